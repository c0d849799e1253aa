"""MPE (multi-agent particle environments, the ``mpe2`` package) as the MARLess workloads.

MARLess (seed 001, section 6.1) runs simple-spread and simple-adversary with six agents:

- ``hpcrl/MPESimpleSpread-v3``: N = 6 cooperating agents cover 6 landmarks (``N`` kwarg).
- ``hpcrl/MPESimpleAdversary-v3``: 1 adversary and N = 5 good agents (6 agents in all). The
  adversary sees 2 numbers fewer than the good agents (it is not told the target landmark);
  its observations are zero-padded at the end so every agent has one observation space, as
  the actors' parallel backend needs (agents are instances of one space). Competitive: VDN
  refuses it (:data:`COMPETITIVE`).

Both are PettingZoo ParallelEnvs with discrete actions (5) and ``max_cycles`` = 25 steps per
episode, after which every agent is truncated at once.
"""
from __future__ import annotations

COMPETITIVE = frozenset({"hpcrl/MPESimpleAdversary-v3"})
"""Env ids whose agents do not share one goal (value-decomposition methods refuse them)."""


def simple_spread(N: int = 6, max_cycles: int = 25, **kwargs):
    """mpe2's simple_spread_v3 parallel env with MARLess' six agents."""
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=N, max_cycles=max_cycles, **kwargs)


def simple_adversary(N: int = 5, max_cycles: int = 25, **kwargs):
    """mpe2's simple_adversary_v3 (N good agents + 1 adversary), observations padded to one space."""
    from mpe2 import simple_adversary_v3

    from hpcrl.envs.padded_observations import PaddedObservations

    return PaddedObservations(simple_adversary_v3.parallel_env(N=N, max_cycles=max_cycles, **kwargs))
