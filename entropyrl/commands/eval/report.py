"""Scoring and the report of a caption evaluation: CHAIR, CIDEr-D and BLEU-4 of every caption set
and POPE of every setting from the models' files (which get CHAIR's findings added), then
`results.json`, `table.md` (with the generation cost) and `figure.png`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from entropyrl.commands.eval.generation import caption_key, pope_key, read_rows, rewrite_rows
from entropyrl.commands.eval.models import EvalError, ModelSource
from entropyrl.commands.eval.plan import POPE_TOKENS, Plan
from entropyrl.core.files import write_json
from entropyrl.evaluation.generation import DECODING_PROTOCOL, DECODING_TEXT

CAPTION_COLUMNS = (
    ("CHAIR_s", "CHAIR_s %", 100.0, True),
    ("CHAIR_i", "CHAIR_i %", 100.0, True),
    ("recall", "recall %", 100.0, False),
    ("length", "words", 1.0, None),
    ("CIDEr-D", "CIDEr-D", 100.0, False),
    ("BLEU-4", "BLEU-4", 100.0, False),
)
# beside CHAIR_i: the share of caption tokens (the model's own tokenizer) inside hallucinated
# mentions, what the token-level mechanisms act on
TOKEN_COLUMNS = (("hallucinated_tokens", "halluc. tokens %", 100.0, True),)
POPE_COLUMNS = (
    ("accuracy", "accuracy %", 100.0, False),
    ("precision", "precision %", 100.0, False),
    ("recall", "recall %", 100.0, False),
    ("f1", "F1 %", 100.0, False),
    ("yes_ratio", "yes %", 100.0, None),
)


def chair_scorer(plan_ground_truth_coco: str | None, ground_truth_file: str | None) -> Any:
    from chair_server.scorer import ChairScorer

    if plan_ground_truth_coco:
        return ChairScorer.from_coco(plan_ground_truth_coco)
    return ChairScorer.from_ground_truth(ground_truth_file)


def token_offsets(model_path: str) -> Any:
    """caption -> each token's character offsets under the model folder's own tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if not getattr(tokenizer, "is_fast", False):
        raise EvalError(f"{model_path}: the tokenizer gives no character offsets (not a fast one)")

    def offsets(caption: str) -> list[tuple[int, int]]:
        found = tokenizer(caption, add_special_tokens=False, return_offsets_mapping=True)
        return [tuple(pair) for pair in found["offset_mapping"]]

    return offsets


def score_model_captions(
    plan: Plan, model: ModelSource, scorer: Any
) -> dict[str, dict[str, dict[int, Any]]]:
    """Per caption set, the per-image values; rewrites captions.jsonl with CHAIR's findings.

    With the model's folder at hand, the values include the hallucinated-token share under its
    own tokenizer (`caption_metrics.TOKEN_METRICS`), and each row its hallucinated spans.
    """
    from entropyrl.evaluation.caption_metrics import HALLUCINATED_SPANS_KEY, caption_values

    path = plan.out / model.name / "captions.jsonl"
    rows = {caption_key(row): row for row in read_rows(path)}
    values: dict[str, dict[str, dict[int, Any]]] = {}
    ordered: list[dict[str, Any]] = []
    offsets = token_offsets(model.path) if model.path else None
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
                    HALLUCINATED_SPANS_KEY: entry.get(HALLUCINATED_SPANS_KEY),
                    "words": metrics["words"],
                    "ground_truth_objects": metrics["ground_truth"],
                    "recalled": metrics["recalled"],
                }
            )
        values[caption_set.key] = caption_values(entries, references, token_offsets=offsets)
    rewrite_rows(path, ordered)
    return values


def score_model_pope(plan: Plan, model: ModelSource) -> dict[str, dict[str, dict[int, Any]]]:
    from entropyrl.evaluation.pope import POPE_METRICS, parse_answer, pope_counts

    path = plan.out / model.name / "pope.jsonl"
    rows = {pope_key(row): row for row in read_rows(path)}
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
    rewrite_rows(path, ordered)
    return values


def write_report(plan: Plan, caption_values: dict, pope_values: dict) -> dict[str, Any]:
    from entropyrl.evaluation.caption_metrics import CAPTION_METRICS, TOKEN_METRICS
    from entropyrl.evaluation.pope import POPE_METRICS, pope_statistic
    from entropyrl.evaluation.report import draw_figure, markdown_table, summarise

    base = plan.models[0].name
    bootstrap = {"resamples": plan.resamples, "seed": plan.seed}
    results: dict[str, Any] = {}
    tables = [
        f"# Hallucination evaluation\n\nPrompt {plan.prompt!r}, {DECODING_TEXT}. "
        f"{plan.quality_note}. {plan.pope_note}. CHAIR ground truth: {plan.ground_truth}.\n"
    ]
    for caption_set in plan.caption_sets:
        per_model = {m.name: caption_values[m.name][caption_set.key] for m in plan.models}
        with_tokens = all(TOKEN_METRICS.keys() <= values.keys() for values in per_model.values())
        metrics = {**CAPTION_METRICS, **(TOKEN_METRICS if with_tokens else {})}
        statistics = {name: spec.statistic for name, spec in metrics.items()}
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
                CAPTION_COLUMNS + (TOKEN_COLUMNS if with_tokens else ()),
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
            "decoding": DECODING_PROTOCOL,
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
