#!/usr/bin/env bash
# Hallucination evaluation of the captioning runs (entropyrl eval caption): the base model and
# each run's last verl checkpoint (merged by verl's model merger) caption the same 500 held-out
# COCO val2014 images greedily at 512 and 64 new tokens and answer POPE; the table gives CHAIR_s,
# CHAIR_i, recall, length, CIDEr-D, BLEU-4 and POPE with 95 % bootstrap intervals over images and
# each run's paired difference from the base (docs/hallucination_eval.md).
#
# usage: bash examples/eval_chair_mscoco.sh [--dry-run] [--out DIR] [entropyrl eval caption flags]
#        bash examples/eval_chair_mscoco.sh --smoke [--out DIR]
#
# --smoke: on the CPU, the caption smoke's checkpoint (SMOKE_RUN; `bash examples/chair_mscoco.sh
# --smoke` runs first when it has none) beside its base model, on the generated world's held-out
# images, with the transformers backend; DIR defaults to runs/eval_chair_mscoco_smoke.
# The same command after an interruption merges and generates only what is missing.
#
# environment:
#   MODEL_PATH    the base model (default Qwen/Qwen2.5-VL-3B-Instruct: a local folder or a cached hub id)
#   CKPT_ROOT     verl's checkpoint root of the runs (default ./checkpoints/entropyrl, where verl
#                 writes when training ran from this folder)
#   RUNS          NAME=EXPERIMENT pairs, each $CKPT_ROOT/<experiment> (default: the runs of
#                 EXPERIMENT=baseline|entropyrl|penalty in examples/chair_mscoco.sh:
#                 "baseline=chair_mscoco_baseline entropyrl=chair_mscoco penalty=chair_mscoco_penalty");
#                 a run without a checkpoint is left out with a note
#   DATA_DIR      output of `entropyrl prepare coco` (default data/coco): test.parquet holds the
#                 held-out images the CHAIR set is drawn from
#   COCO_ANNOTATIONS  COCO 2014 annotation folder: CHAIR's ground truth (instances + captions of
#                 train + val 2014) and POPE's rebuild; without it $DATA_DIR/chair_ground_truth.json
#   POPE_DIR      folder with POPE's released coco_pope_{random,popular,adversarial}.json
#   IMAGE_LIST    CHAIR images from a file (e.g. a paper's 500) instead of a seeded sample
#   TP            tensor-parallel size of the vLLM backend (default 1)
#   PYTHON, DRY_RUN=1   interpreter; print the plan instead of running it
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out=""
smoke=0
passthrough=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --dry-run) ER_DRY_RUN=1 ;;
    --out)
      [ "$#" -ge 2 ] || er_fail "--out needs a folder"
      out="$2"
      shift
      ;;
    --out=*) out="${1#--out=}" ;;
    -h | --help)
      er_print_help
      exit 0
      ;;
    *) passthrough+=("$1") ;;
  esac
  shift
done
eval_cmd=("$ER_PYTHON" -m entropyrl.commands.eval_caption)
er_dry_run && eval_cmd+=(--dry-run)

if [ "$smoke" = 1 ]; then
  ER_SMOKE=1
  out="${out:-runs/eval_chair_mscoco_smoke}"
  SMOKE_RUN="${SMOKE_RUN:-runs/chair_mscoco_smoke}"
  if [ ! -s "$SMOKE_RUN/checkpoints/latest_checkpointed_iteration.txt" ]; then
    echo "smoke: no caption smoke checkpoint in $SMOKE_RUN: running bash examples/chair_mscoco.sh --smoke --out $SMOKE_RUN first" >&2
    if er_dry_run; then
      echo "bash $(er_print_cmd "$ER_ROOT/examples/chair_mscoco.sh" --smoke --out "$SMOKE_RUN")"
    else
      bash "$ER_ROOT/examples/chair_mscoco.sh" --smoke --out "$SMOKE_RUN"
    fi
  fi
  if [ ! -f "$SMOKE_RUN/smoke.env" ]; then
    # a dry run before the caption smoke ran: its asset folder is not named yet
    er_print_cmd "${eval_cmd[@]}" --out "$out" --data "$SMOKE_RUN/assets/<caption assets>/data" \
      --coco "$SMOKE_RUN/assets/<caption assets>/world" --model "base=<caption assets>/model" \
      --model "entropyrl=$SMOKE_RUN/checkpoints" --num-images 0 --backend transformers
    exit 0
  fi
  # shellcheck disable=SC1091
  source "$SMOKE_RUN/smoke.env"  # DATA_DIR, MODEL_PATH, ENTROPYRL_SMOKE_ASSETS of that run
  "${eval_cmd[@]}" --out "$out" --data "$DATA_DIR" --coco "$ENTROPYRL_SMOKE_ASSETS/world" \
    --model "base=$MODEL_PATH" --model "entropyrl=$SMOKE_RUN/checkpoints" \
    --num-images 0 --backend transformers "${passthrough[@]}"
  exit 0
fi

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}"
CKPT_ROOT="${CKPT_ROOT:-$PWD/checkpoints/entropyrl}"
RUNS="${RUNS:-baseline=chair_mscoco_baseline entropyrl=chair_mscoco penalty=chair_mscoco_penalty}"
DATA_DIR="${DATA_DIR:-$ER_ROOT/data/coco}"
out="${out:-$ER_ROOT/eval/chair_mscoco}"
er_require_file "$DATA_DIR/test.parquet" "run: entropyrl prepare coco --annotations ... --images ... --out $DATA_DIR"

models=(--model "base=$MODEL_PATH")
for run in $RUNS; do
  name="${run%%=*}"
  experiment="${run#*=}"
  if compgen -G "$CKPT_ROOT/$experiment/global_step_*/actor" >/dev/null; then
    models+=(--model "$name=$CKPT_ROOT/$experiment")
  else
    echo "note: no checkpoint under $CKPT_ROOT/$experiment: $name left out (train it with EXPERIMENT=$name bash examples/chair_mscoco.sh, trainer.save_freq > 0)" >&2
  fi
done
flags=(--out "$out" --data "$DATA_DIR" --tensor-parallel-size "${TP:-1}")
[ -n "${COCO_ANNOTATIONS:-}" ] && flags+=(--coco "$COCO_ANNOTATIONS")
[ -n "${POPE_DIR:-}" ] && flags+=(--pope-dir "$POPE_DIR")
[ -n "${IMAGE_LIST:-}" ] && flags+=(--image-list "$IMAGE_LIST")
"${eval_cmd[@]}" "${flags[@]}" "${models[@]}" "${passthrough[@]}"
