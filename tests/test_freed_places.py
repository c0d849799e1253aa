"""actors.on_policy: rank 0 frees each batch's backlog places once its push is applied, every group's in one write
(hpcrl/runtime/roles/freed_places.py)."""
import threading

import numpy as np

from hpcrl.runtime.roles.freed_places import FreedPlaces, NoPlaces, places_for
from hpcrl.runtime.roles.push_apply import ApplyGradients
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.local import LocalCounters
from hpcrl.staleness import GradientRecord


class CountingCounters(LocalCounters):
    """The serial runner's counters, each add_each call kept (what a reader could see between two writes)."""

    def __init__(self, n):
        super().__init__(n, threading.Event())
        self.writes = []

    def add_each(self, first, values):
        self.writes.append((first, list(np.asarray(values).tolist())))
        super().add_each(first, values)


def _push(group, seq, fragments):
    return GradientRecord(group=group, seq=seq, base_version=0, samples=1, grad=None, stats={"fragments": fragments})


def test_a_versions_pushes_free_their_places_in_every_group_at_once():
    G = 3
    counters = CountingCounters(control.num_counters(G, 8))
    for g in range(G):
        counters.add(control.BACKLOG + g, 2)
    places = places_for(True, counters, G, lambda g: (g,))
    places.applied([_push(0, 0, 2), _push(1, 0, 2)])
    places.applied([_push(2, 0, 2)])
    assert counters.writes == []  # nothing before the publish
    places.publish()
    assert counters.writes == [(control.BACKLOG, [-2, -2, -2])]
    assert counters.read_all()[control.BACKLOG:control.BACKLOG + G].tolist() == [0, 0, 0]
    places.publish()  # nothing new: no write
    assert len(counters.writes) == 1


def test_pushes_made_before_a_resume_hold_no_place_and_an_allreduce_push_frees_every_group():
    G = 2
    counters = CountingCounters(control.num_counters(G, 4))
    places = FreedPlaces(counters, G, lambda g: range(G))  # learners.topology=allreduce: group 0 for all
    places.restore([3, 0])  # group 0 made pushes 0..2 before the checkpoint
    places.applied([_push(0, 2, 4)])  # queued at the checkpoint, applied after the resume: its places are gone
    places.publish()
    assert counters.writes == []
    places.applied([_push(0, 3, 4)])
    places.publish()
    assert counters.writes == [(control.BACKLOG, [-4, -4])]


def test_pipelined_actors_free_their_own_places_and_a_gradient_push_frees_its_group():
    counters = CountingCounters(control.num_counters(2, 4))
    places = places_for(False, counters, 2, lambda g: (g,))
    assert isinstance(places, NoPlaces)
    places.applied([_push(1, 0, 3)])
    places.publish()
    assert counters.writes == []  # the learner freed them when it took the batch
    assert list(ApplyGradients.batches_in(None, 1)) == [1]
