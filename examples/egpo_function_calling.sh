#!/usr/bin/env bash
# Text EGPO (Hao et al. 2025, arXiv 2508.05118) on function calling: GRPO advantage plus a
# capped entropy bonus, strict binary reward (configs/egpo_function_calling.yaml).
#
# usage: bash examples/egpo_function_calling.sh [--dry-run] [hydra overrides ...]
#   e.g. bash examples/egpo_function_calling.sh trainer.total_epochs=1
#
# environment:
#   MODEL_PATH          policy (default Qwen/Qwen3-4B: a local folder or a cached hub id)
#   DATA_DIR            output of `entropyrl prepare fc` (default data/fc): train/test.parquet
#   N_GPUS              GPUs per node (default: all that nvidia-smi lists)
#   LORA_RANK           LoRA of this rank instead of full fine-tuning (default 0: off);
#                       LORA_ALPHA (default 2 x rank), LORA_LR (default 1e-5); docs/lora.md
#   PYTHON, DRY_RUN=1   interpreter; print the command instead of running it
#
# Checkpoints go to checkpoints/entropyrl_function_calling/egpo_function_calling; compare the
# two runs with examples/eval_function_calling.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
er_fc_main egpo_function_calling "$@"
