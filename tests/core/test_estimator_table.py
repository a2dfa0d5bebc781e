"""The estimator table end to end: what `entropy_inputs` hands each estimator, the sample
entropy it reads, and each registered formula's token and sample advantages against the
formulas it names (`entropyrl.core.algorithms`)."""

from __future__ import annotations

import math

import pytest
import torch

from entropyrl.core import advantages as adv
from entropyrl.core import maxent
from entropyrl.core.algorithms import EstimatorInputs, entropy_inputs, estimate
from entropyrl.core.entropy import segment_mask
from entropyrl.core.specs import AlgorithmSpecs, EntropySpec, MaxEntSpec

OPEN, CLOSE = [7], [9]
RESPONSES = torch.tensor([[7, 1, 9, 2, 3], [1, 2, 3, 0, 0], [7, 9, 4, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
ENTROPY = torch.arange(15, dtype=torch.float64).reshape(3, 5) / 10
LOGP = -torch.arange(15, dtype=torch.float64).reshape(3, 5) / 20


@pytest.mark.parametrize("mode", ["answer", "thinking"])
@pytest.mark.parametrize("source", ["logits", "nll"])
def test_entropy_inputs_follow_the_spec(mode, source):
    got, segment, found = entropy_inputs(
        EntropySpec(mode=mode, source=source), MASK, entropy=ENTROPY, old_log_prob=LOGP,
        responses=RESPONSES, think_ids=(OPEN, CLOSE),
    )  # fmt: skip
    want = ENTROPY if source == "logits" else -LOGP
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want.float())
    want_segment, want_found = segment_mask(RESPONSES, MASK, OPEN, CLOSE, mode)
    assert torch.equal(segment, want_segment) and torch.equal(found, want_found)


def test_the_whole_response_and_a_missing_source_need_no_segment():
    full = entropy_inputs(EntropySpec(mode="full"), MASK, entropy=ENTROPY, old_log_prob=None,
                          responses=None, think_ids=None)  # fmt: skip
    torch.testing.assert_close(full[0], ENTROPY.float())
    assert full[1:] == (None, None)
    for spec, kwargs in (
        (EntropySpec(source="logits"), {"entropy": None, "old_log_prob": LOGP}),
        (EntropySpec(source="nll"), {"entropy": ENTROPY, "old_log_prob": None}),
    ):
        assert entropy_inputs(spec, MASK, responses=RESPONSES, think_ids=(OPEN, CLOSE), **kwargs) == (
            None, None, None,
        )  # fmt: skip
    with pytest.raises(
        ValueError,
        match=r"^entropy\.mode='answer' \(algorithm\.entropy\.mode\) needs the response token ids and the think tags$",
    ):
        entropy_inputs(
            EntropySpec(),
            MASK,
            entropy=ENTROPY,
            old_log_prob=None,
            responses=RESPONSES,
            think_ids=None,
        )
    with pytest.raises(ValueError, match="needs the response token ids"):
        entropy_inputs(
            EntropySpec(),
            MASK,
            entropy=ENTROPY,
            old_log_prob=None,
            responses=None,
            think_ids=(OPEN, CLOSE),
        )


def _inputs(**kwargs):
    base = {
        "scores": torch.tensor([1.0, 0.0, 0.5]),
        "group": torch.tensor([0, 0, 0]),
        "mask": MASK,
    }
    return EstimatorInputs(**{**base, **kwargs})


def test_sample_entropy_is_the_mean_over_mask_and_segment():
    segment = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    h = _inputs(token_entropy=ENTROPY, segment_mask=segment).sample_entropy()
    assert h.dtype == torch.float32
    assert h[0] == pytest.approx((0.3 + 0.4) / 2)
    assert math.isnan(h[1])  # an empty segment: unavailable
    assert h[2] == pytest.approx((1.0 + 1.1 + 1.2) / 3)  # the mask bounds the segment
    whole = _inputs(token_entropy=ENTROPY).sample_entropy()
    assert whole.tolist() == pytest.approx([0.2, 0.6, 1.1])
    missing = _inputs().sample_entropy()
    assert missing.dtype == torch.float32 and all(math.isnan(v) for v in missing.tolist())
    with pytest.raises(
        ValueError, match=r"^token entropy shape \(3, 4\) != response mask shape \(3, 5\)$"
    ):
        _inputs(token_entropy=ENTROPY[:, :4]).sample_entropy()


SPECS = AlgorithmSpecs()


@pytest.mark.parametrize("name", ["grpo", "egpo", "egpo_ratio"])
def test_sequence_estimators_broadcast_their_formula(name):
    inputs = _inputs(token_entropy=ENTROPY, scores=torch.tensor([1.0, 0.0, 0.25]))
    out = estimate(name, inputs, SPECS)
    h = inputs.sample_entropy()
    want, metrics = {
        "grpo": lambda: (adv.grpo_advantage(inputs.scores, inputs.group), {}),
        "egpo": lambda: adv.egpo_bonus_advantage(inputs.scores, h, inputs.group),
        "egpo_ratio": lambda: adv.egpo_ratio_advantage(inputs.scores, h, inputs.group),
    }[name]()
    torch.testing.assert_close(out.sample, want)
    torch.testing.assert_close(out.token, want.unsqueeze(-1) * MASK)
    assert out.metrics == pytest.approx(metrics)
    assert all(type(v) is float for v in out.metrics.values())


def test_token_shaping_with_and_without_entropy():
    inputs = _inputs(token_entropy=ENTROPY)
    base = adv.grpo_advantage(inputs.scores, inputs.group)
    out = estimate("entropy_adv", inputs, SPECS)
    torch.testing.assert_close(
        out.token, adv.entropy_shaped_token_advantage(base, ENTROPY.float(), MASK)
    )
    assert out.sample is None and out.metrics == {"egpo/entropy/missing": 0.0}
    none = estimate("entropy_adv", _inputs(), SPECS)
    torch.testing.assert_close(none.token, base.unsqueeze(-1) * MASK)
    assert none.metrics == {"egpo/entropy/missing": 3.0}


def test_maxent_reads_the_reference_when_beta_needs_it():
    ref = torch.tensor([-1.0, -3.0, -2.0])
    out = estimate("maxent_grpo", _inputs(ref_seq_log_prob=ref), SPECS)
    want, _ = maxent.maxent_advantage(torch.tensor([1.0, 0.0, 0.5]), ref, torch.tensor([0, 0, 0]))
    torch.testing.assert_close(out.sample, want)
    with pytest.raises(
        ValueError,
        match=r"^maxent_grpo with maxent\.beta > 0 needs the reference policy's log-probs",
    ):
        estimate("maxent_grpo", _inputs(), SPECS)
    no_reference = AlgorithmSpecs(maxent=MaxEntSpec(beta=0.0))
    out = estimate("maxent_grpo", _inputs(), no_reference)
    want, _ = maxent.maxent_advantage(
        torch.tensor([1.0, 0.0, 0.5]), torch.zeros(3), torch.tensor([0, 0, 0]), beta=0.0
    )
    torch.testing.assert_close(out.sample, want)


def test_an_unknown_estimator_lists_the_known_ones():
    with pytest.raises(
        ValueError,
        match=r"^unknown advantage estimator 'egpo-ratio'; known: grpo, egpo, egpo_ratio, entropy_adv, maxent_grpo$",
    ):
        estimate("egpo-ratio", _inputs(), SPECS)
