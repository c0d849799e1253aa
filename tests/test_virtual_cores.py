"""A node's cores in virtual time (runtime/virtual_time.py): first come first served, or round robin in time slices
(a profile's time_slice_seconds), as the OS shares an oversubscribed node."""
import simpy

from hpcrl.runtime.virtual_time import Cores, _holding, _sliced


def finish_times(time_slice):
    """One core; a 1 s piece of work from t=0, a 2 ms one arriving at t=0.1: when each ends."""
    env = simpy.Environment()
    cores = Cores(env, 1, time_slice)
    ends = {}

    def work(name, start, seconds):
        yield env.timeout(start)
        yield from (_sliced(env, cores, seconds) if time_slice else _holding(env, cores, seconds))
        ends[name] = env.now

    env.process(work("long", 0.0, 1.0))
    env.process(work("short", 0.1, 0.002))
    env.run()
    return ends


def test_first_come_first_served_holds_short_work_behind_long_work():
    ends = finish_times(None)
    assert abs(ends["long"] - 1.0) < 1e-9 and abs(ends["short"] - 1.002) < 1e-9


def test_time_slices_let_short_work_through_within_a_slice_and_keep_the_total():
    ends = finish_times(0.004)
    assert 0.102 <= ends["short"] <= 0.1 + 0.004 + 0.002 + 1e-9, ends  # waits at most the rest of one slice
    assert abs(ends["long"] - 1.002) < 1e-9, ends  # the core did both pieces of work, no more
