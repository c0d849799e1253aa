"""The job: a Plan built once (``plan.py``), the roles that run it (``roles/``), how they talk
(``transport/``), what they leave (``record/``), and the runners that wire them (``runners/``).

Importing ``hpcrl.runtime`` does not import mpi4py; the modules that need MPI do.
"""
