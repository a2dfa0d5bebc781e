"""Peak memory of a whole run: the summed PSS of a command and every process it starts.

    python benchmarks/smoke_memory.py -- bash examples/chair_mscoco.sh --smoke --out runs/smoke

A verl smoke is many processes (the driver, Ray's raylet and GCS, workers, rollout servers,
TransferQueue, the CHAIR service); RSS counts their shared pages once per process, PSS shares
them out, so the sum is what the run takes from the machine. Samples every `--interval` seconds
(Linux `/proc/PID/smaps_rollup`), prints the peak and the command's wall time and exit status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(name))  # fields[1]: the parent's pid
    return tree


def tree_pss_kb(root: int) -> int:
    """Summed PSS (kB) of `root` and all its descendants."""
    tree, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
                total += sum(int(line.split()[1]) for line in handle if line.startswith("Pss:"))
        except OSError:
            continue
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    started = time.perf_counter()
    process = subprocess.Popen(command)
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_pss_kb(process.pid))
        time.sleep(args.interval)
    wall = time.perf_counter() - started
    print(f"peak PSS {peak / 1e6:.2f} GB, wall {wall:.0f} s, exit {process.returncode}")
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
