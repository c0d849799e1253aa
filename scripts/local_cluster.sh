#!/usr/bin/env bash
# A real Slurm cluster of N compute nodes on this machine, for hpcrl's tests and for developers.
#
#   scripts/local_cluster.sh start [N]   N nodes (default 3, at most 16); installs the Debian packages if missing
#   scripts/local_cluster.sh stop        cancel the cluster's jobs, stop its daemons, remove its namespaces and links
#   scripts/local_cluster.sh status      daemons, namespaces, nodes, queue (exit 3 when not running)
#   scripts/local_cluster.sh env         print `export SLURM_CONF=...` for shells that need it
#
# Each compute node K is a network namespace hpcrl-nodeK plus a UTS namespace (hostname nodeK) with
# its own address NET.(10+K) on a veth pair into a bridge (hpcrl-br0, NET.1 on the host side), and
# runs its own slurmd. slurmctld, slurmdbd, a MariaDB server (the accounting database, listening on
# NET.1 only) and munged run on the host beside them. The host filesystem is every node's filesystem,
# as Lustre/GPFS is at a site. Each node sees its own /etc/hosts (ip netns exec binds
# /etc/netns/hpcrl-nodeK/hosts over it) naming every node and the head, so MPI, srun and PMI find
# each other by name. NET is a private /24 (HPCRL_CLUSTER_NET, default 10.213.0) that `start`
# checks nothing on this machine uses; no traffic leaves the bridge.
#
# Everything else lives in one state dir (HPCRL_CLUSTER_DIR, default /var/lib/hpcrl-cluster):
# configs, munge key and socket, database files, spool, logs, pid files, and the list of what was
# created (run/nodes). `stop` removes exactly that: daemons by pid file, leftover job processes by
# namespace (`ip netns pids`), then the namespaces, links and hosts files. /etc/slurm/slurm.conf
# becomes a symlink to our slurm.conf when no such file exists (so plain `sbatch` finds the cluster);
# a real site config there is never replaced. Runs as root (SlurmUser=root), as in a CI container.
set -euo pipefail

STATE=${HPCRL_CLUSTER_DIR:-/var/lib/hpcrl-cluster}
NET=${HPCRL_CLUSTER_NET:-10.213.0}
CTLD_PORT=6817
SLURMD_PORT=6818
DBD_PORT=6819
DB_PORT=3306
MAX_NODES=16
BRIDGE=hpcrl-br0
HEAD_ADDR=$NET.1
CONF=$STATE/etc/slurm.conf
DBD_CONF=$STATE/etc/slurmdbd.conf
MUNGE_SOCKET=$STATE/munge/munge.socket
DB_SOCKET=$STATE/db/mysqld.sock
SYSTEM_CONF=/etc/slurm/slurm.conf
HEAD=$(hostname -s)
PACKAGES=(munge slurm-wlm slurmdbd mariadb-server iproute2)

log() { echo "local_cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

node_ns() { echo "hpcrl-node$1"; }    # network namespace of node K
node_veth() { echo "hpcrl-v$1"; }     # host end of node K's veth pair (the node's end is eth0)
node_addr() { echo "$NET.$((10 + $1))"; }

# pid from a pid file if that process is alive and is the program named (so a recycled pid is never killed)
live_pid() {  # pidfile program-name
    local pidfile=$1 name=$2 pid
    [[ -r $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name" || return 1
    echo "$pid"
}

# the node count of the running cluster (from run/nodes), or nothing
running_nodes() { [[ -r $STATE/run/nodes ]] && cat "$STATE/run/nodes" || true; }

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null || die "missing Debian packages ${missing[*]} and no apt-get"
    log "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq -o DPkg::Lock::Timeout=600
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
}

ip_to_int() { local IFS=.; read -r a b c d <<<"$1"; echo $(((a << 24) | (b << 16) | (c << 8) | d)); }

# refuse a NET that any address or route of this machine already overlaps (our own bridge aside)
check_subnet_free() {
    [[ $NET =~ ^(10\.[0-9]{1,3}\.[0-9]{1,3}|172\.(1[6-9]|2[0-9]|3[01])\.[0-9]{1,3}|192\.168\.[0-9]{1,3})$ ]] \
        || die "HPCRL_CLUSTER_NET=$NET: give the first three octets of a private /24, e.g. 10.213.0"
    local ours lo hi line prefix net len start end
    ours=$(ip_to_int "$NET.0")
    lo=$ours hi=$((ours + 255))
    while read -r line; do
        [[ $line == *" dev $BRIDGE "* || $line == *" dev $BRIDGE" ]] && continue
        prefix=$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(\/[0-9]+)?$/) { print $i; exit } }' <<<"$line")
        [[ -n $prefix ]] || continue
        net=${prefix%/*}
        len=32
        [[ $prefix == */* ]] && len=${prefix#*/}
        ((len == 0)) && continue  # the default route: more specific routes win, ours stays on the bridge
        start=$(( $(ip_to_int "$net") & (0xffffffff << (32 - len)) & 0xffffffff ))
        end=$((start + (1 << (32 - len)) - 1))
        if ((start <= hi && end >= lo)); then
            die "$NET.0/24 overlaps '$line' on this machine; pick another with HPCRL_CLUSTER_NET=10.X.Y"
        fi
    done < <(ip -4 -o route show table all; ip -4 -o addr show | awk '{print $4 " dev " $2}')
}

write_hosts() {  # the /etc/hosts every node sees
    local n=$1 k dir
    [[ -d /etc/netns ]] || { mkdir /etc/netns && touch "$STATE/run/made-etc-netns"; }
    for k in $(seq "$n"); do
        dir=/etc/netns/$(node_ns "$k")
        mkdir -p "$dir"
        {
            echo "# written by hpcrl scripts/local_cluster.sh for node$k; removed by its stop"
            echo "127.0.0.1 localhost"
            echo "$HEAD_ADDR $HEAD hpcrl-head"
            local j
            for j in $(seq "$n"); do echo "$(node_addr "$j") node$j"; done
        } >"$dir/hosts"
    done
}

create_network() {
    local n=$1 k ns veth
    ip link add "$BRIDGE" type bridge
    ip addr add "$HEAD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for k in $(seq "$n"); do
        ns=$(node_ns "$k") veth=$(node_veth "$k")
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$BRIDGE"
        ip link set "$veth" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$(node_addr "$k")/24" dev eth0
        ip -n "$ns" link set eth0 up
    done
    write_hosts "$n"
}

write_config() {
    local n=$1 cpus mem_mb k
    cpus=$(nproc)
    mem_mb=$(awk -v n="$n" '/MemTotal/ {printf "%d", $2 / 1024 * 0.9 / n}' /proc/meminfo)
    mkdir -p "$STATE"/{etc,munge,ctld,log,run,db}
    for k in $(seq "$n"); do mkdir -p "$STATE/spool/node$k"; done
    chmod 700 "$STATE/munge" "$STATE/etc"
    cat >"$CONF.tmp" <<EOF
# Written by hpcrl scripts/local_cluster.sh: $n nodes in network namespaces. Edits are overwritten on start.
ClusterName=hpcrl-local
SlurmctldHost=$HEAD($HEAD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
# no cgroups in CI containers: track processes by parent pid, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HEAD_ADDR
AccountingStoragePort=$DBD_PORT
# the munge socket for talking to slurmdbd (without it clients look for the system munged)
AccountingStoragePass=$MUNGE_SOCKET
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# trust the CPU count written here over what slurmd detects (every node sees the whole machine)
SlurmdParameters=config_overrides
ReturnToService=2
# keep finished jobs visible to squeue/scontrol for 10 minutes (sacct has them for good)
MinJobAge=600
# requeued jobs may start again at once (tests requeue on the walltime warning signal)
JobRequeue=1
# SIGTERM to SIGKILL when a job or step ends (default 30 s; the tests wait it out after every kill): the ranks'
# checkpoint on SIGTERM takes well under a second
KillWait=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
# every task: MPI between nodes over the network, as between real nodes (see task_prolog.sh)
TaskProlog=$STATE/etc/task_prolog.sh
SlurmctldDebug=info
SlurmdDebug=info
EOF
    for k in $(seq "$n"); do
        echo "NodeName=node$k NodeAddr=$(node_addr "$k") NodeHostname=node$k CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN" >>"$CONF.tmp"
    done
    echo "PartitionName=debug Nodes=node[1-$n] Default=YES MaxTime=24:00:00 State=UP OverSubscribe=NO" >>"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
    # The nodes share this machine's memory, and UCX (the mpich wheel's default netmod) would use it
    # between them (measured: 0 bytes of a 100 MB node1->node2 transfer crossed the bridge). Real nodes
    # share none: every task uses MPICH's OFI netmod over TCP on the node's eth0, unless the job chose a
    # netmod or provider itself. A process on this machine that joins a job by MPI ports (a ClusterEnv
    # head) uses the same with FI_TCP_IFACE=hpcrl-br0; exported into the job, that name is replaced here.
    cat >"$STATE/etc/task_prolog.sh" <<'EOF'
#!/bin/sh
# Written by hpcrl scripts/local_cluster.sh: Slurm's TaskProlog; "export NAME=value" lines set the task's environment.
[ -n "${MPIR_CVAR_CH4_NETMOD:-}" ] || echo "export MPIR_CVAR_CH4_NETMOD=ofi"
[ -n "${FI_PROVIDER:-}" ] || echo "export FI_PROVIDER=tcp"
# /proc/sys/net shows this node's network namespace: keep an interface the node has, else its eth0
[ -n "${FI_TCP_IFACE:-}" ] && [ -d "/proc/sys/net/ipv4/conf/$FI_TCP_IFACE" ] || echo "export FI_TCP_IFACE=eth0"
EOF
    chmod 755 "$STATE/etc/task_prolog.sh"
    if [[ ! -s $STATE/etc/db.pass ]]; then
        (umask 077; head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$STATE/etc/db.pass")
    fi
    (umask 077; cat >"$DBD_CONF" <<EOF
# Written by hpcrl scripts/local_cluster.sh: the accounting daemon and its MariaDB (NET.1 only).
AuthType=auth/munge
AuthInfo=$MUNGE_SOCKET
DbdHost=$HEAD
DbdAddr=$HEAD_ADDR
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=$HEAD_ADDR
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$STATE/etc/db.pass")
StorageLoc=slurm_acct_db
EOF
)
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

db_sql() { mariadb --no-defaults --socket="$DB_SOCKET" -u root -e "$1"; }

start_database() {
    live_pid "$STATE/run/mariadb.pid" mariadbd >/dev/null && return 0
    if [[ ! -d $STATE/db/mysql ]]; then
        mariadb-install-db --no-defaults --user=root --datadir="$STATE/db" --auth-root-authentication-method=socket \
            --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1 || { cat "$STATE/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi
    # listens on the bridge address only; Slurm's recommended InnoDB settings, scaled down
    setsid mariadbd --no-defaults --user=root --datadir="$STATE/db" --socket="$DB_SOCKET" \
        --pid-file="$STATE/run/mariadb.pid" --bind-address="$HEAD_ADDR" --port="$DB_PORT" --skip-name-resolve \
        --log-error="$STATE/log/mariadb.log" --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
        </dev/null >/dev/null 2>&1 &
    local t0=$SECONDS
    until db_sql "SELECT 1" >/dev/null 2>&1; do
        ((SECONDS - t0 < 60)) || { tail -n 20 "$STATE/log/mariadb.log" >&2; die "MariaDB not answering after 60 s"; }
        sleep 0.5
    done
    db_sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'$HEAD_ADDR' IDENTIFIED BY '$(cat "$STATE/etc/db.pass")';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'$HEAD_ADDR';"
}

start_slurmdbd() {
    # slurmdbd reads slurmdbd.conf beside the slurm.conf that SLURM_CONF names
    live_pid "$STATE/run/slurmdbd.pid" slurmdbd >/dev/null || SLURM_CONF=$CONF slurmdbd  # daemonizes
    local t0=$SECONDS
    until SLURM_CONF=$CONF timeout 20 sacctmgr -n list cluster >"$STATE/log/sacctmgr.out" 2>&1; do
        ((SECONDS - t0 < 60)) || { tail -n 20 "$STATE/log/slurmdbd.log" >&2; die "slurmdbd not answering after 60 s"; }
        sleep 0.5
    done
    # the cluster, an account and root in it: every job gets an association, so sacct lists them all
    export SLURM_CONF=$CONF
    sacctmgr -n -P list cluster format=cluster | grep -qx hpcrl-local || sacctmgr -i add cluster hpcrl-local >/dev/null
    sacctmgr -n -P list account format=account | grep -qx hpcrl || sacctmgr -i add account hpcrl Cluster=hpcrl-local >/dev/null
    sacctmgr -n -P list user format=user | grep -qx root \
        && sacctmgr -n -P list assoc user=root account=hpcrl format=user | grep -qx root \
        || sacctmgr -i add user root Account=hpcrl DefaultAccount=hpcrl >/dev/null
}

start_slurm() {
    local n=$1 k
    live_pid "$STATE/run/slurmctld.pid" slurmctld >/dev/null || slurmctld -f "$CONF"
    for k in $(seq "$n"); do
        live_pid "$STATE/run/slurmd-node$k.pid" slurmd >/dev/null && continue
        # in node K's network namespace, a new UTS namespace named nodeK and a mount namespace where
        # the node's hosts file covers /etc/hosts (what `ip netns exec` does, minus its fresh /sys,
        # which would hide the cgroup mounts slurmd wants); host mounts still propagate in
        nsenter --net="/run/netns/$(node_ns "$k")" unshare --uts --mount --propagation slave -- \
            sh -c "mount --bind '/etc/netns/$(node_ns "$k")/hosts' /etc/hosts && hostname node$k && exec slurmd -f '$CONF' -N node$k"
    done
}

wait_ready() {
    local n=$1 t0=$SECONDS states idle node
    export SLURM_CONF=$CONF
    while ((SECONDS - t0 < 90)); do
        states=$(sinfo -h -N -p debug -o '%N %T' 2>/dev/null || true)
        idle=$(grep -cE ' (idle|mixed|allocated)' <<<"$states" || true)
        if ((idle == n)); then
            log "up: $n node(s) node[1-$n] on $NET.0/24, $(nproc) CPUs each, accounting in MariaDB ($((SECONDS - t0)) s)"
            return 0
        fi
        for node in $(awk '$2 ~ /^(down|drain)/ {print $1}' <<<"$states"); do
            scontrol update nodename="$node" state=resume 2>/dev/null || true
        done
        sleep 0.5
    done
    tail -n 20 "$STATE/log/slurmctld.log" "$STATE"/log/slurmd-node*.log >&2 || true
    die "nodes not ready after 90 s: ${states:-no answer}; logs above"
}

cmd_start() {
    local n=${1:-3} have
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_NODES)) || die "N=$n: give a node count from 1 to $MAX_NODES"
    [[ $(id -u) == 0 ]] || die "run as root (namespaces, SlurmUser=root; this is a test cluster)"
    have=$(running_nodes)
    if [[ -n $have ]]; then
        [[ $have == "$n" ]] || die "a $have-node cluster is running; '$0 stop' first"
    else
        install_packages
        check_subnet_free
        mkdir -p "$STATE/run"
        echo "$n" >"$STATE/run/nodes"  # before creating anything: stop removes what this names
        trap 'log "start failed; removing what it made"; cmd_stop' EXIT
        create_network "$n"
    fi
    write_config "$n"
    start_munge
    start_database
    start_slurmdbd
    start_slurm "$n"
    wait_ready "$n"
    trap - EXIT
}

stop_pid() {  # pid name
    local pid=$1 name=$2 i t0=$EPOCHREALTIME
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 100); do
        [[ -d /proc/$pid ]] || break
        sleep 0.1
    done
    [[ -d /proc/$pid ]] && kill -KILL "$pid" 2>/dev/null || true
    log "stopped $name (pid $pid, $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}') s)"
}

stop_daemon() {  # pidfile program-name
    local pid
    pid=$(live_pid "$1" "$2") || return 0
    stop_pid "$pid" "$2"
}

cmd_stop() {
    local n k ns pid jobs i
    n=$(running_nodes)
    if [[ -n $n ]] && live_pid "$STATE/run/slurmctld.pid" slurmctld >/dev/null; then
        # the cluster's own jobs first, so their steps end cleanly
        jobs=$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            SLURM_CONF=$CONF scancel $jobs 2>/dev/null || true
            for i in $(seq 50); do
                [[ -z $(SLURM_CONF=$CONF squeue -h -t R,CG -o %i 2>/dev/null || true) ]] && break
                sleep 0.2
            done
        fi
    fi
    # the nodes' slurmds together (each takes a second or two to go)
    for k in $(seq "${n:-0}"); do stop_daemon "$STATE/run/slurmd-node$k.pid" slurmd & done
    wait
    stop_daemon "$STATE/run/slurmctld.pid" slurmctld
    stop_daemon "$STATE/run/slurmdbd.pid" slurmdbd
    stop_daemon "$STATE/run/mariadb.pid" mariadbd
    stop_daemon "$STATE/run/munged.pid" munged
    for k in $(seq "${n:-0}"); do
        ns=$(node_ns "$k")
        if ip netns list | grep -qw "^$ns"; then
            # whatever still runs in the node (job steps left behind): only processes in our namespace
            for pid in $(ip netns pids "$ns" 2>/dev/null); do stop_pid "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-60) in $ns"; done
            ip netns del "$ns"
        fi
        # deleting the namespace deletes its end of the pair, and the kernel the other (asynchronously)
        if ip link show "$(node_veth "$k")" >/dev/null 2>&1; then ip link del "$(node_veth "$k")" 2>/dev/null || true; fi
        rm -f "/etc/netns/$ns/hosts"
        rmdir "/etc/netns/$ns" 2>/dev/null || true
    done
    if [[ -e $STATE/run/made-etc-netns ]]; then  # ours, and empty unless someone else put things there since
        rmdir /etc/netns 2>/dev/null || true
        rm -f "$STATE/run/made-etc-netns"
    fi
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
    rm -f "$STATE/run/"*.pid "$STATE/run/nodes"
    if [[ $(readlink "$SYSTEM_CONF" 2>/dev/null || true) == "$CONF" ]]; then
        rm -f "$SYSTEM_CONF"
    fi
    [[ -n $n ]] && log "removed $n node namespace(s), their links and $BRIDGE"
    return 0
}

cmd_status() {
    local n k name pid rc=0
    n=$(running_nodes)
    [[ -n $n ]] || { echo "not running"; return 3; }
    for name in munged mariadbd slurmdbd slurmctld; do
        if pid=$(live_pid "$STATE/run/${name/mariadbd/mariadb}.pid" "$name"); then
            echo "$name: running (pid $pid)"
        else
            echo "$name: stopped"; rc=3
        fi
    done
    for k in $(seq "$n"); do
        if pid=$(live_pid "$STATE/run/slurmd-node$k.pid" slurmd); then
            echo "slurmd node$k: running (pid $pid, namespace $(node_ns "$k"), $(node_addr "$k"))"
        else
            echo "slurmd node$k: stopped"; rc=3
        fi
    done
    if ((rc == 0)); then
        SLURM_CONF=$CONF sinfo -N -o "%N %T %c" || rc=3
        SLURM_CONF=$CONF squeue || true
    fi
    return $rc
}

case ${1:-} in
    start) cmd_start "${2:-3}" ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start [N]|stop|status|env   (N nodes, default 3; state in \$HPCRL_CLUSTER_DIR, default /var/lib/hpcrl-cluster)" >&2; exit 2 ;;
esac
