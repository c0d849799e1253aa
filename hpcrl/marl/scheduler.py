"""The policy-count scheduler (MARLess section 4.3.3).

The seed prints N' = min(2^j, 2^(floor(log2 N) + 1)) for the j-th time sharing is enabled
(j = 1, 2, ...), N agents. Read so, the second term is the smallest power of two above N, so
the cap can exceed N (N = 6: 8); K-means cannot make more groups than there are agents, so
hpcrl also caps at N: N'_j = min(2^j, 2^(floor(log2 N) + 1), N). For N = 6: 2, 4, 6, 6, ...
The count grows with j, so each later switch changes the number of policies less than the
first (the scheduler's purpose: small disruptions late in training). The issue's shorthand
"2^(log2 N) + 1" (= N + 1 without the floor) gives the same sequence once capped at N.
"""
from __future__ import annotations


def policy_count(j: int, num_agents: int) -> int:
    """N' for the j-th enabling of sharing (j >= 1) among ``num_agents`` agents."""
    if j < 1 or num_agents < 1:
        raise ValueError(f"policy_count(j={j}, num_agents={num_agents}): both must be >= 1")
    cap = 2 ** (num_agents.bit_length())  # 2^(floor(log2 N) + 1)
    return min(2 ** min(j, 62), cap, num_agents)
