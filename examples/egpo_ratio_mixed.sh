#!/usr/bin/env bash
# EGPO with entropy-ratio calibration on a mixed math + code set, scored by the hybrid reward
# (configs/egpo_ratio_mixed.yaml: math-verify for math rows, the local code sandbox for code
# rows, routed by each row's `ability`).
#
# usage: bash examples/egpo_ratio_mixed.sh [--dry-run] [hydra overrides ...]
#        bash examples/egpo_ratio_mixed.sh --smoke [--out DIR] [--ranks N] [hydra overrides ...]
#
# --smoke runs the same verl trainer on the local CPU with a tiny Qwen2 and the generated
# mixed set of `entropyrl prepare mixed-debug`, 2 steps; it writes DIR/metrics.jsonl and
# DIR/config.yaml, then checks them. DIR defaults to runs/egpo_ratio_mixed_smoke.
#
# environment:
#   MODEL_PATH          policy (default Qwen/Qwen3-4B: a local folder or a cached hub id)
#   DATA_DIR            verl parquet with extra_info.ability per row (default data/mixed_debug,
#                       written by `entropyrl prepare mixed-debug --out data/mixed_debug`)
#   N_GPUS              GPUs per node (default: all that nvidia-smi lists)
#   LORA_RANK           LoRA of this rank instead of full fine-tuning (default 0: off);
#                       LORA_ALPHA (default 2 x rank), LORA_LR (default 1e-5); docs/lora.md
#   PYTHON, DRY_RUN=1   interpreter; print the command instead of running it
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
er_parse_args "$@"
if er_smoke; then
  er_smoke_plan mixed runs/egpo_ratio_mixed_smoke
fi

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen3-4B}"
DATA_DIR="${DATA_DIR:-$ER_ROOT/data/mixed_debug}"

er_smoke || er_require_gpu
overrides=(
  "data.train_files=$DATA_DIR/train.parquet"
  "data.val_files=$DATA_DIR/val.parquet"
  "actor_rollout_ref.model.path=$MODEL_PATH"
)
mapfile -t -O "${#overrides[@]}" overrides < <(er_gpus_override)
er_lora_overrides text
overrides+=("${ER_LORA_OVERRIDES[@]}" "${ER_ARGS[@]}")
er_preflight egpo_ratio_mixed "${overrides[@]}"
if er_smoke; then
  er_smoke_build
fi
er_require_file "$DATA_DIR/train.parquet" "run: entropyrl prepare mixed-debug --out $DATA_DIR"
er_require_file "$DATA_DIR/val.parquet" "written by entropyrl prepare mixed-debug"
er_require_model "$MODEL_PATH"
er_dry_run || er_require_plugin
er_train_cmd egpo_ratio_mixed "${overrides[@]}"
er_train
if er_smoke; then
  er_smoke_check mixed
fi
