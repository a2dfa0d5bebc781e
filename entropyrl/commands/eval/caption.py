"""`entropyrl eval caption`: from verl checkpoints to the table a hallucination paper reports.

    entropyrl eval caption --model base=Qwen/Qwen2.5-VL-3B-Instruct \\
        --model entropyrl=checkpoints/entropyrl/chair_mscoco_qwen2_5_vl_3b_entropyrl \\
        --data data/coco --coco coco/annotations --out eval/chair_mscoco_qwen2_5_vl_3b [--dry-run]

Per model (`NAME=PATH`: a Hugging Face folder or cached hub id, used as it is; a verl run folder,
whose last `global_step_N` is taken; or one `global_step_N`), a verl checkpoint is merged into a
Hugging Face model by verl's model merger (a LoRA run's adapter folded in by
`entropyrl.commands.merge_lora`), then it captions and answers greedily, and everything is scored:

- CHAIR on `--num-images` (500) held-out val2014 images (`entropyrl.evaluation.protocol`), at each
  `--max-new-tokens` (512 and 64): CHAIR_s, CHAIR_i, recall, mean length, with CIDEr-D and BLEU-4
  (`entropyrl.evaluation.caption_metrics`);
- caption quality on Karpathy's test split as well, when the data was prepared from
  `dataset_coco.json`;
- POPE from the released question files (`--pope-dir`) or rebuilt from the annotations
  (`entropyrl.evaluation.pope`);
- every metric with a 95 % bootstrap interval over images, every model's paired difference from
  the first model (the base) on the same images.

Written to `--out`: `images.json` (the image set, reused by a later run), `results.json`,
`table.md`, `figure.png`, and per model `captions.jsonl`, `pope.jsonl` and `settings.json`. The
same command after an interruption merges and generates only what is missing.

The parts, beside it in `entropyrl.commands.eval`: `models` (NAME=PATH, merging), `plan` (images,
protocols, `--dry-run`), `generation` (the resumable child that generates), `report` (scores,
tables, figure).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from entropyrl.commands.eval.generation import check_settings, generate_for_model
from entropyrl.commands.eval.models import EvalError, prepare_model
from entropyrl.commands.eval.plan import DEFAULT_TOKENS, Plan, describe_plan, make_plan
from entropyrl.commands.eval.report import (
    chair_scorer,
    score_model_captions,
    score_model_pope,
    write_report,
)
from entropyrl.core.files import write_json
from entropyrl.data.io import InputFileError


def _write_image_list(plan: Plan) -> None:
    """images.json beside the results; a later run with the same --out must use the same set."""
    path = plan.out / "images.json"
    payload = {"image_ids": plan.chair_ids, **plan.chair_source}
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("image_ids") != plan.chair_ids:
            raise EvalError(
                f"{path} lists another image set: the results in {plan.out} belong to it; use "
                f"another --out, or --image-list {path} to evaluate on the same images"
            )
        return
    plan.out.mkdir(parents=True, exist_ok=True)
    write_json(payload, path)


def evaluate(args: argparse.Namespace) -> int:
    """Plan, then (unless a dry run) merge, generate what is missing, score and report."""
    plan = make_plan(args)
    print(describe_plan(plan), file=sys.stderr)
    if args.dry_run:
        return 0
    if plan.backend == "vllm" and plan.gpus < plan.tensor_parallel_size:
        raise EvalError(
            f"the vllm backend needs {plan.tensor_parallel_size} GPU(s), {plan.gpus} here "
            "(--backend transformers generates on the CPU, slowly)"
        )
    _write_image_list(plan)
    for model in plan.models:
        check_settings(plan, model)
    for model in plan.models:
        prepare_model(model)
        generate_for_model(plan, model)
    scorer = chair_scorer(
        args.coco, args.chair_ground_truth or str(Path(args.data) / "chair_ground_truth.json")
    )
    caption_values = {m.name: score_model_captions(plan, m, scorer) for m in plan.models}
    pope_values = {m.name: score_model_pope(plan, m) for m in plan.models}
    write_report(plan, caption_values, pope_values)
    print(f"wrote {plan.out / 'results.json'}, {plan.out / 'table.md'}, {plan.out / 'figure.png'}")
    print((plan.out / "table.md").read_text())
    return 0


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a model to evaluate (repeat; the first is the base of the "
        "comparison): a Hugging Face folder or cached hub id, a verl run folder "
        "(its last global_step_N) or one global_step_N",
    )
    parser.add_argument(
        "--data",
        required=True,
        help="folder of entropyrl prepare coco (test.parquet: the held-out images)",
    )
    parser.add_argument("--out", required=True, help="results folder (resumed when it exists)")
    parser.add_argument(
        "--coco",
        default=None,
        help="COCO 2014 annotation folder: CHAIR's ground truth (instances + "
        "captions of train + val) and POPE's rebuild (instances_val2014.json)",
    )
    parser.add_argument(
        "--chair-ground-truth",
        default=None,
        help="without --coco: CHAIR ground truth JSON (default DATA/chair_ground_truth.json)",
    )
    parser.add_argument(
        "--image-list",
        default=None,
        help="CHAIR images from this file (ids or COCO file names; e.g. a paper's "
        "500) instead of a seeded sample; refused if it overlaps training",
    )
    parser.add_argument(
        "--num-images",
        type=int,
        default=500,
        help="CHAIR images drawn from the held-out split (0: all of them)",
    )
    parser.add_argument("--seed", type=int, default=0, help="image sample and bootstrap seed")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        nargs="+",
        default=list(DEFAULT_TOKENS),
        help="caption lengths to report CHAIR at (default 512 64)",
    )
    parser.add_argument(
        "--prompt",
        default=None,
        help="caption prompt (default: the prepared data's, as in training)",
    )
    parser.add_argument(
        "--quality",
        choices=("auto", "chair"),
        default="auto",
        help="auto: also caption Karpathy's test split when the data came from "
        "dataset_coco.json; chair: CIDEr-D on the CHAIR images only",
    )
    parser.add_argument(
        "--pope-dir",
        default=None,
        help="folder with POPE's released coco_pope_{random,popular,adversarial}.json",
    )
    parser.add_argument(
        "--pope-sha256",
        action="append",
        metavar="SETTING=HEX",
        help="expected sha256 of a released POPE file (repeat per setting); a mismatch stops",
    )
    parser.add_argument(
        "--pope-images",
        type=int,
        default=500,
        help="images of a rebuilt POPE set (each 3 present + 3 absent objects)",
    )
    parser.add_argument("--no-pope", action="store_true", help="leave POPE out")
    parser.add_argument(
        "--backend",
        default="auto",
        help="vllm (GPUs), transformers (CPU or one GPU), auto: vllm when a GPU and vLLM are here",
    )
    parser.add_argument("--tensor-parallel-size", "--tp", type=int, default=1)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=8192,
        help="vllm backend: context length (image tokens + prompt + answer; default 8192)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="transformers backend batch")
    parser.add_argument("--device", default=None, help="transformers backend device")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and what it needs; merge and generate nothing",
    )


def _main_args(args: argparse.Namespace) -> int:
    from entropyrl.evaluation.pope import ChecksumError
    from entropyrl.evaluation.protocol import ProtocolError

    try:
        return evaluate(args)
    except (EvalError, ProtocolError, InputFileError, ChecksumError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


# What a CIDEr-D figure of this evaluation compares with (--help's closing note).
CIDER_NOTE = (
    "CIDEr-D is computed as pycocoevalcap's Cider computes it: its document frequencies come "
    "from the references of exactly the evaluated images (one Cider().compute_score call over "
    "them), so a figure compares with a paper's only over the same images: Karpathy's test "
    "split (data prepared from dataset_coco.json) or --image-list with the paper's list. The "
    "training reward and validation CIDEr-D (reward/cider, val-aux/coco_caption/cider) fix "
    "their frequencies over the training references (cider_df.json.gz): a different figure. "
    "Captions are tokenised without Java, close to PTB (docs/hallucination_eval.md)."
)


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m entropyrl.commands.eval.caption"
) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], epilog=CIDER_NOTE
    )
    add_arguments(parser)
    return _main_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
