"""What a smoke runs: its tasks, settings per task and the recipe keys it may change.

Read by `entropyrl.commands.smoke` (plan and run), `assets` (build) and `check` (check).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache

from entropyrl.core.files import source_digest

# Tiny model name -> its builder in entropyrl.rig.tiny.
MODELS: dict[str, str] = {
    "qwen2_5_vl": "build_tiny_qwen2_5_vl",
    "qwen2_vl": "build_tiny_qwen2vl",
    "qwen3_vl": "build_tiny_qwen3_vl",
    "qwen3": "build_tiny_qwen3",
    "qwen2": "build_tiny_qwen2",
}
TASKS = ("caption", "function-calling", "mixed")
DEFAULT_OUT = {
    "caption": "runs/chair_mscoco_smoke",
    "function-calling": "runs/fc_smoke",
    "mixed": "runs/egpo_ratio_mixed_smoke",
}
CONFIG_NAMES = {
    "caption": "chair_mscoco",
    "function-calling": "egpo_function_calling",
    "mixed": "egpo_ratio_mixed",
}
# The recipe's architecture (a key of MODELS), and the others a task may take.
DEFAULT_MODEL = {"caption": "qwen2_5_vl", "function-calling": "qwen3", "mixed": "qwen3"}
ASSET_VERSION = 4
# The modules whose code decides what a smoke's assets hold (worlds, converters, the tiny
# models, the tokenizer, the warm-ups): their source is part of the asset key, so an edit to
# any of them builds new assets instead of reusing stale ones. (The settings that shape the
# assets are in the key by value: `SmokeSettings.asset_key`.)
ASSET_SOURCES = (
    "data/coco.py",
    "data/function_calling.py",
    "data/io.py",
    "data/mixed_debug.py",
    "rig/local/captioning.py",
    "rig/local/function_calling.py",
    "rig/local/rl.py",
    "rig/smoke/assets.py",
    "rig/synthetic.py",
    "rig/tiny.py",
    "rig/tokenizer.py",
)


@cache
def asset_source_digest() -> str:
    """sha256 of `ASSET_SOURCES` as installed (names and bytes, in that order)."""
    return source_digest(ASSET_SOURCES)


# The recipes' group sizes (rollout.n): a smoke keeps them (tests/rig/smoke/test_smoke_config.py).
RECIPE_N = {"caption": 5, "function-calling": 8, "mixed": 8}

# Keys whose values may differ between a smoke's resolved config and the recipe's at 1 x 8
# GPUs, each for a reason the CPU forces. A key matches an entry equal to it or under it.
ALLOWED_DIFFERENCES: dict[str, str] = {
    "actor_rollout_ref.model.path": "a tiny model of the recipe's architecture, built offline",
    "actor_rollout_ref.rollout.prometheus.served_model_name": "follows the model path",
    "actor_rollout_ref.model.override_config.attn_implementation": (
        "PyTorch's attention (sdpa): flash-attn needs a GPU; verl's remove-padding path runs on "
        "a PyTorch stand-in of flash-attn's varlen kernel (entropyrl.rig.cpu.backend)"
    ),
    "actor_rollout_ref.rollout.name": "the hf rollout (transformers generate): vLLM needs a GPU",
    "actor_rollout_ref.rollout.agent.num_workers": "processes: one agent loop worker on 2 cores",
    "reward.num_workers": "processes: one reward worker on 2 cores",
    "data.dataloader_num_workers": "processes: the data loader in the trainer's process",
    "trainer.device": "the CPU platform",
    "trainer.n_gpus_per_node": "ranks on the local CPU (--ranks)",
    "actor_rollout_ref.rollout.n_gpus_per_node": "follows trainer.n_gpus_per_node",
    "ray_kwargs.ray_init": "Ray's logical resources on a 2-core machine, no dashboard",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": "one storage process",
    "data.train_files": "the generated data set",
    "data.val_files": "the generated data set",
    "reward.custom_reward_function.reward_kwargs.cider_df": "the generated data set",
    "reward.custom_reward_function.reward_kwargs.chair_url": "the CHAIR service the script starts",
    "data.custom_cls": (
        "verl's RLHFDataset takes images through qwen_vl_utils, which imports torchvision (no CPU "
        "build): PillowRLHFDataset overrides that one method with the same rules (tested against "
        "qwen_vl_utils)"
    ),
    "data.train_batch_size": "batch sizes scaled, the recipe's shape kept",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "batch sizes scaled, >= 2 mini-batches",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "token budget scaled with the lengths",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "follows the token budget",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "follows the token budget",
    "critic.ppo_mini_batch_size": "follows the actor's",
    "data.max_prompt_length": "lengths scaled to the generated data",
    "data.max_response_length": "lengths scaled to the generated data",
    "actor_rollout_ref.rollout.prompt_length": "follows data.max_prompt_length",
    "actor_rollout_ref.rollout.response_length": "follows data.max_response_length",
    "distillation.teacher_models.teacher_model.inference": (
        "follows the rollout's name and lengths (distillation is off)"
    ),
    "trainer.total_training_steps": "a run of a few steps",
    "trainer.save_freq": "a run of a few steps: the resume test saves every step",
    "transfer_queue.enable": (
        "set to true by verl's own TaskRunner at run time (the written config is the running one)"
    ),
    "trainer.default_local_dir": "checkpoints under DIR",
    "trainer.experiment_name": (
        "the launch names the run after MODEL_PATH (chair_mscoco_<model>_<EXPERIMENT>): the tiny "
        "model's folder is `model`"
    ),
    "actor_rollout_ref.rollout.trace.experiment_name": "follows trainer.experiment_name",
}


@dataclass(frozen=True)
class SmokeSettings:
    """The size of a smoke run; `asset_key()` names the reusable assets it needs.

    `prompts_per_step` and `mini_batches` give at least 2 PPO mini-batches per step and, with the
    recipe's micro-batch sizes, at least 2 micro-batches per mini-batch and rank."""

    task: str
    steps: int = 2
    prompts_per_step: int = 4
    mini_batches: int = 2
    ranks: int = 1
    seed: int = 0
    warmup_steps: int = 300
    num_train: int = 64
    num_test: int = 8
    # captioning: world images beyond the val/test halves of num_test, all in test.parquet, held
    # out for the evaluation smoke (examples/eval_chair_mscoco.sh --smoke); training never reads
    # them, validation keeps num_test // 2 images
    eval_images: int = 16
    image_size: int = 112
    hidden_size: int = 64
    response_length: int = 24
    max_prompt_length: int = 1024
    model: str = ""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if not self.model:
            object.__setattr__(self, "model", DEFAULT_MODEL[self.task])
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {sorted(MODELS)}, got {self.model!r}")
        for name in ("steps", "prompts_per_step", "mini_batches", "ranks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompts_per_step % self.mini_batches:
            raise ValueError("prompts_per_step must be a multiple of mini_batches")

    @property
    def rollouts_per_prompt(self) -> int:
        return RECIPE_N[self.task]

    @property
    def mini_batch_prompts(self) -> int:
        return self.prompts_per_step // self.mini_batches

    def asset_key(self) -> str:
        """Settings that change the data or the checkpoint (not the run), and the code that
        builds them (`ASSET_SOURCES`)."""
        fields = ("task", "seed", "warmup_steps", "num_train", "num_test", "image_size")
        if self.task == "caption":
            fields += ("eval_images",)
        payload = {name: getattr(self, name) for name in fields}
        payload.update(hidden_size=self.hidden_size, model=self.model, version=ASSET_VERSION)
        payload.update(code=asset_source_digest())
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.task}-{digest}"


# The text recipes' lengths and warm-up (their smokes differ only in these).
# A smoke trains on 2 prompts per step for 2 steps, so 16 training prompts are plenty; each is
# taught about 75 times in its warm-up (steps x 4 prompts per step / 16), enough for the policy
# to write its answer (or abstain) by a coin flip on nearly every prompt.
TEXT_SETTINGS: dict[str, dict[str, int]] = {
    "function-calling": {
        "response_length": 64,
        "max_prompt_length": 512,
        "warmup_steps": 300,
        "num_train": 16,
    },
    "mixed": {
        "response_length": 96,
        "max_prompt_length": 256,
        "warmup_steps": 300,
        "num_train": 16,
    },
}


def default_settings(task: str, ranks: int = 1, model: str = "") -> SmokeSettings:
    """Each recipe's smoke: caption 4 prompts x 5 (2 mini-batches of 10 rows, the recipe's
    micro-batches of 5 and 10 rows) per rank; the text recipes 2 prompts x 8 per rank (2
    mini-batches of 8 rows, micro-batches cut by a token budget of two longest sequences)."""
    if task in TEXT_SETTINGS:
        return SmokeSettings(
            task=task, ranks=ranks, prompts_per_step=2 * ranks, model=model, **TEXT_SETTINGS[task]
        )
    return SmokeSettings(task=task, ranks=ranks, prompts_per_step=4 * ranks, model=model)


# -- the run's environment and overrides -----------------------------------------------------
