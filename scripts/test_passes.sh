#!/usr/bin/env bash
# make test's three passes; every pass runs whatever the one before it did. Usage: test_passes.sh PYTHON
#   1. the tests that start no MPI job, and the MPI tests marked parallel_safe (no time bound), two at a time,
#      one per core; a worker that runs out takes tests queued for the other (worksteal; the modules with slow
#      tests first: tests/conftest.py)
#   2. two queues side by side, each a pytest of its own running one test at a time: the Slurm tests (they
#      share the one local cluster, and some take a node down) and the other MPI tests (each starts a job of
#      several ranks; two at once took longer than one beside a Slurm test, which mostly waits). The Slurm
#      queue's output comes after the MPI queue's. (Not xdist's loadgroup: with pytest 9 its groups are lost
#      and the Slurm tests ran on both workers.)
#   3. the tests marked alone (bounds on time or CPU that assume nothing beside them), one at a time,
#      collecting only the files that mark one
set -u
PY=${1:?usage: test_passes.sh PYTHON}
cd "$(dirname "$0")/.."
FIRST="not (mpi or slurm) or parallel_safe"

"$PY" -m pytest -q -m "$FIRST" -n 2 --dist worksteal; first=$?

slurm_log=$(mktemp)
"$PY" -m pytest -q -m "slurm and not ($FIRST) and not alone" >"$slurm_log" 2>&1 &
slurm_pid=$!
"$PY" -m pytest -q -m "not slurm and not ($FIRST) and not alone"; mpi=$?
wait "$slurm_pid"; slurm=$?
echo "--- the Slurm tests (run beside the MPI tests above) ---"
cat "$slurm_log"
rm -f "$slurm_log"

# shellcheck disable=SC2046 - one argument per file
"$PY" -m pytest -q -m "alone and not ($FIRST)" $(grep -l "mark\.alone" tests/test_*.py); alone=$?

echo "make test: first pass exit $first, MPI queue $mpi, Slurm queue $slurm, alone $alone"
[ "$first" -eq 0 ] && [ "$mpi" -eq 0 ] && [ "$slurm" -eq 0 ] && [ "$alone" -eq 0 ]
