"""MPE simple-spread's copies in numpy (hpcrl/envs/mpe_spread_copies.py) against mpe2's PettingZoo env: the same
observations, rewards, endings and final observations, bit for bit, step after step and across resets, with agents
that collide; settings the copies do not implement fall back to the PettingZoo copies."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcrl.config import EnvConfig
from hpcrl.envs import make
from hpcrl.runtime.roles.env_backends import CopiesBackend, ParallelBackend, make_backend

pytest.importorskip("mpe2")
ID = "hpcrl/MPESimpleSpread-v3"


def _both(copies: int, **kwargs) -> tuple[CopiesBackend, ParallelBackend]:
    together = make_backend(EnvConfig(id=ID, num_envs=copies, kwargs=kwargs))
    assert isinstance(together, CopiesBackend)
    return together, ParallelBackend([make(ID, **kwargs) for _ in range(copies)], ID)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kwargs", [{"N": 6}, {"N": 3, "local_ratio": 0.25, "max_cycles": 10}])
def test_every_number_is_mpe2s_through_steps_and_resets(kwargs):
    fast, slow = _both(4, **kwargs)
    assert fast.observation_space == slow.observation_space and fast.action_space == slow.action_space
    assert fast.num_envs == slow.num_envs and fast.agents == slow.agents
    assert _same(fast.reset(seed=11), slow.reset(seed=11))
    rng = np.random.default_rng(0)
    collisions = ends = 0
    for t in range(80):
        # half the steps every agent heads for the middle, so agents meet and push each other
        if t % 2:
            actions = rng.integers(0, 5, fast.num_envs)
        else:
            pos = slow_positions(slow)
            actions = np.where(np.abs(pos[:, 0]) > np.abs(pos[:, 1]), np.where(pos[:, 0] > 0, 1, 2),
                               np.where(pos[:, 1] > 0, 3, 4))
        a, b = fast.step(actions), slow.step(actions)
        for name in ("obs", "rewards", "terminated", "truncated", "final_obs"):
            assert _same(getattr(a, name), getattr(b, name)), (t, name)
        assert a.ended == b.ended
        ends += a.ended
        collisions += colliding(slow)
    assert ends >= 3 and collisions > 0, (ends, collisions)


def slow_positions(slow: ParallelBackend) -> np.ndarray:
    """Each instance's own position, from the PettingZoo copies' worlds."""
    return np.concatenate([[a.state.p_pos for a in env.unwrapped.world.agents] for env in slow.envs])


def colliding(slow: ParallelBackend) -> int:
    """Pairs of agents in contact (closer than two radii) in the PettingZoo copies."""
    count = 0
    for env in slow.envs:
        world = env.unwrapped.world
        pos = np.array([a.state.p_pos for a in world.agents])
        gaps = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
        count += int(((gaps < 0.3) & ~np.eye(len(pos), dtype=bool)).sum()) // 2
    return count


def test_settings_the_copies_do_not_have_step_mpe2s_copies():
    assert isinstance(make_backend(EnvConfig(id=ID, num_envs=2, kwargs={"N": 3, "continuous_actions": True})),
                      ParallelBackend)
    assert isinstance(make_backend(EnvConfig(id=ID, num_envs=2, kwargs={"N": 3, "render_mode": None})), CopiesBackend)


def test_an_action_out_of_range_is_refused():
    fast = make_backend(EnvConfig(id=ID, num_envs=1, kwargs={"N": 3}))
    fast.reset(seed=0)
    with pytest.raises(ValueError, match="actions are 0..4"):
        fast.step(np.array([0, 5, 1]))


def test_a_marless_job_in_virtual_time_records_the_same_with_either(tmp_path, monkeypatch):
    """The shipped MAPPO workload, two actors and two rounds in virtual time (which repeats itself bit for bit): its
    run.h5 is the same dataset by dataset whether the actors step the numpy copies or mpe2's."""
    import h5py

    from hpcrl.config import load_config
    from hpcrl.envs.registry import EnvSpec
    from hpcrl.runtime.plan import make_plan
    from hpcrl.runtime.runners import sim

    def record(name: str) -> dict:
        run_dir = tmp_path / name
        cfg = load_config(str(Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "mpe_spread_mappo.yaml"),
                          ["launch.runner=sim", "actors.count=2", "stop.max_rounds=2", "algo.num_sgd_iter=2",
                           "io.tensorboard=false", f"io.run_dir={run_dir}"])
        result = sim.run(make_plan(cfg), run_dir)
        assert result.stop_reason.startswith("stop.max_rounds"), result.message
        out = {}
        with h5py.File(run_dir / "run.h5", "r", locking=False) as f:
            f.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
        return out

    fast = record("copies")
    monkeypatch.setattr(EnvSpec, "load_copies", lambda self: None)
    slow = record("pettingzoo")
    assert fast.keys() == slow.keys() and len(fast) > 50
    assert [k for k in fast if np.asarray(fast[k]).tobytes() != np.asarray(slow[k]).tobytes()] == []
    assert len(fast["episodes/return"]) >= 16


def test_the_bench_times_both_and_finds_them_the_same(capsys):
    from hpcrl.bench.env_copies import main

    assert main(["--copies", "2", "--steps", "5", "--rounds", "2"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith(ID)]
    assert len(row) == 1 and row[0].split()[-1] == "yes" and float(row[0].split()[-2]) > 1, row
