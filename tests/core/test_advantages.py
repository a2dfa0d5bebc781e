"""GRPO and entropy-guided advantages against plain per-group loops."""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.advantages import (
    broadcast_to_tokens,
    egpo_bonus_advantage,
    egpo_ratio_advantage,
    entropy_shaped_token_advantage,
    grpo_advantage,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


@st.composite
def batches(draw, with_entropy=False):
    """Groups of 1..6 samples with arbitrary ids, shuffled; rewards often tied or binary."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=0, max_size=6))
    ids = draw(
        st.lists(
            st.integers(-(2**40), 2**40), min_size=len(sizes), max_size=len(sizes), unique=True
        )
    )
    if draw(st.booleans()):  # also exercise small non-negative ids (direct-index path)
        ids = draw(st.permutations(list(range(len(sizes)))))
    kind = draw(st.sampled_from(["binary", "grid", "float", "equal"]))
    group, scores, entropy = [], [], []
    for gid, n in zip(ids, sizes):
        for _ in range(n):
            group.append(gid)
            if kind == "binary":
                scores.append(float(draw(st.integers(0, 1))))
            elif kind == "grid":
                scores.append(draw(st.integers(-4, 4)) / 4)
            elif kind == "float":
                scores.append(draw(st.floats(-10, 10, width=32)))
            else:
                scores.append(0.3)
            entropy.append(
                draw(
                    st.one_of(
                        st.just(math.nan),
                        st.just(0.0),
                        st.floats(0, 5, width=32),
                    )
                )
            )
    order = draw(st.permutations(list(range(len(group)))))
    group = [group[i] for i in order]
    scores = [scores[i] for i in order]
    entropy = [entropy[i] for i in order]
    out = (
        torch.tensor(scores, dtype=torch.float32),
        torch.tensor(group, dtype=torch.long),
    )
    return (*out, torch.tensor(entropy, dtype=torch.float32)) if with_entropy else out


def ref_grpo(scores, group, norm_by_std=True, eps=1e-6):
    """Per-group loop in float64: singletons and equal-reward groups give 0."""
    s, g = scores.double().tolist(), group.tolist()
    out = [0.0] * len(s)
    for gid in set(g):
        idx = [i for i in range(len(s)) if g[i] == gid]
        vals = [s[i] for i in idx]
        if len(vals) == 1 or len(set(vals)) == 1:
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            out[i] = (s[i] - mean) / (std + eps) if norm_by_std else s[i] - mean
    return torch.tensor(out, dtype=torch.float64)


@SETTINGS
@given(batches(), st.booleans())
def test_grpo_matches_loop(batch, norm):
    scores, group = batch
    got = grpo_advantage(scores, group, norm_by_std=norm)
    assert got.dtype == torch.float32 and got.shape == scores.shape
    torch.testing.assert_close(got.double(), ref_grpo(scores, group, norm), atol=1e-4, rtol=1e-4)


@SETTINGS
@given(batches())
def test_grpo_exact_zeros_for_singletons_and_equal_groups(batch):
    scores, group = batch
    got = grpo_advantage(scores, group)
    for gid in set(group.tolist()):
        sel = group == gid
        if sel.sum() == 1 or scores[sel].unique().numel() == 1:
            assert (got[sel] == 0).all()


def test_grpo_equal_rewards_exact_zero_where_mean_subtraction_rounds():
    # 0.1 * 3 / 3 != 0.1 in float32: a plain mean would leave rounding noise.
    scores = torch.full((3,), 0.1)
    assert (grpo_advantage(scores, torch.zeros(3, dtype=torch.long)) == 0).all()
    scores = torch.tensor([0.7] * 7 + [1e4] * 5)
    group = torch.tensor([3] * 7 + [8] * 5)
    assert (grpo_advantage(scores, group, norm_by_std=False) == 0).all()


def test_grpo_float64_equal_rewards_exact_zero():
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.2], dtype=torch.float64)
    group = torch.tensor([2, 2, 2, 5, 5])
    got = grpo_advantage(scores, group)
    assert got.dtype == torch.float64
    assert (got[:3] == 0).all()
    torch.testing.assert_close(got, ref_grpo(scores, group))


def test_infinite_entropy_counts_as_missing():
    scores = torch.tensor([1.0, 0.0, 0.5])
    group = torch.tensor([0, 0, 0])
    entropy = torch.tensor([float("inf"), 0.3, float("nan")])
    base = grpo_advantage(scores, group)
    for fn in (egpo_bonus_advantage, egpo_ratio_advantage):
        adv, metrics = fn(scores, entropy, group)
        assert metrics["egpo/entropy/missing"] == 2.0
        assert adv[0] == base[0] and adv[2] == base[2]
        assert torch.isfinite(adv).all()


def test_grpo_hand_computed():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0])
    group = torch.tensor([7, 7, -2, -2, 11])
    # Each pair: mean 0.5, unbiased std sqrt(0.5).
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(grpo_advantage(scores, group), torch.tensor([a, -a, -a, a, 0.0]))


def test_nan_scores_rejected_and_empty_batch():
    with pytest.raises(ValueError, match="scores"):
        grpo_advantage(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="scores"):
        egpo_bonus_advantage(torch.tensor([float("inf")]), torch.zeros(1), torch.tensor([0]))
    with pytest.raises(ValueError, match="group"):
        grpo_advantage(torch.zeros(2), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="group"):
        grpo_advantage(torch.zeros(2), torch.tensor([0]))
    with pytest.raises(ValueError, match="entropy"):
        egpo_ratio_advantage(torch.zeros(2), torch.tensor([-1.0, 0.0]), torch.tensor([0, 0]))
    empty = torch.zeros(0)
    gid = torch.zeros(0, dtype=torch.long)
    assert grpo_advantage(empty, gid).shape == (0,)
    adv, metrics = egpo_bonus_advantage(empty, empty, gid)
    assert adv.shape == (0,) and all(math.isfinite(v) for v in metrics.values())
    adv, metrics = egpo_ratio_advantage(empty, empty, gid)
    assert adv.shape == (0,) and all(math.isfinite(v) for v in metrics.values())


def ref_bonus(scores, entropy, group, lam, alpha):
    base = ref_grpo(scores, group)
    out = []
    for a, h in zip(base.tolist(), entropy.double().tolist()):
        if math.isnan(h):
            out.append(a)
        else:
            out.append(a + lam * min(max(h, -abs(a) / alpha), abs(a) / alpha))
    return torch.tensor(out, dtype=torch.float64)


@SETTINGS
@given(batches(with_entropy=True), st.floats(0, 1.5), st.floats(1.6, 4))
def test_egpo_bonus_matches_loop_preserves_sign_and_bound(batch, lam, alpha):
    scores, group, entropy = batch
    got, metrics = egpo_bonus_advantage(scores, entropy, group, lam=lam, alpha=alpha)
    torch.testing.assert_close(
        got.double(), ref_bonus(scores, entropy, group, lam, alpha), atol=1e-4, rtol=1e-4
    )
    base = grpo_advantage(scores, group)
    assert torch.isfinite(got).all()
    # lam < alpha: the bonus never flips the sign and is zero where A = 0.
    assert (torch.sign(got) == torch.sign(base)).all()
    assert ((got - base).abs() <= lam * base.abs() / alpha + 1e-6).all()
    missing = torch.isnan(entropy)
    assert metrics["egpo/entropy/missing"] == float(missing.sum())
    assert (got[missing] == base[missing]).all()
    if (~missing).any():
        assert metrics["egpo/entropy/seq_mean"] == pytest.approx(
            float(entropy[~missing].double().mean()), rel=1e-5, abs=1e-6
        )
    assert set(metrics) >= {"egpo/bonus/mean", "egpo/bonus/clip_frac"}
    assert all(isinstance(v, float) for v in metrics.values())


def test_egpo_bonus_clip_frac_and_validation():
    scores = torch.tensor([1.0, 0.0])
    group = torch.tensor([0, 0])
    # A = +-0.7071; bound |A|/2 = 0.354: entropy 5 is capped, 0.1 is not.
    adv, metrics = egpo_bonus_advantage(scores, torch.tensor([5.0, 0.1]), group)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([a + 0.4 * a / 2, -a + 0.4 * 0.1]))
    assert metrics["egpo/bonus/clip_frac"] == 0.5
    for kwargs in ({"lam": -0.1}, {"alpha": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            egpo_bonus_advantage(scores, torch.ones(2), group, **kwargs)


def ref_ratio(scores, entropy, group, lmin, lmax, eps):
    base = ref_grpo(scores, group).tolist()
    h, g = entropy.double().tolist(), group.tolist()
    out = list(base)
    for gid in set(g):
        idx = [i for i in range(len(g)) if g[i] == gid]
        avail = [h[i] for i in idx if not math.isnan(h[i])]
        if not avail:
            continue
        hbar = sum(avail) / len(avail)
        for i in idx:
            if not math.isnan(h[i]):
                out[i] = base[i] * min(max(hbar / (h[i] + eps), lmin), lmax)
    return torch.tensor(out, dtype=torch.float64)


@SETTINGS
@given(batches(with_entropy=True), st.floats(0.1, 1), st.floats(1, 3))
def test_egpo_ratio_matches_loop_and_weights_in_range(batch, lmin, lmax):
    scores, group, entropy = batch
    got, metrics = egpo_ratio_advantage(
        scores, entropy, group, lambda_min=lmin, lambda_max=lmax, entropy_eps=1e-6
    )
    torch.testing.assert_close(
        got.double(), ref_ratio(scores, entropy, group, lmin, lmax, 1e-6), atol=1e-4, rtol=1e-4
    )
    assert torch.isfinite(got).all()
    base = grpo_advantage(scores, group)
    nz = base != 0
    w = got[nz] / base[nz]
    assert ((w >= lmin - 1e-5) & (w <= lmax + 1e-5)).all()
    assert (torch.sign(got) == torch.sign(base)).all()
    assert metrics["egpo/entropy/missing"] == float(torch.isnan(entropy).sum())
    assert lmin - 1e-6 <= metrics["egpo/weight/mean"] <= lmax + 1e-6 or not len(scores)
    assert {"egpo/weight/std", "egpo/entropy/seq_mean", "egpo/ratio/max"} <= set(metrics)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


def test_egpo_ratio_hand_computed_and_zero_entropy():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    group = torch.tensor([0, 0, 1, 1])
    entropy = torch.tensor([0.5, 1.5, 0.0, float("nan")])
    adv, metrics = egpo_ratio_advantage(scores, entropy, group)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    # Group 0: Hbar = 1, weights 1/0.5 = 2 and 1/1.5; group 1: Hbar = 0 over the one
    # available sample, ratio 0 -> lambda_min; the NaN sample keeps weight 1.
    expected = torch.tensor([a * 2, -a / 1.5, a * 0.5, -a])
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)
    assert metrics["egpo/ratio/max"] == pytest.approx(2.0, rel=1e-5)
    assert metrics["egpo/entropy/missing"] == 1.0
    # A zero entropy next to a positive one: ratio Hbar/eps is huge, clipped to lambda_max.
    adv, _ = egpo_ratio_advantage(scores[:2], torch.tensor([0.0, 2.0]), group[:2])
    torch.testing.assert_close(adv, torch.tensor([2 * a, -a * 0.5]))
    with pytest.raises(ValueError, match="lambda_min"):
        egpo_ratio_advantage(scores, entropy, group, lambda_min=2.0, lambda_max=1.0)


@SETTINGS
@given(
    st.integers(1, 5),
    st.integers(1, 7),
    st.integers(0, 2**31),
    st.booleans(),
    st.floats(0, 1),
    st.floats(0.5, 4),
    st.sampled_from(["none", "inside", "padding"]),
)
def test_token_shaping_matches_loop(bsz, seq, seed, per_token, alpha, kappa, nan_at):
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randn((bsz, seq) if per_token else (bsz,), generator=gen)
    h = torch.rand(bsz, seq, generator=gen) * 3
    mask = torch.rand(bsz, seq, generator=gen) > 0.3
    if nan_at == "inside":
        h[0, 0] = float("nan")
    elif nan_at == "padding":
        h[~mask] = float("nan")  # entropy of padding positions may be garbage
    h.requires_grad_(True)
    got = entropy_shaped_token_advantage(adv, h, mask, alpha=alpha, kappa=kappa)
    assert not got.requires_grad and got.shape == (bsz, seq)
    for b in range(bsz):
        for t in range(seq):
            a = float(adv[b, t] if per_token else adv[b])
            ht = float(h.detach()[b, t])
            ht = 0.0 if math.isnan(ht) else ht
            want = a + min(alpha * ht, abs(a) / kappa) if mask[b, t] else 0.0
            assert float(got[b, t]) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_broadcast_to_tokens():
    adv = torch.tensor([1.5, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(
        broadcast_to_tokens(adv, mask), torch.tensor([[1.5, 1.5, 0.0], [-2.0, 0.0, 0.0]])
    )


def test_large_shuffled_batch_matches_loop():
    rng = random.Random(0)
    ids = [rng.randrange(-(10**12), 10**12) for _ in range(50)]
    group = torch.tensor([i for i in ids for _ in range(8)])
    perm = torch.randperm(len(group), generator=torch.Generator().manual_seed(0))
    group = group[perm]
    scores = torch.randint(0, 3, (len(group),), generator=torch.Generator().manual_seed(1)).float()
    torch.testing.assert_close(
        grpo_advantage(scores, group).double(), ref_grpo(scores, group), atol=1e-5, rtol=1e-5
    )
