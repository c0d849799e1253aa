"""MPI plumbing and the role loops: rank map, RMA windows, fragment channels (no RL maths here).

Importing ``hpcrl.runtime`` does not import mpi4py; the submodules that need MPI do.
"""
