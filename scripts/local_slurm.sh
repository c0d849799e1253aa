#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for hpcrl's tests and for developers.
#
#   scripts/local_slurm.sh start    install slurm-wlm + munge if missing, start munged, slurmctld, slurmd
#   scripts/local_slurm.sh stop     stop the daemons this script started (pid files in the state dir)
#   scripts/local_slurm.sh status   daemons, node state, queue
#   scripts/local_slurm.sh env      print `export SLURM_CONF=...` for shells that need it
#
# Everything lives in one state dir it owns (HPCRL_SLURM_DIR, default /var/lib/hpcrl-slurm): its own
# munge key and socket, slurm.conf, spool, logs and pid files. Nothing else on the machine is touched,
# except /etc/slurm/slurm.conf, which becomes a symlink to our slurm.conf when no such file exists (so
# plain `sbatch` finds the cluster); a real site config there is never replaced. Runs as root
# (SlurmUser=root), as in a CI container. Idempotent: `start` twice leaves one set of daemons.
set -euo pipefail

STATE=${HPCRL_SLURM_DIR:-/var/lib/hpcrl-slurm}
CTLD_PORT=${HPCRL_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${HPCRL_SLURM_SLURMD_PORT:-6818}
CONF=$STATE/etc/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket
SYSTEM_CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)

log() { echo "local_slurm: $*" >&2; }
die() { log "error: $*"; exit 1; }

# pid from a pid file if that process is alive and is the daemon named (so a recycled pid is never killed)
live_pid() {  # pidfile daemon-name
    local pidfile=$1 name=$2 pid
    [[ -r $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name" || return 1
    echo "$pid"
}

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurm-wlm)
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) == 0 ]] || die "need root to install ${missing[*]} (apt-get)"
    log "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq -o DPkg::Lock::Timeout=600
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends munge slurm-wlm >/dev/null
}

write_config() {
    local cpus mem_mb
    cpus=$(nproc)
    mem_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    mkdir -p "$STATE"/{etc,munge,ctld,spool,log,run,jobs}
    chmod 700 "$STATE/munge"
    cat >"$CONF.tmp" <<EOF
# Written by hpcrl scripts/local_slurm.sh: a one-node cluster for tests. Edits are overwritten on start.
ClusterName=hpcrl-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
# no cgroups in CI containers: track processes by parent pid, bind nothing, gather no accounting
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# trust the CPU count written here over what slurmd detects (containers often see more cores than they own)
SlurmdParameters=config_overrides
ReturnToService=2
# keep finished jobs visible to squeue/scontrol for 10 minutes (there is no accounting database)
MinJobAge=600
# requeued jobs may start again at once (tests requeue on the walltime warning signal)
JobRequeue=1
KillWait=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    mv "$CONF.tmp" "$CONF"
    if [[ ! -e $SYSTEM_CONF && ! -L $SYSTEM_CONF ]]; then
        mkdir -p "$(dirname "$SYSTEM_CONF")"
        ln -s "$CONF" "$SYSTEM_CONF"
    elif [[ $(readlink "$SYSTEM_CONF" || true) != "$CONF" ]]; then
        log "$SYSTEM_CONF is not ours: run 'export SLURM_CONF=$CONF' before using sbatch/squeue"
    fi
}

start_munge() {
    live_pid "$STATE/run/munged.pid" munged >/dev/null && return 0
    if [[ ! -s $STATE/munge/munge.key ]]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 400 "$STATE/munge/munge.key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --force --key-file="$STATE/munge/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$STATE/run/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed"
}

start_slurm() {
    if ! live_pid "$STATE/run/slurmctld.pid" slurmctld >/dev/null; then
        slurmctld -f "$CONF"
    fi
    if ! live_pid "$STATE/run/slurmd.pid" slurmd >/dev/null; then
        slurmd -f "$CONF" -N "$NODE"
    fi
}

wait_ready() {
    local t0=$SECONDS state
    export SLURM_CONF=$CONF
    while ((SECONDS - t0 < 60)); do
        state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
        case $state in
            idle* | mixed* | allocated*) log "up: node $NODE $state, $(nproc) CPUs ($((SECONDS - t0)) s)"; return 0 ;;
            down* | drain* | drained*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
    die "node $NODE not ready after 60 s (state: ${state:-no answer}); logs above"
}

cmd_start() {
    [[ $(id -u) == 0 ]] || die "run as root (SlurmUser=root; this is a test cluster)"
    install_packages
    if ! live_pid "$STATE/run/slurmctld.pid" slurmctld >/dev/null; then
        write_config
    fi
    start_munge
    start_slurm
    wait_ready
}

stop_one() {  # name
    local name=$1 pid i
    pid=$(live_pid "$STATE/run/$name.pid" "$name") || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do
        [[ -d /proc/$pid ]] || break
        sleep 0.2
    done
    if [[ -d /proc/$pid ]]; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
}

cmd_stop() {
    stop_one slurmd
    stop_one slurmctld
    stop_one munged
    rm -f "$STATE/run/"*.pid
    if [[ $(readlink "$SYSTEM_CONF" 2>/dev/null || true) == "$CONF" ]]; then
        rm -f "$SYSTEM_CONF"
    fi
}

cmd_status() {
    local name pid rc=0
    for name in munged slurmctld slurmd; do
        if pid=$(live_pid "$STATE/run/$name.pid" "$name"); then
            echo "$name: running (pid $pid)"
        else
            echo "$name: stopped"
            rc=3
        fi
    done
    if ((rc == 0)); then
        SLURM_CONF=$CONF sinfo -N -o "%N %T %c" || rc=3
        SLURM_CONF=$CONF squeue || true
    fi
    return $rc
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|status|env   (state in \$HPCRL_SLURM_DIR, default /var/lib/hpcrl-slurm)" >&2; exit 2 ;;
esac
