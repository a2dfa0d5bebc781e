"""Train the quick starts' warm-up checkpoints into the package (entropyrl/rig/local/warmups/).

    python tools/ship_warmups.py                  # both quick starts (~2 min on one core)
    python tools/ship_warmups.py --only captioning

Run it when tests/rig/local/test_shipped_warmups.py says a shipped checkpoint no longer matches
a fresh training (a change to the warm-up's code or the quick starts' defaults), then commit the
folder. One CPU thread, as the quick starts run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entropyrl.rig.local.warmup_shipping import QUICKSTARTS, ship


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(QUICKSTARTS), action="append")
    args = parser.parse_args(argv)
    for entry in ship(names=tuple(args.only or QUICKSTARTS)):
        size = sum(f.stat().st_size for f in entry.folder.iterdir()) / 2**20
        print(
            f"shipped {entry.folder.relative_to(Path.cwd()) if entry.folder.is_relative_to(Path.cwd()) else entry.folder} ({size:.1f} MiB)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
