#!/usr/bin/env bash
# A real Slurm cluster on this host, for CI and for trying the sbatch templates:
# Debian's slurm-wlm + munge, run as root, without systemd. One node in the
# default partition (debug); a second one, NODE-het in partition "het", so that
# hetjob.sbatch's two components get a node each (Slurm's backfill scheduler
# places the components of a heterogeneous job on different nodes). Both are
# slurmd daemons of this host (slurmd -N).
#
#   bash launch/slurm/local_slurm.sh start    # install if missing, start, wait for the nodes
#   bash launch/slurm/local_slurm.sh status   # sinfo; exit 0 if both nodes are up
#   bash launch/slurm/local_slurm.sh stop     # stop the daemons this script started
#
# Then, in the caller's shell:  export SLURM_CONF=$HYBRID_SLURM_DIR/etc/slurm.conf
# (start and status print that line); sbatch, srun, sinfo, scontrol read it.
#
# Everything lives under HYBRID_SLURM_DIR (default /tmp/hybrid-slurm): slurm.conf,
# the munge key and socket, logs, pid files, controller state and slurmd spool.
# Nothing is written to /etc: the daemons get the config with -f and SLURM_CONF,
# and munged runs on its own socket (slurm.conf AuthInfo=socket=...), so a system
# munged, if any, is left alone. Needs root (apt-get, SlurmUser=root).
#
# The node declares HYBRID_SLURM_CPUS CPUs (default: the host's, at least 16) so
# that jobs of 4-9 tasks (the smoke and the full configs) fit on a 2-core
# machine; SlurmdParameters=config_overrides keeps slurmd from draining the
# node for having fewer real cores. A job asking for more is refused at once.
#
# Other settings: HYBRID_SLURM_TIMEOUT (seconds to wait for the node, default 60),
# HYBRID_SLURM_CTLD_PORT / HYBRID_SLURM_SLURMD_PORT (default 6817 / 6818),
# HYBRID_SLURM_CRED_EXPIRE (seconds a requeued job waits before it restarts, default 5).
set -euo pipefail

DIR=${HYBRID_SLURM_DIR:-/tmp/hybrid-slurm}
CONF=$DIR/etc/slurm.conf
MUNGE_DIR=$DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
NODE=$(hostname -s)
HET_NODE=$NODE-het
TIMEOUT=${HYBRID_SLURM_TIMEOUT:-60}
export SLURM_CONF=$CONF   # for the client commands this script runs

die() { echo "local_slurm.sh: error: $*" >&2; exit 1; }
note() { echo "local_slurm.sh: $*" >&2; }

# pid_alive NAME: the daemon NAME started by this script (its pid file under
# $DIR/run; slurmd-NODE for a node's slurmd) is running.
pid_alive() {
    local pidfile=$DIR/run/$1.pid pid
    [ -s "$pidfile" ] || return 1
    pid=$(cat "$pidfile")
    kill -0 "$pid" 2>/dev/null || return 1
    # not a zombie (a daemon that just died), and not a recycled pid: the
    # process must be that daemon
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "${1%%-*}"* ]]
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "slurm is not installed and this is not root: run as root, or apt-get install slurm-wlm munge"
    note "installing slurm-wlm and munge with apt-get (missing: ${missing[*]})"
    # Debian's postinst scripts start the services through invoke-rc.d (munged
    # on /etc's key; slurmd and slurmctld do not start without /etc/slurm/slurm.conf).
    # We run our own daemons, so forbid that while installing, the usual container
    # way: a policy-rc.d that says no (this machine image already has one).
    local made_policy="" status=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\n# temporary, from launch/slurm/local_slurm.sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local apt=(apt-get install -y -q --no-install-recommends slurm-wlm munge)
    export DEBIAN_FRONTEND=noninteractive
    if ! "${apt[@]}" >"$DIR/log/apt.log" 2>&1; then
        # a fresh machine may have no package lists, or stale ones
        note "apt-get install failed; running apt-get update and trying again"
        apt-get update -q >>"$DIR/log/apt.log" 2>&1 || true
        "${apt[@]}" >>"$DIR/log/apt.log" 2>&1 || status=$?
    fi
    [ -n "$made_policy" ] && rm -f /usr/sbin/policy-rc.d
    if [ "$status" -ne 0 ]; then
        tail -n 30 "$DIR/log/apt.log" >&2
        die "could not install slurm-wlm and munge (log: $DIR/log/apt.log); check that Debian's package repositories are reachable, or install them by hand: apt-get install slurm-wlm munge"
    fi
}

write_munge_key() {
    [ -s "$MUNGE_DIR/munge.key" ] && return 0
    note "writing a munge key to $MUNGE_DIR/munge.key"
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile="$MUNGE_DIR/munge.key"
    else
        dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0400 "$MUNGE_DIR/munge.key"
}

write_conf() {
    local cpus mem
    cpus=$(nproc)
    [ "$cpus" -lt 16 ] && cpus=16
    cpus=${HYBRID_SLURM_CPUS:-$cpus}
    # RealMemory in MB: 90% of the machine's, the rest for the daemons and the OS
    mem=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    cat >"$CONF.new" <<EOF
# One-node Slurm cluster written by launch/slurm/local_slurm.sh; rewritten at
# each start while the daemons are stopped. Use: export SLURM_CONF=$CONF
ClusterName=hybrid
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=${HYBRID_SLURM_CTLD_PORT:-6817}
SlurmdPort=${HYBRID_SLURM_SLURMD_PORT:-6818}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (default 120 s) is also how long a requeued job waits before it
# can start again: short here so that requeue tests are quick.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=${HYBRID_SLURM_CRED_EXPIRE:-5}
StateSaveLocation=$DIR/state/slurmctld
# Two slurmd daemons on this host: each node its own spool, pid file and log (%n: the node).
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# A node's own /tmp for its jobs: PMIx steps (srun --mpi=pmix) make their directory there, named by
# job and step only, so the two components of a heterogeneous job would collide in one /tmp.
TmpFS=$DIR/tmp-%n
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups, no systemd: processes tracked through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No accounting database.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Heterogeneous jobs, and requeued ones once their cred_expire wait is over, are started by the
# backfill scheduler alone, which runs every 30 s by default: a hetjob waited 20 s for a free node
# and each requeued job 28-31 s (measured in slurmctld.log). Every second here.
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
# A job that can never run (more tasks than the node's CPUs) is refused at
# submission instead of pending forever (which would hang sbatch --wait).
EnforcePartLimits=ALL
SwitchType=switch/none
# A node that comes back after a stop/start is usable again at once.
ReturnToService=2
# Batch jobs may be requeued (scontrol requeue, node failure); the default, said explicitly.
JobRequeue=1
MailProg=/bin/true
InactiveLimit=0
KillWait=10
# sbatch --wait polls every 2 s only while that is at least half of MinJobAge (so that it sees a
# job before it is purged); with Slurm's 300 it backs off to 32 s, and a 12 s job took 42 s to
# return. At 4: 16 s.
MinJobAge=4
SlurmctldTimeout=120
SlurmdTimeout=300
# The node reports the CPUs and memory below, not the hardware's, so that more
# tasks than cores fit (this is a test cluster: tasks share the real cores).
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 Port=${HYBRID_SLURM_SLURMD_PORT:-6818} CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=$HET_NODE NodeHostname=$NODE NodeAddr=127.0.0.1 Port=$((${HYBRID_SLURM_SLURMD_PORT:-6818} + 1)) CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=het Nodes=$HET_NODE MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    mv "$CONF.new" "$CONF"
}

# node_state: the node's state as sinfo prints it (idle, mixed, idle* = not
# responding, down*, ...), or nothing.
node_state() { { sinfo -h -N -n "${1:-$NODE}" -o %T 2>/dev/null || true; } | head -n 1; }

show_logs() {
    local f
    for f in "$DIR/log/munged.log" "$DIR/log/slurmctld.log" "$DIR/log/slurmd-$NODE.log" "$DIR/log/slurmd-$HET_NODE.log"; do
        [ -e "$f" ] || continue
        echo "----- last lines of $f" >&2
        tail -n 25 "$f" >&2
    done
    if grep -qs 'Address already in use' "$DIR/log/slurmctld.log" "$DIR/log/slurmd-"*.log; then
        echo "local_slurm.sh: hint: another Slurm (or another HYBRID_SLURM_DIR) holds the ports;" \
             "stop it, or set HYBRID_SLURM_CTLD_PORT and HYBRID_SLURM_SLURMD_PORT (it and the next one) to free ones" >&2
    fi
}

start() {
    [ "$(id -u)" -eq 0 ] || die "run as root (the daemons run as SlurmUser=root)"
    mkdir -p "$DIR/etc" "$DIR/log" "$DIR/run" "$DIR/state/slurmctld" "$DIR/spool/slurmd-$NODE" \
        "$DIR/spool/slurmd-$HET_NODE" "$DIR/tmp-$NODE" "$DIR/tmp-$HET_NODE" "$MUNGE_DIR"
    chmod 0711 "$MUNGE_DIR"   # the socket reachable by all, the key (0400) by root only
    install_packages
    write_munge_key
    if pid_alive slurmctld || pid_alive "slurmd-$NODE" || pid_alive "slurmd-$HET_NODE"; then
        note "daemons already running: keeping $CONF as it is"
    else
        write_conf
    fi

    if ! pid_alive munged; then
        note "starting munged (socket $MUNGE_SOCKET)"
        # --force: start even over a stale socket left by a killed munged, or
        # when a directory above the key or socket is group/world-writable.
        munged --force --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCKET" \
            --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
            --seed-file="$MUNGE_DIR/munged.seed" \
            || { show_logs; die "munged did not start (log above)"; }
    fi
    if ! pid_alive slurmctld; then
        note "starting slurmctld"
        slurmctld -f "$CONF" || { show_logs; die "slurmctld did not start (log above)"; }
    fi
    local node
    for node in "$NODE" "$HET_NODE"; do
        if ! pid_alive "slurmd-$node"; then
            note "starting slurmd (node $node)"
            slurmd -f "$CONF" -N "$node" || { show_logs; die "slurmd did not start (log above)"; }
        fi
    done

    local waited state
    for node in "$NODE" "$HET_NODE"; do
        note "waiting up to ${TIMEOUT}s for node $node to be idle"
        waited=0 state=""
        while :; do
            state=$(node_state "$node")
            # exact names: a suffix such as idle* (not responding) is not up yet
            case "$state" in
                idle|mixed|allocated|completing) break ;;
                drain*|down*)
                    # e.g. left down by an earlier run: bring it back
                    [ "$waited" -gt 5 ] && scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
            esac
            # a daemon that died (bad config, port in use) will not come back: say so now
            if [ "$waited" -ge 3 ] && ! { pid_alive munged && pid_alive slurmctld && pid_alive "slurmd-$NODE" \
                                          && pid_alive "slurmd-$HET_NODE"; }; then
                show_logs
                die "a daemon exited during start-up (logs above, all in $DIR/log); fix the cause, then 'bash $0 stop' and start again"
            fi
            if [ "$waited" -ge "$TIMEOUT" ]; then
                sinfo -N -l >&2 || true
                show_logs
                die "node $node is not up after ${TIMEOUT}s (state: '${state:-none}'); read the logs above, then 'bash $0 stop' and start again (HYBRID_SLURM_TIMEOUT=... to wait longer)"
            fi
            sleep 1
            waited=$((waited + 1))
        done
    done
    sinfo
    echo "export SLURM_CONF=$CONF"
}

# stop_daemons NAME...: SIGTERM the daemons NAME... started by this script at once, wait for them
# (each took about 2 s to end, one after another 8 s).
stop_daemons() {
    local name pid i alive stopping=()
    for name in "$@"; do
        if pid_alive "$name"; then
            pid=$(cat "$DIR/run/$name.pid")
            note "stopping $name (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            stopping+=("$name:$pid")
        fi
        rm -f "$DIR/run/$name.pid"
    done
    for i in $(seq 1 150); do
        alive=0
        for name in "${stopping[@]}"; do kill -0 "${name#*:}" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && return 0
        sleep 0.1
    done
    for name in "${stopping[@]}"; do
        if kill -0 "${name#*:}" 2>/dev/null; then
            note "${name%%:*} did not stop in 15s: sending SIGKILL"
            kill -KILL "${name#*:}" 2>/dev/null || true
        fi
    done
}

stop() {
    # Jobs still running would leave slurmstepd and their tasks behind: cancel them.
    if pid_alive slurmctld; then
        local jobs
        jobs=$({ squeue -h -o %A 2>/dev/null || true; } | tr '\n' ' ')
        if [ -n "${jobs// /}" ]; then
            note "cancelling the jobs still queued or running: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs || true
            local i
            for i in $(seq 1 30); do
                [ -z "$(squeue -h -t running,completing -o %A 2>/dev/null || true)" ] && break
                sleep 0.5
            done
        fi
    fi
    stop_daemons "slurmd-$NODE" "slurmd-$HET_NODE" slurmctld
    stop_daemons munged  # last: the others authenticate through it until they end
}

status() {
    if ! pid_alive slurmctld; then
        echo "slurmctld is not running (HYBRID_SLURM_DIR=$DIR): bash $0 start" >&2
        return 1
    fi
    sinfo
    echo "export SLURM_CONF=$CONF"
    local node
    for node in "$NODE" "$HET_NODE"; do
        case "$(node_state "$node")" in
            idle|mixed|allocated|completing) ;;
            *) echo "node $node is not up; logs are in $DIR/log" >&2; return 1 ;;
        esac
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: bash $0 start|stop|status   (state in HYBRID_SLURM_DIR=$DIR)" >&2; exit 2 ;;
esac
