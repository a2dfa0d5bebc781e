"""COCO converter: parquet rows, splits, CIDEr df of the train split, CHAIR ground truth, CLI."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from entropyrl.cli import main
from entropyrl.data.coco import prepare_coco
from entropyrl.data.io import InputFileError
from entropyrl.rewards.cider import CiderD


def rows(path):
    return pq.read_table(path).to_pylist()


def test_prepare_coco_without_karpathy(coco_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("CHAIR_CACHE_DIR", str(tmp_path / "chair_cache"))
    ann, img = coco_dirs
    out = tmp_path / "out"
    summary = prepare_coco(ann, img, out, val_size=3, test_size=2)
    # val2014: 11 images, 999 has no caption, 101 has no file -> 9 left: 3 val, 2 test, and 4
    # restval, held out in test: no val2014 image is trained on
    assert summary["rows"] == {"train": 6, "val": 3, "test": 2 + 4}
    assert summary["val2014_in_train"] == 0
    reasons = " | ".join(summary["first_rejects"])
    assert "12345" in reasons and "999 has no reference" in reasons and "not found" in reasons
    assert summary["rows_rejected"] == 3 and (out / "rejects.jsonl").is_file()
    train = rows(out / "train.parquet")
    row = train[0]
    assert row["data_source"] == "coco_caption" and row["ability"] == "captioning"
    assert row["prompt"] == [
        {"role": "user", "content": "<image>Please describe this image in detail."}
    ]
    assert len(row["images"]) == 1 and row["images"][0].endswith(row["extra_info"]["file_name"])
    truth = json.loads(row["reward_model"]["ground_truth"])
    assert truth["image_id"] == row["extra_info"]["image_id"] and len(truth["references"]) == 3
    assert [r["extra_info"]["index"] for r in train] == list(range(6))
    split_ids = {
        s: {r["extra_info"]["image_id"] for r in rows(out / f"{s}.parquet")}
        for s in ("train", "val", "test")
    }
    assert split_ids["train"] == set(range(1, 7))
    # CIDEr df is built from the train references only
    df = CiderD.load(out / "cider_df.json.gz")
    assert df.num_images == 6
    refs = {
        r["extra_info"]["image_id"]: json.loads(r["reward_model"]["ground_truth"])["references"]
        for r in train
    }
    expected = CiderD.from_references(refs)
    cand, ref = "a dog on the grass", refs[1]
    assert df.score(cand, ref) == expected.score(cand, ref)
    # CHAIR ground truth for every written image
    chair = json.loads((out / "chair_ground_truth.json").read_text())
    assert set(chair) == {str(i) for ids in split_ids.values() for i in ids}
    assert "dog" in chair["4"] and "horse" in chair["102"]
    # deterministic: same again, same files
    again = tmp_path / "again"
    prepare_coco(ann, img, again, val_size=3, test_size=2)
    for split in ("train", "val", "test"):
        a = [
            (r["extra_info"]["image_id"], r["reward_model"]) for r in rows(out / f"{split}.parquet")
        ]
        b = [
            (r["extra_info"]["image_id"], r["reward_model"])
            for r in rows(again / f"{split}.parquet")
        ]
        assert a == b


def test_prepare_coco_with_karpathy(coco_dirs, tmp_path):
    ann, img = coco_dirs
    karpathy = tmp_path / "dataset_coco.json"
    entries = [
        {
            "cocoid": 1,
            "filepath": "train2014",
            "filename": "COCO_train2014_000000000001.jpg",
            "split": "train",
            "sentences": [{"raw": "A dog."}],
        },
        {
            "cocoid": 100,
            "filepath": "val2014",
            "filename": "COCO_val2014_000000000100.jpg",
            "split": "restval",
            "sentences": [{"raw": "A dog on grass."}],
        },
        {
            "cocoid": 102,
            "filepath": "val2014",
            "filename": "COCO_val2014_000000000102.jpg",
            "split": "val",
            "sentences": [{"raw": "A horse."}],
        },
        {
            "cocoid": 103,
            "filepath": "val2014",
            "filename": "COCO_val2014_000000000103.jpg",
            "split": "test",
            "sentences": [{"raw": "A bird."}],
        },
        {
            "cocoid": 104,
            "filepath": "val2014",
            "filename": "COCO_val2014_000000000104.jpg",
            "split": "holdout",
            "sentences": [],
        },
    ]
    karpathy.write_text(json.dumps({"images": entries}))
    out = tmp_path / "out"
    summary = prepare_coco(
        ann, img, out, karpathy=karpathy, prompt="Describe.", chair_ground_truth=False
    )
    assert summary["rows"] == {"train": 1, "val": 1, "test": 2}  # restval 100 held out in test
    assert "'split'" in summary["first_rejects"][0]
    assert rows(out / "val.parquet")[0]["prompt"][0]["content"] == "<image>Describe."
    test = {
        row["extra_info"]["image_id"]: row["extra_info"]["source"]
        for row in rows(out / "test.parquet")
    }
    assert test == {100: "karpathy_restval", 103: "karpathy"}
    assert not (out / "chair_ground_truth.json").exists()
    # a paper's list held out: the restval image leaves training for the test split
    held = prepare_coco(
        ann, img, tmp_path / "held", karpathy=karpathy, chair_ground_truth=False,
        hold_out=[100, 999],
    )  # fmt: skip
    assert held["rows"] == {"train": 1, "val": 1, "test": 2}
    assert held["held_out"] == 1 and "[999]" in " ".join(held["warnings"])
    test_ids = {row["extra_info"]["image_id"] for row in rows(tmp_path / "held" / "test.parquet")}
    assert test_ids == {100, 103}
    sources = {
        row["extra_info"]["image_id"]: row["extra_info"]["source"]
        for row in rows(tmp_path / "held" / "test.parquet")
    }
    assert sources == {100: "karpathy_hold_out", 103: "karpathy"}


def test_missing_and_malformed_inputs(tmp_path, coco_dirs):
    ann, img = coco_dirs
    with pytest.raises(InputFileError, match="annotations folder not found"):
        prepare_coco(tmp_path / "nope", img, tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputFileError, match="captions_train2014"):
        prepare_coco(empty, img, tmp_path / "out")
    (ann / "captions_val2014.json").write_text('{"images": [\n  {"id": 1,}\n]}')
    with pytest.raises(InputFileError, match=r"captions_val2014\.json, line 2"):
        prepare_coco(ann, img, tmp_path / "out")


def test_cli_prepare_coco_and_fc(coco_dirs, xlam_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CHAIR_CACHE_DIR", str(tmp_path / "chair_cache"))
    ann, img = coco_dirs
    code = main(
        [
            "prepare",
            "coco",
            "--annotations",
            str(ann),
            "--images",
            str(img),
            "--out",
            str(tmp_path / "c"),
            "--val-size",
            "2",
            "--test-size",
            "2",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rows"] == {"train": 6, "val": 2, "test": 2 + 5}
    assert "first 3 rejected rows" in captured.err
    code = main(
        [
            "prepare",
            "fc",
            "--format",
            "xlam",
            "--input",
            str(xlam_file),
            "--out",
            str(tmp_path / "f"),
            "--max-samples",
            "10",
            "--test-size",
            "0.2",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["test"] == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\nnot json\n')
    code = main(
        ["prepare", "fc", "--format", "xlam", "--input", str(bad), "--out", str(tmp_path / "g")]
    )
    assert code == 2
    assert f"{bad}, line 2" in capsys.readouterr().err
    assert (
        main(
            [
                "prepare",
                "fc",
                "--format",
                "xlam",
                "--input",
                str(tmp_path / "missing.jsonl"),
                "--out",
                str(tmp_path / "g"),
            ]
        )
        == 2
    )
    assert main(["prepare"]) == 2


def test_an_images_folder_one_level_too_deep_is_refused_in_one_line(
    coco_dirs, tmp_path, capsys, monkeypatch
):
    """`--images coco/val2014` (the release folder, not the one holding it) finds no train2014
    image: one line naming the folder to give, exit 2, nothing written."""
    monkeypatch.setenv("CHAIR_CACHE_DIR", str(tmp_path / "chair_cache"))
    ann, img = coco_dirs
    out = tmp_path / "c"
    deep = img / "val2014"
    assert deep.is_dir()
    code = main(
        ["prepare", "coco", "--annotations", str(ann), "--images", str(deep), "--out", str(out)]
    )
    assert code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert line.startswith(f"error: {deep}: none of the ")
    assert "train2014 images found" in line
    assert line.endswith("--images is the folder that holds train2014/ and val2014/")
    assert not (out / "train.parquet").exists() and not (out / "val.parquet").exists()
