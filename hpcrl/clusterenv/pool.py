"""The head's side of the transport: send each worker its commands, gather the packed results.

One step: ``Isend`` each worker's slice of the actions (a contiguous view: no copy), ring its
doorbell (one byte on its lifeline, :mod:`hpcrl.clusterenv.lifeline`), prepost one ``Irecv`` per
worker into its result buffer, sleep in ``select`` until every worker rang back (it rings just
before sending), then test the receives. With ``wait="poll"`` there are no doorbells: the head
polls MPI (a short spin, then sleeps of 10 us doubling to 1 ms). Either way it watches for worker
errors (``TAG_ERROR``) and for closed lifelines: a worker whose process is gone ends the wait with
:class:`WorkerLost` naming it. A worker that is alive but does not answer (stopped by SIGSTOP, hung
in its env) keeps its lifeline open: after ``step_timeout`` seconds the wait ends with
:class:`WorkerStalled` naming it (and, on the head's host, its process state). After a loss or a stall
the pool only closes (the survivors are told to exit).
"""
from __future__ import annotations

import math
import pickle
import socket
import time
from pathlib import Path

import numpy as np

from hpcrl.clusterenv import protocol as P
from hpcrl.clusterenv.infos import InfoDecoder, merge

SPIN_SECONDS = 50e-6
"""Polling: test the receives this long before the first sleep."""
DOORBELL_SPIN_SECONDS = 2e-3
"""Doorbell: every worker rang just before sending, so test without sleeping this long."""
LIFELINE_CHECK_SECONDS = 0.005


class WorkerLost(RuntimeError):
    """A worker process died: the message names it (index, host, pid)."""


class WorkerError(RuntimeError):
    """A worker's envs raised: the message names the worker and carries its traceback."""


class WorkerStalled(RuntimeError):
    """A worker did not answer within ``step_timeout`` seconds (stopped or hung): the message names it."""


class WorkerPool:
    def __init__(self, link, counts: list[int], reports: list[dict], obs_space, act_space, policy_width: int = 0,
                 doorbell: bool = True, step_timeout: float | None = None):
        from mpi4py import MPI

        self.step_timeout = step_timeout
        """Seconds a command waits for every worker's result (None: no limit); then WorkerStalled."""
        self.doorbell = doorbell
        """Ring each worker's lifeline after a command and sleep in select() for theirs (else poll MPI)."""
        self.MPI, self.link, self.comm = MPI, link, link.comm
        self.counts = counts
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        self.num_envs = int(self.offsets[-1])
        self.reports = reports
        self.obs_space, self.act_space = obs_space, act_space
        obs_bytes = int(np.prod(obs_space.shape)) * obs_space.dtype.itemsize
        self.layouts = [P.result_layout(k, obs_space.shape, obs_space.dtype, act_space.shape, act_space.dtype,
                                        policy_width) for k in counts]
        self.rooms = [P.info_room(lay, k, obs_bytes) for lay, k in zip(self.layouts, counts)]
        self.buffers = [lay.empty(room) for lay, room in zip(self.layouts, self.rooms)]
        self.views = [lay.views(buf) for lay, buf in zip(self.layouts, self.buffers)]
        self.decoders = [InfoDecoder(k) for k in counts]
        self.broken: str | None = None
        self.stalled: list[int] = []
        """Workers a WorkerStalled named."""
        self.wait_seconds = 0.0
        self._status = MPI.Status()

    @property
    def workers(self) -> int:
        return len(self.counts)

    def describe(self, i: int) -> str:
        r = self.reports[i]
        return f"worker {i} (rank {i + 1} of the head's communicator, host {r['host']}, pid {r['pid']})"

    # ---- commands -------------------------------------------------------------------------
    def step(self, actions: np.ndarray):
        self._check_usable()
        MPI = self.MPI
        sends = [self.comm.Isend([actions[lo:hi], MPI.BYTE], dest=i + 1, tag=P.TAG_STEP)
                 for i, (lo, hi) in enumerate(self._slices())]
        return self._gather(self._rang(sends))

    def act(self, kl: np.ndarray, version: int):
        """Worker-side inference: each worker gets ``[kl[i], version]``."""
        self._check_usable()
        MPI = self.MPI
        self._act_msgs = [np.array([kl[i], version], dtype=np.float64) for i in range(self.workers)]
        sends = [self.comm.Isend([m, MPI.DOUBLE], dest=i + 1, tag=P.TAG_ACT) for i, m in enumerate(self._act_msgs)]
        return self._gather(self._rang(sends))

    def reset(self, seeds: list, options: list):
        self._check_usable()
        sends = [self.comm.isend(pickle.dumps((seeds[i], options[i])), dest=i + 1, tag=P.TAG_RESET)
                 for i in range(self.workers)]
        return self._gather(self._rang(sends))

    def close(self) -> None:
        """Tell every worker to leave; collective cleanup only when all are alive."""
        if self.broken is None:
            reqs = [self.comm.isend(None, dest=i + 1, tag=P.TAG_CLOSE) for i in range(self.workers)]
            self._wait(self._rang(reqs), "close()")

    def stalled_pids(self) -> list[int]:
        """Pids of the workers on this host that a WorkerStalled named (close() ends them)."""
        here = socket.gethostname()
        return [self.reports[i]["pid"] for i in self.stalled if self.reports[i].get("host") == here]

    # ---- waiting --------------------------------------------------------------------------
    def _rang(self, sends: list) -> list:
        if self.doorbell:
            for i in range(self.workers):
                self.link.lifeline.ring(i)
        return sends

    def _wait_rings(self, sends: list, recvs: list, deadline: float) -> None:
        """Sleep in select() until every worker rang (its result is on the way); progress MPI between naps."""
        MPI, pending = self.MPI, set(range(self.workers))
        while pending:
            if time.perf_counter() > deadline:
                self._stalled(sorted(pending), sends + recvs)
            rung, gone = self.link.lifeline.wait_rings(pending, 1e-3)
            if gone:
                self._lost(gone, sends + recvs)
            pending -= rung
            MPI.Request.Testall(sends)
            if pending and self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=P.TAG_ERROR):
                self._check_errors(recvs, [False] * len(recvs))

    def _slices(self):
        return zip(self.offsets[:-1], self.offsets[1:])

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise WorkerLost(f"ClusterEnv is unusable after an earlier failure ({self.broken}); call close()")

    def _gather(self, sends: list) -> list[dict]:
        MPI = self.MPI
        recvs = [self.comm.Irecv([buf, MPI.BYTE], source=i + 1, tag=P.TAG_RESULT) for i, buf in enumerate(self.buffers)]
        statuses = [MPI.Status() for _ in recvs]
        done = [False] * len(recvs)
        t0 = time.perf_counter()
        deadline = t0 + (math.inf if self.step_timeout is None else self.step_timeout)
        if self.doorbell:
            self._wait_rings(sends, recvs, deadline)
        self._wait(sends, "step()", deadline, recvs)
        spin = DOORBELL_SPIN_SECONDS if self.doorbell else SPIN_SECONDS  # rung: the results are on their way
        spin_until, delay, next_check = time.perf_counter() + spin, 1e-5, 0.0
        while not all(done):
            for i, req in enumerate(recvs):
                if not done[i] and req.Test(statuses[i]):
                    done[i] = True
            if all(done):
                break
            now = time.perf_counter()
            if now >= next_check:
                next_check = now + LIFELINE_CHECK_SECONDS
                self._check_errors(recvs, done)
                if now > deadline:
                    self._stalled([i for i in range(self.workers) if not done[i]], sends + recvs)
            if now > spin_until:
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)
        self.wait_seconds += time.perf_counter() - t0
        return [self._unpack(i, statuses[i]) for i in range(self.workers)]

    def _wait(self, reqs: list, what: str, deadline: float = math.inf, others: tuple = ()) -> None:
        """Wait for ``reqs`` (one per worker, or fewer); WorkerStalled after ``deadline`` (cancelling ``others`` too)."""
        delay, next_check = 1e-5, 0.0
        while not self.MPI.Request.Testall(reqs):
            now = time.perf_counter()
            if now >= next_check:
                next_check = now + LIFELINE_CHECK_SECONDS
                self._check_errors(reqs, None)
                if now > deadline:
                    self._stalled([i for i, r in enumerate(reqs) if not r.Test()], [*reqs, *others])
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def _check_errors(self, reqs: list, done) -> None:
        MPI = self.MPI
        if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=P.TAG_ERROR, status=self._status):
            i = self._status.Get_source() - 1
            text = self.comm.recv(source=i + 1, tag=P.TAG_ERROR)
            self._drain(reqs, done, {i})
            raise WorkerError(f"ClusterEnv: {self.describe(i)} raised in its envs:\n{text.rstrip()}")
        gone = self.link.lifeline.dead()
        if gone:
            self._lost(gone, reqs)

    def _lost(self, gone: list[int], reqs: list) -> None:
        if gone:
            names = "; ".join(self.describe(i) for i in gone)
            self.broken = f"{names} died"
            for req in reqs:
                try:
                    req.Cancel()
                except Exception:
                    pass
            raise WorkerLost(f"ClusterEnv: {names} died (its lifeline socket closed); the head stays usable "
                             "for close()")

    def _stalled(self, silent: list[int], reqs: list) -> None:
        """WorkerStalled naming the workers that did not answer within step_timeout; the pool only closes after it."""
        names = "; ".join(f"{self.describe(i)}{_process_state(self.reports[i])}" for i in silent)
        self.broken = f"{names} did not answer"
        self.stalled = list(silent)
        for req in reqs:
            try:
                req.Cancel()
            except Exception:
                pass
        raise WorkerStalled(f"ClusterEnv: {names} did not answer within step_timeout={self.step_timeout:g} s "
                            "(its lifeline is open: stopped or hung, not dead); the head stays usable for close(), "
                            "which ends it")

    def _drain(self, reqs: list, done, failed: set) -> None:
        """After a worker error: wait for the others' results so the next command starts clean."""
        if done is None:
            return
        for i, req in enumerate(reqs):
            if i in failed:
                req.Cancel()
                req.Wait()
            elif not done[i]:
                self._wait([req], "drain")

    # ---- results --------------------------------------------------------------------------
    def _unpack(self, i: int, status) -> dict:
        MPI = self.MPI
        v = self.views[i]
        h = v["header"]
        sid, nbytes, inline = int(h[0]), int(h[1]), bool(h[2])
        dec = self.decoders[i]
        while not dec.known(sid):
            dec.add_schema(self.comm.recv(source=i + 1, tag=P.TAG_SCHEMA))
        end = self.layouts[i].nbytes
        if inline:
            data = self.buffers[i][end:end + nbytes]
        else:
            data = np.empty(nbytes, dtype=np.uint8)
            self.comm.Recv([data, MPI.BYTE], source=i + 1, tag=P.TAG_INFO)
        out = {name: arr for name, arr in v.items()}
        out["info_leaves"] = dec.decode(sid, data) if nbytes or sid >= 0 else {}
        return out

    def assemble(self, parts: list[dict], fields: tuple[str, ...]) -> tuple[dict, dict]:
        """Concatenate the workers' fields into fresh arrays over all envs; merge their infos."""
        arrays = {f: np.concatenate([p[f] for p in parts]) for f in fields}
        infos = merge([(int(lo), int(hi), p["info_leaves"]) for (lo, hi), p in zip(self._slices(), parts)],
                      self.num_envs)
        return arrays, infos


def _process_state(report: dict) -> str:
    """", its process is stopped (SIGSTOP)" and the like for a worker on this host; "" elsewhere or unknown."""
    if report.get("host") != socket.gethostname():
        return ""
    try:
        text = Path(f"/proc/{report['pid']}/stat").read_text()
    except OSError:
        return ""
    state = text[text.rfind(")") + 2:].split()[0]
    named = {"T": "stopped (SIGSTOP or SIGTSTP)", "t": "stopped by a debugger", "D": "in uninterruptible I/O",
             "R": "running", "S": "sleeping", "Z": "a zombie"}
    return f", its process is {named.get(state, 'in state ' + state)}"
