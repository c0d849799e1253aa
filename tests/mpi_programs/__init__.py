"""Small MPI programs the MPI tests start with mpiexec (one job each; nonzero exit = failure)."""
