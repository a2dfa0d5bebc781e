"""The logged step metrics recomputed from recorded runs' samples (entropyrl/rig/smoke/step_metrics.py),
and the faults the recomputation must name: a figure off its samples, a threshold off by one, a
clip fraction that leaves out one side, an entropy mean over
the samples without entropy. Plus the two-rank recording through the whole check: its loss rows
on both ranks, its mini-batches rebuilt from both ranks' shares.

The values are recomputed here a second way, written out in the test (the families, not the
check's code), so a fault in the check's own definitions fails too.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from entropyrl.rig.smoke.check import is_training_row
from entropyrl.rig.smoke.record import Recording, read_recording
from entropyrl.rig.smoke.step_metrics import CLIP_FRACTIONS, driver_metrics

RECORDINGS = Path(__file__).parent / "recorded"
DRIVER_FAMILIES = (
    "critic/score/mean",
    "critic/advantages/max",
    "response_length/mean",
    "reward/cider/mean",
    "reward/recall/mean",
    "chair/chair_i_mean",
    "chair/hallucinated_frac",
    "clip/bound_mean",
)


@pytest.fixture(scope="module")
def caption() -> Recording:
    return read_recording(RECORDINGS / "caption")


@pytest.fixture(scope="module")
def egpo() -> Recording:
    return read_recording(RECORDINGS / "egpo")


@pytest.fixture(scope="module")
def two_ranks() -> Recording:
    return read_recording(RECORDINGS / "two_ranks")


def logged(run: Recording) -> dict[int, dict]:
    return {row["step"]: row["data"] for row in run.metrics if is_training_row(row)}


def step_rows(run: Recording, step: int) -> list[dict]:
    return [row for row in run.real() if row["step"] == step]


def one(problems: list[str], needle: str) -> str:
    found = [line for line in problems if needle in line]
    assert found, problems
    return found[0]


# -- the recordings pass, every family compared ------------------------------------------------


@pytest.mark.parametrize("name", ["caption", "egpo", "lora", "two_ranks"])
def test_every_recording_passes_the_whole_check(name):
    run = read_recording(RECORDINGS / name)
    assert run.trace_problems() == []
    assert run.step_metric_problems() == []


def test_the_caption_families_equal_their_samples_written_out(caption):
    """Each family's definition written out here, against the logged value of every step."""
    threshold = caption.config.algorithm.clip_schedule.threshold
    for step, data in logged(caption).items():
        rows = step_rows(caption, step)
        scores = [r["score"] for r in rows]
        tokens = [a for r in rows for a in r["advantages"]]
        scored = [r["chair_i"] for r in rows if r["chair_i"] is not None]
        ours = {
            "critic/score/mean": sum(scores) / len(scores),
            "critic/advantages/max": max(tokens),
            "response_length/mean": sum(len(r["response"]) for r in rows) / len(rows),
            "reward/cider/mean": sum(r["reward_parts"]["cider"] for r in rows) / len(rows),
            "reward/recall/mean": sum(r["reward_parts"]["recall"] for r in rows) / len(rows),
            "chair/chair_i_mean": sum(scored) / len(scored),
            "chair/hallucinated_frac": sum(c >= threshold for c in scored) / len(scored),
            "clip/bound_mean": sum(r["clip_high"] for r in rows) / len(rows),
        }
        assert set(ours) == set(DRIVER_FAMILIES)
        check = driver_metrics(rows, caption.config, padded=False)
        for name, value in ours.items():
            assert data[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, name)
            assert check[name] == pytest.approx(value, rel=1e-9), (step, name)


def test_the_egpo_entropy_figures_equal_their_samples(egpo):
    for step, data in logged(egpo).items():
        rows = step_rows(egpo, step)
        means = [sum(r["entropy"]) / len(r["entropy"]) for r in rows if r["entropy"]]
        assert data["egpo/entropy/missing"] == len(rows) - len(means) == 0
        assert data["egpo/entropy/seq_mean"] == pytest.approx(sum(means) / len(means), rel=1e-5)


def clip_decisions(row: dict, clip_low: float, clip_c: float) -> tuple[int, int, int]:
    """(high, low, dual) clipped tokens of one loss row, PPO's clip written out per token."""
    high = low = dual = 0
    for new, old, a in zip(row["log_probs"], row["old_log_probs"], row["advantages"]):
        rho = math.exp(min(max(new - old, -20.0), 20.0))
        high += a > 0 and rho > 1 + row["clip_high"]
        low += a < 0 and rho < 1 - clip_low
        clipped = min(max(rho, 1 - clip_low), 1 + row["clip_high"])
        dual += a < 0 and max(-a * rho, -a * clipped) > -a * clip_c
    return high, low, dual


def mini_batches(run: Recording, step: int) -> list[list[dict]]:
    """The step's loss rows as its mini-batches: each rank's consecutive loss calls until they
    hold its share (`global_batch_size / dp_size` rows), the j-th share of every rank together."""
    shares: dict[int, list[list[dict]]] = {}
    for rank in sorted({r["rank"] for r in run.workers}):
        calls: dict[int, list[dict]] = {}
        for row in run.workers:
            if row["rank"] == rank and row["step"] == step:
                calls.setdefault(row["call"], []).append(row)
        chunks: list[list[dict]] = [[]]
        for call in sorted(calls):
            share = calls[call][0]["global_batch_size"] // calls[call][0]["dp_size"]
            if len(chunks[-1]) >= share:
                chunks.append([])
            chunks[-1] += calls[call]
        shares[rank] = chunks
    count = len(shares[0])
    return [[row for chunks in shares.values() for row in chunks[j]] for j in range(count)]


def test_the_clip_fractions_equal_the_clip_decisions_of_both_ranks(two_ranks):
    """Two epochs at lr 1e-3: the second is off-policy and the clip acts, on both sides. Each
    fraction is the clipped share of a mini-batch's tokens over both ranks, averaged over the
    step's mini-batches; one decision at float32 rounding is allowed per mini-batch."""
    actor = two_ranks.config.actor_rollout_ref.actor
    acted = 0.0
    assert {r["rank"] for r in two_ranks.workers} == {0, 1}
    for step, data in logged(two_ranks).items():
        batches = mini_batches(two_ranks, step)
        assert len(batches) == actor.ppo_epochs * (
            two_ranks.config.data.train_batch_size // actor.ppo_mini_batch_size
        )
        fractions = {name: [] for name in CLIP_FRACTIONS}
        slack = 0.0
        for batch in batches:
            tokens = sum(len(r["advantages"]) for r in batch)
            assert {r["batch_num_tokens"] for r in batch} == {tokens}  # verl's count, both ranks
            counts = [clip_decisions(r, actor.clip_ratio_low, actor.clip_ratio_c) for r in batch]
            high, low, dual = (sum(c[i] for c in counts) for i in range(3))
            fractions["actor/clip/frac_high"].append(high / tokens)
            fractions["actor/clip/frac_low"].append(low / tokens)
            fractions["actor/clip/frac_dual"].append(dual / tokens)
            fractions["actor/pg_clipfrac"].append((high + low) / tokens)
            fractions["actor/pg_clipfrac_lower"].append(dual / tokens)
            slack = max(slack, 1 / tokens)
        for name, values in fractions.items():
            mean = sum(values) / len(values)
            assert data[name] == pytest.approx(mean, abs=slack + 1e-9), (step, name)
        acted += data["actor/clip/frac_high"] + data["actor/clip/frac_low"]
    assert acted > 0  # the comparison had clip decisions to get wrong


# -- faults in the logged figures --------------------------------------------------------------


@pytest.mark.parametrize("name", DRIVER_FAMILIES)
def test_a_driver_figure_off_its_samples(caption, name):
    bad = caption.copy()
    data = logged(bad)[2]
    data[name] += 0.05 * max(1.0, abs(data[name]))
    assert one(bad.step_metric_problems(), name).startswith("step 2: ")


def test_a_hallucinated_share_with_the_threshold_off_by_one(caption):
    """A sample exactly at the threshold is hallucinated (it gets the hallucinated bound); a
    dashboard that counts `>` instead of `>=` leaves it out."""
    bad = caption.copy()
    threshold = bad.config.algorithm.clip_schedule.threshold
    rows = step_rows(bad, 1)
    clean = next(r for r in rows if r["chair_i"] == 0.0)
    clean["chair_i"] = threshold
    scored = [r["chair_i"] for r in rows if r["chair_i"] is not None]
    strict = sum(c > threshold for c in scored) / len(scored)
    data = logged(bad)[1]
    data["chair/hallucinated_frac"] = strict
    data["chair/chair_i_mean"] = sum(scored) / len(scored)
    one(bad.step_metric_problems(), "chair/hallucinated_frac")


def test_an_entropy_mean_that_counts_the_samples_without_entropy(egpo):
    bad = egpo.copy()
    rows = step_rows(bad, 1)
    rows[0]["entropy"] = None
    data = logged(bad)[1]
    data["egpo/entropy/missing"] = 1.0
    means = [sum(r["entropy"]) / len(r["entropy"]) for r in rows if r["entropy"]]
    data["egpo/entropy/seq_mean"] = sum(means) / len(rows)  # divided by every sample
    one(bad.step_metric_problems(), "egpo/entropy/seq_mean")


@pytest.mark.parametrize("name", CLIP_FRACTIONS)
def test_a_clip_fraction_off_its_decisions(two_ranks, name):
    """Two decisions per mini-batch more than the loss took: beyond the one at rounding."""
    bad = two_ranks.copy()
    for data in logged(bad).values():
        data[name] += 2.5 / 282
    one(bad.step_metric_problems(), f"step 1: {name}")


def test_a_clip_fraction_that_leaves_out_the_low_side(two_ranks):
    bad = two_ranks.copy()
    for data in logged(bad).values():
        data["actor/pg_clipfrac"] = data["actor/clip/frac_high"]
    step = next(s for s, d in logged(two_ranks).items() if d["actor/clip/frac_low"] > 0.01)
    one(bad.step_metric_problems(), f"step {step}: actor/pg_clipfrac")


def test_loss_rows_without_log_probs_cannot_be_judged(caption):
    bad = caption.copy()
    for row in bad.workers:
        row["log_probs"] = None
    one(bad.step_metric_problems(), "step 1: could not judge the clip fractions")


def test_no_logged_metric_with_its_rows_cannot_be_judged(caption):
    bad = caption.copy()
    bad.metrics = [row for row in bad.metrics if not is_training_row(row)]
    one(bad.step_metric_problems(), "could not judge the step metrics")


# -- two ranks through the loss check ----------------------------------------------------------


def test_a_rank_that_read_another_samples_bound(two_ranks):
    bad = two_ranks.copy()
    rank1 = [r for r in bad.workers if r["rank"] == 1]
    low = next(r for r in rank1 if r["clip_high"] == pytest.approx(0.3))
    high = next(r for r in rank1 if r["clip_high"] == pytest.approx(0.5))
    low["clip_high"], high["clip_high"] = high["clip_high"], low["clip_high"]
    line = one(bad.trace_problems(), "reached the loss with another clip_high")
    assert ", rank 1:" in line


def test_a_sample_that_reached_neither_rank(two_ranks):
    bad = two_ranks.copy()
    lost = next(r for r in bad.workers if r["rank"] == 1)
    bad.workers = [r for r in bad.workers if (r["step"], r["key"]) != (lost["step"], lost["key"])]
    asked = bad.config.data.train_batch_size * bad.config.actor_rollout_ref.rollout.n
    one(bad.trace_problems(), f"step {lost['step']}: 1 of {asked} samples never reached")
