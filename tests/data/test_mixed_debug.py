"""`entropyrl prepare mixed-debug`: layout, reproducibility, and every reference answer scoring 1
under the hybrid reward (math-verify and the real local sandbox)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from entropyrl.cli import main as entropyrl_main
from entropyrl.data.mixed_debug import DATA_SOURCES, mixed_debug_rows, prepare_mixed_debug


def read(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_cli_writes_train_and_val_and_reports(tmp_path, capsys):
    out = tmp_path / "mixed"
    code = entropyrl_main(["prepare", "mixed-debug", "--out", str(out), "--train-size", "6"])
    assert code in (0, None)
    summary = json.loads(capsys.readouterr().out)
    assert (summary["train"], summary["val"]) == (6, 8)
    assert summary["abilities"] == {"train": {"code": 3, "math": 3}, "val": {"code": 4, "math": 4}}
    assert sorted(p.name for p in out.iterdir()) == [
        "train.parquet",
        "val.parquet",
    ]  # no temp files
    rows = read(out / "train.parquet")
    assert [row["ability"] for row in rows] == ["math", "code"] * 3
    for row in rows:
        assert row["extra_info"]["ability"] == row["ability"]  # verl passes only extra_info
        assert row["data_source"] == DATA_SOURCES[row["ability"]]
        assert row["reward_model"]["style"] == "rule"
        assert isinstance(row["reward_model"]["ground_truth"], str)
        assert row["prompt"][0]["role"] == "user"
    kinds = {row["extra_info"]["kind"] for row in read(out / "val.parquet")}
    assert {"code_sum", "code_max", "code_call", "math_sum", "math_percent"} <= kinds


def test_same_seed_same_rows_other_seed_other_rows():
    assert mixed_debug_rows(8, split="train", seed=3) == mixed_debug_rows(8, split="train", seed=3)
    assert mixed_debug_rows(8, split="train", seed=3) != mixed_debug_rows(8, split="train", seed=4)
    assert mixed_debug_rows(8, split="train", seed=3) != mixed_debug_rows(8, split="val", seed=3)


def test_too_small_is_refused(tmp_path, capsys):
    code = entropyrl_main(["prepare", "mixed-debug", "--out", str(tmp_path), "--val-size", "1"])
    assert code == 2
    assert "must be >= 2" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        prepare_mixed_debug(tmp_path, train_size=0)


def test_every_reference_answer_scores_one(tmp_path):
    pytest.importorskip("math_verify")
    from entropyrl.rewards.hybrid import compute_score

    rows = mixed_debug_rows(12, split="val", seed=0)
    for row in rows:
        result = compute_score(
            row["data_source"],
            row["extra_info"]["reference"],
            row["reward_model"]["ground_truth"],
            row["extra_info"],
            tmp_root=str(tmp_path),
        )
        assert result["score"] == 1.0, (row, result)
        assert result["route"] == row["ability"]
