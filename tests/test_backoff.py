"""runtime/backoff.py: the back-off doubles to its cap; a Doorbell's nap ends when a producer rings it, and a ring
made while nobody napped ends the next nap at once (nothing rung for is slept through)."""
from __future__ import annotations

import threading
import time

import numpy as np

from hpcrl.runtime.backoff import Backoff, Doorbell
from hpcrl.runtime.transport.local import LocalMailbox, LocalReports
from hpcrl.runtime.messages import ActorParked


class RecordingClock:
    def __init__(self):
        self.naps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)


def test_backoff_doubles_to_its_cap_and_reset_starts_again():
    clock = RecordingClock()
    b = Backoff(1e-3, 4e-3, clock)
    for _ in range(4):
        b.sleep()
    b.reset()
    b.sleep()
    assert clock.naps == [1e-3, 2e-3, 4e-3, 4e-3, 1e-3]
    assert abs(b.waited - 12e-3) < 1e-12


def test_a_ring_from_another_thread_ends_a_long_nap():
    bell = Doorbell(first=10.0, cap=10.0)
    threading.Timer(0.05, bell.ring).start()
    start = time.monotonic()
    bell.sleep()
    assert time.monotonic() - start < 5.0


def test_a_ring_before_the_nap_ends_it_at_once_and_is_taken_by_it():
    bell = Doorbell(first=0.3, cap=0.3)
    bell.ring()
    start = time.monotonic()
    bell.sleep()
    assert time.monotonic() - start < 0.15
    start = time.monotonic()
    bell.sleep()  # the ring was taken: this nap is the whole 0.3 s
    assert time.monotonic() - start >= 0.29


def test_the_serial_twins_ring_on_every_push_and_report():
    bell = Doorbell(first=10.0, cap=10.0)
    mailbox, reports = LocalMailbox(1, 1, 3, bell=bell), LocalReports(bell)
    for send in (lambda: mailbox.try_push(0, 0, 0, 8, np.zeros(3)), lambda: reports.send(ActorParked(0.0, 0, 0.0, 0.0, 1, 0))):
        send()
        start = time.monotonic()
        bell.sleep()
        assert time.monotonic() - start < 5.0


def test_a_fragment_or_batch_sent_to_a_group_rings_that_groups_bell_only():
    """The serial runner's learner roots nap on their group's Doorbell (runners/serial.py learner_nap): a fragment
    delivered to group 1, or a prepared batch sent to it, must end its nap and leave group 0's asleep."""
    from hpcrl.runtime.transport.local import LocalFragments

    class Layout:
        def pack(self, frag):
            return frag

        def unpack(self, packed, copy=False):
            return packed

    bells = [Doorbell(first=10.0, cap=10.0), Doorbell(first=10.0, cap=10.0)]
    hub = LocalFragments(Layout(), 2, 1, 4, threading.Event(), bells)
    threading.Timer(0.05, hub.actor_link(0).send, args=(1, {"rewards": np.zeros((2, 1))})).start()
    start = time.monotonic()
    bells[1].sleep()
    assert time.monotonic() - start < 5.0 and len(hub.learner_link(1).poll()) == 1
    assert not bells[0]._rung.is_set()
    threading.Timer(0.05, hub.batch_sender().send, args=(1, {"batch": 1})).start()
    start = time.monotonic()
    bells[1].sleep()
    assert time.monotonic() - start < 5.0 and not bells[0]._rung.is_set()


def test_a_change_nap_ends_when_the_shared_state_changes_and_misses_no_change():
    """The serial runner's actors wait on a ChangeNap (runtime/backoff.py): a counter set, a publish or a
    fragment taken ends the nap at once; a change made between the waiter's look and its nap is not slept through;
    with nothing changing the nap doubles to its cap."""
    from hpcrl.runtime.backoff import ChangeNap, Changes
    from hpcrl.runtime.transport.local import LocalBoard, LocalCounters

    changes = Changes()
    counters = LocalCounters(4, threading.Event(), changes=changes)
    board = LocalBoard(3, changes=changes)
    for change in (lambda: counters.set(1, 7), lambda: counters.add(2, 1),
                   lambda: board.publish(0, np.zeros(3, np.float32))):
        nap = ChangeNap(changes, first=10.0, cap=10.0)
        threading.Timer(0.05, change).start()
        start = time.monotonic()
        nap.sleep()
        assert time.monotonic() - start < 5.0
    nap = ChangeNap(changes, first=10.0, cap=10.0)
    counters.set(0, 1)  # after the waiter looked, before it naps
    start = time.monotonic()
    nap.sleep()
    assert time.monotonic() - start < 0.5
    quiet = ChangeNap(changes, first=0.01, cap=0.02)
    for _ in range(3):
        quiet.sleep()
    assert quiet.delay == 0.02 and quiet.waited >= 0.04
