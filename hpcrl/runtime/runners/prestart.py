"""Local ranks forked from one process that has already imported their libraries (``launch.prestart``).

Importing torch costs about 1.3 s of CPU, and four ranks on two cores pay it four times over
before the first environment step. With prestart, ``hpcrl run`` (runner mpi, local mpiexec, no
container) first binds a socket and starts one server on it (``python -m hpcrl.runtime.runners.prestart``),
in parallel with its own config checks; the server imports what every rank needs once
(:data:`PRELOAD`; mpi4py without initialising MPI). Each rank mpiexec starts (``python -m hpcrl.runtime.runners.mpi``) finds the
server's socket in ``$HPCRL_PRESTART`` and hands over its argv, environment, working directory
and open file descriptors (stdio, the PMI socket); the server forks a child that takes them
over, initialises MPI and runs the rank. The rank process stays as the child's stand-in:
it forwards signals to it and exits with its status; when the stand-in dies (mpiexec killed
it), the server kills the child. Without a server (batch scripts, containers, another node,
a server that failed) a rank runs in its own process as before.

Only processes of the same user can connect (a 0700 directory, and the peer's uid is checked).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from hpcrl.runtime import collector

ENV_VAR = "HPCRL_PRESTART"
"""Path of the server's socket, set in the environment of the ranks of a local run."""

SOCKET_NAME = "ranks.sock"
PRELOAD = ("numpy", "torch", "h5py", "gymnasium", "hpcrl.config", "hpcrl.runtime.runners.mpi", "hpcrl.runtime.runners.job",
           "hpcrl.runtime.transport.windows", "hpcrl.runtime.transport.links", "hpcrl.runtime.roles.actor", "hpcrl.runtime.roles.learner",
           "hpcrl.runtime.roles.parameter", "hpcrl.runtime.record.progress")
"""Imported once by the server, before it forks any rank."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
"""Signals the stand-in passes on to its child (mpiexec sends these to the process it started)."""
MAX_FDS = 200
"""Most descriptors one rank hands over (SCM_RIGHTS allows about 250)."""
HEADER = struct.Struct("!I")


# ---- launcher side -------------------------------------------------------------------------------
class PrestartServer:
    """The server process of one local run; ``environ`` goes into the ranks' environment."""

    def __init__(self, environ: dict[str, str], python: str = sys.executable) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hpcrl-"))  # mode 0700
        self.path = self.dir / SOCKET_NAME
        self.environ = {ENV_VAR: str(self.path)}
        # the socket listens from now on (a rank that connects early waits in the backlog); the server
        # inherits it. stdin is the server's lifeline: when this process closes it (or dies), the
        # server stops taking ranks and exits once its children have ended
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(self.path))
            listener.listen(256)
            self.proc = subprocess.Popen([python, "-m", "hpcrl.runtime.runners.prestart", str(self.path), str(listener.fileno())],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         env={**environ, **self.environ}, start_new_session=True,
                                         pass_fds=(listener.fileno(),))

    def stop(self, wait: float = 10.0) -> None:
        """Close the lifeline; kill the server (and any child it still has) if it has not ended in ``wait`` s."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
        for p in (self.path, self.dir):
            try:
                p.unlink() if p == self.path else p.rmdir()
            except OSError:
                pass


_EARLY: list[PrestartServer] = []
"""The server :func:`start_early` started and no one has adopted yet."""


def start_early(argv: list[str]) -> None:
    """Start the server as ``hpcrl run`` begins, before the command imports its config machinery (about 0.4 s of
    the launcher's start-up, during which the server already imports torch), when the arguments leave it likely
    that the run's ranks are local MPI ranks: not ``--runner serial`` or ``sim`` (nor ``-o launch.runner=...``),
    not ``--inside-mpi``, not inside a job already. ``hpcrl run`` adopts it (:func:`adopt_early`) or stops it once
    its plan says otherwise; a command that ends before adopting it stops it (:func:`drop_early`)."""
    from hpcrl.job_env import job_rank, rank_environment

    words = set(argv)
    runner = next((a.split("=", 1)[1] for a in argv if a.startswith(("--runner=", "launch.runner="))), None)
    if "--runner" in argv and argv.index("--runner") + 1 < len(argv):
        runner = argv[argv.index("--runner") + 1]
    if runner in ("serial", "sim") or words & {"--inside-mpi", "-h", "--help"} or job_rank(os.environ) is not None:
        return
    try:
        _EARLY.append(PrestartServer(rank_environment(os.environ)))
    except OSError:
        pass  # hpcrl run tries again and says why


def adopt_early() -> PrestartServer | None:
    """The server :func:`start_early` started, now the caller's to stop; None when there is none."""
    return _EARLY.pop() if _EARLY else None


def drop_early() -> None:
    """Stop a server :func:`start_early` started that no one adopted (the command ended first)."""
    while _EARLY:
        _EARLY.pop().stop(wait=0)


# ---- rank side (the stand-in) ------------------------------------------------------------------
def hand_over(argv: list[str], environ: dict[str, str] | None = None) -> int | None:
    """Run this rank as a child of the prestart server; its exit code, or None when there is no server."""
    environ = dict(os.environ if environ is None else environ)
    path = environ.pop(ENV_VAR, None)
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:  # another node, or the server is gone: start here
        sock.close()
        return None
    fds = _open_fds(exclude=sock.fileno())
    request = json.dumps({"argv": list(argv), "env": environ, "cwd": os.getcwd(), "fds": fds}).encode()
    child: list[int] = []
    pending: list[int] = []

    def forward(signum, _frame) -> None:
        if child:
            _kill(child[0], signum)
        else:
            pending.append(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        socket.send_fds(sock, [HEADER.pack(len(request)) + request], fds)
        replies = sock.makefile("rb")
        line = replies.readline()
        if not line:  # the server ended before it forked this rank: start here after all
            sys.stderr.write("hpcrl: the prestart server ended before starting this rank; starting it here\n")
            return None
        child.append(int(json.loads(line)["pid"]))
        for s in pending:
            _kill(child[0], s)
        line = replies.readline()
        if not line:
            _kill(child[0], signal.SIGKILL)
            sys.stderr.write("hpcrl: the prestart server ended while this rank ran\n")
            return 1
        status = int(json.loads(line)["status"])
    finally:
        sock.close()
        if child:  # the child has ended: a late signal (mpiexec and the launcher may both send SIGTERM) has no one
            for s in FORWARDED:  # to go to, and must not end the stand-in in place of the child's own status
                signal.signal(s, signal.SIG_IGN)
        else:  # this process goes on to run the rank itself, or fails
            for s, handler in previous.items():
                signal.signal(s, handler)
    if status < 0:  # the child died of a signal: say which rank, then the stand-in dies of it too
        sys.stderr.write(killed_line(environ, child[0], -status) + "\n")
        sys.stderr.flush()
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be given a handler (nor need one)
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def killed_line(environ: dict[str, str], pid: int, signum: int) -> str:
    """``hpcrl: rank R (pid P on HOST) was killed by signal N (NAME)``: what the launcher names a dead rank by
    (hydra's banner shows the stand-in's PID, not the rank's)."""
    import platform

    from hpcrl.job_env import job_rank

    rank = job_rank(environ)
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "?"
    return (f"hpcrl: rank {rank[0] if rank else '?'} (pid {pid} on {platform.node()}) was killed by signal "
            f"{signum} ({name})")


def _open_fds(exclude: int) -> list[int]:
    """This process's open descriptors (stdio, the PMI socket, ...), as the child must see them."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = [str(fd) for fd in range(3)]
    fds = []
    for name in names:
        fd = int(name)
        if fd == exclude:
            continue
        try:
            os.fstat(fd)
        except OSError:  # the listing's own descriptor, already closed
            continue
        fds.append(fd)
    return sorted(fds)[:MAX_FDS]


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


# ---- the server ----------------------------------------------------------------------------------
def serve(path: Path, fd: int) -> int:
    """Accept ranks on the listening socket ``fd`` (bound to ``path``) until stdin closes and every child has ended."""
    listener = socket.socket(fileno=fd)  # ranks that connected already wait while the imports below run
    collector.pause()
    preload()
    collector.resume()  # the imports are permanent: each forked rank's collector skips them
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "lifeline")
    children: dict[int, socket.socket] = {}  # pid -> the stand-in's connection
    pidfds: dict[int, int] = {}
    accepting = True
    while accepting or children:
        timeout = None if hasattr(os, "pidfd_open") else 0.2
        for key, _ in sel.select(timeout):
            what = key.data
            if what == "accept":
                conn, _ = listener.accept()
                pid = _start_child(conn, sel, [listener, *children.values()], list(pidfds.values()))
                if pid is None:
                    continue
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, ("standin", pid))
                if hasattr(os, "pidfd_open"):
                    pidfds[pid] = os.pidfd_open(pid)
                    sel.register(pidfds[pid], selectors.EVENT_READ, ("exited", pid))
            elif what == "lifeline":
                if not os.read(sys.stdin.fileno(), 4096):
                    accepting = False
                    sel.unregister(sys.stdin.fileno())
                    sel.unregister(listener)
                    listener.close()
                    path.unlink(missing_ok=True)
            elif what[0] == "standin":  # EOF: mpiexec killed the stand-in, so the rank goes too
                _kill(what[1], signal.SIGKILL)
                sel.unregister(children[what[1]])
            elif what[0] == "exited":
                _reap(what[1], children, pidfds, sel)
        if not hasattr(os, "pidfd_open"):
            for pid in list(children):
                _reap(pid, children, pidfds, sel, block=False)
    return 0


def preload() -> None:
    """Import what every rank needs, with the settings a rank uses (one torch thread, MPI not initialised)."""
    import importlib

    import mpi4py

    mpi4py.rc.initialize = False  # each child initialises MPI itself, after taking over its PMI socket
    mpi4py.rc.finalize = False
    from mpi4py import MPI  # noqa: F401 - loads the MPI library once

    for name in PRELOAD:
        importlib.import_module(name)
    from hpcrl.runtime.runners.threads import one_compute_thread

    one_compute_thread()
    sys.stdout.flush()
    sys.stderr.flush()


def _start_child(conn: socket.socket, sel, sockets: list, pidfds: list[int]) -> int | None:
    """Read one stand-in's request and fork the rank; None when the request is refused or broken."""
    fds: list[int] = []
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            raise ConnectionError("another user")
        conn.settimeout(30)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, MAX_FDS)
        if len(data) < HEADER.size:
            raise ConnectionError("short request")
        size = HEADER.unpack_from(data)[0]
        while len(data) < HEADER.size + size:
            more = conn.recv(1 << 16)
            if not more:
                raise ConnectionError("truncated request")
            data += more
        request = json.loads(data[HEADER.size:HEADER.size + size])
        conn.settimeout(None)
    except (OSError, ValueError, ConnectionError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    # a signal forwarded to the child before it has its handlers waits (blocked) instead of killing it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    pid = os.fork()
    if pid == 0:  # the rank; never returns
        code = 1
        try:
            sel.close()
            for s in (*sockets, conn):
                s.close()
            for fd in pidfds:
                os.close(fd)
            _become(request, fds)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            code = _run_rank(request["argv"])
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - report, then end this child whatever happened
            import traceback

            traceback.print_exc()
        finally:
            _exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        _kill(pid, signal.SIGKILL)
    return pid


def _become(request: dict, fds: list[int]) -> None:
    """Take over the stand-in's descriptors (same numbers), environment and working directory."""
    from hpcrl.runtime.signals import remember_stop_signals

    for s in (*FORWARDED, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    remember_stop_signals()  # as a rank started by mpiexec does first
    import fcntl

    targets = list(request["fds"])[:len(fds)]
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1000) for fd in fds]  # out of the way of every target
    for fd in fds:
        os.close(fd)
    for src, dst in zip(high, targets):
        os.dup2(src, dst, inheritable=True)
        os.close(src)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["-m", *request["argv"]]  # python -m hpcrl.runtime.runners.mpi ARGS
    import numpy as np

    np.random.seed()  # a fresh process would have drawn its own legacy-global seed


def _run_rank(argv: list[str]) -> int:
    from mpi4py import MPI

    _end_before_library_destructors()  # before MPI's init: MPICH's exit handler, registered in it, runs first
    MPI.Init_thread(MPI.THREAD_MULTIPLE)
    from hpcrl.runtime.runners.mpi import run_rank

    return run_rank(argv)


_EXIT_STATUS: list[int | None] = [None]
"""The status the child's C exit ends with, set by :func:`_exit` (an exit handler is not told it); None: another
exit (MPI_Abort's), which runs every handler as before."""
_KEPT: list = []


def _end_before_library_destructors() -> None:
    """Register a C exit handler that flushes C stdio and ends the process with :data:`_EXIT_STATUS` (if set).

    The C library runs exit handlers last registered first: MPICH's, registered by MPI's init after this one,
    tells mpiexec that the rank finalized; this one runs next and ends the process before the handlers registered
    when the server imported torch, libtorch's static destructors, which took 0.1-0.2 s of CPU per rank at the end
    of every job (the launcher waits for the last rank)."""
    import ctypes

    libc = ctypes.CDLL(None)

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def end(_arg) -> None:
        if _EXIT_STATUS[0] is not None:
            libc.fflush(None)
            libc._exit(_EXIT_STATUS[0])

    _KEPT.append(end)  # the callback must outlive this function
    libc.__cxa_atexit(end, None, None)


def _exit(code: int) -> None:
    """End a child as the interpreter would: Python's exit handlers, MPI_Finalize, flushed stdio, then the C
    library's exit handlers (MPICH tells mpiexec that the rank finalized in one: without it, mpiexec takes the
    rank's end for a crash and kills the job; :func:`_end_before_library_destructors` ends it after that one)."""
    import atexit
    import ctypes

    _EXIT_STATUS[0] = code
    try:
        atexit._run_exitfuncs()
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
        sys.stdout.flush()
        sys.stderr.flush()
        ctypes.CDLL(None).exit(code)
    finally:
        os._exit(code)


def _reap(pid: int, children: dict, pidfds: dict, sel, block: bool = True) -> None:
    done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    if not done:
        return
    conn = children.pop(pid)
    try:
        conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    except OSError:
        pass
    try:
        sel.unregister(conn)
    except (KeyError, ValueError):
        pass
    conn.close()
    if pid in pidfds:
        sel.unregister(pidfds[pid])
        os.close(pidfds.pop(pid))


if __name__ == "__main__":
    # no interpreter teardown: with torch imported it takes seconds on a busy machine, and hpcrl run waits for it
    os._exit(serve(Path(sys.argv[1]), int(sys.argv[2])))
