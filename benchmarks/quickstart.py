"""Wall and CPU time of the quick start, on an idle machine and beside a CPU-bound neighbour.

    python benchmarks/quickstart.py --repeats 3
    python benchmarks/quickstart.py --first-run --repeats 3    # a new user's first and second run

Runs `bash examples/quickstart.sh` (the quick start, install already done: its setup step only
checks) with the demo's defaults, and side by side the reference settings `--vs` (by default those of the earlier quick
start: two torch threads, the warm-up trained in every run), each in two conditions:
idle, and beside one CPU-bound process (a Python busy loop started just before the run and
stopped after it). Runs alternate (A, B, A, B, ...) so that a drift of the machine's speed
reaches both. Prints one markdown table: medians with min-max, each condition's ratio to the same
settings idle, and the ratio of the two settings pair by pair. A run past `--timeout` is stopped
and counted at the timeout, marked `>`. The demo's own last line (PASS/FAIL) is kept per run.

With `--first-run` the two settings are the same options in two cache states instead: "first
run" in an empty HOME (no ~/.cache/entropyrl: tokenizer, warm-up cache, matplotlib's font cache
all cold), then "second run" in the HOME that first run left, as a new user meets them. The
install is done already in both (pip's downloads depend on the network and are reported apart).

CPU seconds are the run's and every process it waited for (the CHAIR service), from the
kernel's accounting (`os.wait4`), not the neighbour's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "--threads 2 --no-warmup-cache"
CONDITIONS = ("idle", "neighbour")


@dataclass
class Run:
    wall: float
    cpu: float
    stopped: bool  # hit the timeout
    verdict: str
    phases: dict[str, float]  # the demo's own timing of its warm-up and RL (summary.json)


def _busy_loop() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


# What points a run's caches away from HOME: removed when a run gets a HOME of its own.
CACHE_VARIABLES = ("ENTROPYRL_CACHE", "XDG_CACHE_HOME", "MPLCONFIGDIR", "HF_HOME")


def _environment(home: Path | None) -> dict[str, str]:
    """This process's environment, or with `home` as HOME and no cache variable pointing
    elsewhere (a new user's account)."""
    env = dict(os.environ)
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
        env["HOME"] = str(home)
        for name in CACHE_VARIABLES:
            env.pop(name, None)
    return env


def run_once(
    script: list[str],
    args: list[str],
    out: Path,
    *,
    neighbour: bool,
    timeout: float,
    home: Path | None = None,
) -> Run:
    """One quick start (`script` with `args`); beside a busy loop when `neighbour`; in `home`
    (a HOME of its own) when given."""
    busy = _busy_loop() if neighbour else None
    try:
        if busy is not None:
            time.sleep(0.5)  # the neighbour is running before the quick start starts
        command = [*script, "--no-progress", "--overwrite", "--out", str(out), *args]
        log = out.with_suffix(".log")
        started = time.perf_counter()
        with log.open("w") as handle:
            process = subprocess.Popen(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
                env=_environment(home),
            )
            stopped = False
            while True:
                pid, _, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() - started > timeout:
                    os.killpg(process.pid, signal.SIGINT)  # the demo stops its service on ^C
                    stopped = True
                    _, _, usage = os.wait4(process.pid, 0)
                    break
                time.sleep(0.2)
        wall = time.perf_counter() - started
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    verdict = "stopped" if stopped else (lines[-1] if lines else "no output")
    return Run(wall, usage.ru_utime + usage.ru_stime, stopped, verdict, _phases(out))


def _phases(out: Path) -> dict[str, float]:
    """Wall seconds of the warm-up (0 when it came from the cache) and of RL, as the demo
    measured them."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    warm = summary["warmup"]
    return {
        "warm-up": 0.0 if warm.get("cached") else warm["seconds"],
        "RL": sum(v["seconds"] for v in summary["variants"].values()),
    }


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def _timed(runs: list[Run], key: str) -> str:
    text = _median([getattr(r, key) for r in runs])
    return f"> {text}" if any(r.stopped for r in runs) else text


def _phase(runs: list[Run], name: str) -> str:
    values = [r.phases[name] for r in runs if name in r.phases]
    return _median(values) if values else "n/a"


def _verdicts(runs: list[Run]) -> str:
    words = [r.verdict.split(":", 1)[0] if not r.stopped else "stopped" for r in runs]
    return ", ".join(f"{w} x{words.count(w)}" for w in dict.fromkeys(words))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per settings and condition")
    parser.add_argument(
        "--script",
        default="bash examples/quickstart.sh",
        help="the quick start's command, before its options (default: %(default)s)",
    )
    parser.add_argument("--args", default="", help="options of the measured run (default: none)")
    parser.add_argument(
        "--vs", default=REFERENCE, help=f"options of the reference run (default: {REFERENCE!r})"
    )
    parser.add_argument(
        "--vs-repeats", type=int, default=None, help="runs of the reference (default: --repeats)"
    )
    parser.add_argument(
        "--conditions", default=",".join(CONDITIONS), help="idle, neighbour or both"
    )
    parser.add_argument(
        "--first-run",
        action="store_true",
        help="compare a first run in an empty HOME with the second run in the same HOME "
        "(--args for both; --vs unused)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a run stops")
    args = parser.parse_args(argv)
    conditions = [c for c in args.conditions.split(",") if c]
    if not set(conditions) <= set(CONDITIONS) or not conditions:
        parser.error(f"--conditions: choose from {', '.join(CONDITIONS)}")
    names = ("first run", "second run") if args.first_run else ("quick start", "reference")
    options = [shlex.split(args.args), shlex.split(args.args if args.first_run else args.vs)]
    settings = dict(zip(names, options, strict=True))
    repeats = {names[0]: args.repeats, names[1]: args.vs_repeats or args.repeats}
    results: dict[tuple[str, str], list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="quickstart-bench-") as folder:
        for repeat in range(max(repeats.values())):
            for condition in conditions:
                for name, options in settings.items():
                    if repeat >= repeats[name]:
                        continue
                    out = Path(folder) / f"{name.replace(' ', '-')}-{condition}-{repeat}"
                    # the second run's HOME is the one its first run left
                    home = Path(folder) / f"home-{condition}-{repeat}" if args.first_run else None
                    run = run_once(
                        shlex.split(args.script),
                        options,
                        out,
                        neighbour=condition == "neighbour",
                        timeout=args.timeout,
                        home=home,
                    )
                    results.setdefault((name, condition), []).append(run)
                    print(
                        f"# {name}, {condition}, run {repeat + 1}: {run.wall:.1f} s wall, "
                        f"{run.cpu:.1f} CPU-s; {run.verdict[:100]}",
                        file=sys.stderr,
                        flush=True,
                    )
    print(f"machine: {os.cpu_count()} cores; {os.uname().machine}; Python {sys.version.split()[0]}")
    print(f"{names[0]}: `{' '.join([args.script, args.args]).strip()}`")
    if args.first_run:
        print(f"{names[1]}: the same, in the HOME its first run left\n")
    else:
        print(f"{names[1]}: `{args.script} {args.vs}`\n")
    print(
        "| settings | condition | runs | wall s, median (min-max) | CPU s | x its idle wall "
        "| warm-up s | RL s | checks |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in settings:
        idle = results.get((name, "idle"))
        for condition in conditions:
            runs = results[(name, condition)]
            ratio = "1.00"
            if condition != "idle":
                ratio = "n/a"
                if idle:
                    value = statistics.median(r.wall for r in runs) / statistics.median(
                        r.wall for r in idle
                    )
                    ratio = f"{'> ' if any(r.stopped for r in runs) else ''}{value:.2f}"
            print(
                f"| {name} | {condition} | {len(runs)} | {_timed(runs, 'wall')} | "
                f"{_timed(runs, 'cpu')} | {ratio} | {_phase(runs, 'warm-up')} | "
                f"{_phase(runs, 'RL')} | {_verdicts(runs)} |"
            )
    print(f"\n| condition | {names[0]} / {names[1]}, wall (median of pairs) |")
    print("|---|---|")
    for condition in conditions:
        pairs = list(zip(results[(names[0], condition)], results[(names[1], condition)]))
        ratios = [a.wall / b.wall for a, b in pairs]
        mark = "< " if any(b.stopped for _, b in pairs) else ""
        print(f"| {condition} | {mark}{statistics.median(ratios):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
