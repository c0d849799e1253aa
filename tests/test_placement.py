"""launch.placement: which rank takes which role, from the ranks' hostnames (hpcrl/runtime/placement.py)."""
from __future__ import annotations

import pytest

from hpcrl.config import load_config
from hpcrl.errors import ConfigError
from hpcrl.runtime.placement import block_hosts, role_order
from hpcrl.sites import load_site
from hpcrl.submit import plan_job

BLOCK = block_hosts(9, 3)  # node0: ranks 0-2, node1: 3-5, node2: 6-8
CYCLIC = [f"node{r % 3}" for r in range(9)]  # srun --distribution=cyclic: node0 holds 0, 3, 6


def test_in_launch_order_is_the_launch_order():
    assert role_order(CYCLIC, 2) == list(range(9))


def test_learners_first_packs_learners_beside_the_parameter_rank_whatever_the_launch_order():
    assert role_order(BLOCK, 2, "learners_first") == list(range(9))
    # cyclic: the learners are node0's other ranks (3, 6), the actors node1's then node2's
    assert role_order(CYCLIC, 2, "learners_first") == [0, 3, 6, 1, 4, 7, 2, 5, 8]


def test_learners_per_node_and_a_parameter_rank_apart():
    assert role_order(CYCLIC, 2, "learners_first", learners_per_node=1) == [0, 3, 1, 6, 4, 7, 2, 5, 8]
    # apart: node0 keeps the parameter rank and actors; the learners go to node1
    order = role_order(BLOCK, 2, "learners_first", parameter="apart")
    assert order == [0, 3, 4, 1, 2, 5, 6, 7, 8]
    assert {BLOCK[r] for r in order[1:3]} == {"node1"}


def test_learners_that_do_not_fit_are_one_line():
    with pytest.raises(ValueError, match="4 learner rank\\(s\\) do not fit .*learners_per_node=1, parameter=apart"):
        role_order(BLOCK, 4, "learners_first", learners_per_node=1, parameter="apart")


def test_options_of_learners_first_need_it():
    with pytest.raises(ConfigError, match="read only with launch.placement.roles=learners_first"):
        load_config(None, ["launch.placement.learners_per_node=2"])


def test_submit_refuses_a_placement_that_does_not_fit_before_writing_anything(tmp_path):
    cfg = load_config(None, ["learners.groups=4", "algo.minibatch_size=64", "launch.placement.roles=learners_first",
                             "launch.placement.learners_per_node=1", "launch.placement.parameter=apart"])
    with pytest.raises(ConfigError, match="do not fit"):  # 4 learners on 1 node of 7 ranks, apart: only 0 fit
        plan_job(cfg, load_site("local-cluster"), nodes=1, run_dir=str(tmp_path / "run"))
    assert not list(tmp_path.iterdir())


def test_submit_refuses_more_learners_on_a_node_than_gpus(tmp_path):
    cfg = load_config(None, ["learners.groups=6", "actors.count=57", "algo.train_batch_size=1536", "launch.placement.roles=learners_first"])
    with pytest.raises(ConfigError, match="6 learner ranks on one node of perlmutter-gpu, which has 4 GPUs"):
        plan_job(cfg, load_site("perlmutter-gpu"), nodes=1, account="m0000", run_dir=str(tmp_path / "run"))
    fits = load_config(None, ["learners.groups=6", "actors.count=57", "algo.train_batch_size=1536", "launch.placement.roles=learners_first",
                              "launch.placement.learners_per_node=4"])
    assert plan_job(fits, load_site("perlmutter-gpu"), nodes=2, account="m0000", run_dir=str(tmp_path / "run")).nodes == 2


@pytest.mark.parametrize("site, kwargs, message", [
    ("polaris", {"nodes": 2, "min_nodes": 1, "account": "p"}, "polaris schedules with pbs, which has no node range"),
    ("local-cluster", {"nodes": 2, "min_nodes": 3}, "--min-nodes: 3; allowed: 1 to --nodes \\(2\\)"),
    ("local-cluster", {"nodes": 3, "min_nodes": 1}, "--min-nodes 1: 1 node\\(s\\) x 2 ranks = 2: too few"),
])
def test_min_nodes_that_cannot_work_are_refused_before_anything_is_written(site, kwargs, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        plan_job(load_config(None, ["actors.count=4"]), load_site(site), run_dir=str(tmp_path / "run"), **kwargs)
    assert not list(tmp_path.iterdir())


def test_min_nodes_counts_the_ranks_when_the_job_starts(tmp_path):
    from hpcrl.submit import render

    job = plan_job(load_config(None, ["actors.count=4"]), load_site("local-cluster"), nodes=3, min_nodes=2,
                   run_dir=str(tmp_path / "run"))
    script = render(job)
    assert "#SBATCH --nodes=2-3" in script and "#SBATCH --ntasks" not in script  # a requeue would keep a task count
    assert 'RANKS=$((SLURM_JOB_NUM_NODES * 2))' in script and 'srun --ntasks="$RANKS"' in script
    assert script.count("--fit-actors") == 2  # the start and the resume
