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
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
MODEL_PATH="${MODEL_PATH:-Qwen/Qwen3-4B}"
DATA_DIR="${DATA_DIR:-$root/data/mixed_debug}"

# `entropyrl launch` checks what the run needs (above), then runs this command with
# LORA_RANK's overrides and yours last.
exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \
  "$PYTHON" -m verl.trainer.main_ppo --config-path "$root/configs" --config-name egpo_ratio_mixed \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/val.parquet" \
  actor_rollout_ref.model.path="$MODEL_PATH"
