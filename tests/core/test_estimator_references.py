"""The estimators' logged metrics and their edges against written-out references.

A dashboard reads `egpo/*` and `maxent/*` as the paper's quantities; each is recomputed here
one group at a time in float64 and compared, and each documented refusal is probed at its edge
with the message a user reads.
"""

from __future__ import annotations

import math

import pytest
import torch

from entropyrl.core import advantages as adv
from entropyrl.core import maxent
from entropyrl.core.maxent import _group_ranks

SCORES = torch.tensor([1.0, 0.0, 0.5, 0.25, 2.0, 2.0, 3.0, -1.0, 0.7], dtype=torch.float64)
GROUP = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 3])
ENTROPY = torch.tensor([0.3, 1.2, float("nan"), 0.0, 0.8, 0.1, 2.0, 0.05, 0.4], dtype=torch.float64)


def _grpo_reference(scores, group, eps=1e-6):
    out = torch.zeros_like(scores)
    for g in group.unique():
        idx = (group == g).nonzero().flatten()
        s = scores[idx]
        std = s.std() if len(idx) > 1 else torch.tensor(1.0, dtype=s.dtype)
        out[idx] = (s - s.mean()) / (std + eps) if len(idx) > 1 else 0.0
    return out


def test_bonus_metrics_are_the_papers_quantities():
    lam, alpha = 0.4, 0.5  # alpha in (0, 1] is allowed (the paper only recommends > 1)
    out, metrics = adv.egpo_bonus_advantage(SCORES, ENTROPY, GROUP, lam=lam, alpha=alpha)
    a = _grpo_reference(SCORES, GROUP)
    h = torch.nan_to_num(ENTROPY, nan=0.0)
    capped = torch.minimum(h, a.abs() / alpha)
    torch.testing.assert_close(out, a + lam * capped)
    available = ~ENTROPY.isnan()
    assert metrics["egpo/bonus/mean"] == pytest.approx(float(lam * capped.mean()), rel=1e-6)
    assert metrics["egpo/bonus/clip_frac"] == pytest.approx(
        float(((capped < h) & available).sum()) / int(available.sum())
    )
    assert metrics["egpo/entropy/seq_mean"] == pytest.approx(float(h[available].mean()), rel=1e-6)
    assert metrics["egpo/entropy/missing"] == 1.0


def test_bonus_edges():
    with pytest.raises(
        ValueError, match=r"^alpha must be > 0 \(the paper uses alpha > 1\), got 0$"
    ):
        adv.egpo_bonus_advantage(SCORES, ENTROPY, GROUP, alpha=0)
    with pytest.raises(ValueError, match=r"^lam must be >= 0, got -0.1$"):
        adv.egpo_bonus_advantage(SCORES, ENTROPY, GROUP, lam=-0.1)
    out, metrics = adv.egpo_bonus_advantage(SCORES, ENTROPY, GROUP, lam=0.0, alpha=1e-9)
    torch.testing.assert_close(out, _grpo_reference(SCORES, GROUP))
    one = torch.tensor([1.0])
    out, metrics = adv.egpo_bonus_advantage(one, torch.tensor([0.5]), torch.tensor([0]))
    assert out.tolist() == [0.0] and metrics["egpo/bonus/clip_frac"] == 1.0
    with pytest.raises(ValueError, match=r"^entropy has length 2, expected 9 \(one per sample\)$"):
        adv.egpo_bonus_advantage(SCORES, ENTROPY[:2], GROUP)


def test_ratio_metrics_are_the_papers_quantities():
    lmin, lmax, eps = 0.0, 3.0, 1e-3
    out, metrics = adv.egpo_ratio_advantage(
        SCORES, ENTROPY, GROUP, lambda_min=lmin, lambda_max=lmax, entropy_eps=eps
    )
    a = _grpo_reference(SCORES, GROUP)
    weight = torch.ones_like(SCORES)
    ratio = torch.zeros_like(SCORES)
    for g in GROUP.unique():
        idx = (g == GROUP).nonzero().flatten()
        have = [i for i in idx.tolist() if not math.isnan(ENTROPY[i])]
        h_bar = sum(float(ENTROPY[i]) for i in have) / max(len(have), 1)
        for i in have:
            ratio[i] = h_bar / (float(ENTROPY[i]) + eps)
            weight[i] = min(max(float(ratio[i]), lmin), lmax)
    torch.testing.assert_close(out, a * weight)
    assert metrics["egpo/weight/mean"] == pytest.approx(float(weight.mean()), rel=1e-6)
    assert metrics["egpo/weight/std"] == pytest.approx(float(weight.std(unbiased=False)), rel=1e-5)
    assert metrics["egpo/ratio/max"] == pytest.approx(float(ratio.max()), rel=1e-6)
    assert metrics["egpo/entropy/seq_mean"] == pytest.approx(
        float(ENTROPY[~ENTROPY.isnan()].mean()), rel=1e-6
    )
    assert metrics["egpo/entropy/missing"] == 1.0


def test_ratio_edges():
    with pytest.raises(ValueError, match=r"^entropy_eps must be > 0, got 0$"):
        adv.egpo_ratio_advantage(SCORES, ENTROPY, GROUP, entropy_eps=0)
    with pytest.raises(ValueError, match=r"lambda_min=-0.1, lambda_max=2.0$"):
        adv.egpo_ratio_advantage(SCORES, ENTROPY, GROUP, lambda_min=-0.1)
    adv.egpo_ratio_advantage(SCORES, ENTROPY, GROUP, lambda_min=1.0, lambda_max=1.0)
    empty = torch.zeros(0)
    out, metrics = adv.egpo_ratio_advantage(empty, empty, empty.long())
    assert out.numel() == 0
    assert metrics == {
        "egpo/weight/mean": 0.0,
        "egpo/weight/std": 0.0,
        "egpo/entropy/seq_mean": 0.0,
        "egpo/ratio/max": 0.0,
        "egpo/entropy/missing": 0.0,
    }


def test_shaping_edges_name_the_argument():
    a = torch.tensor([1.0, -1.0])
    h = torch.ones(2, 3)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"^kappa must be > 0, got 0$"):
        adv.entropy_shaped_token_advantage(a, h, mask, kappa=0)
    with pytest.raises(ValueError, match=r"^alpha must be >= 0, got -1$"):
        adv.entropy_shaped_token_advantage(a, h, mask, alpha=-1)
    with pytest.raises(ValueError, match=r"^adv has length 3, expected 2 \(one per sample\)$"):
        adv.entropy_shaped_token_advantage(torch.ones(3), h, mask)
    with pytest.raises(ValueError, match=r"^adv must be \[B\] or \[B, T\], got shape \(2, 2\)$"):
        adv.entropy_shaped_token_advantage(torch.ones(2, 2), h, mask)
    with pytest.raises(ValueError, match=r"^adv must be finite$"):
        adv.entropy_shaped_token_advantage(torch.tensor([1.0, math.inf]), h, mask)
    with pytest.raises(ValueError, match=r"^token_entropy must be \[B, T\], got shape \(2,\)$"):
        adv.entropy_shaped_token_advantage(a, torch.ones(2), mask)
    with pytest.raises(ValueError, match=r"^mask shape \(2, 2\) != token_entropy shape \(2, 3\)$"):
        adv.entropy_shaped_token_advantage(a, h, torch.ones(2, 2))
    out = adv.entropy_shaped_token_advantage(a, h, mask, alpha=0.4, kappa=1e-9)
    torch.testing.assert_close(out, a.unsqueeze(-1) + 0.4 * torch.ones(2, 3))
    assert adv.entropy_shaped_token_advantage(a.double(), h, mask).dtype == torch.float64


def test_broadcast_names_the_argument():
    with pytest.raises(ValueError, match=r"^adv has length 1, expected 2 \(one per sample\)$"):
        adv.broadcast_to_tokens(torch.ones(1), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"^mask must be \[B, T\], got shape \(2,\)$"):
        adv.broadcast_to_tokens(torch.ones(2), torch.ones(2))
    out = adv.broadcast_to_tokens(
        torch.tensor([2.0, -1.0], dtype=torch.float64), torch.tensor([[1, 0], [1, 1]])
    )
    assert out.dtype == torch.float64 and out.tolist() == [[2.0, 0.0], [-1.0, -1.0]]


def test_a_missing_reward_is_counted_in_the_message():
    scores = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])
    with pytest.raises(ValueError, match=r"^scores must be finite: 3 NaN/inf value\(s\)"):
        adv.grpo_advantage(scores, torch.tensor([0, 0, 1, 1, 1]))


# ---- MaxEnt-GRPO


def _maxent_reference(scores, log_ref, group, tau, beta, source, temperature):
    weight = torch.zeros_like(scores)
    entropies = []
    for g in group.unique():
        idx = (group == g).nonzero().flatten().tolist()
        s = [float(scores[i]) for i in idx]
        if source == "ranks":
            ranks = [sum(x > y for x in s) + (sum(x == y for x in s) - 1) / 2 for y in s]
            log_q = [-r / temperature for r in ranks]
        else:
            log_q = [x / temperature for x in s]
        logits = [(q + beta * float(log_ref[i])) / (tau + beta) for q, i in zip(log_q, idx)]
        top = max(logits)
        e = [math.exp(x - top) for x in logits]
        pi = [x / sum(e) for x in e]
        for i, p in zip(idx, pi):
            weight[i] = len(idx) * p - 1
        entropies.append(-sum(p * math.log(p) for p in pi if p > 0))
    return weight, sum(entropies) / len(entropies)


@pytest.mark.parametrize("source", ["rewards", "ranks"])
@pytest.mark.parametrize(
    ("tau", "beta", "temperature"), [(0.5, 0.3, 0.7), (2.0, 0.0, 1.0), (0.0, 0.2, 3.0)]
)
def test_maxent_weights_and_metrics(source, tau, beta, temperature):
    log_ref = torch.tensor(
        [-3.0, -1.0, -2.5, -0.5, -4.0, -1.5, -2.0, -2.2, -1.0], dtype=torch.float64
    )
    weight, metrics = maxent.maxent_advantage(
        SCORES, log_ref, GROUP, tau=tau, beta=beta, source=source, temperature=temperature
    )
    want, entropy = _maxent_reference(SCORES, log_ref, GROUP, tau, beta, source, temperature)
    torch.testing.assert_close(weight, want)
    assert metrics["maxent/target_entropy"] == pytest.approx(entropy, rel=1e-9)
    assert metrics["maxent/weight/max"] == pytest.approx(float(want.max()), rel=1e-9)
    assert metrics["maxent/weight/min"] == pytest.approx(float(want.min()), rel=1e-9)


def test_maxent_stays_finite_at_large_log_likelihoods():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    log_ref = torch.tensor([-5000.0, -4000.0, 3000.0, 3100.0])  # float32: exp overflows unshifted
    weight, metrics = maxent.maxent_advantage(
        scores, log_ref, torch.tensor([0, 0, 1, 1]), tau=1.0, beta=0.1
    )
    want, entropy = _maxent_reference(
        scores.double(), log_ref.double(), torch.tensor([0, 0, 1, 1]), 1.0, 0.1, "rewards", 1.0
    )
    assert torch.isfinite(weight).all()
    torch.testing.assert_close(weight.double(), want, atol=1e-5, rtol=1e-5)
    assert metrics["maxent/target_entropy"] == pytest.approx(entropy, abs=1e-5)


def test_maxent_edges():
    empty = torch.zeros(0)
    weight, metrics = maxent.maxent_advantage(empty, empty, empty.long())
    assert weight.numel() == 0
    assert metrics == {
        "maxent/target_entropy": 0.0,
        "maxent/weight/max": 0.0,
        "maxent/weight/min": 0.0,
    }
    with pytest.raises(ValueError, match=r"^scores must be finite \(no NaN/inf\)$"):
        maxent.maxent_advantage(torch.tensor([math.nan]), torch.zeros(1), torch.tensor([0]))
    with pytest.raises(
        ValueError, match=r"^log_pi_ref has length 2, expected 1 \(one per sample\)$"
    ):
        maxent.maxent_advantage(torch.zeros(1), torch.zeros(2), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"^log_pi_ref must be finite \(no NaN/inf\)$"):
        maxent.maxent_advantage(torch.zeros(1), torch.tensor([-math.inf]), torch.tensor([0]))
    one, _ = maxent.maxent_advantage(torch.tensor([3.0]), torch.tensor([-1.0]), torch.tensor([0]))
    assert one.tolist() == [0.0]


def _ranks_reference(x, group):
    out = []
    for i, y in enumerate(x.tolist()):
        peers = [v for v, g in zip(x.tolist(), group.tolist()) if g == group[i]]
        out.append(sum(v > y for v in peers) + (sum(v == y for v in peers) - 1) / 2)
    return out


@pytest.mark.parametrize(
    ("scores", "group"),
    [
        ([1.0, 1.0], [0, 0]),  # a tied pair alone
        ([3.0], [0]),
        ([0.5, 2.0, 0.5, 0.5, 1.0, 1.0, 7.0], [1, 1, 0, 1, 0, 0, 2]),
        ([2.0, 1.0, 3.0, 3.0, 0.0, 3.0], [5, 5, 5, 2, 2, 2]),
    ],
)
def test_group_ranks_are_ranks_within_each_group(scores, group):
    x = torch.tensor(scores, dtype=torch.float64)
    g = torch.tensor(group)
    inv, num_groups = torch.unique(g, return_inverse=True)[1], int(g.unique().numel())
    assert _group_ranks(x, inv, num_groups).tolist() == _ranks_reference(x, g)
