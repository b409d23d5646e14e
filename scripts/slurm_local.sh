#!/usr/bin/env bash
# A real single-node Slurm cluster from Debian's packages (slurm-wlm, munge), for tests and
# for trying the batch scripts under slurm/ on one machine.
#
#   scripts/slurm_local.sh start DIR   install Slurm and munge if missing (root only), write
#                                      DIR/slurm.conf, start munged, slurmctld and slurmd, wait
#                                      until the node is idle, print `export SLURM_CONF=...`
#   scripts/slurm_local.sh stop DIR    kill the cluster's jobs, stop its daemons (none is left)
#
#   eval "$(scripts/slurm_local.sh start /tmp/slurm)" && sbatch slurm/train.sbatch ...
#
# Exit status 77 (what ctest counts as skipped) when Slurm cannot be had here: not root, or
# the packages cannot be installed. Everything the cluster writes lives under DIR (config,
# state, spool, logs, pid files) except munged's socket directory, /run/ddiloco-munge.*, which
# DIR/munge_dir names and `stop` removes. munged runs with its own socket and key, and the
# daemons listen on free ports, so a system Slurm or munge on the machine is left alone.
# Slurm knobs the tests rely on: JobRequeue=1; KillWait=30 (SIGTERM, then SIGKILL 30 s later:
# time for a job to write its checkpoint); AuthInfo cred_expire=10 and sched_interval=2, so that
# a requeued job starts again ~12 s after it ended (Slurm's defaults: 121 s, then up to 60 s).
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
say() { echo "slurm_local: $*" >&2; }
skip() { say "$*"; exit 77; }

[[ $# == 2 && ( $1 == start || $1 == stop ) ]] || { usage >&2; exit 2; }
cmd=$1
if [[ $cmd == stop && ! -d $2 ]]; then say "no cluster in $2"; exit 0; fi
mkdir -p "$2"
DIR=$(cd "$2" && pwd -P)
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

pid_of() { if [[ -s $1 ]]; then cat "$1"; fi; }
alive() { [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; }
# wait_gone PID SECONDS: true once PID has exited.
wait_gone() {
  local pid=$1 deadline=$((SECONDS + $2))
  while alive "$pid"; do ((SECONDS < deadline)) || return 1; sleep 0.2; done
}

stop_cluster() {
  [[ -f $CONF ]] || { say "no cluster in $DIR (no slurm.conf)"; return 0; }
  local ctld slurmd munged
  ctld=$(pid_of "$DIR/run/slurmctld.pid")
  slurmd=$(pid_of "$DIR/run/slurmd.pid")
  if alive "$ctld"; then
    # Jobs first, with SIGKILL (no KillWait): slurmstepd and the job's processes would survive
    # a plain shutdown of the daemons.
    local jobs=()
    mapfile -t jobs < <(timeout 10 squeue -h -o %i 2>/dev/null || true)
    if ((${#jobs[@]} > 0)); then
      timeout 10 scancel --full -s KILL "${jobs[@]}" 2>/dev/null || true
      timeout 10 scancel "${jobs[@]}" 2>/dev/null || true  # pending ones
      local deadline=$((SECONDS + 15))
      while [[ -n $(timeout 10 squeue -h -o %i 2>/dev/null || true) ]] && ((SECONDS < deadline)); do
        sleep 0.3
      done
    fi
    timeout 10 scontrol shutdown >/dev/null 2>&1 || true
  fi
  local p
  for p in $ctld $slurmd; do
    wait_gone "$p" 15 && continue
    say "daemon $p did not stop: SIGKILL"
    kill -KILL "$p" 2>/dev/null || true
  done
  # Safety net: a slurmstepd of this cluster that outlived slurmd (it carries our SLURM_CONF).
  local env_file
  for env_file in /proc/[0-9]*/environ; do
    p=${env_file#/proc/}; p=${p%/environ}
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == slurmstepd ]] || continue
    if grep -qzxF "SLURM_CONF=$CONF" "$env_file" 2>/dev/null; then
      say "leftover slurmstepd $p: SIGKILL"
      pkill -KILL -P "$p" 2>/dev/null || true
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  local mdir
  mdir=$(cat "$DIR/munge_dir" 2>/dev/null || true)
  if [[ -n $mdir ]]; then
    munged=$(pid_of "$mdir/munged.pid")
    if alive "$munged"; then
      kill -TERM "$munged" 2>/dev/null || true
      wait_gone "$munged" 10 || kill -KILL "$munged" 2>/dev/null || true
    fi
    [[ $mdir == /run/ddiloco-munge.* || $mdir == /tmp/ddiloco-munge.* ]] && rm -rf "$mdir"
    rm -f "$DIR/munge_dir"
  fi
  say "stopped the cluster in $DIR"
}

if [[ $cmd == stop ]]; then stop_cluster; exit 0; fi

# ---- start ----------------------------------------------------------------------------------
[[ $(id -u) == 0 ]] || skip "needs root (slurmd and munged run as root and as munge); skipped"
need=(slurmctld slurmd munged sbatch scontrol squeue)
missing=0
for c in "${need[@]}"; do command -v "$c" >/dev/null || missing=1; done
if [[ $missing == 1 ]]; then
  say "installing slurm-wlm munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends slurm-wlm munge >"$DIR/apt.log" 2>&1; then
    apt-get update -qq >>"$DIR/apt.log" 2>&1 || true
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >>"$DIR/apt.log" 2>&1 ||
      skip "apt-get install slurm-wlm munge failed (see $DIR/apt.log); skipped"
  fi
  for c in "${need[@]}"; do
    command -v "$c" >/dev/null || skip "$c missing after installing slurm-wlm; skipped"
  done
fi
id munge >/dev/null 2>&1 || skip "no 'munge' user (package munge half-installed?); skipped"
# slurmd (22.05) initialises its cgroup plugin whatever ProctrackType says, and cannot start
# where no cgroup filesystem is mounted (a chroot or a container without /sys/fs/cgroup).
awk '$2 == "/sys/fs/cgroup" || index($2, "/sys/fs/cgroup/") == 1 { found = 1 } END { exit !found }' \
  /proc/mounts || skip "no cgroup filesystem mounted on /sys/fs/cgroup: slurmd cannot start here; skipped"

# What an earlier start in DIR left running goes first.
if [[ -f $CONF ]]; then stop_cluster; fi
rm -rf "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"

# munged: own key, socket, pid and log in a directory munge owns (DIR itself may sit below
# a directory the munge user cannot enter, such as mktemp's 0700 ones).
mdir=$(mktemp -d /run/ddiloco-munge.XXXXXX 2>/dev/null || mktemp -d /tmp/ddiloco-munge.XXXXXX)
echo "$mdir" > "$DIR/munge_dir"
chmod 0755 "$mdir"
dd if=/dev/urandom of="$mdir/munge.key" bs=1024 count=1 status=none
chmod 0600 "$mdir/munge.key"
chown -R munge:munge "$mdir"
MSOCK=$mdir/munge.socket
runuser -u munge -- /usr/sbin/munged --socket="$MSOCK" --key-file="$mdir/munge.key" \
  --pid-file="$mdir/munged.pid" --log-file="$mdir/munged.log" --seed-file="$mdir/munged.seed" ||
  { cat "$mdir/munged.log" >&2 2>/dev/null; stop_cluster; exit 1; }
munge -n -S "$MSOCK" | unmunge -S "$MSOCK" >/dev/null ||
  { say "munge does not answer on $MSOCK"; stop_cluster; exit 1; }

# Two free TCP ports (a system Slurm may hold 6817/6818).
read -r ctld_port slurmd_port < <(
  if [[ -x /usr/bin/python3 ]]; then
    /usr/bin/python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))'
  else
    echo 6817 6818
  fi)

# The node as slurmd sees it (CPUs, sockets, cores, threads, memory), under the name localhost.
node=$(slurmd -C | head -1 | sed -E 's/^NodeName=[^ ]+ //')

cat > "$CONF" <<EOF
# Written by scripts/slurm_local.sh: a one-node test cluster.
ClusterName=ddiloco
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (default 120 s) is also how long a requeued job waits before it may start again.
AuthInfo=socket=$MSOCK,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# Requeue: jobs may be requeued (scontrol requeue, preemption, node failure); a job that is
# stopped gets SIGTERM and KillWait seconds later SIGKILL.
JobRequeue=1
KillWait=30
# Schedule every 2 s (default 60 s): a requeued job starts again within seconds.
SchedulerParameters=sched_interval=2
MinJobAge=600
NodeName=localhost $node State=UNKNOWN
# Jobs that ask for it (sbatch --oversubscribe) may share cores: the isolated deployment's
# syncer and unit jobs on this one 2-core node.
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

# (What is shown of the logs may be missing: nothing may stop the cluster from being stopped.)
failed() { say "$1 failed:"; tail -n 20 "$DIR/log/$1.log" >&2 || true; stop_cluster; exit 1; }
slurmctld -i -f "$CONF" || failed slurmctld
slurmd -N localhost -f "$CONF" || failed slurmd

deadline=$((SECONDS + 30))
until [[ $(sinfo -h -n localhost -o %T 2>/dev/null) == idle ]]; do
  if ((SECONDS >= deadline)); then
    say "the node did not become idle within 30 s: $(sinfo -h -N -o '%N %T %E' 2>&1)"
    tail -n 5 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
    stop_cluster
    exit 1
  fi
  sleep 0.3
done
say "cluster up in $DIR ($(sinfo -h -o '%P %D %c CPUs %T'))"
echo "export SLURM_CONF=$CONF"
