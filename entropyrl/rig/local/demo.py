"""`entropyrl demo`: warm-up + RL of a tiny Qwen2-VL against a real CHAIR service, on one machine.

Builds the synthetic COCO world, starts the CHAIR service on a free loopback port, warms the
model up on the noisy captions, evaluates the held-out images, runs each RL variant from that
same checkpoint, evaluates again, and writes `metrics.jsonl`, `curves.png`, `summary.md` and
`summary.json` under `--out`. The service is stopped on the way out, error or not.

Ctrl-C prints one line, `interrupted at <step>; partial outputs in <--out>`, and exits with 130:
metrics.jsonl holds one whole JSON line per step logged before it, the service is stopped.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from entropyrl.rig.local.config import DemoConfig
from entropyrl.rig.local.interrupts import run_interruptible
from entropyrl.rig.local.progress import set_position
from entropyrl.rig.local.reference import (
    quick_start_checks,
    quick_start_verdict,
    reference_for,
    reference_section,
)
from entropyrl.rig.local.report import (
    eval_columns,
    eval_row,
    markdown_table,
    plot_curves,
    write_summary,
)
from entropyrl.rig.local.runner import CaptionSession, MetricsLog, run_rl, warmup_source

__all__ = ["PHASE_SECONDS", "expected_seconds", "main", "prepare_warmup", "run_caption_demo"]

# Wall seconds of the default captioning demo's phases on `MACHINE` with one torch thread, idle
# (benchmarks/quickstart.py, docs/results.md): the start (imports, world, tokenizer, model, CHAIR
# service) and the end (summary, curves), the warm-up, one RL variant, one held-out evaluation.
PHASE_SECONDS = {"start": 10.0, "warm-up": 96.0, "RL": 50.0, "evaluation": 1.0}


def _settings(cfg: DemoConfig) -> dict[str, Any]:
    keys = (
        "seed", "steps", "warmup_steps", "lr", "warmup_lr", "prompts_per_step",
        "samples_per_prompt", "num_minibatches", "chair_weight", "chair_penalty", "noise_rate",
        "hidden_size",
        "image_size", "tokenizer_ranks", "threads",
    )  # fmt: skip
    settings = {k: getattr(cfg, k) for k in keys}
    settings["algorithm"] = {
        name: getattr(cfg, name).to_dict()
        for name in ("ppo", "clip_schedule", "entropy", "egpo_bonus", "egpo_ratio")
    }
    return settings


def run_caption_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the captioning demo; returns the summary (also written to `summary.json`)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(out / "metrics.jsonl")
    started = time.perf_counter()
    variants = cfg.variants()
    set_position("setup (synthetic world, tokenizer, model, CHAIR service)")
    with CaptionSession(cfg, out / "world") as session:
        setup_seconds = time.perf_counter() - started
        warm = session.warm_up(log)
        if warm["cached"]:
            print(f"warm-up: {warmup_source(warm)}", flush=True)
        set_position("the held-out evaluation after warm-up")
        before, before_records = session.evaluate()
        log.write("eval", 0, before, variant="warm-up")
        rows = [eval_row("after warm-up", before, warm["seconds"])]
        checkpoint = session.state()
        results: dict[str, Any] = {}
        samples: dict[str, list[dict[str, Any]]] = {"warm-up": before_records[:8]}
        for variant in variants:  # same seed, data and checkpoint for every variant
            session.restore(checkpoint)
            rl = run_rl(session.model, session.task, cfg, variant, seed=cfg.seed, log=log)
            set_position(f"the held-out evaluation after {variant}")
            after, after_records = session.evaluate()
            log.write("eval", cfg.steps, after, variant=variant)
            rows.append(eval_row(f"after RL: {variant}", after, rl["seconds"]))
            history = rl["history"]
            k = max(1, min(10, len(history) // 3))
            results[variant] = {
                "eval": after,
                "seconds": rl["seconds"],
                "reward_first": sum(h["reward"] for h in history[:k]) / k if history else None,
                "reward_last": sum(h["reward"] for h in history[-k:]) / k if history else None,
            }
            samples[variant] = after_records[:8]
        chair_stats = {**session.chair.stats, "restarts": session.server.restarts}
        server_url = session.server.url
        set_position("stopping the CHAIR service")
    set_position("writing summary.md and curves.png")
    total = time.perf_counter() - started
    table = markdown_table(rows, eval_columns(rows))
    summary = {
        "task": "captioning",
        "settings": _settings(cfg),
        "warmup": {**warm, "eval": before},
        "variants": results,
        "rows": rows,
        "chair_service": {"url": server_url, **chair_stats},
        "seconds": {"setup": setup_seconds, "total": total},
        "samples": samples,
    }
    reference, _ = reference_for(cfg)
    summary["readme_reference"] = reference
    summary["checks"] = quick_start_checks(rows)
    passed, verdict = quick_start_verdict(rows, summary["checks"], str(out))
    summary["passed"] = passed
    compared = reference_section(cfg, rows)
    write_summary(
        out, summary, f"{table}\n\n{compared}", heading=f"entropyrl demo (seed {cfg.seed})"
    )
    plot_curves(
        log.records, out / "curves.png", title=f"RL from the same warm-up (seed {cfg.seed})"
    )
    print(table)
    print(f"\n{compared}")
    print(f"\n{total:.0f} s in all; outputs in {out}/ (metrics.jsonl, curves.png, summary.md)")
    print(verdict, flush=True)  # the last line
    return summary


# what shows that a folder holds an earlier run
RUN_FILES = ("metrics.jsonl", "summary.json", "summary.md")


def _holds_run(folder: str) -> bool:
    return any((Path(folder) / name).exists() for name in RUN_FILES)


def output_folder(out: str, overwrite: bool) -> str:
    """`out`, or when it holds an earlier run (and `overwrite` is off) the first free
    `<out>-2`, `<out>-3`, ...: a second run never replaces the first without being asked."""
    if overwrite or not _holds_run(out):
        return out
    number = 2
    while _holds_run(f"{out}-{number}"):
        number += 1
    return f"{out}-{number}"


def stored_warmup_of(cfg: DemoConfig) -> Any:
    """The stored warm-up a run of `cfg` would load (cache or package), or None."""
    from entropyrl.models.loading import pick_device
    from entropyrl.rig.local.warmup_cache import stored_warmup

    return stored_warmup(cfg, cfg.seed, pick_device(cfg.device).type, cfg.task)


def prepare_warmup(cfg: DemoConfig) -> int:
    """`entropyrl demo --warmup-only`: the warm-up checkpoint of `cfg` into the cache (what the
    quick start's install step runs), or nothing when it is in the cache or the package."""
    import tempfile

    if cfg.task != "captioning" or cfg.model or not cfg.warmup_cache:
        print("error: --warmup-only caches the captioning warm-up of a tiny model", file=sys.stderr)
        return 2
    stored = stored_warmup_of(cfg)
    if stored is not None:
        where = "shipped with entropyrl" if stored.shipped else "in the cache"
        print(f"warm-up checkpoint: {where}")
        return 0
    print(
        f"warm-up checkpoint: training it for these settings, once ({expected_seconds(cfg, rl=False):.0f} s "
        "on one core of a 2-core x86-64 VM)",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="entropyrl-warmup-") as world,
        CaptionSession(cfg, world) as session,
    ):
        warm = session.warm_up(None)
    print(f"warm-up checkpoint: stored ({warm['steps']:.0f} steps in {warm['seconds']:.0f} s)")
    return 0


def expected_seconds(cfg: DemoConfig, *, warmup: bool = True, rl: bool = True) -> float:
    """The captioning demo's wall time with one thread on `MACHINE`, scaled from the defaults'
    measured phases (`PHASE_SECONDS`) by the number of samples each phase trains on."""
    defaults = DemoConfig()
    seconds = PHASE_SECONDS["start"]
    if warmup:
        samples = cfg.warmup_steps * cfg.warmup_batch
        seconds += (
            PHASE_SECONDS["warm-up"] * samples / (defaults.warmup_steps * defaults.warmup_batch)
        )
    if rl:
        per_step = cfg.prompts_per_step * cfg.samples_per_prompt * cfg.ppo_epochs
        default_step = defaults.prompts_per_step * defaults.samples_per_prompt * defaults.ppo_epochs
        seconds += (
            PHASE_SECONDS["RL"]
            * len(cfg.variants())
            * cfg.steps
            * per_step
            / (defaults.steps * default_step)
        )
        seconds += (
            PHASE_SECONDS["evaluation"]
            * (1 + len(cfg.variants()))
            * cfg.num_test
            / defaults.num_test
        )
    return seconds


def _expectation(cfg: DemoConfig) -> str:
    """The start line's estimate: from the cache, or the warm-up trained first."""
    stored = stored_warmup_of(cfg)
    if stored is not None:
        where = "is shipped with entropyrl" if stored.shipped else "comes from the cache"
        how = f"about {expected_seconds(cfg, warmup=False):.0f} s (the warm-up {where})"
    else:
        how = (
            f"about {expected_seconds(cfg):.0f} s (the warm-up is trained first; a later run with "
            f"these settings takes it from the cache: about {expected_seconds(cfg, warmup=False):.0f} s)"
        )
    return f"expected: {how} on one core of a 2-core x86-64 VM; more where other jobs share it"


def _run_task(cfg: DemoConfig) -> int:
    """Run the demo `cfg` asks for: 0, or 1 when the captioning demo's checks FAIL."""
    if cfg.warmup_only:
        return prepare_warmup(cfg)
    out = output_folder(cfg.out, cfg.overwrite)
    if out != cfg.out:
        print(
            f"{cfg.out} holds an earlier run (kept; --overwrite replaces it): this one goes to {out}"
        )
        cfg.out = out
    print(
        f"outputs go to {cfg.out}/ (metrics.jsonl, curves.png, summary.md, summary.json)",
        flush=True,
    )
    if cfg.acceptance:
        from entropyrl.rig.local.acceptance import run_acceptance

        run_acceptance(cfg)
    elif cfg.task == "function-calling":
        from entropyrl.rig.local.function_calling import run_function_calling_demo

        run_function_calling_demo(cfg)
    else:
        if cfg.threads == 1 and not cfg.device:
            print(_expectation(cfg), flush=True)
        return 0 if run_caption_demo(cfg)["passed"] else 1
    return 0


def main(cfg: DemoConfig) -> int:
    """Entry point of `entropyrl demo`: 0 done, 1 when its checks FAIL, 130 interrupted."""
    return run_interruptible(_run_task, cfg)


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps({"usage": "entropyrl demo --help"}))
