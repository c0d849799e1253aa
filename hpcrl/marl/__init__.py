"""MARLess (seed 001, SoCC'25) as plain functions, no MPI: the pieces of dynamic learner sharing
(section 4.3) and cost-aware actor scaling (section 4.4), and the multi-agent algorithms.

- :mod:`detection`: per-agent reward normalisation, tolerant window, least-squares slope, toggle (4.3.1)
- :mod:`scheduler`: the policy-count scheduler N' (4.3.3)
- :mod:`similarity`: PCA + KDE + KL between agents' (observation, action) samples (4.3.2)
- :mod:`grouping`: K-means of agents into N' groups (4.3.3)
- :mod:`convexity`: convexity ratio C = e_max / e_min of a loss Hessian (4.3.4, Eq. 1)
- :mod:`actor_scaling`: per-policy actor demand and the beta rule (4.4, Eq. 2)
- :mod:`sharing`, :mod:`sharing_rank`: the whole 4.3 decision per round, and its place in a run
  (learner reports, the parameter rank's end_round, the policy_map rows)
- :mod:`scaling_rank`: actor scaling in a run (per-policy convexity each round, the active actor count the
  parameter rank sets, the actor_scaling rows)
"""
