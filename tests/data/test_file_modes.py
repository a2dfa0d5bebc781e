"""Converter outputs get the mode every other tool's new files get: 0666 less the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask 022", "umask 027"])
def test_prepare_outputs_follow_the_umask(coco_dirs, xlam_file, tmp_path, umask) -> None:
    ann, img = coco_dirs
    out = tmp_path / "out"
    coco = ["coco", "--annotations", str(ann), "--images", str(img), "--out", str(out / "coco")]
    commands = [
        [*coco, "--val-size", "2", "--test-size", "2"],
        [*coco, "--val-size", "3", "--test-size", "2"],  # replaces the files: same mode
        ["fc", "--format", "xlam", "--input", str(xlam_file), "--out", str(out / "fc")],
    ]
    for command in commands:
        run = subprocess.run(
            [sys.executable, "-m", "entropyrl", "prepare", *command],
            capture_output=True,
            text=True,
            env={**os.environ, "CHAIR_CACHE_DIR": str(tmp_path / "cache")},
            preexec_fn=lambda: os.umask(umask),
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
    files = sorted(p for p in out.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert {"train.parquet", "cider_df.json.gz", "chair_ground_truth.json"} <= names
    modes = {str(p.relative_to(out)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask))
