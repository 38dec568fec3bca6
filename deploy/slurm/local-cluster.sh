#!/bin/bash
# A real one-node Slurm cluster on this machine, for trying and testing deploy/slurm/ (run as
# root; Debian or Ubuntu). `up` installs slurm-wlm and munge if missing, writes a minimal
# slurm.conf for this machine (its real CPUs and memory, from `slurmd -C`), creates the munge
# key if absent, starts munged, slurmctld and slurmd, and waits until the node is idle. `down`
# stops the three daemons (configuration and packages stay). make slurm-up / make slurm-down.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
SPOOL=/var/spool
LOG_DIR=/var/log/slurm
PARTITION=${NEURO_SLURM_PARTITION:-neuro}
UP_TIMEOUT=${NEURO_SLURM_UP_TIMEOUT:-60}

die() { echo "local-cluster: $*" >&2; exit 1; }

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sinfo >/dev/null && return
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
}

start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        install -d -o munge -g munge -m 0700 /etc/munge
        (umask 077 && dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none)
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    if ! munge -n >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged
        for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
        munge -n | unmunge >/dev/null || die "munged does not answer"
    fi
}

write_conf() {
    local node host
    host=$(hostname -s)
    # e.g. NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105
    node=$(slurmd -C | head -n 1)
    [[ $node == NodeName=* ]] || die "slurmd -C printed no node line"
    install -d -m 0755 "$CONF_DIR" "$LOG_DIR"
    install -d -m 0755 "$SPOOL/slurmctld" "$SPOOL/slurmd"
    cat >"$CONF.tmp" <<EOF
# Written by deploy/slurm/local-cluster.sh: one node, no cgroups, no accounting.
ClusterName=neuro
SlurmctldHost=$host
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobRequeue=1
ReturnToService=2
KillWait=30
MpiDefault=none
StateSaveLocation=$SPOOL/slurmctld
SlurmdSpoolDir=$SPOOL/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$node State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

node_state() { sinfo --noheader --partition="$PARTITION" --format=%T 2>/dev/null | head -n 1; }

up() {
    [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts daemons)"
    install_packages
    start_munge
    write_conf
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    local state=""
    for _ in $(seq $((UP_TIMEOUT * 2))); do
        state=$(node_state)
        case $state in
            idle | mixed | allocated) echo "local-cluster: partition $PARTITION is up ($state)"; return ;;
            down* | drain*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    tail -n 20 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2 || true
    die "no idle node after ${UP_TIMEOUT}s (state: ${state:-no answer})"
}

stop_daemon() {
    local name=$1 pid
    pid=$(pgrep -x "$name" || true)
    [ -n "$pid" ] || return 0
    kill $pid
    for _ in $(seq 50); do kill -0 $pid 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL $pid 2>/dev/null || true
}

down() {
    stop_daemon slurmd
    stop_daemon slurmctld
    stop_daemon munged
    echo "local-cluster: stopped"
}

case ${1:-} in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
