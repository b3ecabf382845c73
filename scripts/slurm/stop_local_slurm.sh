#!/usr/bin/env bash
# Stop the one-node cluster of scripts/slurm/start_local_slurm.sh: slurmd, slurmctld, munged,
# each by the process id in its pid file (nothing else is touched). Packages, slurm.conf and the
# munge key stay; start_local_slurm.sh brings it back in a second. Safe to run when it is down.
set -euo pipefail

[ "$(id -u)" -eq 0 ] || { echo "stop_local_slurm: must run as root" >&2; exit 1; }

stop() { # name pidfile
    local name=$1 pidfile=$2 pid
    if [ -f "$pidfile" ] && pid=$(cat "$pidfile") && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        # Wait up to 10 s for it to exit (slurmctld saves its state first).
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "stop_local_slurm: $name (pid $pid) did not stop in 10 s" >&2
            return 1
        fi
        echo "stop_local_slurm: stopped $name (pid $pid)"
    else
        echo "stop_local_slurm: $name not running"
    fi
    rm -f "$pidfile"
}

# Compute node first, then the controller, then authentication, which both use.
stop slurmd /run/slurmd.pid
stop slurmctld /run/slurmctld.pid
stop munged /run/munge/munged.pid
