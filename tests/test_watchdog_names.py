"""The parameter rank's watchdog (runtime/transport/control.py) names the rank that went quiet first.

A hung node's ranks stop beating first; ranks on other nodes that wait on them go quiet after. When
several pass launch.watchdog_seconds in one check, the job must end naming the first, not the lowest
rank number (seen on the local cluster: an actor on node2 was named for node3's hang)."""
from __future__ import annotations

import numpy as np
import pytest

from hpcrl.runtime.transport import control


class SetClock:
    """A clock (runtime/clock.py) whose time the test sets."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def test_the_rank_quiet_the_longest_is_named():
    clock = SetClock(100.0)
    roles, nodes, groups = ["parameter", "learner", "actor", "actor"], ["n1", "n1", "n2", "n3"], 1
    dog = control.Watchdog(roles, nodes, groups, warn=3.0, limit=8.0, clock=clock)
    words = np.zeros(control.num_counters(groups, len(roles)), dtype=np.int64)

    def beat(rank: int, value: int) -> None:
        words[control.heartbeat_word(groups, rank)] = value

    for r in (1, 2, 3):
        beat(r, 1)
    assert dog.check(words) == []
    clock.t += 1
    beat(1, 2), beat(2, 2)  # rank 3 (node n3) hangs here
    assert dog.check(words) == []
    clock.t += 2  # rank 3 quiet 3 s, rank 2 (node n2, waiting on it from here) quiet 2 s: one warning
    beat(1, 3)
    assert dog.check(words) == ["hpcrl: warning: rank 3 (actor on n3) has made no progress for 3 s "
                                "(the job ends after launch.watchdog_seconds=8)"]
    clock.t += 7  # both past the limit: rank 3 (10 s) is named, not rank 2 (9 s)
    beat(1, 4)
    with pytest.raises(RuntimeError, match=r"^rank 3 \(actor on n3\) made no progress for 10 s"):
        dog.check(words)


def test_a_rank_whose_role_returned_is_not_watched():
    """While rank 0 shuts the job down, a rank that finished (its word FINISHED, control.mark_finished) stops
    beating: it must not be named, and a rank still running is named as before."""
    clock = SetClock(100.0)
    roles, nodes, groups = ["parameter", "learner", "actor"], ["n1", "n1", "n2"], 1
    dog = control.Watchdog(roles, nodes, groups, warn=3.0, limit=8.0, clock=clock)
    counters = np.zeros(control.num_counters(groups, len(roles)), dtype=np.int64)

    class Words:
        def set(self, word: int, value: int) -> None:
            counters[word] = value

    counters[control.heartbeat_word(groups, 1)] = counters[control.heartbeat_word(groups, 2)] = 1
    assert dog.check(counters) == []
    control.mark_finished(Words(), groups, 2)  # the actor on n2 is done
    clock.t += 20
    with pytest.raises(RuntimeError, match=r"^rank 1 \(learner on n1\) made no progress for 20 s"):
        dog.check(counters)
    control.mark_finished(Words(), groups, 1)
    assert dog.check(counters) == []
