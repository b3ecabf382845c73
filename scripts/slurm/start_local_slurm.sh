#!/usr/bin/env bash
# Bring up a one-node Slurm cluster on this machine, for tests/test_slurm.py and for trying
# profiles/slurm-ci by hand. Idempotent: safe to run again while it is up (it then only waits
# for the node and prints its state).
#
#   sudo scripts/slurm/start_local_slurm.sh        # stop with scripts/slurm/stop_local_slurm.sh
#
# Needs root (apt-get, daemons started directly, no systemd). Debian/Ubuntu only.
# Environment: SLURM_START_TIMEOUT (seconds to wait for the node, default 60),
#              SLURM_MEM_MARGIN_MB (memory kept back from Slurm, default 1024),
#              SLURM_CONF (the config file, as for Slurm itself; default /etc/slurm/slurm.conf).
# A slurm.conf it did not write (a real cluster's) is left alone: the script stops first.
set -euo pipefail

TIMEOUT=${SLURM_START_TIMEOUT:-60}
MARGIN_MB=${SLURM_MEM_MARGIN_MB:-1024}
CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
HEADER="# Written by scripts/slurm/start_local_slurm.sh"
NODE=localhost
PARTITION=local

now_ms() { echo $(($(date +%s%N) / 1000000)); }
# Seconds, one decimal, from a now_ms start (to an optional now_ms end).
secs() { local d=$((${2:-$(now_ms)} - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }
t0=$(now_ms)
die() { echo "start_local_slurm: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages and starts slurmctld/slurmd as root)"
# A slurm.conf this script did not write belongs to a real cluster: change nothing.
if [ -f "$CONF" ]; then
    case "$(head -1 "$CONF")" in
        "$HEADER"*) ;;
        *) die "$CONF was not written by this script (a real cluster's?); changed nothing" ;;
    esac
fi

# ---- 1. packages ----------------------------------------------------------------------------
need=()
for pkg in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "apt-get not found: install ${need[*]} yourself"
    echo "start_local_slurm: installing ${need[*]}"
    # No systemd here: tell the packages' maintainer scripts not to start services themselves
    # (exit 101 = "action forbidden"); we start the daemons below with our own config.
    policy_rc=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        policy_rc=/usr/sbin/policy-rc.d
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${need[@]}"; then
        # Stale or missing package lists: refresh once and retry.
        apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}" \
            || { [ -n "$policy_rc" ] && rm -f "$policy_rc"; die "apt-get install ${need[*]} failed"; }
    fi
    [ -n "$policy_rc" ] && rm -f "$policy_rc"
fi
t_installed=$(now_ms)
echo "start_local_slurm: packages ready in $(secs "$t0")s"

# ---- 2. munge (Slurm's authentication between client, controller and node) ------------------
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
# /run/munge holds the socket; systemd-tmpfiles would create it, so do it by hand.
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile=/etc/munge/munge.key
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
fi
# munged refuses a key readable by anyone but its owner.
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    # Run as the munge user, as its service file would.
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munged did not start (see /var/log/munge/munged.log)"
fi

# ---- 3. slurm.conf for this one node ---------------------------------------------------------
# nproc without the OpenMP variables it also obeys: under `make test` each pytest process sets
# OMP_NUM_THREADS=1, and the node would flip between 1 CPU and all of them from one caller to the
# next (a change of node that `scontrol reconfigure` refuses).
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
mem_total=$(free -m | awk '/^Mem:/ {print $2}')
real_mem=$((mem_total - MARGIN_MB))
[ "$real_mem" -ge 512 ] || real_mem=$((mem_total * 3 / 4))
def_mem=$((real_mem / cpus))
install -d -m 0755 "$(dirname "$CONF")" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm

new_conf=$(cat <<CONF
$HEADER: a one-node cluster for tests. Do not edit;
# the script rewrites it.
ClusterName=dprflow-local
# Controller and compute node are this machine, under the name localhost (slurmd -N localhost).
SlurmctldHost=$NODE
# Both daemons run as root: there is no slurm service user setup to get right in a container.
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MpiDefault=none
# No cgroups (containers rarely delegate them): track job processes through /proc, and bind
# no tasks to cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No slurmdbd, so no accounting: sacct does not work, and Snakemake's Slurm plugin must poll
# with squeue instead (profiles/slurm-ci sets status_command: squeue).
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Hand out cores and memory as separate consumable resources, so several small jobs share
# the node (the default, select/linear, gives each job the whole node).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Memory of a job that asks for none: without it one job claims all of RealMemory and the
# rest queue behind it.
DefMemPerCPU=$def_mem
# squeue only lists a finished job for MinJobAge seconds; Snakemake's squeue status checks
# must see it before it disappears (keep this >= 3x the profile's
# init_seconds_before_status_checks and its status check interval).
MinJobAge=300
# A node that was down (e.g. after a restart of slurmd) comes back by itself once it registers.
ReturnToService=2
# Trust the CPUs and RealMemory below rather than draining the node when the hardware slurmd
# detects (a container sees the host's sockets and memory) differs from them.
SlurmdParameters=config_overrides
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
SchedulerType=sched/backfill
# From nproc and free -m (minus ${MARGIN_MB} MB for the OS and the daemons).
NodeName=$NODE CPUs=$cpus RealMemory=$real_mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
)
conf_changed=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$new_conf" ]; then
    printf '%s\n' "$new_conf" > "$CONF"
    conf_changed=1
fi

# ---- 4. daemons ------------------------------------------------------------------------------
t_daemons=$(now_ms)
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if alive /run/slurmctld.pid; then
    # Already up: pick up a changed config without a restart. A changed node (CPUs, memory)
    # needs the daemons restarted: stop them and run this script again, which starts them anew.
    if [ $conf_changed -eq 1 ] && ! scontrol reconfigure; then
        echo "start_local_slurm: the node changed; restarting slurmctld and slurmd"
        bash "$(dirname "$0")/stop_local_slurm.sh"
        exec bash "$0"
    fi
else
    # -c: start from a clean state (no jobs or node states from an earlier run).
    slurmctld -c
fi
alive /run/slurmd.pid || slurmd -N $NODE

# ---- 5. wait for the node --------------------------------------------------------------------
state=
deadline=$(($(date +%s) + TIMEOUT))
while [ "$(date +%s)" -lt $deadline ]; do
    state=$(sinfo -h -N -n $NODE -o '%t' 2>/dev/null | head -1 || true)
    case "$state" in
        idle | mix | alloc) break ;;
        # A drained/down node (e.g. left over from an earlier run): put it back in service.
        down* | drain* | drng*) scontrol update NodeName=$NODE State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.5
done
case "$state" in
    idle | mix | alloc) ;;
    *) die "node $NODE not idle after ${TIMEOUT}s (state: '${state:-no answer}');" \
        "see /var/log/slurm/slurmctld.log and /var/log/slurm/slurmd.log" ;;
esac

echo "start_local_slurm: node $NODE is $state (CPUs=$cpus RealMemory=${real_mem}MB DefMemPerCPU=$def_mem," \
    "partition $PARTITION)"
echo "start_local_slurm: install $(secs "$t0" "$t_installed")s," \
    "daemons $(secs "$t_daemons")s, total $(secs "$t0")s"
