"""The end of a demo: one verdict line, last, a FAIL exits non-zero, and an earlier run's folder
is kept (the run goes to the next free one) unless --overwrite."""

from __future__ import annotations

import json
import subprocess
import sys

from entropyrl.rig.local.demo import output_folder
from entropyrl.rig.local.reference import quick_start_checks, quick_start_verdict

TINY = [
    "--num-train", "16", "--num-test", "4", "--image-size", "56", "--max-objects", "1",
    "--hidden-size", "64", "--warmup-steps", "12", "--warmup-batch", "4", "--steps", "2",
    "--prompts-per-step", "2", "--samples-per-prompt", "2", "--max-new-tokens", "8",
    "--eval-max-new-tokens", "8", "--threads", "1", "--adv", "egpo", "--no-progress",
]  # fmt: skip

ROWS = [
    {"stage": "after warm-up", "chair_i_pct": 27.7, "cider": 4.17},
    {"stage": "after RL: egpo+clip", "chair_i_pct": 3.1, "cider": 5.32},
]


def test_a_pass_is_one_line_with_its_figures() -> None:
    checks = quick_start_checks(ROWS)
    assert quick_start_verdict(ROWS, checks, "runs/demo") == (
        True,
        "PASS: egpo+clip: held-out CHAIR_i 27.7 % -> 3.1 %, CIDEr-D 4.17 -> 5.32; outputs in "
        "runs/demo",
    )


def test_a_fail_names_the_check_that_failed() -> None:
    rows = [ROWS[0], {"stage": "after RL: grpo", "chair_i_pct": 27.5, "cider": 4.2}]
    passed, line = quick_start_verdict(rows, quick_start_checks(rows), "out")
    assert not passed
    assert line.startswith("FAIL: grpo: held-out CHAIR_i 27.7 % -> 27.5 %")
    assert "; failed: grpo: held-out CHAIR_i falls by more than" in line


def test_an_earlier_run_is_kept(tmp_path) -> None:
    out = tmp_path / "demo"
    assert output_folder(str(out), overwrite=False) == str(out)  # nothing there yet
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert output_folder(str(out), overwrite=False) == str(out)  # no earlier run in it
    (out / "summary.json").write_text("{}")
    assert output_folder(str(out), overwrite=False) == f"{out}-2"
    (tmp_path / "demo-2").mkdir()
    (tmp_path / "demo-2" / "metrics.jsonl").write_text("")
    assert output_folder(str(out), overwrite=False) == f"{out}-3"
    assert output_folder(str(out), overwrite=True) == str(out)


def test_the_demo_ends_with_its_verdict_and_exits_by_it(tmp_path) -> None:
    """A real tiny run (two RL steps: its checks may go either way), then the same command."""
    out = tmp_path / "demo"

    def demo(*extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "entropyrl", "demo", *TINY, "--out", str(out), *extra]
        return subprocess.run(command, capture_output=True, text=True, timeout=600)

    first = demo()
    assert first.stdout.splitlines()[0] == (
        f"outputs go to {out}/ (metrics.jsonl, curves.png, summary.md, summary.json)"
    )
    verdict = first.stdout.splitlines()[-1]
    passed = json.loads((out / "summary.json").read_text())["passed"]
    assert verdict.startswith("PASS: " if passed else "FAIL: ") and verdict.endswith(str(out))
    assert first.returncode == (0 if passed else 1), first.stderr[-2000:]
    again = demo()
    assert again.stdout.splitlines()[0] == (
        f"{out} holds an earlier run (kept; --overwrite replaces it): this one goes to {out}-2"
    )
    assert json.loads((out / "summary.json").read_text())["passed"] == passed  # untouched
    second = json.loads((tmp_path / "demo-2" / "summary.json").read_text())["passed"]
    assert again.stdout.splitlines()[-1].endswith(f"; outputs in {out}-2")
    assert again.returncode == (0 if second else 1)


def test_the_summary_shows_settings_as_a_table_and_captions_marked(tmp_path) -> None:
    from entropyrl.rig.local.report import write_summary

    samples = {
        "warm-up": [{"image_id": 3, "caption": "a cat next to a dog.", "hallucinated": ["dog"]}],
        "egpo+clip": [{"image_id": 3, "caption": "a cat.", "hallucinated": []}],
    }
    settings = {"lr": 0.0002, "algorithm": {"clip_schedule": {"low": 0.3}}}
    write_summary(tmp_path, {"settings": settings, "samples": samples}, "TABLE")
    text = (tmp_path / "summary.md").read_text()
    assert "- image 3:\n  - warm-up: a cat next to a **~~dog.~~**\n  - egpo+clip: a cat.\n" in text
    assert "| lr | 0.0002 |\n| algorithm.clip_schedule.low | 0.3 |" in text
