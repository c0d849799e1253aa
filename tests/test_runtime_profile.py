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
from hpcrl.runtime.record.cycle_profile import LEARNER_PHASES, PARAMETER_PHASES, PhaseClock


def test_phase_clock_charges_every_second_to_one_phase():
    clock = PhaseClock(("a", "b"))
    clock.lap("a")
    sum(range(100_000))
    clock.lap("b")
    clock.move(1e9, "b", "a")  # never more than b holds
    elapsed, sec = clock.take()
    assert sec["b"] == 0.0 and sec["a"] == pytest.approx(elapsed)
    assert clock.take()[0] == 0.0


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
