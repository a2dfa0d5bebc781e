"""PPO clip loss: plain per-token reference, per-sample bounds, where gradients vanish."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.losses import AGG_MODES, ppo_clip_loss

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def make_batch(seed, bsz=4, seq=6, spread=0.6, per_token=False, empty_rows=True):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(bsz, seq, generator=gen, dtype=torch.float64) * 3
    new = old + torch.randn(bsz, seq, generator=gen, dtype=torch.float64) * spread
    shape = (bsz, seq) if per_token else (bsz,)
    adv = torch.randn(*shape, generator=gen, dtype=torch.float64)
    mask = (torch.rand(bsz, seq, generator=gen) > 0.25).long()
    mask[:, 0] = 1
    if empty_rows and bsz > 1:
        mask[-1] = 0
    return new, old, adv, mask


def ref_loss(new, old, adv, mask, clip_low, clip_high, clip_c, agg):
    """Token loop from the PPO / dual-clip definitions, in Python floats."""
    bsz, seq = new.shape
    highs = clip_high.tolist() if isinstance(clip_high, torch.Tensor) else [clip_high] * bsz
    seq_losses, seq_tokens, all_losses = [], [], []
    for b in range(bsz):
        losses = []
        for t in range(seq):
            if not mask[b, t]:
                continue
            a = float(adv[b, t]) if adv.dim() == 2 else float(adv[b])
            log_ratio = min(max(float(new[b, t] - old[b, t]), -20.0), 20.0)
            rho = math.exp(log_ratio)
            clipped = min(max(rho, 1 - clip_low), 1 + highs[b])
            loss = max(-a * rho, -a * clipped)
            if clip_c is not None and a < 0:
                loss = min(loss, -a * clip_c)
            losses.append(loss)
        all_losses += losses
        seq_tokens.append(len(losses))
        if agg == "seq-mean-token-sum":
            seq_losses.append(sum(losses))
        elif agg == "seq-mean-token-mean":
            seq_losses.append(sum(losses) / len(losses) if losses else 0.0)
    if agg == "token-mean":
        return sum(all_losses) / max(len(all_losses), 1)
    kept = [s for s, n in zip(seq_losses, seq_tokens) if n > 0]
    return sum(kept) / max(len(kept), 1)


@SETTINGS
@given(
    st.integers(0, 2**31),
    st.integers(1, 5),
    st.integers(1, 7),
    st.booleans(),
    st.booleans(),
    st.sampled_from(AGG_MODES),
    st.sampled_from([None, 3.0, 1.5]),
)
def test_loss_matches_token_loop(seed, bsz, seq, per_token, per_sample, agg, clip_c):
    new, old, adv, mask = make_batch(seed, bsz, seq, spread=1.0, per_token=per_token)
    clip_high = (
        torch.rand(bsz, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        if per_sample
        else 0.28
    )
    loss, metrics, _ = ppo_clip_loss(
        new, old, adv, mask, clip_low=0.2, clip_high=clip_high, clip_c=clip_c, agg=agg
    )
    want = ref_loss(new, old, adv, mask, 0.2, clip_high, clip_c, agg)
    # seq-mean-token-mean divides by (n + 1e-8) as verl does: relative 1e-8.
    assert float(loss) == pytest.approx(want, rel=1e-7, abs=1e-12)
    assert set(metrics) == {
        "clip/frac_high",
        "clip/frac_low",
        "clip/frac_dual",
        "clip/high_mean",
        "ppo_kl",
    }
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    has = mask.bool().any(-1)
    if per_sample:
        assert metrics["clip/high_mean"] == pytest.approx(float(clip_high[has].mean()))
    else:
        assert metrics["clip/high_mean"] == pytest.approx(0.28)
    keep = mask.bool()
    kl = -(new - old).clamp(-20, 20)[keep].mean()
    assert metrics["ppo_kl"] == pytest.approx(float(kl))


def test_clip_fractions_by_hand():
    # One sample per situation; ratios e^{log}: 1.5 (A>0 clipped high), 0.5 (A<0 clipped low),
    # 4 (A<0, dual clip), 1.1 (inside).
    log_ratio = torch.log(torch.tensor([[1.5], [0.5], [4.0], [1.1]], dtype=torch.float64))
    old = torch.zeros(4, 1, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    mask = torch.ones(4, 1)
    loss, m, _ = ppo_clip_loss(log_ratio, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    assert m["clip/frac_high"] == 0.25 and m["clip/frac_low"] == 0.25
    assert m["clip/frac_dual"] == 0.25
    # Per-token losses: -1.28, 0.8, 3 (dual clip), -1.1.
    assert float(loss) == pytest.approx((-1.28 + 0.8 + 3.0 - 1.1) / 4)
    # A per-sample bound of 0.6 lets the first sample's ratio 1.5 through unclipped.
    loss, m, _ = ppo_clip_loss(
        log_ratio, old, adv, mask, clip_high=torch.tensor([0.6, 0.28, 0.28, 0.28])
    )
    assert m["clip/frac_high"] == 0.0
    assert float(loss) == pytest.approx((-1.5 + 0.8 + 3.0 - 1.1) / 4)


@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from(AGG_MODES), st.floats(0.0, 1.0))
def test_all_equal_per_sample_bound_equals_scalar(seed, agg, high):
    new, old, adv, mask = make_batch(seed, bsz=5, seq=7, spread=0.8)
    a = new.clone().requires_grad_(True)
    b = new.clone().requires_grad_(True)
    loss_s, m_s, _ = ppo_clip_loss(a, old, adv, mask, clip_high=high, agg=agg)
    per_sample = torch.full((5,), high, dtype=torch.float64)
    loss_t, m_t, _ = ppo_clip_loss(b, old, adv, mask, clip_high=per_sample, agg=agg)
    loss_s.backward()
    loss_t.backward()
    assert float(loss_s.detach()) == pytest.approx(float(loss_t.detach()), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-15)
    for k in m_s:
        assert m_s[k] == pytest.approx(m_t[k], rel=1e-12, abs=1e-15)


@SETTINGS
@given(st.integers(0, 2**31), st.booleans(), st.sampled_from(AGG_MODES))
def test_gradient_zero_exactly_where_clip_acts(seed, per_sample, agg):
    new, old, adv, mask = make_batch(seed, bsz=6, seq=8, spread=1.2, per_token=True)
    highs = torch.tensor([0.1, 0.28, 0.5, 0.9, 0.0, 2.0], dtype=torch.float64)
    clip_high = highs if per_sample else 0.28
    lp = new.clone().requires_grad_(True)
    loss, _, _ = ppo_clip_loss(lp, old, adv, mask, clip_low=0.2, clip_high=clip_high, agg=agg)
    loss.backward()
    rho = torch.exp((new - old).clamp(-20, 20))
    upper = 1 + (highs.unsqueeze(-1) if per_sample else torch.tensor(0.28, dtype=torch.float64))
    clip_region = ((adv > 0) & (rho > upper)) | ((adv < 0) & (rho < 0.8)) | ((adv < 0) & (rho > 3))
    keep = mask.bool()
    grad = lp.grad
    assert (grad[clip_region | ~keep] == 0).all()
    # Everywhere else (valid token, A != 0, off the bounds) the gradient is -A * rho / norm != 0.
    active = keep & ~clip_region & (adv != 0)
    assert (grad[active] != 0).all()
    assert (torch.sign(grad[active]) == -torch.sign(adv[active])).all()


def test_empty_mask_gives_connected_zero():
    new, old, adv, _ = make_batch(0)
    lp = new.clone().requires_grad_(True)
    for agg in AGG_MODES:
        loss, metrics, _ = ppo_clip_loss(lp, old, adv, torch.zeros_like(new), agg=agg)
        assert float(loss.detach()) == 0.0 and loss.requires_grad
        loss.backward()
        assert (lp.grad == 0).all()
        assert all(v == 0.0 for v in metrics.values())


def test_validation():
    new, old, adv, mask = make_batch(0)
    with pytest.raises(ValueError, match="clip_c"):
        ppo_clip_loss(new, old, adv, mask, clip_c=1.0)
    with pytest.raises(ValueError, match="agg"):
        ppo_clip_loss(new, old, adv, mask, agg="token-sum-norm")
    with pytest.raises(ValueError, match="clip_high"):
        ppo_clip_loss(new, old, adv, mask, clip_high=torch.tensor([0.2, 0.3]))
    with pytest.raises(ValueError, match="clip_low"):
        ppo_clip_loss(new, old, adv, mask, clip_low=-0.1)
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(new, old, adv[:2], mask)
    with pytest.raises(ValueError, match="old_log_prob"):
        ppo_clip_loss(new, old[:, :2], adv, mask)


def test_float32_inputs_and_no_dual_clip():
    new, old, adv, mask = make_batch(5, spread=2.0)
    loss, _, _ = ppo_clip_loss(new.float(), old.float(), adv.float(), mask, clip_c=None)
    assert loss.dtype == torch.float32
    want = ref_loss(
        new.float().double(),
        old.float().double(),
        adv.float().double(),
        mask,
        0.2,
        0.28,
        None,
        "token-mean",
    )
    assert float(loss) == pytest.approx(want, rel=1e-5)


def test_all_equal_per_sample_bound_equals_scalar_float32():
    new, old, adv, mask = make_batch(7, bsz=5, seq=7, spread=0.8)
    new, old, adv = new.float(), old.float(), adv.float()
    for high in (0.28, 0.3, 0.5):
        scalar, _, _ = ppo_clip_loss(new, old, adv, mask, clip_high=high)
        tensor, _, _ = ppo_clip_loss(
            new, old, adv, mask, clip_high=torch.full((5,), high, dtype=torch.float64)
        )
        assert torch.equal(scalar, tensor)


def test_padding_may_hold_nan():
    new, old, adv, mask = make_batch(3, per_token=True)
    clean, m_clean, _ = ppo_clip_loss(new, old, adv, mask)
    pad = ~mask.bool()
    new, adv = new.clone(), adv.clone()
    new[pad] = float("nan")
    adv[pad] = float("inf")
    lp = new.clone().requires_grad_(True)
    dirty, m_dirty, _ = ppo_clip_loss(lp, old, adv, mask)
    dirty.backward()
    assert float(dirty.detach()) == float(clean) and m_dirty == m_clean
    assert torch.isfinite(lp.grad).all() and (lp.grad[pad] == 0).all()
