#!/usr/bin/env bash
# Hallucination evaluation of the captioning runs (entropyrl eval caption): the base model and
# each run's last verl checkpoint (merged by verl's model merger) caption the same 500 held-out
# COCO val2014 images greedily at 512 and 64 new tokens and answer POPE; the table gives CHAIR_s,
# CHAIR_i, recall, length, CIDEr-D, BLEU-4 and POPE with 95 % bootstrap intervals over images and
# each run's paired difference from the base (docs/hallucination_eval.md).
#
# usage: bash examples/eval_chair_mscoco.sh [--dry-run] [--out DIR] [entropyrl eval caption flags]
#        bash examples/eval_chair_mscoco.sh --smoke [--out DIR]
#   e.g. MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct bash examples/eval_chair_mscoco.sh: the 7B base
#        and its seven EXPERIMENT runs of examples/chair_mscoco.sh, into
#        eval/chair_mscoco_qwen2_5_vl_7b (the folder carries the model unless --out names one)
#
# --smoke: on the CPU, the caption smoke's checkpoint (SMOKE_RUN; `bash examples/chair_mscoco.sh
# --smoke` runs first when it has none) beside its base model, on the generated world's held-out
# images, with the transformers backend; DIR defaults to runs/eval_chair_mscoco_smoke.
# The same command after an interruption merges and generates only what is missing.
#
# environment:
#   MODEL_PATH    the model whose comparison set is evaluated (default Qwen/Qwen2.5-VL-3B-Instruct:
#                 a local folder or a cached hub id, as given to examples/chair_mscoco.sh): the
#                 base, and the runs examples/chair_mscoco.sh trained from it with each EXPERIMENT
#   CKPT_ROOT     verl's checkpoint root of the runs (default ./checkpoints/entropyrl, where verl
#                 writes when training ran from this folder)
#   RUNS          NAME=EXPERIMENT_NAME pairs, each $CKPT_ROOT/<experiment name> (default:
#                 MODEL_PATH's seven runs; for Qwen/Qwen2.5-VL-7B-Instruct
#                 "baseline=chair_mscoco_qwen2_5_vl_7b_baseline entropyrl=..._entropyrl
#                 penalty=..._penalty reversed=..._reversed clip_low=..._clip_low token_penalty=...
#                 token_clip=..."); a run without a checkpoint is
#                 left out with a note
#   DATA_DIR      output of `entropyrl prepare coco` (default data/coco): test.parquet holds the
#                 held-out images the CHAIR set is drawn from
#   COCO_ANNOTATIONS  COCO 2014 annotation folder: CHAIR's ground truth (instances + captions of
#                 train + val 2014) and POPE's rebuild; without it $DATA_DIR/chair_ground_truth.json
#   POPE_DIR      folder with POPE's released coco_pope_{random,popular,adversarial}.json
#   IMAGE_LIST    CHAIR images from a file (e.g. a paper's 500) instead of a seeded sample
#   TP            tensor-parallel size of the vLLM backend (default 1)
#   PYTHON, DRY_RUN=1   interpreter; print the plan instead of running it
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}"
DATA_DIR="${DATA_DIR:-$root/data/coco}"

# `entropyrl launch` runs this command with a --model NAME=FOLDER for each run of RUNS that has
# a checkpoint, COCO_ANNOTATIONS, POPE_DIR and IMAGE_LIST, and your flags last (the folder below
# gets _<model> appended; --out replaces it); with --smoke, the caption smoke's model, data and checkpoint instead.
exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \
  "$PYTHON" -m entropyrl.commands.eval.caption --out "$root/eval/chair_mscoco" \
  --data "$DATA_DIR" --tensor-parallel-size "${TP:-1}" --model "base=$MODEL_PATH"
