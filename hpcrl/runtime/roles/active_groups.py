"""Which learner groups compute: both sides of the ACTIVE counter word.

Groups 0 .. active-1 take batches; the others park (``wait_while_parked``: blocked in
``counters.wait_until``, no spinning). On the parameter rank three things move the count, each recorded
as rows of ``elastic_events``:

- the algorithm (``algo.learner_groups_needed``: MARL policy learners, one group per policy), at
  the start and at each round's end; when it decides, the elastic rule stays out of it;
- the elastic rule (runtime/roles/elastic.py: the actors' supply of env steps against the groups'
  measured capacity), asked every half second, one group at a time;
- ``debug.active_groups`` (tests), at each round's end, in place of the elastic rule;
- nothing else: a resume keeps the count, clamped to ``learners.active_range``.

SSP's held words (``plan.pacing == "held"``) are here too: a group whose gradient waits in the
admission queue is told to wait before computing another.
"""
from __future__ import annotations

from typing import Callable

from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.messages import ELASTIC_ACTION, ELASTIC_REASON, GroupEvent
from hpcrl.runtime.roles import elastic
from hpcrl.runtime.transport import control


class ActiveGroups:
    """The active learner-group count, published in the counter words and recorded as it changes."""

    def __init__(self, learners, counters, publish_version: Callable[[], None], schedule: list[int] | None = None
                 ) -> None:
        self.groups = learners.groups
        self.lo, self.hi = learners.active_range
        self.active = self.lo
        self.counters = counters
        # a change the algorithm makes goes out with a new weight version (the learners' map of policies moves)
        self.publish_version = publish_version
        self.rule = elastic.ElasticRule(self.lo, self.hi, learners.elastic_headroom, learners.elastic_seconds)
        self.algo_decides = False  # algo.learner_groups_needed decides them (MARL policy learners)
        self.schedule = schedule  # debug.active_groups: the count after each round, the elastic rule left out
        self._held: dict[int, bool] = {}

    def restore(self, active: int) -> None:
        self.active = min(max(active, self.lo), self.hi)

    def from_algo(self, algo, model, record, events: bool) -> None:
        """As ``algo.learner_groups_needed`` says, each group activated or parked by the change a row of
        elastic_events in ``record`` (with ``events``; the count at the start is no event)."""
        need = algo.learner_groups_needed(model, self.groups)
        self.algo_decides = need is not None
        if need is None or (need := min(max(int(need), 1), self.groups)) == self.active:
            return
        # with events, the new map goes out first: a learner that sees the new count then pulls weights with the
        # map behind it
        self._move_to(need, record, ("policies_split", "policies_merged"), events, new_version=events)

    def _move_to(self, active: int, record, reasons: tuple[str, str], events: bool = True,
                 new_version: bool = False) -> None:
        """Groups 0 .. active-1 active from now on: the counter word, the record, and (with ``events``) a row of
        elastic_events per group activated (``reasons[0]``) or parked (``reasons[1]``)."""
        more = active > self.active
        changed = range(self.active, active) if more else range(active, self.active)
        self.active = active
        if new_version:
            self.publish_version()
        # the rows first: a group woken by the counter stamps its "parked" row after its "activate" row
        record.active(active)
        for g in changed if events else ():
            record.group_event(g, "activate" if more else "park", reasons[0] if more else reasons[1], active)
        self.counters.set(control.ACTIVE, active)

    def end_round(self, round_: int, algo, model, record) -> None:
        """At a round's end: the algorithm's count, or the debug schedule's."""
        self.from_algo(algo, model, record, events=True)
        if not self.schedule or self.algo_decides:
            return
        want = min(max(self.schedule[min(round_, len(self.schedule) - 1)], self.lo), self.hi)
        if want != self.active:
            self._move_to(want, record, ("scheduled", "scheduled"))

    def elastic(self, now: float, record) -> None:
        """Activate or park one learner group when the elastic rule says so; record the decision."""
        if self.lo == self.hi or self.algo_decides or self.schedule:
            return
        words = self.counters.read_all()
        waiting = int(sum(words[control.BACKLOG + g] for g in range(self.active)))
        d = self.rule.decide(now, self.active, waiting)
        if d is None:
            return
        group = self.active if d.action == "activate" else self.active - 1
        self.active = d.active
        record.group_event(group, d.action, d.reason, self.active, d.supply, d.capacity, d.load, waiting)
        self.counters.set(control.ACTIVE, self.active)  # after the row (see _move_to)

    def hold(self, queue) -> None:
        """SSP: a group with a gradient still queued waits before computing more (Ho et al. 2013)."""
        held = {rec.group for rec in queue}
        for g in range(self.groups):
            if g in held or self._held.get(g):
                self._held[g] = g in held
                self.counters.set(control.held_word(self.groups, g), int(g in held))


def wait_while_parked(counters, group: int, reports, tick: Callable[[], None], clock: Clock = WALL) -> bool:
    """The learner's side: block until ``group`` is activated (True) or the run stops (False), calling ``tick``
    at least once a second (the group's heartbeat, and fragments an actor sent before it saw the park); then
    report the park's length and the CPU it used (an ``activity`` row, elastic_events on the parameter rank)."""
    start, cpu = clock.unix(), clock.thread_time()
    awake = lambda w: bool(w[control.STOP]) or group < w[control.ACTIVE]  # noqa: E731
    while True:
        tick()
        words = counters.read_all()
        if awake(words):
            break
        counters.wait_until(awake, timeout=1.0, nap=control.PARK_NAP_SECONDS)
    woken = not words[control.STOP]
    reports.send(GroupEvent(
        time=clock.unix(), group=group, action=ELASTIC_ACTION["parked"],
        reason=ELASTIC_REASON["woken" if woken else "stopped"], active_groups=int(words[control.ACTIVE]),
        parked_seconds=clock.unix() - start, cpu_seconds=clock.thread_time() - cpu))
    return woken
