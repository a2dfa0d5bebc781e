"""``python -m chair_server.evaluate``: CHAIR of a captions file, printed as a markdown table.

    python -m chair_server.evaluate --captions caps.jsonl (--coco DIR | --ground-truth FILE) \
        [--json OUT]

``caps.jsonl`` holds one ``{"image_id": ..., "caption": "..."}`` per line. CHAIR_s, CHAIR_i and
recall are printed in percent (as papers print them), n/a when no caption could be scored (null
in the output of ``--json``, which writes the full scorer output, whole or not at all).

Ctrl-C prints one line (what it was doing; nothing is written) and exits with 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from chair_server import strict_json
from chair_server.scorer import ChairScorer


def read_captions(path: str | Path) -> list[dict[str, Any]]:
    """JSON lines of ``{"image_id", "caption"}``; errors name the line and the field."""
    items = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: malformed JSON ({exc})") from exc
            if not isinstance(item, dict):
                raise ValueError(f"{path}:{number}: expected an object with image_id and caption")
            for name in ("image_id", "caption"):
                if name not in item:
                    raise ValueError(f"{path}:{number}: {name} is missing")
            items.append({"image_id": item["image_id"], "caption": item["caption"]})
    return items


def _cell(value: float | None, scale: float = 1.0) -> str:
    """A metric to one decimal; n/a for a value over nothing (None), never a fake 0.0."""
    return "n/a" if value is None else f"{scale * value:.1f}"


def format_table(name: str, overall: dict[str, Any]) -> str:
    """One-row markdown table of the corpus metrics (percent; n/a where nothing was scored)."""
    return "\n".join(
        [
            "| file | CHAIR_s | CHAIR_i | recall | mean length (words) | scored | errors |",
            "|---|---|---|---|---|---|---|",
            f"| {name} | {_cell(overall['CHAIRs'], 100)} | {_cell(overall['CHAIRi'], 100)} | "
            f"{_cell(overall['Recall'], 100)} | {_cell(overall['mean_length'])} | "
            f"{overall['captions']} | {overall['errors']} |",
        ]
    )


def write_json_whole(obj: Any, path: str | Path) -> None:
    """JSON written beside ``path`` and renamed onto it: a reader (or an interrupted run) never
    sees half a file. The file gets the usual mode of a new file (0666 less the umask). Strict
    JSON: a non-finite number (e.g. an image id given as NaN, echoed back) is null."""
    path = Path(path)
    text = strict_json.dumps(obj, indent=1)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """0 done, 2 missing or malformed input, 130 interrupted (Ctrl-C)."""
    parser = argparse.ArgumentParser(prog="python -m chair_server.evaluate", description=__doc__)
    parser.add_argument("--captions", required=True, help="JSON lines {image_id, caption}")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--coco", help="folder with COCO 2014 annotation files")
    source.add_argument("--ground-truth", help='JSON {"<image_id>": [category, ...]}')
    parser.add_argument("--cache-dir", help="ground-truth cache folder for --coco")
    parser.add_argument("--json", dest="json_out", help="write the full scorer output here")
    args = parser.parse_args(argv)
    doing = "loading the ground truth"
    try:
        try:
            if args.coco:
                scorer = ChairScorer.from_coco(args.coco, cache_dir=args.cache_dir)
            else:
                scorer = ChairScorer.from_ground_truth(args.ground_truth)
            doing = f"reading {args.captions}"
            captions = read_captions(args.captions)
            doing = f"scoring {len(captions)} captions"
            result = scorer.score_corpus(captions)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        _report(Path(args.captions).name, result["overall_metrics"])
        if args.json_out:
            doing = f"writing {args.json_out}"
            write_json_whole(result, args.json_out)
    except KeyboardInterrupt:
        written = (
            "the table is printed, --json not written"
            if doing.startswith("writing")
            else "nothing written"
        )
        print(f"interrupted while {doing}; {written}", file=sys.stderr)
        return 130
    return 0


def _report(name: str, overall: dict[str, Any]) -> None:
    print(format_table(name, overall))
    if overall["errors"]:
        print(f"{overall['errors']} captions left out (unknown image id)", file=sys.stderr)
    if not overall["captions"]:
        print(
            "no caption could be scored: CHAIR_s, CHAIR_i and recall are n/a (null in --json); "
            "check that the ground truth covers these image ids",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.exit(main())
