"""Code reward throughput: programs scored per second and the sandbox's overhead per program.

    python benchmarks/sandbox.py                  # 64 programs x 5 repeats on 2 workers
    python benchmarks/sandbox.py --programs 4 --repeats 1   # smoke run

Every variant runs the same small stdin program (read two integers, print the sum) and is
measured side by side with plain `subprocess.run([python, "-c", program])`, the floor any
process-per-program scorer pays: repeats are interleaved so load changes hit all variants alike.
Latency is the median of single programs run one at a time; throughput is programs finished per
second with `--workers` programs in flight (threads, each waiting on its child process). Compare
ratios, not absolute numbers, on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from entropyrl.rewards.hybrid import compute_score
from entropyrl.rewards.sandbox import Sandbox, SandboxLimits, namespace_prefix

PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def plain(python_args: list[str]) -> Callable[[int], bool]:
    def run(i: int) -> bool:
        done = subprocess.run(
            [sys.executable, *python_args, "-c", PROGRAM],
            input=f"{i} {i}\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.stdout == f"{2 * i}\n"

    return run


def sandboxed(sandbox: Sandbox) -> Callable[[int], bool]:
    def run(i: int) -> bool:
        return sandbox.run(PROGRAM, f"{i} {i}\n").stdout == f"{2 * i}\n"

    return run


def scored(tmp_root: str, isolation: str, workers: int) -> Callable[[int], bool]:
    response = f"```python\n{PROGRAM}```"

    def run(i: int) -> bool:
        tests = json.dumps({"inputs": [f"{i} {i}\n"], "outputs": [f"{2 * i}\n"]})
        result = compute_score(
            "bench",
            response,
            tests,
            {"ability": "code"},
            isolation=isolation,
            max_concurrent=workers,
            tmp_root=tmp_root,
        )
        return result["score"] == 1.0

    return run


def math_scored(i: int) -> bool:
    result = compute_score("bench", f"so \\boxed{{{i}/2}}", f"{i / 2}", {"ability": "math"})
    return result["score"] == 1.0


def measure(
    variants: dict[str, Callable[[int], bool]], programs: int, repeats: int, workers: int
) -> dict[str, tuple[float, float]]:
    """{name: (median seconds per program one at a time, median programs/s on `workers`)}."""
    latency: dict[str, list[float]] = {name: [] for name in variants}
    throughput: dict[str, list[float]] = {name: [] for name in variants}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        # Warm-up, not timed: first imports, the namespace probe, math-verify's worker processes.
        for run in variants.values():
            list(pool.map(run, range(workers)))
        for _ in range(repeats):
            for name, run in variants.items():
                for i in range(min(programs, 16)):
                    start = time.perf_counter()
                    if not run(i):
                        raise RuntimeError(f"{name}: program {i} gave a wrong result")
                    latency[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                if not all(pool.map(run, range(programs))):
                    raise RuntimeError(f"{name}: a program gave a wrong result")
                throughput[name].append(programs / (time.perf_counter() - start))
    return {
        name: (statistics.median(latency[name]), statistics.median(throughput[name]))
        for name in variants
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=64, help="programs per throughput batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="programs in flight (cores)")
    args = parser.parse_args()

    limits = SandboxLimits()
    namespaces = namespace_prefix() is not None
    with tempfile.TemporaryDirectory(prefix="entropyrl-bench-") as tmp_root:
        variants = {
            "plain `subprocess.run([python, -c, program])`": plain([]),
            "plain, isolated interpreter (`python -I -S`)": plain(["-I", "-S"]),
            "`Sandbox.run`, no namespaces": sandboxed(
                Sandbox(limits, isolation="none", tmp_root=tmp_root, max_concurrent=args.workers)
            ),
        }
        if namespaces:
            variants["`Sandbox.run`, namespaces (net, pid, mount)"] = sandboxed(
                Sandbox(
                    limits, isolation="namespaces", tmp_root=tmp_root, max_concurrent=args.workers
                )
            )
        variants["`hybrid.compute_score`, code route (1 test)"] = scored(
            tmp_root, "auto", args.workers
        )
        results = measure(variants, args.programs, args.repeats, args.workers)
        math_result = measure({"math": math_scored}, args.programs, args.repeats, args.workers)
        if os.listdir(tmp_root):
            raise RuntimeError("a work directory was left behind")

    base_latency, base_rate = results["plain `subprocess.run([python, -c, program])`"]
    cpus = os.cpu_count()
    print("### Code sandbox throughput\n")
    print(
        f"{args.programs} programs per batch, {args.workers} in flight, {cpus} CPUs, medians of "
        f"{args.repeats} interleaved repeats; namespaces {'on' if namespaces else 'unavailable'}."
        "\n"
    )
    print(
        "| variant | ms / program (one at a time) | overhead vs plain (ms) | time / plain "
        f"| programs / s ({args.workers} workers) | rate / plain |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, (latency, rate) in results.items():
        print(
            f"| {name} | {latency * 1e3:.1f} | {(latency - base_latency) * 1e3:+.1f} "
            f"| {latency / base_latency:.2f} | {rate:.1f} | {rate / base_rate:.2f} |"
        )
    latency, rate = math_result["math"]
    print(
        f"\nMath route (math-verify in this process): {latency * 1e3:.2f} ms per answer, "
        f"{rate:.0f} answers/s with {args.workers} threads."
    )


if __name__ == "__main__":
    main()
