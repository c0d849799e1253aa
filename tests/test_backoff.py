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
