"""How many learner groups are active: supply of environment steps vs the groups' measured capacity.

The parameter rank feeds :class:`ElasticRule` what it hears anyway: every actor fragment
report (steps and the seconds spent sampling them) and every gradient's stats (new env steps,
and the learner cycle's busy seconds: the cycle minus its waits for data and for a mailbox
slot). From these it keeps

- supply S: env steps per second the actors produce while sampling, summed over actors (each
  actor's rate is an exponential average over its fragments, so an actor blocked by
  back-pressure keeps its last rate);
- capacity C: env steps per busy second of one learner group, over the gradients of the last
  ``window`` seconds;

and the load of the active groups, ``S / (active * C)``. A group is activated when the load
exceeds ``1 + headroom`` while fragments wait in the active groups' queues (at least one per
group); one is parked when the remaining groups would run below ``1 - headroom``:
``S / ((active - 1) * C) < 1 - headroom``. Between the two thresholds nothing changes
(hysteresis), and after a change the rule waits one full ``window`` of new measurements.
Pure bookkeeping: no MPI, no clock of its own (callers pass ``now``).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass



@dataclass(frozen=True)
class Decision:
    active: int
    """Active groups after the change."""
    action: str
    reason: str
    supply: float
    """S, env steps/s."""
    capacity: float
    """C, env steps/s per group."""
    load: float
    """S / (active before * C)."""


class ElasticRule:
    def __init__(self, lo: int, hi: int, headroom: float, window: float, smoothing: float = 0.3):
        self.lo, self.hi, self.headroom, self.window = lo, hi, headroom, window
        self.smoothing = smoothing
        self.actor_rate: dict[int, float] = {}
        self.recent: deque[tuple[float, float, float]] = deque()  # (time, env steps, busy seconds)
        self.since: float | None = None  # time of the first gradient measured since the last change

    def fragment(self, actor: int, steps: int, sample_seconds: float) -> None:
        """An actor sampled ``steps`` env steps in ``sample_seconds``."""
        if sample_seconds <= 0:
            return
        rate = steps / sample_seconds
        old = self.actor_rate.get(actor)
        self.actor_rate[actor] = rate if old is None else old + self.smoothing * (rate - old)

    def gradient(self, now: float, new_steps: float, busy_seconds: float) -> None:
        """A group pushed a gradient: ``new_steps`` env steps consumed with it, ``busy_seconds`` of work."""
        if busy_seconds == busy_seconds and busy_seconds > 0:  # NaN from a learner that did not measure
            self.recent.append((now, new_steps, busy_seconds))
            if self.since is None:
                self.since = now

    def supply(self) -> float:
        return sum(self.actor_rate.values())

    def capacity(self, now: float) -> float:
        """Env steps per busy second of one group over the last ``window`` seconds (NaN without data)."""
        while self.recent and self.recent[0][0] < now - self.window:
            self.recent.popleft()
        steps = sum(r[1] for r in self.recent)
        busy = sum(r[2] for r in self.recent)
        return steps / busy if steps > 0 and busy > 0 else float("nan")

    def decide(self, now: float, active: int, waiting: int) -> Decision | None:
        """The change to make now, if any. ``waiting``: fragments queued at the active groups."""
        if self.since is None or now - self.since < self.window or self.lo == self.hi:
            return None
        supply, capacity = self.supply(), self.capacity(now)
        if not (supply > 0 and capacity > 0):
            return None
        load = supply / (active * capacity)
        h = self.headroom
        if active < self.hi and load > 1 + h and waiting >= active:
            return self._change(now, Decision(active + 1, "activate", "supply_above_capacity", supply, capacity, load))
        if active > self.lo and supply / ((active - 1) * capacity) < 1 - h:
            return self._change(now, Decision(active - 1, "park", "supply_below_capacity", supply, capacity, load))
        return None

    def _change(self, now: float, d: Decision) -> Decision:
        self.since = None  # measure the new layout afresh
        self.recent.clear()
        return d
