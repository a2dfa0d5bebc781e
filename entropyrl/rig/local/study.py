"""Ablation study: which part of entropy-guided, hallucination-aware RL changes what, per seed.

For each seed: warm up on the noisy captions once, evaluate (greedy, held-out), then from that
same checkpoint run every variant of the grid and an equal-CPU-time control, evaluating after
each. The grid separates the pieces the project claims matter:

- the clip bound alone: GRPO with clip_high fixed at the schedule's `low`, then at its `high`;
- the CHAIR clip schedule (EntropyRL's step rule, the reversed direction, linear, sigmoid);
- entropy guidance of the advantages (EGPO bonus, EGPO ratio), with and without the CHAIR clip;
- the control: the supervised warm-up continued for the mean CPU time of the seed's RL runs
  (process CPU time, as in `entropyrl.rig.local.acceptance`, so other jobs on a shared machine
  do not hand one side more compute).

A clip bound only matters where the policy moves far enough within one step for the ratio to
reach it, so the study's own defaults (`STUDY_DEFAULTS`) take more PPO mini-batches, epochs and
a larger learning rate than the quick start, which never reaches its bounds. Each RL step logs
the token entropy of its samples and the clipped-token fractions, split into hallucinating and
clean samples (`entropyrl.rig.local.rl.hallucination_split_metrics`); the report gives every
number as the mean and standard deviation over seeds, and each variant's per-seed paired
difference from plain GRPO at the `low` bound (same seed, same warm-up checkpoint).

Run: `python -m entropyrl.rig.local.study --seeds 0,1,2 --threads 1 --out runs/study`; seeds may run
in separate processes (`--seeds 0 --out runs/study-s0`, ...) and be combined with
`--combine runs/study-s0 runs/study-s1 ... --out runs/study`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entropyrl.core.files import json_dumps
from entropyrl.rig.local.config import DemoConfig
from entropyrl.rig.local.report import markdown_table, write_summary

__all__ = [
    "CREDIT",
    "GRID",
    "PRESETS",
    "REFERENCE",
    "STUDY_DEFAULTS",
    "StudyVariant",
    "aggregate",
    "main",
    "plot_study",
    "run_study",
    "run_summary",
    "study_tables",
]

CONTROL = "control"


@dataclass(frozen=True)
class StudyVariant:
    """One RL run of the grid: an estimator, how each sample's clip_high is set, its reward and
    the token-level sections it turns on.

    `schedule` turns the CHAIR clip schedule on with these overrides of the run's
    `clip_schedule` section; without it every sample gets the fixed bound `fixed`, which names
    an end of that section (`"low"` or `"high"`), so the fixed and scheduled runs share their
    numbers (written once, in `ClipScheduleSpec`, or given with `--clip-schedule-low/high`).
    `sections` turns on other algorithm sections (`token_penalty`, `token_clip`,
    `clip_low_schedule`) with these overrides; `chair_weight` replaces the run's weight of the
    sequence-level CHAIR penalty (0: CIDEr-D alone; CHAIR still scores, so the token
    mechanisms see which words are hallucinated).
    """

    key: str
    adv: str
    schedule: Mapping[str, Any] | None = None
    fixed: str = "low"
    family: str = field(default="", compare=False)
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    chair_weight: float | None = None

    def config(self, cfg: DemoConfig) -> tuple[DemoConfig, str]:
        """The run's config and the `rl_settings` variant name (`ADV` or `ADV+clip`)."""
        extra: dict[str, Any] = {
            name: dataclasses.replace(getattr(cfg, name), enable=True, **overrides)
            for name, overrides in self.sections.items()
        }
        if self.chair_weight is not None:
            extra["chair_weight"] = float(self.chair_weight)
        if self.schedule is not None:
            spec = dataclasses.replace(cfg.clip_schedule, enable=True, **self.schedule)
            run = dataclasses.replace(cfg, adv=self.adv, clip_schedule=spec, **extra)
            return run, f"{self.adv}+clip"
        eps = getattr(cfg.clip_schedule, self.fixed)
        ppo = dataclasses.replace(cfg.ppo, clip_high=eps)
        off = dataclasses.replace(cfg.clip_schedule, enable=False)
        run = dataclasses.replace(cfg, adv=self.adv, ppo=ppo, clip_schedule=off, **extra)
        return run, self.adv

    def label(self, cfg: DemoConfig) -> str:
        """A table label with the bounds and the reward this variant actually used."""
        name = {"grpo": "GRPO", "egpo": "EGPO bonus", "egpo_ratio": "EGPO ratio"}.get(
            self.adv, self.adv
        )
        run_cfg, _ = self.config(cfg)
        spec = run_cfg.clip_schedule
        if self.schedule is None:
            text = f"{name}, clip_high {run_cfg.ppo.clip_high:g}"
        else:
            ends = (
                (spec.low, spec.high)
                if spec.direction == "hallucinated_high"
                else (spec.high, spec.low)
            )
            text = f"{name} + CHAIR {spec.rule} (clean {ends[0]:g} / halluc. {ends[1]:g}"
            if spec.rule == "sigmoid":
                text += f", centre {spec.threshold:g}, width {spec.temperature:g}"
            text += ")"
        if run_cfg.token_penalty.enable:
            text += f" + token penalty (beta {run_cfg.token_penalty.beta:g})"
        if run_cfg.token_clip.enable:
            tc = run_cfg.token_clip
            text += f" + token clip (halluc. tokens {tc.low:g} / {tc.high:g})"
        if run_cfg.clip_low_schedule.enable:
            cl = run_cfg.clip_low_schedule
            text += f" + clip_low {cl.rule} (clean {cl.low:g} / halluc. {cl.high:g})"
        return f"{text}; reward {reward_name(run_cfg)}"


def reward_name(cfg: DemoConfig) -> str:
    """The reward a run trains on, as a table names it."""
    if cfg.chair_weight == 0:
        return "CIDEr-D"
    weight = "" if cfg.chair_weight == 1 else f"{cfg.chair_weight:g} x "
    return f"CIDEr-D - {weight}CHAIR {cfg.chair_penalty}"


# The sigmoid rule is centred at CHAIR_i 0.25 (one wrong object among four mentions) rather
# than at the step's 1e-4: centred at 1e-4, a clean caption (CHAIR_i 0) sits on the middle of
# the sigmoid and gets the mean of the two bounds, so the variant would not be a graded rule.
GRID: tuple[StudyVariant, ...] = (
    StudyVariant("grpo-low", "grpo", fixed="low", family="grpo"),
    StudyVariant("grpo-high", "grpo", fixed="high", family="grpo"),
    StudyVariant("grpo-step", "grpo", {"rule": "step"}, family="schedule"),
    StudyVariant(
        "grpo-step-reversed",
        "grpo",
        {"rule": "step", "direction": "hallucinated_low"},
        family="schedule",
    ),
    StudyVariant("grpo-linear", "grpo", {"rule": "linear"}, family="schedule"),
    StudyVariant(
        "grpo-sigmoid",
        "grpo",
        {"rule": "sigmoid", "threshold": 0.25, "temperature": 0.1},
        family="schedule",
    ),
    StudyVariant("egpo-low", "egpo", fixed="low", family="egpo"),
    StudyVariant("egpo-step", "egpo", {"rule": "step"}, family="egpo"),
    StudyVariant("egpo_ratio-low", "egpo_ratio", fixed="low", family="egpo_ratio"),
    StudyVariant("egpo_ratio-step", "egpo_ratio", {"rule": "step"}, family="egpo_ratio"),
    StudyVariant("cider-grpo", "grpo", family="credit", chair_weight=0.0),
    StudyVariant(
        "token-penalty", "grpo", family="credit", sections={"token_penalty": {}}, chair_weight=0.0
    ),
    StudyVariant("token-penalty+seq", "grpo", family="credit", sections={"token_penalty": {}}),
    StudyVariant(
        "token-clip", "grpo", family="credit", sections={"token_clip": {}}, chair_weight=0.0
    ),
    StudyVariant("token-clip+seq", "grpo", family="credit", sections={"token_clip": {}}),
    StudyVariant(
        "clip-low", "grpo", family="credit", sections={"clip_low_schedule": {}}, chair_weight=0.0
    ),
    StudyVariant("clip-low+seq", "grpo", family="credit", sections={"clip_low_schedule": {}}),
)
REFERENCE = "grpo-low"

# Where hallucination credit is placed, from the same warm-up per seed: the sequence penalty
# (`REFERENCE`, GRPO on CIDEr-D minus the CHAIR count), the seed's per-sample clip_high rule,
# plain GRPO on CIDEr-D alone, and each token-level mechanism on CIDEr-D alone and beside the
# sequence penalty (`--variants credit`).
CREDIT: tuple[str, ...] = (
    REFERENCE,
    "grpo-step",
    *(v.key for v in GRID if v.family == "credit"),
)
PRESETS: dict[str, tuple[str, ...]] = {
    "credit": CREDIT,
    "mechanisms": tuple(v.key for v in GRID if v.family != "credit"),
}

# Where the clip acts on this world (docs/quickstart.md, the mechanism study): four mini-batches and
# two epochs per step give each rollout batch eight updates, and lr 2e-4 moves the tiny policy
# far enough per step for sampled-token ratios to pass 1.3. One torch thread: results depend on
# the thread count, and one thread per process leaves the second core to a second seed.
STUDY_DEFAULTS: dict[str, Any] = {
    "out": "runs/study",
    "lr": 2e-4,
    "num_minibatches": 4,
    "ppo_epochs": 2,
    "threads": 1,
}

# Training metrics averaged over a run's steps (a key missing at a step, e.g. no hallucinated
# sample in that batch, is left out of that step's average).
TRAINING_KEYS = (
    "entropy",
    "entropy/hallucinated",
    "entropy/clean",
    "entropy/hallucinated_tokens",
    "entropy/clean_tokens",
    "hallucinated_token_frac",
    "clip_frac_high",
    "clip_frac_low",
    "clip_frac_high/hallucinated",
    "clip_frac_high/clean",
    "clip_frac_low/hallucinated",
    "clip_frac_low/clean",
    "clip_high",
    "chair_i",
    "cider",
    "reward",
)
HELD_OUT_KEYS = ("chair_i", "chair_s", "recall", "cider", "length")
REWARD_TAIL = 10  # steps at the end over which the final training reward is averaged


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def run_summary(
    history: Sequence[Mapping[str, float]], held_out: Mapping[str, float]
) -> dict[str, float]:
    """One run's row: held-out metrics (`eval/*`) and training means over its steps (`train/*`).

    `train/reward_last` is the mean reward of the last `REWARD_TAIL` steps.
    """
    row = {f"eval/{k}": float(held_out[k]) for k in HELD_OUT_KEYS if k in held_out}
    for key in TRAINING_KEYS:
        row[f"train/{key}"] = _mean([h[key] for h in history if key in h])
    tail = [h["reward"] for h in history[-REWARD_TAIL:] if "reward" in h]
    row["train/reward_last"] = _mean(tail)
    return row


def run_study(cfg: DemoConfig, variants: Sequence[StudyVariant] = GRID) -> dict[str, Any]:
    """Run the grid for every seed of `cfg.seed_list()`; writes and returns the summary."""
    from entropyrl.rig.local.runner import MetricsLog, warm_start

    if not variants:
        raise ValueError("the study needs at least one variant")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(out / "metrics.jsonl")
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    for seed in cfg.seed_list():
        with warm_start(cfg, out, seed, log) as run:
            log.write("eval", 0, run.before, variant="warm-up", seed=seed)
            runs.append(_run_row(seed, "warm-up", "warm-up checkpoint", run.before, [], run.warmup))
            for variant in variants:
                run_cfg, name = variant.config(cfg)
                rl, after = run.rl(run_cfg, name)
                for step, metrics in enumerate(rl["history"]):
                    log.write("rl", step, metrics, variant=variant.key, seed=seed)
                log.write("eval", cfg.steps, after, variant=variant.key, seed=seed)
                runs.append(
                    _run_row(seed, variant.key, variant.label(cfg), after, rl["history"], rl)
                )
            control, held = run.control("cpu")  # the mean RL time of the seed (CPU time on CPU)
            log.write("eval", seed, held, variant=CONTROL, seed=seed)
            label = "control: warm-up continued, mean RL CPU time"
            runs.append(_run_row(seed, CONTROL, label, held, [], control))
        summary = _write_outputs(cfg, variants, runs, log.records, out, started)
    return summary


def _run_row(
    seed: int,
    key: str,
    label: str,
    held_out: Mapping[str, float],
    history: Sequence[Mapping[str, float]],
    phase: Mapping[str, Any],
) -> dict[str, Any]:
    row = {"seed": seed, "variant": key, "label": label, **run_summary(history, held_out)}
    row["cpu_seconds"] = float(phase["cpu_seconds"])
    row["wall_seconds"] = float(phase["seconds"])
    row["steps"] = int(phase["steps"]) if "steps" in phase else len(history)
    if not history:  # supervised phases have no rollouts: no training metrics to show
        row = {k: v for k, v in row.items() if not k.startswith("train/")}
    return row


def _stats(values: Sequence[float]) -> dict[str, float]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return {"mean": math.nan, "sd": math.nan, "n": 0}
    sd = statistics.stdev(finite) if len(finite) > 1 else math.nan
    return {"mean": statistics.fmean(finite), "sd": sd, "n": len(finite)}


def paired_interval(stats: Mapping[str, float], level: float = 0.95) -> list[float]:
    """The `level` t-interval [low, high] of a mean paired difference over n seeds.

    mean ± t_{(1+level)/2, n-1} · sd / sqrt(n): the seeds are the independent units (each
    its own warm-up and RL runs), and a paired difference removes what a seed shares across
    variants. NaN ends with fewer than two seeds.
    """
    from scipy.stats import t

    n, mean, sd = stats["n"], stats["mean"], stats["sd"]
    if n < 2 or not math.isfinite(sd):
        return [math.nan, math.nan]
    half = float(t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
    return [mean - half, mean + half]


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation over seeds per variant and metric, and paired differences.

    Returns `{"variants": {key: {"label", "seeds", metric: {"mean", "sd", "n"}}},
    "paired": {key: {metric: {"mean", "sd", "n", "same_sign", "beyond_noise", "ci95",
    "per_seed"}}}}`; `ci95` is `paired_interval`'s 95 % interval.
    A paired difference is this variant minus `REFERENCE` on the same seed (the same warm-up
    checkpoint); it counts as beyond seed noise when every seed's difference has the same sign
    and its mean is more than twice its standard error (sd / sqrt(n)).
    """
    by_variant: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_variant.setdefault(run["variant"], []).append(run)
    metrics = sorted(
        {k for run in runs for k, v in run.items() if "/" in k and isinstance(v, int | float)}
        | {"cpu_seconds", "steps"}
    )
    variants: dict[str, Any] = {}
    for key, rows in by_variant.items():
        entry: dict[str, Any] = {"label": rows[0]["label"], "seeds": [r["seed"] for r in rows]}
        for metric in metrics:
            if any(metric in r for r in rows):
                entry[metric] = _stats([r.get(metric, math.nan) for r in rows])
        variants[key] = entry
    paired: dict[str, Any] = {}
    reference = {r["seed"]: r for r in by_variant.get(REFERENCE, [])}
    for key, rows in by_variant.items():
        if key == REFERENCE or not reference:
            continue
        entry = {}
        for metric in metrics:
            diffs = {
                r["seed"]: r[metric] - reference[r["seed"]][metric]
                for r in rows
                if r["seed"] in reference
                and metric in r
                and metric in reference[r["seed"]]
                and math.isfinite(r[metric] - reference[r["seed"]][metric])
            }
            if not diffs:
                continue
            stats = _stats(list(diffs.values()))
            signs = {math.copysign(1.0, d) for d in diffs.values() if d != 0}
            same_sign = len(signs) == 1 and all(d != 0 for d in diffs.values())
            se = stats["sd"] / math.sqrt(stats["n"]) if stats["n"] > 1 else math.nan
            stats["same_sign"] = same_sign
            stats["beyond_noise"] = bool(
                same_sign and stats["n"] > 1 and abs(stats["mean"]) > 2 * se
            )
            stats["ci95"] = paired_interval(stats)
            stats["per_seed"] = diffs
            entry[metric] = stats
        paired[key] = entry
    return {"variants": variants, "paired": paired}


def _cell(stats: Mapping[str, Any] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not stats or not math.isfinite(stats["mean"]):
        return "n/a"
    text = f"{scale * stats['mean']:.{digits}f}"
    if math.isfinite(stats.get("sd", math.nan)):
        text += f" ± {scale * stats['sd']:.{digits}f}"
    return text


def _diff_cell(stats: Mapping[str, Any] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not stats:
        return "n/a"
    text = f"{scale * stats['mean']:+.{digits}f}"
    low, high = stats.get("ci95", (math.nan, math.nan))
    if math.isfinite(low) and math.isfinite(high):
        text += f" [{scale * low:+.{digits}f}, {scale * high:+.{digits}f}]"
    elif math.isfinite(stats.get("sd", math.nan)):
        text += f" ± {scale * stats['sd']:.{digits}f}"
    return text + (" *" if stats.get("beyond_noise") else "")


OUTCOME_COLUMNS = (
    ("eval/chair_i", "CHAIR_i %", 100.0),
    ("eval/chair_s", "CHAIR_s %", 100.0),
    ("eval/recall", "recall %", 100.0),
    ("eval/cider", "CIDEr-D", 1.0),
    ("train/reward_last", "reward (last 10 steps)", 1.0),
)
DYNAMICS_COLUMNS = (
    ("train/entropy", "entropy", 1.0),
    ("train/entropy/hallucinated", "entropy halluc.", 1.0),
    ("train/entropy/clean", "entropy clean", 1.0),
    ("train/entropy/hallucinated_tokens", "entropy halluc. tokens", 1.0),
    ("train/entropy/clean_tokens", "entropy other tokens", 1.0),
    ("train/clip_high", "mean clip_high", 1.0),
    ("train/clip_frac_high/hallucinated", "clip high % halluc.", 100.0),
    ("train/clip_frac_high/clean", "clip high % clean", 100.0),
    ("train/clip_frac_low/hallucinated", "clip low % halluc.", 100.0),
    ("train/clip_frac_low/clean", "clip low % clean", 100.0),
    ("train/chair_i", "CHAIR_i % (samples)", 100.0),
)
PAIRED_COLUMNS = (
    ("eval/chair_i", "Δ CHAIR_i (points)", 100.0),
    ("eval/chair_s", "Δ CHAIR_s (points)", 100.0),
    ("eval/recall", "Δ recall (points)", 100.0),
    ("eval/cider", "Δ CIDEr-D", 1.0),
    ("train/entropy", "Δ entropy", 1.0),
)


def _order(keys: Sequence[str]) -> list[str]:
    known = ["warm-up", *(v.key for v in GRID), CONTROL]
    return [k for k in known if k in keys] + [k for k in keys if k not in known]


def study_tables(aggregated: Mapping[str, Any]) -> str:
    """The study's markdown: outcome, training dynamics and paired differences."""
    variants = aggregated["variants"]
    keys = _order(list(variants))
    n = max((len(v["seeds"]) for v in variants.values()), default=0)

    def table(columns, source, cell, keep) -> str:
        rows = []
        for key in keys:
            if not keep(key):
                continue
            row = {"variant": variants[key]["label"]}
            for metric, header, scale in columns:
                row[header] = cell(source.get(key, {}).get(metric), scale)
            rows.append(row)
        return markdown_table(rows, [("variant", "variant")] + [(h, h) for _, h, _ in columns])

    outcome = table(OUTCOME_COLUMNS, variants, _cell, lambda k: True)
    dynamics = table(DYNAMICS_COLUMNS, variants, _cell, lambda k: k not in ("warm-up", CONTROL))
    paired = table(
        PAIRED_COLUMNS,
        aggregated["paired"],
        _diff_cell,
        lambda k: k in aggregated["paired"] and k != "warm-up",
    )
    reference = variants.get(REFERENCE, {}).get("label", REFERENCE)
    return "\n\n".join(
        [
            f"Held-out images, greedy decoding; mean ± standard deviation over {n} seeds.",
            outcome,
            "Sampled responses during RL (means over steps): token entropy at the sampling "
            "temperature, and the share of tokens clipped at 1 + clip_high (A > 0) or "
            "1 - clip_low (A < 0), for hallucinating (CHAIR_i > 0) and clean samples.",
            dynamics,
            f"Paired difference from {reference} (same seed and warm-up checkpoint): mean "
            "[95 % t-interval over seeds]; * = same sign in every seed and |mean| > 2 "
            "standard errors.",
            paired,
        ]
    )


PLOT_PANELS = (
    ("entropy", "token entropy of samples"),
    ("chair_i", "CHAIR_i of samples"),
    ("clip_frac_high", "tokens clipped at 1 + clip_high"),
    ("reward", "reward"),
)


def plot_study(records: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Entropy, CHAIR_i, high-side clip fraction and reward over RL steps, one line per
    variant (mean over seeds, 5-step moving average) -> PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = [r for r in records if r.get("phase") == "rl"]
    keys = _order(list(dict.fromkeys(r["variant"] for r in rl)))
    styles = {"grpo": "-", "schedule": "--", "egpo": "-.", "egpo_ratio": ":", "credit": "--"}
    family = {v.key: v.family for v in GRID}
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), squeeze=False)
    for ax, (metric, label) in zip(axes.flat, PLOT_PANELS):
        for index, key in enumerate(keys):
            per_step: dict[int, list[float]] = {}
            for r in rl:
                if r["variant"] == key and metric in r and math.isfinite(r[metric]):
                    per_step.setdefault(r["step"], []).append(r[metric])
            if not per_step:
                continue
            steps = sorted(per_step)
            means = [statistics.fmean(per_step[s]) for s in steps]
            ax.plot(
                steps,
                _moving_average(means),
                label=key,
                color=colors(index % 10),
                linestyle=styles.get(family.get(key, ""), "-"),
                linewidth=1.6,
            )
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _moving_average(values: Sequence[float], window: int = 5) -> list[float]:
    return [_mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _settings(cfg: DemoConfig) -> dict[str, Any]:
    keys = (
        "seeds", "steps", "warmup_steps", "lr", "warmup_lr", "prompts_per_step",
        "samples_per_prompt", "num_minibatches", "ppo_epochs", "temperature", "chair_weight",
        "chair_penalty", "noise_rate", "threads",
    )  # fmt: skip
    settings = {k: getattr(cfg, k) for k in keys}
    settings["ppo"] = cfg.ppo.to_dict()
    settings["clip_schedule"] = cfg.clip_schedule.to_dict()
    return settings


def _write_outputs(
    cfg: DemoConfig | None,
    variants: Sequence[StudyVariant] | None,
    runs: Sequence[Mapping[str, Any]],
    records: Sequence[Mapping[str, Any]],
    out: Path,
    started: float,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    aggregated = aggregate(runs)
    tables = study_tables(aggregated)
    summary = {
        "settings": dict(settings) if settings is not None else _settings(cfg),
        "variants": {v.key: v.label(cfg) for v in variants} if cfg and variants else {},
        "runs": list(runs),
        "aggregate": aggregated,
        "seconds": time.perf_counter() - started,
    }
    write_summary(out, summary, tables, heading="Ablation study")
    seeds = sorted({r["seed"] for r in runs})
    plot_study(
        records, out / "study.png", title=f"RL from one warm-up per seed ({len(seeds)} seeds: mean)"
    )
    return summary


def combine(folders: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    """Merge study folders (e.g. one per seed, run in parallel) into one report under `out`."""
    runs: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    for folder in map(Path, folders):
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        runs += [_nan_for_null(r) for r in summary["runs"]]
        settings = {**summary.get("settings", {}), **settings}
        with (folder / "metrics.jsonl").open(encoding="utf-8") as handle:
            records += [_nan_for_null(json.loads(line)) for line in handle if line.strip()]
    seeds = [r["seed"] for r in runs if r["variant"] == "warm-up"]
    if len(seeds) != len(set(seeds)):
        raise ValueError(f"combine: a seed appears in more than one folder: {sorted(seeds)}")
    settings["seeds"] = ",".join(str(s) for s in sorted(seeds))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "metrics.jsonl").open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json_dumps(record) + "\n")
    return _write_outputs(None, None, runs, records, out, time.perf_counter(), settings)


def _nan_for_null(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row or record as read back: null (a value not measured) is NaN again, as in a run."""
    return {k: math.nan if v is None else v for k, v in row.items()}


def main(argv: list[str] | None = None, prog: str = "python -m entropyrl.rig.local.study") -> int:
    """`python -m entropyrl.rig.local.study [demo options] [--variants K,...] [--combine DIR ...]`."""
    import argparse

    from chair_server.options import add_options, from_args

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Ablation of the clip schedule and the entropy guidance from one warm-up "
        "per seed, against an equal-CPU-time control. Writes summary.md/.json, metrics.jsonl "
        "and study.png under --out.",
    )
    add_options(parser, DemoConfig)
    parser.add_argument(
        "--variants",
        default="mechanisms",
        help="comma-separated grid variants, or a preset: mechanisms (the clip schedule and the "
        "entropy guidance), credit (where hallucination credit is placed); known variants: "
        + ", ".join(v.key for v in GRID)
        + " (default: %(default)s)",
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        metavar="DIR",
        help="merge finished study folders (e.g. one per seed) into --out instead of running",
    )
    parser.set_defaults(**STUDY_DEFAULTS)
    args = parser.parse_args(argv)
    if args.combine:
        combine(args.combine, args.out)
        print((Path(args.out) / "summary.md").read_text(encoding="utf-8"))
        return 0
    by_key = {v.key: v for v in GRID}
    wanted = [
        key
        for part in args.variants.split(",")
        if part.strip()
        for key in PRESETS.get(part.strip(), (part.strip(),))
    ]
    unknown = [k for k in wanted if k not in by_key]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(by_key)}")
    cfg = from_args(args, DemoConfig)
    from entropyrl.rig.local.interrupts import exit_on_sigterm

    exit_on_sigterm()
    run_study(cfg, [by_key[k] for k in wanted])
    print((Path(cfg.out) / "summary.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
