#!/usr/bin/env bash
# A one-node Slurm cluster on localhost for CI: installs slurm-wlm + munge (Debian 12 ships
# Slurm 22.05), writes slurm.conf sized from nproc/free, starts munged, slurmctld and slurmd,
# and waits until `sinfo` shows the node idle. Idempotent; needs root. No accounting daemon:
# the Snakemake profile queries job states with squeue (MinJobAge keeps finished jobs visible).
set -euo pipefail

log() { echo "[slurm-setup] $*"; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

node=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(free -m | awk '/^Mem:/ {print $2}') * 9 / 10 ))
conf_dir=/etc/slurm
mkdir -p "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge

cat > "$conf_dir/slurm.conf" <<CONF
# Written by .ci/slurm/setup.sh: one node, this machine.
ClusterName=ci
SlurmctldHost=${node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=3600
KillWait=10
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=${node} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=ci Nodes=${node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
log "slurm.conf: node ${node}, ${cpus} CPUs, ${mem_mb} MB"

# munge: a key, then the daemon (as the munge user, as Debian's service does)
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown munge:munge /etc/munge/munge.key /run/munge
chmod 400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
fi
for _ in $(seq 30); do munge -n >/dev/null 2>&1 && break; sleep 0.5; done
munge -n | unmunge >/dev/null
log "munged is up"

# Restart the Slurm daemons so they read this slurm.conf.
for daemon in slurmctld slurmd; do
    if [ -f "/run/${daemon}.pid" ] && kill -0 "$(cat "/run/${daemon}.pid")" 2>/dev/null; then
        kill "$(cat "/run/${daemon}.pid")"
        for _ in $(seq 50); do kill -0 "$(cat "/run/${daemon}.pid" 2>/dev/null)" 2>/dev/null || break; sleep 0.2; done
    fi
done
slurmctld
slurmd

for _ in $(seq 120); do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
    if [ "$state" = "idle" ]; then
        sinfo
        log "node ${node} is idle"
        exit 0
    fi
    if [ "$state" = "down" ] || [ "$state" = "drain" ] || [ "$state" = "inval" ]; then
        scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
    fi
    sleep 1
done
log "node ${node} did not become idle; last state '${state:-none}'"
tail -n 30 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log || true
exit 1
