"""`entropyrl eval caption`: from verl checkpoints to the table a hallucination paper reports.

    entropyrl eval caption --model base=Qwen/Qwen2.5-VL-3B-Instruct \\
        --model entropyrl=checkpoints/entropyrl/chair_mscoco --data data/coco --coco coco/annotations \\
        --out eval/chair_mscoco [--dry-run]

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
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entropyrl.data.io import InputFileError
from entropyrl.files import json_dumps, write_json

DEFAULT_TOKENS = (512, 64)
DEFAULT_PROMPT = "Please describe this image in detail."
POPE_TOKENS = 32
CHECKPOINT_MARKERS = ("fsdp_config.json", "huggingface")
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
)
CAPTION_COLUMNS = (
    ("CHAIR_s", "CHAIR_s %", 100.0, True),
    ("CHAIR_i", "CHAIR_i %", 100.0, True),
    ("recall", "recall %", 100.0, False),
    ("length", "words", 1.0, None),
    ("CIDEr-D", "CIDEr-D", 100.0, False),
    ("BLEU-4", "BLEU-4", 100.0, False),
)
POPE_COLUMNS = (
    ("accuracy", "accuracy %", 100.0, False),
    ("precision", "precision %", 100.0, False),
    ("recall", "recall %", 100.0, False),
    ("f1", "F1 %", 100.0, False),
    ("yes_ratio", "yes %", 100.0, None),
)


class EvalError(RuntimeError):
    """A setup problem, said in one line (exit status 2)."""


# ---------------------------------------------------------------------------------------------
# Models: NAME=PATH -> a Hugging Face folder
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelSource:
    """Where a model comes from and the Hugging Face folder it is evaluated from."""

    name: str
    given: str
    kind: str  # "hf" (used as is) or "checkpoint" (merged first)
    checkpoint: str | None = None  # the verl actor folder
    lora: bool = False
    path: str | None = None  # the Hugging Face folder (after merging)

    def describe(self) -> str:
        if self.kind == "hf":
            return f"{self.path} (Hugging Face model, used as it is)"
        how = (
            "verl's model merger, then the LoRA adapter folded in"
            if self.lora
            else "verl's model merger"
        )
        return f"{self.checkpoint} (verl checkpoint, merged by {how} into {self.path})"


def _latest_step(run: Path) -> Path | None:
    steps = [
        step
        for step in run.glob("global_step_*")
        if step.name.split("_")[-1].isdigit() and (step / "actor").is_dir()
    ]
    return max(steps, key=lambda step: int(step.name.split("_")[-1]), default=None)


def _hub_snapshot(given: str) -> str | None:
    if given.count("/") != 1 or given.startswith(("/", ".")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(given, local_files_only=True)
    except Exception:  # not cached (or no huggingface_hub): not a usable hub id
        return None


def resolve_model(name: str, given: str, out: Path) -> ModelSource:
    """Classify `given` (see the module docstring); merging happens later, in `prepare_model`."""
    path = Path(given).expanduser()
    target = out / name / "hf"
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(name, given, "hf", path=str(path.resolve()))
    actor: Path | None = None
    if path.is_dir() and any((path / marker).exists() for marker in CHECKPOINT_MARKERS):
        actor = path
    elif path.is_dir() and (path / "actor").is_dir():
        actor = path / "actor"
    elif path.is_dir():
        step = _latest_step(path)
        if step is None:
            raise EvalError(
                f"model {name}={given}: neither a Hugging Face folder (config.json) nor a verl "
                "checkpoint (global_step_N/actor)"
            )
        actor = step / "actor"
    if actor is not None:
        lora = (actor / "lora_train_meta.json").is_file()
        merged = target / "merged" if lora else target
        return ModelSource(
            name, given, "checkpoint", checkpoint=str(actor.resolve()), lora=lora, path=str(merged)
        )
    snapshot = _hub_snapshot(given)
    if snapshot is None:
        raise EvalError(
            f"model {name}={given}: not a local folder nor a model in the Hugging Face cache "
            f"(download it first: hf download {given})"
        )
    return ModelSource(name, given, "hf", path=snapshot)


def parse_models(
    entries: Sequence[str], out: Path, problems: list[str] | None = None
) -> list[ModelSource]:
    """The `--model NAME=PATH` entries; with `problems` (a dry run) a model that cannot be
    resolved is noted there and left out instead of stopping."""
    models: list[ModelSource] = []
    for entry in entries:
        name, sep, given = entry.partition("=")
        if not sep or not name or not given:
            raise EvalError(f"--model {entry!r}: expected NAME=PATH")
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise EvalError(f"--model {entry!r}: NAME may hold letters, digits, '-', '_', '.'")
        if any(model.name == name for model in models):
            raise EvalError(f"--model {name} is given twice")
        try:
            models.append(resolve_model(name, given, out))
        except EvalError as error:
            if problems is None:
                raise
            problems.append(f"prerequisite not met: {error}")
    if not models and problems is None:
        raise EvalError("no --model given (NAME=PATH; the first is the base of the comparison)")
    return models


def prepare_model(model: ModelSource, *, python: str = sys.executable) -> None:
    """Merge a checkpoint into `model.path` (once: a finished merge is reused)."""
    if model.kind != "checkpoint":
        return
    target = Path(model.path).parent if model.lora else Path(model.path)
    stamp = Path(model.path) / "MERGED_FROM"
    if stamp.is_file() and stamp.read_text().strip() == model.checkpoint:
        return
    shutil.rmtree(target, ignore_errors=True)
    _run(
        [
            python,
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            model.checkpoint,
            "--target_dir",
            str(target),
        ],
        f"verl's model merger on {model.checkpoint}",
    )
    # verl's merger writes weights, config and tokenizer; the image processor and chat template
    # are in the checkpoint's huggingface/ folder
    hf = Path(model.checkpoint) / "huggingface"
    for name in PROCESSOR_FILES:
        if (hf / name).is_file() and not (target / name).exists():
            shutil.copy2(hf / name, target / name)
    if model.lora:
        from entropyrl.commands.merge_lora import merge_lora

        merge_lora(target, model.path)
        for name in PROCESSOR_FILES:
            if (target / name).is_file() and not (Path(model.path) / name).exists():
                shutil.copy2(target / name, Path(model.path) / name)
    stamp.write_text(model.checkpoint + "\n")


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise EvalError(f"{what} failed (exit {result.returncode}):\n{tail}")


# ---------------------------------------------------------------------------------------------
# The plan: images, protocols, requests
# ---------------------------------------------------------------------------------------------


@dataclass
class CaptionSet:
    """Captions of `image_ids` at `max_new_tokens`; `name@tokens` keys it everywhere."""

    name: str
    image_ids: list[int]
    max_new_tokens: int
    description: str

    @property
    def key(self) -> str:
        return f"{self.name}@{self.max_new_tokens}"


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
    batch_size: int
    device: str | None
    resamples: int
    seed: int
    gpus: int
    notes: list[str] = field(default_factory=list)

    def caption_requests(self) -> int:
        return sum(len(s.image_ids) for s in self.caption_sets)

    def pope_requests(self) -> int:
        return sum(len(questions) for questions in self.pope.values())


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
    from entropyrl.evaluation.protocol import check_held_out, read_image_list, sample_image_ids

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
        return {}, "off", "POPE: planned once the prepared data is there"
    if args.pope_dir:
        questions: dict[str, list[Any]] = {}
        for setting in POPE_SETTINGS:
            path = Path(args.pope_dir) / f"coco_pope_{setting}.json"
            questions[setting] = load_pope_questions(path)
        ids = {q.image_id for qs in questions.values() for q in qs}
        missing = sorted(ids - set(images))
        if missing:
            raise EvalError(
                f"{len(missing)} POPE images are not in the prepared data (e.g. {missing[:5]}): "
                "POPE's images are val2014; prepare the data from the full val2014 folder"
            )
        seen = sorted(ids & training)
        note = "POPE: the released question files (RUCAIBox/POPE output/coco)"
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
        )
        for budget in tokens
    ]
    sources = {image.source for image in held_out.values()}
    if sources == {"karpathy"} and args.quality == "auto":
        sets.append(
            CaptionSet("karpathy_test", sorted(held_out), min(tokens), "Karpathy's test split")
        )
        quality_note = (
            f"CIDEr-D and BLEU-4 on Karpathy's test split ({len(held_out)} images, "
            f"{min(tokens)} new tokens) compare with papers' Karpathy-test figures (up to the "
            "tokenisation, see docs/hallucination_eval.md); on the CHAIR images only within "
            "this project"
        )
    else:
        quality_note = (
            "CIDEr-D and BLEU-4 on the CHAIR images (no dataset_coco.json: not Karpathy's test "
            "split), comparable within this project only"
        )
    pope, pope_source, pope_note = _pope_questions(args, held_out, training, images)
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
    models = parse_models(args.model, out, notes if args.dry_run else None)
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
        batch_size=args.batch_size,
        device=args.device,
        resamples=args.resamples,
        seed=args.seed,
        gpus=gpus,
        notes=notes,
    )


def describe_plan(plan: Plan) -> str:
    """What the run will do and need, for `--dry-run` and the log."""
    per_model_tokens = sum(len(s.image_ids) * s.max_new_tokens for s in plan.caption_sets)
    per_model_tokens += plan.pope_requests() * POPE_TOKENS
    lines = [f"caption evaluation -> {plan.out}", "models (the first is the base):"]
    if not plan.models:
        lines.append("  (none usable: see the notes below)")
    lines += [f"  {model.name}: {model.describe()}" for model in plan.models]
    lines.append(f"prompt: {plan.prompt!r}, greedy decoding, the model's chat template")
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
    lines.append(plan.pope_note)
    lines.append(
        f"statistics: 95 % percentile bootstrap over images ({plan.resamples} resamples, "
        f"seed {plan.seed}); paired differences from the first model"
    )
    lines.append(
        f"generation per model: {plan.caption_requests()} captions + {plan.pope_requests()} "
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
    merges = [m for m in plan.models if m.kind == "checkpoint"]
    if merges:
        lines.append(
            f"merging: {len(merges)} checkpoint(s) with verl's model merger (CPU, about 2 bytes "
            "per parameter of disk each for bf16 weights)"
        )
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Generation (one child process per model: a vLLM engine frees its GPUs when its process ends)
# ---------------------------------------------------------------------------------------------


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path`; a last line cut off by an interruption is dropped."""
    if not path.is_file():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise EvalError(f"{path}, line {number}: not JSON") from None
    return rows


def _caption_key(row: Mapping[str, Any]) -> tuple[str, int]:
    return (f"{row['set']}@{row['max_new_tokens']}", int(row["image_id"]))


def _pope_key(row: Mapping[str, Any]) -> tuple[str, int]:
    return (str(row["setting"]), int(row["question_id"]))


def _check_settings(plan: Plan, model: ModelSource) -> None:
    """A folder holding another model's or prompt's generations is not resumed into."""
    path = plan.out / model.name / "settings.json"
    if not path.is_file():
        return
    saved = json.loads(path.read_text())
    wanted = {"model": model.path, "prompt": plan.prompt, "backend": plan.backend}
    differs = {key: saved.get(key) for key, value in wanted.items() if saved.get(key) != value}
    if differs:
        raise EvalError(
            f"{plan.out / model.name} holds generations made with {differs} (now "
            f"{ {k: wanted[k] for k in differs} }): use another --out or remove that folder"
        )


def pending_work(plan: Plan, model: ModelSource) -> dict[str, Any]:
    """The requests of `model` that are not in its files yet."""
    folder = plan.out / model.name
    done_captions = {_caption_key(row) for row in read_rows(folder / "captions.jsonl")}
    done_pope = {_pope_key(row) for row in read_rows(folder / "pope.jsonl")}
    captions = [
        {
            "set": s.name,
            "max_new_tokens": s.max_new_tokens,
            "image_id": image_id,
            "image": plan.images[image_id].path,
        }
        for s in plan.caption_sets
        for image_id in s.image_ids
        if (s.key, image_id) not in done_captions
    ]
    pope = [
        {
            "setting": setting,
            "question_id": q.question_id,
            "image_id": q.image_id,
            "image": plan.images[q.image_id].path,
            "question": q.text,
            "label": q.label,
            "object": q.object,
        }
        for setting, questions in plan.pope.items()
        for q in questions
        if (setting, q.question_id) not in done_pope
    ]
    return {"captions": captions, "pope": pope}


def generate_for_model(plan: Plan, model: ModelSource) -> None:
    """Run the child that generates what `model` still lacks (nothing when all is there)."""
    folder = plan.out / model.name
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("captions.jsonl", "pope.jsonl"):
        path = folder / name
        if path.is_file() and not path.read_bytes().endswith(b"\n") and path.stat().st_size:
            _rewrite(path, read_rows(path))  # drop a line an interruption cut off
    work = pending_work(plan, model)
    if not work["captions"] and not work["pope"] and (folder / "settings.json").is_file():
        print(f"{model.name}: all generations present, none redone", file=sys.stderr)
        return
    spec = {
        "model": model.path,
        "backend": plan.backend,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "batch_size": plan.batch_size,
        "device": plan.device,
        "prompt": plan.prompt,
        "folder": str(folder),
        **work,
    }
    spec_path = folder / "pending.json"
    write_json(spec, spec_path)
    print(
        f"{model.name}: generating {len(work['captions'])} captions and {len(work['pope'])} "
        f"POPE answers ({plan.backend})",
        file=sys.stderr,
    )
    result = subprocess.run(
        [sys.executable, "-m", "entropyrl.commands.eval_caption", "generate", str(spec_path)]
    )
    if result.returncode != 0:
        raise EvalError(
            f"{model.name}: generation stopped (exit {result.returncode}); the same command "
            "resumes from what was written"
        )
    spec_path.unlink(missing_ok=True)


def _append(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json_dumps(row, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def run_generation(spec_path: str) -> int:
    """The child: load the model once, generate in chunks, append each chunk to its file."""
    from entropyrl.evaluation.generation import Request, load
    from entropyrl.evaluation.pope import parse_answer

    spec = json.loads(Path(spec_path).read_text())
    folder = Path(spec["folder"])
    started = time.perf_counter()
    captioner = load(
        spec["backend"],
        spec["model"],
        tensor_parallel_size=spec["tensor_parallel_size"],
        batch_size=spec["batch_size"],
        device=spec["device"],
    )
    settings = {"model": spec["model"], "prompt": spec["prompt"], **captioner.settings()}
    previous = folder / "settings.json"
    # wall-clock seconds of each generation session (a resumed run adds one): the cost table
    timing = json.loads(previous.read_text()).get("timing", []) if previous.is_file() else []
    session = {"load_seconds": round(time.perf_counter() - started, 3), "captions": {}}
    settings["timing"] = [*timing, session]
    write_json(settings, previous)
    chunk = 1024 if spec["backend"] == "vllm" else 8 * spec["batch_size"]
    by_budget: dict[int, list[dict[str, Any]]] = {}
    for row in spec["captions"]:
        by_budget.setdefault(int(row["max_new_tokens"]), []).append(row)
    for budget, rows in by_budget.items():
        clock = time.perf_counter()
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            answers = captioner.generate(
                [Request(row["image"], spec["prompt"]) for row in part], budget
            )
            _append(
                folder / "captions.jsonl",
                [
                    {
                        "set": row["set"],
                        "max_new_tokens": budget,
                        "image_id": row["image_id"],
                        "caption": answer,
                    }
                    for row, answer in zip(part, answers)
                ],
            )
        session["captions"][str(budget)] = {
            "count": len(rows),
            "seconds": round(time.perf_counter() - clock, 3),
        }
    pope = spec["pope"]
    clock = time.perf_counter()
    for start in range(0, len(pope), chunk):
        part = pope[start : start + chunk]
        answers = captioner.generate(
            [Request(row["image"], row["question"]) for row in part], POPE_TOKENS
        )
        _append(
            folder / "pope.jsonl",
            [
                {
                    "setting": row["setting"],
                    "question_id": row["question_id"],
                    "image_id": row["image_id"],
                    "question": row["question"],
                    "object": row["object"],
                    "label": row["label"],
                    "answer": answer,
                    "parsed": parse_answer(answer),
                }
                for row, answer in zip(part, answers)
            ],
        )
    session["pope"] = {"count": len(pope), "seconds": round(time.perf_counter() - clock, 3)}
    write_json(settings, previous)
    return 0


# ---------------------------------------------------------------------------------------------
# Scoring and the report
# ---------------------------------------------------------------------------------------------


def chair_scorer(plan_ground_truth_coco: str | None, ground_truth_file: str | None) -> Any:
    from chair_server.scorer import ChairScorer

    if plan_ground_truth_coco:
        return ChairScorer.from_coco(plan_ground_truth_coco)
    return ChairScorer.from_ground_truth(ground_truth_file)


def score_model_captions(
    plan: Plan, model: ModelSource, scorer: Any
) -> dict[str, dict[str, dict[int, Any]]]:
    """Per caption set, the per-image values; rewrites captions.jsonl with CHAIR's findings."""
    from entropyrl.evaluation.caption_metrics import caption_values

    path = plan.out / model.name / "captions.jsonl"
    rows = {_caption_key(row): row for row in read_rows(path)}
    values: dict[str, dict[str, dict[int, Any]]] = {}
    ordered: list[dict[str, Any]] = []
    for caption_set in plan.caption_sets:
        entries, references = [], []
        for image_id in caption_set.image_ids:
            row = rows.get((caption_set.key, image_id))
            if row is None:
                raise EvalError(f"{path}: no caption of image {image_id} in {caption_set.key}")
            entry = scorer.score_one(image_id, row["caption"])
            if "error" in entry:
                raise EvalError(f"{model.name}, image {image_id}: CHAIR: {entry['error']}")
            entries.append(entry)
            references.append(plan.images[image_id].references)
            metrics = entry["metrics"]
            ordered.append(
                {
                    "set": caption_set.name,
                    "max_new_tokens": caption_set.max_new_tokens,
                    "image_id": image_id,
                    "caption": row["caption"],
                    "mentioned": entry["mentioned"],
                    "hallucinated": entry["hallucinated"],
                    "words": metrics["words"],
                    "ground_truth_objects": metrics["ground_truth"],
                    "recalled": metrics["recalled"],
                }
            )
        values[caption_set.key] = caption_values(entries, references)
    _rewrite(path, ordered)
    return values


def score_model_pope(plan: Plan, model: ModelSource) -> dict[str, dict[str, dict[int, Any]]]:
    from entropyrl.evaluation.pope import POPE_METRICS, parse_answer, pope_counts

    path = plan.out / model.name / "pope.jsonl"
    rows = {_pope_key(row): row for row in read_rows(path)}
    values: dict[str, dict[str, dict[int, Any]]] = {}
    ordered = []
    for setting, questions in plan.pope.items():
        answered = []
        for question in questions:
            row = rows.get((setting, question.question_id))
            if row is None:
                raise EvalError(f"{path}: no answer to {setting} question {question.question_id}")
            row["parsed"] = parse_answer(row["answer"])
            answered.append(row)
            ordered.append(row)
        counts = pope_counts(
            [row["image_id"] for row in answered],
            [row["label"] for row in answered],
            [row["parsed"] for row in answered],
        )
        values[setting] = {name: counts for name in POPE_METRICS}
    _rewrite(path, ordered)
    return values


def _rewrite(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json_dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def write_report(plan: Plan, caption_values: dict, pope_values: dict) -> dict[str, Any]:
    from entropyrl.evaluation.caption_metrics import CAPTION_METRICS
    from entropyrl.evaluation.pope import POPE_METRICS, pope_statistic
    from entropyrl.evaluation.report import draw_figure, markdown_table, summarise

    base = plan.models[0].name
    bootstrap = {"resamples": plan.resamples, "seed": plan.seed}
    results: dict[str, Any] = {}
    tables = [
        f"# Hallucination evaluation\n\nPrompt {plan.prompt!r}, greedy decoding. "
        f"{plan.quality_note}. {plan.pope_note}. CHAIR ground truth: {plan.ground_truth}.\n"
    ]
    statistics = {name: spec.statistic for name, spec in CAPTION_METRICS.items()}
    for caption_set in plan.caption_sets:
        per_model = {m.name: caption_values[m.name][caption_set.key] for m in plan.models}
        summary = summarise(per_model, statistics, base=base, **bootstrap)
        results[caption_set.key] = {
            "kind": "captions",
            "images": len(caption_set.image_ids),
            "max_new_tokens": caption_set.max_new_tokens,
            "description": caption_set.description,
            "models": summary,
        }
        tables.append(
            markdown_table(
                f"Captions: {caption_set.description}, max_new_tokens {caption_set.max_new_tokens}",
                summary,
                CAPTION_COLUMNS,
                base=base,
            )
        )
    pope_statistics = {name: pope_statistic(name) for name in POPE_METRICS}
    for setting in plan.pope:
        per_model = {m.name: pope_values[m.name][setting] for m in plan.models}
        summary = summarise(per_model, pope_statistics, base=base, **bootstrap)
        images = len({q.image_id for q in plan.pope[setting]})
        results[f"pope/{setting}"] = {
            "kind": "pope",
            "questions": len(plan.pope[setting]),
            "images": images,
            "source": plan.pope_source,
            "models": summary,
        }
        tables.append(
            markdown_table(
                f"POPE {setting} ({len(plan.pope[setting])} questions, {images} images)",
                summary,
                POPE_COLUMNS,
                base=base,
            )
        )
    settings = {}
    for model in plan.models:
        path = plan.out / model.name / "settings.json"
        settings[model.name] = {
            "given": model.given,
            "kind": model.kind,
            "checkpoint": model.checkpoint,
            "lora": model.lora,
            "path": model.path,
            "generation": json.loads(path.read_text()) if path.is_file() else None,
        }
    document = {
        "protocol": {
            "data": str(plan.data),
            "prompt": plan.prompt,
            "decoding": "greedy",
            "caption_sets": [
                {
                    "key": s.key,
                    "images": len(s.image_ids),
                    "max_new_tokens": s.max_new_tokens,
                    "description": s.description,
                }
                for s in plan.caption_sets
            ],
            "chair_images": {**plan.chair_source, "file": str(plan.out / "images.json")},
            "chair_ground_truth": plan.ground_truth,
            "caption_quality": plan.quality_note,
            "pope": {
                "source": plan.pope_source,
                "note": plan.pope_note,
                "max_new_tokens": POPE_TOKENS,
            },
            "bootstrap": {
                "resamples": plan.resamples,
                "seed": plan.seed,
                "level": 0.95,
                "unit": "image",
                "paired_with": base,
            },
        },
        "models": settings,
        "results": results,
    }
    write_json(document, plan.out / "results.json")
    tables.append(cost_table(settings))
    (plan.out / "table.md").write_text("\n".join(tables), encoding="utf-8")
    panels = []
    for caption_set in plan.caption_sets:
        for metric, label, scale, _ in CAPTION_COLUMNS[:3] + CAPTION_COLUMNS[4:5]:
            panels.append(
                (f"{label} ({caption_set.key})", results[caption_set.key]["models"], metric, scale)
            )
    for setting in plan.pope:
        panels.append((f"POPE {setting} F1 %", results[f"pope/{setting}"]["models"], "f1", 100.0))
    draw_figure(panels, plan.out / "figure.png")
    return document


def cost_table(settings: Mapping[str, Any]) -> str:
    """Generation wall-clock per model (all sessions of a resumed run added): seconds per
    caption at each length and per POPE answer, with the backend and device."""
    lines = [
        "### Cost",
        "",
        "| model | backend | captions | s / caption | POPE answers | s / answer |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in settings.items():
        generation = entry.get("generation") or {}
        counts: dict[str, list[float]] = {}
        pope = [0.0, 0.0]
        for session in generation.get("timing", []):
            for budget, part in session.get("captions", {}).items():
                total = counts.setdefault(budget, [0.0, 0.0])
                total[0] += part["count"]
                total[1] += part["seconds"]
            if "pope" in session:
                pope[0] += session["pope"]["count"]
                pope[1] += session["pope"]["seconds"]
        captions = ", ".join(
            f"{int(c)} at {b} tokens"
            for b, (c, _) in sorted(counts.items(), key=lambda item: -int(item[0]))
        )
        per_caption = ", ".join(
            f"{t / c:.3f} ({b})"
            for b, (c, t) in sorted(counts.items(), key=lambda item: -int(item[0]))
            if c
        )
        backend = f"{generation.get('backend', '?')} on {generation.get('device', 'GPUs')}"
        per_answer = f"{pope[1] / pope[0]:.3f}" if pope[0] else "–"
        lines.append(
            f"| {name} | {backend} | {captions or '–'} | {per_caption or '–'} | "
            f"{int(pope[0])} | {per_answer} |"
        )
    return "\n".join(lines) + "\n"


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
        _check_settings(plan, model)
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
    parser.add_argument("--batch-size", type=int, default=8, help="transformers backend batch")
    parser.add_argument("--device", default=None, help="transformers backend device")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and what it needs; merge and generate nothing",
    )


def _main_args(args: argparse.Namespace) -> int:
    from entropyrl.evaluation.protocol import ProtocolError

    try:
        return evaluate(args)
    except (EvalError, ProtocolError, InputFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def register(subparsers: Any) -> None:
    """Add `eval caption` to the entropyrl CLI."""
    evaluation = subparsers.add_parser(
        "eval", help="evaluate trained models (caption: CHAIR, POPE, CIDEr-D)"
    )
    commands = evaluation.add_subparsers(dest="eval_command", metavar="TASK")
    caption = commands.add_parser(
        "caption",
        help="CHAIR / POPE / CIDEr-D of the base model and each run, with bootstrap intervals",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(caption)
    caption.set_defaults(func=_main_args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["generate"]:
        return run_generation(argv[1])
    parser = argparse.ArgumentParser(
        prog="python -m entropyrl.commands.eval_caption", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    return _main_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
