#!/usr/bin/env bash
# Hallucination-aware captioning on MSCOCO with verl (configs/chair_mscoco.yaml): GRPO with a
# per-sample eps_high from each caption's CHAIR_i (0.3 clean / 0.5 hallucinating).
#
# usage: bash examples/chair_mscoco.sh [--dry-run] [hydra overrides ...]
#        bash examples/chair_mscoco.sh --smoke [--out DIR] [--ranks N] [hydra overrides ...]
#   e.g. bash examples/chair_mscoco.sh algorithm.adv_estimator=egpo_ratio trainer.experiment_name=chair_mscoco_egpo_ratio
#
# --smoke runs the recipe itself on the local CPU: a tiny Qwen2.5-VL warmed up on a
# generated COCO-style world, the real CHAIR service, the recipe's estimator, per-sample
# clip-high, remove-padding, validation and a checkpoint, 2 steps; verl's output goes to
# DIR/run.log, the terminal gets a line per step; DIR/metrics.jsonl (one row per step) and
# DIR/config.yaml are then checked. The same command resumes a killed run from its checkpoint.
# --dry-run prints the commands and how a step is split over the ranks.
# DIR defaults to runs/chair_mscoco_smoke; the model and data are reused from DIR/assets.
#
# environment:
#   MODEL_PATH          policy (default Qwen/Qwen2.5-VL-3B-Instruct: a local folder or a cached hub id)
#   DATA_DIR            output of `entropyrl prepare coco` (default data/coco): train/val.parquet,
#                       cider_df.json.gz, chair_ground_truth.json
#   CHAIR_COCO          COCO 2014 annotation folder for the CHAIR service (instead of
#                       $DATA_DIR/chair_ground_truth.json)
#   CHAIR_TIMEOUT       seconds to wait for the CHAIR service to become healthy (default 300)
#   CHAIR_HOST          address the CHAIR service listens on (default 127.0.0.1 on one node,
#                       this node's address on several: the reward workers run on every node)
#   CHAIR_SERVER_TOKEN  the service's bearer token, read by the service and by the reward's
#                       client; required when CHAIR_HOST is not a loopback address (export it on
#                       every node before `ray start`: the reward workers read it there)
#   CHAIR_OPTIONAL=1    train on if the CHAIR service does not come up (CIDEr-D reward only,
#                       neutral clip bounds, counted in chair/fallback_samples); default: stop
#   N_GPUS              GPUs per node (default: those nvidia-smi lists, cut to CUDA_VISIBLE_DEVICES)
#   CHECKPOINTS_SHARED=1  on several nodes: trainer.default_local_dir is shared though its file
#                       system looks local (the check wants NFS, Lustre, ... or this)
#   LORA_RANK           LoRA of this rank instead of full fine-tuning (default 0: off); the vision
#                       tower keeps its weights; LORA_ALPHA (default 2 x rank), LORA_LR (default
#                       1e-5); works with --smoke too (docs/lora.md)
#   EXPERIMENT          entropyrl (the recipe, default), baseline (GRPO, no schedule), penalty
#                       (GRPO, reward CIDEr-D - 1.0 x hallucinated mentions) or reversed (clean
#                       0.5 / hallucinating 0.3): each under its own experiment name, compared
#                       by examples/eval_chair_mscoco.sh
#   SMOKE_MODEL         --smoke's tiny policy: qwen2_5_vl (the recipe's, default) or qwen3_vl
#   PYTHON, DRY_RUN=1   interpreter; print the commands instead of running them
#
# Before anything starts, the recipe is composed with every override and checked (algorithm
# keys, the batch split verl asserts on, and on GPU runs flash-attn, vLLM, the GPUs, a shared
# checkpoint folder on several nodes); each problem is one line and the exit status 2. Then it
# starts the CHAIR service on a free port, waits for /health, trains, and stops the service on
# any exit. The service runs supervised: if it dies it is started again on the same port (the
# trainer keeps its URL), with one line on stderr each time; meanwhile the reward's client
# takes its fallback. Without a GPU, data or model it stops at once and says what is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
er_parse_args "$@"
if er_smoke; then
  er_smoke_plan caption runs/chair_mscoco_smoke
fi

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}"
DATA_DIR="${DATA_DIR:-$ER_ROOT/data/coco}"
CHAIR_TIMEOUT="${CHAIR_TIMEOUT:-300}"

# 1. prerequisites, cheapest first; the config before anything starts
er_smoke || er_require_gpu
overrides=(
  "data.train_files=$DATA_DIR/train.parquet"
  "data.val_files=$DATA_DIR/val.parquet"
  "actor_rollout_ref.model.path=$MODEL_PATH"
  "reward.custom_reward_function.reward_kwargs.cider_df=$DATA_DIR/cider_df.json.gz"
)
mapfile -t -O "${#overrides[@]}" overrides < <(er_gpus_override)
er_lora_overrides vision
overrides+=("${ER_LORA_OVERRIDES[@]}")
er_caption_experiment
overrides+=("${ER_EXPERIMENT_OVERRIDES[@]}")
er_preflight chair_mscoco "${overrides[@]}" "${ER_ARGS[@]}"
if er_smoke; then
  er_smoke_build
fi
er_require_file "$DATA_DIR/train.parquet" "run: entropyrl prepare coco --annotations ... --images ... --out $DATA_DIR"
er_require_file "$DATA_DIR/val.parquet" "written by entropyrl prepare coco"
er_require_file "$DATA_DIR/cider_df.json.gz" "CIDEr-D document frequencies, written by entropyrl prepare coco"
if [ -n "${CHAIR_COCO:-}" ]; then
  [ -d "$CHAIR_COCO" ] || er_fail "CHAIR_COCO=$CHAIR_COCO is not a folder"
  chair_source=(--coco "$CHAIR_COCO")
else
  er_require_file "$DATA_DIR/chair_ground_truth.json" "CHAIR ground truth, written by entropyrl prepare coco (or set CHAIR_COCO)"
  chair_source=(--ground-truth "$DATA_DIR/chair_ground_truth.json")
fi
er_require_model "$MODEL_PATH"
er_dry_run || er_require_plugin

# 2. the CHAIR service on a free port, supervised (restarted on that port if it dies), stopped
#    on any exit. chair_pid is the supervisor: SIGTERM to it stops the service, then itself.
#    On one node it listens on the loopback; on several, the reward workers of every node must
#    reach it: it listens on this node's address and wants the token from every client.
chair_host="${CHAIR_HOST:-}"
if [ -z "$chair_host" ]; then
  chair_host=127.0.0.1
  if [ "${ER_NNODES:-1}" -gt 1 ]; then
    chair_host="$(er_node_address)"
  fi
fi
if ! er_loopback "$chair_host" && [ -z "${CHAIR_SERVER_TOKEN:-}" ]; then
  er_fail "the CHAIR service would listen on $chair_host, where other machines reach it (${ER_NNODES:-1} node(s)), so it needs a token: export CHAIR_SERVER_TOKEN=<a secret> here and on every node before 'ray start' (the reward workers read it there)"
fi
workdir="$(mktemp -d "${TMPDIR:-/tmp}/chair_mscoco.XXXXXX")"
# The service's log stays in the run's folder (the checkpoint folder; a smoke's DIR), appended
# to across resumes: what it said survives a crash.
if er_smoke; then
  chair_log="$ER_SMOKE_OUT/chair_server.log"
else
  chair_log="${ER_CHECKPOINT_DIR:-.}/chair_server.log"
fi
chair_cmd=("$ER_PYTHON" -m chair_server "${chair_source[@]}" --host "$chair_host" --port 0 --ready-file "$workdir/url" --supervise)
chair_pid=""
cleanup() {
  if [ -n "$chair_pid" ] && kill -0 "$chair_pid" 2>/dev/null; then
    kill "$chair_pid" 2>/dev/null || true
    wait "$chair_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if er_dry_run; then
  echo "$(er_print_cmd "${chair_cmd[@]}") &"
  chair_url="http://$chair_host:PORT"  # the real port comes from the ready file
else
  # the service's own output goes to its log; the supervisor's restart lines to stderr
  mkdir -p "$(dirname "$chair_log")"
  echo "== $(date -u '+%Y-%m-%dT%H:%M:%SZ') $(er_print_cmd "${chair_cmd[@]}")" >>"$chair_log"
  "${chair_cmd[@]}" >>"$chair_log" &
  chair_pid=$!
  deadline=$((SECONDS + CHAIR_TIMEOUT))
  chair_up=0
  while :; do
    if [ -s "$workdir/url" ] && "$ER_PYTHON" - "$(cat "$workdir/url")" >/dev/null 2>&1 <<'EOF'; then
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as response:
    sys.exit(0 if response.status == 200 else 1)
EOF
      chair_up=1
      break
    fi
    if ! kill -0 "$chair_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      break
    fi
    sleep 1
  done
  if [ "$chair_up" = 1 ]; then
    chair_url="$(cat "$workdir/url")"
    echo "CHAIR service: $chair_url (supervisor pid $chair_pid: restarted on this port if it dies; log: $chair_log)"
  elif [ "${CHAIR_OPTIONAL:-0}" = 1 ]; then
    echo "warning: the CHAIR service did not come up (last lines of its log below); training" \
      "continues without CHAIR scores (CHAIR_OPTIONAL=1): CIDEr-D reward only, neutral clip" \
      "bounds, counted in chair/fallback_samples" >&2
    tail -n 5 "$chair_log" >&2 || true
    # An address nothing listens on: the reward's client takes its documented fallback at
    # every batch, which the metrics count (the same path as a service that dies mid-run).
    chair_url="$(cat "$workdir/url" 2>/dev/null || true)"
    chair_url="${chair_url:-http://127.0.0.1:9}"
  else
    tail -n 5 "$chair_log" >&2 || true
    er_fail "the CHAIR service did not come up within ${CHAIR_TIMEOUT}s (the last lines of its log are above); CHAIR_OPTIONAL=1 trains without it (CIDEr-D reward only, neutral clip bounds, counted in chair/fallback_samples)"
  fi
fi

# 3. training: verl's own entry point, our config, the caller's overrides last
er_train_cmd chair_mscoco "${overrides[@]}" \
  "reward.custom_reward_function.reward_kwargs.chair_url=$chair_url" \
  "${ER_ARGS[@]}"
er_train
if er_smoke; then
  er_smoke_check caption
fi
