#!/usr/bin/env bash
# GRPO vs EGPO on function calling: merge each run's last verl checkpoint into a Hugging Face
# model (verl's model merger), generate greedily on the test split and on every BFCL category,
# score each generation twice and write a markdown comparison table of both:
#   strict accuracy: the binary reward used in training (exact values, <think> + Qwen's
#                    <tool_call>\n{...}\n</tool_call> layout);
#   BFCL accuracy:   BFCL rows only, BFCL's own Qwen FC decoder and ast_checker on the same
#                    generation (comparable with the leaderboard's checker, not its prompts);
#                    needs the bfcl extra (docs/install.md), otherwise left out with a note.
#
# usage: bash examples/eval_function_calling.sh [--dry-run]
#
# environment:
#   CKPT_ROOT     verl checkpoint root (default ./checkpoints/entropyrl_function_calling, where
#                 verl writes when training ran from this folder)
#   RUNS          runs to compare (default "grpo egpo"): $CKPT_ROOT/<run>_function_calling
#   DATA_DIR      output of `entropyrl prepare fc` (default data/fc): test.parquet
#   BFCL_DIR      optional folder of BFCL category parquets (`entropyrl prepare fc --format bfcl
#                 --data-source bfcl_<category>`, one <category>/test.parquet or *.parquet each)
#   OUT_DIR       results (default eval/function_calling): merged models, generations, table.md
#   MAX_NEW_TOKENS, TP  generation length (default 8192) and tensor-parallel size (default 1)
#   BFCL_CHECK    auto (default: BFCL accuracy when bfcl-eval is installed), require, or off
#   PYTHON, DRY_RUN=1   interpreter; print the commands instead of running them
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DATA_DIR="${DATA_DIR:-$root/data/fc}"

# `entropyrl launch` checks the GPUs and the test split, then runs this command: for each run,
# verl's model merger on its last checkpoint, generation on every set, scoring; then the table.
# shellcheck disable=SC2086  # RUNS is a list of run names
exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \
  "$PYTHON" -m entropyrl.commands.eval.fc compare --runs ${RUNS:-grpo egpo} \
  --checkpoints "${CKPT_ROOT:-$PWD/checkpoints/entropyrl_function_calling}" \
  --data "$DATA_DIR/test.parquet" --bfcl-dir "${BFCL_DIR:-}" \
  --out "${OUT_DIR:-$root/eval/function_calling}" --bfcl "${BFCL_CHECK:-auto}" \
  --max-new-tokens "${MAX_NEW_TOKENS:-8192}" --tensor-parallel-size "${TP:-1}" --python "$PYTHON"
