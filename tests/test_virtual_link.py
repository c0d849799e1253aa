"""Rank 0's link in virtual time (runtime/transport/sim.py ``_Charges.over``): transfers share its bandwidth one at a
time, while their latencies overlap (a NIC has many messages in flight), as the scale model prices the link."""
from hpcrl.runtime.transport.sim import TransportPrices, _Charges
from hpcrl.runtime.virtual_time import VirtualClock, VirtualWorld


def ends_of_reads(readers: int, latency: float, moving: float) -> list[float]:
    """``readers`` ranks on other nodes each read from rank 0 at virtual second 0: when each read ends."""
    world = VirtualWorld()
    prices = TransportPrices(push=float, receive=float, publish=float, fetch=float, fragment_send=0.0, report=0.0,
                             link_times=lambda a, b, nbytes: (latency, moving))
    charges = _Charges(world, prices)
    ends = []

    for rank in range(1, readers + 1):
        clock = VirtualClock(world, lambda work, count: 0.0)

        def read(rank=rank, clock=clock):
            charges.to_or_from_rank0(rank, 4, "a read")
            ends.append(clock.now())

        world.spawn(rank, f"reader {rank}", read, clock, None)
    world.run()
    return sorted(ends)


def test_small_reads_wait_for_each_others_bytes_not_latencies():
    ends = ends_of_reads(100, latency=2e-6, moving=1e-9)
    assert max(ends) < 2e-6 + 100 * 1e-9 + 1e-12, max(ends)  # held for latency, it would be 100 x 2 us


def test_large_reads_queue_for_the_bandwidth_and_each_adds_its_latency():
    ends = ends_of_reads(4, latency=1e-3, moving=1e-2)
    assert all(abs(end - (k * 1e-2 + 1e-3)) < 1e-9 for k, end in enumerate(ends, start=1)), ends
