"""Fast start: ranks forked from the prestart server, and the recorded seconds to the first env step."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.io import read_attrs
from hpcrl.runtime.runners.prestart import ENV_VAR, PrestartServer

ROOT = Path(__file__).resolve().parents[1]
# the stand-in: hand the rank over, then say what this process itself imported and what came back
STAND_IN = ("import sys; from hpcrl.runtime.runners.prestart import hand_over; code = hand_over(sys.argv[1:]); "
            "print('stand-in: torch imported here =', 'torch' in sys.modules, 'code =', code, flush=True); "
            "sys.exit(0)")


@pytest.fixture(scope="module")
def server():
    srv = PrestartServer(dict(os.environ, PYTHONPATH=str(ROOT)))
    yield srv
    srv.stop()


def stand_in(server, *argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **server.environ)
    return subprocess.run([sys.executable, "-c", STAND_IN, *argv], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.slow
def test_a_rank_runs_in_a_child_of_the_server_with_the_stand_ins_stdio_and_exit_code(server):
    res = stand_in(server, "--help")  # the child prints the rank's usage on the stand-in's stdout
    assert "python -m hpcrl.runtime.runners.mpi" in res.stdout and "run_dir" in res.stdout, res.stdout + res.stderr
    assert "stand-in: torch imported here = False code = 0" in res.stdout
    res = stand_in(server, "RUN_DIR", "--no-such-flag")  # argparse's exit code 2 and message on the stand-in's stderr
    assert "unrecognized arguments: --no-such-flag" in res.stderr
    assert "stand-in: torch imported here = False code = 2" in res.stdout


def test_without_a_server_the_rank_starts_in_its_own_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{ENV_VAR: str(tmp_path / "no.sock")})
    res = subprocess.run([sys.executable, "-c", STAND_IN, "--help"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert "code = None" in res.stdout and "python -m hpcrl.runtime.runners.mpi" not in res.stdout


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_run_records_seconds_to_the_first_env_step(tmp_path):
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", "-o", "stop.total_env_steps=256",
                          "-o", "stop.target_return=null", "-o", f"io.run_dir={run_dir}"],
                         capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    attrs = read_attrs(run_dir / "run.h5")
    seconds = float(attrs["startup_seconds"])
    assert 0.0 < seconds < 180.0 and attrs["command_unix"] < attrs["start_unix"] + seconds
    assert f"first environment step {seconds:.2f} s after the command" in res.stdout


def test_a_program_calling_main_times_its_start_from_the_call(tmp_path):
    """cli.main(argv) from a long-lived program (a notebook, a Parsl python_app, pytest) counts from the call,
    not from when its process began (CI printed "first environment step 536.07 s after the command")."""
    from hpcrl.cli import main as cli_main

    run_dir = tmp_path / "run"
    time.sleep(2.0)  # this process began at least two seconds before the call
    called = time.time()
    assert cli_main(["run", "--runner", "serial", "-o", "stop.total_env_steps=256", "-o", "stop.target_return=null",
                     "-o", f"io.run_dir={run_dir}"]) == 0
    attrs = read_attrs(run_dir / "run.h5")
    assert attrs["command_unix"] >= called - 0.01 and float(attrs["startup_seconds"]) < time.time() - called


def _servers_under(tmp: Path) -> list[str]:
    """Command lines of live processes that name a socket under ``tmp`` (a prestart server started there)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "hpcrl.runtime.runners.prestart" in cmdline and str(tmp) in cmdline:
            found.append(cmdline)
    return found


def _servers_started_under(tmp: Path, within: float = 5.0) -> list[str]:
    """:func:`_servers_under`, waiting up to ``within`` s for one: Popen returns once the exec began, and the
    kernel fills the new process's command line a moment later (read empty in between: seen on a loaded VM)."""
    deadline = time.monotonic() + within
    while not (found := _servers_under(tmp)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


def test_the_early_server_is_started_only_where_ranks_may_be_local_and_a_failed_command_stops_it(tmp_path,
                                                                                                 monkeypatch):
    from hpcrl.runtime.runners import prestart

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    for argv in (["run", "--runner", "serial"], ["-q", "run", "--runner=sim"], ["run", "-o", "launch.runner=sim"],
                 ["run", "--inside-mpi"], ["run", "-h"]):
        prestart.start_early(argv)
        assert prestart.adopt_early() is None, argv
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "4")
    prestart.start_early(["run"])  # a rank of a job already: no local ranks to fork
    assert prestart.adopt_early() is None
    monkeypatch.delenv("PMI_RANK")
    prestart.start_early(["-q", "run", "my.yaml"])
    assert _servers_started_under(tmp_path)
    prestart.drop_early()
    assert prestart.adopt_early() is None and not _servers_under(tmp_path) and not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, said", [(["--no-such-flag"], "unrecognized arguments"),  # before the command runs
                                         (["-o", "actors.count=-1"], "actors.count")])  # after it adopted the server
def test_a_run_refused_for_bad_input_leaves_no_prestart_server(tmp_path, args, said):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", *args, "-o", f"io.run_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and said in res.stderr, res.stderr
    assert not _servers_under(tmp_path) and not [p for p in tmp_path.iterdir() if p.name.startswith("hpcrl-")]


def test_a_childs_c_exit_runs_the_handlers_registered_after_its_own_then_ends_with_its_status(tmp_path):
    """The prestart child's exit: MPICH's handler (registered by MPI's init, after the child's own) still runs, and
    the child's handler then ends the process with the status it was given, before the handlers registered earlier
    (libtorch's static destructors, when the server imported torch)."""
    marker = tmp_path / "later-handler-ran"
    code = f"""
import ctypes
from hpcrl.runtime.runners import prestart
libc = ctypes.CDLL(None)

@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def earlier(_arg):  # registered before the child's handler, as libtorch's destructors are: must not run
    open({str(marker)!r} + ".earlier", "w").close()

@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def later(_arg):  # registered after it, as MPICH's PMI finalize is: must run
    open({str(marker)!r}, "w").close()

libc.__cxa_atexit(earlier, None, None)
prestart._end_before_library_destructors()
libc.__cxa_atexit(later, None, None)
prestart._EXIT_STATUS[0] = 7
libc.exit(3)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert marker.exists() and not Path(str(marker) + ".earlier").exists()
    marker.unlink()  # another exit (MPI_Abort's, no status set): every handler runs, the exit's own status stands
    unset = subprocess.run([sys.executable, "-c", code.replace("prestart._EXIT_STATUS[0] = 7", "")],
                           capture_output=True, text=True, timeout=60)
    assert unset.returncode == 3 and marker.exists() and Path(str(marker) + ".earlier").exists(), unset.stderr
