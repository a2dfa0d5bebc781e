# Shared helpers for the verl launch scripts (sourced, not run).
#
# Every script accepts `--dry-run` (or DRY_RUN=1): prerequisite failures become notes, each
# command is printed, shell-quoted, instead of run, and the resources it would take (nodes x
# GPUs per node, from the overrides, N_GPUS or nvidia-smi) are noted on stderr. `--smoke [--out DIR] [--ranks N]` runs the
# same verl trainer on the local CPU with a tiny model and generated data
# (entropyrl.commands.smoke prepares them, then checks DIR/metrics.jsonl). Remaining arguments are
# Hydra overrides passed through to verl.

ER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ER_PYTHON="${PYTHON:-python3}"
ER_DRY_RUN="${DRY_RUN:-0}"
ER_SMOKE=0
ER_SMOKE_OUT=""
ER_SMOKE_TASK=""
ER_RANKS=1
ER_ARGS=()
ER_SMOKE_OVERRIDES=()
ER_QUICKSTART="No GPU here? \`bash $0 --smoke\` runs this same verl trainer on the CPU with a tiny model; the CPU quick start (bash examples/quickstart.sh) runs the algorithms on one machine."

# Split "$@" into our flags and pass-through overrides (ER_ARGS).
er_parse_args() {
  ER_ARGS=()
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --dry-run) ER_DRY_RUN=1 ;;
      --smoke) ER_SMOKE=1 ;;
      --out)
        [ "$#" -ge 2 ] || { echo "error: --out needs a folder" >&2; exit 2; }
        ER_SMOKE_OUT="$2"
        shift
        ;;
      --out=*) ER_SMOKE_OUT="${1#--out=}" ;;
      --ranks)
        [ "$#" -ge 2 ] || { echo "error: --ranks needs a number" >&2; exit 2; }
        ER_RANKS="$2"
        shift
        ;;
      --ranks=*) ER_RANKS="${1#--ranks=}" ;;
      -h | --help)
        er_print_help
        exit 0
        ;;
      -*)
        # a misspelt flag would otherwise reach Hydra as an override, or be taken for one
        echo "error: unknown option $1 (the options: --dry-run, --smoke, --out DIR, --ranks N, --help; everything else is a Hydra override, key=value)" >&2
        exit 2
        ;;
      *) ER_ARGS+=("$1") ;;
    esac
    shift
  done
  case "$ER_RANKS" in
    '' | *[!0-9]* | 0) echo "error: --ranks must be a positive integer, got '$ER_RANKS'" >&2; exit 2 ;;
  esac
  if [ "$ER_SMOKE" != "1" ] && { [ -n "$ER_SMOKE_OUT" ] || [ "$ER_RANKS" != "1" ]; }; then
    echo "error: --out and --ranks belong to --smoke (a GPU run takes trainer.* overrides)" >&2
    exit 2
  fi
}

# The calling script's header comment (its lines up to `set -`), as its --help.
er_print_help() { sed -n '2,/^set -/p' "$0" | sed -e '/^set -/d' -e 's/^# \{0,1\}//'; }
er_dry_run() { [ "$ER_DRY_RUN" = "1" ]; }
er_smoke() { [ "$ER_SMOKE" = "1" ]; }

# --smoke, before anything else: the run's folder, environment (DATA_DIR, MODEL_PATH,
# VERL_PLATFORM=cpu, thread counts, the metrics file) and overrides (ER_SMOKE_OVERRIDES), with
# the asset folder named but not built yet. er_smoke_plan TASK DEFAULT_OUT
er_smoke_plan() {
  local task="$1" default_out="$2"
  ER_SMOKE_TASK="$task"
  ER_SMOKE_OUT="${ER_SMOKE_OUT:-$default_out}"
  mkdir -p "$ER_SMOKE_OUT"
  ER_SMOKE_OUT="$(cd "$ER_SMOKE_OUT" && pwd)"
  er_require_verl
  "$ER_PYTHON" -m entropyrl.commands.smoke plan "$task" --out "$ER_SMOKE_OUT" --ranks "$ER_RANKS" \
    || er_fail "could not plan the smoke run (see the message above)"
  # shellcheck disable=SC1091
  source "$ER_SMOKE_OUT/smoke.env"
  mapfile -t ER_SMOKE_OVERRIDES <"$ER_SMOKE_OUT/overrides.txt"
  ER_N_GPUS="$ER_RANKS"
}

# --smoke, once the config passed its checks: build (or reuse) the tiny model and data.
er_smoke_build() {
  er_dry_run && return 0
  echo "smoke: preparing the tiny model and data in $ER_SMOKE_OUT (reused when present)" >&2
  "$ER_PYTHON" -m entropyrl.commands.smoke build "$ER_SMOKE_TASK" --out "$ER_SMOKE_OUT" \
    --ranks "$ER_RANKS" || er_fail "could not prepare the smoke run (see the message above)"
}

# Before anything starts (the CHAIR service, Ray, a smoke's asset build): compose CONFIG with
# the overrides the training command will get (a smoke's first) and stop, one line per problem,
# on what could not run: unknown algorithm keys, a batch geometry verl would assert on, and on
# GPU runs a missing flash-attn or vLLM, too few GPUs, a checkpoint folder not shared between
# nodes, a checkpoint folder holding another run's checkpoint. A dry run prints how a step is
# split. A run whose checkpoint is at its last step stops here (exit 0), having said so. Sets
# ER_NNODES, ER_GPUS_PER_NODE and ER_CHECKPOINT_DIR.
# er_preflight CONFIG OVERRIDES...
er_preflight() {
  local config="$1" mode=gpu env_file status=0
  shift
  er_smoke && mode=smoke
  if ! er_verl_version >/dev/null; then
    # nothing to compose the recipe with: say what to install here (the smoke says it itself)
    local no_verl
    no_verl="$("$ER_PYTHON" -c 'from entropyrl.commands.preflight import NO_VERL; print(NO_VERL)' 2>/dev/null || echo "verl is not installed (docs/install.md)")"
    er_fail "$no_verl"
    er_dry_run && echo "# dry-run: the recipe's checks and the step's split need verl; skipped" >&2
    return 0
  fi
  local flags=(--mode "$mode")
  er_dry_run && flags+=(--dry-run)
  env_file="$(mktemp "${TMPDIR:-/tmp}/entropyrl_preflight.XXXXXX")"
  "$ER_PYTHON" -m entropyrl.commands.preflight "$config" "${flags[@]}" --env-out "$env_file" -- \
    "${ER_SMOKE_OVERRIDES[@]}" "$@" || status=$?
  if [ "$status" != 0 ]; then
    rm -f "$env_file"
    exit "$status"
  fi
  # shellcheck disable=SC1090
  source "$env_file"
  rm -f "$env_file"
  if [ "${ER_NOTHING_TO_DO:-0}" = 1 ] && ! er_dry_run; then
    exit 0  # the checkpoint is at the run's last step (said above)
  fi
}

# --smoke: check DIR/metrics.jsonl after the run. er_smoke_check TASK
er_smoke_check() {
  er_dry_run && return 0
  "$ER_PYTHON" -m entropyrl.commands.smoke check "$1" --out "$ER_SMOKE_OUT" --ranks "$ER_RANKS"
}

# The installed verl's version, from its metadata (no import); non-zero when there is none.
er_verl_version() {
  "$ER_PYTHON" -c 'import importlib.metadata as m; print(m.version("verl"))' 2>/dev/null
}

# verl importable and the version this project is written for (one line, not a traceback).
er_require_verl() {
  local found
  if ! found="$(er_verl_version)"; then
    er_fail "verl is not installed in $ER_PYTHON (install it with: pip install 'verl[verl-core]==0.9.1', or bash tools/setup.sh dev)"
    return 0
  fi
  if [ "$found" != "0.9.1" ]; then
    er_fail "verl $found is installed; entropyrl's plugin is written for verl 0.9.1 (pip install 'verl[verl-core]==0.9.1')"
  fi
}

# A failed prerequisite: stop with the reason and the quick-start pointer (a note in dry-run).
er_fail() {
  if er_dry_run; then
    echo "# dry-run: prerequisite not met: $*" >&2
    return 0
  fi
  echo "error: $*" >&2
  er_smoke || echo "$ER_QUICKSTART" >&2
  exit 2
}

# Print a command shell-quoted, exactly as it would run.
er_print_cmd() {
  local out="" word
  for word in "$@"; do
    out+="$(printf '%q' "$word") "
  done
  echo "${out% }"
}

# Run a command, or print it in dry-run.
er_run() {
  if er_dry_run; then
    er_print_cmd "$@"
  else
    "$@"
  fi
}

# Run the training command ER_CMD: as it is on GPUs; in a smoke with verl's output in the run's
# log and a line per step on the terminal (entropyrl.commands.smoke run). A dry run prints it.
er_train() {
  local status=0
  if er_dry_run; then
    er_print_cmd "${ER_CMD[@]}"
  elif er_smoke; then
    "$ER_PYTHON" -m entropyrl.commands.smoke run "$ER_SMOKE_TASK" --out "$ER_SMOKE_OUT" -- "${ER_CMD[@]}" || status=$?
  else
    "${ER_CMD[@]}" || status=$?
  fi
  if [ "$status" != 0 ]; then
    # a run stopped by a signal (Ctrl-C, a kill) says nothing about the plugin
    [ "$status" -ge 128 ] || er_diagnose_plugin
    exit "$status"
  fi
}

# The GPUs this process can use: what nvidia-smi lists, cut to CUDA_VISIBLE_DEVICES when it is
# set (CUDA stops at the first empty or negative entry). Sets ER_GPUS_HERE and ER_GPUS_SEEN.
er_count_gpus() {
  ER_GPUS_HERE=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    ER_GPUS_HERE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c . || true)"
    ER_GPUS_HERE="${ER_GPUS_HERE:-0}"
    ER_GPUS_SEEN="nvidia-smi lists $ER_GPUS_HERE"
  else
    ER_GPUS_SEEN="nvidia-smi not found"
  fi
  if [ "${CUDA_VISIBLE_DEVICES+set}" = set ]; then
    local visible=0 device devices
    IFS=',' read -r -a devices <<<"$CUDA_VISIBLE_DEVICES"
    for device in "${devices[@]}"; do
      case "$device" in '' | -*) break ;; esac
      visible=$((visible + 1))
    done
    [ "$visible" -lt "$ER_GPUS_HERE" ] && ER_GPUS_HERE="$visible"
    ER_GPUS_SEEN="$ER_GPUS_SEEN, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES leaves $ER_GPUS_HERE"
  fi
}

# At least one NVIDIA GPU visible. Sets ER_GPUS_HERE, ER_N_GPUS (GPUs per node: N_GPUS, else
# ER_GPUS_HERE) and ER_N_GPUS_FROM (where that came from). A dry run on a machine without GPUs
# plans for the config's own GPUs per node (ER_N_GPUS empty: no override).
er_require_gpu() {
  er_count_gpus
  if [ -n "${N_GPUS:-}" ]; then
    ER_N_GPUS="$N_GPUS"
    ER_N_GPUS_FROM="N_GPUS=$N_GPUS"
  elif [ "$ER_GPUS_HERE" -ge 1 ]; then
    ER_N_GPUS="$ER_GPUS_HERE"
    ER_N_GPUS_FROM="the GPUs this process sees ($ER_GPUS_SEEN)"
  else
    ER_N_GPUS=""
    ER_N_GPUS_FROM="the config (no GPU here: $ER_GPUS_SEEN; N_GPUS=... plans another layout)"
  fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    er_fail "nvidia-smi not found: verl training needs NVIDIA GPUs (a GPU node installs pip install -e '.[gpu]', docs/install.md; here --dry-run plans the run and --smoke runs the recipe on the CPU)"
  elif [ "$ER_GPUS_HERE" -lt 1 ]; then
    er_fail "no GPU visible ($ER_GPUS_SEEN)"
  fi
}

# The overrides that set GPUs per node, if any: "trainer.n_gpus_per_node=N" or nothing.
er_gpus_override() {
  [ -n "${ER_N_GPUS:-}" ] && printf '%s\n' "trainer.n_gpus_per_node=$ER_N_GPUS"
  return 0
}

# The value of the last KEY=VALUE (or +KEY=, ++KEY=) among the arguments, as Hydra applies
# them (the last one wins); empty when none sets KEY. er_override_value KEY ARGS...
er_override_value() {
  local key="$1" value="" arg
  shift
  for arg in "$@"; do
    case "$arg" in
      "$key="* | "+$key="* | "++$key="*) value="${arg#*=}" ;;
    esac
  done
  printf '%s' "$value"
}

# Dry run: say plainly that the local host has no GPU for WHAT, then HINT (default: the CPU
# alternatives). er_note_no_gpu WHAT [HINT]
er_note_no_gpu() {
  local hint="${2-$ER_QUICKSTART}"
  echo "# dry-run: no GPU on the local host (${ER_GPUS_SEEN:-nvidia-smi not run}): $1 needs NVIDIA GPUs and would stop at once here.${hint:+ $hint}" >&2
}

# Dry run: the resources a training command would take (nodes x GPUs per node, from the composed
# config: ER_NNODES and ER_GPUS_PER_NODE, set by er_preflight) and where the GPUs per node come
# from, and plainly when the local host has no GPU. Lines on stderr, so stdout stays the commands.
er_report_resources() {
  er_dry_run || return 0
  if er_smoke; then
    echo "# dry-run: resources: $ER_RANKS rank(s) on the local CPU (smoke run: no GPU needed)" >&2
    return 0
  fi
  local nodes="${ER_NNODES:-?}" per_node="${ER_GPUS_PER_NODE:-?}" per_node_from asked total
  local here="${ER_GPUS_HERE:-0}"
  asked="$(er_override_value trainer.n_gpus_per_node "${ER_ARGS[@]}")"
  if [ -n "$asked" ]; then
    per_node_from="trainer.n_gpus_per_node=$asked"
  else
    per_node_from="${ER_N_GPUS_FROM:-the config}"
  fi
  total="?"
  case "$nodes$per_node" in
    '' | *[!0-9]*) ;;
    *) total=$((nodes * per_node)) ;;
  esac
  echo "# dry-run: resources: $nodes node(s) x $per_node GPU(s) per node = $total GPU(s) (GPUs per node: $per_node_from)" >&2
  if [ "$here" -lt 1 ]; then
    er_note_no_gpu "the training command"
  elif [ "$per_node" -eq "$per_node" ] 2>/dev/null && [ "$per_node" -gt "$here" ]; then
    echo "# dry-run: the local host shows $here GPU(s), fewer than the $per_node per node asked for" >&2
  fi
}

# This node's address as other nodes see it (the first that `hostname -I` lists).
er_node_address() {
  local address
  address="$(hostname -I 2>/dev/null | awk '{print $1}')"
  if [ -z "$address" ]; then
    address="$("$ER_PYTHON" -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')"
  fi
  printf '%s' "$address"
}

# True for an address only the local host reaches (127.0.0.0/8, ::1, localhost).
er_loopback() {
  case "$1" in
    127.* | ::1 | localhost) return 0 ;;
    *) return 1 ;;
  esac
}

# A file that must exist: er_require_file PATH "what it is and how to make it".
er_require_file() {
  [ -f "$1" ] || er_fail "missing $1 ($2)"
}

# The policy model: a local folder with config.json, or a hub id already in the local cache
# (training never downloads at run time).
er_require_model() {
  local model="$1"
  if [ -d "$model" ]; then
    [ -f "$model/config.json" ] || er_fail "model folder $model has no config.json"
    return 0
  fi
  if ! "$ER_PYTHON" - "$model" >/dev/null 2>&1 <<'EOF'; then
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], local_files_only=True)
EOF
    er_fail "model $model is neither a local folder nor in the Hugging Face cache (download it first: hf download $model, or set MODEL_PATH to a local folder)"
  fi
}

# verl and our plugin importable and registered in a fresh process (one import of verl).
er_require_plugin() {
  local problem
  if ! problem="$("$ER_PYTHON" -m entropyrl doctor --discovery --quick 2>/dev/null)"; then
    er_fail "the entropyrl verl plugin does not load: ${problem:-entropyrl doctor failed} (run: $ER_PYTHON -m entropyrl doctor)"
  fi
}

# After a failed run (not one stopped by a signal): whether verl loaded the plugin at all (a fresh `import verl`, some 10
# CPU-seconds, so asked only now), in one line on stderr when it did not.
er_diagnose_plugin() {
  local problem
  if ! problem="$("$ER_PYTHON" -m entropyrl doctor --discovery 2>/dev/null)"; then
    echo "error: the entropyrl verl plugin does not load: ${problem:-entropyrl doctor failed} (run: $ER_PYTHON -m entropyrl doctor)" >&2
  fi
}

# The training command: verl's own entry point with one of our configs and the overrides
# (the smoke's overrides, when --smoke, come before the caller's); a dry run also says the
# resources it would take.
er_train_cmd() {
  local config="$1"
  shift
  ER_CMD=("$ER_PYTHON" -m verl.trainer.main_ppo --config-path "$ER_ROOT/configs" --config-name "$config")
  if er_smoke; then
    ER_CMD+=("${ER_SMOKE_OVERRIDES[@]}")
  fi
  ER_CMD+=("$@")
  er_report_resources "${ER_CMD[@]}"
}

# LoRA instead of full fine-tuning when LORA_RANK > 0, through verl's own keys: adapters of rank
# LORA_RANK and scale LORA_ALPHA / LORA_RANK (alpha default 2 x rank) on every linear layer of
# the language model (a VLM's vision tower excluded, as in verl's VLM LoRA example: vLLM applies
# no LoRA there), and the learning rate LORA_LR (default 1e-5: 10x the recipes' full
# fine-tuning rate, see docs/lora.md). The caller's overrides come later and win.
# Sets ER_LORA_OVERRIDES. er_lora_overrides vision|text
er_lora_overrides() {
  local rank="${LORA_RANK:-0}" alpha
  ER_LORA_OVERRIDES=()
  case "$rank" in
    '' | *[!0-9]*) er_fail "LORA_RANK must be a whole number (0: full fine-tuning), got '$rank'" ;;
  esac
  [ "$rank" -gt 0 ] || return 0
  alpha="${LORA_ALPHA:-$((2 * rank))}"
  ER_LORA_OVERRIDES=(
    "actor_rollout_ref.model.lora_rank=$rank"
    "actor_rollout_ref.model.lora_alpha=$alpha"
    "actor_rollout_ref.model.target_modules=all-linear"
    "actor_rollout_ref.actor.optim.lr=${LORA_LR:-1e-5}"
  )
  if [ "$1" = vision ]; then
    ER_LORA_OVERRIDES+=("actor_rollout_ref.model.exclude_modules='.*visual.*'")
  fi
}

# Function-calling training (EGPO or GRPO): er_fc_main CONFIG "$@".
# Both runs read the same DATA_DIR and differ only in the config's estimator.
er_fc_main() {
  local config="$1"
  shift
  er_parse_args "$@"
  if er_smoke; then
    er_smoke_plan function-calling "runs/${config}_smoke"
  fi
  MODEL_PATH="${MODEL_PATH:-Qwen/Qwen3-4B}"
  DATA_DIR="${DATA_DIR:-$ER_ROOT/data/fc}"
  er_smoke || er_require_gpu
  local overrides=(
    "data.train_files=$DATA_DIR/train.parquet"
    "data.val_files=$DATA_DIR/test.parquet"
    "actor_rollout_ref.model.path=$MODEL_PATH"
  )
  mapfile -t -O "${#overrides[@]}" overrides < <(er_gpus_override)
  er_lora_overrides text
  overrides+=("${ER_LORA_OVERRIDES[@]}" "${ER_ARGS[@]}")
  er_preflight "$config" "${overrides[@]}"
  if er_smoke; then
    er_smoke_build
  fi
  er_require_file "$DATA_DIR/train.parquet" "run: entropyrl prepare fc --format xlam --input xlam_function_calling_60k.json --out $DATA_DIR"
  er_require_file "$DATA_DIR/test.parquet" "written by entropyrl prepare fc"
  er_require_model "$MODEL_PATH"
  er_dry_run || er_require_plugin
  er_train_cmd "$config" "${overrides[@]}"
  er_train
  if er_smoke; then
    er_smoke_check function-calling
  fi
}

# EXPERIMENT: the captioning comparisons, each under its own trainer.experiment_name (so its
# checkpoints land in their own folder, where examples/eval_chair_mscoco.sh finds them). Sets
# ER_EXPERIMENT_OVERRIDES; the caller's overrides come after them and win.
#   entropyrl  the recipe: per-sample eps_high from CHAIR_i (clean 0.3 / hallucinating 0.5),
#              CIDEr-D reward (experiment chair_mscoco)
#   baseline   GRPO: no schedule, eps_high 0.3 for every sample (chair_mscoco_baseline)
#   penalty    GRPO with reward CIDEr-D - 1.0 x (hallucinated mentions), no schedule: the
#              reward that lowered CHAIR in the study (chair_mscoco_penalty)
#   reversed   the rule turned round: clean 0.5 / hallucinating 0.3 (chair_mscoco_reversed)
er_caption_experiment() {
  local kwargs=reward.custom_reward_function.reward_kwargs
  case "${EXPERIMENT:-entropyrl}" in
    entropyrl) ER_EXPERIMENT_OVERRIDES=() ;;
    baseline)
      ER_EXPERIMENT_OVERRIDES=(algorithm.clip_schedule.enable=false
        trainer.experiment_name=chair_mscoco_baseline) ;;
    penalty)
      ER_EXPERIMENT_OVERRIDES=(algorithm.clip_schedule.enable=false "$kwargs.chair_weight=1.0"
        "$kwargs.chair_penalty=count" trainer.experiment_name=chair_mscoco_penalty) ;;
    reversed)
      ER_EXPERIMENT_OVERRIDES=(algorithm.clip_schedule.direction=hallucinated_low
        trainer.experiment_name=chair_mscoco_reversed) ;;
    *)
      echo "error: EXPERIMENT must be entropyrl, baseline, penalty or reversed, got '$EXPERIMENT'" >&2
      exit 2 ;;
  esac
}
