"""Command lines: evaluate, the service's start-up contract, and the no-torch guarantee."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chair_server import evaluate
from chair_server.launch import start_server


def test_chair_server_never_imports_torch() -> None:
    code = (
        "import sys, chair_server, chair_server.app, chair_server.launch, chair_server.evaluate, "
        "chair_server.__main__, chair_server.config; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'numpy' not in sys.modules, 'numpy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_evaluate_cli(tmp_path, coco_dir, gt_file, capsys) -> None:
    captions = tmp_path / "caps.jsonl"
    rows = [
        {"image_id": 1001, "caption": "A man with a cat."},  # person ok, cat hallucinated
        {"image_id": 1002, "caption": "A toilet."},
        {"image_id": 9, "caption": "A dog."},  # unknown image: left out
    ]
    captions.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out.json"
    assert (
        evaluate.main(
            ["--captions", str(captions), "--ground-truth", str(gt_file), "--json", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr()
    # CHAIR_s 1/2, CHAIR_i 1/3, recall (1 + 1) / (4 + 2), mean length (5 + 2) / 2 words
    assert "| caps.jsonl | 50.0 | 33.3 | 33.3 | 3.5 | 2 | 1 |" in printed.out
    assert "1 captions left out" in printed.err
    assert json.loads(out.read_text())["overall_metrics"]["captions"] == 2
    assert (
        evaluate.main(
            [
                "--captions",
                str(captions),
                "--coco",
                str(coco_dir),
                "--cache-dir",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )


def test_evaluate_cli_subprocess_and_bad_file(tmp_path, gt_file) -> None:
    captions = tmp_path / "caps.jsonl"
    captions.write_text('{"image_id": 1001, "caption": "A dog."}\n{"image_id": 1001}\n')
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "chair_server.evaluate",
            "--captions",
            str(captions),
            "--ground-truth",
            str(gt_file),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "caps.jsonl:2: caption is missing" in run.stderr


def test_server_startup_line_and_bad_source(tmp_path, gt_file, coco_dir) -> None:
    with start_server(coco=coco_dir, extra_args=["--cache-dir", str(tmp_path / "c")]) as server:
        assert server.pid > 0 and server.url.startswith("http://127.0.0.1:")
    assert server.stop() == 0  # SIGTERM is a clean shutdown
    log = server.log_text()
    assert f"CHAIR server listening on {server.url}" in log
    with pytest.raises(RuntimeError, match="cannot load ground truth"):
        start_server(ground_truth=tmp_path / "missing.json", timeout=30)
    run = subprocess.run([sys.executable, "-m", "chair_server"], capture_output=True, text=True)
    assert run.returncode == 2 and "--coco" in run.stderr
    with pytest.raises(ValueError, match="exactly one"):
        start_server()
