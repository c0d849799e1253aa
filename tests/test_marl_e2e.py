"""IPPO, MAPPO, IQL and VDN through `hpcrl run` (serially, VDN under mpi too: test_mpi_run says why), and the
shipped MARL configs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcrl.cli import main as cli_main
from hpcrl.config import load_config
from hpcrl.errors import ConfigError
from hpcrl.io import read_attrs, read_table
from hpcrl.marl.agents import check_agent_count
from hpcrl.runtime.roles.sampler import describe_env


CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs"
MARL_CONFIGS = sorted(CONFIGS.glob("mpe_*.yaml")) + sorted(CONFIGS.glob("wallmodel_*ppo.yaml"))
TINY = ["env.num_envs=2", "actors.fragment_length=25", "io.checkpoint_every=5", "io.flush_seconds=0.5"]
BATCH = ["algo.train_batch_size=300", "algo.minibatch_size=150", "algo.num_sgd_iter=1"]
REPLAY = ["algo.batch_size=32", "algo.updates_per_fragment=2"]


def _overrides(algo: str, steps: int, run_dir: Path) -> list[str]:
    extra = BATCH if algo in ("ippo", "mappo") else REPLAY
    out = []
    for o in [*TINY, *extra, f"stop.total_env_steps={steps}", f"io.run_dir={run_dir}"]:
        out += ["-o", o]
    return out


def _check_record(run_dir: Path, runner: str, agents: int = 6) -> None:
    h5 = run_dir / "run.h5"
    assert read_attrs(h5)["runner"] == runner
    updates, episodes = read_table(h5, "updates"), read_table(h5, "episodes")
    assert len(updates["version"]) >= 2
    # every agent of both copies finished 25-step episodes, each its own instance
    assert set(np.unique(episodes["env_index"])) == set(range(2 * agents))
    assert np.all(episodes["length"] == 25)


@pytest.mark.parametrize("algo", ["ippo", "mappo", "iql", "vdn"])
def test_serial_run(algo, tmp_path):
    run_dir = tmp_path / "run"
    rc = cli_main(["run", str(CONFIGS / f"mpe_spread_{algo}.yaml"), "--runner", "serial",
                   *_overrides(algo, 1200, run_dir)])
    assert rc == 0
    _check_record(run_dir, "serial")


@pytest.mark.mpi
@pytest.mark.parametrize("algo", ["vdn"])
@pytest.mark.slow
def test_mpi_run(algo, tmp_path):
    """One MPI run, of the replay family: the runner sees only the family (on-policy batches, or replay with
    algo.updates_per_fragment), and the on-policy one runs under mpiexec as IPPO in test_marl_sharing_run.py,
    test_marl_policy_learners.py and test_marl_actor_scaling_run.py. MAPPO is IPPO's class with a central critic, IQL
    VDN's without the team sum; test_serial_run runs all four through the same role objects."""
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(CONFIGS / f"mpe_spread_{algo}.yaml"), "--runner",
                          "mpi", *_overrides(algo, 1200, run_dir)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    _check_record(run_dir, "mpi")


@pytest.mark.parametrize("path", MARL_CONFIGS, ids=lambda p: p.stem)
def test_shipped_configs_name_their_envs_agent_count(path):
    cfg = load_config(path)
    check_agent_count(cfg, describe_env(cfg.env))


def test_a_wrong_agent_count_is_one_line():
    cfg = load_config(CONFIGS / "mpe_spread_ippo.yaml", ["algo.agents=3"])
    with pytest.raises(ConfigError, match="algo.agents: 3, but hpcrl/MPESimpleSpread-v3 has 6 agents"):
        check_agent_count(cfg, describe_env(cfg.env))


def test_hpcrl_run_refuses_a_wrong_agent_count_before_writing(tmp_path, capsys):
    from hpcrl.cli import main as hpcrl_main

    rc = hpcrl_main(["run", str(CONFIGS / "mpe_spread_ippo.yaml"), "-o", "algo.agents=3",
                     "-o", f"io.run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "algo.agents: 3" in err and "\n" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algo", ["mappo", "iql"])
@pytest.mark.slow
def test_evaluation_episodes_of_a_marl_run(algo, tmp_path):
    # eval.* makes the last actor act with algo.greedy on its own env copy: one episode per agent
    # stopped by rounds, not env steps: IQL's actors are not held back by on-policy batches, and when
    # they sampled the whole step budget before the first round ended no evaluation was ever due
    run_dir = tmp_path / "run"
    extra = ["-o", "eval.episodes=1", "-o", "eval.every_rounds=1", "-o", "stop.max_rounds=3"]  # evaluations due twice
    rc = cli_main(["run", str(CONFIGS / f"mpe_spread_{algo}.yaml"), "--runner", "serial",
                   *_overrides(algo, 1_000_000, run_dir), *extra])
    assert rc == 0
    ev = read_table(run_dir / "run.h5", "eval_episodes")
    assert len(ev["return"]) >= 6 and set(np.unique(ev["env_index"])) == set(range(6))
    assert np.all(ev["length"] == 25)
