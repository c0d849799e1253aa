"""Admission policies: which queued gradients the parameter rank applies, and when.

Pure Python and numpy: no MPI, no torch. The parameter rank keeps a queue of
:class:`GradientRecord` in arrival order and, after each arrival, calls::

    while (adm := policy.admit(queue, version, active_groups)) is not None:
        for step in adm.steps:               # one optimizer step each, in order
            g = aggregate(step)              # (1/H) sum_c scale_c * g_c
            optimizer.step(g); version += 1  # version rises by one per step
        adm.remove_from(queue)

and ``policy.end_round(k)`` when round k ends (a round = ``train_batch_size`` environment
steps consumed by the learners, as an RLlib training iteration).

Staleness of a gradient = the version at which it is applied minus its base version
(step i of an admission is applied at ``version + i``). Policies:

- ``stellaris``: the paper (Stellaris, SC'24, Section V-C). Round 0 runs unthresholded
  (pure async) and records delta_max, the largest staleness seen. From round k >= 1 every
  arrival re-evaluates the queue's mean staleness and the whole queue is applied as one
  averaged step once the mean is <= beta_k = delta_max * d**k (Eq. 3). Each gradient is
  scaled by alpha_c / alpha_0 = delta_c**(-1/v) for delta_c > 0, else 1 (Eq. 4).
  d = 1 applies every arrival at once (as in round 0; ``pure_async`` without the Eq. 4
  scaling) and d = 0 is synchronous (wait for one gradient from every active group).
- ``stellaris_code``: the authors' released code (Stellaris-SC24 artifact, an RLlib 2.8 fork): delta_max =
  int(mean staleness of the observation round) + 1; beta = clip(floor(delta_max * d**k) + 1,
  1, delta_max) (their rounds count from 1 at the observation round, so their d**(k-1)
  is our d**k); the queue is also applied once it holds as many gradients as there are
  active groups; every queued gradient is its own optimizer step, in order; scale 1.
- ``aggregation.delta_max`` (both Stellaris policies): ``first_round``, the paper, keeps the delta_max of
  round 0 for the whole run; ``per_active_groups`` observes again (one unthresholded round, as round 0)
  whenever the number of active learner groups differs from the number delta_max was observed with,
  so a run that starts with one active group and grows does not keep that group's small delta_max
  (its threshold would make admission synchronous early). beta_k keeps decaying with the run's round k.
- ``pure_async``: every gradient applied on arrival, its own step, scale 1.
- ``sync``: one averaged step as soon as the queue holds a gradient from each of
  ``active_groups`` distinct groups (the oldest one per group; later ones wait for the
  next step). Staleness is not required to be 0: exact lockstep needs the learners to
  wait for the new version after each push, which is the runtime's business.

No-deadlock rule (ours, not the paper's): a threshold can be unreachable (beta_k below
the staleness the queue can reach, e.g. beta_k = 0 with a stale gradient queued). For
``stellaris`` the queue is therefore also applied once it holds a gradient from each of
``active_groups`` distinct groups; waiting longer could only add gradients from groups
already represented. This is the d = 0 (synchronous) behaviour, so beta_k decaying
towards 0 tends to synchronous aggregation, as the paper intends.

Adam and the learning-rate scale. The optimizer runs at its base rate alpha_0 and the
parameter rank feeds it ``aggregate(step)``, i.e. each gradient multiplied by
alpha_c / alpha_0 before averaging. With SGD this is exactly the paper's update
theta <- theta - (1/H) sum alpha_c g_c. With Adam the moments see the weighted average,
so the optimizer state stays the statistics of what was actually applied; note that Adam
divides by the running RMS of its input, so it mostly absorbs a scale shared by all
gradients over many steps, and the scaling acts chiefly as a relative weight between
gradients of different staleness (fresh ones count more).

The paper's ablation baselines (Stellaris Section VIII-C, Fig. 11):

- ``ssp``: stale-synchronous parallel (Ho et al. 2013, "More effective distributed ML via a
  stale synchronous parameter server"). Each learner group has a clock: the number of its
  gradients applied so far (SSP's per-worker iteration count, not the policy version: with G
  groups the version rises about G times per clock tick, so a bound in versions would tighten
  as groups are added). A queued gradient of group g is "more than s ahead" and waits while
  clock_g - min_h clock_h > s over the running active groups h (groups 0 .. active_groups - 1,
  the groups the runtime keeps active, that have pushed at least once); otherwise it is applied,
  its own step, scale 1. A group's gradients are applied in arrival order. A group joins at the
  slowest running clock when its first gradient arrives, and again when it becomes active after
  a pause: nobody waits for a group that has not started (it may have had no data yet), nor for
  steps it never had to take. s = 0 is bulk-synchronous (round-robin over the running groups).
- ``softsync``: n-softsync (Zhang et al. 2016, "Staleness-aware async-SGD for distributed deep
  learning", IJCAI): once the queue holds c gradients (any groups) the oldest c are applied as
  one averaged step, scale 1 (the staleness-dependent learning rate of that paper is not part of
  the protocol; use stellaris for Eq. 4). c = ``aggregation.softsync_c``, or the number of
  active groups when that is None (1-softsync in Zhang et al.'s terms: lambda learners, c = lambda).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from hpcrl.errors import ConfigError

Step = list[tuple["GradientRecord", float]]


@dataclass
class GradientRecord:
    """One gradient pushed by a learner group (the flat vector is opaque to the policies)."""

    group: int
    seq: int
    base_version: int
    samples: int
    grad: np.ndarray | None  # float32, 1-D; None: summed into its node's combined gradient (``scaled_for``)
    stats: dict = field(default_factory=dict)
    received_at: float = 0.0
    node: int = 0
    """Its group's node, in the job's order of nodes: a step sums each node's gradients first (``aggregate``)."""
    scaled_for: int = 0
    """A node's combined gradient (learners.combine=node): ``grad`` is already the sum, in group order, of its node's
    gradients of the step each times float32(1 / scaled_for), the step's size; the other records of that push have
    no gradient of their own. 0: ``grad`` is this push's own."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.group, self.seq)


@dataclass
class Admission:
    """What to apply now: ``steps[i]`` is one optimizer step of (record, alpha_c/alpha_0) pairs."""

    steps: list[Step]
    staleness: dict[tuple[int, int], int]
    """(group, seq) -> staleness at the step that applies it."""
    threshold: float | None
    """beta in force when the admission was made (None: unthresholded)."""

    @property
    def records(self) -> list[GradientRecord]:
        return [rec for step in self.steps for rec, _ in step]

    def remove_from(self, queue: list[GradientRecord]) -> None:
        """Delete the admitted records from ``queue`` in place (by identity)."""
        taken = {id(rec) for rec in self.records}
        queue[:] = [rec for rec in queue if id(rec) not in taken]


def aggregate(step: Step, out: np.ndarray | None = None) -> np.ndarray:
    """The step's gradient (1/H) sum_c scale_c g_c (Stellaris Section V-C), float32: in ``out`` when given, else
    a new array, or the record's own gradient when the step is one gradient at scale 1 (read it, do not write it).

    The order of the sum is fixed, whatever order the pushes arrived in: each node's gradients first, in group order,
    from zero, then those sums in node order. A node's groups that combine their pushes (learners.combine=node) make
    that node's sum themselves, so combining changes no bit of the step."""
    if not step:
        raise ValueError("aggregate: empty step")
    first = step[0][0].grad
    if len(step) == 1 and step[0][1] == 1.0 and out is None and first.dtype == np.float32 and not step[0][0].scaled_for:
        return first  # one gradient at full rate (most steps): it is the step's gradient, no copy
    H = len(step)
    by_node: dict[int, list[tuple[GradientRecord, float]]] = {}
    for rec, scale in sorted(step, key=lambda part: (part[0].node, part[0].group, part[0].seq)):
        if rec.grad is not None:
            by_node.setdefault(rec.node, []).append((rec, scale))
    if not by_node:
        raise ValueError("aggregate: no gradient in the step (each combined push's records come with their node's sum)")
    size = next(iter(by_node.values()))[0][0].grad.size
    if out is None:
        out = np.zeros(size, dtype=np.float32)
    else:
        out[...] = 0.0
    partial = None
    for parts in by_node.values():
        if len(parts) == 1 and not parts[0][0].scaled_for:  # 0 + x is x: a node of one gradient is added at once
            rec, scale = parts[0]
            out += np.float32(scale / H) * rec.grad
            continue
        if partial is None:
            partial = np.empty(size, dtype=np.float32)
        partial[...] = 0.0
        for rec, scale in parts:
            if rec.scaled_for:
                if rec.scaled_for != H or scale != 1.0:
                    raise ValueError(f"aggregate: group {rec.group}'s combined push was scaled for a step of "
                                     f"{rec.scaled_for} at scale 1, this step has {H} at scale {scale}")
                partial += rec.grad
            else:
                partial += np.float32(scale / H) * rec.grad
        out += partial
    return out


def lr_scale(staleness: int, v: float) -> float:
    """alpha_c / alpha_0 = 1 / staleness**(1/v) for staleness > 0, else 1 (Stellaris Eq. 4)."""
    return 1.0 if staleness <= 0 else staleness ** (-1.0 / v)


DELTA_MAX_RULES = ("first_round", "per_active_groups")
"""When the Stellaris policies observe delta_max (aggregation.delta_max; see the module docstring)."""


class AdmissionPolicy:
    """Base class: holds the round counter; subclasses decide ``admit``."""

    name = "base"

    def __init__(self) -> None:
        self.round = 0

    @property
    def threshold(self) -> float | None:
        """The staleness threshold beta in force (None: no threshold)."""
        return None

    def end_round(self, round_index: int) -> None:
        """Round ``round_index`` (0-based) has ended; the next one is ``round_index + 1``."""
        self.round = round_index + 1

    def admit(self, queue: Sequence[GradientRecord], version: int, active_groups: int) -> Admission | None:
        """Records to apply now (the caller removes them from its queue), or None to wait."""
        raise NotImplementedError

    @staticmethod
    def _check(version: int, active_groups: int) -> None:
        if active_groups < 1:
            raise ValueError(f"admit: active_groups must be >= 1, got {active_groups}")


def _each_on_its_own(queue: Sequence[GradientRecord], version: int, scale: Callable[[int], float],
                     threshold: float | None) -> Admission | None:
    """Every queued record as its own step, in order; step i is applied at version + i."""
    if not queue:
        return None
    staleness = {rec.key: version + i - rec.base_version for i, rec in enumerate(queue)}
    steps = [[(rec, scale(staleness[rec.key]))] for rec in queue]
    return Admission(steps, staleness, threshold)


def _covers_groups(records: Sequence[GradientRecord], active_groups: int) -> bool:
    return len({rec.group for rec in records}) >= active_groups


class PureAsync(AdmissionPolicy):
    """Apply every gradient on arrival, unscaled."""

    name = "pure_async"

    def admit(self, queue, version, active_groups):
        self._check(version, active_groups)
        return _each_on_its_own(queue, version, lambda s: 1.0, None)


class Sync(AdmissionPolicy):
    """One averaged step once the queue holds a gradient from every active group."""

    name = "sync"

    def admit(self, queue, version, active_groups):
        self._check(version, active_groups)
        oldest: dict[int, GradientRecord] = {}
        for rec in queue:
            oldest.setdefault(rec.group, rec)
        if len(oldest) < active_groups:
            return None
        chosen = [rec for rec in queue if oldest[rec.group] is rec]
        staleness = {rec.key: version - rec.base_version for rec in chosen}
        return Admission([[(rec, 1.0) for rec in chosen]], staleness, None)


class _Observation:
    """When a Stellaris policy observes delta_max again (``per_active_groups``: the active count changed)."""

    def __init__(self, rule: str) -> None:
        if rule not in DELTA_MAX_RULES:
            raise ValueError(f"delta_max must be one of {', '.join(DELTA_MAX_RULES)}, got {rule!r}")
        self.rule, self.groups = rule, None  # groups: the active count of the current (or last) observation

    def again(self, observing: bool, active_groups: int) -> bool:
        """True when delta_max is to be dropped and observed again; notes the count an observation sees."""
        if observing:
            self.groups = active_groups
            return False
        if self.rule == "per_active_groups" and active_groups != self.groups:
            self.groups = active_groups
            return True
        return False


class Stellaris(AdmissionPolicy):
    """The paper's staleness-aware aggregation (Section V-C, Eqs. 3 and 4)."""

    name = "stellaris"

    def __init__(self, d: float, v: float, delta_max: str = "first_round") -> None:
        super().__init__()
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"d must be in [0, 1], got {d}")
        self.d, self.v = d, v
        self.delta_max: int | None = None  # observed in round 0 (and again on a new active count: per_active_groups)
        self._seen_max: int | None = None
        self._observe = _Observation(delta_max)

    @property
    def observing(self) -> bool:
        return self.delta_max is None

    @property
    def threshold(self) -> float | None:
        if self.observing:
            return None
        return self.delta_max * self.d ** self.round  # Eq. 3

    def end_round(self, round_index: int) -> None:
        super().end_round(round_index)
        if self.observing and self._seen_max is not None:
            self.delta_max = self._seen_max

    def admit(self, queue, version, active_groups):
        self._check(version, active_groups)
        if self._observe.again(self.observing, active_groups):
            self.delta_max, self._seen_max = None, None
        scale = lambda s: lr_scale(s, self.v)  # noqa: E731
        if self.observing or self.d == 1.0:
            adm = _each_on_its_own(queue, version, scale, self.threshold)
            if adm is not None and self.observing:
                self._seen_max = max(max(adm.staleness.values()), self._seen_max or 0)
            return adm
        beta = self.threshold
        # Each arrival re-evaluates the queue: the first prefix that qualifies is applied.
        total = 0
        for n, rec in enumerate(queue, start=1):
            total += version - rec.base_version
            prefix = queue[:n]
            mean_ok = self.d > 0.0 and total / n <= beta
            if mean_ok or _covers_groups(prefix, active_groups):
                staleness = {r.key: version - r.base_version for r in prefix}
                return Admission([[(r, scale(staleness[r.key])) for r in prefix]], staleness, beta)
        return None


class StellarisCode(AdmissionPolicy):
    """The authors' released code (the Stellaris-SC24 artifact, an RLlib 2.8 fork); see the module docstring."""

    name = "stellaris_code"

    def __init__(self, d: float, delta_max: str = "first_round") -> None:
        super().__init__()
        self.d = d
        self.delta_max: int | None = None
        self._sum = 0
        self._count = 0
        self._observe = _Observation(delta_max)

    @property
    def observing(self) -> bool:
        return self.delta_max is None

    @property
    def threshold(self) -> float | None:
        if self.observing:
            return None
        beta = math.floor(self.delta_max * self.d ** self.round) + 1
        return float(min(max(beta, 1), self.delta_max))

    def end_round(self, round_index: int) -> None:
        super().end_round(round_index)
        if self.observing and self._count > 0:
            self.delta_max = int(self._sum / self._count) + 1

    def admit(self, queue, version, active_groups):
        self._check(version, active_groups)
        if self._observe.again(self.observing, active_groups):
            self.delta_max, self._sum, self._count = None, 0, 0
        if self.observing:
            adm = _each_on_its_own(queue, version, lambda s: 1.0, None)
            if adm is not None:
                self._sum += sum(adm.staleness.values())
                self._count += len(adm.staleness)
            return adm
        beta = self.threshold
        total = 0
        for n, rec in enumerate(queue, start=1):
            total += version - rec.base_version
            if total / n <= beta or n >= active_groups:
                return _each_on_its_own(queue[:n], version, lambda s: 1.0, beta)
        return None


class SSP(AdmissionPolicy):
    """Stale-synchronous parallel over learner-group clocks (see the module docstring)."""

    name = "ssp"

    def __init__(self, s: int) -> None:
        super().__init__()
        if s < 0:
            raise ValueError(f"ssp: s must be >= 0, got {s}")
        self.s = s
        self.clock: dict[int, int] = {}  # group -> its position: gradients applied (+ where it joined)
        self._active = 0

    def _slowest(self, clock: dict[int, int], active_groups: int) -> int | None:
        running = [clock[g] for g in range(active_groups) if g in clock]
        return min(running) if running else None

    def _rejoin(self, active_groups: int) -> None:
        """Groups that become active again start at the slowest clock of those active before."""
        if active_groups > self._active:
            floor = self._slowest(self.clock, self._active)
            for g in range(self._active, active_groups):
                if g in self.clock and floor is not None:
                    self.clock[g] = max(self.clock[g], floor)
        self._active = active_groups

    def admit(self, queue, version, active_groups):
        self._check(version, active_groups)
        self._rejoin(active_groups)
        clock = dict(self.clock)
        taken: list[GradientRecord] = []
        waiting = list(queue)
        progress = True
        while progress:  # applying a slow group's gradient can release a fast group's
            progress = False
            blocked: set[int] = set()  # a group's later gradients wait behind its earlier one
            for rec in list(waiting):
                if rec.group in blocked:
                    continue
                if rec.group not in clock:  # first gradient of this group: it joins at the slowest clock
                    clock[rec.group] = self._slowest(clock, active_groups) or 0
                slowest = self._slowest(clock, active_groups)
                if slowest is not None and clock[rec.group] - slowest > self.s:
                    blocked.add(rec.group)
                    continue
                clock[rec.group] += 1
                taken.append(rec)
                waiting.remove(rec)
                progress = True
        self.clock = clock
        if not taken:
            return None
        return _each_on_its_own(taken, version, lambda s: 1.0, None)

    @property
    def min_clock(self) -> int:
        """The slowest running active group's clock (what a waiting learner would compare its own pushes with)."""
        return self._slowest(self.clock, max(self._active, 1)) or 0


class SoftSync(AdmissionPolicy):
    """n-softsync: one averaged step of the oldest c queued gradients (see the module docstring)."""

    name = "softsync"

    def __init__(self, c: int | None) -> None:
        super().__init__()
        if c is not None and c < 1:
            raise ValueError(f"softsync: c must be >= 1, got {c}")
        self.c = c

    def admit(self, queue, version, active_groups):
        self._check(version, active_groups)
        c = self.c if self.c is not None else active_groups
        if len(queue) < c:
            return None
        chosen = list(queue[:c])
        staleness = {rec.key: version - rec.base_version for rec in chosen}
        return Admission([[(rec, 1.0) for rec in chosen]], staleness, None)


POLICIES: dict[str, Callable[[Any], AdmissionPolicy]] = {
    "stellaris": lambda cfg: Stellaris(d=cfg.d, v=cfg.v, delta_max=cfg.delta_max),
    "stellaris_code": lambda cfg: StellarisCode(d=cfg.d, delta_max=cfg.delta_max),
    "pure_async": lambda cfg: PureAsync(),
    "sync": lambda cfg: Sync(),
    "ssp": lambda cfg: SSP(s=cfg.ssp_s),
    "softsync": lambda cfg: SoftSync(c=cfg.softsync_c),
}


POLICY_PACING = {"stellaris": "free", "stellaris_code": "free", "pure_async": "free", "sync": "lockstep", "ssp": "held",
                 "softsync": "free"}
"""How each policy paces a learner group (read through hpcrl.runtime.plan): free; lockstep (a gradient waits
until the group's previous one is applied: sync admits nothing stale); held (a group waits while rank 0
holds one of its gradients back: SSP's bound on the clock gap)."""


POLICY_FIELDS = {"stellaris": ("d", "v", "delta_max"), "stellaris_code": ("d", "delta_max"), "pure_async": (), "sync": (), "ssp": ("ssp_s",),
                 "softsync": ("softsync_c",)}
"""The aggregation fields each policy reads (a value set for one it does not read is refused: it would do nothing)."""


def make_policy(aggregation_cfg: Any) -> AdmissionPolicy:
    """The admission policy named by ``aggregation.policy`` (an AggregationConfig)."""
    name = aggregation_cfg.policy
    if name not in POLICIES:
        raise ConfigError(f"aggregation.policy: unknown admission policy {name!r}; allowed: {', '.join(POLICIES)}")
    return POLICIES[name](aggregation_cfg)
