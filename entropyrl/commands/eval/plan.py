"""The plan of a caption evaluation: the models, the held-out images, the caption sets and
POPE's questions, the backend, and `describe_plan`, what `--dry-run` prints (what it will do
and what it needs).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entropyrl.commands.eval.models import EvalError, ModelSource, parse_models
from entropyrl.data.io import InputFileError
from entropyrl.evaluation.generation import DECODING_TEXT

DEFAULT_TOKENS = (512, 64)
DEFAULT_PROMPT = "Please describe this image in detail."
POPE_TOKENS = 32


@dataclass
class CaptionSet:
    """Captions of `image_ids` at `max_new_tokens`; `name@tokens` keys it everywhere."""

    name: str
    image_ids: list[int]
    max_new_tokens: int
    description: str
    planned: int = 0  # images it will hold, for a dry run before the data is prepared

    @property
    def key(self) -> str:
        return f"{self.name}@{self.max_new_tokens}"

    @property
    def size(self) -> int:
        return len(self.image_ids) or self.planned


@dataclass
class Plan:
    out: Path
    data: Path
    models: list[ModelSource]
    prompt: str
    images: dict[int, Any]  # image_id -> EvalImage (every split that can be asked about)
    chair_ids: list[int]
    chair_source: dict[str, Any]
    caption_sets: list[CaptionSet]
    quality_note: str
    pope: dict[str, list[Any]]  # setting -> PopeQuestion
    pope_source: str
    pope_note: str
    ground_truth: str
    backend: str
    tensor_parallel_size: int
    max_model_len: int
    batch_size: int
    device: str | None
    resamples: int
    seed: int
    gpus: int
    notes: list[str] = field(default_factory=list)
    pope_planned: int = 0  # POPE questions a dry run before the data is prepared expects

    def caption_requests(self) -> int:
        return sum(s.size for s in self.caption_sets)

    def pope_requests(self) -> int:
        return sum(len(questions) for questions in self.pope.values()) or self.pope_planned


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _choose_chair_images(
    args: argparse.Namespace,
    held_out: Mapping[int, Any],
    training: set[int],
    available: Mapping[int, Any],
) -> tuple[list[int], dict[str, Any]]:
    from entropyrl.data.io import read_image_list
    from entropyrl.evaluation.protocol import check_held_out, sample_image_ids

    if args.image_list:
        ids = read_image_list(args.image_list)
        check_held_out(ids, available=available, training=training)
        return ids, {"from": "list", "file": str(Path(args.image_list).resolve())}
    count = len(held_out) if args.num_images == 0 else args.num_images
    ids = sample_image_ids(held_out, count, args.seed)
    return ids, {
        "from": "seeded sample of the prepared test split",
        "seed": args.seed,
        "candidates": len(held_out),
        "rule": "random.Random(seed).sample(sorted image ids, n), then sorted",
    }


def _expected_sha256(entries: list[str] | None) -> dict[str, str]:
    """`--pope-sha256 SETTING=HEX` entries as {setting: hex}."""
    from entropyrl.evaluation.pope import POPE_SETTINGS

    expected = {}
    for entry in entries or []:
        setting, sep, digest = entry.partition("=")
        if not sep or setting not in POPE_SETTINGS:
            raise EvalError(
                f"--pope-sha256 {entry!r}: expected SETTING=HEX, SETTING one of {POPE_SETTINGS}"
            )
        expected[setting] = digest
    return expected


def _pope_questions(
    args: argparse.Namespace,
    held_out: Mapping[int, Any],
    training: set[int],
    images: Mapping[int, Any],
) -> tuple[dict[str, list[Any]], str, str]:
    from entropyrl.evaluation.pope import (
        POPE_SETTINGS,
        build_pope,
        coco_objects_by_image,
        load_pope_questions,
    )

    if args.no_pope:
        return {}, "off", "POPE left out (--no-pope)"
    if not held_out:
        if args.pope_dir or args.coco:
            how = "the released files" if args.pope_dir else f"rebuilt from {args.coco}"
            return {}, "planned", f"POPE ({how}): read once the prepared data is there"
        return {}, "off", "POPE left out: give --pope-dir (released files) or --coco (rebuild)"
    if args.pope_dir:
        from entropyrl.evaluation.pope import file_sha256, released_set_problems

        expected = _expected_sha256(args.pope_sha256)
        questions: dict[str, list[Any]] = {}
        digests = []
        for setting in POPE_SETTINGS:
            path = Path(args.pope_dir) / f"coco_pope_{setting}.json"
            questions[setting] = load_pope_questions(path, expected_sha256=expected.get(setting))
            digests.append(f"{path.name} sha256 {file_sha256(path)}")
        ids = {q.image_id for qs in questions.values() for q in qs}
        missing = sorted(ids - set(images))
        if missing:
            raise EvalError(
                f"{len(missing)} POPE images are not in the prepared data (e.g. {missing[:5]}): "
                "POPE's images are val2014; prepare the data from the full val2014 folder"
            )
        seen = sorted(ids & training)
        checked = "checked against --pope-sha256" if expected else "not checked: no --pope-sha256"
        problems = released_set_problems(questions)
        shape = (
            "NOT the released files' shape, not comparable with papers: " + "; ".join(problems)
            if problems
            else "the released shape: 3 x 3,000 questions over the same 500 images, "
            "3 present + 3 absent objects each"
        )
        note = (
            f"POPE: the released question files (RUCAIBox/POPE output/coco; {shape}; {checked}; "
            f"{'; '.join(digests)})"
        )
        if seen:
            note += f"; {len(seen)} of its {len(ids)} images are training images of this data"
        return questions, "released", note
    instances = Path(args.coco or "") / "instances_val2014.json"
    if not args.coco or not instances.is_file():
        return {}, "off", "POPE left out: give --pope-dir (released files) or --coco (rebuild)"
    from entropyrl.data.io import read_json

    loaded = read_json(instances)
    categories = [str(category["name"]) for category in loaded.get("categories", [])]
    objects = coco_objects_by_image(loaded)
    objects = {image_id: names for image_id, names in objects.items() if image_id in held_out}
    eligible = sum(len(set(names)) >= 3 for names in objects.values())
    if eligible == 0:
        return {}, "off", "POPE left out: no held-out image has 3 annotated objects"
    count = min(args.pope_images, eligible)
    questions = {
        setting: build_pope(
            objects,
            setting=setting,
            num_images=count,
            seed=args.seed,
            extra_categories=categories,
        )
        for setting in POPE_SETTINGS
    }
    note = (
        f"POPE rebuilt from {instances} over {count} held-out images with >= 3 objects "
        f"(of {eligible}; POPE's procedure, not the released files: not comparable with "
        "papers' POPE)"
    )
    return questions, "rebuilt", note


def make_plan(args: argparse.Namespace) -> Plan:
    from entropyrl.evaluation.generation import BACKENDS
    from entropyrl.evaluation.protocol import read_split

    out = Path(args.out)
    data = Path(args.data)
    notes: list[str] = []
    try:
        held_out = read_split(data / "test.parquet")
    except InputFileError as error:
        if not args.dry_run:
            raise
        notes.append(f"prerequisite not met: {error}")
        held_out = {}
    images = dict(held_out)
    if (data / "val.parquet").is_file():
        images.update(read_split(data / "val.parquet"))
    training: set[int] = set()
    if (data / "train.parquet").is_file():
        train = read_split(data / "train.parquet")
        training = set(train)
        if args.pope_dir:
            images.update(train)
    prompts = {image.prompt for image in held_out.values()} or {DEFAULT_PROMPT}
    prompt = args.prompt or sorted(prompts)[0]
    if held_out:
        chair_ids, chair_source = _choose_chair_images(args, held_out, training, images)
    else:  # a dry run without data: the plan, with the sample it would draw
        chair_ids, chair_source = [], {"from": f"{args.num_images} drawn from test.parquet"}
    tokens = sorted(set(args.max_new_tokens), reverse=True)
    sets = [
        CaptionSet(
            "chair",
            chair_ids,
            budget,
            f"{len(chair_ids)} held-out images" if held_out else f"{args.num_images} images",
            planned=0 if held_out else args.num_images,
        )
        for budget in tokens
    ]
    # Karpathy's own test images: `prepare coco` also holds out restval and a paper's list
    # (sources `karpathy_restval`, `karpathy_hold_out`), which are not his test split.
    karpathy_test = sorted(i for i, image in held_out.items() if image.source == "karpathy")
    if karpathy_test and args.quality == "auto":
        sets.append(
            CaptionSet("karpathy_test", karpathy_test, min(tokens), "Karpathy's test split")
        )
        quality_note = (
            f"CIDEr-D and BLEU-4 on Karpathy's test split ({len(karpathy_test)} images, "
            f"{min(tokens)} new tokens) compare with papers' Karpathy-test figures (up to the "
            "tokenisation, see docs/hallucination_eval.md); on the CHAIR images only within "
            "this project"
        )
    elif not held_out:
        quality_note = (
            "CIDEr-D and BLEU-4 on Karpathy's test split too when the prepared data comes from "
            "dataset_coco.json, else on the CHAIR images only"
        )
    else:
        quality_note = (
            "CIDEr-D and BLEU-4 on the CHAIR images (no dataset_coco.json: not Karpathy's test "
            "split), comparable within this project only"
        )
    pope, pope_source, pope_note = _pope_questions(args, held_out, training, images)
    pope_planned = 0
    if pope_source == "planned":
        from entropyrl.evaluation.pope import POPE_SETTINGS, RELEASED_IMAGES, RELEASED_PER_IMAGE

        per_setting = RELEASED_IMAGES if args.pope_dir else args.pope_images
        pope_planned = len(POPE_SETTINGS) * RELEASED_PER_IMAGE * per_setting
    if args.coco:
        ground_truth = f"COCO instances + captions in {args.coco} (the original CHAIR code's)"
    else:
        path = Path(args.chair_ground_truth or data / "chair_ground_truth.json")
        ground_truth = f"{path} (written by entropyrl prepare coco from COCO instances + captions)"
    gpus = _gpu_count()
    backend = args.backend
    if backend == "auto":
        backend = "vllm" if gpus and _vllm_importable() else "transformers"
        if backend == "transformers":
            notes.append(
                "backend auto: vllm on a GPU node with vLLM; here (no GPU or no vLLM) "
                "transformers generate, on the CPU at float32: fine for the smoke, hours for a "
                "3B model on 500 images"
            )
    if backend not in BACKENDS:
        raise EvalError(f"--backend must be auto or one of {BACKENDS}, got {backend!r}")
    models = parse_models(args.model, out, dry_run=args.dry_run)
    if len(prompts) > 1:
        notes.append(f"the test split holds {len(prompts)} prompts; evaluating with {prompt!r}")
    return Plan(
        out=out,
        data=data.resolve(),
        models=models,
        prompt=prompt,
        images=images,
        chair_ids=chair_ids,
        chair_source=chair_source,
        caption_sets=sets,
        quality_note=quality_note,
        pope=pope,
        pope_source=pope_source,
        pope_note=pope_note,
        ground_truth=ground_truth,
        backend=backend,
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        batch_size=args.batch_size,
        device=args.device,
        resamples=args.resamples,
        seed=args.seed,
        gpus=gpus,
        notes=notes,
        pope_planned=pope_planned,
    )


def describe_plan(plan: Plan) -> str:
    """What the run will do and need, for `--dry-run` and the log."""
    per_model_tokens = sum(s.size * s.max_new_tokens for s in plan.caption_sets)
    per_model_tokens += plan.pope_requests() * POPE_TOKENS
    lines = [f"caption evaluation -> {plan.out}", "models (the first is the base):"]
    if not plan.models:
        lines.append("  (none given)")
    lines += [f"  {model.name}: {model.describe()}" for model in plan.models]
    lines.append(f"prompt: {plan.prompt!r}, the model's chat template, {DECODING_TEXT}")
    for caption_set in plan.caption_sets:
        lines.append(
            f"captions {caption_set.key}: {caption_set.description}, "
            f"max_new_tokens {caption_set.max_new_tokens}: CHAIR_s, CHAIR_i, recall, length, "
            "CIDEr-D, BLEU-4"
        )
    lines.append(f"CHAIR images: {json.dumps(plan.chair_source)}")
    lines.append(f"CHAIR ground truth: {plan.ground_truth}")
    lines.append(f"caption quality: {plan.quality_note}")
    if plan.pope:
        counts = ", ".join(f"{s} {len(q)}" for s, q in plan.pope.items())
        lines.append(f"POPE ({plan.pope_source}): {counts} questions, {POPE_TOKENS} new tokens")
    elif plan.pope_planned:
        lines.append(f"POPE: about {plan.pope_planned:,} questions, {POPE_TOKENS} new tokens")
    lines.append(plan.pope_note)
    lines.append(
        f"statistics: 95 % percentile bootstrap over images ({plan.resamples} resamples, "
        f"seed {plan.seed}); paired differences from the first model"
    )
    lines.append(
        f"generation per model: {plan.caption_requests():,} captions + {plan.pope_requests():,} "
        f"POPE answers, at most {per_model_tokens:,} new tokens; {len(plan.models)} model(s)"
    )
    if plan.backend == "vllm":
        need = f"vllm backend: {plan.tensor_parallel_size} GPU(s) (tensor parallel)"
        here = f"{plan.gpus} GPU(s) here"
        if plan.gpus < plan.tensor_parallel_size:
            here += " -> not enough: run it on a GPU node, or --backend transformers (CPU, slow)"
        lines.append(f"needs: {need}; {here}")
    else:
        device = plan.device or ("cuda" if plan.gpus else "cpu")
        lines.append(
            f"needs: transformers backend on {device} (batch {plan.batch_size}); "
            f"{plan.gpus} GPU(s) here"
        )
    missing = [m.name for m in plan.models if m.kind == "missing"]
    if missing:
        lines.append(f"not ready: {', '.join(missing)} (see above); the run would stop there")
    merges = [m for m in plan.models if m.kind == "checkpoint"]
    if merges:
        lines.append(
            f"merging: {len(merges)} checkpoint(s) with verl's model merger (CPU, about 2 bytes "
            "per parameter of disk each for bf16 weights)"
        )
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)
