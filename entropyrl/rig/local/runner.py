"""Phases of a local run (warm-up, RL, equal-time control) and the shared session they run in.

A `CaptionSession` owns the synthetic world, the CHAIR service subprocess and its HTTP client,
the tokenizer/processor, the reward and the model; phases log one JSON line per step through a
`MetricsLog`. `entropyrl demo` (demo.py) composes them; the acceptance study (acceptance.py) and
the ablation study (study.py) run each seed through `warm_start`: one warm-up, RL runs from its
checkpoint, and a control that continues the warm-up for the RL runs' time.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from entropyrl.core.entropy import think_tag_ids
from entropyrl.core.files import json_dumps
from entropyrl.core.specs import AlgorithmSpecs
from entropyrl.rig.local.config import DemoConfig, parse_variant
from entropyrl.rig.local.progress import Progress
from entropyrl.rig.local.rl import RLSettings, rl_step, supervised_step

__all__ = [
    "CaptionSession",
    "MetricsLog",
    "WarmStart",
    "rl_settings",
    "run_rl",
    "run_warmup",
    "warm_start",
]


class MetricsLog:
    """Appends `{"phase", "variant", "step", ...metrics}` lines to `metrics.jsonl`.

    A value not measured (NaN) or infinite is `null` in the file (strict JSON, which jq and
    JavaScript read); `records` keep the floats as they were."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("", encoding="utf-8")
        self.records: list[dict[str, Any]] = []

    @staticmethod
    def record(phase: str, step: int, metrics: dict[str, Any], **tags: Any) -> dict[str, Any]:
        """The line's fields, in the order they are written."""
        return {"phase": phase, "step": step, **tags, **metrics}

    def write(self, phase: str, step: int, metrics: dict[str, Any], **tags: Any) -> None:
        record = self.record(phase, step, metrics, **tags)
        self.records.append(record)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json_dumps(record) + "\n")


def rl_settings(cfg: DemoConfig, variant: str, tokenizer: Any = None) -> RLSettings:
    """`RLSettings` of a variant name (`ADV`, or `ADV+clip` with the clip schedule on); the token
    sections (token penalty, token clip, clip-low schedule) apply to every variant."""
    adv, clip = parse_variant(variant)
    specs = AlgorithmSpecs(
        clip_schedule=dataclasses.replace(cfg.clip_schedule, enable=clip),
        entropy=cfg.entropy,
        egpo_bonus=cfg.egpo_bonus,
        egpo_ratio=cfg.egpo_ratio,
        entropy_adv=cfg.entropy_adv,
        maxent=cfg.maxent,
        clip_low_schedule=cfg.clip_low_schedule,
        token_penalty=cfg.token_penalty,
        token_clip=cfg.token_clip,
    )
    think_ids = None
    if cfg.entropy.mode != "full" and tokenizer is not None:
        think_ids = think_tag_ids(tokenizer)
    return RLSettings(
        adv=adv,
        specs=specs,
        ppo=cfg.ppo,
        samples_per_prompt=cfg.samples_per_prompt,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        num_minibatches=cfg.num_minibatches,
        ppo_epochs=cfg.ppo_epochs,
        kl_coef=cfg.kl_coef,
        max_grad_norm=cfg.max_grad_norm,
        think_ids=think_ids,
        token_penalty_beta=cfg.token_penalty.beta if cfg.token_penalty.enable else None,
        token_clip=(cfg.token_clip.low, cfg.token_clip.high) if cfg.token_clip.enable else None,
        clip_low_schedule=cfg.clip_low_schedule if cfg.clip_low_schedule.enable else None,
    )


# An RL step's values on the progress bar/lines, in this order: what a reader looks for first.
RL_PROGRESS = ("reward", "chair_i", "cider", "entropy", "clip_high")


def _constant_after_ramp(step: int, ramp: int = 20) -> float:
    return min(1.0, (step + 1) / ramp)


def run_warmup(
    model: Any,
    task: Any,
    cfg: DemoConfig,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    seed: int,
    log: MetricsLog | None = None,
    phase: str = "warmup",
    ramp: bool = True,
    progress: bool = True,
    clock: str = "wall",
) -> dict[str, float]:
    """Supervised steps on the noisy warm-up captions, for `steps` steps or `seconds` seconds.

    `clock` says how `seconds` is measured: "wall", or "cpu" (this process's CPU time, which
    other jobs on a shared machine do not inflate).

    Returns `{"steps", "seconds", "cpu_seconds", "loss"}` (loss of the last 20 steps).
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if (steps is None) == (seconds is None):
        raise ValueError("run_warmup needs exactly one of steps= or seconds=")
    rng = random.Random(f"warmup-{seed}-{phase}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.warmup_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _constant_after_ramp if ramp else (lambda _: 1.0)
    )
    started = time.perf_counter()
    cpu_started = time.process_time()
    losses: list[float] = []
    step = 0
    label = "warm-up" if phase == "warmup" else phase
    bar = Progress(label, steps, enabled=progress and cfg.progress)
    while True:
        if clock == "cpu":
            elapsed = time.process_time() - cpu_started
        else:
            elapsed = time.perf_counter() - started
        if (steps is not None and step >= steps) or (seconds is not None and elapsed >= seconds):
            break
        ids, targets = task.warmup_batch(rng, cfg.warmup_batch)
        loss = supervised_step(
            model,
            optimizer,
            task.prompts(ids),
            targets,
            pad_id=task.tokenizer.pad_token_id,
            max_grad_norm=cfg.max_grad_norm,
        )
        schedule.step()
        losses.append(loss)
        if log is not None and (step % 10 == 0):
            log.write(phase, step, {"loss": loss, "seconds": time.perf_counter() - started})
        step += 1
        bar.update(step, {"loss": loss})
    bar.close()
    tail = losses[-20:]
    return {
        "steps": float(step),
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "loss": sum(tail) / len(tail) if tail else math.nan,
    }


def run_rl(
    model: Any,
    task: Any,
    cfg: DemoConfig,
    variant: str,
    *,
    seed: int,
    log: MetricsLog | None = None,
    ref_model: Any | None = None,
    items_source: Callable[[random.Random, int], list[Any]] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`cfg.steps` RL steps of `variant`; returns `{"seconds", "cpu_seconds", "history"}`."""
    settings = rl_settings(cfg, variant, task.tokenizer)
    # MaxEnt-GRPO's target needs the reference policy when beta > 0 (verl: the ref worker).
    if settings.adv == "maxent_grpo" and cfg.maxent.beta > 0 and ref_model is None:
        ref_model = _frozen_copy(model)
    if cfg.kl_coef > 0 and ref_model is None:
        ref_model = _frozen_copy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(f"rl-{seed}")
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    from entropyrl.rig.local.policy import forbidden_token_ids

    suppress = forbidden_token_ids(task.tokenizer)
    pick = items_source or (lambda r, k: r.sample(task.train_ids, k))
    history = []
    started = time.perf_counter()
    cpu_started = time.process_time()
    bar = Progress(
        f"RL {variant}",
        cfg.steps,
        enabled=progress and cfg.progress,
        where=f"RL step {{step}} of {variant}",
    )
    for step in range(cfg.steps):
        items = pick(rng, cfg.prompts_per_step)
        metrics = rl_step(
            model,
            optimizer,
            task,
            items,
            settings,
            tokenizer=task.tokenizer,
            suppress=suppress,
            generator=generator,
            ref_model=ref_model,
        )
        history.append(metrics)
        if log is not None:
            log.write("rl", step, metrics, variant=variant)
        shown = {k: metrics[k] for k in RL_PROGRESS if k in metrics}
        bar.update(step + 1, {"step": step, **shown})  # step: as metrics.jsonl numbers it
    bar.close()
    return {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "history": history,
    }


def _frozen_copy(model: Any) -> Any:
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class RecordingLog:
    """Keeps every line a phase logs (for the warm-up cache) and passes it on to `log`."""

    def __init__(self, log: MetricsLog | None) -> None:
        self.log = log
        self.records: list[dict[str, Any]] = []

    def write(self, phase: str, step: int, metrics: dict[str, Any], **tags: Any) -> None:
        self.records.append(MetricsLog.record(phase, step, metrics, **tags))
        if self.log is not None:
            self.log.write(phase, step, metrics, **tags)


def _metrics_of(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("phase", "step")}


def warm_up_or_load(
    model: Any,
    task: Any,
    cfg: DemoConfig,
    *,
    seed: int,
    log: MetricsLog | None,
    task_name: str = "captioning",
) -> dict[str, Any]:
    """`run_warmup` with `cfg`'s settings, or, with `warmup_cache` on, the stored checkpoint
    of the same settings (entropyrl.rig.local.warmup_cache: the cache's, else the package's):
    its weights, result and log lines. The result says which: `cached` (loaded at all),
    `shipped` (from the package) and `cache` (its folder). A trained one goes into the cache."""
    from entropyrl.rig.local.warmup_cache import stored_warmup, warmup_entry

    device = next(model.parameters()).device.type
    stored = stored_warmup(cfg, seed, device, task_name)
    if stored is not None:
        state, result, records = stored.load()
        model.load_state_dict(state)
        for record in records if log is not None else ():
            log.write(record["phase"], record["step"], _metrics_of(record))
        return {**result, "cached": True, "shipped": stored.shipped, "cache": str(stored.folder)}
    recorded = RecordingLog(log)
    result = run_warmup(model, task, cfg, steps=cfg.warmup_steps, seed=seed, log=recorded)
    if cfg.warmup_cache and not cfg.model:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        warmup_entry(cfg, seed, device, task_name).save(state, result, recorded.records)
    return {**result, "cached": False, "shipped": False}


def warmup_source(warm: dict[str, Any]) -> str:
    """Where a loaded warm-up (`warm_up_or_load`'s result) came from, for the run's log."""
    if warm.get("shipped"):
        return (
            "the checkpoint shipped with entropyrl for these settings (trained by "
            "tools/ship_warmups.py, checked against a fresh training by the tests; "
            "--no-warmup-cache trains it again)"
        )
    return (
        f"the checkpoint of an earlier run with these settings ({warm['cache']}; "
        "--no-warmup-cache trains it again)"
    )


class CaptionSession:
    """World + CHAIR service + tokenizer/processor + reward + a fresh tiny model (or `--model`).

    Use as a context manager: the CHAIR service subprocess is stopped on exit.
    """

    def __init__(self, cfg: DemoConfig, world_dir: str | Path, *, seed: int | None = None) -> None:
        from chair_server.launch import start_server
        from entropyrl.models.loading import load_pretrained, pick_device
        from entropyrl.rewards.chair_client import ChairClient
        from entropyrl.rewards.cider import CiderD
        from entropyrl.rig.local.captioning import CaptionTask
        from entropyrl.rig.synthetic import build_synthetic_coco
        from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2vl, seed_everything
        from entropyrl.rig.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

        self.cfg = cfg
        self.seed = cfg.seed if seed is None else seed
        torch.set_num_threads(cfg.threads)
        seed_everything(self.seed)
        self.device = pick_device(cfg.device)
        self.world = build_synthetic_coco(world_dir, **cfg.world_settings(seed=self.seed))
        if cfg.model:
            self.model, self.tokenizer = load_pretrained(cfg.model, vision=True)
        else:
            self.tokenizer = build_qwen_tokenizer(cfg.tokenizer_ranks)
            self.model = build_tiny_qwen2vl(
                self.tokenizer,
                TinyModelConfig(
                    hidden_size=cfg.hidden_size,
                    num_layers=cfg.num_layers,
                    vision_depth=cfg.vision_depth,
                ),
                seed=self.seed,
            )
        self.model.to(self.device)
        self.processor = build_qwen2vl_processor(self.tokenizer, image_size=cfg.image_size)
        self.server = start_server(coco=self.world.root, extra_args=["--workers", "2"])
        try:
            # the handle, not its URL: a restart on another port is followed
            self.chair = ChairClient(self.server, timeout=30.0, retries=2)
            self.cider = CiderD.from_references(self.world.train_references())
            self.reward = self._caption_reward(cfg)
            self.task = CaptionTask(self.world, self.tokenizer, self.processor, self.reward)
        except BaseException:
            self.server.stop()
            raise

    def warm_up(self, log: MetricsLog | None) -> dict[str, Any]:
        """`warm_up_or_load` with this session's model, task and settings."""
        return warm_up_or_load(self.model, self.task, self.cfg, seed=self.seed, log=log)

    def task_for(self, cfg: DemoConfig) -> Any:
        """This session's `CaptionTask` with `cfg`'s reward weights (a study variant may train
        on CIDEr-D alone from the same warm-up); the world, scorers and CHAIR service are
        shared."""
        reward = self.reward
        weights = (cfg.chair_weight, cfg.recall_weight, cfg.chair_penalty)
        if weights == (reward.chair_weight, reward.recall_weight, reward.chair_penalty):
            return self.task
        task = copy.copy(self.task)
        task.reward_fn = self._caption_reward(cfg)
        return task

    def _caption_reward(self, cfg: DemoConfig) -> Any:
        """CIDEr-D with `cfg`'s CHAIR and recall terms, on this session's scorers."""
        from entropyrl.rewards.caption import CaptionReward

        return CaptionReward(
            self.cider,
            self.chair,
            chair_weight=cfg.chair_weight,
            recall_weight=cfg.recall_weight,
            chair_penalty=cfg.chair_penalty,
        )

    def evaluate(self, model: Any | None = None) -> tuple[dict[str, float], list[dict[str, Any]]]:
        from entropyrl.rig.local.policy import forbidden_token_ids

        return self.task.evaluate(
            model or self.model,
            self.chair,
            max_new_tokens=self.cfg.eval_max_new_tokens,
            suppress=forbidden_token_ids(self.tokenizer),
        )

    def state(self) -> dict[str, torch.Tensor]:
        """A copy of the model weights (the shared warm-up checkpoint)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> CaptionSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WarmStart:
    """One seed's session after its warm-up: `warmup` (what `run_warmup` returned) and `before`
    (the held-out metrics after it); `rl` and `control` start from the warm-up checkpoint."""

    def __init__(self, session: CaptionSession, log: MetricsLog | None) -> None:
        self.session = session
        self.seed = session.seed
        self.log = log
        self.warmup = session.warm_up(log)
        self.before, _ = session.evaluate()
        self.rl_runs: list[dict[str, Any]] = []
        self._checkpoint = session.state()
        self._moved = False

    def _from_checkpoint(self) -> None:
        if self._moved:
            self.session.restore(self._checkpoint)
        self._moved = True

    def rl(
        self, cfg: DemoConfig, variant: str, *, log: MetricsLog | None = None
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """`run_rl` of `variant` with `cfg` from the warm-up checkpoint (steps logged to `log`
        when given); returns (its result, the held-out metrics after it)."""
        self._from_checkpoint()
        session = self.session
        task = session.task_for(cfg)
        rl = run_rl(session.model, task, cfg, variant, seed=self.seed, log=log)
        self.rl_runs.append(rl)
        after, _ = session.evaluate()
        return rl, after

    def control(self, clock: str) -> tuple[dict[str, float], dict[str, float]]:
        """The warm-up continued from its checkpoint for the mean time of the RL runs so far,
        measured on `clock` ("cpu": process CPU time; on an accelerator always "wall"), no
        ramp; returns (`run_warmup`'s result, the held-out metrics after it)."""
        if not self.rl_runs:
            raise ValueError("the control's budget is the RL runs' time: run RL first")
        session = self.session
        if session.device.type != "cpu":
            clock = "wall"
        key = "cpu_seconds" if clock == "cpu" else "seconds"
        budget = sum(rl[key] for rl in self.rl_runs) / len(self.rl_runs)
        self._from_checkpoint()
        control = run_warmup(
            session.model,
            session.task,
            session.cfg,
            seconds=budget,
            clock=clock,
            seed=self.seed,
            log=self.log,
            phase="control",
            ramp=False,
        )
        held, _ = session.evaluate()
        return control, held


@contextlib.contextmanager
def warm_start(
    cfg: DemoConfig, out: str | Path, seed: int, log: MetricsLog | None
) -> Iterator[WarmStart]:
    """A `CaptionSession` for `seed` (its world under `out/world-seed<seed>`), warmed up and
    evaluated: the per-seed start of the acceptance and ablation studies. The CHAIR service
    stops on the way out."""
    with CaptionSession(cfg, Path(out) / f"world-seed{seed}", seed=seed) as session:
        yield WarmStart(session, log)
