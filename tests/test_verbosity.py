"""`hpcrl -q` / `hpcrl -v` (issue 27 item 5): -q leaves errors and the final summary, -v adds detail."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcrl import verbosity
from hpcrl.cli import main as cli_main

PROGRESS = re.compile(r"^\[\s*[\d.]+ s\] steps \d+", re.M)
CARTPOLE_HA2C = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "cartpole_ha2c.yaml"


@pytest.fixture(autouse=True)
def normal_level_after():
    yield
    verbosity.set_level(verbosity.NORMAL)


def serial_run(tmp_path: Path, name: str, *flags: str) -> list[str]:
    return ["run", *flags, "--runner", "serial", "-o", "env.num_envs=2", "-o", "stop.total_env_steps=1200",
            "-o", "stop.target_return=null", "-o", "io.log_seconds=0.1", "-o", "io.tensorboard=false",
            "-o", f"io.run_dir={tmp_path / name}"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quiet_silences_the_start_and_progress_lines_of_a_serial_run(tmp_path, capsys):
    assert cli_main(serial_run(tmp_path, "normal")) == 0
    normal = capsys.readouterr().out
    assert PROGRESS.search(normal) and "hpcrl run: " in normal  # what -q has to silence is there without it

    for argv in (["-q", *serial_run(tmp_path, "quiet-before")], serial_run(tmp_path, "quiet-after", "-q")):
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        assert not PROGRESS.search(out), out
        assert "hpcrl run:" not in out, out  # no start lines (runner, live scalars, start-up time)
        assert out.startswith("hpcrl run summary\n"), out
        assert "stop.total_env_steps=1200 reached" in out


@pytest.mark.timeout(200)
def test_verbose_shows_the_plan_and_a_detailed_line_for_every_update(tmp_path, capsys):
    argv = ["-v", "run", str(CARTPOLE_HA2C), "-o", "env.num_envs=16", "-o", "learners.device=cpu",
            "-o", "stop.total_env_steps=20480", "-o", "stop.target_return=null", "-o", "io.tensorboard=false",
            "-o", "algo.stats_every=5", "-o", f"io.run_dir={tmp_path / 'v'}"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "hpcrl run: plan: ha2c on hpcrl/CartPole-v1 x 16 per actor; one device loop" in out
    lines = PROGRESS.findall(out)
    detailed = [line for line in out.splitlines() if PROGRESS.match(line)]
    # io.log_seconds is 10 s: without -v at most one line in a run this short; with it one per update
    assert len(lines) >= 2 and all("policy_loss" in line for line in detailed), out
    assert "hpcrl run summary" in out


@pytest.mark.timeout(200)
def test_verbose_shows_ppos_losses_kl_entropy_and_clip_fraction_in_a_roles_run(tmp_path, capsys):
    assert cli_main(["-v", *serial_run(tmp_path, "ppo")]) == 0
    detailed = [line for line in capsys.readouterr().out.splitlines() if PROGRESS.match(line)]
    last = detailed[-1]
    for name in ("policy_loss", "value_loss", "kl", "entropy", "clip_fraction"):
        assert re.search(rf"  {name} -?[\d.]", last), last
    assert "mailbox_wait_seconds" not in last and "compute_seconds" not in last  # the push's timings stay out


def test_quiet_and_verbose_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", "-q", "-v"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
