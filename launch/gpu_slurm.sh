#!/usr/bin/env bash
# Submit a vt command to SLURM on NVIDIA GPU hosts (through launch/gpu_slurm.sbatch).
#
#   launch/gpu_slurm.sh --nodes 2 --gpus-per-node 8 --time 24:00:00 -- \
#       vt train --config configs/sft_stage1.py --workdir /shared/runs/sft_stage1
#
# Options:
#   --nodes N             hosts (default 1)
#   --gpus-per-node G     GPUs per host (default 8)
#   --per gpu|host        one process per GPU (default) or per host
#   --time HH:MM:SS       time limit (the job checkpoints and requeues itself 5 minutes before it)
#   --partition P, --account A, --job-name NAME, --qos Q    passed to sbatch
#   --venv DIR            virtualenv with vt[cuda] on shared storage (default: ./.venv)
#   --cache DIR           persistent compilation cache on shared storage (default: ./.cache/jax)
#   --install             create the virtualenv and install vt[cuda] into it first (on this node)
#   --python PY           the interpreter that makes that virtualenv, Python >= 3.12 (default: python3.12)
#   --dry-run             print the sbatch command and what each task would run; submit nothing
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "launch/gpu_slurm.sh: error: $*" >&2; exit 2; }

repo="$(cd "$(dirname "$0")/.." && pwd)"
nodes=1 gpus=8 per=gpu time_limit="" venv="$PWD/.venv" cache="$PWD/.cache/jax" install=0 dry_run=0 python=python3.12
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="${2:?}"; shift 2 ;;
    --gpus-per-node) gpus="${2:?}"; shift 2 ;;
    --per) per="${2:?}"; shift 2 ;;
    --time) time_limit="${2:?}"; shift 2 ;;
    --partition|--account|--job-name|--qos) extra+=("$1=${2:?}"); shift 2 ;;
    --venv) venv="${2:?}"; shift 2 ;;
    --cache) cache="${2:?}"; shift 2 ;;
    --install) install=1; shift ;;
    --python) python="${2:?}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1 (the command goes after --)" ;;
  esac
done
[[ $# -gt 0 ]] || die "no command given (usage: launch/gpu_slurm.sh [options] -- COMMAND ...)"
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '$nodes'"
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node must be a positive integer, got '$gpus'"
case "$per" in
  gpu) tasks="$gpus" ;;
  host) tasks=1 ;;
  *) die "--per must be gpu or host, got '$per'" ;;
esac

if [[ "$install" == 1 ]]; then
  if [[ "$dry_run" == 1 ]]; then
    echo "$python -m venv $venv && $venv/bin/pip install -e '${repo}[cuda]'"
  else
    # jax >= 0.11 ships wheels for Python >= 3.12 only.
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
      || die "--install needs Python >= 3.12 (jax >= 0.11); '$python' is missing or older (pass --python PATH)"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -e "${repo}[cuda]"
  fi
fi

submit=(sbatch --nodes="$nodes" --gpus-per-node="$gpus" --ntasks-per-node="$tasks" --chdir="$PWD"
        --export="ALL,VT_VENV=$venv,VT_PROCESS_PER=$per,JAX_COMPILATION_CACHE_DIR=$cache")
[[ -n "$time_limit" ]] && submit+=(--time="$time_limit")
submit+=("${extra[@]+"${extra[@]}"}" "$repo/launch/gpu_slurm.sbatch" "$@")

if [[ "$dry_run" == 1 ]]; then
  printf '%q ' "${submit[@]}"; printf '\n'
  echo "# each task of the job then runs:"
  env SLURM_JOB_NUM_NODES="$nodes" SLURM_NTASKS_PER_NODE="$tasks" SLURM_GPUS_PER_NODE="$gpus" \
    SLURM_SUBMIT_DIR="$PWD" VT_VENV="$venv" VT_PROCESS_PER="$per" JAX_COMPILATION_CACHE_DIR="$cache" VT_DRY_RUN=1 \
    bash "$repo/launch/gpu_slurm.sbatch" "$@"
  exit 0
fi
"${submit[@]}"
