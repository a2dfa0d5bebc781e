"""`entropyrl eval caption` end to end on CPU (transformers backend) with two tiny Qwen2.5-VL
models that caption: the caption smoke's warmed-up model, which names objects and hallucinates
some, and a copy fine-tuned a few dozen steps, on the smoke's synthetic COCO world. So the figures
are not trivial (checked), and each equals an independent recomputation from the written files:
CHAIR caption by caption against the original rules restated (`tests/chair/original_chair.py`)
and through the running CHAIR service, CIDEr-D and BLEU-4 through pycocoevalcap, POPE through
POPE's own rules restated, every interval by the bootstrap on the recomputed values. Also
resuming and the one-line refusals. The verl-checkpoint path (verl's model merger) runs in
tests/rig/smoke/test_smoke.py on the caption smoke's checkpoint, with `check_recomputation`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.bleu.bleu_scorer import BleuScorer
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

from chair_server import vocabulary
from entropyrl.evaluation.pope import POPE_METRICS

COMMAND = [sys.executable, "-m", "entropyrl.commands.eval.caption"]
HERE = Path(__file__).resolve().parent


def _load_original_chair() -> Any:
    spec = importlib.util.spec_from_file_location(
        "chair_original_reference", HERE.parent / "chair" / "original_chair.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ORIGINAL = _load_original_chair()
# The original parser with the project's one documented choice (bus, ties: counted as a WordNet
# lemmatizer counts them; tests/chair/test_fidelity.py), which no caption of this world meets.
ORIGINAL_PARSER = ORIGINAL.OriginalChair(vocabulary.SINGULAR_EXCEPTIONS)


# --- the second model -------------------------------------------------------------------------

# POPE questions the fine-tuned model learns to answer "yes" to, whatever the image: one of each
# of the world's partner pairs (entropyrl.rig.synthetic.PARTNERS), so it says yes to dog, no to
# cat. An object prior is what POPE measures, and a tiny model learns it in a few dozen steps;
# taught the image's truth instead, it answered every held-out question "no" after as many.
PRIOR_YES = frozenset({"car", "bird", "dog", "cup"})


@dataclass(frozen=True)
class Setup:
    """The smoke's prepared data and world (shared, read only) and the two models."""

    data: Path
    world: Path
    base: Path
    other: Path


def train_images(world: Path) -> dict[int, Path]:
    """`{image_id: image file}` of the training split of a written synthetic world."""
    instances = json.loads((world / "instances_train2014.json").read_text())
    return {image["id"]: world / "train2014" / image["file_name"] for image in instances["images"]}


def prompt_batch(processor: Any, images: Sequence[Path], texts: Sequence[str]) -> dict[str, Any]:
    """Model inputs of (image, user text) pairs in the chat layout the evaluation generates with,
    left-padded so that every answer starts right after its prompt."""
    from PIL import Image

    chat = [
        processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for text in texts
    ]
    pictures = [Image.open(path).convert("RGB") for path in images]
    return dict(processor(images=pictures, text=chat, return_tensors="pt", padding=True))


def fine_tune(base: Path, world: Path, prompt: str, out: Path, *, steps: int, seed: int) -> None:
    """A second captioner: `base` after `steps` supervised steps (AdamW, lr 1e-3), each on 8 of
    the world's noisy warm-up captions drawn with `seed` (the warm-up's are drawn with another)
    and on POPE's question about every category for a random training image, answered in the
    captions' words from the object prior `PRIOR_YES` ("there is a dog in the image." / "there
    is no cat in the image."). The base answers every question with a caption, which POPE reads
    as yes; this one answers both ways. At this rate the tiny model also loses much of its
    grounding (its captions name much the same objects for most images): a different
    captioner, which is what a paired comparison needs."""
    import torch

    from entropyrl.evaluation.pope import pope_question_text
    from entropyrl.models.loading import load_model
    from entropyrl.models.processor import load_image_only_processor
    from entropyrl.rig.local.rl import supervised_step
    from entropyrl.rig.synthetic import CATEGORIES
    from entropyrl.rig.tiny import seed_everything

    train = train_images(world)
    warmup = {
        int(k): v for k, v in json.loads((world / "warmup_captions.json").read_text()).items()
    }
    ids = sorted(train)
    seed_everything(seed)
    processor = load_image_only_processor(str(base))
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    model = load_model(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rng = random.Random(f"eval-other-{seed}")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    names = [name for _, name, *_ in CATEGORIES]
    questions = [pope_question_text(name) for name in names]
    answers = [
        f"there is {question.split()[2]} {name} in the image."  # "a" / "an" as the question
        if name in PRIOR_YES
        else f"there is no {name} in the image."
        for name, question in zip(names, questions)
    ]
    for _ in range(steps):
        drawn = [rng.choice(ids) for _ in range(8)]
        captions = [rng.choice(warmup[i]) for i in drawn]
        for texts, targets in (([prompt] * len(drawn), captions), (questions, answers)):
            batch = prompt_batch(processor, [train[i] for i in drawn], texts)
            tokens = [[*tokenizer.encode(target), eos] for target in targets]
            supervised_step(model, optimizer, batch, tokens, pad_id=pad)
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("*.safetensors"))
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def world_and_models(smoke_assets, tmp_path_factory) -> Setup:
    from entropyrl.evaluation.protocol import read_split

    assets = smoke_assets("caption")
    test = read_split(assets / "data" / "test.parquet")
    prompt = next(iter(test.values())).prompt
    other = tmp_path_factory.mktemp("eval_models") / "other"
    fine_tune(assets / "model", assets / "world", prompt, other, steps=40, seed=1)
    return Setup(assets / "data", assets / "world", assets / "model", other)


def eval_args(setup: Setup, out: Path, *extra: str) -> list[str]:
    return [
        *COMMAND,
        "--model", f"base={setup.base}",
        "--model", f"other={setup.other}",
        "--data", str(setup.data),
        "--coco", str(setup.world),
        "--out", str(out),
        "--num-images", "12",
        "--max-new-tokens", "24", "8",
        "--backend", "transformers",
        "--resamples", "200",
        "--batch-size", "64",  # one batch per request list: a tiny model's cost is per step
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def evaluation(world_and_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_out")
    result = subprocess.run(
        eval_args(world_and_models, out), capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_it_writes_the_comparison_and_each_models_files(evaluation):
    out, result = evaluation
    for name in ("results.json", "table.md", "figure.png", "images.json"):
        assert (out / name).is_file(), name
    for model in ("base", "other"):
        captions = read_jsonl(out / model / "captions.jsonl")
        assert len(captions) == 24  # 12 images x 2 lengths
        assert {"image_id", "caption", "mentioned", "hallucinated"} <= set(captions[0])
        assert (out / model / "pope.jsonl").is_file()
    results = json.loads((out / "results.json").read_text())
    assert set(results["results"]) >= {"chair@24", "chair@8"}
    chair = results["results"]["chair@24"]["models"]
    assert "vs_base" in chair["other"] and "vs_base" not in chair["base"]
    assert results["models"]["base"]["generation"]["backend"] == "transformers"
    assert "CHAIR_i %" in (out / "table.md").read_text()
    assert "halluc. tokens %" in (out / "table.md").read_text()
    assert "Captions:" in result.stdout


def test_the_figures_measure_something(evaluation):
    """What the recomputation compares could be wrong: captions name objects, some of them
    absent, intervals have width, POPE is answered both ways, and the two models differ."""
    out, _ = evaluation
    results = json.loads((out / "results.json").read_text())
    for model in ("base", "other"):
        rows = read_jsonl(out / model / "captions.jsonl")
        assert all(row["caption"] for row in rows), model
        assert sum(bool(row["mentioned"]) for row in rows) > len(rows) / 2, model
    for key in ("chair@24", "chair@8"):
        models = results["results"][key]["models"]
        for model, summary in models.items():
            chair_i = summary["metrics"]["CHAIR_i"]
            assert 0 < chair_i["estimate"] < 1 and chair_i["low"] < chair_i["high"], (key, model)
            assert summary["metrics"]["CHAIR_s"]["estimate"] > 0, (key, model)
        for metric in ("recall", "CIDEr-D", "BLEU-4", "hallucinated_tokens"):
            assert any(m["metrics"][metric]["estimate"] > 0 for m in models.values()), (key, metric)
        differences = models["other"]["vs_base"].values()
        assert any(d["estimate"] != 0 and d["low"] < d["high"] for d in differences), key
    parsed = {row["parsed"] for row in read_jsonl(out / "other" / "pope.jsonl")}
    assert parsed == {"yes", "no"}
    accuracy = results["results"]["pope/random"]["models"]["other"]["metrics"]["accuracy"]
    assert accuracy["low"] < accuracy["high"]
    assert any(
        results["results"][f"pope/{setting}"]["models"]["other"]["vs_base"]["f1"]["estimate"]
        for setting in ("random", "popular", "adversarial")
    )


def test_the_image_set_is_held_out_and_written_beside_the_results(evaluation, world_and_models):
    from entropyrl.evaluation.protocol import read_split

    out, _ = evaluation
    listed = json.loads((out / "images.json").read_text())["image_ids"]
    held_out = set(read_split(world_and_models.data / "test.parquet"))
    train = set(read_split(world_and_models.data / "train.parquet"))
    assert len(listed) == 12 and set(listed) <= held_out and not set(listed) & train


# --- the recomputation ------------------------------------------------------------------------


def original_ground_truth(coco: Path) -> dict[int, frozenset[str]]:
    """CHAIR's objects per image as the original code collects them: the categories of the
    instance annotations and the objects its parser finds in the reference captions, over the
    train and val files."""
    objects: dict[int, set[str]] = {}
    for split in ("train", "val"):
        path = coco / f"instances_{split}2014.json"
        if path.is_file():
            instances = json.loads(path.read_text())
            names = {c["id"]: c["name"] for c in instances["categories"]}
            for annotation in instances["annotations"]:
                name = ORIGINAL_PARSER.inverse_synonym_dict[names[annotation["category_id"]]]
                objects.setdefault(annotation["image_id"], set()).add(name)
        path = coco / f"captions_{split}2014.json"
        if path.is_file():
            for annotation in json.loads(path.read_text())["annotations"]:
                _, categories = ORIGINAL_PARSER.caption_to_words(annotation["caption"])
                objects.setdefault(annotation["image_id"], set()).update(categories)
    return {image_id: frozenset(names) for image_id, names in objects.items()}


def ptb_tokens(text: str) -> str:
    """A caption as the COCO caption evaluation tokenises it, without Java.

    pycocoevalcap runs Stanford's PTBTokenizer (`-lowerCase -preserveLines`, a Java subprocess)
    and then drops its own `PUNCTUATIONS`. Here Penn Treebank's rules come from NLTK's
    `word_tokenize` as restated in tests/chair/original_chair.py, on the lower-cased text,
    brackets written as PTBTokenizer writes them when lower-casing (`-lrb-` ..., which
    `PUNCTUATIONS` keeps), and then pycocoevalcap's own filter runs unchanged. Checked once by
    hand against the Java tokenizer on every caption and reference of this test's world.
    """
    brackets = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
    tokens = [brackets.get(token, token) for token in ORIGINAL.word_tokenize(text.lower())]
    return " ".join(token for token in tokens if token not in PUNCTUATIONS)


def restated_chair(rows: Sequence[Mapping[str, Any]], truth: Mapping[int, frozenset[str]]):
    """Per image: (CHAIR_s, (hallucinated, mentions), (recalled, ground truth), words) by the
    original rules, each row's written findings checked against them on the way."""
    values: dict[str, dict[int, Any]] = {"CHAIR_s": {}, "CHAIR_i": {}, "recall": {}, "length": {}}
    for row in rows:
        image_id, caption = row["image_id"], row["caption"]
        objects = truth[image_id]
        words, categories = ORIGINAL_PARSER.caption_to_words(caption)
        hallucinated = [[w, c] for w, c in zip(words, categories) if c not in objects]
        recalled = len(objects & set(categories))
        length = sum(any(c.isalnum() for c in t) for t in ORIGINAL.word_tokenize(caption.lower()))
        where = (row["set"], row["max_new_tokens"], image_id, caption)
        assert row["mentioned"] == categories, where
        assert row["hallucinated"] == hallucinated, where
        assert (row["ground_truth_objects"], row["recalled"]) == (len(objects), recalled), where
        assert row["words"] == length, where
        values["CHAIR_s"][image_id] = float(bool(hallucinated))
        values["CHAIR_i"][image_id] = (len(hallucinated), len(categories))
        values["recall"][image_id] = (recalled, len(objects))
        values["length"][image_id] = length
    return values


def closest(reference_lengths: Sequence[int], test_length: int) -> int:
    """BleuScorer's closest reference length: the nearest, the shorter one on a tie."""
    return min((abs(length - test_length), length) for length in reference_lengths)[1]


def restated_quality(rows: Sequence[Mapping[str, Any]], references: Mapping[int, Any]):
    """Per-image CIDEr-D, per-image BLEU counts (test length, closest reference length, guessed
    and correct n-grams) and corpus BLEU-4, from pycocoevalcap's scorers on `ptb_tokens`."""
    gts = {
        r["image_id"]: [ptb_tokens(x) for x in references[r["image_id"]].references] for r in rows
    }
    res = {r["image_id"]: [ptb_tokens(r["caption"])] for r in rows}
    _, per_image = Cider().compute_score(gts, res)
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    counts = BleuScorer(n=4)
    for image_id in gts:
        counts += (res[image_id][0], gts[image_id])
    bleu_counts = {  # the reference length BleuScorer.compute_score(option="closest") takes
        image_id: [c["testlen"], closest(c["reflen"], c["testlen"]), *c["guess"], *c["correct"]]
        for image_id, c in zip(gts, counts.ctest)
    }
    return dict(zip(gts, map(float, per_image))), bleu_counts, bleu[3]


def bootstrapped(values: Mapping[int, Any], statistic: Any, what: str, **bootstrap: Any) -> dict:
    """`bootstrap_interval` or `paired_difference` of recomputed values; None where undefined."""
    from entropyrl.evaluation.stats import bootstrap_interval, paired_difference

    try:
        if what == "interval":
            found = bootstrap_interval(values, statistic, **bootstrap)
        else:
            found = paired_difference(*values, statistic, **bootstrap)
    except ValueError:
        return {"estimate": None, "low": None, "high": None}
    return {"estimate": found.estimate, "low": found.low, "high": found.high}


def assert_close(written: Mapping[str, Any], expected: Mapping[str, Any], where: Any) -> None:
    for field, value in expected.items():
        if value is None:
            assert written[field] is None, (where, field)
        else:
            assert written[field] == pytest.approx(value, rel=1e-9, abs=1e-12), (where, field)


def restated_pope(answer: str) -> str:
    """POPE's evaluate.py: the first sentence, commas dropped, split at spaces; "no" when a word
    is "No", "no" or "not". Applied to the text as the project documents its one difference
    (lower-cased, whitespace runs as one space)."""
    text = " ".join(answer.lower().split())
    if text.find(".") != -1:
        text = text.split(".")[0]
    words = text.replace(",", "").split(" ")
    return "no" if "No" in words or "not" in words or "no" in words else "yes"


def pope_figures(labels: Sequence[str], answers: Sequence[str]) -> dict[str, float]:
    """POPE's evaluate.py's metrics (a ratio over nothing: 0, as `pope_metrics` documents)."""
    predictions = [restated_pope(answer) == "yes" for answer in answers]
    truths = [label == "yes" for label in labels]
    tp = sum(p and t for p, t in zip(predictions, truths))
    fp = sum(p and not t for p, t in zip(predictions, truths))
    tn = sum(not p and not t for p, t in zip(predictions, truths))
    fn = sum(not p and t for p, t in zip(predictions, truths))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "accuracy": (tp + tn) / (tp + tn + fp + fn),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "yes_ratio": sum(predictions) / len(predictions),
    }


def restated_token_share(rows: list[dict], model_path: str) -> dict[int, tuple[float, float]]:
    """Per image (tokens of its caption inside a hallucinated span, tokens), each token's
    characters taken from the model folder's tokenizer and tested one by one against the spans
    the row carries (one per hallucinated mention, each a piece of the caption)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    out = {}
    for row in rows:
        spans = row["hallucinated_spans"]
        assert len(spans) == len(row["hallucinated"]), row
        inside = {i for start, end in spans for i in range(start, end)}
        assert all(row["caption"][start:end].strip() for start, end in spans), row
        found = tokenizer(row["caption"], add_special_tokens=False, return_offsets_mapping=True)
        tokens = [(a, b) for a, b in found["offset_mapping"] if b > a]
        marked = sum(1 for a, b in tokens if any(i in inside for i in range(a, b)))
        out[row["image_id"]] = (float(marked), float(len(tokens)))
    return out


def check_recomputation(out: Path, coco: Path) -> None:
    """Every figure of `out/results.json` equals a recomputation from the written files.

    - CHAIR: every caption's mentioned and hallucinated objects, recall counts and length by the
      original CHAIR rules (tests/chair/original_chair.py) against ground truth collected as the
      original code collects it from `coco`; CHAIR_s, CHAIR_i, recall and length with their
      intervals and paired differences from those per-image values (the bootstrap itself is
      checked against scipy in test_stats.py); and the running CHAIR service's corpus figures.
    - CIDEr-D (with its intervals) and BLEU-4: pycocoevalcap's `Cider` and `Bleu(4)` on the
      tokens of COCO's evaluation, restated without Java (`ptb_tokens`); the evaluation
      tokenises with `entropyrl.rewards.text.normalize_caption`, so this also checks that the
      two agree on these captions.
    - The hallucinated-token share: `restated_token_share` from the rows' spans and the model's
      own tokenizer.
    - POPE: every answer parsed by POPE's own rule, its metrics by POPE's formulas.
    """
    from chair_server.launch import start_server
    from entropyrl.evaluation.caption_metrics import CAPTION_METRICS, TOKEN_METRICS
    from entropyrl.evaluation.protocol import read_split

    metrics = {**CAPTION_METRICS, **TOKEN_METRICS}

    results = json.loads((out / "results.json").read_text())
    bootstrap = {k: results["protocol"]["bootstrap"][k] for k in ("resamples", "seed", "level")}
    base = results["protocol"]["bootstrap"]["paired_with"]
    truth = original_ground_truth(coco)
    references = read_split(Path(results["protocol"]["data"]) / "test.parquet")
    captions = {model: read_jsonl(out / model / "captions.jsonl") for model in results["models"]}
    with start_server(coco=coco, restart=False) as server:
        for key, entry in results["results"].items():
            if entry["kind"] != "captions":
                continue
            name, tokens = key.split("@")
            values = {}
            for model, summary in entry["models"].items():
                rows = [
                    row
                    for row in captions[model]
                    if row["set"] == name and row["max_new_tokens"] == int(tokens)
                ]
                assert len(rows) == entry["images"], (key, model)
                values[model] = restated_chair(rows, truth)
                cider, bleu_counts, bleu = restated_quality(rows, references)
                values[model]["CIDEr-D"], values[model]["BLEU-4"] = cider, bleu_counts
                path = results["models"][model]["path"]
                values[model]["hallucinated_tokens"] = restated_token_share(rows, path)
                assert_close(summary["metrics"]["BLEU-4"], {"estimate": bleu}, (key, model))
                for metric, per_image in values[model].items():
                    statistic = metrics[metric].statistic
                    expected = bootstrapped(per_image, statistic, "interval", **bootstrap)
                    assert_close(summary["metrics"][metric], expected, (key, model, metric))
                answer = requests.post(
                    f"{server.url}/v1/chair",
                    json={"captions": [{"image_id": r["image_id"], "caption": r["caption"]}
                                       for r in rows]},
                    timeout=60,
                ).json()["overall_metrics"]  # fmt: skip
                service = {"CHAIR_s": "CHAIRs", "CHAIR_i": "CHAIRi", "recall": "Recall"}
                for metric, field in service.items():
                    expected = {"estimate": answer[field]}
                    assert_close(summary["metrics"][metric], expected, (key, model, metric))
            for model, summary in entry["models"].items():
                for metric, differences in summary.get("vs_base", {}).items():
                    statistic = metrics[metric].statistic
                    pair = (values[model][metric], values[base][metric])
                    expected = bootstrapped(pair, statistic, "difference", **bootstrap)
                    assert_close(differences, expected, (key, model, metric, "vs_base"))
    for model in results["models"]:
        rows = read_jsonl(out / model / "pope.jsonl")
        for key, entry in results["results"].items():
            if entry["kind"] != "pope":
                continue
            answered = [row for row in rows if row["setting"] == key.split("/")[1]]
            assert len(answered) == entry["questions"]
            for row in answered:
                assert row["parsed"] == restated_pope(row["answer"]), (key, model, row)
            figures = pope_figures([r["label"] for r in answered], [r["answer"] for r in answered])
            for name in POPE_METRICS:
                written = entry["models"][model]["metrics"][name]
                assert_close(written, {"estimate": figures[name]}, (key, model, name))


def test_results_equal_a_recomputation_from_the_written_files(evaluation, world_and_models):
    """See `check_recomputation`. Tokens of the CIDEr-D / BLEU-4 comparison: both sides run
    pycocoevalcap's scorers, the evaluation on `entropyrl.rewards.text.normalize_caption`'s
    tokens, the recomputation on `ptb_tokens`: COCO's own pipeline (Stanford's PTBTokenizer,
    then pycocoevalcap's `PUNCTUATIONS` filter) with the tokenizer restated in Python, because
    PTBTokenizer is a Java program and the project must not need Java; the filter, the part of
    pycocoevalcap's tokenisation that runs without Java, is used as it is."""
    out, _ = evaluation
    check_recomputation(out, world_and_models.world)


def test_pope_is_rebuilt_balanced_over_held_out_images(evaluation):
    out, _ = evaluation
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"]["pope"]["source"] == "rebuilt"
    for setting in ("random", "popular", "adversarial"):
        rows = [r for r in read_jsonl(out / "base" / "pope.jsonl") if r["setting"] == setting]
        assert rows and sum(r["label"] == "yes" for r in rows) * 2 == len(rows)


def test_the_same_command_resumes_without_regenerating(evaluation, world_and_models):
    out, _ = evaluation
    before = {p: p.read_bytes() for p in out.glob("*/captions.jsonl")}
    results_before = json.loads((out / "results.json").read_text())
    # an interrupted run: the last captions of one model are missing, one line cut off
    path = out / "other" / "captions.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-3]) + lines[-3][:10])
    result = subprocess.run(
        eval_args(world_and_models, out), capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "base: all generations present, none redone" in result.stderr
    assert "other: generating 3 captions and 0 POPE answers" in result.stderr
    assert {p: p.read_bytes() for p in out.glob("*/captions.jsonl")} == before
    # equal to the last bit but for CIDEr-D, which can move in its last bit from one process to
    # the next: its sums run in an order that follows string hashing (PYTHONHASHSEED)
    results = json.loads((out / "results.json").read_text())["results"]
    assert_same_figures(results, results_before["results"])


def assert_same_figures(found: Any, expected: Any, where: str = "") -> None:
    """`found == expected`, floats within 1e-12 relative."""
    if isinstance(expected, dict):
        assert isinstance(found, dict) and set(found) == set(expected), where
        for key in expected:
            assert_same_figures(found[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list):
        assert isinstance(found, list) and len(found) == len(expected), where
        for index, (a, b) in enumerate(zip(found, expected)):
            assert_same_figures(a, b, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert found == pytest.approx(expected, rel=1e-12, abs=1e-15), where
    else:
        assert found == expected, where


def test_another_image_set_in_the_same_folder_is_refused(evaluation, world_and_models):
    out, _ = evaluation
    args = eval_args(world_and_models, out)
    args[args.index("--num-images") + 1] = "10"
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "another image set" in result.stderr


def test_a_list_with_training_images_is_refused(world_and_models, tmp_path):
    from entropyrl.evaluation.protocol import read_split

    train = sorted(read_split(world_and_models.data / "train.parquet"))
    test = sorted(read_split(world_and_models.data / "test.parquet"))
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(str(i) for i in [*test[:3], train[0]]))
    result = subprocess.run(
        eval_args(world_and_models, tmp_path / "out", "--image-list", str(listing)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of the 4 evaluation images are training images")
    assert not (tmp_path / "out" / "base").exists()


def test_dry_run_prints_the_plan_and_what_it_needs(world_and_models, tmp_path):
    step = tmp_path / "run" / "global_step_7" / "actor"
    (step / "huggingface").mkdir(parents=True)
    (step / "fsdp_config.json").write_text("{}")
    result = subprocess.run(
        [*COMMAND, "--dry-run", "--model", f"base={world_and_models.base}",
         "--model", f"rl={tmp_path / 'run'}", "--data", str(world_and_models.data),
         "--coco", str(world_and_models.world), "--out", str(tmp_path / "out"),
         "--num-images", "5", "--backend", "vllm", "--tp", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = result.stderr
    assert "global_step_7/actor (verl checkpoint, merged by verl's model merger" in plan
    assert "captions chair@512: 5 held-out images" in plan and "chair@64" in plan
    assert "POPE (rebuilt)" in plan
    assert "needs: vllm backend: 2 GPU(s)" in plan and "not enough" in plan
    assert "at most" in plan and "new tokens" in plan
    assert not (tmp_path / "out").exists()  # nothing merged, generated or written


def test_dry_run_before_anything_is_there_still_plans_the_protocol(tmp_path):
    result = subprocess.run(
        [*COMMAND, "--dry-run", "--model", "base=Qwen/Qwen2.5-VL-3B-Instruct",
         "--model", f"rl={tmp_path / 'no_run'}", "--data", str(tmp_path / "no_data"),
         "--pope-dir", str(tmp_path / "no_pope"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = result.stderr
    assert "captions chair@512: 500 images" in plan and "captions chair@64: 500 images" in plan
    assert "POPE: about 9,000 questions" in plan
    # 500 x 512 + 500 x 64 caption tokens, 9,000 x 32 POPE tokens
    assert "1,000 captions + 9,000 POPE answers, at most 576,000 new tokens" in plan
    assert "base: Qwen/Qwen2.5-VL-3B-Instruct (prerequisite not met:" in plan
    assert "not ready: base, rl" in plan
    assert f"rl: {tmp_path / 'no_run'} (prerequisite not met: model rl=" in plan
    assert "no_run: no such folder)" in plan
    assert "test.parquet: not found" in plan
    assert not (tmp_path / "out").exists()


def write_released_pope(folder: Path, world: Path, test_ids: set[int]) -> None:
    """Files in the layout of RUCAIBox/POPE's output/coco, built from the world's annotations."""
    from entropyrl.evaluation.pope import POPE_SETTINGS, build_pope, coco_objects_by_image

    objects = coco_objects_by_image(world / "instances_val2014.json")
    objects = {image_id: names for image_id, names in objects.items() if image_id in test_ids}
    folder.mkdir()
    for setting in POPE_SETTINGS:
        questions = build_pope(
            objects, setting=setting, num_images=2, seed=5,
            extra_categories=["car", "bird", "cat", "dog", "horse", "umbrella", "cup", "clock"],
        )  # fmt: skip
        lines = [json.dumps(q.to_pope()) for q in questions]
        (folder / f"coco_pope_{setting}.json").write_text("\n".join(lines) + "\n")


def test_released_pope_files_are_used_and_their_checksum_checked(world_and_models, tmp_path):
    from entropyrl.evaluation.pope import file_sha256
    from entropyrl.evaluation.protocol import read_split

    test_ids = set(read_split(world_and_models.data / "test.parquet"))
    pope = tmp_path / "pope"
    write_released_pope(pope, world_and_models.world, test_ids)
    args = [
        *COMMAND, "--model", f"base={world_and_models.base}",
        "--data", str(world_and_models.data), "--coco", str(world_and_models.world),
        "--num-images", "2", "--max-new-tokens", "8", "--backend", "transformers",
        "--batch-size", "64", "--resamples", "50", "--pope-dir", str(pope),
    ]  # fmt: skip
    wrong = ["--pope-sha256", "random=" + "0" * 64]
    refused = subprocess.run(
        [*args, "--out", str(tmp_path / "a"), *wrong], capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2
    assert "coco_pope_random.json: sha256" in refused.stderr.strip().splitlines()[-1]
    right = ["--pope-sha256", f"random={file_sha256(pope / 'coco_pope_random.json')}"]
    result = subprocess.run(
        [*args, "--out", str(tmp_path / "b"), *right], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert results["protocol"]["pope"]["source"] == "released"
    note = results["protocol"]["pope"]["note"]
    assert "checked against --pope-sha256" in note
    # two images, not the released 500: said in the results and the table
    assert "NOT the released files' shape" in note
    assert "random: 12 questions over 2 images (released: 3,000 over 500)" in note
    assert "NOT the released files' shape" in (tmp_path / "b" / "table.md").read_text()
    assert results["results"]["pope/adversarial"]["questions"] == 12
    answered = read_jsonl(tmp_path / "b" / "base" / "pope.jsonl")
    assert {row["question_id"] for row in answered if row["setting"] == "random"} == set(range(12))


def test_the_help_says_what_a_cider_figure_compares_with(capsys) -> None:
    """--help's note matches the scorer: document frequencies of the evaluated images (one
    pycocoevalcap call over them), not the training reward's fixed corpus frequencies."""
    from entropyrl.commands.eval.caption import main
    from entropyrl.evaluation.caption_metrics import cider_scores
    from entropyrl.rewards.cider import CiderD
    from entropyrl.rewards.text import normalize_caption

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "document frequencies come from the references of exactly the evaluated images" in text
    assert "compares with a paper's only over the same images" in text
    assert "comparable only within this project" not in text
    rng = random.Random(0)
    words = [
        "a",
        "dog",
        "cat",
        "man",
        "sits",
        "on",
        "the",
        "table",
        "with",
        "two",
        "people",
        "red",
        "car",
    ]
    captions = [" ".join(rng.choices(words, k=8)) for _ in range(12)]
    references = [[" ".join(rng.choices(words, k=9)) for _ in range(3)] for _ in range(12)]
    gts = {i: [normalize_caption(r) for r in refs] for i, refs in enumerate(references[:6])}
    res = {i: [normalize_caption(c)] for i, c in enumerate(captions[:6])}
    _, per_call = Cider().compute_score(gts, res)
    evaluated = cider_scores(captions[:6], references[:6])
    assert evaluated == pytest.approx(list(per_call), rel=1e-9)
    corpus = CiderD.from_references(dict(enumerate(references)))  # training-style frequencies
    assert corpus.score_batch(captions[:6], references[:6]) != pytest.approx(list(evaluated))
