#!/usr/bin/env bash
# Run a vt command on every worker of a Cloud TPU VM slice (multi-host, no Pathways).
#
#   launch/tpu_pod.sh --name vt-v5p --zone us-east5-a --type v5p-32 -- \
#       vt train --config configs/sft_stage1.py --workdir /mnt/shared/runs/sft_stage1
#
# Steps (each one can be run alone with --only STEP):
#   plan    before create (and run): a command with --config is compiled here for --type with `vt plan` (libtpu,
#           no TPU needed; the --config.key=value overrides included); a program that does not fit in the
#           chips' HBM, or does not compile, stops the launch before the slice is created (--no-plan skips it)
#   create  create the slice with gcloud unless it already exists (then it is reused)
#   sync    copy this checkout (git-tracked and untracked, non-ignored files) to ~/vt on every worker,
#           create ~/vt/.venv and install vt[tpu] there (jax needs Python >= 3.12: the worker's python3.12, or one
#           that uv fetches where the image has an older one, as tpu-ubuntu2204-base does)
#   run     run the command on all workers at once (gcloud ... ssh --worker=all), streaming every worker's
#           output here; vt.distributed.initialize() on each worker finds the others through the TPU metadata
#           server, so the command is the same everywhere
#   delete  tear the slice down (only with --delete or --only delete)
# The workdir (checkpoints are written by all workers together) must be a filesystem every worker sees:
# a Filestore or gcsfuse mount at the same path. The compilation cache may be a gs:// URL.
#
# Options:
#   --name NAME             TPU VM name (required)
#   --zone ZONE             zone (required)
#   --type TYPE             accelerator type, e.g. v5p-32, v6e-16 (required to create)
#   --version VERSION       TPU software version (default: tpu-ubuntu2204-base)
#   --project PROJECT       gcloud project (default: gcloud's configured one)
#   --spot                  create a Spot slice (preemptible: `vt train` resumes from its workdir on rerun)
#   --cache DIR             JAX_COMPILATION_CACHE_DIR on the workers (e.g. gs://BUCKET/jax-cache)
#   --only STEP             run one step: create | sync | run | delete
#   --delete                delete the slice after the run
#   --no-plan               do not run `vt plan` first
#   --dry-run               print every gcloud command instead of running it
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "launch/tpu_pod.sh: error: $*" >&2; exit 2; }

name="" zone="" type="" version="tpu-ubuntu2204-base" project="" spot=0 cache="" only="" delete=0 dry_run=0 plan=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) name="${2:?}"; shift 2 ;;
    --zone) zone="${2:?}"; shift 2 ;;
    --type) type="${2:?}"; shift 2 ;;
    --version) version="${2:?}"; shift 2 ;;
    --project) project="${2:?}"; shift 2 ;;
    --spot) spot=1; shift ;;
    --cache) cache="${2:?}"; shift 2 ;;
    --only) only="${2:?}"; shift 2 ;;
    --delete) delete=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --no-plan) plan=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1 (the command goes after --)" ;;
  esac
done
[[ -n "$name" ]] || die "--name is required"
[[ -n "$zone" ]] || die "--zone is required"
case "$only" in ""|create|sync|run|delete) ;; *) die "--only must be create, sync, run or delete, got '$only'" ;; esac
want() { [[ -z "$only" || "$only" == "$1" ]]; }
if want run && [[ $# -eq 0 ]]; then die "no command given (usage: launch/tpu_pod.sh [options] -- COMMAND ...)"; fi

repo="$(cd "$(dirname "$0")/.." && pwd)"
tpu=(gcloud compute tpus tpu-vm)
where=(--zone "$zone")
[[ -n "$project" ]] && where+=(--project "$project")

run() {  # print in dry-run mode, execute otherwise
  if [[ "$dry_run" == 1 ]]; then printf '%q ' "$@"; printf '\n'; else "$@"; fi
}

# The config (and its overrides) of the command, for `vt plan`.
config="" overrides=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --config) config="${args[i + 1]:-}" ;;
    --config=*) config="${args[i]#--config=}" ;;
    --config.*) overrides+=("${args[i]}") ;;
  esac
done
if [[ "$plan" == 1 && -n "$type" && -n "$config" ]] && { want create || want run; }; then
  py="$repo/.venv/bin/python"
  [[ -x "$py" ]] || py=python3
  plan_cmd=("$py" -m vt plan --config "$config" --topology "$type" "${overrides[@]}")
  if [[ "$dry_run" == 1 ]]; then
    run "${plan_cmd[@]}"
  else
    # vt plan's exit 1 means "does not fit": a Python that cannot import vt (no venv here) also exits 1
    (cd "$repo" && "$py" -c 'import vt.plan' 2>/dev/null) \
      || die "$py cannot import vt, so vt plan cannot check $config: make install (the repo's .venv), or --no-plan"
    (cd "$repo" && "${plan_cmd[@]}") || planned=$?
    case "${planned:-0}" in
      0) ;;
      1) echo "launch/tpu_pod.sh: $config does not fit $type (vt plan above): change the config, or --no-plan to launch anyway" >&2
         exit 1 ;;
      *) die "vt plan failed (exit ${planned}); --no-plan to launch without it" ;;
    esac
  fi
fi

if want create; then
  if [[ "$dry_run" == 0 ]] && "${tpu[@]}" describe "$name" "${where[@]}" >/dev/null 2>&1; then
    echo "launch/tpu_pod.sh: reusing existing TPU VM $name" >&2
  else
    [[ -n "$type" ]] || die "--type is required to create $name"
    create=("${tpu[@]}" create "$name" "${where[@]}" --accelerator-type "$type" --version "$version")
    [[ "$spot" == 1 ]] && create+=(--spot)
    [[ "$dry_run" == 1 ]] && echo "# create $name unless \`${tpu[*]} describe $name\` finds it"
    run "${create[@]}"
  fi
fi

if want sync; then
  tarball="${TMPDIR:-/tmp}/vt-src-$name.tar.gz"
  if [[ "$dry_run" == 1 ]]; then
    echo "# pack: git -C $repo ls-files -z --cached --others --exclude-standard | tar -czf $tarball --null -T -"
  else
    git -C "$repo" ls-files -z --cached --others --exclude-standard | tar -C "$repo" -czf "$tarball" --null -T -
  fi
  run "${tpu[@]}" scp "$tarball" "$name:vt-src.tar.gz" "${where[@]}" --worker=all
  install='rm -rf ~/vt && mkdir -p ~/vt && tar -C ~/vt -xzf ~/vt-src.tar.gz && cd ~/vt && { command -v python3.12 >/dev/null && python3.12 -m venv .venv || { python3 -m pip install -q --user uv && ~/.local/bin/uv venv -q --seed --python 3.12 .venv; }; } && .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e ".[tpu]"'
  run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command "$install"
fi

if want run; then
  envs="VT_DISTRIBUTED=auto"
  [[ -n "$cache" ]] && envs+=" JAX_COMPILATION_CACHE_DIR=$(printf '%q' "$cache")"
  remote="cd ~/vt && . .venv/bin/activate && env $envs $(printf '%q ' "$@")"
  run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command "$remote" || status=$?
fi

if [[ "$delete" == 1 || "$only" == delete ]]; then  # also after a failed run: a forgotten slice costs money
  run "${tpu[@]}" delete "$name" "${where[@]}" --quiet
fi
exit "${status:-0}"
