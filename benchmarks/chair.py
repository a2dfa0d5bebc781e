"""CHAIR benchmark: parity with published numbers and the original code, speed, HTTP cost.

    python benchmarks/chair.py [--parity-dir ../shared/parity/chair] [--repeats 15]

Needs the parity data (LLaVA-1.5-7B captions of 500 COCO val2014 images released with OPERA,
arXiv 2311.17911, and the images' ground-truth objects); skips politely when it is absent.
Prints markdown tables:

1. parity: CHAIR_s / CHAIR_i of ``ChairScorer`` against the published and recomputed values and
   against the original code, restated in ``tests/chair/original_chair.py`` (NLTK's tokenizer
   rules, pattern's singularizer, synonyms.txt, the original's ``caption_to_words``);
2. fidelity: per caption, whether ``ChairScorer.mentions`` equals the original's mentions;
3. time per caption: ``ChairScorer`` vs that restated original (its structure kept: vocabulary
   as a list turned into a set for every word, the singularizer called per token);
4. HTTP: the 500-caption batch through ``POST /v1/chair`` (client + server + JSON) vs the same
   batch scored in-process (medians of the same run), and captions/s under 8 concurrent clients.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from chair_server import ChairScorer, vocabulary
from chair_server.launch import start_server
from entropyrl.rewards.chair_client import ChairClient

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PARITY = REPO.parent / "shared" / "parity" / "chair"

# file -> (published CHAIR_s, CHAIR_i, recomputed CHAIR_s range, CHAIR_i range), percent
PUBLISHED = {
    "ours": (44.6, 12.8, (44.6, 44.8), (12.7, 12.8)),
    "beam5": (48.8, 13.9, (48.8, 49.0), (13.8, 13.9)),
    "greedy": (None, None, (44.8, 45.0), (12.6, 12.8)),
}
TOLERANCE_S, TOLERANCE_I = 0.5, 0.3


# --- the original code, restated rule by rule (the tests' reference) ---------------------------
def load_original():
    """``tests/chair/original_chair.py``: the original CHAIR parser on restated NLTK/pattern rules."""
    path = REPO / "tests" / "chair" / "original_chair.py"
    spec = importlib.util.spec_from_file_location("chair_original_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class OriginalCorpus:
    """CHAIR_s / CHAIR_i of the original code: its ``caption_to_words`` per caption."""

    def __init__(self, ground_truth: dict[int, list[str]], chair) -> None:
        self.chair = chair
        self.imid_to_objects = {k: set(v) for k, v in ground_truth.items()}

    def compute(self, items: list[dict]) -> tuple[float, float]:
        captions = hallucinated_captions = mentions = hallucinated = 0
        for item in items:
            _, node_words = self.chair.caption_to_words(item["caption"])
            gt = self.imid_to_objects[item["image_id"]]
            bad = sum(1 for n in node_words if n not in gt)
            captions += 1
            hallucinated_captions += bad > 0
            mentions += len(node_words)
            hallucinated += bad
        return hallucinated_captions / captions, hallucinated / max(mentions, 1)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parity-dir", type=Path, default=DEFAULT_PARITY)
    parser.add_argument("--repeats", type=int, default=15, help="timing repeats (medians)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients")
    args = parser.parse_args(argv)
    gt_path = args.parity_dir / "ground_truth_objects.json"
    if not gt_path.is_file():
        print(f"parity data not found at {args.parity_dir}: skipping the CHAIR benchmark")
        return 0

    scorer = ChairScorer.from_ground_truth(gt_path)
    runs = {}
    for name in PUBLISHED:
        with open(args.parity_dir / f"llava-1.5_{name}.jsonl", encoding="utf-8") as handle:
            runs[name] = [json.loads(line) for line in handle if line.strip()]

    # 1. parity -------------------------------------------------------------------------------
    original = load_original()
    pure = original.OriginalChair()
    with_choice = original.OriginalChair(vocabulary.SINGULAR_EXCEPTIONS)
    original_corpus = OriginalCorpus(scorer.ground_truth(), pure)
    rows, ok = [], True
    for name, items in runs.items():
        overall = scorer.score_corpus(items)["overall_metrics"]
        original_s, original_i = original_corpus.compute(items)
        chair_s, chair_i = 100 * overall["CHAIRs"], 100 * overall["CHAIRi"]
        pub_s, pub_i, range_s, range_i = PUBLISHED[name]
        if pub_s is not None:
            passed = abs(chair_s - pub_s) <= TOLERANCE_S and abs(chair_i - pub_i) <= TOLERANCE_I
            reference = f"{pub_s} / {pub_i}"
        else:
            passed = (
                range_s[0] - 1e-9 <= round(chair_s, 1) <= range_s[1] + 1e-9
                and range_i[0] - 1e-9 <= round(chair_i, 1) <= range_i[1] + 1e-9
            )
            reference = "-"
        ok &= passed
        rows.append(
            [
                name,
                overall["captions"],
                f"{chair_s:.2f}",
                f"{chair_i:.2f}",
                f"{100 * overall['Recall']:.1f}",
                reference,
                f"{range_s[0]}-{range_s[1]} / {range_i[0]}-{range_i[1]}",
                f"{100 * original_s:.2f} / {100 * original_i:.2f}",
                "yes" if passed else "NO",
            ]
        )
    print("### CHAIR parity (LLaVA-1.5-7B, 500 COCO val2014 images, 512 new tokens)\n")
    header = ["decoding", "captions", "CHAIR_s", "CHAIR_i", "recall", "published (s / i)"]
    header += ["recomputed (s / i)", "original code, restated (s / i)", "within tolerance"]
    print(table(header, rows))
    print(f"\nTolerance: ±{TOLERANCE_S} CHAIR_s, ±{TOLERANCE_I} CHAIR_i vs published; greedy:")
    print("inside the recomputed range (one decimal). The restated original keeps its")
    print("singularizer's misses (bus -> bu, ties -> ty); ChairScorer counts those mentions (the")
    print("one documented difference), which lowers CHAIR_i slightly.\n")

    # 2. fidelity -----------------------------------------------------------------------------
    every = [item for items in runs.values() for item in items]
    same = same_categories = same_with_choice = 0
    for item in every:
        ours = scorer.mentions(item["caption"])
        theirs = pure.mentions(item["caption"])
        same += ours == theirs
        same_categories += [c for _, c in ours] == [c for _, c in theirs]
        same_with_choice += ours == with_choice.mentions(item["caption"])
    n = len(every)
    print(f"### Mention decisions vs the original code, caption by caption ({n} captions)\n")
    print(
        table(
            ["compared with", "identical (word, category) lists", "identical category lists"],
            [
                ["original code", f"{same} / {n}", f"{same_categories} / {n}"],
                [
                    "original code + the documented singularizer choice",
                    f"{same_with_choice} / {n}",
                    "",
                ],
            ],
        )
    )
    print()
    ok &= same_with_choice == n

    # 3. time per caption ---------------------------------------------------------------------
    sample = every[::5]  # the slow baseline times a fifth of the captions
    implementations = [
        (
            "original code, restated (NLTK rules, pattern singularizer, vocabulary list)",
            original_corpus.compute,
            sample,
        ),
        ("ChairScorer.score_corpus", scorer.score_corpus, every),
    ]
    # Rounds interleave the implementations so a load change on a shared machine hits all of
    # them alike; per-caption medians over the rounds.
    per_caption: list[list[float]] = [[] for _ in implementations]
    for _ in range(max(3, args.repeats // 3)):
        for k, (_, fn, items) in enumerate(implementations):
            start = time.perf_counter()
            fn(items)
            per_caption[k].append((time.perf_counter() - start) / len(items))
    medians = [statistics.median(t) for t in per_caption]
    t_ours = medians[-1]
    words = statistics.mean(len(i["caption"].split()) for i in every)
    print(f"### Scoring time per caption ({n} captions, {words:.0f} words on average)\n")
    rows = []
    for (label, _, items), t in zip(implementations, medians):
        speed_up = " / ".join(f"{b / t:.0f}x" for b in medians[:-1]) if t == t_ours else "1x"
        rows.append([label, f"{1000 * t:.4f}", f"{1 / t:,.0f}", speed_up, len(items)])
    print(
        table(
            ["implementation", "ms / caption", "captions / s", "speed-up", "captions timed"], rows
        )
    )
    print()

    # 4. HTTP ---------------------------------------------------------------------------------
    batch = runs["ours"]
    with start_server(ground_truth=gt_path, extra_args=["--workers", str(args.clients)]) as server:
        client = ChairClient(server.url, timeout=60, max_batch=len(batch))
        client.score(batch)  # warm-up
        http_times, local_times = [], []
        for _ in range(args.repeats):  # interleaved, as above
            http_times.append(median_time(lambda: client.score(batch), 1))
            local_times.append(median_time(lambda: scorer.score_corpus(batch), 1))
        t_http, t_local = statistics.median(http_times), statistics.median(local_times)
        per_client = max(5, args.repeats)
        done = []

        def worker() -> None:
            c = ChairClient(server.url, timeout=120, max_batch=len(batch))
            for _ in range(per_client):
                done.append(sum(1 for r in c.score(batch) if r is not None))

        threads = [threading.Thread(target=worker) for _ in range(args.clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    print(f"### HTTP round trip ({len(batch)}-caption batch, medians of {args.repeats})\n")
    print(
        table(
            ["path", "ms / batch", "ratio"],
            [
                ["in-process ChairScorer.score_corpus", f"{1000 * t_local:.1f}", "1.00x"],
                [
                    "ChairClient -> POST /v1/chair",
                    f"{1000 * t_http:.1f}",
                    f"{t_http / t_local:.2f}x",
                ],
            ],
        )
    )
    print(
        f"\n{args.clients} concurrent clients x {per_client} batches: "
        f"{sum(done):,} captions in {wall:.2f} s = {sum(done) / wall:,.0f} captions/s\n"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
