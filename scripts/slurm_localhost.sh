#!/usr/bin/env bash
# A one-node Slurm cluster on localhost, in its own directory, for testing the `slurm` profile
# against a real scheduler (tests/test_slurm_real.py, `make test-slurm`).
#
#   scripts/slurm_localhost.sh start DIR   start munged, slurmctld and slurmd; wait until the node is idle
#   scripts/slurm_localhost.sh env DIR     print the exports that point Slurm's commands at it
#   scripts/slurm_localhost.sh stop DIR    cancel its jobs, stop the daemons, delete DIR
#
# Everything (slurm.conf, munge key and socket, state, spool, logs, pid files) lives under DIR,
# so nothing in /etc or /run is touched and several clusters can run side by side on their own
# ports. No systemd and no cgroups: processes are tracked through /proc (proctrack/linuxproc).
# Needs root (the daemons run as root) and the Debian packages slurm-wlm and munge:
#   apt-get install -y slurm-wlm munge
set -euo pipefail

die() { echo "slurm_localhost: $*" >&2; exit 1; }

# A TCP port nobody listens on now (the kernel picks it), so parallel clusters do not collide.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The node's real CPUs and memory, as slurmd itself measures them (a bigger claim drains the node).
node_hardware() {
  slurmd -C | head -n 1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=' | tr '\n' ' '
}

write_conf() {
  local dir=$1 ctld_port slurmd_port
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  cat > "$dir/etc/slurm.conf" <<EOF
ClusterName=namsa-localhost
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd.%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# A test cluster: react within seconds, not minutes.
SchedulerParameters=sched_interval=2
MessageTimeout=20
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=localhost NodeAddr=127.0.0.1 $(node_hardware) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

print_env() {
  echo "export SLURM_CONF=$1/etc/slurm.conf"
}

start_munge() {
  local dir=$1
  # munged wants its key private to its user and refuses a world-writable socket directory.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed"
}

# Poll `cmd` every second until it succeeds or `timeout` seconds passed.
wait_for() {
  local timeout=$1 what=$2; shift 2
  for _ in $(seq "$timeout"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  die "$what did not happen within ${timeout} s; logs in ${DIR}/log"
}

node_idle() {
  [[ "$(sinfo --noheader --nodes=localhost --format=%t 2>/dev/null)" == idle* ]]
}

start() {
  local dir=$1
  for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || die "$tool not found; install it: apt-get install -y slurm-wlm munge"
  done
  [[ -e "$dir/etc/slurm.conf" ]] && die "$dir already holds a cluster; stop it first"
  mkdir -p "$dir"/{etc,munge,state,spool,log,run}
  chmod 0755 "$dir/munge"   # munged wants the socket directory searchable by all
  write_conf "$dir"
  export SLURM_CONF=$dir/etc/slurm.conf
  start_munge "$dir"
  wait_for 20 "munged start" test -S "$dir/munge/munge.socket"
  slurmctld -c            # -c: no state from an earlier cluster; daemonises, writes its pid file
  wait_for 30 "slurmctld answering" scontrol ping
  slurmd -N localhost     # the node's name is localhost whatever the host is called
  wait_for 60 "node localhost idle" node_idle
  print_env "$dir"
}

# Stop the daemon whose pid file is given, waiting up to 10 s, then SIGKILL it.
stop_pid() {
  local pidfile=$1 pid
  [[ -s "$pidfile" ]] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}

stop() {
  local dir=$1
  [[ -e "$dir/etc/slurm.conf" ]] || { rm -rf "$dir"; return 0; }
  export SLURM_CONF=$dir/etc/slurm.conf
  # Jobs first, so slurmd kills their processes (the Parsl workers) before it goes.
  if scontrol ping >/dev/null 2>&1; then
    scancel --full --partition=debug >/dev/null 2>&1 || true
    for _ in $(seq 20); do [[ -z "$(squeue --noheader 2>/dev/null)" ]] && break; sleep 1; done
  fi
  stop_pid "$dir/run/slurmd.pid"
  stop_pid "$dir/run/slurmctld.pid"
  stop_pid "$dir/run/munged.pid"
  rm -rf "$dir"
}

main() {
  [[ $# -eq 2 ]] || die "usage: $0 start|env|stop DIR"
  DIR=$(realpath -m "$2")
  case $1 in
    start) start "$DIR" ;;
    env) print_env "$DIR" ;;
    stop) stop "$DIR" ;;
    *) die "unknown subcommand $1; use start, env or stop" ;;
  esac
}

main "$@"
