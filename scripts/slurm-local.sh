#!/usr/bin/env bash
# A real two-node Slurm on this one machine, for the slurm launch target's end-to-end test
# (tests/launch/test_launch_slurm.py, marker `slurm`) and for trying `hetauto launch --target slurm` by hand.
#
# Installs Debian's slurm-wlm and munge (if missing), writes /etc/slurm/slurm.conf with two nodes, n1 and n2,
# each served by its own slurmd on 127.0.0.1 (`slurmd -N n1` on port 17001, `-N n2` on 17002), partitions
# fast (n1), slow (n2) and all (both; the default), starts munged, slurmctld and both slurmd, and waits until
# `sinfo` shows both nodes idle. Run as root (the `slurm` tests' fixture runs it when no Slurm answers). Running it
# again while the daemons are up only says so; two runs at once (two pytest workers) take turns on a lock file,
# so the second finds the first's daemons up. Writes nothing into the repository; logs are in /var/log/hetauto-slurm.
#
# Choices (see ../shared/reference/launch.md): heterogeneous jobs are scheduled only by sched/backfill (every
# bf_interval seconds: 1 here, not 30); proctrack/linuxproc and task/none need no cgroups (containers); select/cons_tres with CPUs=4 per node and config_overrides (the
# configured CPUs count, not this machine's) so a node takes a job of several tasks; no accounting daemon, so
# `sacct` has no data here: poll `squeue` and `scontrol show job` (kept MinJobAge seconds after the end).
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by hetauto scripts/slurm-local.sh"
RUN=/run/hetauto-slurm
SPOOL=/var/spool/hetauto-slurm
LOGS=/var/log/hetauto-slurm
NODES=(n1 n2)

say() { echo "slurm-local: $*"; }
die() { echo "slurm-local: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and starts system daemons)"

# --- one run at a time: a second waits here for the first, then finds the daemons up (fd 9 holds the lock until
# this script exits; the daemons are started without it)
LOCK=/run/lock/hetauto-slurm-local.lock
install -d -m 0755 "$(dirname "$LOCK")"
exec 9>"$LOCK"
flock -w 600 9 || die "another slurm-local.sh has held $LOCK for 10 minutes"

alive() {  # alive PIDFILE: the process the file names is running
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

both_idle() {  # n1 and n2 answer and take jobs (idle; or mixed/allocated: running a job; planned: kept for one)
    local states
    states=$(sinfo -h -N -p all -o '%N %t' 2>/dev/null | sort -u) || return 1
    for n in "${NODES[@]}"; do
        grep -Eq "^$n (idle|mix|alloc|plnd)\$" <<<"$states" || return 1
    done
}

# --- the configuration this machine gets
host=$(hostname -s)
conf=$(cat <<EOF
$MARK: two nodes on this machine
ClusterName=hetauto-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.1 Port=17001 CPUs=4 RealMemory=2048 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.0.1 Port=17002 CPUs=4 RealMemory=2048 State=UNKNOWN
PartitionName=fast Nodes=n1 MaxTime=INFINITE State=UP
PartitionName=slow Nodes=n2 MaxTime=INFINITE State=UP
PartitionName=all Nodes=n1,n2 MaxTime=INFINITE State=UP Default=YES
EOF
)

# --- already up with this configuration: nothing to do
if [[ -f $CONF ]] && [[ $(cat "$CONF") == "$conf" ]] && alive "$RUN/slurmctld.pid" \
        && alive "$RUN/slurmd-n1.pid" && alive "$RUN/slurmd-n2.pid" && both_idle; then
    say "already running: nodes n1 (partition fast) and n2 (partition slow), partition all; $CONF"
    exit 0
fi

# --- packages (quiet; only when missing)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sinfo >/dev/null \
        || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null 2>&1 || die "apt-get update failed"
    apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 || die "apt-get install slurm-wlm munge failed"
fi

# --- munge: its key, log and socket folder belong to the munge user
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge /var/lib/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged 9>&- || die "munged did not start (see /var/log/munge/munged.log)"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null 2>&1 || die "munge does not work (see /var/log/munge/munged.log)"
fi

# --- slurm.conf (a foreign one is kept as slurm.conf.orig)
if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF" && [[ ! -e $CONF.orig ]]; then
    mv "$CONF" "$CONF.orig"
fi
install -d -m 0755 /etc/slurm "$RUN" "$LOGS" "$SPOOL" "$SPOOL/ctld"
changed=0
if [[ ! -f $CONF ]] || [[ $(cat "$CONF") != "$conf" ]]; then
    printf '%s\n' "$conf" > "$CONF"
    changed=1
fi
chmod 0644 "$CONF"

# --- daemons: a running one is restarted only when the configuration changed
stop() {  # stop PIDFILE
    if alive "$1"; then
        local pid; pid=$(cat "$1")
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
}
if (( changed )); then
    for n in "${NODES[@]}"; do stop "$RUN/slurmd-$n.pid"; done
    stop "$RUN/slurmctld.pid"
fi
if ! alive "$RUN/slurmctld.pid"; then
    slurmctld 9>&- || die "slurmctld did not start (see $LOGS/slurmctld.log)"
fi
for n in "${NODES[@]}"; do
    install -d -m 0755 "$SPOOL/$n"
    if ! alive "$RUN/slurmd-$n.pid"; then
        slurmd -N "$n" 9>&- || die "slurmd -N $n did not start (see $LOGS/slurmd-$n.log)"
    fi
done

# --- wait until both nodes are idle (a node left down from an earlier run is resumed)
for i in $(seq 120); do
    both_idle && break
    if (( i % 10 == 0 )); then
        for n in "${NODES[@]}"; do
            scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
        done
    fi
    sleep 0.5
done
both_idle || die "nodes not idle after 60 s: $(sinfo -h -N -o '%N=%t' 2>&1 | tr '\n' ' ')(logs: $LOGS)"
say "up: nodes n1 (partition fast) and n2 (partition slow), partition all (default); $CONF, logs $LOGS"
