#!/bin/bash
#SBATCH --job-name=cartpole
#SBATCH --nodes=2
#SBATCH --ntasks=4
# more ranks than cores; Slurm then refuses any --ntasks-per-node above the core count, so none is given
#SBATCH --overcommit
#SBATCH --time=00:10:00
#SBATCH --partition=debug
#SBATCH --output=slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#
# hpcrl job "cartpole": 4 MPI ranks on 2 node(s) of the test cluster of namespaced nodes from scripts/local_cluster.sh.
# Rendered by `hpcrl submit --site local-cluster`. The same script starts the run, or resumes it
# from its last checkpoint whenever the job runs again (requeue after the walltime warning, node failure).
set -uo pipefail

RUN_DIR=/scratch/me/runs/cartpole
JOB_DIR=/scratch/me/runs/cartpole.job
CONFIG="$JOB_DIR/config.yaml"
RESTART=${SLURM_RESTART_COUNT:-0}
MAX_RESTARTS=10
if [ ! -f "$CONFIG" ]; then  # a script saved from `hpcrl submit --dry-run`: its first start makes the job folder
    mkdir -p "$JOB_DIR" && cat >"$CONFIG" <<'HPCRL_CONFIG_YAML' || exit 1
(job.config_yaml: the resolved config)
HPCRL_CONFIG_YAML
fi
cd "$JOB_DIR" || exit 1
export HDF5_USE_FILE_LOCKING=FALSE
export OMP_NUM_THREADS=1
export PYTHONUNBUFFERED=1
export UCX_LOG_LEVEL=error

# start, or resume from the last checkpoint
if [ -f "$RUN_DIR/checkpoints/latest.pt" ]; then
    echo "hpcrl: resuming $RUN_DIR from its last checkpoint (restart $RESTART)"
    RANK_ARGS=(/opt/hpcrl/bin/python -m hpcrl.runtime.runners.mpi /scratch/me/runs/cartpole --progress=plain --resume)
else
    if [ -e "$RUN_DIR" ]; then  # an earlier attempt stopped before its first checkpoint
        mv "$RUN_DIR" "$RUN_DIR.incomplete-$(date +%Y%m%d-%H%M%S)"
    fi
    echo "hpcrl: starting $RUN_DIR"
    mkdir -p "$RUN_DIR" && cp "$CONFIG" "$RUN_DIR/config.yaml" || exit 1  # the ranks read the resolved config there
    RANK_ARGS=(/opt/hpcrl/bin/python -m hpcrl.runtime.runners.mpi /scratch/me/runs/cartpole --progress=plain)
fi
# what the centre bills: the run records it beside this job's id for `hpcrl analyze`
export HPCRL_SITE=local-cluster HPCRL_CHARGE_UNIT=node-hours HPCRL_CHARGE_PER_NODE_HOUR=1.0

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

# srun writes its own lines to the job's output file; the ranks' failure is read there from here on
JOB_LOG=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdErr=//p')
JOB_LOG_AT_LAUNCH=$(stat -c %s "$JOB_LOG" 2>/dev/null || echo 0)
srun --ntasks=4 --overcommit --mpi=pmi2 --kill-on-bad-exit=1 \
    "${RANK_ARGS[@]}" &
LAUNCHER_PID=$!
while :; do
    wait "$LAUNCHER_PID"
    RC=$?
    kill -0 "$LAUNCHER_PID" 2>/dev/null || break  # wait was cut short by a signal: the ranks still run
done
echo "hpcrl: ranks exited with code $RC"
# the ranks that ended first, when srun's first line about the end is theirs ("srun: error: node2: tasks 4-5:
# Killed"; --kill-on-bad-exit=1 then ended the others), not a step ended by an MPI_Abort or a cancel (whose ranks
# srun lists after, in no telling order): killed by a signal (not an exit code, not Out Of Memory), their node is
# left out of a requeue
LOST_NODE=
FIRST=
if [ "$RC" != 0 ] && [ "$REQUEUE" = 0 ] && [ "$CANCELLED" = 0 ] && [ -f "$JOB_LOG" ]; then
    FIRST=$(tail -c +$((JOB_LOG_AT_LAUNCH + 1)) "$JOB_LOG" |
        grep -m1 -E '^srun: error: [^ :]+: tasks? [0-9,-]+: |^srun: Job step aborted|^slurmstepd[^ ]*: error: \*\*\* ' |
        sed -nE 's/^srun: error: ([^ :]+): tasks? ([0-9,-]+): (.+)$/\1 \2 \3/p')
fi
if [ -n "$FIRST" ]; then
    read -r FAILED_NODE FAILED_RANKS FAILED_HOW <<<"$FIRST"
    case "$FAILED_HOW" in
        "Exited with exit code"*|"Out Of Memory"*)
            echo "hpcrl: ranks $FAILED_RANKS on $FAILED_NODE ended first ($FAILED_HOW)" ;;
        *)
            LOST_NODE=$FAILED_NODE
            echo "hpcrl: ranks $FAILED_RANKS on $FAILED_NODE were killed ($FAILED_HOW); srun ended the others" ;;
    esac
fi
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
        trap '' TERM  # the requeue ends this script with SIGTERM; it must outlive it to update the pending job
        if [ -n "$LOST_NODE" ]; then
            EXCLUDE=$(scontrol show job "$SLURM_JOB_ID" | sed -nE 's/.*ExcNodeList=([^ (][^ ]*).*/\1,/p')$LOST_NODE
            echo "hpcrl: requeueing job $SLURM_JOB_ID (restart $((RESTART + 1)) of $MAX_RESTARTS) without $LOST_NODE, where ranks $FAILED_RANKS were killed: it resumes on the nodes left (ExcNodeList=$EXCLUDE)"
        else
            echo "hpcrl: requeueing job $SLURM_JOB_ID (restart $((RESTART + 1)) of $MAX_RESTARTS)"
        fi
        scontrol requeue "$SLURM_JOB_ID"
        # ExcNodeList only once the job pends again: Slurm refuses it for a running job
        [ -z "$LOST_NODE" ] || scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$EXCLUDE" ||
            echo "hpcrl: warning: could not leave $LOST_NODE out of the requeued job (scontrol update ExcNodeList)"
    fi
fi
exit "$RC"
