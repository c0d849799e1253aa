"""Sharded parameter ranks (``aggregation.shards``, docs/architecture.md "Sharded parameter ranks").

- where slices are cut, and that S slices step every float exactly as one optimizer over the whole buffer does;
- the torn-version body (tests/mpi_programs/shard_stress.py) on the RMA windows and on the in-memory twins;
- a whole MPI job: with sync admission and on-policy actors, 3 shards end with the same weights as one
  parameter rank, element-wise, after the same versions;
- bad input: one line, exit 2.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi_programs.launcher import run_mpi
from mpi_programs.shard_stress import run_threads

from hpcrl.cli import main as cli_main
from hpcrl.config import load_config
from hpcrl.errors import ConfigError
from hpcrl.io import read_table
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.record.checkpoint import load_checkpoint
from hpcrl.runtime.roles.push_apply import apply_mode
from hpcrl.runtime.roles.sampler import describe_env
from hpcrl.runtime.roles.shard import SliceModel
from hpcrl.runtime.runners.job import role_parts
from hpcrl.runtime.shards import ALIGN, bounds, cut_points, param_sizes
from hpcrl.runtime.topology import plan_roles

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "hpcrl" / "configs" / "cartpole.yaml")
SYNC_JOB = ["env.num_envs=2", "actors.count=1", "actors.on_policy=true", "aggregation.policy=sync",
            "learners.push=gradient", "algo.train_batch_size=32", "algo.minibatch_size=16", "algo.num_sgd_iter=2", "stop.max_rounds=5",
            "algo.kl_coeff=0.2", "io.log_seconds=60"]
"""4 versions a round (2 passes of 2 minibatches), 5 rounds: PPO's lr anneal and its KL coefficient (in shard 2's
slice, set by rank 0's end_round) both change on the way."""


def test_slices_start_at_a_tensor_or_a_block_of_one():
    sizes = [256, 64, 4096, 64, 128, 2, 1]
    points = cut_points(sizes)
    assert points[:4] == [0, 256, 320, 320 + ALIGN] and points[-1] == sum(sizes)
    for S in range(1, len(points)):
        b = bounds(sizes, S)
        assert b[0] == 0 and b[-1] == sum(sizes) and all(x < y for x, y in zip(b, b[1:])) and set(b) <= set(points)
    assert bounds([1_000_000], 4) == [0, 249856, 500224, 750080, 1_000_000]  # even to a block
    with pytest.raises(ValueError, match=f"split at most {len(points) - 1} ways"):
        bounds(sizes, len(points))


def test_the_shards_are_the_ranks_after_rank_0():
    roles = plan_roles(6, 1, 1, 2, shards=3)
    assert [(r.role, r.group_rank) for r in roles] == [("parameter", -1), ("shard", 1), ("shard", 2),
                                                      ("learner", 0), ("actor", -1), ("actor", -1)]
    with pytest.raises(ConfigError, match="5 ranks but the config needs 3 parameter"):
        plan_roles(5, 1, 1, 2, shards=3)


@pytest.mark.parametrize("push", ["gradient", "update"])
def test_three_slices_step_every_float_as_one_optimizer_does(push):
    """PPO's Adam (gradient push) or the outer step (update push) on three SliceModels equals the one optimizer over
    the whole model bit for bit, with the lr changing every step (a cut inside a tensor's last vector would not)."""
    cfg = load_config(CARTPOLE, [f"learners.push={push}", "aggregation.outer_momentum=0.9"] if push == "update" else [])
    plan = make_plan(cfg)
    algo, whole, _ = role_parts(plan, describe_env(cfg.env), torch.device("cpu"))
    _, split, _ = role_parts(plan, describe_env(cfg.env), torch.device("cpu"))
    one = apply_mode(push, algo, whole, None, cfg.aggregation, 1)
    b = bounds(param_sizes(split), 3)
    parts = [apply_mode(push, algo, SliceModel(split, slice(b[s], b[s + 1])), None, cfg.aggregation, 1)
             for s in range(3)]
    optimizers = [one.make_optimizer()] + [p.make_optimizer() for p in parts]
    rng = np.random.default_rng(0)
    for k in range(6):
        g = (rng.standard_normal(whole.flat.num_params) * 0.01).astype(np.float32)
        g[-1] = 0.0  # PPO's KL coefficient is not trained
        for opt in optimizers:
            opt.param_groups[0]["lr"] = 1e-3 * (1 - k / 10)
        one.apply(optimizers[0], g)
        for s, (p, opt) in enumerate(zip(parts, optimizers[1:])):
            p.apply(opt, g[b[s]:b[s + 1]])
        assert np.array_equal(whole.flat.numpy(), split.flat.numpy()), f"step {k}"


@pytest.mark.parametrize("backend", ["threads", pytest.param("mpi", marks=[pytest.mark.mpi, pytest.mark.slow])])
def test_a_reader_never_sees_a_torn_version(backend):
    # 3 shards (one leading, one at once, one with short sleeps) and 2 readers; history 2: a shard's publish
    # rewrites the slot of the version before the newest, which slow readers are still copying
    args = (3, 400, 30_000, 2)
    said = run_mpi(5, "shard_stress", *args, timeout=60) if backend == "mpi" else run_threads(5, *args)
    assert "OK torn_versions shards=3 size=5 versions=400" in said


def _run(tmp_path: Path, shards: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hpcrl", "run", CARTPOLE,
           *[a for o in [*SYNC_JOB, f"aggregation.shards={shards}", f"io.run_dir={tmp_path / f's{shards}'}"]
             for a in ("-o", o)]]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.mpi
@pytest.mark.slow
def test_three_shards_make_the_weights_of_one_parameter_rank_element_wise(tmp_path):
    jobs = {S: _run(tmp_path, S) for S in (1, 3)}  # side by side: each is mostly start-up
    for S, proc in jobs.items():
        out, _ = proc.communicate(timeout=150)
        assert proc.returncode == 0, f"shards={S}:\n{out[-3000:]}"
    one, three = (load_checkpoint(tmp_path / f"s{S}") for S in (1, 3))
    assert one["version"] == three["version"] == 20
    assert torch.equal(one["params"], three["params"]), (one["params"] - three["params"]).abs().max()
    initial = role_parts(make_plan(load_config(CARTPOLE, SYNC_JOB)), describe_env(load_config(CARTPOLE).env),
                         torch.device("cpu"))[1].flat.params
    assert not torch.equal(initial, three["params"]) and three["params"][-1] != initial[-1]  # trained; KL moved
    g1, g3 = (read_table(tmp_path / f"s{S}" / "run.h5", "gradients") for S in (1, 3))
    assert np.array_equal(g1["base_version"], g3["base_version"]) and np.array_equal(g1["loss"], g3["loss"])
    ranks = read_table(tmp_path / "s3" / "run.h5", "rank_map")
    assert list(ranks["role"][:3]) == [0, 0, 0] and list(ranks["index"][:3]) == [0, 1, 2]  # shards are parameter ranks


@pytest.mark.mpi
def test_a_shard_that_fails_ends_the_job_naming_it(tmp_path):
    cmd = [sys.executable, "-m", "hpcrl", "run", CARTPOLE, *[a for o in [
        *SYNC_JOB, "aggregation.shards=2", "stop.max_rounds=100000", "debug.raise_on_rank=1",
        "debug.raise_after_seconds=1", f"io.run_dir={tmp_path / 'run'}"] for a in ("-o", o)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "rank 1 (shard on" in done.stdout + done.stderr, done.stdout[-2000:]


@pytest.mark.parametrize("args, says", [
    (["-o", "aggregation.shards=40"], "aggregation.shards=40: the model's 9156 floats in 13 tensors split at most"),
    (["--ranks", "4", "-o", "aggregation.shards=3"], "--ranks 4: too few; this config needs 3 parameter"),
    (["--runner", "serial", "-o", "aggregation.shards=2"], "launch.runner=serial runs one parameter role"),
    (["--runner", "sim", "-o", "aggregation.shards=2"], "launch.runner=sim runs one parameter role"),
    (["-o", "aggregation.shards=2", "-o", "actors.weight_sync=aaps"], "actors.weight_sync=aaps needs the whole"),
    (["-o", "aggregation.shards=0"], "aggregation.shards"),
])
def test_shards_the_job_cannot_have_are_one_line(args, says, capsys):
    assert cli_main(["run", CARTPOLE, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_a_resume_of_a_sharded_run_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(load_config(CARTPOLE, ["aggregation.shards=2"]).to_yaml())
    (run / "checkpoints").mkdir()
    torch.save({}, run / "checkpoints" / "latest.pt")
    assert cli_main(["run", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "aggregation.shards=2 runs are not resumable yet" in err and len(err.splitlines()) == 1, err


@pytest.mark.mpi
@pytest.mark.slow
def test_the_shard_push_bench_prints_each_shards_cost(capsys):
    from hpcrl.bench.shard_push import main

    assert main(["--sizes", "4096", "--shards", "2", "--pushes", "10"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1], r[4]) for r in rows] == [("4096", "2", "8192")]  # 4 P / S bytes per version and shard
    assert float(rows[0][2]) > 0 and float(rows[0][3]) > 0


@pytest.mark.mpi
def test_a_bench_worker_job_that_fails_or_hangs_is_one_line():
    from hpcrl.bench.mpi_worker import WorkerFailed, run_worker

    with pytest.raises(WorkerFailed, match=r"^the job failed \(\d+\)$"):
        run_worker(1, "hpcrl.no_such_module", [], 60, "the job")
    with pytest.raises(WorkerFailed, match=r"^the job was killed after 2 s$"):
        run_worker(1, "timeit", ["-n", "1", "-r", "1", "import time; time.sleep(60)"], 2, "the job")
