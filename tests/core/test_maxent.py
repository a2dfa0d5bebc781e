"""MaxEnt-GRPO target: per-group loop reference, normalisation and the tau/beta limits."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.maxent import listwise_log_target, maxent_advantage, maxent_target

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)


@st.composite
def groups(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    ids = draw(
        st.lists(
            st.integers(-(10**9), 10**9), min_size=len(sizes), max_size=len(sizes), unique=True
        )
    )
    group = [gid for gid, n in zip(ids, sizes) for _ in range(n)]
    order = draw(st.permutations(list(range(len(group)))))
    group = [group[i] for i in order]
    n = len(group)
    vals = st.floats(-5, 5, width=32)
    log_q = draw(st.lists(vals, min_size=n, max_size=n))
    log_ref = draw(st.lists(st.floats(-300, 0, width=32), min_size=n, max_size=n))
    rewards = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n))
    return (
        torch.tensor(group),
        torch.tensor(log_q, dtype=torch.float64),
        torch.tensor(log_ref, dtype=torch.float64),
        torch.tensor(rewards, dtype=torch.float64),
    )


def ref_log_softmax_per_group(logits, group):
    out = [0.0] * len(group)
    for gid in set(group):
        idx = [i for i in range(len(group)) if group[i] == gid]
        top = max(logits[i] for i in idx)
        lse = top + math.log(sum(math.exp(logits[i] - top) for i in idx))
        for i in idx:
            out[i] = logits[i] - lse
    return torch.tensor(out, dtype=torch.float64)


def ref_target(log_q, log_ref, group, tau, beta):
    logits = [(q + beta * r) / (tau + beta) for q, r in zip(log_q.tolist(), log_ref.tolist())]
    return ref_log_softmax_per_group(logits, group.tolist())


@SETTINGS
@given(groups(), st.floats(0, 3), st.floats(0, 3))
def test_target_matches_loop_and_is_normalised(batch, tau, beta):
    group, log_q, log_ref, _ = batch
    if tau + beta < 1e-3:
        tau = 0.5
    got = maxent_target(log_q, log_ref, group, tau=tau, beta=beta)
    torch.testing.assert_close(got, ref_target(log_q, log_ref, group, tau, beta))
    for gid in group.unique():
        assert float(torch.logsumexp(got[group == gid], 0)) == pytest.approx(0.0, abs=1e-9)


def normalise(logits, group):
    return ref_log_softmax_per_group(logits.tolist(), group.tolist())


@SETTINGS
@given(groups(), st.floats(0.2, 3))
def test_limits(batch, temp):
    group, log_q, log_ref, _ = batch
    # beta -> 0: pi* ∝ q^{1/tau}, whatever the reference says; q itself at tau = 1.
    torch.testing.assert_close(
        maxent_target(log_q, log_ref, group, tau=1.0, beta=0.0), normalise(log_q, group)
    )
    torch.testing.assert_close(
        maxent_target(log_q, log_ref, group, tau=temp, beta=1e-9),
        normalise(log_q / temp, group),
        atol=1e-5,
        rtol=1e-5,
    )
    # tau -> 0: pi* ∝ q^{1/beta} * pi_ref, the reference-anchored (KL-regularised) fit.
    torch.testing.assert_close(
        maxent_target(log_q, log_ref, group, tau=1e-9, beta=temp),
        normalise(log_q / temp + log_ref, group),
        atol=1e-5,
        rtol=1e-5,
    )


def test_target_far_from_zero_does_not_underflow():
    log_ref = torch.tensor([-5000.0, -5001.0, -4000.0])
    got = maxent_target(torch.zeros(3), log_ref, torch.tensor([0, 0, 1]), tau=0.0, beta=1.0)
    torch.testing.assert_close(
        got.exp(), torch.tensor([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 1.0])
    )
    with pytest.raises(ValueError, match="tau"):
        maxent_target(torch.zeros(2), torch.zeros(2), torch.tensor([0, 0]), tau=0.0, beta=0.0)
    with pytest.raises(ValueError, match="log_pi_ref"):
        maxent_target(
            torch.zeros(2), torch.tensor([0.0, math.nan]), torch.tensor([0, 0]), tau=1, beta=0
        )


def ref_ranks(scores, group):
    out = []
    for i, s in enumerate(scores):
        peers = [scores[j] for j in range(len(scores)) if group[j] == group[i]]
        better = sum(p > s for p in peers)
        ties = sum(p == s for p in peers) - 1
        out.append(better + ties / 2)
    return out


@SETTINGS
@given(groups(), st.sampled_from(["rewards", "ranks"]), st.floats(0.2, 3))
def test_listwise_target_matches_loop(batch, source, temp):
    group, _, _, rewards = batch
    got = listwise_log_target(rewards, group, source=source, temperature=temp)
    if source == "rewards":
        logits = rewards / temp
    else:
        logits = -torch.tensor(ref_ranks(rewards.tolist(), group.tolist()), dtype=torch.float64)
        logits = logits / temp
    torch.testing.assert_close(got, normalise(logits, group))


@SETTINGS
@given(groups(), st.sampled_from(["rewards", "ranks"]))
def test_advantage_is_centred_weight(batch, source):
    group, _, log_ref, rewards = batch
    adv, metrics = maxent_advantage(rewards, log_ref, group, tau=0.7, beta=0.3, source=source)
    log_q = listwise_log_target(rewards, group, source=source)
    pi = maxent_target(log_q, log_ref, group, tau=0.7, beta=0.3).exp()
    for gid in group.unique():
        sel = group == gid
        k = int(sel.sum())
        torch.testing.assert_close(adv[sel], k * pi[sel] - 1)
        assert float(adv[sel].sum()) == pytest.approx(0.0, abs=1e-9)
        if k == 1:
            assert float(adv[sel]) == 0.0
    assert metrics["maxent/weight/max"] == pytest.approx(float(adv.max()))
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


def test_uniform_target_gives_zero_weight():
    group = torch.tensor([4, 4, 4, 9, 9])
    adv, metrics = maxent_advantage(torch.ones(5), torch.full((5,), -12.5), group)
    assert torch.allclose(adv, torch.zeros(5), atol=1e-6)
    assert metrics["maxent/target_entropy"] == pytest.approx((math.log(3) + math.log(2)) / 2)
    with pytest.raises(ValueError, match="source"):
        maxent_advantage(torch.ones(5), torch.zeros(5), group, source="pairs")
