"""The benchmarks still run: each one end to end on tiny inputs, in its own process.

They print the tables of docs/results.md; numbers are not checked here (timings are never gated on),
only that every section is produced without an error.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_advantages_benchmark_prints_every_estimator():
    result = run_benchmark(
        "advantages.py", "--batch", "2048", "--tokens", "8", "--repeats", "2", "--slow-repeats", "1"
    )
    assert result.returncode == 0, result.stderr
    for row in (
        "grpo_advantage",
        "egpo_bonus_advantage",
        "egpo_ratio_advantage",
        "maxent_advantage",
        "entropy_shaped_token_advantage",
        "per-group Python loop",
    ):
        assert row in result.stdout, row


def test_entropy_memory_benchmark_runs_chunked_and_unchunked():
    result = run_benchmark(
        "entropy_memory.py",
        *("--batch", "1", "--seq", "64", "--vocab", "512", "--chunks", "16", "--repeats", "1"),
    )
    assert result.returncode == 0, result.stderr
    assert "| token_entropy | none |" in result.stdout
    assert "| token_entropy | 16 |" in result.stdout


def test_cuda_check_runs_small_on_cpu(tmp_path):
    """The GPU script at tiny sizes on the CPU: every part it runs ends without an error and the
    core agrees with float64 (docs/cuda.md holds its numbers from a GPU)."""
    result = run_benchmark(
        "cuda_check.py",
        *("--small", "--device", "cpu", "--parts", "environment,core,recipe"),
        *("--out", str(tmp_path)),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "cuda_check.json").read_text())
    for name, row in report["core"]["estimators"]["rows"].items():
        for entropy_dtype, cell in row.items():
            assert cell["finite"], (name, entropy_dtype)
            assert cell["max_abs_diff_vs_cpu_fp64"] < 1e-5, (name, entropy_dtype)
    assert report["core"]["token_entropy"]["max_abs_diff_vs_cpu_fp64"] < 1e-5
    assert report["core"]["ppo_clip_loss"]["grad_max_abs_diff"] < 1e-6
    assert report["recipe"]["tiny"]["loss_finite"] and report["recipe"]["tiny"]["no_grad_finite"]
    assert "error" not in report["recipe"]["tiny"]


def test_cider_benchmark_runs_quick():
    pytest.importorskip("pycocoevalcap")
    result = run_benchmark("cider.py", "--quick", "--images", "200")
    assert result.returncode == 0, result.stderr
    assert "pycocoevalcap" in result.stdout


def test_chair_benchmark_runs_on_parity_shaped_data(tmp_path):
    """Tiny files in the parity folder's layout; parity itself is judged on the real data."""
    ground_truth = {"1": ["dog", "person"], "2": ["cat"], "3": ["car", "truck"]}
    (tmp_path / "ground_truth_objects.json").write_text(json.dumps(ground_truth))
    captions = [
        {"image_id": 1, "caption": "A man walks his dog past a bench."},
        {"image_id": 2, "caption": "A cat sleeps next to a laptop and a cup."},
        {"image_id": 3, "caption": "Cars and a truck wait at a traffic light."},
    ]
    for name in ("ours", "beam5", "greedy"):
        with open(tmp_path / f"llava-1.5_{name}.jsonl", "w") as handle:
            handle.writelines(json.dumps(c) + "\n" for c in captions)
    result = run_benchmark(
        "chair.py", "--parity-dir", str(tmp_path), "--repeats", "1", "--clients", "2"
    )
    assert "Traceback" not in result.stderr, result.stderr
    for section in ("### CHAIR parity", "### Scoring time per caption", "### HTTP round trip"):
        assert section in result.stdout, section
    assert "captions/s" in result.stdout


def test_sandbox_benchmark_runs_every_variant():
    pytest.importorskip("math_verify")
    result = run_benchmark("sandbox.py", "--programs", "4", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    for row in ("plain `subprocess.run", "`Sandbox.run`, no namespaces", "`hybrid.compute_score`"):
        assert row in result.stdout, row
    assert "Math route" in result.stdout


def test_bfcl_agreement_benchmark_runs_on_a_few_entries():
    """Convert, render, judge both ways on 3 entries of 2 categories; never looser than BFCL."""
    # find_spec, not an import: BFCL's checker takes ~5 s to import, in the benchmark's process
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if not in_ci and importlib.util.find_spec("bfcl_eval") is None:
        pytest.skip("bfcl-eval is not installed (optional extra bfcl)")
    result = run_benchmark(
        "bfcl_agreement.py", "--categories", "simple_python", "parallel", "--max-entries", "3"
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "6 entries converted by `entropyrl prepare fc --format bfcl`" in result.stdout
    modes = ("the row (verl's path)", "BFCL's unmodified answer", "the row's ground truth")
    for mode in modes:
        row = next(line for line in result.stdout.splitlines() if line.startswith(f"| {mode}"))
        candidates, both_1, both_0, looser, stricter = map(int, row.strip("|").split("|")[1:])
        assert looser == 0 and both_1 > 0 and both_0 > 0
        assert candidates == both_1 + both_0 + looser + stricter
    assert "Correct answers not scored 1 by both: 0" in result.stdout


def test_plugin_overhead_benchmark_plans_runs_that_compose_and_summarizes_them():
    """Its real runs take minutes (docs/results.md); here: the commands it would run compose into
    configs that pass the checks, the variants are the two trainers, and the table is built
    from verl's timing metrics as read from a metrics file."""
    spec = importlib.util.spec_from_file_location(
        "plugin_overhead", ROOT / "benchmarks" / "plugin_overhead.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = run_benchmark(
        "plugin_overhead.py", "--dry-run", "--runs", "2", "--steps", "4", "--warmup", "1"
    )
    assert result.returncode == 0, result.stderr
    commands = [line.split() for line in result.stdout.splitlines()]
    assert [c[c.index("--out") + 1].rsplit("/", 1)[1] for c in commands] == [
        "on-0",
        "off-0",
        "off-1",
        "on-1",
    ]
    from entropyrl.commands import preflight

    for variant in ("on", "off"):
        config = preflight.compose_recipe("chair_mscoco", list(bench.VARIANTS[variant]))
        assert preflight.config_findings(config) == []
    rows = [
        {"step": step, "data": {f"timing_s/{phase}": float(step) for phase in bench.PHASES}}
        for step in (1, 2, 3, 4)
    ]
    kept = bench.phase_times(rows, warmup=1)
    assert kept["step"] == [2.0, 3.0, 4.0]
    table = bench.summarize({"on": kept, "off": {p: [v / 2 for v in vs] for p, vs in kept.items()}})
    assert table["step"] == {"on": 3.0, "off": 1.5, "ratio": 2.0, "steps": 3}
    assert "| step | 1.500 | 3.000 | 2.000 | 3 |" in bench.markdown(table)


def test_quickstart_benchmark_times_both_settings_in_both_conditions():
    tiny = (
        "--num-train 8 --num-test 4 --image-size 56 --max-objects 1 --hidden-size 32 "
        "--warmup-steps 2 --warmup-batch 2 --steps 1 --prompts-per-step 2 --samples-per-prompt 2 "
        "--max-new-tokens 4 --eval-max-new-tokens 4"
    )
    result = run_benchmark(
        "quickstart.py",
        *("--script", f"{sys.executable} -m entropyrl demo", "--repeats", "1"),
        *("--args", tiny, "--vs", f"{tiny} --threads 2 --no-warmup-cache"),
        timeout=400,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| quick start")]
    assert [row.split(" | ")[1] for row in rows] == ["idle", "neighbour"], result.stdout
    assert "| reference | neighbour | 1 |" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("| settings"))
    assert header.count("|") == rows[0].count("|"), "a column without its heading"
    assert "| idle | " in result.stdout and "| neighbour | " in result.stdout
    # each run's verdict is the demo's own last line (these settings are too small to pass)
    assert "stopped" not in result.stdout and "no output" not in result.stdout


def test_quickstart_benchmark_times_a_first_run_and_the_second_in_its_home():
    tiny = (
        "--num-train 8 --num-test 4 --image-size 56 --max-objects 1 --hidden-size 32 "
        "--warmup-steps 40 --warmup-batch 2 --steps 1 --prompts-per-step 2 --samples-per-prompt 2 "
        "--max-new-tokens 4 --eval-max-new-tokens 4"
    )
    result = run_benchmark(
        "quickstart.py",
        *("--script", f"{sys.executable} -m entropyrl demo", "--repeats", "1"),
        *("--args", tiny, "--first-run", "--conditions", "idle"),
        timeout=400,
    )
    assert result.returncode == 0, result.stderr
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")
        for line in result.stdout.splitlines()
        if line.startswith(("| first run", "| second run"))
    }
    assert set(rows) == {"first run", "second run"}, result.stdout
    warmup = {name: float(row[6].split()[0]) for name, row in rows.items()}
    assert warmup["first run"] > 0, "an empty HOME: the warm-up is trained"
    assert warmup["second run"] == 0, "the HOME the first run left: the warm-up from its cache"
    assert "| idle | " in result.stdout and "first run / second run" in result.stdout
