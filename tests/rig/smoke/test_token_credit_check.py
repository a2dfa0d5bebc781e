"""The smoke check of the token mechanisms fed recorded bad runs (see test_smoke_check.py for the
method): `EXPERIMENT=token_penalty` and `EXPERIMENT=token_clip` caption smokes, recorded under
tests/rig/smoke/recorded, changed the way a fault would change them.

Faults: a penalty that never reached the advantages, a penalty of another beta, a penalty on the
wrong tokens; a mask never set, a mask on a clean caption, a mask of the wrong length, spans that
do not match CHAIR's count; a token clip the loss never applied to the marked tokens (its logged
fractions then differ from the recomputed ones), a loss that read another sample's mask.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from entropyrl.rig.smoke.record import Recording, read_recording
from entropyrl.rig.trace import HALLUCINATED_KEY
from entropyrl.verl.loss import HALLUCINATED_FIELD

RECORDINGS = Path(__file__).parent / "recorded"


def one(problems: list[str], needle: str) -> str:
    found = [line for line in problems if needle in line]
    assert found, problems
    return found[0]


def marked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if any(row.get(HALLUCINATED_KEY) or [])]


def clean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows CHAIR scored with no hallucinated span."""
    return [
        row
        for row in rows
        if (row.get("reward_parts") or {}).get("hallucinated_spans") == "[]" and not row["padding"]
    ]


def test_the_trace_key_is_the_loss_field():
    assert HALLUCINATED_KEY == HALLUCINATED_FIELD


# -- the token penalty --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def penalty() -> Recording:
    return read_recording(RECORDINGS / "token_penalty")


def test_the_recorded_token_penalty_run_passes(penalty):
    assert penalty.trace_problems() == []
    assert penalty.step_metric_problems() == []
    assert marked(penalty.real()), "the recording must mark some tokens to test anything"
    assert clean(penalty.real()), "and keep some clean captions"


def test_a_penalty_that_never_reached_the_advantages(penalty):
    bad = penalty.copy()
    beta = float(bad.config.algorithm.token_penalty.beta)
    for row in marked(bad.real()):
        row["advantages"] = [a + beta * m for a, m in zip(row["advantages"], row[HALLUCINATED_KEY])]
    one(bad.trace_problems(), "advantages differ")


def test_a_penalty_of_another_beta(penalty):
    bad = penalty.copy()
    for row in marked(bad.real()):  # beta 0.5 instead of the config's
        row["advantages"] = [a + 0.5 * m for a, m in zip(row["advantages"], row[HALLUCINATED_KEY])]
    one(bad.trace_problems(), "advantages differ")


def test_a_penalty_one_token_late(penalty):
    bad = penalty.copy()
    for row in marked(bad.real()):  # the mask as written, the penalty on the next token
        late = [0.0, *row[HALLUCINATED_KEY][:-1]]
        row["advantages"] = [
            a + m - n for a, m, n in zip(row["advantages"], row[HALLUCINATED_KEY], late)
        ]
    one(bad.trace_problems(), "advantages differ")


def test_a_mask_that_is_never_set(penalty):
    bad = penalty.copy()
    beta = float(bad.config.algorithm.token_penalty.beta)
    for row in bad.driver:  # neither marks nor penalty: the advantages agree with the mask
        marks = row.get(HALLUCINATED_KEY) or []
        row["advantages"] = [a + beta * m for a, m in zip(row["advantages"], marks)]
        row[HALLUCINATED_KEY] = [0.0] * len(marks)
    problems = bad.trace_problems()
    one(problems, "hallucinated mention(s) has 0 marked token(s)")


def test_a_mask_missing_on_every_step(penalty):
    bad = penalty.copy()
    beta = float(bad.config.algorithm.token_penalty.beta)
    for row in bad.driver:
        marks = row.pop(HALLUCINATED_KEY, None) or []
        row["advantages"] = [a + beta * m for a, m in zip(row["advantages"], marks)]
    one(bad.trace_problems(), "carries no hallucinated-token mask of its length")


def test_a_mask_of_another_length(penalty):
    bad = penalty.copy()
    row = marked(bad.real())[0]
    row[HALLUCINATED_KEY] = row[HALLUCINATED_KEY][:-1]
    one(bad.trace_problems(), "carries no hallucinated-token mask of its length")


def test_a_clean_caption_with_marked_tokens(penalty):
    bad = penalty.copy()
    beta = float(bad.config.algorithm.token_penalty.beta)
    row = clean(bad.real())[0]
    row[HALLUCINATED_KEY] = [1.0] + [0.0] * (len(row["advantages"]) - 1)
    row["advantages"][0] -= beta  # the penalty agrees with the (wrong) mask
    one(bad.trace_problems(), "a caption with 0 hallucinated mention(s) has 1 marked token(s)")


def test_spans_that_do_not_match_chairs_count(penalty):
    bad = penalty.copy()
    row = marked(bad.real())[0]
    spans = json.loads(row["reward_parts"]["hallucinated_spans"])
    row["reward_parts"]["hallucinated_spans"] = json.dumps(spans + spans[:1])
    one(bad.trace_problems(), f"{len(spans) + 1} hallucinated spans for")


def test_a_run_that_never_marks_a_token_cannot_be_judged(penalty):
    assert float(penalty.config.algorithm.token_penalty.beta) == 1.0
    bad = penalty.copy()
    for row in bad.driver:  # every caption clean, as a model that never hallucinates
        marks = row.get(HALLUCINATED_KEY) or []
        row["advantages"] = [a + m for a, m in zip(row["advantages"], marks)]
        row[HALLUCINATED_KEY] = [0.0] * len(marks)
        parts = row.get("reward_parts") or {}
        if "hallucinated_spans" in parts:
            parts["hallucinated_spans"], parts["hallucinated"] = "[]", 0
    one(bad.trace_problems(), "could not judge the token mechanisms")


# -- the token clip -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_clip() -> Recording:
    return read_recording(RECORDINGS / "token_clip")


def test_the_recorded_token_clip_run_passes(token_clip):
    assert token_clip.trace_problems() == []
    assert token_clip.step_metric_problems() == []
    assert [row for row in token_clip.workers if any(row.get(HALLUCINATED_KEY) or [])]


def test_the_token_clip_run_carries_the_mask_to_the_loss(token_clip):
    assert all(HALLUCINATED_KEY in row for row in token_clip.workers)


def test_a_loss_that_read_another_samples_mask(token_clip):
    bad = token_clip.copy()
    rows = [row for row in bad.workers if any(row[HALLUCINATED_KEY])]
    row = rows[0]
    row[HALLUCINATED_KEY] = [1.0 - m for m in row[HALLUCINATED_KEY]]
    one(bad.trace_problems(), "with another hallucinated_tokens than the driver computed")


def test_a_token_clip_the_loss_never_applied(token_clip):
    """The recomputation tells the two clips apart: where a marked token's ratio lies between
    the actor's bounds and the token clip's, fractions recomputed with the mask gone (what a
    loss that ignored it logs) miss the logged ones, and the check says so."""
    from entropyrl.rig.smoke.step_metrics import clip_counts

    spec = token_clip.config.algorithm.token_clip
    actor = token_clip.config.actor_rollout_ref.actor
    between = 0
    for row in token_clip.workers:
        with_token = clip_counts(
            row,
            float(actor.clip_ratio_low),
            None,
            float(actor.clip_ratio_high),
            (float(spec.low), float(spec.high)),
        )
        without = clip_counts(
            row, float(actor.clip_ratio_low), None, float(actor.clip_ratio_high), None
        )
        between += with_token != without
    if not between:
        pytest.fail("no marked token's ratio lies between the bounds: the recording tests nothing")
    bad = token_clip.copy()
    for row in bad.workers:  # what the loss saw had it ignored the mask
        row[HALLUCINATED_KEY] = [0.0] * len(row[HALLUCINATED_KEY])
    for row in bad.driver:
        if HALLUCINATED_KEY in row:
            row[HALLUCINATED_KEY] = [0.0] * len(row[HALLUCINATED_KEY])
    assert bad.step_metric_problems() != []
