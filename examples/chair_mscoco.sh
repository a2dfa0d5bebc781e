#!/usr/bin/env bash
# Hallucination-aware captioning on MSCOCO with verl (configs/chair_mscoco.yaml): GRPO with a
# per-sample clip_high from each caption's CHAIR_i (0.3 clean / 0.5 hallucinating).
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
#                       0.5 / hallucinating 0.3) or clip_low (per-sample clip_low from CHAIR_i:
#                       clean 0.2 / hallucinating 0.4) or token_penalty (-1.0 on the advantage of
#                       each hallucinated mention's tokens) or token_clip (those tokens clipped
#                       at low 0.2 / high 0.5): each under its own experiment name, which
#                       carries the model (chair_mscoco_qwen2_5_vl_7b_baseline for
#                       MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct), so each model's set has its own
#                       checkpoint folders; compared by MODEL_PATH=... examples/eval_chair_mscoco.sh
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
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# exported: the run name (trainer.experiment_name) carries the model
export MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}"
DATA_DIR="${DATA_DIR:-$root/data/coco}"

# `entropyrl launch` checks and starts what the run needs (above), then runs this command with
# the CHAIR service's URL, EXPERIMENT's and LORA_RANK's overrides, and yours last.
exec "$PYTHON" -m entropyrl launch "$0" "$@" -- \
  "$PYTHON" -m verl.trainer.main_ppo --config-path "$root/configs" --config-name chair_mscoco \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/val.parquet" \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  reward.custom_reward_function.reward_kwargs.cider_df="$DATA_DIR/cider_df.json.gz"
