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
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
er_parse_args "$@"
[ "${#ER_ARGS[@]}" -eq 0 ] || er_fail "unexpected arguments: ${ER_ARGS[*]}"

CKPT_ROOT="${CKPT_ROOT:-$PWD/checkpoints/entropyrl_function_calling}"
RUNS="${RUNS:-grpo egpo}"
DATA_DIR="${DATA_DIR:-$ER_ROOT/data/fc}"
OUT_DIR="${OUT_DIR:-$ER_ROOT/eval/function_calling}"
MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-8192}"
TP="${TP:-1}"
BFCL_CHECK="${BFCL_CHECK:-auto}"

er_require_gpu
er_require_file "$DATA_DIR/test.parquet" "written by entropyrl prepare fc"
if er_dry_run; then
  echo "# dry-run: resources: generation on TP=$TP GPU(s), one model at a time ($ER_GPUS_SEEN)" >&2
  [ "$ER_GPUS_HERE" -ge 1 ] || er_note_no_gpu "generation" ""
fi

# Evaluation sets: the held-out split, then each BFCL category.
eval_sets=("test=$DATA_DIR/test.parquet")
if [ -n "${BFCL_DIR:-}" ]; then
  [ -d "$BFCL_DIR" ] || er_fail "BFCL_DIR=$BFCL_DIR is not a folder"
  shopt -s nullglob
  for parquet in "$BFCL_DIR"/*.parquet "$BFCL_DIR"/*/test.parquet; do
    name="$(basename "$parquet" .parquet)"
    [ "$name" = "test" ] && name="$(basename "$(dirname "$parquet")")"
    eval_sets+=("$name=$parquet")
  done
  shopt -u nullglob
fi

# The last global_step_N of a run (N compared numerically).
latest_step() {
  local dir="$1/$2_function_calling" best="" step
  for step in "$dir"/global_step_*; do
    [ -d "$step" ] || continue
    if [ -z "$best" ] || [ "${step##*_}" -gt "${best##*_}" ]; then best="$step"; fi
  done
  echo "$best"
}

results=()
for run in $RUNS; do
  step="$(latest_step "$CKPT_ROOT" "$run")"
  if [ -z "$step" ]; then
    er_fail "no checkpoint under $CKPT_ROOT/${run}_function_calling (train with examples/${run}_function_calling.sh, trainer.save_freq > 0)"
    step="$CKPT_ROOT/${run}_function_calling/global_step_N"
  fi
  model="$OUT_DIR/$run/hf"
  er_run "$ER_PYTHON" -m verl.model_merger merge --backend fsdp --local_dir "$step/actor" --target_dir "$model"
  if [ -f "$step/actor/lora_train_meta.json" ]; then
    # a LoRA run: the merger wrote the base and $model/lora_adapter; evaluate base + adapter
    er_run "$ER_PYTHON" -m entropyrl.commands.merge_lora "$model" --out "$model/merged"
    model="$model/merged"
  fi
  generations=()
  for entry in "${eval_sets[@]}"; do
    name="${entry%%=*}"
    er_run "$ER_PYTHON" -m entropyrl.commands.evaluate generate --model "$model" --data "${entry#*=}" \
      --out "$OUT_DIR/$run/$name.jsonl" --max-new-tokens "$MAX_NEW_TOKENS" --tensor-parallel-size "$TP"
    generations+=("$OUT_DIR/$run/$name.jsonl")
  done
  er_run "$ER_PYTHON" -m entropyrl.commands.evaluate score --name "$run" --bfcl "$BFCL_CHECK" \
    --generations "${generations[@]}" --out "$OUT_DIR/$run/result.json"
  results+=(--result "${run^^}=$OUT_DIR/$run/result.json")
done
er_run "$ER_PYTHON" -m entropyrl.commands.evaluate table "${results[@]}" --out "$OUT_DIR/table.md"
