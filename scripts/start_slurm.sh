#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, as root, for tests and demos.
#
#   sudo scripts/start_slurm.sh        # install (once), configure, start, wait for the node
#
# Idempotent: a second call finds munge/slurmctld/slurmd up and just waits for
# the node to be idle. Debian packages: slurm-wlm (slurmctld, slurmd, client)
# and munge. No systemd, no cgroups, no accounting database: processes are
# tracked by /proc (proctrack/linuxproc), tasks are not bound (task/none),
# CPUs are the consumable resource (select/cons_tres, CR_CPU), so a 2-core
# machine runs two 1-CPU array tasks at a time. Without slurmdbd `sacct` has
# no data; use `squeue` and `scontrol show job`.
#
# Environment: NCP_SLURM_WAIT (seconds to wait for the idle node, default 120),
# NCP_SLURM_CPUS (default: nproc), NCP_SLURM_STATE (default /var/spool/slurm).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

[[ $(id -u) -eq 0 ]] || { echo "error: start_slurm.sh must run as root" >&2; exit 2; }

WAIT=${NCP_SLURM_WAIT:-120}
CPUS=${NCP_SLURM_CPUS:-$(nproc)}
STATE=${NCP_SLURM_STATE:-/var/spool/slurm}
NODE=$(hostname -s)
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOG_DIR=/var/log/slurm

log() { echo "start_slurm: $*"; }

# -- packages ---------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sinfo >/dev/null \
   || ! command -v munged >/dev/null; then
  log "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The packages' own service start-up fails without systemd; we start the daemons below.
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

# -- munge ------------------------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  log "creating /etc/munge/munge.key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  # A stale socket/pid left by a killed munged would stop a new one from starting.
  if [[ -f /run/munge/munged.pid ]] && ! kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  fi
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
  munge -n | unmunge >/dev/null || { echo "error: munged does not answer" >&2; exit 1; }
fi

# -- slurm.conf -------------------------------------------------------------
# Real memory as slurmd itself measures it, so the node is never drained for
# "Low RealMemory"; fall back to /proc/meminfo.
MEM=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
[[ -n "$MEM" ]] || MEM=$(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo)

mkdir -p "$CONF_DIR" "$LOG_DIR" "$STATE/ctld" "$STATE/d"
NEW_CONF=$(cat <<EOF
# Written by ncp-local scripts/start_slurm.sh: a single-node cluster run as root.
ClusterName=ncp
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=30
MinJobAge=600
MaxArraySize=10001
JobRequeue=1
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
CHANGED=0
if [[ ! -f $CONF ]] || [[ "$(cat "$CONF")" != "$NEW_CONF" ]]; then
  printf '%s\n' "$NEW_CONF" > "$CONF"
  CHANGED=1
  log "wrote $CONF (node $NODE, $CPUS CPUs, ${MEM} MB)"
fi

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# -- daemons ----------------------------------------------------------------
if alive /run/slurmctld.pid; then
  if [[ $CHANGED -eq 1 ]]; then scontrol reconfigure; fi
else
  log "starting slurmctld"
  slurmctld
fi
for _ in $(seq 1 30); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 1; done
scontrol ping | grep -q UP || { echo "error: slurmctld does not answer; see $LOG_DIR/slurmctld.log" >&2; exit 1; }

if ! alive /run/slurmd.pid; then
  log "starting slurmd"
  slurmd
fi

# -- wait for the node ------------------------------------------------------
deadline=$((SECONDS + WAIT))
while :; do
  state=$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -1 || true)
  case "$state" in
    idle|mixed|allocated|completing) break ;;
    down*|drain*|drained*)
      # A restarted slurmd leaves the node down until told otherwise.
      scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
  esac
  if (( SECONDS >= deadline )); then
    echo "error: node $NODE is '${state:-unknown}' after ${WAIT}s; see $LOG_DIR/slurmd.log" >&2
    sinfo -N -l >&2 || true
    exit 1
  fi
  sleep 1
done
log "node $NODE is $state"
sinfo
