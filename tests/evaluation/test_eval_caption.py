"""`entropyrl eval caption` end to end on a generated COCO world with two tiny Qwen2.5-VL models
(transformers backend, CPU): the files it writes, figures that equal an independent
recomputation (CHAIR through the running CHAIR service over HTTP, CIDEr-D and BLEU-4 through
pycocoevalcap, POPE from the answers), resuming, and its one-line refusals. The verl-checkpoint
path (verl's model merger) runs in tests/verl/test_smoke.py on the caption smoke's checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider

from entropyrl.evaluation.pope import POPE_METRICS, parse_answer, pope_metrics
from entropyrl.rewards.text import normalize_caption

COMMAND = [sys.executable, "-m", "entropyrl.commands.eval_caption"]


def save_tiny_model(folder: Path, seed: int, image_size: int) -> None:
    from entropyrl.models.tiny import TinyModelConfig, build_tiny_qwen2_5_vl
    from entropyrl.models.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

    tokenizer = build_qwen_tokenizer(8192)
    processor = build_qwen2vl_processor(tokenizer, image_size=image_size)
    model = build_tiny_qwen2_5_vl(tokenizer, TinyModelConfig(hidden_size=32), seed=seed)
    folder.mkdir(parents=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor.image_processor.save_pretrained(folder)


@pytest.fixture(scope="module")
def world_and_models(tmp_path_factory):
    from entropyrl.data.coco import prepare_coco
    from entropyrl.data.synthetic import build_synthetic_coco

    root = tmp_path_factory.mktemp("eval_world")
    world = build_synthetic_coco(root / "world", num_train=8, num_test=24, image_size=56, seed=3)
    prepare_coco(world.root, world.root, root / "data", val_size=4, test_size=20)
    save_tiny_model(root / "base", seed=0, image_size=56)
    save_tiny_model(root / "other", seed=1, image_size=56)
    return root


def eval_args(root: Path, out: Path, *extra: str) -> list[str]:
    return [
        *COMMAND,
        "--model", f"base={root / 'base'}",
        "--model", f"other={root / 'other'}",
        "--data", str(root / "data"),
        "--coco", str(root / "world"),
        "--out", str(out),
        "--num-images", "12",
        "--max-new-tokens", "24", "8",
        "--backend", "transformers",
        "--resamples", "200",
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
    assert "Captions:" in result.stdout


def test_the_image_set_is_held_out_and_written_beside_the_results(evaluation, world_and_models):
    from entropyrl.evaluation.protocol import read_split

    out, _ = evaluation
    listed = json.loads((out / "images.json").read_text())["image_ids"]
    held_out = set(read_split(world_and_models / "data" / "test.parquet"))
    train = set(read_split(world_and_models / "data" / "train.parquet"))
    assert len(listed) == 12 and set(listed) <= held_out and not set(listed) & train


def recompute_captions(out: Path, chair_url: str, key: str, model: str) -> dict[str, float]:
    """CHAIR through the service, CIDEr-D and BLEU-4 through pycocoevalcap, from captions.jsonl."""
    from entropyrl.evaluation.protocol import read_split

    results = json.loads((out / "results.json").read_text())
    name, tokens = key.split("@")
    rows = [
        row
        for row in read_jsonl(out / model / "captions.jsonl")
        if row["set"] == name and row["max_new_tokens"] == int(tokens)
    ]
    answer = requests.post(
        f"{chair_url}/v1/chair",
        json={"captions": [{"image_id": r["image_id"], "caption": r["caption"]} for r in rows]},
        timeout=60,
    ).json()
    overall = answer["overall_metrics"]
    references = read_split(Path(results["protocol"]["data"]) / "test.parquet")
    gts = {r["image_id"]: [normalize_caption(x) for x in references[r["image_id"]].references]
           for r in rows}  # fmt: skip
    res = {r["image_id"]: [normalize_caption(r["caption"])] for r in rows}
    cider, _ = Cider().compute_score(gts, res)
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    return {
        "CHAIR_s": overall["CHAIRs"],
        "CHAIR_i": overall["CHAIRi"],
        "recall": overall["Recall"],
        "length": overall["mean_length"],
        "CIDEr-D": cider,
        "BLEU-4": bleu[3],
    }


def check_recomputation(out: Path, coco: Path) -> None:
    from chair_server.launch import start_server

    results = json.loads((out / "results.json").read_text())
    with start_server(coco=coco, restart=False) as server:
        for key, entry in results["results"].items():
            if entry["kind"] != "captions":
                continue
            for model, summary in entry["models"].items():
                expected = recompute_captions(out, server.url, key, model)
                for metric, value in expected.items():
                    estimate = summary["metrics"][metric]["estimate"]
                    if value is None:
                        assert estimate is None, (key, model, metric)
                    else:
                        assert estimate == pytest.approx(value, rel=1e-9, abs=1e-12), (
                            key, model, metric
                        )  # fmt: skip
    for model in results["models"]:
        rows = read_jsonl(out / model / "pope.jsonl")
        for key, entry in results["results"].items():
            if entry["kind"] != "pope":
                continue
            setting = key.split("/")[1]
            answered = [row for row in rows if row["setting"] == setting]
            assert len(answered) == entry["questions"]
            metrics = pope_metrics(
                [row["label"] for row in answered],
                [parse_answer(row["answer"]) for row in answered],
            )
            for name in POPE_METRICS:
                estimate = entry["models"][model]["metrics"][name]["estimate"]
                assert estimate == pytest.approx(getattr(metrics, name)), (key, model, name)


def test_results_equal_a_recomputation_from_the_written_files(evaluation, world_and_models):
    out, _ = evaluation
    check_recomputation(out, world_and_models / "world")


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
    assert json.loads((out / "results.json").read_text())["results"] == results_before["results"]
    assert {p: p.read_bytes() for p in out.glob("*/captions.jsonl")} == before


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

    train = sorted(read_split(world_and_models / "data" / "train.parquet"))
    test = sorted(read_split(world_and_models / "data" / "test.parquet"))
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
        [*COMMAND, "--dry-run", "--model", f"base={world_and_models / 'base'}",
         "--model", f"rl={tmp_path / 'run'}", "--data", str(world_and_models / "data"),
         "--coco", str(world_and_models / "world"), "--out", str(tmp_path / "out"),
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

    test_ids = set(read_split(world_and_models / "data" / "test.parquet"))
    pope = tmp_path / "pope"
    write_released_pope(pope, world_and_models / "world", test_ids)
    args = [
        *COMMAND, "--model", f"base={world_and_models / 'base'}",
        "--data", str(world_and_models / "data"), "--coco", str(world_and_models / "world"),
        "--num-images", "2", "--max-new-tokens", "8", "--backend", "transformers",
        "--resamples", "50", "--pope-dir", str(pope),
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
