"""Which images `entropyrl prepare coco` trains on: no val2014 image unless --restval (CHAIR's and
POPE's images are val2014), Karpathy's splits from the original file and from a mirror's rows,
the manifest, and the docs showing one `prepare coco` command."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from entropyrl.cli import main
from entropyrl.data.coco import prepare_coco
from entropyrl.data.io import InputFileError

ROOT = Path(__file__).resolve().parents[2]
TRAIN2014 = set(range(1, 7))  # the fixture's train2014 images (coco_dirs)
RESTVAL = {100, 104, 105, 106, 107}  # val2014, usable (101 has no file, 999 no caption)
VAL, TEST = {102, 108}, {103, 109}


def split_of(image_id: int) -> str:
    if image_id in TRAIN2014:
        return "train"
    if image_id in VAL:
        return "val"
    return "test" if image_id in TEST else "restval"


def karpathy_entries(ann: Path) -> list[dict]:
    """Karpathy's dataset_coco.json entries for the coco_dirs images (101: restval, no file)."""
    entries = []
    for part in ("train", "val"):
        data = json.loads((ann / f"captions_{part}2014.json").read_text())
        captions: dict[int, list[str]] = {}
        for annotation in data["annotations"]:
            captions.setdefault(annotation["image_id"], []).append(annotation["caption"])
        for image in data["images"]:
            if image["id"] not in captions:  # 999: no caption, left out as Karpathy does
                continue
            entries.append(
                {
                    "filepath": f"{part}2014",
                    "filename": image["file_name"],
                    "cocoid": image["id"],
                    "split": split_of(image["id"]),
                    "sentences": [
                        {"raw": text, "tokens": text.lower().split()}
                        for text in captions[image["id"]]
                    ],
                }
            )
    return entries


def mirror_rows(entries: list[dict]) -> list[dict]:
    """The same images in yerevann/coco-karpathy's rows: sentences are the texts themselves."""
    return [
        {
            "filepath": entry["filepath"],
            "sentids": list(range(len(entry["sentences"]))),
            "filename": entry["filename"],
            "imgid": index,
            "split": entry["split"],
            "sentences": [sentence["raw"] for sentence in entry["sentences"]],
            "cocoid": entry["cocoid"],
            "url": f"http://images.cocodataset.org/{entry['filepath']}/{entry['filename']}",
        }
        for index, entry in enumerate(entries)
    ]


def write_layout(layout: str, entries: list[dict], root: Path) -> Path:
    """Karpathy's splits in one layout; returns what --karpathy is given."""
    root.mkdir(parents=True, exist_ok=True)
    if layout == "dataset_coco.json":
        path = root / "dataset_coco.json"
        path.write_text(json.dumps({"dataset": "coco", "images": entries}))
        return path
    rows = mirror_rows(entries)
    if layout == "mirror parquet folder":  # `hf download yerevann/coco-karpathy` lays it out so
        for name, splits in (
            ("train", ("train", "restval")),
            ("validation", ("val",)),
            ("test", ("test",)),
        ):
            path = root / "data" / f"{name}-00000-of-00001.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist([r for r in rows if r["split"] in splits]), path)
        (root / "README.md").write_text("# coco-karpathy\n")
        return root
    path = root / "coco_karpathy.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist() if path.is_file() else []


def split_ids(out: Path) -> dict[str, set[int]]:
    return {
        split: {row["extra_info"]["image_id"] for row in rows(out / f"{split}.parquet")}
        for split in ("train", "val", "test")
    }


def sources(path: Path) -> dict[int, str]:
    return {row["extra_info"]["image_id"]: row["extra_info"]["source"] for row in rows(path)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "layout", ["dataset_coco.json", "mirror parquet folder", "mirror json lines"]
)
def test_no_val2014_image_is_trained_on_by_default(coco_dirs, tmp_path, layout):
    ann, img = coco_dirs
    karpathy = write_layout(layout, karpathy_entries(ann), tmp_path / "karpathy")
    out = tmp_path / "out"
    summary = prepare_coco(ann, img, out, karpathy=karpathy, chair_ground_truth=False)
    ids = split_ids(out)
    assert ids == {"train": TRAIN2014, "val": VAL, "test": TEST | RESTVAL}
    train = rows(out / "train.parquet")
    assert all(row["extra_info"]["file_name"].startswith("COCO_train2014_") for row in train)
    assert summary["val2014_in_train"] == 0 and summary["warnings"] == []
    assert "restval (5 val2014 images) held out in test.parquet" in summary["split_rule"]
    assert sources(out / "test.parquet") == {
        **dict.fromkeys(TEST, "karpathy"),
        **dict.fromkeys(RESTVAL, "karpathy_restval"),
    }
    # every layout reads the same references
    refs = {
        r["extra_info"]["image_id"]: json.loads(r["reward_model"]["ground_truth"])["references"]
        for split in ("train", "val", "test")
        for r in rows(out / f"{split}.parquet")
    }
    assert refs[104] == [f"A dog on the grass number {k}." for k in range(3)]

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["restval_in"] == "test"
    assert manifest["images"] == {
        "train": {"train2014": 6, "val2014": 0},
        "val": {"train2014": 0, "val2014": 2},
        "test": {"train2014": 0, "val2014": 7},
    }
    assert manifest["moved_to_test"]["restval"]["image_ids"] == sorted(RESTVAL)
    assert manifest["val2014_in_train"] == []
    files = manifest["karpathy"]["files"]
    if layout == "mirror parquet folder":
        assert [Path(f["path"]).name for f in files] == [
            "test-00000-of-00001.parquet",
            "train-00000-of-00001.parquet",
            "validation-00000-of-00001.parquet",
        ]
    else:
        assert [f["path"] for f in files] == [str(karpathy.resolve())]
    assert all(f["sha256"] == sha256(Path(f["path"])) for f in files)
    expected_layout = "dataset_coco.json" if layout == "dataset_coco.json" else "rows"
    assert {f["layout"] for f in files} == {expected_layout}
    assert manifest["karpathy"]["published_sha256"] is None


def test_restval_trains_on_val2014_and_says_so(coco_dirs, tmp_path, capsys):
    ann, img = coco_dirs
    karpathy = write_layout("dataset_coco.json", karpathy_entries(ann), tmp_path / "k")
    out = tmp_path / "out"
    command = ["prepare", "coco", "--annotations", str(ann), "--images", str(img)]
    command += ["--karpathy", str(karpathy), "--out", str(out), "--no-chair", "--restval"]
    assert main(command) == 0
    captured = capsys.readouterr()
    assert split_ids(out) == {"train": TRAIN2014 | RESTVAL, "val": VAL, "test": TEST}
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "--restval: 5 val2014 images are in train.parquet" in warnings[0]
    assert "CHAIR" in warnings[0] and "POPE" in warnings[0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["restval_in"] == "train"
    assert manifest["val2014_in_train"] == sorted(RESTVAL)
    assert manifest["moved_to_test"]["restval"]["image_ids"] == []
    assert {r["extra_info"]["source"] for r in rows(out / "train.parquet")} == {"karpathy"}


def test_the_hash_split_keeps_val2014_out_of_training_and_says_so(coco_dirs, tmp_path, capsys):
    ann, img = coco_dirs
    out = tmp_path / "out"
    command = ["prepare", "coco", "--annotations", str(ann), "--images", str(img)]
    command += ["--out", str(out), "--no-chair", "--val-size", "2", "--test-size", "3"]
    assert main(command) == 0
    captured = capsys.readouterr()
    ids = split_ids(out)
    assert ids["train"] == TRAIN2014
    assert len(ids["val"]) == 2 and len(ids["test"]) == 3 + 4
    assert not (ids["val"] | ids["test"]) & TRAIN2014
    said = [line for line in captured.err.splitlines() if "hash split" in line]
    assert len(said) == 1 and said[0].startswith("warning: no --karpathy: a hash split")
    assert "2 val, 3 test, the other 4 held out in test.parquet" in said[0]
    assert "Karpathy" in said[0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits_from"] == "hash of the val2014 image ids"
    assert manifest["karpathy"] is None
    assert manifest["images"]["train"] == {"train2014": 6, "val2014": 0}
    # what bounds a prompt without opening an image: each split's sizes (read from the files'
    # headers) and the rows' prompt
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert manifest["prompts"] == [rows[0]["prompt"]]
    for split in ("train", "val", "test"):
        table = pq.read_table(out / f"{split}.parquet").to_pylist()
        expected: dict[str, int] = {}
        for row in table:
            with Image.open(row["images"][0]) as image:
                key = f"{image.size[0]}x{image.size[1]}"
            expected[key] = expected.get(key, 0) + 1
        assert manifest["image_sizes"][split] == expected, split
    restval = set(manifest["moved_to_test"]["restval"]["image_ids"])
    assert len(restval) == 4 and restval <= ids["test"]
    test = sources(out / "test.parquet")
    assert {i for i, source in test.items() if source == "coco2014_restval"} == restval
    # --restval: the hash split's rest trains, as before this rule
    again = tmp_path / "again"
    command[command.index(str(out))] = str(again)
    assert main([*command, "--restval"]) == 0
    assert "--restval: 4 val2014 images are in train.parquet" in capsys.readouterr().err
    assert split_ids(again)["train"] == TRAIN2014 | restval


def test_the_synthetic_world_keeps_its_splits(tmp_path):
    """The smoke's call (val_size + test_size = every val2014 image): nothing moves."""
    from entropyrl.rig.synthetic import build_synthetic_coco

    world = build_synthetic_coco(tmp_path / "world", num_train=5, num_test=6, image_size=56)
    summary = prepare_coco(world.root, world.root, tmp_path / "data", val_size=3, test_size=3)
    assert summary["rows"] == {"train": 5, "val": 3, "test": 3}
    test = rows(tmp_path / "data" / "test.parquet")
    assert {row["extra_info"]["source"] for row in test} == {"coco2014"}


@pytest.mark.parametrize(
    ("layout", "break_it", "field"),
    [
        ("dataset_coco.json", lambda data: data["images"][0].pop("cocoid"), "'cocoid'"),
        ("dataset_coco.json", lambda data: data.pop("images"), "'images'"),
        (
            "dataset_coco.json",
            lambda data: data["images"][0].update(sentences=[{"text": "a dog"}]),
            "'sentences'",
        ),
        ("mirror json lines", lambda data: data[0].update(filepath=7), "'filepath'"),
        ("mirror parquet", lambda data: [row.pop("sentences") for row in data], "'sentences'"),
    ],
)
def test_a_malformed_split_file_is_one_line_naming_file_and_field(
    coco_dirs, tmp_path, capsys, layout, break_it, field
):
    ann, img = coco_dirs
    entries = karpathy_entries(ann)
    if layout == "dataset_coco.json":
        data = {"images": entries}
        break_it(data)
        path = tmp_path / "dataset_coco.json"
        path.write_text(json.dumps(data))
    elif layout == "mirror json lines":
        data = mirror_rows(entries)
        break_it(data)
        path = tmp_path / "rows.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in data))
    else:
        data = mirror_rows(entries)
        break_it(data)
        path = tmp_path / "train-00000-of-00001.parquet"
        pq.write_table(pa.Table.from_pylist(data), path)
    with pytest.raises(InputFileError) as error:
        prepare_coco(ann, img, tmp_path / "out", karpathy=path, chair_ground_truth=False)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and field in message
    command = ["prepare", "coco", "--annotations", str(ann), "--images", str(img)]
    assert main([*command, "--karpathy", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_a_folder_without_parquet_files_is_named(coco_dirs, tmp_path):
    ann, img = coco_dirs
    (tmp_path / "k").mkdir()
    with pytest.raises(InputFileError, match=r"k: no \.parquet file"):
        prepare_coco(ann, img, tmp_path / "out", karpathy=tmp_path / "k")


DOC_PAGES = ("training", "hallucination_eval")
PREPARE = re.compile(r"^(?:.*&& )?(entropyrl prepare coco .*)$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_docs_show_one_prepare_coco_command():
    pages = [ROOT / "README.md", *(ROOT / "docs" / f"{name}.md" for name in DOC_PAGES)]
    commands = {}
    for page in pages:
        blocks = "\n".join(FENCE.findall(page.read_text(encoding="utf-8")))
        found = PREPARE.findall(blocks)
        assert found, f"{page.name}: no `entropyrl prepare coco` command"
        commands[page.name] = found
        assert "caption_datasets.zip" not in blocks, f"{page.name}: downloads the dead link"
    lines = {line for found in commands.values() for line in found}
    assert len(lines) == 1, f"the pages show different commands: {commands}"
    assert "--karpathy" in lines.pop()


def test_the_evaluation_scores_quality_on_karpathys_test_images_only(coco_dirs, tmp_path):
    """The held-out split also holds restval: the caption evaluation's `karpathy_test` set (the
    one whose CIDEr-D compares with papers' Karpathy-test figures) takes Karpathy's own test
    images, not the restval images beside them."""
    import argparse

    from entropyrl.commands.eval import caption as eval_caption
    from entropyrl.commands.eval import plan as eval_plan

    ann, img = coco_dirs
    karpathy = write_layout("dataset_coco.json", karpathy_entries(ann), tmp_path / "karpathy")
    prepare_coco(ann, img, tmp_path / "out", karpathy=karpathy, chair_ground_truth=False)
    parser = argparse.ArgumentParser()
    eval_caption.add_arguments(parser)
    args = parser.parse_args(
        [
            *("--model", f"base={tmp_path / 'no_model'}", "--data", str(tmp_path / "out")),
            *("--coco", str(ann), "--out", str(tmp_path / "eval"), "--num-images", "2"),
            "--dry-run",
        ]
    )
    plan = eval_plan.make_plan(args)
    quality = [s for s in plan.caption_sets if s.name == "karpathy_test"]
    assert [s.image_ids for s in quality] == [sorted(TEST)]
