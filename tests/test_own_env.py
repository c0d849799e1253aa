"""A user's own Gymnasium env (docs/own-env.md): registered by a module that `env.imports` names, or named as
Gymnasium's `module:Id`; trained on the serial runner in this process and on MPI ranks through `hpcrl run`.

The env is tests/own_env_pkg/envs.py (importable with tests/ on the path), whose text docs/own-env.md holds."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import yaml

from hpcrl.cli import main as cli_main
from hpcrl.config import build_config
from hpcrl.envs import check_env_id
from hpcrl.errors import ConfigError
from hpcrl.io import read_attrs, read_table
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import serial

TESTS = Path(__file__).parent
MODULE, ENV_ID = "own_env_pkg.envs", "OwnCorridor-v0"
TINY = {
    "name": "own",
    "actors": {"count": 2, "fragment_length": 16},
    "algo": {"name": "ppo", "train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 1},
    "io": {"flush_seconds": 0.5},
}


def config(run_dir: Path, env: dict, steps: int, runner: str, target: float | None = None) -> dict:
    return {**TINY, "env": {"num_envs": 2, **env}, "stop": {"target_return": target, "total_env_steps": steps},
            "io": {**TINY["io"], "run_dir": str(run_dir)}, "launch": {"runner": runner, "timeout_seconds": 60}}


def assert_corridor_episodes(run_dir: Path) -> None:
    """The record's episodes are the corridor's: reaching the end after L steps returns 1 - 0.01 (L - 1),
    50 steps short of it return -0.5 (a return no Gymnasium env of the same id could fake by chance)."""
    episodes = read_table(run_dir / "run.h5", "episodes")
    length, ret = episodes["length"], episodes["return"]
    assert len(ret) > 0
    arrived = np.isclose(ret, 1 - 0.01 * (length - 1), atol=1e-4)
    assert np.all(arrived | ((length == 50) & np.isclose(ret, -0.5, atol=1e-4))), (length, ret)
    assert np.all(length >= 5) and arrived.any()  # the corridor is 5 cells long


@pytest.fixture
def own_env_path(monkeypatch):
    """tests/ on sys.path, and the module not yet imported nor its id registered (both put back afterwards)."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.delitem(gymnasium.registry, ENV_ID, raising=False)


def test_env_imports_trains_the_users_env_on_the_serial_runner(tmp_path, own_env_path):
    run_dir = tmp_path / "run"
    cfg = build_config(config(run_dir, {"id": ENV_ID, "imports": [MODULE]}, 20_000, "serial", target=0.95))
    with pytest.raises(ConfigError, match=r"unknown environment 'OwnCorridor-v0'.*needs its module in env.imports"):
        check_env_id(ENV_ID)  # nothing imported it yet
    check_env_id(cfg.env.id, cfg.env.imports)  # what hpcrl run's validation does
    assert MODULE in sys.modules
    del sys.modules[MODULE], gymnasium.registry[ENV_ID]  # the roles import it again where they make their envs
    result = serial.run(make_plan(cfg), run_dir, progress="plain")
    assert result.stop_reason.startswith("stop.target_return"), result.message  # it learns the 5-step walk (0.96)
    assert_corridor_episodes(run_dir)


def test_module_colon_id_imports_the_module_then_looks_the_id_up(tmp_path, own_env_path):
    run_dir = tmp_path / "run"
    env_id = f"{MODULE}:{ENV_ID}"
    cfg = build_config(config(run_dir, {"id": env_id}, 300, "serial"))
    check_env_id(cfg.env.id)
    assert MODULE in sys.modules and ENV_ID in gymnasium.registry
    assert serial.run(make_plan(cfg), run_dir, progress="plain").stop_reason.startswith("stop.total_env_steps")
    assert_corridor_episodes(run_dir)
    with pytest.raises(ConfigError, match="not Gymnasium's 'module:Id'"):
        check_env_id(f"{MODULE}:")


@pytest.mark.parametrize("env, line", [
    ({"imports": ["no_such_pkg.envs"]},
     "env.imports: cannot import 'no_such_pkg.envs': No module named 'no_such_pkg' (install it, or put its folder "
     "on PYTHONPATH)"),
    ({"id": "no_such_pkg.envs:OwnCorridor-v0"}, "env.id 'no_such_pkg.envs:OwnCorridor-v0': cannot import "
     "'no_such_pkg.envs': No module named 'no_such_pkg'"),
    ({"id": "OwnCorridr-v0", "imports": [MODULE]},
     "env.id: unknown environment 'OwnCorridr-v0' after importing own_env_pkg.envs (did you mean OwnCorridor-v0?); "
     "the module whose import calls gymnasium.register('OwnCorridr-v0', ...) belongs in env.imports"),
    ({"id": f"{MODULE}:OwnCorridr-v0"}, "env.id: unknown environment 'OwnCorridr-v0' after importing own_env_pkg.envs"),
    ({"imports": ["own_env_pkg/envs"]}, "env.imports: 'own_env_pkg/envs' is not a module name"),
])
def test_an_env_that_cannot_be_found_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch,
                                                                              own_env_path, env, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config(tmp_path / "runs" / "x", {"id": ENV_ID, **env}, 300, "mpi")))
    assert cli_main(["run", "--runner", "serial", str(tmp_path / "c.yaml")]) == 2  # --runner serial: no prestart server
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and line in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def test_a_single_module_name_is_a_list_of_one():
    assert build_config({"env": {"imports": MODULE}}).env.imports == [MODULE]


def test_the_docs_example_is_the_tested_env():
    """docs/own-env.md shows tests/own_env_pkg/envs.py as it is, so the example cannot drift from what is tested."""
    doc = (TESTS.parent / "docs" / "own-env.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    assert code == (TESTS / "own_env_pkg" / "envs.py").read_text()
    assert "own-env.md" in (TESTS.parent / "README.md").read_text()


@pytest.mark.mpi
@pytest.mark.slow
def test_env_imports_on_mpi_ranks_through_hpcrl_run(tmp_path):
    """Launcher and ranks are fresh processes (the ranks forked by the prestart server): each imports the module."""
    run_dir = tmp_path / "run"
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(config(run_dir, {"id": ENV_ID, "imports": [MODULE]}, 2000, "mpi")))
    pythonpath = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=90, env=dict(os.environ, PYTHONPATH=pythonpath, UCX_LOG_LEVEL="error"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert read_attrs(run_dir / "run.h5")["runner"] == "mpi"
    assert sorted(p.name for p in (run_dir / "traj").iterdir()) == ["actor-00000.h5", "actor-00001.h5"]
    assert_corridor_episodes(run_dir)
