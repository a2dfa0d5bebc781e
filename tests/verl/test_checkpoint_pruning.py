"""`remove_older` keeps the newest `keep` global_step_N folders and removes only the rest."""

from __future__ import annotations

from entropyrl.verl.checks.checkpoints import remove_older


def test_fewer_folders_than_kept_are_all_kept(tmp_path):
    for step in (5, 10):
        (tmp_path / f"global_step_{step}").mkdir()
    assert remove_older(tmp_path, keep=2) == []
    assert remove_older(tmp_path, keep=3) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_10", "global_step_5"]


def test_the_oldest_go_by_step_number_not_by_name(tmp_path):
    for step in (2, 10, 9, 100):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / "global_step_latest").mkdir()  # not a step: never removed
    (tmp_path / "global_step_1").write_text("a file, not a checkpoint")
    removed = remove_older(tmp_path, keep=2)
    assert [p.name for p in removed] == ["global_step_2", "global_step_9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_1",
        "global_step_10",
        "global_step_100",
        "global_step_latest",
    ]
