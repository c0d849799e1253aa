"""The learner cycle profile (learner_cycles) and the parameter rank's load (parameter_load).

:func:`check_profile` is what a run must record: one cycle row per gradient the parameter rank
received, with phases that add up to the cycle, and load rows whose absorption rate follows from
their own columns. The serial and MPI runs of tests/test_runtime_elastic.py (two learner groups,
one activated and parked during the run) are checked with it.
"""
from __future__ import annotations

import numpy as np
import pytest

from hpcrl.io import read_attrs, read_table
from hpcrl.runtime.record.cycle_profile import LEARNER_PHASES, PARAMETER_PHASES, CycleRecord, PhaseClock


def test_phase_clock_charges_every_second_to_one_phase():
    clock = PhaseClock(("a", "b"))
    clock.lap("a")
    sum(range(100_000))
    clock.lap("b")
    clock.move(1e9, "b", "a")  # never more than b holds
    elapsed, sec = clock.take()
    assert sec["b"] == 0.0 and sec["a"] == pytest.approx(elapsed)
    assert clock.take()[0] == 0.0


def test_cycle_busy_time_in_cpu_seconds_counts_the_sleeps_and_starts_again_each_cycle():
    """The serial runner's busy time: the thread's CPU seconds in the cycle plus what it slept in place of compute;
    not the wall time (in which waits for the interpreter lock would count)."""
    cpu = iter([10.0, 10.5, 10.7, 11.0, 11.2, 30.0, 30.1])
    record = CycleRecord(0, cpu_time=lambda: next(cpu))  # starts at 10.0
    assert record.busy_so_far() == pytest.approx(0.5)
    record.slept(0.2)
    assert record.busy_so_far() == pytest.approx(0.9)  # 0.7 of CPU and the 0.2 slept
    record.close(seq=0, base_version=0, push_wait=0.0)  # a new cycle from 11.0
    assert record.busy_so_far() == pytest.approx(0.2)
    record.restart()  # a park: from 30.0, the sleeps of the last cycle gone
    assert record.busy_so_far() == pytest.approx(0.1)
    wall = CycleRecord(0)  # elsewhere: wall seconds of the cycle less its waits
    wall.lap("idle")
    assert wall.busy_so_far() == 0.0


def check_profile(h5) -> None:
    grads, cycles = read_table(h5, "gradients"), read_table(h5, "learner_cycles")
    got = {(int(g), int(s)) for g, s in zip(cycles["group"], cycles["seq"])}
    sent = {(int(g), int(s)) for g, s in zip(grads["group"], grads["seq"])}
    assert len(got) == len(cycles["seq"]) and sent <= got  # every gradient received has its cycle, once
    phases = sum(cycles[f"{p}_seconds"] for p in LEARNER_PHASES)
    assert np.allclose(phases, cycles["cycle_seconds"], rtol=1e-3, atol=1e-5)
    assert np.all(cycles["gradient_seconds"] > 0) and np.all(cycles["cycle_seconds"] >= cycles["gradient_seconds"])
    assert np.all(np.diff(cycles["time"][cycles["group"] == 0]) >= 0)
    load = read_table(h5, "parameter_load")
    assert len(load["time"]) >= 1 and load["gradients"].sum() <= len(grads["seq"])
    busy = sum(load[f"{p}_seconds"] for p in PARAMETER_PHASES)
    assert np.all(busy <= load["interval_seconds"] * 1.001 + 1e-4)
    work = load["receive_seconds"] + load["admit_seconds"] + load["apply_seconds"] + load["publish_seconds"]
    some = load["gradients"] > 0
    assert some.any()
    assert np.allclose(load["absorption_rate"][some], load["gradients"][some] / work[some], rtol=1e-3)
    assert read_attrs(h5)["num_params"] > 0
