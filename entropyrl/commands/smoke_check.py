"""Checking a finished `--smoke` run: values, not only plumbing.

`check_run` reads what the run wrote under its folder (`metrics.jsonl` from verl's file logger,
`config.yaml`, the per-sample trace, the checkpoints) and fails unless:
- every step 1..`trainer.total_training_steps` has a finite policy loss and reward, and some
  group's advantages are not all zero;
- validation ran (its `val-core/*` metrics) and the last step's checkpoint was saved with the
  run's settings beside it;
- the rollout's log-probs equal the actor's on the same tokens (remove-padding and the CPU
  attention compute what generation computed);
- the estimator got what it needs: entropy for every sample (`egpo/entropy/missing == 0`) unless
  the config takes it away (rollout-correction bypass: then every sample is missing and the
  advantages are plain GRPO), the reference's log-probs for `maxent_grpo`;
- one step's advantages, computed again from the trace's rewards, groups, entropies and reference
  log-probs with verl's own `grpo` and each estimator's formula written out here, equal the
  trainer's;
- with the CHAIR schedule on, each sample's bound is the schedule's rule applied to its own
  CHAIR_i (the neutral bound where the service gave none), and both bounds occur in some step
  where CHAIR_i differs across samples.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entropyrl.data.io import read_records
from entropyrl.estimator_names import ENTROPY_ESTIMATORS

# Rollout (hf generate) vs actor log-probs on the same tokens, bfloat16 actor: a mean absolute
# probability difference far below what a leak across packed sequences gives (tenths).
ROLLOUT_PROBS_DIFF_MEAN = 0.02


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """verl file-logger rows `{"step": n, "data": {...}}`, one per step in step order. Rows of
    the same step are merged, a later value winning: a resumed run logs its validation before
    training at the step it resumed from, beside that step's training row."""
    rows: dict[int, dict[str, Any]] = {}
    for number, row in read_records(path):
        if not isinstance(row, dict) or "step" not in row or not isinstance(row.get("data"), dict):
            raise ValueError(f"{path}:{number}: expected {{'step': n, 'data': {{...}}}}")
        merged = rows.setdefault(row["step"], {**row, "data": {}})
        merged["data"].update(row["data"])
    return [rows[step] for step in sorted(rows)]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


STEP_LINE = (
    ("critic/score/mean", "reward"),
    ("chair/chair_i_mean", "chair_i"),
    ("clip/bound_mean", "bound"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/clip/frac_high", "clip_high"),
    ("egpo/entropy/seq_mean", "entropy"),
    ("timing_s/step", "s"),
)


def step_line(row: dict[str, Any]) -> str:
    """One line for a step: reward and CHAIR first, then the loss, the clip and the time (step 0:
    validation before training)."""
    parts = [f"step {row['step']}" if row["step"] else "before training"]
    for name, short in STEP_LINE:
        value = row["data"].get(name)
        if _finite(value):
            parts.append(f"{short}={float(value):.4g}")
    for name, value in sorted(row["data"].items()):
        kind = name.split("/")
        shown = kind[0] == "val-core" or (kind[0] == "val-aux" and "chair_i" in kind)
        if shown and "mean@" in name and _finite(value):
            parts.append(f"val {'/'.join(kind[2:-1])}={float(value):.4g}")
    return "  ".join(parts)


def summarize(rows: Sequence[dict[str, Any]]) -> str:
    return "\n".join(step_line(row) for row in rows)


# -- the estimators' formulas, written out independently of entropyrl.advantages --------------


def grpo_reference(scores: list[float], groups: list[Any], norm_by_std: bool) -> list[float]:
    """verl's own `compute_grpo_outcome_advantage` on one-token responses."""
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards = torch.tensor(scores, dtype=torch.float32).unsqueeze(1)
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=rewards,
        response_mask=torch.ones_like(rewards),
        index=np.array(groups, dtype=object),
        norm_adv_by_std_in_grpo=norm_by_std,
    )
    # verl gives a group of one r / (1 + eps); entropyrl gives it 0 (no baseline to compare to)
    sizes = defaultdict(int)
    for group in groups:
        sizes[group] += 1
    return [0.0 if sizes[g] == 1 else float(a) for g, a in zip(groups, advantages[:, 0])]


def segment(tokens: list[int], end_tag: list[int] | None, mode: str) -> tuple[int, int]:
    """[start, stop) of the tokens whose entropy counts: all of them, or those after the last
    `</think>` for mode `answer` (all of them when the tag is missing)."""
    if mode != "answer" or not end_tag:
        return 0, len(tokens)
    for start in range(len(tokens) - len(end_tag), -1, -1):
        if tokens[start : start + len(end_tag)] == end_tag:
            stop = len(tokens)
            return (start + len(end_tag), stop) if start + len(end_tag) < stop else (0, stop)
    return 0, len(tokens)


def expected_advantages(
    rows: list[dict[str, Any]], config: Any, end_tag: list[int] | None
) -> list[list[float]]:
    """Per-token advantages each row should have (one value repeated for sequence estimators)."""
    from omegaconf import OmegaConf

    get = lambda key, default=None: OmegaConf.select(config, key, default=default)  # noqa: E731
    name = get("algorithm.adv_estimator")
    scores = [row["score"] for row in rows]
    groups = [row["group"] for row in rows]
    base = grpo_reference(scores, groups, bool(get("algorithm.norm_adv_by_std_in_grpo", True)))
    lengths = [len(row["advantages"]) for row in rows]
    entropies = [row.get("entropy") for row in rows]
    missing = any(e is None for e in entropies)
    if name == "grpo" or (name in ENTROPY_ESTIMATORS and missing):
        return [[a] * n for a, n in zip(base, lengths)]
    mode = get("algorithm.entropy.mode", "answer")
    if name in ("egpo", "egpo_ratio"):
        means = []
        for row, tokens in zip(rows, entropies):
            start, stop = segment(row.get("response") or [], end_tag, mode)
            part = tokens[start:stop]
            means.append(sum(part) / len(part) if part else float("nan"))
    if name == "egpo":
        lam, alpha = get("algorithm.egpo_bonus.lam", 0.4), get("algorithm.egpo_bonus.alpha", 2.0)
        values = [
            a if math.isnan(h) else a + lam * min(h, abs(a) / alpha) for a, h in zip(base, means)
        ]
        return [[v] * n for v, n in zip(values, lengths)]
    if name == "egpo_ratio":
        low, high = (
            get("algorithm.egpo_ratio.lambda_min", 0.5),
            get("algorithm.egpo_ratio.lambda_max", 2.0),
        )
        eps = get("algorithm.egpo_ratio.entropy_epsilon", 1e-6)
        by_group = defaultdict(list)
        for g, h in zip(groups, means):
            if not math.isnan(h):
                by_group[g].append(h)
        values = []
        for a, g, h in zip(base, groups, means):
            if math.isnan(h):
                values.append(a)
                continue
            mean = sum(by_group[g]) / len(by_group[g])
            values.append(a * min(max(mean / (h + eps), low), high))
        return [[v] * n for v, n in zip(values, lengths)]
    if name == "entropy_adv":
        alpha, kappa = (
            get("algorithm.entropy_adv.alpha", 0.4),
            get("algorithm.entropy_adv.kappa", 2.0),
        )
        return [
            [a + min(alpha * h, abs(a) / kappa) for h in tokens]
            for a, tokens in zip(base, entropies)
        ]
    if name == "maxent_grpo":
        tau, beta = get("algorithm.maxent.tau", 1.0), get("algorithm.maxent.beta", 0.1)
        temperature = get("algorithm.maxent.temperature", 1.0)
        if get("algorithm.maxent.source", "rewards") != "rewards":
            raise NotImplementedError("the check writes out maxent_grpo for source=rewards only")
        logits = [
            (score / temperature + beta * sum(row["ref_log_prob"])) / (tau + beta)
            for score, row in zip(scores, rows)
        ]
        members = defaultdict(list)
        for i, g in enumerate(groups):
            members[g].append(i)
        values = [0.0] * len(rows)
        for indices in members.values():
            top = max(logits[i] for i in indices)
            weights = [math.exp(logits[i] - top) for i in indices]
            total = sum(weights)
            for i, w in zip(indices, weights):
                values[i] = len(indices) * w / total - 1.0
        return [[v] * n for v, n in zip(values, lengths)]
    raise ValueError(f"the smoke check has no formula for estimator {name!r}")


# -- the checks -------------------------------------------------------------------------------


def check_metrics(rows: Sequence[dict[str, Any]], config: Any) -> list[str]:
    from omegaconf import OmegaConf

    from entropyrl.verl.rewards import CAPTION_REWARD_NAME

    get = lambda key, default=None: OmegaConf.select(config, key, default=default)  # noqa: E731
    problems = []
    total = int(get("trainer.total_training_steps"))
    every = rows
    rows = [row for row in rows if row["step"] >= 1]  # step 0: validation before training
    steps = [row["step"] for row in rows]
    if steps != list(range(1, total + 1)):
        problems.append(f"expected one row per step 1..{total}, got steps {steps}")
    estimator = get("algorithm.adv_estimator")
    correction = get("algorithm.rollout_correction.bypass_mode", False)
    schedule = bool(get("algorithm.clip_schedule.enable", False))
    caption = get("reward.custom_reward_function.name", None) == CAPTION_REWARD_NAME
    for row in rows:
        data, step = row["data"], row["step"]
        required = ["actor/pg_loss", "critic/score/mean"]
        if not correction:  # in bypass mode the old log-probs are the rollout's: nothing to compare
            required.append("training/rollout_probs_diff_mean")
        if schedule:
            required += ["clip/bound_mean", "clip/bound_min", "clip/bound_max"]
            required += ["actor/clip/frac_high", "actor/clip/frac_low", "chair/fallback_samples"]
        if caption:  # the reward's parts beside verl's critic/score
            required += ["reward/cider/mean", "reward/words/mean"]
        if estimator in ENTROPY_ESTIMATORS:
            required.append("egpo/entropy/missing")
        if estimator == "egpo_ratio":
            required += ["egpo/weight/mean", "egpo/ratio/max"]
        if estimator == "maxent_grpo":
            required += ["maxent/target_entropy", "maxent/weight/max"]
        for name in required:
            if not _finite(data.get(name)):
                problems.append(f"step {step}: {name} is {data.get(name)!r}, expected a number")
        missing = data.get("egpo/entropy/missing")
        if estimator in ENTROPY_ESTIMATORS and _finite(missing) and not correction and missing:
            problems.append(
                f"step {step}: {missing:g} samples reached the estimator without entropy"
            )
        diff = data.get("training/rollout_probs_diff_mean")
        if _finite(diff) and diff > ROLLOUT_PROBS_DIFF_MEAN:
            problems.append(
                f"step {step}: the actor's probabilities differ from the rollout's by {diff:.3g} "
                f"on average (more than {ROLLOUT_PROBS_DIFF_MEAN}): the training forward pass "
                "does not compute what generation computed"
            )
    spread = [
        row["data"].get("critic/advantages/max", 0.0)
        - row["data"].get("critic/advantages/min", 0.0)
        for row in rows
    ]
    if rows and not any(_finite(value) and value > 0 for value in spread):
        problems.append("every advantage is zero: no group's reward varied, nothing was learned")
    validation = [k for row in every for k in row["data"] if k.startswith("val-core/")]
    if get("trainer.test_freq", -1) > 0 and not validation:
        problems.append("no validation metrics (val-core/*): validation did not run")
    for row in every:
        for name, value in row["data"].items():
            if name.startswith("val-") and isinstance(value, float) and not math.isfinite(value):
                problems.append(f"step {row['step']}: {name} is {value}")
    return problems


def check_checkpoint(config: Any, steps: int, *, ours: bool = True) -> list[str]:
    from entropyrl.verl.checkpoints import SETTINGS_FILE, checkpoint_folder, latest_step

    folder = checkpoint_folder(config)
    if config.trainer.save_freq <= 0:
        return []
    latest = latest_step(folder)
    if latest != steps:
        return [f"the last checkpoint in {folder} is {latest}, expected step {steps}"]
    problems = []
    if not (folder / f"global_step_{steps}" / "actor").is_dir():
        problems.append(f"{folder}/global_step_{steps}/actor was not written")
    if ours and not (folder / SETTINGS_FILE).is_file():
        problems.append(f"{folder}/{SETTINGS_FILE} (the run's settings) was not written")
    return problems


def _end_tag(config: Any) -> list[int] | None:
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(config.actor_rollout_ref.model.path))
    except Exception:  # no tokenizer to read: the answer segment falls back to the response
        return None
    return tokenizer.encode("</think>", add_special_tokens=False)


def check_trace(trace_rows: list[dict[str, Any]], config: Any) -> list[str]:
    """The last traced step's advantages against the formulas; the clip bounds against the
    schedule's rule (every step)."""
    from omegaconf import OmegaConf

    problems: list[str] = []
    rows = [row for row in trace_rows if not row.get("padding")]
    if not rows:
        return ["the run wrote no per-sample trace (ENTROPYRL_TRACE_DIR)"]
    last = max(row["step"] for row in rows)
    # a step traced by a killed run and again by the run that resumed it: the latter's rows
    latest_run = [row.get("run") for row in rows if row["step"] == last][-1]
    step_rows = [row for row in rows if row["step"] == last and row.get("run") == latest_run]
    expected = expected_advantages(step_rows, config, _end_tag(config))
    worst = 0.0
    for row, values in zip(step_rows, expected):
        got = row["advantages"]
        if len(got) != len(values):
            problems.append(f"step {last}: {len(got)} advantages for {len(values)} tokens")
            continue
        for a, b in zip(got, values):
            worst = max(worst, abs(a - b) / max(1.0, abs(b)))
    if worst > 1e-4:
        problems.append(
            f"step {last}: advantages differ from the formula's by up to {worst:.3g} (relative)"
        )
    spec = OmegaConf.select(config, "algorithm.clip_schedule", default=None)
    if spec is not None and spec.get("enable", False):
        problems += _check_bounds(rows, spec)
    return problems


def _rule(chair: float | None, spec: Any) -> float:
    low, high = float(spec.get("low", 0.3)), float(spec.get("high", 0.5))
    neutral = spec.get("neutral")
    neutral = low if neutral is None else float(neutral)
    if chair is None:
        return neutral
    rule = spec.get("rule", "step")
    if rule != "step":
        return float("nan")  # continuous rules: only the range is checked
    hallucinated = chair >= float(spec.get("threshold", 1e-4))
    if spec.get("direction", "hallucinated_high") == "hallucinated_high":
        return high if hallucinated else low
    return low if hallucinated else high


def _check_bounds(rows: list[dict[str, Any]], spec: Any) -> list[str]:
    problems = []
    low, high = float(spec.get("low", 0.3)), float(spec.get("high", 0.5))
    both_seen = False
    by_step = defaultdict(list)
    for row in rows:
        by_step[(row["step"], row.get("run"))].append(row)
    varied = False
    for (step, _), step_rows in sorted(by_step.items(), key=lambda item: item[0][0]):
        for row in step_rows:
            want, got = _rule(row["chair_i"], spec), row["clip_high"]
            if got is None:
                problems.append(f"step {step}: a sample reached the loss without a bound")
                break
            if math.isnan(want):
                if not min(low, high) - 1e-6 <= got <= max(low, high) + 1e-6:
                    problems.append(f"step {step}: bound {got} outside [{low}, {high}]")
                    break
            elif abs(got - want) > 1e-6:
                problems.append(
                    f"step {step}: CHAIR_i {row['chair_i']} got bound {got}, the rule gives {want}"
                )
                break
        scored = {_rule(row["chair_i"], spec) for row in step_rows if row["chair_i"] is not None}
        varied |= len(scored) > 1
        both_seen |= {round(row["clip_high"], 6) for row in step_rows} >= {
            round(low, 6),
            round(high, 6),
        }
    if varied and not both_seen:
        problems.append(
            "CHAIR_i differed across samples but the two bounds never occurred together"
        )
    return problems


def check_run(settings: Any, out: Path) -> int:
    """Check the run in `out`; print the steps and the verdict. 0 when it is good."""
    from omegaconf import OmegaConf

    from entropyrl.commands.doctor import expected_verl_messages
    from entropyrl.verl import trace

    metrics, config_path = out / "metrics.jsonl", out / "config.yaml"
    if not config_path.is_file():  # verl's own trainer writes none: the config Hydra composed
        config_path = out / "hydra" / ".hydra" / "config.yaml"
    if not metrics.is_file() or not config_path.is_file():
        print(f"smoke check: {out} has no metrics.jsonl or config.yaml (the run did not train)")
        return 1
    rows = read_metrics(metrics)
    config = OmegaConf.load(config_path)
    problems = check_metrics(rows, config)
    ranks = OmegaConf.select(config, "trainer.n_gpus_per_node")
    if ranks != settings.ranks or OmegaConf.select(config, "trainer.nnodes") != 1:
        problems.append(f"the run had {ranks} rank(s), expected {settings.ranks}")
    # verl's own trainer (plugin_overhead's baseline) writes no trace and no run settings
    ours = OmegaConf.select(config, "trainer.v1.trainer_mode") == "entropyrl"
    problems += check_checkpoint(config, int(config.trainer.total_training_steps), ours=ours)
    if ours:
        with expected_verl_messages(verbose=False):  # verl's import warnings: nothing to say
            problems += check_trace(trace.read(out / "trace", "driver"), config)
    if problems:
        print(summarize(rows))
        print("smoke check FAILED:\n  " + "\n  ".join(problems))
        return 1
    trained = sum(1 for row in rows if row["step"] >= 1)
    print(f"smoke check passed: {trained} steps in {metrics}")
    return 0
