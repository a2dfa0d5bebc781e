"""``entropyrl prepare coco|fc|mixed-debug``: the converters of `entropyrl.data` on the command
line.

Top-level imports stay light (argparse only) so ``entropyrl --help`` is fast; the converters
and pyarrow load when a command runs. Exit codes: 0 done, 2 missing or malformed input, 130
interrupted (Ctrl-C: one line; every output file is written whole or not at all, so the files
in --out are complete ones).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from entropyrl.data.io import InputFileError


def register(subparsers: Any) -> None:
    """Add ``prepare`` with the ``coco`` and ``fc`` sub-commands to the entropyrl CLI."""
    prepare = subparsers.add_parser(
        "prepare", help="convert data sets to verl RLHF parquet (coco captions, function calling)"
    )
    commands = prepare.add_subparsers(dest="prepare_command", metavar="SOURCE")

    coco = commands.add_parser(
        "coco",
        help="COCO 2014 captions -> parquet, CIDEr-D df file, CHAIR ground truth",
        description="COCO 2014 captions -> {train,val,test}.parquet, cider_df.json.gz (train "
        "references), chair_ground_truth.json and manifest.json (the split rule, the images per "
        "split and COCO source, the images held out, the Karpathy file's sha256). No val2014 "
        "image is trained on unless --restval: CHAIR's and POPE's images are val2014.",
    )
    coco.add_argument("--annotations", required=True, help="folder with captions_*2014.json")
    coco.add_argument("--images", required=True, help="folder with train2014/ and val2014/")
    coco.add_argument(
        "--karpathy",
        default=None,
        metavar="PATH",
        help="Karpathy's splits: dataset_coco.json, or the Hugging Face dataset "
        "yerevann/coco-karpathy (its folder of parquet files, or one of them); without it a "
        "hash split of val2014, said on stderr",
    )
    coco.add_argument("--out", required=True, help="output folder")
    coco.add_argument(
        "--prompt",
        default=None,
        help='user prompt (default "<image>Please describe this image in detail.", the CHAIR '
        "evaluation prompt)",
    )
    coco.add_argument(
        "--val-size", type=int, default=5000, help="val2014 images for val without --karpathy"
    )
    coco.add_argument(
        "--test-size",
        type=int,
        default=5000,
        help="val2014 images for test without --karpathy (the rest are restval)",
    )
    coco.add_argument(
        "--restval",
        action="store_true",
        help="train on restval (the val2014 images outside val and test), as papers' Karpathy "
        "train does; by default they are held out in test.parquet, since CHAIR's and POPE's "
        "images are val2014 (a warning says how many val2014 images are then trained on)",
    )
    coco.add_argument(
        "--no-check-images", action="store_true", help="do not require the image files to exist"
    )
    coco.add_argument("--no-chair", action="store_true", help="skip chair_ground_truth.json")
    coco.add_argument(
        "--hold-out",
        default=None,
        metavar="FILE",
        help="images (ids or COCO file names, e.g. a paper's CHAIR or POPE list) kept out of "
        "training: put into the test split whatever split they would have had",
    )
    coco.set_defaults(func=_run_coco)

    fc = commands.add_parser(
        "fc",
        help="function-calling data (xlam, messages, bfcl) -> parquet",
        description="Function-calling data -> train.parquet / test.parquet; the split depends "
        "only on each example's content (sha1), never on the input order.",
    )
    fc.add_argument("--format", required=True, choices=("xlam", "messages", "bfcl"))
    fc.add_argument("--input", required=True, help="JSON or JSON-lines file")
    fc.add_argument(
        "--answers",
        default=None,
        help="BFCL possible-answer file (default: possible_answer/<input name> beside the input)",
    )
    fc.add_argument("--out", required=True, help="output folder")
    fc.add_argument(
        "--max-samples", type=int, default=1000, help="examples kept (<= 0: all; default 1000)"
    )
    fc.add_argument(
        "--test-size",
        type=float,
        default=0.05,
        help="test fraction (< 1) or count (>= 1); default 0.05",
    )
    fc.add_argument("--seed", type=int, default=42, help="salt of the sample/split hash (42)")
    fc.add_argument("--system-prompt", default=None, help="system text placed before the tools")
    fc.add_argument("--data-source", default="function_calling", help="data_source column")
    fc.set_defaults(func=_run_fc)

    mixed = commands.add_parser(
        "mixed-debug",
        help="a small generated math + code set (train/val parquet) for dry runs",
        description="Generated math (fractions, percentages, equations) and code (stdin and "
        "function-call tests in verl's formats) rows, alternating, with `ability` in each row "
        "and a reference answer in extra_info -> train.parquet / val.parquet.",
    )
    mixed.add_argument("--out", required=True, help="output folder")
    mixed.add_argument("--train-size", type=int, default=32, help="train rows (32)")
    mixed.add_argument("--val-size", type=int, default=8, help="val rows (8)")
    mixed.add_argument("--seed", type=int, default=0, help="generator seed (0)")
    mixed.set_defaults(func=_run_mixed_debug)

    prepare.set_defaults(func=lambda args: _usage(prepare))


def _converter(
    errors: type[Exception],
) -> Callable[[Callable[[argparse.Namespace], dict[str, Any]]], Callable[..., int]]:
    """A converter's command: its summary on stdout (rejects and warnings on stderr) and 0;
    `errors` (bad input) as one line on stderr and 2; Ctrl-C as one line and 130 (128 + SIGINT)."""

    def decorate(convert: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[..., int]:
        @functools.wraps(convert)
        def run(args: argparse.Namespace) -> int:
            try:
                summary = convert(args)
            except errors as error:
                print(f"error: {error}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print(
                    f"interrupted during prepare {args.prepare_command}; partial outputs in "
                    f"{args.out} (the files finished before it, each whole)",
                    file=sys.stderr,
                )
                return 130
            _report(summary)
            return 0

        return run

    return decorate


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _report(summary: dict[str, Any]) -> None:
    first = summary.pop("first_rejects", [])
    print(json.dumps(summary, indent=1, ensure_ascii=False))
    if first:
        print(f"first {len(first)} rejected rows:", file=sys.stderr)
        for line in first:
            print(f"  {line}", file=sys.stderr)
    for warning in summary.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)


@_converter(InputFileError)
def _run_coco(args: argparse.Namespace) -> dict[str, Any]:
    from entropyrl.data.coco import DEFAULT_CAPTION_PROMPT, prepare_coco
    from entropyrl.data.io import read_image_list

    hold_out = read_image_list(args.hold_out) if args.hold_out else None
    return prepare_coco(
        args.annotations,
        args.images,
        args.out,
        karpathy=args.karpathy,
        prompt=args.prompt or DEFAULT_CAPTION_PROMPT,
        val_size=args.val_size,
        test_size=args.test_size,
        check_images=not args.no_check_images,
        chair_ground_truth=not args.no_chair,
        hold_out=hold_out,
        restval=args.restval,
    )


@_converter(ValueError)
def _run_mixed_debug(args: argparse.Namespace) -> dict[str, Any]:
    from entropyrl.data.mixed_debug import prepare_mixed_debug

    return prepare_mixed_debug(
        args.out, train_size=args.train_size, val_size=args.val_size, seed=args.seed
    )


@_converter(InputFileError)
def _run_fc(args: argparse.Namespace) -> dict[str, Any]:
    from entropyrl.data.function_calling import DEFAULT_SYSTEM_PROMPT, prepare_function_calling

    return prepare_function_calling(
        args.input,
        args.out,
        fmt=args.format,
        answers_path=args.answers,
        max_samples=args.max_samples,
        test_size=args.test_size,
        seed=args.seed,
        system_prompt=args.system_prompt or DEFAULT_SYSTEM_PROMPT,
        data_source=args.data_source,
    )
