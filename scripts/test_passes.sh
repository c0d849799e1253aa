#!/usr/bin/env bash
# make test's two passes; the second runs whatever the first did. Usage: test_passes.sh PYTHON
#   1. every test not marked alone, two at a time, one per core; a worker that runs out takes tests queued for the
#      other (worksteal; the modules with slow tests first: tests/conftest.py). An MPI or Slurm test has at most one
#      other test beside it; two Slurm tests may run side by side on the local cluster (each has a job of its own;
#      the one that takes a node down, the node-fault test, is marked alone). (xdist's loadgroup cannot keep the
#      Slurm tests in one queue: under pytest 9 its groups are lost.)
#   2. the tests marked alone (bounds on time or CPU that assume nothing beside them), one at a time, collecting
#      only the files that mark one
set -u
PY=${1:?usage: test_passes.sh PYTHON}
cd "$(dirname "$0")/.."

"$PY" -m pytest -q -m "not alone" -n 2 --dist worksteal; first=$?

# shellcheck disable=SC2046 - one argument per file
"$PY" -m pytest -q -m alone $(grep -l "mark\.alone" tests/test_*.py); alone=$?

echo "make test: first pass exit $first, alone $alone"
[ "$first" -eq 0 ] && [ "$alone" -eq 0 ]
