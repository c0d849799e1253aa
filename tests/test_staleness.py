"""Admission policies on hand-worked queues (Stellaris Section V-C, Eqs. 3-4, the code variant, and the
Fig. 11 baselines SSP and softsync)."""
from types import SimpleNamespace

import numpy as np
import pytest

from hpcrl.config import AggregationConfig
from hpcrl.errors import ConfigError
from hpcrl.staleness import (
    SSP,
    GradientRecord,
    PureAsync,
    SoftSync,
    Stellaris,
    StellarisCode,
    Sync,
    aggregate,
    lr_scale,
    make_policy,
)


def rec(group, seq, base, value=1.0):
    return GradientRecord(group=group, seq=seq, base_version=base, samples=10,
                          grad=np.full(3, value, dtype=np.float32))


def keys(adm):
    return [[r.key for r, _ in step] for step in adm.steps]


def observed(policy, staleness_values, version=100):
    """Run round 0 with one arrival per staleness value, then end it."""
    for i, s in enumerate(staleness_values):
        adm = policy.admit([rec(0, i, version - s)], version, active_groups=1)
        assert adm.staleness == {(0, i): s}
        version += 1
    policy.end_round(0)
    return version


def test_lr_scale_eq4():
    assert lr_scale(0, 3) == 1.0
    assert lr_scale(8, 3) == pytest.approx(0.5)
    assert lr_scale(4, 2) == pytest.approx(0.5)
    assert lr_scale(1, 3) == 1.0


def test_pure_async_each_arrival_own_step():
    q = [rec(0, 0, base=5), rec(1, 0, base=3)]
    adm = PureAsync().admit(q, version=5, active_groups=2)
    assert keys(adm) == [[(0, 0)], [(1, 0)]]
    # the second step is applied at version 6
    assert adm.staleness == {(0, 0): 0, (1, 0): 3}
    assert [s for step in adm.steps for _, s in step] == [1.0, 1.0]
    adm.remove_from(q)
    assert q == []
    assert PureAsync().admit([], 5, 1) is None


def test_sync_waits_for_every_active_group_and_averages():
    pol = Sync()
    q = [rec(0, 0, 4, 1.0), rec(0, 1, 4, 5.0)]
    assert pol.admit(q, version=4, active_groups=2) is None
    q.append(rec(1, 0, 3, 3.0))
    adm = pol.admit(q, version=4, active_groups=2)
    assert keys(adm) == [[(0, 0), (1, 0)]]
    assert adm.staleness == {(0, 0): 0, (1, 0): 1}
    np.testing.assert_allclose(aggregate(adm.steps[0]), [2.0, 2.0, 2.0])
    adm.remove_from(q)
    assert [r.key for r in q] == [(0, 1)]
    with pytest.raises(ValueError):
        pol.admit(q, 4, active_groups=0)


def test_stellaris_round0_is_async_and_observes_delta_max():
    pol = Stellaris(d=0.5, v=3)
    assert pol.threshold is None
    q = [rec(0, 0, base=10), rec(1, 0, base=8)]
    adm = pol.admit(q, version=10, active_groups=3)
    assert keys(adm) == [[(0, 0)], [(1, 0)]]
    assert adm.staleness == {(0, 0): 0, (1, 0): 3}  # 10 + 1 - 8
    assert [s for step in adm.steps for _, s in step] == pytest.approx([1.0, 3 ** (-1 / 3)])
    assert pol.admit([rec(2, 0, base=8)], version=12, active_groups=3).staleness == {(2, 0): 4}
    assert pol.delta_max is None
    pol.end_round(0)
    assert pol.delta_max == 4
    assert pol.threshold == pytest.approx(2.0)  # beta_1 = 4 * 0.5
    pol.end_round(1)
    assert pol.threshold == pytest.approx(1.0)


def test_stellaris_mean_staleness_admission_and_lr_scales():
    pol = Stellaris(d=0.5, v=3)
    version = observed(pol, [4])  # delta_max = 4, beta_1 = 2
    q = [rec(0, 0, version - 5, 2.0)]
    assert pol.admit(q, version, active_groups=4) is None  # mean 5
    q.append(rec(1, 0, version, 4.0))
    assert pol.admit(q, version, active_groups=4) is None  # mean 2.5
    q.append(rec(2, 0, version, 6.0))
    adm = pol.admit(q, version, active_groups=4)  # mean 5/3 <= 2
    assert keys(adm) == [[(0, 0), (1, 0), (2, 0)]]
    assert adm.threshold == pytest.approx(2.0)
    assert adm.staleness == {(0, 0): 5, (1, 0): 0, (2, 0): 0}
    scales = [s for _, s in adm.steps[0]]
    assert scales == pytest.approx([5 ** (-1 / 3), 1.0, 1.0])
    expected = (2.0 * 5 ** (-1 / 3) + 4.0 + 6.0) / 3
    np.testing.assert_allclose(aggregate(adm.steps[0]), np.full(3, expected), rtol=1e-6)


def test_stellaris_applies_first_qualifying_prefix():
    pol = Stellaris(d=0.5, v=3)
    version = observed(pol, [4])
    q = [rec(0, 0, version), rec(1, 0, version - 9)]
    adm = pol.admit(q, version, active_groups=4)
    assert keys(adm) == [[(0, 0)]]
    adm.remove_from(q)
    assert [r.key for r in q] == [(1, 0)]
    assert pol.admit(q, version + 1, active_groups=4) is None  # staleness 10 waits


@pytest.mark.parametrize("d, expected", [
    (0.96, [9.6, 9.216, 8.84736]),
    (0.5, [5.0, 2.5, 1.25]),
    (1.0, [10.0, 10.0, 10.0]),
    (0.0, [0.0, 0.0, 0.0]),
])
def test_stellaris_threshold_schedule_eq3(d, expected):
    pol = Stellaris(d=d, v=3)
    observed(pol, [3, 10, 7])
    got = [pol.threshold]
    for k in (1, 2):
        pol.end_round(k)
        got.append(pol.threshold)
    assert got == pytest.approx(expected)


def test_stellaris_d1_is_pure_async():
    pol = Stellaris(d=1.0, v=3)
    version = observed(pol, [2])
    adm = pol.admit([rec(0, 0, version - 50)], version, active_groups=4)  # 50 > beta = 2
    assert keys(adm) == [[(0, 0)]]
    assert adm.steps[0][0][1] == pytest.approx(50 ** (-1 / 3))


def test_stellaris_d0_is_synchronous():
    pol = Stellaris(d=0.0, v=3)
    version = observed(pol, [3])
    q = [rec(0, 0, version)]
    assert pol.admit(q, version, active_groups=2) is None  # fresh, but group 1 missing
    q.append(rec(1, 0, version - 1))
    adm = pol.admit(q, version, active_groups=2)
    assert keys(adm) == [[(0, 0), (1, 0)]]


def test_stellaris_unreachable_threshold_does_not_deadlock():
    pol = Stellaris(d=0.5, v=3)
    version = observed(pol, [1])
    for k in range(1, 5):
        pol.end_round(k)
    assert pol.threshold == pytest.approx(1 / 32)
    q = [rec(0, 0, version - 3), rec(0, 1, version - 2)]
    assert pol.admit(q, version, active_groups=2) is None  # only group 0
    q.append(rec(1, 0, version - 2))
    adm = pol.admit(q, version, active_groups=2)  # mean 7/3 > beta, but every group is in
    assert keys(adm) == [[(0, 0), (0, 1), (1, 0)]]


def test_stellaris_code_delta_max_and_threshold():
    pol = StellarisCode(d=0.9)
    observed(pol, [3, 4, 4])  # mean 3.67 -> delta_max = 3 + 1
    assert pol.delta_max == 4
    got = {}
    for k in range(1, 31):
        got[k] = pol.threshold
        pol.end_round(k)
    assert got[1] == 4.0   # floor(3.6) + 1
    assert got[2] == 4.0   # floor(3.24) + 1
    assert got[5] == 3.0   # floor(2.36) + 1
    assert got[30] == 1.0  # floor(0.17) + 1, clipped below at 1
    big = StellarisCode(d=1.0)
    observed(big, [5])
    assert big.threshold == 6.0  # floor(6) + 1 = 7, clipped to delta_max = 6


def test_stellaris_code_queue_rules():
    pol = StellarisCode(d=0.0)
    version = observed(pol, [2])  # delta_max 3, beta = floor(0) + 1 = 1
    assert pol.threshold == 1.0
    q = [rec(0, 0, version - 5)]
    assert pol.admit(q, version, active_groups=2) is None
    q.append(rec(0, 1, version - 5))  # as many gradients as active groups: apply
    adm = pol.admit(q, version, active_groups=2)
    assert keys(adm) == [[(0, 0)], [(0, 1)]]  # each its own step, in order
    assert adm.staleness == {(0, 0): 5, (0, 1): 6}
    assert all(s == 1.0 for step in adm.steps for _, s in step)
    q = [rec(0, 2, version - 1)]  # mean 1 <= beta
    assert keys(pol.admit(q, version, active_groups=4)) == [[(0, 2)]]


def test_ssp_bounds_the_clock_gap_and_releases_in_order():
    pol = SSP(s=1)
    # group 1 pushes once, then group 0 three times: group 0 joins at group 1's clock (1); its clock
    # 1 and 2 are within s = 1 of group 1's, 3 is not, so (0, 2) waits
    q = [rec(1, 0, 10), rec(0, 0, 10), rec(0, 1, 10), rec(0, 2, 11)]
    adm = pol.admit(q, version=10, active_groups=2)
    assert keys(adm) == [[(1, 0)], [(0, 0)], [(0, 1)]]
    assert adm.staleness == {(1, 0): 0, (0, 0): 1, (0, 1): 2}  # step i is applied at version 10 + i
    assert all(s == 1.0 for step in adm.steps for _, s in step)
    adm.remove_from(q)
    assert pol.admit(q, version=13, active_groups=2) is None
    assert pol.clock == {0: 3, 1: 1} and pol.min_clock == 1
    # group 1's next gradient is applied first, which releases (0, 2) in the same admission
    q.append(rec(1, 1, 12))
    adm = pol.admit(q, version=13, active_groups=2)
    assert keys(adm) == [[(1, 1)], [(0, 2)]]
    assert adm.staleness == {(1, 1): 1, (0, 2): 3}  # 13 - 12; 14 - 11
    assert pol.clock == {0: 4, 1: 2} and pol.min_clock == 2
    assert pol.admit([rec(0, 3, 15)], version=15, active_groups=2) is None  # 4 - 2 > 1


def test_ssp_waits_only_for_groups_that_run():
    pol = SSP(s=0)
    # group 1 has not pushed yet (it may have had no data): group 0 is not held back
    adm = pol.admit([rec(0, 0, 0), rec(0, 1, 0)], version=0, active_groups=2)
    assert keys(adm) == [[(0, 0)], [(0, 1)]]
    # group 1 joins at group 0's clock (2); from then on s = 0 keeps them level: (0, 4) waits for (1, 1)
    q = [rec(1, 0, 2), rec(0, 2, 2), rec(0, 3, 2), rec(0, 4, 2), rec(1, 1, 2)]
    adm = pol.admit(q, version=2, active_groups=2)
    assert keys(adm) == [[(1, 0)], [(0, 2)], [(0, 3)], [(1, 1)], [(0, 4)]]
    assert pol.clock == {0: 5, 1: 4}
    # a third group becomes active and joins at the slowest clock (4), not at 0
    q = [rec(2, 0, 7), rec(0, 5, 7)]
    adm = pol.admit(q, version=7, active_groups=3)
    assert keys(adm) == [[(2, 0)]] and pol.clock == {0: 5, 1: 4, 2: 5}
    adm.remove_from(q)
    q.append(rec(1, 2, 7))
    assert keys(pol.admit(q, version=8, active_groups=3)) == [[(1, 2)], [(0, 5)]]


def test_softsync_averages_every_c_gradients():
    pol = SoftSync(c=3)
    q = [rec(0, 0, 5, 1.0), rec(0, 1, 5, 2.0)]
    assert pol.admit(q, version=6, active_groups=2) is None
    q += [rec(1, 0, 4, 6.0), rec(1, 1, 6, 9.0)]
    adm = pol.admit(q, version=6, active_groups=2)
    assert keys(adm) == [[(0, 0), (0, 1), (1, 0)]]  # the oldest three, any groups
    assert adm.staleness == {(0, 0): 1, (0, 1): 1, (1, 0): 2}
    np.testing.assert_allclose(aggregate(adm.steps[0]), np.full(3, 3.0))
    adm.remove_from(q)
    assert [r.key for r in q] == [(1, 1)]
    assert SoftSync(c=None).admit([rec(0, 0, 1), rec(0, 1, 1)], 1, active_groups=2) is not None  # c = groups
    assert SoftSync(c=None).admit([rec(0, 0, 1)], 1, active_groups=2) is None


def test_make_policy_names_and_error():
    for name, cls in [("stellaris", Stellaris), ("stellaris_code", StellarisCode),
                      ("pure_async", PureAsync), ("sync", Sync), ("ssp", SSP), ("softsync", SoftSync)]:
        pol = make_policy(AggregationConfig(policy=name, d=0.9, v=2, ssp_s=2, softsync_c=4))
        assert isinstance(pol, cls) and pol.name == name
    assert make_policy(AggregationConfig()).d == 0.96
    assert make_policy(AggregationConfig(policy="ssp", ssp_s=5)).s == 5
    assert make_policy(AggregationConfig(policy="softsync", softsync_c=4)).c == 4
    with pytest.raises(ConfigError, match="aggregation.policy.*stellaris, stellaris_code, pure_async, sync, ssp, softsync"):
        make_policy(SimpleNamespace(policy="hogwild", d=0.9, v=3))


@pytest.mark.parametrize("name", ["stellaris", "stellaris_code", "pure_async", "sync", "ssp", "softsync"])
@pytest.mark.parametrize("d", [0.0, 0.9, 1.0])
def test_simulated_run_applies_every_gradient_once(name, d):
    """Groups with random compute times push against the version they pulled; the caller loop
    from the module docstring drains the queue. Invariants: nothing lost or applied twice, no
    deadlock, the version counts steps, and a thresholded stellaris step respects beta or covers all groups."""
    rng = np.random.default_rng(7)
    pol = make_policy(AggregationConfig(policy=name, d=d, v=3, ssp_s=1, softsync_c=3))
    groups, version, queue, applied = 4, 0, [], []
    pulled = {g: 0 for g in range(groups)}
    ready = {g: rng.uniform(1, 3) for g in range(groups)}
    seq = {g: 0 for g in range(groups)}
    for arrival in range(400):
        g = min(ready, key=ready.get)
        queue.append(rec(g, seq[g], pulled[g]))
        seq[g] += 1
        while (adm := pol.admit(queue, version, groups)) is not None:
            for step in adm.steps:
                if name == "stellaris" and adm.threshold is not None and 0 < d < 1:
                    mean = np.mean([adm.staleness[r.key] for r, _ in step])
                    assert mean <= adm.threshold or len({r.group for r, _ in step}) == groups
                applied.extend(r.key for r, _ in step)
                version += 1
            adm.remove_from(queue)
        pulled[g] = version  # the group pulls the newest weights and computes again
        ready[g] += rng.uniform(1, 3)
        if arrival % 40 == 39:
            pol.end_round(arrival // 40)
    # sync and ssp let fast groups pile up (lockstep needs learners that wait: the runtime's job)
    assert len(queue) < groups * (4 if name in ("sync", "ssp") else 2)
    assert len(applied) == len(set(applied)) == 400 - len(queue)
    if name in ("pure_async", "stellaris_code", "ssp"):
        assert version == len(applied)
    elif name == "sync":
        assert version * groups == len(applied)
    elif name == "softsync":
        assert version * 3 == len(applied)
    else:
        assert 0 < version <= len(applied)


@pytest.mark.parametrize("cls", [Stellaris, StellarisCode])
def test_delta_max_is_observed_again_when_the_active_groups_change_per_active_groups_only(cls):
    """aggregation.delta_max: one active group observes a small delta_max in round 0; when three groups are active
    in round 2, per_active_groups observes again for that round (each gradient on its own, no threshold) and
    keeps the larger delta_max; first_round (the paper) keeps round 0's."""
    def run(rule):
        policy = cls(d=0.9, delta_max=rule) if cls is StellarisCode else cls(d=0.9, v=3.0, delta_max=rule)
        version = observed(policy, [0, 1, 1])  # round 0, one group
        first = policy.delta_max
        policy.admit([rec(0, 10, version - 1)], version, active_groups=1)  # round 1, one group, thresholded
        policy.end_round(1)
        assert policy.threshold is not None
        queue = [rec(0, 11, version - 8), rec(1, 0, version - 9), rec(2, 0, version - 7)]  # round 2, three groups
        adm = policy.admit(queue, version + 1, active_groups=3)
        policy.end_round(2)
        return first, adm, policy
    first, adm, kept = run("first_round")
    assert kept.delta_max == first  # the paper: round 0's, whatever the parallelism later
    first, adm, again = run("per_active_groups")
    assert adm.threshold is None and len(adm.steps) == 3  # observing: each gradient its own step
    assert again.delta_max > first and again.threshold is not None
    with pytest.raises(ValueError, match="delta_max must be one of first_round, per_active_groups"):
        Stellaris(d=0.9, v=3.0, delta_max="sometimes")


def test_delta_max_is_refused_under_a_policy_that_does_not_observe_one():
    from hpcrl.config import build_config

    with pytest.raises(ConfigError, match="aggregation.delta_max='per_active_groups' does nothing under aggregation."
                                          "policy=sync; it is read by stellaris, stellaris_code"):
        build_config({"aggregation": {"policy": "sync", "delta_max": "per_active_groups"}})
    assert make_policy(AggregationConfig(delta_max="per_active_groups"))._observe.rule == "per_active_groups"
