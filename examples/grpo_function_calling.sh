#!/usr/bin/env bash
# GRPO baseline on function calling, identical to examples/egpo_function_calling.sh except
# the advantage estimator (configs/grpo_function_calling.yaml).
#
# usage: bash examples/grpo_function_calling.sh [--dry-run] [hydra overrides ...]
#   e.g. bash examples/grpo_function_calling.sh trainer.total_epochs=1
#
# environment:
#   MODEL_PATH          policy (default Qwen/Qwen3-4B: a local folder or a cached hub id)
#   DATA_DIR            output of `entropyrl prepare fc` (default data/fc): train/test.parquet
#   N_GPUS              GPUs per node (default: all that nvidia-smi lists)
#   LORA_RANK           LoRA of this rank instead of full fine-tuning (default 0: off);
#                       LORA_ALPHA (default 2 x rank), LORA_LR (default 1e-5); docs/lora.md
#   PYTHON, DRY_RUN=1   interpreter; print the command instead of running it
#
# Checkpoints go to checkpoints/entropyrl_function_calling/grpo_function_calling; compare the
# two runs with examples/eval_function_calling.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
MODEL_PATH="${MODEL_PATH:-Qwen/Qwen3-4B}"
DATA_DIR="${DATA_DIR:-$root/data/fc}"

# `entropyrl launch` checks what the run needs (above), then runs this command with
# LORA_RANK's overrides and yours last.
exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \
  "$PYTHON" -m verl.trainer.main_ppo --config-path "$root/configs" --config-name grpo_function_calling \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  actor_rollout_ref.model.path="$MODEL_PATH"
