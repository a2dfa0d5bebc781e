"""What each recipe needs around its training command (`RECIPES`: the smoke's task, LoRA's
kind, its input files with how to make them, whether it needs the CHAIR service), and the
overrides the launch adds from the environment: LoRA (LORA_RANK, ...) and the captioning
comparisons (EXPERIMENT)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

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
RECIPES: dict[str, Recipe] = {
    "chair_mscoco": Recipe(
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
    "egpo_function_calling": Recipe("function-calling", "text", _FC_INPUTS),
    "grpo_function_calling": Recipe("function-calling", "text", _FC_INPUTS),
    "egpo_ratio_mixed": Recipe(
        "mixed",
        "text",
        {
            "data.train_files": "run: entropyrl prepare mixed-debug --out {folder}",
            "data.val_files": "written by entropyrl prepare mixed-debug",
        },
    ),
}

# EXPERIMENT: the captioning comparisons, each under its own trainer.experiment_name (so its
# checkpoints land in their own folder, where examples/eval_chair_mscoco.sh finds them).
#   entropyrl  the recipe: per-sample clip_high from CHAIR_i (clean 0.3 / hallucinating 0.5)
#   baseline   GRPO: no schedule, clip_high 0.3 for every sample
#   penalty    GRPO with reward CIDEr-D - 1.0 x (hallucinated mentions), no schedule: the
#              reward that lowered CHAIR in the study
#   reversed   the rule turned round: clean 0.5 / hallucinating 0.3
EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "entropyrl": (),
    "baseline": (
        "algorithm.clip_schedule.enable=false",
        "trainer.experiment_name=chair_mscoco_baseline",
    ),
    "penalty": (
        "algorithm.clip_schedule.enable=false",
        f"{REWARD_KWARGS}.chair_weight=1.0",
        f"{REWARD_KWARGS}.chair_penalty=count",
        "trainer.experiment_name=chair_mscoco_penalty",
    ),
    "reversed": (
        "algorithm.clip_schedule.direction=hallucinated_low",
        "trainer.experiment_name=chair_mscoco_reversed",
    ),
}


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


def experiment_overrides() -> list[str]:
    name = os.environ.get("EXPERIMENT") or "entropyrl"
    if name not in EXPERIMENTS:
        usage_error(f"EXPERIMENT must be entropyrl, baseline, penalty or reversed, got '{name}'")
    return list(EXPERIMENTS[name])
