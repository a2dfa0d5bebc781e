"""The step metrics a dashboard reads, recomputed from a run's per-sample trace.

A metric that is present and finite can still be wrong (a mean over the wrong rows, a threshold
off by one, a fraction of the wrong denominator). Each family is recomputed here from the rows it
summarises, with its definition written out, and compared with what verl's file logger wrote:

- `critic/score/*`, `critic/advantages/*` (token statistics over response tokens) and
  `response_length/*`: verl's `compute_data_metrics`, from the driver's rows of the step;
- `reward/<part>/mean`: the mean over the step's rows that report the part;
- `chair/*`, `clip/bound_*` and `clip/low_bound_*`: the CHAIR_i scores (with or without a
  schedule) and the bounds each schedule gave (a sample without CHAIR_i is unavailable, one at
  or above the clip schedule's threshold hallucinated);
- `egpo/entropy/*`: the samples with a sequence entropy and its mean;
- `actor/pg_clipfrac`, `actor/pg_clipfrac_lower`, `actor/clip/frac_*`: every clip decision taken
  again from the log-probs the loss traced (rho = exp(log_prob - old_log_prob); clipped high when
  A > 0 and rho > 1 + clip_high, low when A < 0 and rho < 1 - clip_low, dual when A < 0 and the
  clipped loss exceeds -clip_c A), as the share of each mini-batch's tokens, averaged over the
  step's mini-batches and epochs as verl's actor does (a step whose loss ran in two processes
  of a rank, a killed run's and its resumption's, is left out of this one).

A step with verl's synthetic padding rows (a batch topped up to divide over the ranks) is left out
of the `critic/*`, `response_length/*` and `egpo/entropy/*` comparison: verl and the estimator
count those rows there (a lost sample's place is such a row) and the trace keeps only what they
copy.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

# Recomputed in float64 from float32 values: relative error.
RELATIVE = 1e-4
# A ratio within float32 rounding of a bound can fall either way: one token per mini-batch.
CLIP_DECISIONS_AT_ROUNDING = 1
# The loss's clip fractions, each a share of a mini-batch's response tokens.
CLIP_FRACTIONS = (
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/clip/frac_high",
    "actor/clip/frac_low",
    "actor/clip/frac_dual",
)


def _getter(config: Any):
    from omegaconf import OmegaConf

    return lambda key, default=None: OmegaConf.select(config, key, default=default)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def driver_metrics(
    rows: list[dict[str, Any]], config: Any, *, padded: bool, sequence_entropy=None
) -> dict[str, float]:
    """One step's driver-side metrics from its real (non-padding) driver rows."""
    from entropyrl.core.specs import ClipScheduleSpec

    get = _getter(config)
    out: dict[str, float] = {}
    if not padded:
        scores = [float(row["score"]) for row in rows if row.get("score") is not None]
        if scores:
            out.update(
                {
                    "critic/score/mean": _mean(scores),
                    "critic/score/max": max(scores),
                    "critic/score/min": min(scores),
                }
            )
        tokens = [float(a) for row in rows for a in row.get("advantages") or []]
        if tokens:
            out.update(
                {
                    "critic/advantages/mean": _mean(tokens),
                    "critic/advantages/max": max(tokens),
                    "critic/advantages/min": min(tokens),
                }
            )
        lengths = [float(len(row["response"])) for row in rows if row.get("response") is not None]
        if lengths:
            out.update(
                {
                    "response_length/mean": _mean(lengths),
                    "response_length/max": max(lengths),
                    "response_length/min": min(lengths),
                }
            )
    parts: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for name, value in (row.get("reward_parts") or {}).items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and math.isfinite(value):
                parts[name].append(float(value))
    from entropyrl.verl.hooks import REWARD_PARTS

    for name in REWARD_PARTS:
        if parts.get(name):
            out[f"reward/{name}/mean"] = _mean(parts[name])
    mapping = get("algorithm.clip_schedule", None)
    spec = ClipScheduleSpec.from_mapping(mapping)
    scored = [float(row["chair_i"]) for row in rows if row.get("chair_i") is not None]
    if scored:  # logged with or without a schedule (its threshold)
        out["chair/chair_i_mean"] = _mean(scored)
        out["chair/hallucinated_frac"] = _mean(
            [1.0 if chair >= spec.threshold else 0.0 for chair in scored]
        )
    low = get("algorithm.clip_low_schedule", None)
    low_bounds = [float(row["clip_low"]) for row in rows if row.get("clip_low") is not None]
    if low is not None and low.get("enable", False) and low_bounds:
        out.update(
            {
                "clip/low_bound_mean": _mean(low_bounds),
                "clip/low_bound_min": min(low_bounds),
                "clip/low_bound_max": max(low_bounds),
            }
        )
    if spec.enable:
        bounds = [float(row["clip_high"]) for row in rows if row.get("clip_high") is not None]
        out["chair/unavailable"] = float(sum(1 for row in rows if row.get("chair_i") is None))
        if bounds:
            out.update(
                {
                    "clip/bound_mean": _mean(bounds),
                    "clip/bound_min": min(bounds),
                    "clip/bound_max": max(bounds),
                }
            )
    if sequence_entropy is not None and not padded:  # the estimator counts every row
        entropies = [sequence_entropy(row) for row in rows]
        available = [h for h in entropies if h is not None]
        out["egpo/entropy/missing"] = float(len(rows) - len(available))
        if available:
            out["egpo/entropy/seq_mean"] = _mean(available)
    return out


def _mini_batches(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One step's loss rows cut into its mini-batches (every epoch's), in order.

    Each rank sees its share of a mini-batch (`global_batch_size` rows over `dp_size` ranks) in
    consecutive loss calls; the j-th share of every rank is mini-batch j."""
    by_rank: dict[Any, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_rank[row.get("rank", 0)][row["call"]].append(row)
    shares: dict[Any, list[list[dict[str, Any]]]] = {}
    for rank, calls in by_rank.items():
        chunks: list[list[dict[str, Any]]] = [[]]
        for call in sorted(calls):
            first = calls[call][0]
            per_rank = int(first["global_batch_size"]) // int(first.get("dp_size") or 1)
            if len(chunks[-1]) >= per_rank:
                chunks.append([])
            chunks[-1].extend(calls[call])
        shares[rank] = chunks
    count = max(len(chunks) for chunks in shares.values())
    return [
        [row for chunks in shares.values() if j < len(chunks) for row in chunks[j]]
        for j in range(count)
    ]


def clip_counts(
    row: dict[str, Any],
    clip_low: float,
    clip_c: float | None,
    clip_high: float | None = None,
    token_clip: tuple[float, float] | None = None,
) -> tuple[int, int, int]:
    """(clipped high, clipped low, dual-clipped) token counts of one loss row: its own bounds
    where a schedule gave it one, else the actor's constants `clip_low`, `clip_high`; with the
    token clip's (low, high), those on the tokens the row's `hallucinated_tokens` marks."""
    import numpy as np

    new = np.asarray(row["log_probs"], dtype=np.float32)
    old = np.asarray(row["old_log_probs"], dtype=np.float32)
    adv = np.asarray(row["advantages"], dtype=np.float32)
    own_high, own_low = row.get("clip_high"), row.get("clip_low")
    high_bound = np.float32(1.0 + float(clip_high if own_high is None else own_high))
    low_bound = np.float32(1.0 - float(clip_low if own_low is None else own_low))
    marks = row.get("hallucinated_tokens")
    if token_clip is not None and marks is not None:
        on = np.asarray(marks, dtype=np.float32) > 0
        low_bound = np.where(on, np.float32(1.0 - token_clip[0]), low_bound).astype(np.float32)
        high_bound = np.where(on, np.float32(1.0 + token_clip[1]), high_bound).astype(np.float32)
    rho = np.exp(np.clip(new - old, -20.0, 20.0), dtype=np.float32)
    high = int(np.sum((adv > 0) & (rho > high_bound)))
    low = int(np.sum((adv < 0) & (rho < low_bound)))
    dual = 0
    if clip_c is not None:
        loss = np.maximum(-adv * rho, -adv * np.clip(rho, low_bound, high_bound))
        dual = int(np.sum((adv < 0) & (loss > -adv * np.float32(clip_c))))
    return high, low, dual


def loss_metrics(rows: list[dict[str, Any]], config: Any) -> tuple[dict[str, float], float]:
    """One step's clip fractions from its loss rows, and the tolerance one decision at rounding
    per mini-batch gives them."""
    get = _getter(config)
    clip_low = float(get("actor_rollout_ref.actor.clip_ratio_low", 0.2))
    clip_high = get("actor_rollout_ref.actor.clip_ratio_high", None)
    clip_high = None if clip_high is None else float(clip_high)
    clip_c = get("actor_rollout_ref.actor.clip_ratio_c", None)
    clip_c = None if clip_c is None else float(clip_c)
    from entropyrl.core.specs import algorithm_specs

    spec = algorithm_specs(get("algorithm")).token_clip
    token_clip = (spec.low, spec.high) if spec.enable else None
    fractions: dict[str, list[float]] = defaultdict(list)
    slack = 0.0
    for batch in _mini_batches(rows):
        tokens = float(batch[0]["batch_num_tokens"])
        high = low = dual = 0
        for row in batch:
            h, lo, d = clip_counts(row, clip_low, clip_c, clip_high, token_clip)
            high, low, dual = high + h, low + lo, dual + d
        counts = dict(zip(CLIP_FRACTIONS, (high + low, dual, high, low, dual)))
        for name, count in counts.items():
            fractions[name].append(count / tokens)
        slack = max(slack, CLIP_DECISIONS_AT_ROUNDING / tokens)
    return {name: sum(values) / len(values) for name, values in fractions.items()}, slack


def check_step_metrics(
    logged: dict[int, dict[str, Any]],
    trace_rows: list[dict[str, Any]],
    config: Any,
    *,
    worker_rows: list[dict[str, Any]] | None = None,
    sequence_entropy=None,
) -> list[str]:
    """Each step's logged metrics (`logged`: step -> its training row's data) of the families
    above against their recomputation; a step
    traced by a killed run and again by the run that resumed it passes when either run's rows
    give its metrics. `sequence_entropy(row) -> H_i | None` for the entropy-guided estimators."""
    runs: dict[int, dict[Any, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    padding: dict[tuple[int, Any], bool] = defaultdict(bool)
    for row in trace_rows:
        padding[(row["step"], row.get("run"))] |= bool(row.get("padding"))
        if not row.get("padding"):
            runs[row["step"]][row.get("run")].append(row)
    losses: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in worker_rows or []:
        losses[row["step"]].append(row)
    problems: list[str] = []
    judged = 0
    for step in sorted(runs):
        data = logged.get(step)
        if data is None:
            continue  # check_metrics names a step without its row
        candidates = []
        for run, rows in runs[step].items():
            want = driver_metrics(
                rows, config, padded=padding[(step, run)], sequence_entropy=sequence_entropy
            )
            wrong = _differences(want, data, slack=0.0)
            candidates.append((wrong, len(want)))
        wrong, compared = min(candidates, key=lambda item: len(item[0]))
        judged += compared
        problems += [f"step {step}: {line}" for line in wrong[:3]]
        rows = losses.get(step)
        processes = defaultdict(set)
        for row in rows or []:
            processes[row.get("rank", 0)].add(row.get("process"))
        resumed = any(len(found) > 1 for found in processes.values())
        if rows and not resumed:
            if any(row.get("log_probs") is None for row in rows):
                problems.append(
                    f"step {step}: could not judge the clip fractions: the loss rows carry no "
                    "log_probs (a trace older than the check: record the run again)"
                )
                continue
            want, slack = loss_metrics(rows, config)
            if not any(_bounded(row) for row in rows):
                # no bound of ours in the step: the loss is verl's vanilla (same function,
                # same metrics), which logs no actor/clip/* fractions
                want = {k: v for k, v in want.items() if not k.startswith("actor/clip/")}
            wrong = _differences(want, data, slack=slack)
            judged += len(want)
            problems += [f"step {step}: {line}" for line in wrong[:3]]
    if trace_rows and not judged:
        problems.append("could not judge the step metrics: no logged metric has its rows")
    return problems


def _bounded(row: dict[str, Any]) -> bool:
    """Whether a loss row carries a bound of ours (per-sample, or the token clip's mask)."""
    return any(row.get(k) is not None for k in ("clip_high", "clip_low", "hallucinated_tokens"))


def _differences(want: dict[str, float], data: dict[str, Any], *, slack: float) -> list[str]:
    """A line per recomputed metric the logged one misses by more than `slack` (absolute) plus
    the relative rounding."""
    lines = []
    for name, value in want.items():
        got = data.get(name)
        if not isinstance(got, int | float) or not math.isfinite(got):
            lines.append(f"{name} is {got!r}, its rows give {value:.6g}")
            continue
        if abs(got - value) > slack + RELATIVE * max(1.0, abs(value)):
            lines.append(
                f"{name} is {got:.6g}, its rows give {value:.6g}: the logged metric does not "
                "summarise the step's samples"
            )
    return lines
