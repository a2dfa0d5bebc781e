"""CIDEr-D reward speed against pycocoevalcap, and why per-batch CIDEr is 0 for a GRPO group.

    python benchmarks/cider.py            # full run (a few seconds per table)
    python benchmarks/cider.py --quick    # smaller corpus and fewer repeats

The corpus is synthetic and seeded (COCO-sized captions over a Zipf vocabulary: 5 references of
8-16 words per image); candidates are references with some words replaced, so they overlap the
references as real captions do. Timings are medians of several repeats measured side by side in
one process: compare the ratio, not the absolute numbers, on a shared machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
from pycocoevalcap.cider.cider import Cider

from entropyrl.rewards.cider import CiderD


def zipf_vocabulary(rng: random.Random, size: int) -> tuple[list[str], list[float]]:
    words = [f"w{i}" for i in range(size)]
    weights = [1.0 / (rank + 1) for rank in range(size)]
    return words, weights


def sentence(rng, words, weights, low, high) -> str:
    return " ".join(rng.choices(words, weights, k=rng.randint(low, high)))


def perturb(rng, caption: str, words, weights, rate: float, extra: int = 0) -> str:
    tokens = [rng.choices(words, weights)[0] if rng.random() < rate else t for t in caption.split()]
    tokens += rng.choices(words, weights, k=extra)
    return " ".join(tokens)


def interleaved_medians(fns, repeats: int) -> list[float]:
    """Median seconds of each function, run in turn so load changes hit all of them alike."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return [statistics.median(bucket) for bucket in times]


def speed_table(args, rng, corpus, cider, words, weights) -> None:
    image_ids = list(corpus)
    print("## Per-candidate time, GRPO batch\n")
    print(
        f"{args.batch} images x {args.group} rollouts = {args.batch * args.group} candidates per "
        f"reward batch; df over {len(corpus)} images; medians of {args.repeats} repeats.\n"
    )
    print(
        "| candidates | pycocoevalcap per batch (us) | CiderD, refs new (us) | CiderD, refs cached (us) | speed-up new | speed-up cached |"
    )
    print("|---|---|---|---|---|---|")
    for label, extra in (("short (8-16 words)", 0), ("long (+60 words)", 60)):
        batch_ids = rng.sample(image_ids, args.batch)
        cands, refs = [], []
        for image_id in batch_ids:
            for _ in range(args.group):
                base = rng.choice(corpus[image_id])
                cands.append(perturb(rng, base, words, weights, 0.3, extra))
                refs.append(corpus[image_id])
        gts = {k: refs[k] for k in range(len(cands))}
        res = {k: [cands[k]] for k in range(len(cands))}
        n = len(cands)

        def coco(gts=gts, res=res):
            Cider().compute_score(gts, res)

        def cold(cands=cands, refs=refs):
            cider.clear_cache()
            cider.score_batch(cands, refs)

        def warm(cands=cands, refs=refs):
            cider.score_batch(cands, refs)

        coco, new, warm = interleaved_medians([coco, cold, warm], args.repeats)
        us = 1e6 / n
        print(
            f"| {label} | {coco * us:.1f} | {new * us:.1f} | {warm * us:.1f} | "
            f"{coco / new:.1f}x | {coco / warm:.1f}x |"
        )
    print()


def zero_demo(cider: CiderD, corpus, rng, words, weights, group: int) -> None:
    image_id = next(iter(corpus))
    refs = corpus[image_id]
    rollouts = [
        perturb(rng, refs[k % len(refs)], words, weights, 0.15 * (k % 4)) for k in range(group)
    ]
    _, per_group = Cider().compute_score(
        {k: refs for k in range(group)}, {k: [c] for k, c in enumerate(rollouts)}
    )
    _, per_image = Cider().compute_score({0: refs}, {0: [rollouts[0]]})
    ours = cider.score_batch(rollouts, [refs] * group)
    print("## One GRPO group: pycocoevalcap per call vs corpus df\n")
    print(
        f"The {group} rollouts of one image scored by one pycocoevalcap call (df and ref_len from "
        "the call itself) and by CiderD with df from the whole training corpus.\n"
    )
    print("| rollout | pycocoevalcap, one call per group | CiderD (corpus df) |")
    print("|---|---|---|")
    for k in range(group):
        print(f"| {k} | {per_group[k]:.3f} | {ours[k]:.3f} |")
    print(
        f"\nGroup std: pycocoevalcap {np.std(per_group):.3f}, CiderD {np.std(ours):.3f} "
        f"(a zero std gives GRPO no advantage signal). One image alone: pycocoevalcap "
        f"{per_image[0]:.3f}.\n"
    )
    # A mixed batch is not 0, but the same caption's score depends on its batch-mates.
    others = [k for k in corpus if k != image_id]
    print("| same rollout 0, batch-mates | pycocoevalcap | CiderD (corpus df) |")
    print("|---|---|---|")
    for size in (1, 4, 32):
        mates = rng.sample(others, size)
        gts = {0: refs, **{m: corpus[m] for m in mates}}
        res = {0: [rollouts[0]], **{m: [corpus[m][0]] for m in mates}}
        _, scores = Cider().compute_score(gts, res)
        print(f"| {size} other image(s) | {scores[0]:.3f} | {cider.score(rollouts[0], refs):.3f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=64, help="images per reward batch")
    parser.add_argument("--group", type=int, default=8, help="rollouts per image")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.images, args.batch, args.repeats = 1000, 16, 3
    rng = random.Random(args.seed)
    words, weights = zipf_vocabulary(rng, 3000)
    corpus = {
        i: [sentence(rng, words, weights, 8, 16) for _ in range(5)] for i in range(args.images)
    }
    start = time.perf_counter()
    cider = CiderD.from_references(corpus)
    build = time.perf_counter() - start
    print(
        f"# CIDEr-D benchmark\n\nCiderD.from_references over {args.images} images x 5 references: {build:.2f} s.\n"
    )
    speed_table(args, rng, corpus, cider, words, weights)
    zero_demo(cider, corpus, rng, words, weights, args.group)


if __name__ == "__main__":
    main()
