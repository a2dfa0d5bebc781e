"""Peak memory and time of `token_entropy`, chunked vs unchunked, on [8, 4096, 32768] logits.

Each variant runs in a fresh Python process, so one variant's allocator state cannot hide
another's peak. What is measured:

- CPU: peak resident set size of the process (``ru_maxrss``) minus its resident size right after
  the logits were allocated, i.e. the extra memory `token_entropy` needed on top of its input.
  torch's CPU allocator returns large blocks to the OS, so this is the real footprint.
- CUDA (``--device cuda``): ``torch.cuda.max_memory_allocated`` minus the memory allocated
  before the call (the caching allocator's view; the driver's own overhead is not included).

Time is the median of ``--repeats`` calls after one warm-up call. A variant whose predicted
footprint exceeds half of the available memory is skipped with a message, so the benchmark
cannot push a shared machine into swapping or the OOM killer; ``--seq`` shrinks the shape.

    python benchmarks/entropy_memory.py                   # [8, 4096, 32768], CPU
    python benchmarks/entropy_memory.py --seq 1024        # smaller input for small machines
    python benchmarks/entropy_memory.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, statistics, sys, time
import torch
from entropyrl.core.entropy import token_entropy

cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
device = cfg["device"]
gen = torch.Generator(device=device).manual_seed(0)
# In place: a temporary here would raise ru_maxrss above the input before the call.
logits = torch.randn(*cfg["shape"], generator=gen, device=device).mul_(4)


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def naive(x):
    return -(torch.softmax(x, -1) * torch.log_softmax(x, -1)).sum(-1)


if cfg["variant"] == "naive":
    fn = lambda: naive(logits)
else:
    fn = lambda: token_entropy(logits, chunk_size=cfg["chunk"])
if device == "cuda":
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
else:
    before = rss()
    out = fn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
ref = out.double().mean().item()
del out
times = []
for _ in range(cfg["repeats"]):
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
print(json.dumps({"peak": peak, "seconds": statistics.median(times), "mean_entropy": ref}))
"""


def available_bytes(device: str) -> int:
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--chunks", type=int, nargs="*", default=[4096, 1024, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--naive", action="store_true", help="also softmax * log_softmax")
    parser.add_argument(
        "--max-fraction",
        type=float,
        default=0.5,
        help="skip variants predicted to need more than this share of the available memory",
    )
    args = parser.parse_args()

    shape = [args.batch, args.seq, args.vocab]
    rows, vocab = args.batch * args.seq, args.vocab
    input_bytes = rows * vocab * 4
    variants: list[tuple[str, int | None, int]] = []  # (variant, chunk, predicted extra bytes)
    if args.naive:
        variants.append(("naive", None, 3 * input_bytes))
    # Two float32 temporaries of the block being processed (see token_entropy).
    variants.append(("unchunked", None, 2 * input_bytes))
    variants += [("chunked", c, 2 * min(c, rows) * vocab * 4) for c in args.chunks]

    print(
        f"token_entropy on {shape} float32 logits ({input_bytes / 2**30:.2f} GiB), "
        f"device {args.device}, torch threads {args.threads}, median of {args.repeats}\n"
    )
    print("| variant | chunk_size (rows) | extra peak memory | time (s) |")
    print("|---|---:|---:|---:|")
    reference = None
    for variant, chunk, predicted in variants:
        label = "naive softmax * log_softmax" if variant == "naive" else "token_entropy"
        if input_bytes + predicted > available_bytes(args.device) * args.max_fraction:
            print(
                f"| {label} | {chunk or 'none'} | skipped: needs ~{predicted / 2**30:.1f} GiB "
                f"+ input, over --max-fraction of the available memory | |"
            )
            continue
        cfg = {
            "shape": shape,
            "variant": variant,
            "chunk": chunk,
            "repeats": args.repeats,
            "threads": args.threads,
            "device": args.device,
        }
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            print(f"| {label} | {chunk or 'none'} | failed: {proc.stderr.strip()[-200:]} | |")
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        # Chunking must not change the result (the naive float32 reference may round apart).
        if variant != "naive":
            if reference is None:
                reference = res["mean_entropy"]
            elif res["mean_entropy"] != reference:
                # Bit for bit on the CPU; CUDA's reductions order by the block's shape.
                gap = abs(res["mean_entropy"] - reference) / abs(reference)
                print(f"note: chunk {chunk}: mean entropy differs by {gap:.1e} (relative)")
        print(
            f"| {label} | {chunk or 'none'} | {res['peak'] / 2**20:,.0f} MiB | "
            f"{res['seconds']:.2f} |"
        )


if __name__ == "__main__":
    main()
