"""Every JSON file the project writes parses with a strict parser: a value not measured or not
finite (NaN, infinity) is null, never `NaN`/`Infinity` (which jq and JavaScript reject)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from entropyrl.core.files import finite_json, json_dumps, write_json

NAN, INF = math.nan, math.inf


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} in JSON: jq and JavaScript reject it")


def strict_loads(text: str):
    """`json.loads` that refuses NaN, Infinity and -Infinity, as jq and JavaScript do."""
    return json.loads(text, parse_constant=_refuse)


def strict_lines(path: Path) -> list:
    return [strict_loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_strict_parser_refuses_what_python_writes_by_default():
    with pytest.raises(AssertionError, match="NaN"):
        strict_loads(json.dumps({"x": NAN}))
    with pytest.raises(AssertionError, match="Infinity"):
        strict_loads(json.dumps([-INF]))


def test_finite_json_maps_non_finite_numbers_to_none_at_any_depth():
    value = {"a": NAN, "b": [1.5, INF, (-INF, 2)], "c": {"d": {"e": NAN}}, "f": "NaN", "g": True}
    assert finite_json(value) == {
        "a": None,
        "b": [1.5, None, [None, 2]],
        "c": {"d": {"e": None}},
        "f": "NaN",  # a string stays a string
        "g": True,
    }
    assert strict_loads(json_dumps(value)) == finite_json(value)
    assert json_dumps({"x": 0.1, "n": 3}) == json.dumps({"x": 0.1, "n": 3})  # finite: unchanged


def test_numpy_and_torch_scalars_become_numbers_or_null():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    value = {
        "np_nan": np.float32("nan"),
        "np_f64_inf": np.float64("inf"),
        "np_int": np.int64(7),
        "np_bool": np.bool_(True),
        "np_0d": np.array(2.5),
        "torch_inf": torch.tensor(float("-inf")),
        "torch_half": torch.tensor(0.5),
    }
    assert strict_loads(json_dumps(value)) == {
        "np_nan": None,
        "np_f64_inf": None,
        "np_int": 7,
        "np_bool": True,
        "np_0d": 2.5,
        "torch_inf": None,
        "torch_half": 0.5,
    }


def test_write_json_writes_strict_json_atomically(tmp_path):
    path = tmp_path / "out" / "data.json"
    write_json({"score": NAN, "rows": [{"ratio": INF}, {"ratio": 1.0}]}, path)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and strict_loads(text) == {
        "score": None,
        "rows": [{"ratio": None}, {"ratio": 1.0}],
    }
    assert [p.name for p in path.parent.iterdir()] == ["data.json"]  # no temporary file left


def test_the_local_runners_metrics_log_writes_null_and_keeps_nan_in_memory(tmp_path):
    pytest.importorskip("torch")
    from entropyrl.rig.local.runner import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write("rl", 0, {"reward": 0.5, "entropy/hallucinated": NAN}, variant="egpo")
    log.write("eval", 1, {"chair_i": NAN, "cider": INF, "recall": -INF}, variant="warm-up")
    assert strict_lines(tmp_path / "metrics.jsonl") == [
        {"phase": "rl", "step": 0, "variant": "egpo", "reward": 0.5, "entropy/hallucinated": None},
        {"phase": "eval", "step": 1, "variant": "warm-up", "chair_i": None, "cider": None,
         "recall": None},
    ]  # fmt: skip
    assert math.isnan(log.records[1]["chair_i"])  # the curves still see a float


def test_summary_json_of_a_local_run_is_strict(tmp_path):
    from entropyrl.rig.local.reference import quick_start_checks
    from entropyrl.rig.local.report import eval_columns, eval_row, markdown_table, write_summary

    scored = {"chair_i": 0.2, "chair_s": 0.5, "recall": 0.9, "cider": 4.0, "length": 9.0}
    unscored = {**scored, "chair_i": NAN, "chair_s": NAN, "recall": NAN, "chair_unscored": 8}
    rows = [eval_row("after warm-up", scored, 1.0), eval_row("after RL: egpo", unscored, INF)]
    summary = {
        "rows": rows,
        "checks": quick_start_checks(rows),
        "variants": {"egpo": {"eval": unscored, "reward_first": None, "spread": (NAN, 1.0)}},
        "settings": {"lr": 5e-5},
    }
    json_path, md_path = write_summary(tmp_path, summary, markdown_table(rows, eval_columns(rows)))
    saved = strict_loads(json_path.read_text(encoding="utf-8"))
    assert saved["rows"][1]["chair_i_pct"] is None and saved["rows"][1]["train_seconds"] is None
    assert saved["variants"]["egpo"]["spread"] == [None, 1.0]
    chair = saved["checks"][0]
    assert chair["metric"] == "chair_i_pct" and chair["after_rl"] is None
    assert chair["passed"] is False
    assert "n/a" in md_path.read_text(encoding="utf-8")


def test_study_combine_reads_null_and_writes_strict_json(tmp_path):
    pytest.importorskip("matplotlib")
    from entropyrl.rig.local.study import combine

    for seed in (0, 1):
        folder = tmp_path / f"s{seed}"
        folder.mkdir()
        runs = [
            {"seed": seed, "variant": variant, "label": variant, "eval/chair_i": chair,
             "eval/cider": 4.0 + seed, "train/entropy/hallucinated": NAN, "cpu_seconds": 1.0,
             "steps": 3}
            for variant, chair in (("warm-up", 0.3), ("grpo-low", NAN), ("grpo-step", 0.1))
        ]  # fmt: skip
        write_json({"settings": {"seeds": str(seed)}, "runs": runs}, folder / "summary.json")
        records = [
            {"phase": "rl", "step": step, "variant": "grpo-low", "seed": seed,
             "entropy": 1.0, "chair_i": NAN if step else 0.2, "reward": INF}
            for step in range(3)
        ]  # fmt: skip
        (folder / "metrics.jsonl").write_text("".join(json_dumps(r) + "\n" for r in records))
    summary = combine([tmp_path / "s0", tmp_path / "s1"], tmp_path / "all")
    assert math.isnan(summary["runs"][1]["eval/chair_i"])  # null read back as not measured
    saved = strict_loads((tmp_path / "all" / "summary.json").read_text(encoding="utf-8"))
    grpo = saved["aggregate"]["variants"]["grpo-low"]
    assert grpo["eval/chair_i"] == {"mean": None, "sd": None, "n": 0}
    assert saved["runs"][1]["eval/chair_i"] is None
    lines = strict_lines(tmp_path / "all" / "metrics.jsonl")
    assert len(lines) == 6 and lines[1]["chair_i"] is None and lines[0]["reward"] is None
