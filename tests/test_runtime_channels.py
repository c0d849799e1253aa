"""Fragment layout (in process) and actor -> learner transport (mpiexec)."""
import numpy as np
import pytest
from mpi_programs.launcher import run_mpi

from hpcrl.runtime.transport.layout import FragmentLayout


def fragment(layout_T=3, N=2):
    rng = np.random.default_rng(0)
    return {
        "obs": rng.standard_normal((layout_T, N, 4)).astype(np.float32),
        "actions": rng.standard_normal((layout_T, N, 1)),
        "rewards": np.arange(layout_T * N, dtype=np.float32).reshape(layout_T, N),
        "terminated": np.eye(layout_T, N, dtype=bool),
        "truncated": np.zeros((layout_T, N), bool),
        "behaviour_logp": -np.ones((layout_T, N)),
        "values": np.full((layout_T, N), 0.5),
        "final_values": np.zeros((layout_T, N)),
        "last_value": np.array([1.5, -2.0]),
        "policy_version": 7,
        "actor": 3,
        "fragment": 11,
    }


def test_layout_round_trip_is_exact_and_aligned():
    layout = FragmentLayout(3, 2, (4,), np.float32, (1,), np.float64)
    frag = fragment()
    buf = layout.pack(frag)
    assert buf.dtype == np.uint8 and buf.size == layout.nbytes
    assert all(offset % 8 == 0 for _, _, offset in layout.fields.values())
    back = layout.unpack(buf)
    for k, v in frag.items():
        np.testing.assert_array_equal(back[k], np.asarray(v).astype(back[k].dtype) if k not in ("policy_version", "actor", "fragment") else v)
    assert back["terminated"].dtype == bool and back["policy_version"] == 7
    buf[:] = 0  # unpack copied: the fragment does not alias the buffer
    assert back["rewards"][2, 1] == 5


def test_layout_rejects_wrong_shapes_and_missing_fields():
    layout = FragmentLayout(3, 2, (4,), np.float32, (1,), np.float64)
    frag = fragment()
    frag["rewards"] = np.zeros((2, 3))
    with pytest.raises(ValueError, match="rewards"):
        layout.pack(frag)
    del frag["rewards"]
    with pytest.raises(KeyError, match="rewards"):
        layout.pack(frag)
    with pytest.raises(ValueError, match="clashes"):
        FragmentLayout(3, 2, extra={"obs": ((1,), np.float32)})


@pytest.mark.mpi
@pytest.mark.slow
def test_fragments_from_several_actors_arrive_intact_in_order():
    assert "OK channels" in run_mpi(5, "channels", 2, 60, 2, 0.0, timeout=30)


@pytest.mark.mpi
@pytest.mark.slow
def test_slow_learner_bounds_fragments_in_flight_and_actors_wait():
    assert "OK channels" in run_mpi(4, "channels", 1, 15, 1, 0.01, timeout=30)
