"""Advantage estimators: entropyrl vs a per-group Python loop and verl's own GRPO.

B responses in groups of 8 with shuffled group ids (0..B/8-1, the compact ids verl's
vectorised path indexes with), binary rewards, sequence entropies with 5% missing (NaN).
Each estimator is timed N times after one warm-up call; the table gives medians.

    python benchmarks/advantages.py            # B = 65,536, the figures in the README
    python benchmarks/advantages.py --quick    # smoke run

"verl" rows need `verl` importable (extra `verl`); they are skipped otherwise. verl's
functions take token-level rewards [B, T]: they are given T = 1 for the per-sample comparison,
and the token-shaping row is compared with verl's grpo_vectorized at the same T.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict

import torch

from entropyrl.core.advantages import (
    egpo_bonus_advantage,
    egpo_ratio_advantage,
    entropy_shaped_token_advantage,
    grpo_advantage,
)
from entropyrl.core.maxent import maxent_advantage


def loop_grpo(scores: torch.Tensor, group: list, eps: float = 1e-6) -> torch.Tensor:
    """The shape of verl's `grpo`: a dict of groups, a Python loop over groups and samples."""
    by_group = defaultdict(list)
    for i in range(len(group)):
        by_group[group[i]].append(scores[i])
    stats = {}
    for gid, vals in by_group.items():
        if len(vals) == 1:
            stats[gid] = (torch.tensor(0.0), torch.tensor(1.0))
        else:
            stacked = torch.stack(vals)
            stats[gid] = (stacked.mean(), stacked.std())
    out = scores.clone()
    for i in range(len(group)):
        mean, std = stats[group[i]]
        out[i] = (scores[i] - mean) / (std + eps)
    return out


def timed(fn, repeats: int) -> float:
    """Median wall time in milliseconds over `repeats` calls, after one warm-up call."""
    return timed_together({"fn": fn}, repeats)["fn"]


def timed_together(fns: dict, repeats: int) -> dict[str, float]:
    """Median ms per function, calling them round-robin so machine load hits all alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="T for the token-shaping row")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--slow-repeats", type=int, default=3, help="repeats of the loops")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="B = 4,096, few repeats")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.repeats, args.slow_repeats = 4096, 5, 1
    torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    bsz, k = args.batch, args.group_size
    group = torch.arange(bsz // k).repeat_interleave(k)
    group = group[torch.randperm(len(group), generator=gen)]
    bsz = len(group)
    scores = torch.randint(0, 2, (bsz,), generator=gen).float()
    entropy = torch.rand(bsz, generator=gen) * 2
    entropy[torch.rand(bsz, generator=gen) < 0.05] = math.nan
    log_ref = -torch.rand(bsz, generator=gen) * 200
    tok_h = torch.rand(bsz, args.tokens, generator=gen) * 2
    tok_mask = torch.ones(bsz, args.tokens)
    adv = grpo_advantage(scores, group)

    # name -> (function, key of the verl row it is compared with)
    fast: dict[str, tuple] = {}
    slow: dict[str, tuple] = {}
    try:
        from verl.trainer.ppo import core_algos

        index = group.numpy()
        r1, m1 = scores.unsqueeze(-1), torch.ones(bsz, 1)
        rt = torch.zeros(bsz, args.tokens)
        rt[:, -1] = scores
        vec = core_algos.compute_grpo_vectorized_outcome_advantage
        fast["verl grpo_vectorized (T=1)"] = (lambda: vec(r1, m1, index), "vec1")
        fast[f"verl grpo_vectorized (T={args.tokens})"] = (lambda: vec(rt, tok_mask, index), "vecT")
        slow["verl grpo (loop over groups)"] = (
            lambda: core_algos.compute_grpo_outcome_advantage(r1, m1, index),
            "vec1",
        )
    except ImportError as exc:
        print(f"verl not importable ({exc}): verl rows skipped")

    group_list = group.tolist()
    torch.testing.assert_close(loop_grpo(scores, group_list), adv, atol=1e-5, rtol=1e-5)
    slow["per-group Python loop (reference)"] = (lambda: loop_grpo(scores, group_list), "vec1")
    fast["grpo_advantage"] = (lambda: grpo_advantage(scores, group), "vec1")
    fast["egpo_bonus_advantage"] = (lambda: egpo_bonus_advantage(scores, entropy, group), "vec1")
    fast["egpo_ratio_advantage"] = (lambda: egpo_ratio_advantage(scores, entropy, group), "vec1")
    fast["maxent_advantage"] = (lambda: maxent_advantage(scores, log_ref, group), "vec1")
    fast[f"entropy_shaped_token_advantage (T={args.tokens})"] = (
        lambda: entropy_shaped_token_advantage(adv, tok_h, tok_mask),
        "vecT",
    )
    ms = timed_together({k: v[0] for k, v in fast.items()}, args.repeats)
    ms.update(timed_together({k: v[0] for k, v in slow.items()}, args.slow_repeats))
    keys = {**{k: v[1] for k, v in fast.items()}, **{k: v[1] for k, v in slow.items()}}
    base = {
        "vec1": ms.get("verl grpo_vectorized (T=1)"),
        "vecT": ms.get(f"verl grpo_vectorized (T={args.tokens})"),
        "loop": ms["per-group Python loop (reference)"],
    }
    rows = [(name, ms[name], keys[name]) for name in [*slow, *fast]]

    print(
        f"\nB = {bsz:,} responses, groups of {k}, shuffled ids, torch threads = {args.threads}, "
        f"median of {args.repeats} (loops: {args.slow_repeats})\n"
    )
    has_verl = base["vec1"] is not None
    print("| estimator | median ms | x verl grpo_vectorized (time ratio) | speed-up vs loop |")
    print("|---|---:|---:|---:|")
    for name, ms, key in rows:
        ratio = f"{ms / base[key]:.2f}" if has_verl else "n/a"
        print(f"| {name} | {ms:.2f} | {ratio} | {base['loop'] / ms:.0f}x |")
    if has_verl:
        print(
            "\nGoal: every entropyrl estimator within 2x of verl grpo_vectorized (ratio <= 2)"
            " and >= 200x the loop."
        )


if __name__ == "__main__":
    main()
