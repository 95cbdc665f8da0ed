#!/usr/bin/env bash
# N local processes on one machine: the CPU rehearsal of a pod.
#
#   launch/local.sh -n 2 -d 4 -- vt train --config configs/sft_stage1.py:smoke --workdir /tmp/run \
#       --config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2
#
# Each process gets D simulated CPU devices (--xla_force_host_platform_device_count) and the variables that
# vt.distributed.initialize() reads: JAX_COORDINATOR_ADDRESS (127.0.0.1:PORT, process 0 serves it),
# JAX_NUM_PROCESSES, JAX_PROCESS_ID. Together they form one N*D-device mesh, exactly as the hosts of a pod do.
# Process 0 writes to this terminal; process i>0 to LOG_DIR/process_<i>.log (printed when it fails).
# If any process fails, the others are stopped and the exit status is the first failure's.
#
# Options:
#   -n, --num-processes N       processes (default 2)
#   -d, --devices-per-process D simulated CPU devices per process (default 4)
#   -p, --port PORT             coordinator port (default: a free one)
#   --log-dir DIR               logs of processes 1..N-1 (default: a new temporary directory)
#   --timeout SECONDS           stop every process after this long (default 0: no limit)
#   --dry-run                   print each process's environment and command, run nothing
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "launch/local.sh: error: $*" >&2; exit 2; }

num=2
devices=4
port=""
log_dir=""
timeout_s=0
dry_run=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--num-processes) num="${2:?}"; shift 2 ;;
    -d|--devices-per-process) devices="${2:?}"; shift 2 ;;
    -p|--port) port="${2:?}"; shift 2 ;;
    --log-dir) log_dir="${2:?}"; shift 2 ;;
    --timeout) timeout_s="${2:?}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1 (the command goes after --)" ;;
  esac
done
[[ $# -gt 0 ]] || die "no command given (usage: launch/local.sh [options] -- COMMAND ...)"
[[ "$num" =~ ^[1-9][0-9]*$ ]] || die "--num-processes must be a positive integer, got '$num'"
[[ "$devices" =~ ^[1-9][0-9]*$ ]] || die "--devices-per-process must be a positive integer, got '$devices'"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout must be a whole number of seconds, got '$timeout_s'"

if [[ -z "$port" ]]; then
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
[[ "$port" =~ ^[0-9]+$ ]] || die "--port must be a number, got '$port'"

# A device-count flag the caller already set would fight ours: drop it, keep every other XLA flag.
xla_flags=""
for flag in ${XLA_FLAGS:-}; do
  [[ "$flag" == --xla_force_host_platform_device_count=* ]] || xla_flags+="$flag "
done
xla_flags+="--xla_force_host_platform_device_count=$devices"

process_env() {  # the environment of process $1, one NAME=value per line
  printf '%s\n' "JAX_PLATFORMS=cpu" "XLA_FLAGS=$xla_flags" "JAX_COORDINATOR_ADDRESS=127.0.0.1:$port" \
    "JAX_NUM_PROCESSES=$num" "JAX_PROCESS_ID=$1"
}

if [[ "$dry_run" == 1 ]]; then
  echo "# launch/local.sh: $num processes x $devices CPU devices = $((num * devices)) devices"
  for ((i = 0; i < num; i++)); do
    mapfile -t vars < <(process_env "$i")
    printf 'env'
    printf ' %q' "${vars[@]}" "$@"
    printf '\n'
  done
  exit 0
fi

if [[ -z "$log_dir" ]]; then
  log_dir="$(mktemp -d "${TMPDIR:-/tmp}/vt-local.XXXXXX")"
fi
mkdir -p "$log_dir"

# Each process leads its own process group (setsid), so stopping it reaches its children too.
group=()
if command -v setsid >/dev/null; then group=(setsid); fi
pids=()
stop_all() {  # SIGTERM (a learner checkpoints on it), SIGKILL whatever is still there 10 s later
  local pid alive
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 20); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ "$alive" == 0 ]] && return 0
    sleep 0.5
  done
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; done
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM

runner=()
if [[ "$timeout_s" -gt 0 ]]; then runner=(timeout -k 10 "$timeout_s"); fi

for ((i = 0; i < num; i++)); do
  mapfile -t vars < <(process_env "$i")
  if [[ "$i" == 0 ]]; then
    "${group[@]}" env "${vars[@]}" "${runner[@]}" "$@" &
  else
    "${group[@]}" env "${vars[@]}" "${runner[@]}" "$@" >"$log_dir/process_$i.log" 2>&1 &
  fi
  pids+=("$!")
done
[[ "$num" -gt 1 ]] && echo "launch/local.sh: $num processes on 127.0.0.1:$port; logs of processes 1..$((num - 1)) in $log_dir" >&2

# Collect each process as it ends; a failure stops the rest (they would wait forever at the next collective).
# Polled rather than `wait -n PID...`: bash drops a job that has already ended from its job table (then
# `wait -n` says "no such job" and misses it), while `wait PID` still returns that job's saved status.
status=0
remaining=("${pids[@]}")
while [[ ${#remaining[@]} -gt 0 ]]; do
  still=()
  for pid in "${remaining[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
    set +e
    wait "$pid"
    rc=$?
    set -e
    if [[ "$rc" != 0 && "$status" == 0 ]]; then
      status=$rc
      for ((i = 0; i < num; i++)); do
        if [[ "${pids[$i]}" == "$pid" ]]; then
          echo "launch/local.sh: process $i exited with status $rc" >&2
          if [[ "$i" != 0 ]]; then tail -n 40 "$log_dir/process_$i.log" >&2 || true; fi
        fi
      done
      stop_all
    fi
  done
  remaining=("${still[@]+"${still[@]}"}")
  if [[ ${#remaining[@]} -gt 0 ]]; then sleep 0.2; fi
done
exit "$status"
