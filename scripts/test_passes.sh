#!/usr/bin/env bash
# make test's three passes; every pass runs whatever the one before it did. Usage: test_passes.sh PYTHON
#   1. the tests that start no MPI job, and the MPI tests marked parallel_safe (no time bound), two at a time,
#      one per core; a worker that runs out takes tests queued for the other (worksteal; the modules with slow
#      tests first: tests/conftest.py)
#   2. the other MPI tests and the Slurm tests, two at a time, one per core (worksteal). Two Slurm tests may run
#      side by side on the local cluster: each has a job of its own, and the one that takes a node down (the
#      node-fault test) is marked alone. (Two queues with xdist's loadgroup, one for the Slurm tests, were
#      tried: under pytest 9 xdist's groups are lost; as two pytest processes the passes took 452 s instead of
#      the 286 s of this one.)
#   3. the tests marked alone (bounds on time or CPU that assume nothing beside them), one at a time,
#      collecting only the files that mark one
set -u
PY=${1:?usage: test_passes.sh PYTHON}
cd "$(dirname "$0")/.."
FIRST="not (mpi or slurm) or parallel_safe"

"$PY" -m pytest -q -m "$FIRST" -n 2 --dist worksteal; first=$?

"$PY" -m pytest -q -m "not ($FIRST) and not alone" -n 2 --dist worksteal; second=$?

# shellcheck disable=SC2046 - one argument per file
"$PY" -m pytest -q -m "alone and not ($FIRST)" $(grep -l "mark\.alone" tests/test_*.py); alone=$?

echo "make test: first pass exit $first, second $second, alone $alone"
[ "$first" -eq 0 ] && [ "$second" -eq 0 ] && [ "$alone" -eq 0 ]
