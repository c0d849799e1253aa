"""The scale model (hpcrl/bench/scale_predict.py) on hand-made costs, and one quick run of its measuring part."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from hpcrl.bench.scale_predict import (Costs, Interconnect, Layout, Linear, Workload, perlmutter, predict,
                                       saturation_nodes, scaling_efficiency)
from hpcrl.runtime.transport.report_packing import FLUSH_SECONDS

ROOT = Path(__file__).resolve().parent.parent
MS = 1e-3


def costs(**kw) -> Costs:
    """Cheap everywhere unless given: the tests make one part expensive and see it bind."""
    base = dict(push=Linear(0.0), receive=Linear(0.0), admit=0.0, apply_gradient=Linear(0.0),
                apply_update=Linear(0.0), publish=Linear(0.0), fetch=Linear(0.0), node_copy=Linear(0.0),
                fragment_send=0.0, report=0.0, actor_step=1e-9, gradient=1e-9)
    return Costs(**{**base, **kw})


WORK = Workload(floats=10_000, batch_steps=256, minibatches=8, fragment_steps=128)


def test_rank0_saturates_where_its_cost_says():
    c = costs(receive=Linear(1 * MS), gradient=2 * MS)  # rank 0: 1 ms per push; a learner: 2 ms per gradient
    lay = lambda learners: Layout(nodes=1, actors=1000, actor_nodes=1, learners=learners)  # noqa: E731
    one = predict(c, WORK, lay(1))  # 500 pushes/s offered, rank 0 could take 1,000/s
    assert one.bottleneck == "learners"
    assert one.pushes_per_s == pytest.approx(500.0) and one.rank0_busy == pytest.approx(0.5)
    two = predict(c, WORK, lay(2))  # exactly what rank 0 takes
    assert two.pushes_per_s == pytest.approx(1000.0) and two.rank0_busy == pytest.approx(1.0)
    many = predict(c, WORK, lay(4))
    assert many.bottleneck == "rank 0 CPU"
    assert many.pushes_per_s == pytest.approx(1000.0) and many.rank0_busy == pytest.approx(1.0)
    assert many.env_steps_per_s == pytest.approx(1000.0 * WORK.batch_steps / WORK.minibatches)
    assert many.bounds["learners"] == pytest.approx(2 * many.env_steps_per_s)


def test_update_push_lifts_rank0_by_the_minibatches_per_batch():
    c = costs(receive=Linear(0.2 * MS, 1e-8), publish=Linear(0.1 * MS, 1e-8))
    lay = Layout(nodes=1, actors=10**6, actor_nodes=1, learners=10**4)
    grad, upd = predict(c, WORK, lay, "gradient"), predict(c, WORK, lay, "update")
    assert grad.bottleneck == upd.bottleneck == "rank 0 CPU"
    assert upd.env_steps_per_s / grad.env_steps_per_s == pytest.approx(WORK.minibatches)
    assert upd.pushes_per_s == pytest.approx(grad.pushes_per_s)  # rank 0 takes as many pushes/s either way
    # the actors' fragment reports do not fall with the pushes: with them the lift is smaller, as the costs say
    with_reports = replace(c, report=0.5 * MS)
    g2, u2 = predict(with_reports, WORK, lay, "gradient"), predict(with_reports, WORK, lay, "update")
    per_push = 0.3 * MS + 2e-8 * WORK.floats  # receive + publish at P
    reports = 0.5 * MS / WORK.fragment_steps
    expected = (WORK.minibatches / WORK.batch_steps * per_push + reports) / (per_push / WORK.batch_steps + reports)
    assert u2.env_steps_per_s / g2.env_steps_per_s == pytest.approx(expected)
    assert 1 < expected < WORK.minibatches


def test_per_node_fetch_divides_link_traffic_by_actors_per_node_when_versions_are_rare():
    # update push on a long batch: far fewer versions than fragments, so every actor fetches every version
    work = Workload(floats=1_000_000, batch_steps=1_000_000, minibatches=8, fragment_steps=100)
    lay = Layout(nodes=11, actors=640, actor_nodes=10, learners=1, nic_bytes_per_s=1e9)
    c = costs(gradient=1e-12)
    per_actor, per_node = predict(c, work, lay, "update", "actor"), predict(c, work, lay, "update", "node")
    assert per_actor.bottleneck == per_node.bottleneck == "rank 0 link"
    # the learner's own fetch (one per version) is in both
    assert per_node.env_steps_per_s / per_actor.env_steps_per_s == pytest.approx((640 + 1) / (10 + 1))
    assert per_actor.rank0_out_bytes_per_s == pytest.approx(1e9)


def test_a_weight_tree_leaves_rank_0_fanout_fetches_a_version_and_allreduce_groups_read_back_untrained_values():
    work = Workload(floats=1_000_000, batch_steps=1_000_000, minibatches=8, fragment_steps=100)
    lay = Layout(nodes=101, actors=6400, actor_nodes=100, learners=8, nic_bytes_per_s=1e9)
    c = costs(gradient=1e-12)
    flat, tree = predict(c, work, lay, "update", "node"), predict(c, work, lay, "update", "node", tree=4)
    assert flat.bottleneck == tree.bottleneck == "rank 0 link"
    # per version (one per push): 100 nodes (or the tree's first 4), and the pushing learner reading the whole weights
    assert tree.env_steps_per_s / flat.env_steps_per_s == pytest.approx((100 + 1) / (4 + 1))
    net = Interconnect(latency=0.0, node_bytes_per_s=1e15, learners_per_node=1)
    P, B, U = work.floats, work.batch_steps, work.untrained
    for fanout, from_rank0 in ((0, 100), (4, 4)):  # a version per batch of all 8 groups; each group reads U floats
        ring = predict(c, work, lay, fetch="node", topology="allreduce", net=net, tree=fanout)
        per_step = 4 * P * from_rank0 / (8 * B) + 4 * U * 8 / (8 * B)
        assert ring.rank0_out_bytes_per_s / ring.env_steps_per_s == pytest.approx(per_step)
    for bad in ({"tree": 1, "fetch": "node"}, {"tree": 4, "fetch": "actor"}):
        with pytest.raises(ValueError, match="tree: a fanout of 2 or more"):
            predict(c, work, lay, "update", **bad)


def test_per_node_fetch_changes_nothing_when_every_fragment_meets_a_new_version():
    lay = Layout(nodes=3, actors=128, actor_nodes=2, learners=8, nic_bytes_per_s=1e8)
    c = costs(gradient=1e-6)
    a, n = predict(c, WORK, lay, "gradient", "actor"), predict(c, WORK, lay, "gradient", "node")
    assert a.rank0_out_bytes_per_s == pytest.approx(n.rank0_out_bytes_per_s)
    assert a.env_steps_per_s == pytest.approx(n.env_steps_per_s)


def test_shared_cores_bound_the_sum_of_every_roles_seconds():
    c = costs(actor_step=50e-6, gradient=0.2 * MS, receive=Linear(0.1 * MS))
    lay = Layout(nodes=2, actors=4, actor_nodes=2, learners=1, cores=2.0)
    r = predict(c, WORK, lay)
    p = WORK.minibatches / WORK.batch_steps
    assert r.bottleneck == "cores"  # each role alone could go faster: actors 80K, learner 160K, rank 0 320K steps/s
    assert min(v for k, v in r.bounds.items() if k != "cores") > 2 * r.env_steps_per_s
    assert r.env_steps_per_s == pytest.approx(2.0 / (50e-6 + p * 0.2 * MS + p * 0.1 * MS))


def test_perlmutter_saturation_node_count_and_how_update_push_moves_it():
    # rank 0: 0.3 ms per push (3,333/s); a learner rank: 4 ms per gradient (250/s): 14 learners saturate it,
    # 4 learner ranks per GPU node and half the nodes GPU nodes: 4 GPU nodes, i.e. 7 nodes (round(3.5) = 4)
    c = costs(receive=Linear(0.3 * MS), gradient=4 * MS)
    assert saturation_nodes(c, WORK, "gradient", "actor") == 7
    assert predict(c, WORK, perlmutter(6), "gradient").bottleneck == "learners"
    assert predict(c, WORK, perlmutter(7), "gradient").bottleneck == "rank 0 CPU"
    # update push: a learner makes 8 minibatch steps per push, so 8 x 14 = 107 learner ranks, 27 GPU nodes, 54 nodes
    n = saturation_nodes(c, WORK, "update", "actor")
    assert perlmutter(n).learners * 250 / WORK.minibatches >= 1 / (0.3 * MS)
    assert perlmutter(n - 1).learners * 250 / WORK.minibatches < 1 / (0.3 * MS)
    assert n == 54


def test_hierarchical_aggregation_and_shards_lift_rank0_as_their_costs_say():
    c = costs(receive=Linear(0.1 * MS, 20e-9), publish=Linear(0.1 * MS, 10e-9))
    lay = Layout(nodes=1, actors=10**6, actor_nodes=1, learners=10**5)
    base = predict(c, WORK, lay)
    sync = predict(c, WORK, lay, admission="sync")
    # sync: one version per push of every learner, so rank 0's steps and publishes all but vanish here
    assert sync.env_steps_per_s > base.env_steps_per_s
    # node combine, as built: rank 0 receives one push in 4, and still admits each learner's
    per_push = lambda c, combine: c.receive(WORK.floats) / combine + c.admit  # noqa: E731
    combined = predict(c, WORK, lay, admission="sync", combine=4)
    assert combined.env_steps_per_s / sync.env_steps_per_s == pytest.approx(per_push(c, 1) / per_push(c, 4), rel=1e-3)
    assert combined.pushes_per_s / combined.env_steps_per_s == pytest.approx(
        sync.pushes_per_s / sync.env_steps_per_s / 4)
    with pytest.raises(ValueError, match="sync with combine"):
        predict(c, WORK, lay, combine=4)
    sharded = predict(c, WORK, lay, shards=4)
    per_push = lambda P: 0.2 * MS + 30e-9 * P  # noqa: E731
    assert sharded.env_steps_per_s / base.env_steps_per_s == pytest.approx(per_push(WORK.floats) / per_push(2500))


def test_allreduce_costs_rabenseifners_latencies_and_bytes_across_the_learner_nodes():
    net = Interconnect(latency=5e-6, node_bytes_per_s=1e9, learners_per_node=4)
    assert net.allreduce(10**6, 4) == 0.0  # one node: summed over NVLink, left out
    two = 2 * 1 * 5e-6 + 2 * (1 / 2) * 4e6 / 1e9  # 2 nodes: 2 log2(2) latencies, half the bytes each way
    assert net.allreduce(10**6, 8) == pytest.approx(two)
    assert net.allreduce(10**6, 4 * 100) == pytest.approx(2 * 7 * 5e-6 + 2 * 99 / 100 * 4e6 / 1e9)  # ceil(log2 100) = 7


def test_allreduce_has_no_parameter_rank_to_saturate_and_rank_0_takes_one_push_per_batch_of_all_learners():
    c = costs(receive=Linear(1 * MS), publish=Linear(1 * MS), gradient=2 * MS, apply_gradient=Linear(0.5 * MS))
    net = Interconnect(latency=0.0, node_bytes_per_s=1e12, learners_per_node=1)
    lay = Layout(nodes=64, actors=10**6, actor_nodes=64, learners=64)
    server, ring = predict(c, WORK, lay, "update"), predict(c, WORK, lay, topology="allreduce", net=net)
    assert server.bottleneck == "rank 0 CPU" and ring.bottleneck == "learners"
    per_batch = 1 / (64 * WORK.batch_steps)  # one push and version per batch of all 64 learners
    per_step = (WORK.minibatches / WORK.batch_steps) * (2 * MS + net.allreduce(WORK.floats, 64) + 0.5 * MS) \
        + per_batch * (c.push(WORK.floats) + 64 * c.fetch(WORK.floats))
    assert ring.env_steps_per_s == pytest.approx(64 / per_step)
    assert ring.pushes_per_s == pytest.approx(ring.env_steps_per_s * per_batch)
    assert ring.rank0_in_bytes_per_s == pytest.approx(4 * WORK.floats * ring.pushes_per_s)
    with pytest.raises(ValueError, match="topology must be one of"):
        predict(c, WORK, lay, topology="ring")


def test_per_node_reports_divide_rank0s_record_work_by_the_actors_per_node():
    c = costs(report=1 * MS)
    lay = Layout(nodes=10, actors=640, actor_nodes=10, learners=10**6)
    per_fragment, per_node = predict(c, WORK, lay), predict(c, WORK, lay, reports="node")
    assert per_fragment.bottleneck == per_node.bottleneck == "rank 0 CPU"
    assert per_fragment.env_steps_per_s == pytest.approx(WORK.fragment_steps / (1 * MS))
    assert per_node.env_steps_per_s / per_fragment.env_steps_per_s == pytest.approx(64)
    # each report in a node's message costs its unpickling: 64 reports at 1 ms + 63 x 0.25 ms
    each = predict(replace(c, report_each=0.25 * MS), WORK, lay, reports="node")
    assert each.env_steps_per_s / per_fragment.env_steps_per_s == pytest.approx(64 / (1 + 63 * 0.25))
    # the record's rows stay one per report whichever way the reports come: they cap both alike
    rows = replace(c, record=1 * MS)
    assert predict(rows, WORK, lay).env_steps_per_s == pytest.approx(WORK.fragment_steps / (2 * MS))
    assert predict(rows, WORK, lay, reports="node").env_steps_per_s == pytest.approx(
        WORK.fragment_steps / ((1 / 64 + 1) * MS))
    columns = replace(rows, record_node=0.25 * MS)  # a node's reports appended as columns
    assert predict(columns, WORK, lay, reports="node").env_steps_per_s == pytest.approx(
        WORK.fragment_steps / ((1 / 64 + 0.25) * MS))
    assert predict(columns, WORK, lay).env_steps_per_s == pytest.approx(WORK.fragment_steps / (2 * MS))


def test_per_node_summaries_cost_rank0_one_summary_per_node_and_flush_interval():
    lay = Layout(nodes=10, actors=640, actor_nodes=10, learners=10**6)
    c = costs(report=1 * MS, record=1 * MS, summary=2 * MS, actor_step=10e-6)
    # 64 actors at 100K env steps/s each fill a 50 ms summary with 320K env steps: 2 ms of rank 0 per 320K steps
    steps = 64 * FLUSH_SECONDS / 10e-6
    assert predict(c, WORK, lay, reports="summary").bounds["rank 0 CPU"] == pytest.approx(steps / (2 * MS))
    slow = replace(c, actor_step=1.0)  # under a fragment per interval: a summary holds at least one fragment
    assert predict(slow, WORK, lay, reports="summary").bounds["rank 0 CPU"] == pytest.approx(
        WORK.fragment_steps / (2 * MS))
    # the relay's rows are the node's actors' work: node_pack per summary, spread over its env steps
    packed = replace(c, node_pack=64 * MS)
    assert predict(packed, WORK, lay, reports="summary").bounds["actors"] == pytest.approx(
        640 / (10e-6 + 64 * MS / steps))
    with pytest.raises(ValueError, match="no 'summary'"):  # costs measured before summaries were built
        predict(costs(), WORK, lay, reports="summary")
    # past 100 nodes of actors the relays send less often: rank 0 gets at most 2,000 summaries a second
    many = Layout(nodes=1000, actors=64_000, actor_nodes=1000, learners=10**6)
    r = predict(c, WORK, many, reports="summary")
    assert r.bounds["rank 0 CPU"] == pytest.approx(64 * (1000 / 2000) / 10e-6 / (2 * MS))  # 0.5 s summaries


def test_scaling_efficiency_is_one_while_only_the_nodes_work_and_falls_once_rank0_binds():
    c = costs(actor_step=100e-6, gradient=1 * MS, receive=Linear(0.01 * MS))  # rank 0: 100K pushes/s
    rate, eff = scaling_efficiency(c, WORK, 2, push="update")
    assert eff == pytest.approx(1.0)
    assert scaling_efficiency(c, WORK, 64, push="update")[1] == pytest.approx(1.0)  # actors and learners scale
    n = saturation_nodes(c, WORK, "update", "actor")
    big, eff_big = scaling_efficiency(c, WORK, 4 * n, push="update")
    assert eff_big < 0.5 and big == pytest.approx(predict(c, WORK, perlmutter(n), "update").env_steps_per_s, rel=0.3)


def test_linear_fit_recovers_a_line_and_keeps_terms_non_negative():
    f = Linear.fit([1000, 100_000, 1_000_000], [1e-4 + 2e-9 * n for n in (1000, 100_000, 1_000_000)])
    assert f.fixed == pytest.approx(1e-4) and f.per_float == pytest.approx(2e-9)
    assert Linear.fit([10, 20], [2.0, 1.0]).per_float == 0.0
    assert math.isclose(Linear.fit([5], [3.0])(10**6), 3.0)


def test_sacct_cpu_times_read_as_seconds():
    from hpcrl.bench.scale_model import sacct_seconds

    assert sacct_seconds("00:34.590") == pytest.approx(34.59)
    assert sacct_seconds("01:02:03") == pytest.approx(3723)
    assert sacct_seconds("1-00:00:01.5") == pytest.approx(86401.5)


@pytest.mark.slow
@pytest.mark.mpi
def test_measuring_part_runs_the_real_micro_run():
    from hpcrl.bench import scale_measure

    config = str(ROOT / "hpcrl" / "configs" / "cartpole.yaml")
    work, steps = scale_measure.workload(config, [], 0.05)
    assert work.floats > 1000 and work.minibatches == 20 and work.fragment_steps == 128
    got = scale_measure.transport(config, [work.floats, 200_000], 0.05, tcp=False, timeout=120)
    c = scale_measure.costs_from(got, steps)
    for name in ("push", "receive", "apply_gradient", "apply_update", "publish", "fetch", "node_copy"):
        small, large = getattr(c, name)(work.floats), getattr(c, name)(200_000)
        assert 0 < small < 1.0 and small <= large, (name, small, large)
    assert 0 < c.fragment_send < 1.0 and 0 < c.report < 1.0 and 0 < c.admit < 1.0
    assert 0 <= c.report_each < c.report  # a further report in a node's message costs less than a message
    assert 0 < c.record < 1e-2 and 0 < c.record_node < 1e-2
    assert 0 < c.summary < 1e-1 and 0 < c.node_pack < 1.0  # a node's summary: rank 0's part, the relay's part
    assert 0 < c.actor_step < 1e-2 and 0 < c.gradient < 1.0
    r = predict(c, work, Layout(nodes=1, actors=2, actor_nodes=1, learners=1, cores=2.0))
    assert r.env_steps_per_s > 0 and r.bottleneck in {"actors", "learners", "rank 0 CPU", "cores"}


@pytest.mark.parametrize("config", ["cartpole", "mpe_spread_ippo"])
def test_workload_measures_a_real_minibatch_of_any_algorithm(config):
    """scale-model's workload (the sim's measured costs) cuts its gradient's minibatch from a sampled, prepared
    batch, so a MARL config (its agent column) is measured too."""
    from hpcrl.bench.scale_measure import workload

    # small sizes: the MPE env steps at about 1 ms per agent, and the shipped batch is 24 fragments of 1,200
    small = ["env.num_envs=2", "actors.fragment_length=5", "algo.train_batch_size=20", "algo.minibatch_size=10"]
    work, got = workload(str(Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / f"{config}.yaml"), small, 0.05)
    assert work.minibatches > 0 and all(got[k] > 0 for k in ("actor_step", "gradient", "prepare_per_step"))
