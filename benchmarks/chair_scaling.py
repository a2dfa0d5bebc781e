"""CHAIR service capacity: captions scored per second by 1, 2, ... server processes.

    python benchmarks/chair_scaling.py [--servers 1 2] [--clients 8] [--batch 320] [--rounds 6]

One `python -m chair_server` process scores under the GIL (its waitress threads share one
core), so capacity grows with processes, not with `--workers`. Each run starts N processes on the
same ground truth; `--clients` threads send reward-sized batches (`--batch` captions, one
`POST /v1/chair` each through `ChairClient`) round-robin over the processes, as a load balancer
in front of them would, and the wall time of all batches gives captions/s. Captions are the
LLaVA-1.5 detailed captions of the CHAIR parity files when `--parity-dir` holds them (about 100
words each, what a captioning policy writes), otherwise generated COCO-style captions.
Prints a markdown table; the client threads run in this process and take CPU too.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from chair_server.launch import start_server
from entropyrl.rewards.chair_client import ChairClient

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PARITY = REPO.parent / "shared" / "parity" / "chair"
OBJECTS = (
    "person",
    "dog",
    "cat",
    "car",
    "bus",
    "bench",
    "chair",
    "dining table",
    "bicycle",
    "umbrella",
    "horse",
    "bird",
    "cup",
    "bottle",
    "laptop",
    "tv",
    "couch",
    "bed",
)


def parity_captions(folder: Path) -> tuple[list[dict], dict[str, list[str]]] | None:
    """(captions, ground truth) from the parity files, or None when they are not there."""
    truth, captions = folder / "ground_truth_objects.json", folder / "llava-1.5_ours.jsonl"
    if not (truth.is_file() and captions.is_file()):
        return None
    rows = [json.loads(line) for line in captions.read_text().splitlines() if line.strip()]
    items = [{"image_id": int(r["image_id"]), "caption": r["caption"]} for r in rows]
    return items, json.loads(truth.read_text())


def generated_captions(count: int = 500, seed: int = 0) -> tuple[list[dict], dict[str, list]]:
    """COCO-style captions (three objects, one of them often absent from the image)."""
    rng = random.Random(seed)
    items, truth = [], {}
    for image_id in range(1, count + 1):
        present = rng.sample(OBJECTS, 3)
        mentioned = [*present[:2], rng.choice(OBJECTS)]
        truth[str(image_id)] = present
        caption = (
            f"A {mentioned[0]} next to a {mentioned[1]} in a busy room, "
            f"with a {mentioned[2]} near the window and people walking by."
        )
        items.append({"image_id": image_id, "caption": caption})
    return items, truth


def captions_per_second(urls: list[str], batches: list[list[dict]], clients: int) -> float:
    """Send every batch once (client threads, round-robin over the urls); captions / wall s."""
    queue = list(enumerate(batches))
    lock = threading.Lock()
    scored: list[int] = []

    def client_loop(number: int) -> None:
        client = ChairClient(urls[number % len(urls)], timeout=120, max_batch=10_000)
        while True:
            with lock:
                if not queue:
                    return
                _, batch = queue.pop()
            results = client.score(batch)
            scored.append(sum(1 for result in results if result is not None))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    total = sum(len(batch) for batch in batches)
    if sum(scored) != total:
        raise RuntimeError(f"only {sum(scored)} of {total} captions were scored")
    return total / wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--clients", type=int, default=8, help="concurrent client threads")
    parser.add_argument("--batch", type=int, default=320, help="captions per request")
    parser.add_argument("--rounds", type=int, default=6, help="batches per client")
    parser.add_argument("--workers", type=int, default=4, help="--workers of each server")
    parser.add_argument("--parity-dir", type=Path, default=DEFAULT_PARITY)
    args = parser.parse_args(argv)

    found = parity_captions(args.parity_dir)
    source = "LLaVA-1.5 captions (parity files)" if found else "generated COCO-style captions"
    items, truth = found or generated_captions()
    rng = random.Random(0)
    batches = [
        [rng.choice(items) for _ in range(args.batch)] for _ in range(args.clients * args.rounds)
    ]
    words = sum(len(item["caption"].split()) for b in batches for item in b) / (
        len(batches) * args.batch
    )
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        gt_path = Path(folder) / "gt.json"
        gt_path.write_text(json.dumps(truth))
        for count in args.servers:
            with ExitStack() as stack:
                servers = [
                    stack.enter_context(
                        start_server(
                            ground_truth=gt_path, extra_args=["--workers", str(args.workers)]
                        )
                    )
                    for _ in range(count)
                ]
                urls = [server.url for server in servers]
                captions_per_second(urls, batches[: args.clients], args.clients)  # warm-up
                rate = captions_per_second(urls, batches, args.clients)
            rows.append((count, rate))
    print(
        f"{source}, {words:.0f} words on average; {args.clients} clients x {args.rounds} "
        f"batches of {args.batch} captions\n"
    )
    print("| server processes | captions / s | per process |")
    print("|---:|---:|---:|")
    for count, rate in rows:
        print(f"| {count} | {rate:,.0f} | {rate / count:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
