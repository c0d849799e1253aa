#!/bin/bash
#PBS -N cartpole
#PBS -A MyProject
#PBS -q debug
#PBS -l select=1:system=polaris
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -l filesystems=home:eagle
#PBS -r y
#PBS -j oe
#PBS -o /eagle/MyProject/runs/cartpole.job/pbs-output.txt
#
# hpcrl job "cartpole": 12 MPI ranks on 1 node(s) of ALCF Polaris (PBS Pro, PALS mpiexec, 4x A100, 32 cores).
# Rendered by `hpcrl submit --site polaris`. The same script starts the run, or resumes it
# from its last checkpoint whenever the job runs again (requeue after the walltime warning, node failure).
set -uo pipefail

RUN_DIR=/eagle/MyProject/runs/cartpole
JOB_DIR=/eagle/MyProject/runs/cartpole.job
CONFIG="$JOB_DIR/config.yaml"
RESTART=${HPCRL_RESTART:-0}
MAX_RESTARTS=10
if [ ! -f "$CONFIG" ]; then  # a script saved from `hpcrl submit --dry-run`: its first start makes the job folder
    mkdir -p "$JOB_DIR" && cat >"$CONFIG" <<'HPCRL_CONFIG_YAML' || exit 1
(job.config_yaml: the resolved config)
HPCRL_CONFIG_YAML
fi
cd "$JOB_DIR" || exit 1
exec >>"$JOB_DIR/job-${PBS_JOBID:-interactive}.log" 2>&1  # one log per job; PBS overwrites its -o file
module use /soft/modulefiles
export HDF5_USE_FILE_LOCKING=FALSE
export OMP_NUM_THREADS=1
export PYTHONUNBUFFERED=1
export UCX_LOG_LEVEL=error

# start, or resume from the last checkpoint
if [ -f "$RUN_DIR/checkpoints/latest.pt" ]; then
    echo "hpcrl: resuming $RUN_DIR from its last checkpoint (restart $RESTART)"
    RANK_ARGS=(/opt/hpcrl/bin/python -m hpcrl.runtime.runners.mpi /eagle/MyProject/runs/cartpole --progress=plain --resume)
else
    if [ -e "$RUN_DIR" ]; then  # an earlier attempt stopped before its first checkpoint
        mv "$RUN_DIR" "$RUN_DIR.incomplete-$(date +%Y%m%d-%H%M%S)"
    fi
    echo "hpcrl: starting $RUN_DIR"
    mkdir -p "$RUN_DIR" && cp "$CONFIG" "$RUN_DIR/config.yaml" || exit 1  # the ranks read the resolved config there
    RANK_ARGS=(/opt/hpcrl/bin/python -m hpcrl.runtime.runners.mpi /eagle/MyProject/runs/cartpole --progress=plain)
fi
# what the centre bills: the run records it beside this job's id for `hpcrl analyze`
export HPCRL_SITE=polaris HPCRL_CHARGE_UNIT=node-hours HPCRL_CHARGE_PER_NODE_HOUR=1.0

# The walltime warning (USR1) and a cancel (TERM) reach this shell; the launcher passes them on
# to the ranks, whose parameter rank writes a checkpoint before the job ends.
REQUEUE=0
CANCELLED=0
LAUNCHER_PID=
forward() { if [ -n "$LAUNCHER_PID" ]; then kill -s "$1" "$LAUNCHER_PID" 2>/dev/null; fi; }
trap 'REQUEUE=1; echo "hpcrl: walltime warning: checkpoint and requeue"; forward USR1' USR1
trap 'CANCELLED=1; echo "hpcrl: terminated: checkpoint and stop"; forward TERM' TERM
checkpoint_time() { stat -c %Y "$RUN_DIR/checkpoints/latest.pt" 2>/dev/null || echo none; }
CHECKPOINT_AT_START=$(checkpoint_time)
# PBS sends no warning before the walltime: a timer signals this shell 120 s before it ends
( sleep 3480 && kill -s USR1 $$ ) &
TIMER_PID=$!

# put runs on /eagle/PROJECT (Lustre); home is small
mpiexec -n 12 --ppn 12 --depth=4 --cpu-bind depth --hostfile "$PBS_NODEFILE" \
    "${RANK_ARGS[@]}" &
LAUNCHER_PID=$!
while :; do
    wait "$LAUNCHER_PID"
    RC=$?
    kill -0 "$LAUNCHER_PID" 2>/dev/null || break  # wait was cut short by a signal: the ranks still run
done
echo "hpcrl: ranks exited with code $RC"
kill "$TIMER_PID" 2>/dev/null
# a failure (a lost node or rank) after a new checkpoint comes back and resumes from it; one before any
# progress does not (the same failure would repeat)
if [ "$RC" != 0 ] && [ "$REQUEUE" = 0 ] && [ "$CANCELLED" = 0 ] && [ "$(checkpoint_time)" != "$CHECKPOINT_AT_START" ]; then
    REQUEUE=1
    echo "hpcrl: the ranks failed (exit $RC) after writing a new checkpoint: requeue to resume from it"
fi

if [ "$REQUEUE" = 1 ]; then
    if [ ! -f "$RUN_DIR/checkpoints/latest.pt" ]; then
        echo "hpcrl: no checkpoint in $RUN_DIR; not requeueing"
    elif [ "$RESTART" -ge "$MAX_RESTARTS" ]; then
        echo "hpcrl: $MAX_RESTARTS restarts done; not requeueing (submit this script again to go on)"
    else
        # users cannot requeue a PBS job: submit this script again, to start once this job has ended
        NEXT=$(qsub -W depend=afterany:"$PBS_JOBID" -v HPCRL_RESTART=$((RESTART + 1)) /eagle/MyProject/runs/cartpole.job/cartpole.pbs) \
            && echo "hpcrl: submitted $NEXT to resume (restart $((RESTART + 1)) of $MAX_RESTARTS)"
    fi
fi
exit "$RC"
