"""What each recipe needs around its training command, and the overrides the launch adds from
the environment: LoRA (LORA_RANK, ...) and the captioning comparisons (EXPERIMENT).

What a recipe needs follows from the reward it trains on (`REWARD_NEEDS`, keyed by the verl
entry point's name in `entropyrl.verl.rewards`): the smoke's task, LoRA's kind, its input files
with how to make them, whether it needs the CHAIR service. `recipe_for` reads the reward from
the recipe's own config (`reward.custom_reward_function.name`, following its `defaults` list and
the command's overrides), so a new config over an existing reward needs no entry here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from entropyrl.commands.launch.args import REWARD_KWARGS, usage_error


@dataclass(frozen=True)
class Recipe:
    """What a recipe needs around its training command."""

    task: str  # the smoke's task (entropyrl.commands.smoke)
    lora: str  # "vision": LoRA leaves the vision tower alone; "text"
    # override key -> what the file is and how to make it ({folder}: the file's folder)
    inputs: dict[str, str] = field(default_factory=dict)
    chair: bool = False  # starts the CHAIR service and passes its URL to the reward


_FC_INPUTS = {
    "data.train_files": "run: entropyrl prepare fc --format xlam --input "
    "xlam_function_calling_60k.json --out {folder}",
    "data.val_files": "written by entropyrl prepare fc",
}
REWARD_NEEDS: dict[str, Recipe] = {
    "caption_score": Recipe(
        "caption",
        "vision",
        {
            "data.train_files": "run: entropyrl prepare coco --annotations ... --images ... "
            "--out {folder}",
            "data.val_files": "written by entropyrl prepare coco",
            "reward.custom_reward_function.reward_kwargs.cider_df": "CIDEr-D document "
            "frequencies, written by entropyrl prepare coco",
        },
        chair=True,
    ),
    "function_calling_score": Recipe("function-calling", "text", _FC_INPUTS),
    "hybrid_score": Recipe(
        "mixed",
        "text",
        {
            "data.train_files": "run: entropyrl prepare mixed-debug --out {folder}",
            "data.val_files": "written by entropyrl prepare mixed-debug",
        },
    ),
}
REWARD_KEY = "reward.custom_reward_function.name"


def _config_value(folder: Path, name: str, dotted: str, seen: tuple[str, ...] = ()) -> object:
    """`dotted` of the config `name` as Hydra composes it from `folder`: its `defaults` list in
    order (`_self_`, appended when the list leaves it out, where the file's own keys land; a
    later entry wins), configs outside `folder` (verl's own) contributing nothing."""
    try:
        import yaml  # PyYAML comes with Hydra, hence with verl
    except ImportError:
        from entropyrl.verl.checks.stack import NO_VERL

        usage_error(NO_VERL)
    path = folder / f"{name}.yaml"
    if name in seen or not path.is_file():
        return None
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    entries = list(data.get("defaults") or [])
    if "_self_" not in entries:
        entries.append("_self_")
    found = None
    for entry in entries:
        if entry == "_self_":
            got: object = data
            for part in dotted.split("."):
                got = got.get(part) if isinstance(got, dict) else None
        elif isinstance(entry, str):
            got = _config_value(folder, entry, dotted, (*seen, name))
        else:
            got = None
        found = got if got is not None else found
    return found


def recipe_for(config_dir: str | Path, config: str, overrides: Sequence[str] = ()) -> Recipe:
    """What `config` (a config name under `config_dir`) needs, from the reward it trains on;
    the last override of the reward's name wins. An unknown reward is a usage error naming it."""
    name = _config_value(Path(config_dir), config, REWARD_KEY)
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == REWARD_KEY:
            name = value
    recipe = REWARD_NEEDS.get(str(name))
    if recipe is None:
        where = f"{config}'s {REWARD_KEY}"
        usage_error(
            f"no launch recipe for {where} ({name!r}); the launch knows "
            f"{', '.join(REWARD_NEEDS)} (entropyrl.verl.rewards)"
        )
    return recipe  # type: ignore[return-value]


# EXPERIMENT: the captioning comparisons, each under its own trainer.experiment_name,
# chair_mscoco_<model>_<experiment> (`experiment_name`), so its checkpoints land in their own
# folder (verl's trainer.default_local_dir is checkpoints/<project>/<experiment_name>), where
# examples/eval_chair_mscoco.sh finds a model's set; the 3B, 7B and Qwen3-VL sets never share one.
#   entropyrl  the recipe: per-sample clip_high from CHAIR_i (clean 0.3 / hallucinating 0.5)
#   baseline   GRPO: no schedule, clip_high 0.3 for every sample
#   penalty    GRPO with reward CIDEr-D - 1.0 x (hallucinated mentions), no schedule: the
#              reward that lowered CHAIR in the study
#   reversed   the rule turned round: clean 0.5 / hallucinating 0.3
#   clip_low   per-sample clip_low from CHAIR_i (clean 0.2 / hallucinating 0.4), the side on
#              which hallucinating captions are clipped; clip_high 0.3 for every sample
EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "entropyrl": (),
    "baseline": ("algorithm.clip_schedule.enable=false",),
    "penalty": (
        "algorithm.clip_schedule.enable=false",
        f"{REWARD_KWARGS}.chair_weight=1.0",
        f"{REWARD_KWARGS}.chair_penalty=count",
    ),
    "reversed": ("algorithm.clip_schedule.direction=hallucinated_low",),
    "clip_low": (
        "algorithm.clip_schedule.enable=false",
        "algorithm.clip_low_schedule.enable=true",
    ),
    # the token-level mechanisms on CIDEr-D alone: the hallucinated mentions' tokens get -1.0
    # on their advantage, or their own clip bounds (low 0.2 / high 0.5)
    "token_penalty": (
        "algorithm.clip_schedule.enable=false",
        "algorithm.token_penalty.enable=true",
    ),
    "token_clip": (
        "algorithm.clip_schedule.enable=false",
        "algorithm.token_clip.enable=true",
    ),
}
# the captioning recipe's policy (configs/chair_mscoco.yaml, examples/chair_mscoco.sh)
DEFAULT_CAPTION_MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"
# folders that name a checkpoint's layout, not its model (verl's merger, the hub cache)
_LAYOUT_FOLDERS = {"actor", "huggingface", "hf", "snapshots"}


def model_short_name(model_path: str) -> str:
    """The model of a path, hub id or local folder, as a run name takes it: lower case, `_` for
    every run of other characters, the `-Instruct` variant implied (the recipes' models are
    instruct models; other variants, e.g. `-Thinking`, stay in the name).

    `Qwen/Qwen2.5-VL-3B-Instruct` and `/models/Qwen2.5-VL-3B-Instruct/` -> `qwen2_5_vl_3b`; a hub
    cache snapshot (`.../models--Qwen--Qwen3-VL-4B-Instruct/snapshots/<commit>`) -> `qwen3_vl_4b`.
    Folders that only say where weights sit (`actor`, `huggingface`, `global_step_N`, a snapshot's
    commit) are skipped, so a merged checkpoint takes its run's name."""
    parts = [part for part in re.split(r"[\\/]+", model_path.strip()) if part]
    name = ""
    for part in reversed(parts):
        if part.startswith("models--"):  # the Hugging Face cache: models--ORG--NAME
            name = part.split("--")[-1]
            break
    if not name:
        for part in reversed(parts):
            layout = part.lower() in _LAYOUT_FOLDERS or re.fullmatch(r"global_step_\d+", part)
            commit = re.fullmatch(r"[0-9a-f]{40}", part)
            if not layout and not commit:
                name = part
                break
    name = re.sub(r"-instruct$", "", name.lower())
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "model"


def experiment_name(model_path: str, experiment: str) -> str:
    """The run name (`trainer.experiment_name`) of one captioning comparison of one model:
    `chair_mscoco_qwen2_5_vl_7b_baseline` for Qwen/Qwen2.5-VL-7B-Instruct with baseline."""
    return f"chair_mscoco_{model_short_name(model_path)}_{experiment}"


def lora_overrides(kind: str, fail: Callable[[str], None]) -> list[str]:
    """LoRA instead of full fine-tuning when LORA_RANK > 0, through verl's own keys: adapters of
    rank LORA_RANK and scale LORA_ALPHA / LORA_RANK (alpha default 2 x rank) on every linear
    layer of the language model (a VLM's vision tower excluded, as in verl's VLM LoRA example:
    vLLM applies no LoRA there), and the learning rate LORA_LR (default 1e-5: 10x the recipes'
    full fine-tuning rate, docs/lora.md). The caller's overrides come later and win."""
    rank = os.environ.get("LORA_RANK", "0") or "0"
    if not rank.isdigit():
        fail(f"LORA_RANK must be a whole number (0: full fine-tuning), got '{rank}'")
        return []
    if int(rank) == 0:
        return []
    overrides = [
        f"actor_rollout_ref.model.lora_rank={rank}",
        f"actor_rollout_ref.model.lora_alpha={os.environ.get('LORA_ALPHA') or 2 * int(rank)}",
        "actor_rollout_ref.model.target_modules=all-linear",
        f"actor_rollout_ref.actor.optim.lr={os.environ.get('LORA_LR') or '1e-5'}",
    ]
    if kind == "vision":
        overrides.append("actor_rollout_ref.model.exclude_modules='.*visual.*'")
    return overrides


def experiment_overrides(model_path: str | None = None) -> list[str]:
    """EXPERIMENT's overrides and its run name for `model_path` (by default MODEL_PATH, as the
    launch script passes it, or the recipe's model). The caller's overrides come later and win,
    a `trainer.experiment_name=` of theirs too."""
    name = os.environ.get("EXPERIMENT") or "entropyrl"
    if name not in EXPERIMENTS:
        *others, last = EXPERIMENTS
        usage_error(f"EXPERIMENT must be {', '.join(others)} or {last}, got '{name}'")
    model = model_path or os.environ.get("MODEL_PATH") or DEFAULT_CAPTION_MODEL
    return [*EXPERIMENTS[name], f"trainer.experiment_name={experiment_name(model, name)}"]
