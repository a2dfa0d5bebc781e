"""Checking a finished `--smoke` run: values, not only plumbing.

`check_run` reads what the run wrote under its folder (`metrics.jsonl` from verl's file logger,
`config.yaml`, the per-sample trace, the checkpoints) and fails, with one line naming each
problem, unless:

- every training step 1..`trainer.total_training_steps` has its own row of training metrics
  (a row that holds only validation metrics is not a training step) with a finite policy loss
  and reward, and the parts its recipe's reward reports;
- validation ran (its `val-core/*` metrics) and the last step's checkpoint was saved with the
  run's settings beside it;
- the rollout's log-probs equal the actor's on the same tokens (remove-padding and the CPU
  attention compute what generation computed);
- every training step's advantages, computed again from the trace's rewards, groups, entropies and
  reference log-probs with GRPO and each estimator's formula written out here (independently of
  `entropyrl.core.advantages` and of verl), equal the trainer's, sample by sample; a sample without
  entropy keeps its GRPO advantage, and the entropy-guided estimators must get entropy for every
  sample unless the config takes it away (rollout-correction bypass);
- the caption reward's score is CIDEr-D minus the configured CHAIR penalty plus the recall bonus,
  recomposed from the parts it reported for each sample;
- with the CHAIR schedule on, each sample's bound is the schedule's rule (step, linear or sigmoid,
  either direction) applied to its own CHAIR_i, the neutral bound where the service gave none;
- with the per-sample clip loss, every sample reached the actor's loss with its own bound, advantages and old log-probs: each
  micro-batch row the loss traced, whatever mini-batch, rank and balance_batch position it got,
  carries the values the driver computed for that sample, and every sample of a step reached it;
- every step's logged metrics of the families a dashboard reads (`critic/*`, `reward/*`,
  `chair/*`, `clip/bound_*`, `egpo/entropy/*`, the loss's clip fractions) equal their
  recomputation from the step's samples (`entropyrl.rig.smoke.step_metrics`);
- with the `hf` rollout, every generation used the weights the actor sent last: the weight-sync
  probe (`entropyrl.rig.trace`) compares the fingerprint of each tensor the rollout generated
  with against the one the actor sent, so a rollout that kept older weights fails even when its
  probabilities stay close to the actor's (a tiny learning rate moves them by less than rounding).

Each check must also be able to fail on this run: a run whose groups all had equal rewards
(every advantage 0, whatever the estimator), whose entropy-guided advantages never differed from
GRPO's, whose CHAIR_i never fell on both sides of the schedule's threshold (a constant bound would
pass), or whose rollout never generated with updated weights, "could not be judged", and that is
a failure too. `CHAIR_OPTIONAL=1` (the documented fallback when the service is down) accepts a
run in which no sample got a CHAIR score: every bound is then checked to be the neutral one.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entropyrl.core.estimator_names import ENTROPY_ESTIMATORS
from entropyrl.data.io import read_records
from entropyrl.rig.smoke.step_metrics import check_step_metrics
from entropyrl.rig.trace import HALLUCINATED_KEY

# Rollout (hf generate) vs actor log-probs on the same tokens, bfloat16 actor: a mean absolute
# probability difference far below what a leak across packed sequences gives (tenths).
ROLLOUT_PROBS_DIFF_MEAN = 0.02
# Advantages, bounds and rewards recomputed here against the trainer's (float32): relative error.
TOLERANCE = 1e-4
GRPO_EPS = 1e-6  # verl's and entropyrl's epsilon added to the group's std
# Metrics only a training step logs; a row without them is validation only.
TRAINING_KEYS = ("actor/pg_loss", "critic/score/mean")
CAPTION_PARTS = ("cider", "chair_i", "chair_s", "recall", "words")


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


def is_training_row(row: dict[str, Any]) -> bool:
    """Whether a metrics row holds a training step's metrics (not only validation's)."""
    return any(name in row["data"] for name in TRAINING_KEYS)


STEP_LINE = (
    ("critic/score/mean", "reward"),
    ("chair/chair_i_mean", "chair_i"),
    ("clip/bound_mean", "bound"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/clip/frac_high", "clip_high"),
    ("egpo/entropy/seq_mean", "entropy"),
    ("timing_s/step", "s"),
)


def training_metrics(rows: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each training step's metrics (its row's data) by step."""
    return {row["step"]: row["data"] for row in rows if is_training_row(row)}


def step_line(row: dict[str, Any]) -> str:
    """One line for a step: reward and CHAIR first, then the loss, the clip and the time (step 0:
    validation before training)."""
    parts = [f"step {row['step']}" if row["step"] else "before training"]
    for name, short in STEP_LINE:
        value = row["data"].get(name)
        if _finite(value):
            parts.append(f"{short}={float(value):.4g}")
    lost = row["data"].get("rollout/lost_samples")
    if _finite(lost) and lost:
        parts.append(f"lost={lost:g}")
    for name, value in sorted(row["data"].items()):
        kind = name.split("/")
        shown = kind[0] == "val-core" or (kind[0] == "val-aux" and "chair_i" in kind)
        if shown and "mean@" in name and _finite(value):
            parts.append(f"val {'/'.join(kind[2:-1])}={float(value):.4g}")
    return "  ".join(parts)


def summarize(rows: Sequence[dict[str, Any]]) -> str:
    return "\n".join(step_line(row) for row in rows)


def _getter(config: Any):
    from omegaconf import OmegaConf

    return lambda key, default=None: OmegaConf.select(config, key, default=default)


# -- the formulas, written out independently of entropyrl.core.advantages and of verl --------------


def grpo_reference(
    scores: list[float], groups: list[Any], norm_by_std: bool, *, singleton: str = "zero"
) -> list[float]:
    """A_i = (r_i - mean_g) / (std_g + 1e-6), std unbiased (n - 1), per group g.

    A group of one has no baseline: entropyrl's estimators give it 0 (`singleton="zero"`); verl's
    own `grpo` gives r / (1 + eps) (`singleton="verl"`: mean 0, std 1).
    """
    members: dict[Any, list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        members[group].append(i)
    out = [0.0] * len(scores)
    for indices in members.values():
        values = [float(scores[i]) for i in indices]
        n = len(values)
        if n == 1:
            out[indices[0]] = values[0] / (1.0 + GRPO_EPS) if singleton == "verl" else 0.0
            continue
        mean = sum(values) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        for i, value in zip(indices, values):
            out[i] = (value - mean) / (std + GRPO_EPS) if norm_by_std else value - mean
    return out


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


def sequence_entropy(row: dict[str, Any], end_tag: list[int] | None, mode: str) -> float | None:
    """H_i: the mean token entropy over the row's segment; None without entropy or tokens."""
    tokens = row.get("entropy")
    if tokens is None:
        return None
    start, stop = segment(row.get("response") or [], end_tag, mode)
    part = [h for h in tokens[start:stop] if h is not None and math.isfinite(h)]
    return sum(part) / len(part) if part else None


def _group_ranks(scores: list[float], indices: list[int]) -> dict[int, float]:
    """Rank of each member of one group, 0 for the best score, tied scores their mean rank."""
    ordered = sorted(indices, key=lambda i: -scores[i])
    ranks: dict[int, float] = {}
    start = 0
    while start < len(ordered):
        stop = start
        while stop + 1 < len(ordered) and scores[ordered[stop + 1]] == scores[ordered[start]]:
            stop += 1
        for position in range(start, stop + 1):
            ranks[ordered[position]] = (start + stop) / 2
        start = stop + 1
    return ranks


def expected_advantages(
    rows: list[dict[str, Any]], config: Any, end_tag: list[int] | None
) -> tuple[list[list[float]], list[list[float]]]:
    """(the per-token advantages each row of one step should have under the config's estimator
    and, with `algorithm.token_penalty` on, its -beta on each token the row's
    `hallucinated_tokens` marks; the plain GRPO advantages of the same rows) for `rows` of one
    step; a row without entropy keeps its GRPO advantage under the entropy-guided estimators.
    The settings (and their defaults) are read through `entropyrl.core.specs`; the formulas are
    written out here."""
    from entropyrl.core.specs import algorithm_specs

    expected, baseline = _estimator_advantages(rows, config, end_tag)
    penalty = algorithm_specs(_getter(config)("algorithm")).token_penalty
    if not penalty.enable:
        return expected, baseline
    moved = []
    for row, want in zip(rows, expected):
        marks = row.get(HALLUCINATED_KEY) or [0.0] * len(want)
        if len(marks) != len(want):
            marks = [0.0] * len(want)  # check_token_credit names the row
        moved.append([a - penalty.beta * float(m) for a, m in zip(want, marks)])
    return moved, baseline


def _estimator_advantages(
    rows: list[dict[str, Any]], config: Any, end_tag: list[int] | None
) -> tuple[list[list[float]], list[list[float]]]:
    """`expected_advantages` before the token penalty."""
    from entropyrl.core.specs import algorithm_specs

    get = _getter(config)
    specs = algorithm_specs(get("algorithm"))
    name = get("algorithm.adv_estimator")
    scores = [row["score"] for row in rows]
    groups = [row["group"] for row in rows]
    norm = bool(get("algorithm.norm_adv_by_std_in_grpo", True))
    singleton = "verl" if name == "grpo" else "zero"
    base = grpo_reference(scores, groups, norm, singleton=singleton)
    lengths = [len(row["advantages"]) for row in rows]
    baseline = [[a] * n for a, n in zip(base, lengths)]
    if name == "grpo":
        return baseline, baseline
    if name in ("egpo", "egpo_ratio"):
        means = [sequence_entropy(row, end_tag, specs.entropy.mode) for row in rows]
    if name == "egpo":
        lam, alpha = specs.egpo_bonus.lam, specs.egpo_bonus.alpha
        values = [a if h is None else a + lam * min(h, abs(a) / alpha) for a, h in zip(base, means)]
        return [[v] * n for v, n in zip(values, lengths)], baseline
    if name == "egpo_ratio":
        low, high = specs.egpo_ratio.lambda_min, specs.egpo_ratio.lambda_max
        eps = specs.egpo_ratio.entropy_epsilon
        by_group: dict[Any, list[float]] = defaultdict(list)
        for group, h in zip(groups, means):
            if h is not None:
                by_group[group].append(h)
        values = []
        for a, group, h in zip(base, groups, means):
            if h is None:
                values.append(a)
                continue
            mean = sum(by_group[group]) / len(by_group[group])
            values.append(a * min(max(mean / (h + eps), low), high))
        return [[v] * n for v, n in zip(values, lengths)], baseline
    if name == "entropy_adv":
        alpha, kappa = specs.entropy_adv.alpha, specs.entropy_adv.kappa
        expected = []
        for a, row, n in zip(base, rows, lengths):
            tokens = row.get("entropy")
            if tokens is None:
                expected.append([a] * n)
                continue
            expected.append([a + min(alpha * (h or 0.0), abs(a) / kappa) for h in tokens])
        return expected, baseline
    if name == "maxent_grpo":
        spec = specs.maxent
        members: dict[Any, list[int]] = defaultdict(list)
        for i, group in enumerate(groups):
            members[group].append(i)
        values = [0.0] * len(rows)
        for indices in members.values():
            if spec.source == "ranks":
                ranks = _group_ranks(scores, indices)
                target = {i: -ranks[i] / spec.temperature for i in indices}
            else:
                target = {i: scores[i] / spec.temperature for i in indices}
            logits = {
                i: (target[i] + spec.beta * sum(rows[i]["ref_log_prob"])) / (spec.tau + spec.beta)
                for i in indices
            }
            top = max(logits.values())
            weights = {i: math.exp(logits[i] - top) for i in indices}
            total = sum(weights.values())
            for i in indices:
                values[i] = len(indices) * weights[i] / total - 1.0
        return [[v] * n for v, n in zip(values, lengths)], baseline
    raise ValueError(f"the smoke check has no formula for estimator {name!r}")


def clip_rule(chair: float | None, spec: Any) -> float:
    """The bound the clip schedule `spec` (an `algorithm.clip_schedule` mapping; its defaults
    read through `entropyrl.core.specs`) gives a sample with CHAIR_i `chair` (None: not scored)."""
    from entropyrl.core.specs import ClipScheduleSpec

    if not isinstance(spec, ClipScheduleSpec):
        spec = ClipScheduleSpec.from_mapping(spec)
    if chair is None:
        return spec.low if spec.neutral is None else spec.neutral
    if spec.rule == "step":
        share = 1.0 if chair >= spec.threshold else 0.0
    elif spec.rule == "linear":
        share = min(max((chair - spec.threshold) / (spec.saturation - spec.threshold), 0.0), 1.0)
    elif spec.rule == "sigmoid":
        share = 1.0 / (1.0 + math.exp(-(chair - spec.threshold) / spec.temperature))
    else:
        raise ValueError(f"the smoke check has no formula for clip rule {spec.rule!r}")
    start, end = (spec.low, spec.high)
    if spec.direction != "hallucinated_high":
        start, end = spec.high, spec.low
    return start + (end - start) * share


def caption_score(parts: dict[str, Any], reward_kwargs: Any) -> float:
    """The caption reward recomposed from its parts: CIDEr-D, and where CHAIR scored the caption
    the recall bonus minus the CHAIR penalty (its CHAIR_i, or its count of hallucinated
    mentions with `chair_penalty: count`)."""
    score = float(parts["cider"])
    if not parts.get("chair_ok"):
        return score
    weight = float(reward_kwargs.get("chair_weight", 0.0) or 0.0)
    recall_weight = float(reward_kwargs.get("recall_weight", 0.0) or 0.0)
    count = reward_kwargs.get("chair_penalty", "fraction") == "count"
    penalty = float(parts["hallucinated"] if count else parts["chair_i"])
    return score + recall_weight * float(parts["recall"]) - weight * penalty


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(1.0, abs(b))


# -- the checks -------------------------------------------------------------------------------


def check_metrics(
    rows: Sequence[dict[str, Any]], config: Any, *, chair_optional: bool = False
) -> list[str]:
    """Problems of the metrics rows (`read_metrics`) of a run with this config."""
    from entropyrl.verl.rewards import CAPTION_REWARD_NAME

    get = _getter(config)
    problems = []
    total = int(get("trainer.total_training_steps"))
    every = list(rows)
    training = [row for row in every if is_training_row(row)]
    steps = [row["step"] for row in training]
    for row in every:
        if row["step"] >= 1 and not is_training_row(row) and row["step"] <= total:
            problems.append(
                f"step {row['step']}: only validation metrics, no training metrics "
                f"({', '.join(TRAINING_KEYS)}): this row is not a training step"
            )
        if row["step"] < 1 and is_training_row(row):
            problems.append(f"step {row['step']}: training metrics before step 1")
    if steps != list(range(1, total + 1)):
        problems.append(f"expected one training row per step 1..{total}, got steps {steps}")
    estimator = get("algorithm.adv_estimator")
    correction = get("algorithm.rollout_correction.bypass_mode", False)
    schedule = bool(get("algorithm.clip_schedule.enable", False))
    caption = get("reward.custom_reward_function.name", None) == CAPTION_REWARD_NAME
    for row in training:
        data, step = row["data"], row["step"]
        required = ["actor/pg_loss", "critic/score/mean"]
        if not correction:  # in bypass mode the old log-probs are the rollout's: nothing to compare
            required.append("training/rollout_probs_diff_mean")
        if schedule:
            required += ["clip/bound_mean", "clip/bound_min", "clip/bound_max"]
            required += ["actor/clip/frac_high", "actor/clip/frac_low", "chair/fallback_samples"]
        if caption:  # the reward's parts beside verl's critic/score
            required += ["reward/cider/mean", "reward/words/mean"]
            if not chair_optional:
                required += ["reward/chair_s/mean", "reward/recall/mean", "chair/chair_i_mean"]
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
        for row in training
    ]
    if training and not any(_finite(value) and value > 0 for value in spread):
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
    from entropyrl.verl.checks.checkpoints import SETTINGS_FILE, checkpoint_folder, latest_step

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
    """The token ids of `</think>` in the run's tokenizer (its `tokenizer.json`, read by the
    `tokenizers` library: no torch or transformers import); None without one."""
    try:
        from tokenizers import Tokenizer

        path = Path(str(config.actor_rollout_ref.model.path)) / "tokenizer.json"
        return Tokenizer.from_file(str(path)).encode("</think>", add_special_tokens=False).ids
    except Exception:  # no tokenizer to read: the answer segment falls back to the response
        return None


def read_trace(folder: Path, prefix: str) -> list[dict[str, Any]]:
    """Every row of the trace files `folder/<prefix>*.jsonl` (`entropyrl.rig.trace` writes them;
    read here without importing torch)."""
    import json

    rows = []
    for path in sorted(folder.glob(f"{prefix}*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def _steps_of(rows: list[dict[str, Any]]) -> list[tuple[int, Any, list[dict[str, Any]]]]:
    """The trace's real rows as (step, run, rows) in step order; a step traced by a killed run
    and again by the run that resumed it is checked for each run on its own rows."""
    by_step: dict[tuple[int, Any], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_step[(row["step"], row.get("run"))].append(row)
    return [(step, run, group) for (step, run), group in sorted(by_step.items(), key=_order)]


def _order(item: tuple[tuple[int, Any], list]) -> tuple[int, str]:
    return item[0][0], str(item[0][1])


def check_advantages(
    rows: list[dict[str, Any]], config: Any, end_tag: list[int] | None
) -> list[str]:
    """Every traced step's advantages against the formulas, sample by sample."""
    get = _getter(config)
    name = get("algorithm.adv_estimator")
    bypass = bool(get("algorithm.rollout_correction.bypass_mode", False))
    wants_entropy = name in ENTROPY_ESTIMATORS and not bypass
    problems: list[str] = []
    judged = 0
    for step, _, step_rows in _steps_of(rows):
        lacking = sum(1 for row in step_rows if row.get("entropy") is None)
        if wants_entropy and lacking:
            problems.append(
                f"step {step}: {lacking} of {len(step_rows)} samples reached the estimator "
                "without entropy"
            )
        expected, baseline = expected_advantages(step_rows, config, end_tag)
        worst, worst_base, distinct, moved = 0.0, 0.0, False, False
        for row, want, base in zip(step_rows, expected, baseline):
            got = row["advantages"]
            if len(got) != len(want):
                problems.append(f"step {step}: {len(got)} advantages for {len(want)} tokens")
                continue
            worst = max([worst, *(_relative(a, b) for a, b in zip(got, want))])
            worst_base = max([worst_base, *(_relative(a, b) for a, b in zip(got, base))])
            distinct |= any(_relative(a, b) > TOLERANCE for a, b in zip(want, base))
            moved |= any(abs(a) > TOLERANCE for a in want)
        if worst > TOLERANCE:
            line = (
                f"step {step}: the advantages differ from {name}'s formula by up to {worst:.3g} "
                "(relative)"
            )
            if distinct and worst_base <= TOLERANCE:
                line += ": they are plain GRPO's, the estimator's own term was not applied"
            problems.append(line)
        # a step can tell a wrong estimator from a right one only where they give different
        # advantages: GRPO's for the entropy-guided estimators, all zeros for the others
        judged += distinct if wants_entropy else moved
    if rows and not judged:
        what = (
            f"no step's {name} advantages differed from plain GRPO's (equal rewards in every "
            "group, or no entropy)"
            if wants_entropy
            else "every group of every step had equal rewards (all advantages 0)"
        )
        problems.append(f"could not judge the advantages: {what}; a wrong estimator would pass")
    return problems


def check_token_credit(rows: list[dict[str, Any]], config: Any) -> list[str]:
    """With a token mechanism on, each step's hallucinated-token mask against what CHAIR said
    of the caption: a clean caption (no span) has no marked token, a caption with mentions has
    at least one per step of them, the spans are as many as CHAIR's count of hallucinated
    mentions, and some step marks a token (else a mask that is never set would pass)."""
    import json

    from entropyrl.core.specs import algorithm_specs

    specs = algorithm_specs(_getter(config)("algorithm"))
    if not (specs.token_penalty.enable or specs.token_clip.enable):
        return []
    problems: list[str] = []
    marked_any = False
    for row in rows:
        where = f"step {row['step']}"
        marks = row.get(HALLUCINATED_KEY)
        if marks is None or len(marks) != len(row["advantages"]):
            problems.append(f"{where}: a sample carries no hallucinated-token mask of its length")
            break
        parts = row.get("reward_parts") or {}
        spans = parts.get("hallucinated_spans")
        marked = sum(1 for m in marks if m)
        marked_any |= marked > 0
        if spans is None:
            if marked:
                problems.append(f"{where}: a caption CHAIR did not score has marked tokens")
                break
            continue
        found = json.loads(spans)
        count = parts.get("hallucinated")
        if isinstance(count, int | float) and count == count and len(found) != int(count):
            problems.append(
                f"{where}: {len(found)} hallucinated spans for {int(count)} hallucinated mentions"
            )
            break
        if bool(found) != bool(marked):
            problems.append(
                f"{where}: a caption with {len(found)} hallucinated mention(s) has {marked} "
                "marked token(s)"
            )
            break
    if rows and not marked_any and not problems:
        problems.append("could not judge the token mechanisms: no step marked a hallucinated token")
    return problems


def check_rewards(rows: list[dict[str, Any]], config: Any) -> list[str]:
    """The caption reward's score of every sample against its recomposition from its parts."""
    from entropyrl.verl.rewards import CAPTION_REWARD_NAME

    get = _getter(config)
    if get("reward.custom_reward_function.name", None) != CAPTION_REWARD_NAME:
        return []
    kwargs = get("reward.custom_reward_function.reward_kwargs", {}) or {}
    problems = []
    for step, _, step_rows in _steps_of(rows):
        for row in step_rows:
            parts = row.get("reward_parts")
            absent = [p for p in CAPTION_PARTS if not isinstance(parts, dict) or p not in parts]
            if absent:
                problems.append(f"step {step}: the caption reward reported no {', '.join(absent)}")
                break
            try:
                want = caption_score(parts, kwargs)
            except (KeyError, TypeError, ValueError) as error:
                problems.append(f"step {step}: the reward's parts do not recompose ({error})")
                break
            if row.get("score") is None or _relative(row["score"], want) > TOLERANCE:
                problems.append(
                    f"step {step}: a sample's reward is {row.get('score')}, its parts give "
                    f"{want:.6g} (CIDEr-D {parts['cider']:.6g}, CHAIR_i {parts['chair_i']}, "
                    f"chair_weight {kwargs.get('chair_weight', 0.0)}): a part of the reward is "
                    "missing or extra"
                )
                break
    return problems


def check_bounds(
    rows: list[dict[str, Any]], config: Any, *, chair_optional: bool = False
) -> list[str]:
    """Each sample's clip-high bound (the clip schedule) and clip-low bound (the clip-low
    schedule) against the rule of the schedule on its side for its own CHAIR_i."""
    from entropyrl.core.specs import ClipLowScheduleSpec, ClipScheduleSpec

    problems = []
    for spec_cls, field, label, what in (
        (ClipScheduleSpec, "clip_high", "bound", "the clip schedule"),
        (ClipLowScheduleSpec, "clip_low", "clip_low bound", "the clip-low schedule"),
    ):
        mapping = _getter(config)(f"algorithm.{spec_cls.SECTION}", None)
        if mapping is not None and mapping.get("enable", False):
            spec = spec_cls.from_mapping(mapping)
            problems += _bound_problems(rows, spec, field, (label, what), chair_optional)
    return problems


def _bound_problems(
    rows: list[dict[str, Any]],
    spec: Any,
    field: str,
    names: tuple[str, str],
    chair_optional: bool,
) -> list[str]:
    label, what = names
    problems = []
    for step, _, step_rows in _steps_of(rows):
        for row in step_rows:
            want, got = clip_rule(row["chair_i"], spec), row.get(field)
            if got is None:
                problems.append(f"step {step}: a sample reached the loss without a {label}")
                break
            if _relative(got, want) > TOLERANCE:
                problems.append(
                    f"step {step}: CHAIR_i {row['chair_i']} got {label} {got:.6g}, the "
                    f"{spec.rule} rule ({spec.direction}) gives {want:.6g}"
                )
                break
    scored = [row["chair_i"] for row in rows if row["chair_i"] is not None]
    if not scored:
        if not chair_optional:
            problems.append(
                f"could not judge {what}: no sample got a CHAIR score (set "
                "CHAIR_OPTIONAL=1 only to check the neutral fallback)"
            )
        return problems
    if len({round(clip_rule(chair, spec), 6) for chair in scored}) < 2:
        problems.append(
            f"could not judge {what}: every scored sample's CHAIR_i "
            f"({min(scored):.3g}..{max(scored):.3g}) gives the same bound, so a constant bound "
            "would pass"
        )
    return problems


LOSS_FIELDS = ("clip_high", "clip_low", "advantages", "old_log_probs", HALLUCINATED_KEY)
LOSS_MODES = ("per_sample_clip",)  # the policy losses that trace what reached them


def _same_values(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, list) or isinstance(b, list):
        if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
            return False
        return all(_same_values(x, y) for x, y in zip(a, b))
    return _relative(float(a), float(b)) <= TOLERANCE


def check_loss_inputs(rows: list[dict[str, Any]], worker_rows: list[dict[str, Any]]) -> list[str]:
    """What reached the actor's loss against what the driver computed, sample by sample.

    `rows` are the driver's rows (padding included), `worker_rows` the loss's rows (one per
    micro-batch row, `entropyrl.rig.trace.worker_rows`), matched by step and sample key. A step
    traced by a killed run and again by the run that resumed it needs one of them complete."""
    if not worker_rows:
        return ["could not judge what reached the loss: the actor's loss traced no rows"]
    driver: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        driver[(row["step"], row["key"])].append(row)
    problems: list[str] = []
    reached = set()
    for row in worker_rows:  # the first row of each kind of fault is named
        where = f"step {row.get('step')}, rank {row.get('rank')}"
        candidates = driver.get((row.get("step"), row["key"]), [])
        # the mask reaches the loss with the token clip only (which refuses a batch without
        # it); the token penalty alone leaves it on the driver
        fields = LOSS_FIELDS if HALLUCINATED_KEY in row else LOSS_FIELDS[:-1]
        if not candidates:
            line = f"{where}: the loss got a sample the driver never traced"
        elif any(all(_same_values(row.get(f), c.get(f)) for f in fields) for c in candidates):
            line = None
        else:
            field = next(f for f in fields if not _same_values(row.get(f), candidates[0].get(f)))
            line = (
                f"{where}: a sample reached the loss with another {field} than the driver "
                "computed for it (the loss read another row's values)"
            )
        if line and not any(p.endswith(line.split(": ", 1)[1]) for p in problems):
            problems.append(line)
        reached.add((row.get("step"), row["key"]))
    incomplete: dict[int, list[str]] = defaultdict(list)
    complete = set()
    for step, _, step_rows in _steps_of([row for row in rows if not row.get("padding")]):
        missing = sum(1 for row in step_rows if (step, row["key"]) not in reached)
        if missing:
            incomplete[step].append(f"{missing} of {len(step_rows)}")
        else:
            complete.add(step)
    for step, counts in sorted(incomplete.items()):
        if step not in complete:
            problems.append(f"step {step}: {counts[-1]} samples never reached the actor's loss")
    return problems


def check_weight_sync(
    sync_rows: list[dict[str, Any]], rollout_rows: list[dict[str, Any]]
) -> list[str]:
    """The weight-sync probe: each generation's weights against the last ones the actor sent to
    that replica (`entropyrl.rig.trace`). Empty when responses were replayed (no weights used)."""
    if any(row.get("replay") for row in rollout_rows):
        return []
    if not rollout_rows:
        return ["could not judge the weight sync: the rollout wrote no probe rows"]
    if not any(row.get("kind") in ("weights", "adapter") for row in sync_rows):
        return ["could not judge the weight sync: no weight sync reached the rollout"]
    states = {row["state"]: row["tensors"] for row in rollout_rows if "tensors" in row}
    problems: list[str] = []
    judged = 0
    replicas = sorted({row["replica"] for row in rollout_rows})
    for replica in replicas:
        syncs = {
            kind: sorted(
                (row for row in sync_rows if row["replica"] == replica and row["kind"] == kind),
                key=lambda row: row["t"],
            )
            for kind in ("weights", "adapter")
        }
        times = {kind: [row["t"] for row in rows] for kind, rows in syncs.items()}
        generations = sorted(
            (row for row in rollout_rows if row["replica"] == replica), key=lambda row: row["t"]
        )
        for row in generations:
            used = states.get(row["state"])
            if used is None:
                problems.append(f"replica {replica}: a generation names unknown weights")
                break
            sent: dict[str, str] = {}
            updated = False
            for kind, kind_rows in syncs.items():
                last = bisect.bisect_left(times[kind], row["t"]) - 1
                if last >= 0:
                    sent.update(kind_rows[last]["tensors"])
                    updated |= kind_rows[last]["tensors"] != kind_rows[0]["tensors"]
            differ = sorted(name for name, value in sent.items() if used.get(name) != value)
            if differ:
                absent = sum(1 for name in differ if name not in used)
                problems.append(
                    f"replica {replica}: the rollout generated (trainer step {row.get('step')}) "
                    f"with weights other than the actor's last sync: {len(differ)} of "
                    f"{len(sent)} tensors differ ({absent} absent), e.g. {differ[0]}; it kept "
                    "older weights or ignored the sync"
                )
                break
            judged += updated
    if not problems and not judged:
        problems.append(
            "could not judge the weight sync: no generation came after the actor's weights changed"
        )
    return problems


def check_trace(
    trace_rows: list[dict[str, Any]],
    config: Any,
    *,
    sync_rows: list[dict[str, Any]] | None = None,
    rollout_rows: list[dict[str, Any]] | None = None,
    worker_rows: list[dict[str, Any]] | None = None,
    chair_optional: bool = False,
    end_tag: list[int] | str | None = "config",
) -> list[str]:
    """The per-sample trace of a run against the formulas: every step's advantages, the
    rewards' parts, the clip bounds; with the loss's rows also what reached the loss, with the
    probe's rows also the weight sync."""
    rows = [row for row in trace_rows if not row.get("padding")]
    if not rows:
        return ["the run wrote no per-sample trace (ENTROPYRL_TRACE_DIR)"]
    total = _getter(config)("trainer.total_training_steps", None)
    problems: list[str] = []
    if total is not None:
        traced = sorted({row["step"] for row in rows})
        missing = [s for s in range(1, int(total) + 1) if s not in traced]
        if missing or any(s < 1 or s > int(total) for s in traced):
            problems.append(
                f"the trace holds training steps {traced}, expected 1..{int(total)}: a step "
                "computed no advantages through the entropyrl trainer, or a step outside the run"
            )
    tag = _end_tag(config) if end_tag == "config" else end_tag
    problems += check_advantages(rows, config, tag)  # type: ignore[arg-type]
    problems += check_rewards(rows, config)
    problems += check_token_credit(rows, config)
    problems += check_bounds(rows, config, chair_optional=chair_optional)
    if worker_rows is not None:
        problems += check_loss_inputs(trace_rows, worker_rows)
    if sync_rows is not None or rollout_rows is not None:
        problems += check_weight_sync(sync_rows or [], rollout_rows or [])
    return problems


def check_sample_counts(
    rows: Sequence[dict[str, Any]], trace_rows: list[dict[str, Any]], config: Any
) -> list[str]:
    """Every sample a step asked for (train_batch_size x rollout.n) reached its advantages or
    was counted lost (`rollout/lost_samples`, entropyrl.verl.failures.lost_samples): none went missing
    in silence, none counted lost arrived."""
    get = _getter(config)
    asked = int(get("data.train_batch_size")) * int(get("actor_rollout_ref.rollout.n"))
    counts = {row["step"]: row["data"] for row in rows if is_training_row(row)}
    problems = []
    for step, _run, group in _steps_of([r for r in trace_rows if not r.get("padding")]):
        data = counts.get(step, {})
        lost, expected = data.get("rollout/lost_samples"), data.get("rollout/expected_samples")
        if not (_finite(lost) and _finite(expected)):
            problems.append(
                f"step {step}: no count of its samples (rollout/lost_samples, "
                "rollout/expected_samples): the trainer did not count what it was handed"
            )
            continue
        if expected != asked:
            problems.append(
                f"step {step}: rollout/expected_samples is {expected:g}, the config asks for "
                f"{asked} (data.train_batch_size x actor_rollout_ref.rollout.n)"
            )
        if len(group) + lost != asked:
            problems.append(
                f"step {step}: {len(group)} samples reached the advantages and {lost:g} were "
                f"counted lost, of {asked} asked for: "
                + (
                    f"{asked - len(group) - lost:g} lost in silence"
                    if len(group) + lost < asked
                    else "samples counted lost arrived"
                )
            )
    return problems


# The estimators that log `egpo/entropy/seq_mean`, the mean of the sequence entropies they read.
SEQUENCE_ENTROPY_ESTIMATORS = ("egpo", "egpo_ratio")


def entropy_of(config: Any):
    """`row -> H_i` as the config's estimator reads it, or None when it logs no `egpo/entropy/*`."""
    from entropyrl.core.specs import algorithm_specs

    get = _getter(config)
    if get("algorithm.adv_estimator") not in SEQUENCE_ENTROPY_ESTIMATORS:
        return None
    tag, mode = _end_tag(config), algorithm_specs(get("algorithm")).entropy.mode
    return lambda row: sequence_entropy(row, tag, mode)


def check_run(settings: Any, out: Path) -> int:
    """Check the run in `out`; print the steps and the verdict. 0 when it is good."""
    from omegaconf import OmegaConf

    metrics, config_path = out / "metrics.jsonl", out / "config.yaml"
    if not config_path.is_file():  # verl's own trainer writes none: the config Hydra composed
        config_path = out / "hydra" / ".hydra" / "config.yaml"
    if not metrics.is_file() or not config_path.is_file():
        print(f"smoke check: {out} has no metrics.jsonl or config.yaml (the run did not train)")
        return 1
    chair_optional = os.environ.get("CHAIR_OPTIONAL", "") == "1"
    rows = read_metrics(metrics)
    config = OmegaConf.load(config_path)
    problems = check_metrics(rows, config, chair_optional=chair_optional)
    ranks = OmegaConf.select(config, "trainer.n_gpus_per_node")
    if ranks != settings.ranks or OmegaConf.select(config, "trainer.nnodes") != 1:
        problems.append(f"the run had {ranks} rank(s), expected {settings.ranks}")
    # verl's own trainer (plugin_overhead's baseline) writes no trace and no run settings
    ours = OmegaConf.select(config, "trainer.v1.trainer_mode") == "entropyrl"
    problems += check_checkpoint(config, int(config.trainer.total_training_steps), ours=ours)
    hf_rollout = OmegaConf.select(config, "actor_rollout_ref.rollout.name") == "hf"
    # the per-sample clip loss traces its micro-batch rows; verl's own losses trace nothing. The
    # trainer runs it when the config names it or the clip schedule is on (the one switch).
    our_loss = OmegaConf.select(
        config, "actor_rollout_ref.actor.policy_loss.loss_mode"
    ) in LOSS_MODES or (
        ours and OmegaConf.select(config, "algorithm.clip_schedule.enable", default=False)
    )
    if ours:
        folder = out / "trace"
        driver = read_trace(folder, "driver")
        workers = read_trace(folder, "worker") if our_loss else None
        problems += check_sample_counts(rows, driver, config)
        problems += check_step_metrics(
            training_metrics(rows),
            driver,
            config,
            worker_rows=workers,
            sequence_entropy=entropy_of(config),
        )
        problems += check_trace(
            driver,
            config,
            worker_rows=workers,
            sync_rows=read_trace(folder, "sync") if hf_rollout else None,
            rollout_rows=read_trace(folder, "rollout") if hf_rollout else None,
            chair_optional=chair_optional,
        )
    if problems:
        print(summarize(rows))
        print("smoke check FAILED:\n  " + "\n  ".join(problems))
        return 1
    trained = sum(1 for row in rows if is_training_row(row))
    print(f"smoke check passed: {trained} steps in {metrics}")
    return 0
