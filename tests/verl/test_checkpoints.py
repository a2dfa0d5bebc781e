"""Checkpoints continue only the run that wrote them; validation means survive unscored captions.

The decisions of `entropyrl.verl.checks.checkpoints` on folders laid out as verl 0.9.1 writes them
(`global_step_N/`, `latest_checkpointed_iteration.txt`), the metrics a resumed run keeps
(`entropyrl.verl.run_log`, through verl's own `Tracking` and `FileLogger`), and the trainer's validation metrics through
verl's own `process_validation_metrics`. The whole path (a killed smoke resumed, another
estimator refused, a finished run) runs in tests/rig/smoke/test_smoke.py.
"""

from __future__ import annotations

import json
import math

import pytest

from entropyrl.verl.checks import checkpoints


@pytest.fixture
def config(compose, tmp_path):
    return compose(
        "chair_mscoco",
        [f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.total_training_steps=10"],
    )


def save(config, step: int) -> None:
    """What verl's `_save_checkpoint` and the trainer write for `step`."""
    folder = checkpoints.checkpoint_folder(config)
    (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
    (folder / checkpoints.LATEST_FILE).write_text(str(step))
    checkpoints.write_settings(folder, config, step)


def test_raising_a_limit_resumes_and_changing_the_algorithm_does_not(config, compose, tmp_path):
    """The stop line of a lost-samples stop says to raise the limit: doing so continues the run
    (the limits of LIMIT_KEYS are left out of the comparison); the clip schedule is the run."""
    save(config, 4)
    folder = f"trainer.default_local_dir={tmp_path / 'ckpt'}"
    raised = compose(
        "chair_mscoco",
        [
            folder,
            "trainer.total_training_steps=10",
            "algorithm.lost_samples.max_fraction=0.2",
            "algorithm.chair_fallback.max_fraction=0.5",
        ],
    )
    decision = checkpoints.resume_decision(raised)
    assert (decision.kind, decision.step) == ("resume", 4), decision.line
    changed = compose(
        "chair_mscoco",
        [folder, "trainer.total_training_steps=10", "algorithm.clip_schedule.high=0.6"],
    )
    decision = checkpoints.resume_decision(changed)
    assert decision.kind == "other_run"
    assert "algorithm.clip_schedule.high: 0.5 -> 0.6" in decision.line
    assert "max_fraction" not in decision.line


def test_no_checkpoint_starts_fresh(config):
    assert checkpoints.resume_decision(config).kind == "fresh"


def test_the_same_settings_resume(config):
    save(config, 4)
    decision = checkpoints.resume_decision(config)
    assert (decision.kind, decision.step) == ("resume", 4)
    assert decision.line.endswith("after step 4")


def test_other_settings_are_refused_naming_what_differs(config, compose, tmp_path):
    save(config, 4)
    other = compose(
        "chair_mscoco",
        [
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "algorithm.adv_estimator=egpo",
            "algorithm.clip_schedule.high=0.6",
        ],
    )
    decision = checkpoints.resume_decision(other)
    assert decision.kind == "other_run"
    assert "algorithm.adv_estimator: 'grpo' -> 'egpo'" in decision.line
    assert "algorithm.clip_schedule.high: 0.5 -> 0.6" in decision.line
    # what may change between a run and its resumption does not count
    longer = compose(
        "chair_mscoco",
        [
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.total_training_steps=20",
            "data.train_batch_size=256",
            "trainer.n_gpus_per_node=4",
        ],
    )
    assert checkpoints.resume_decision(longer).kind == "resume"


def test_a_finished_run_has_nothing_left_to_do(config):
    save(config, 10)
    decision = checkpoints.resume_decision(config)
    assert decision.kind == "finished"
    assert decision.line.startswith("nothing left to do:")


def test_a_checkpoint_without_settings_is_resumed_as_verl_would(config):
    save(config, 3)
    (checkpoints.checkpoint_folder(config) / checkpoints.SETTINGS_FILE).unlink()
    assert checkpoints.resume_decision(config).kind == "unknown"


def test_resume_disabled_never_looks(compose, tmp_path, config):
    save(config, 3)
    off = compose(
        "chair_mscoco",
        [f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.resume_mode=disable"],
    )
    assert checkpoints.resume_decision(off).kind == "fresh"


def test_older_checkpoints_are_removed_beyond_the_kept_number(tmp_path):
    for step in (1, 2, 10, 3):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / "global_step_x").mkdir()  # not a step folder: left alone
    removed = checkpoints.remove_older(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["global_step_1", "global_step_2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_10",
        "global_step_3",
        "global_step_x",
    ]


def test_a_resumed_runs_metrics_keep_the_steps_before_its_checkpoint(tmp_path, monkeypatch):
    """verl's own `Tracking` (file backend) built as `fit` builds it and handed to the trainer's
    `logger`: the rows up to the checkpoint come back, later ones are logged again."""
    from verl.utils import tracking
    from verl.utils.tracking import FileLogger, Tracking

    from entropyrl.verl.run_log import ResumedLog, metrics_file_path
    from entropyrl.verl.trainer import EntropyPPOTrainer

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    assert metrics_file_path("project", "experiment", {"VERL_FILE_LOGGER_PATH": str(path)}) == (
        str(path)
    )
    path.write_text("".join(json.dumps({"step": s, "data": {"x": s}}) + "\n" for s in (1, 2, 3)))
    trainer = EntropyPPOTrainer.__new__(EntropyPPOTrainer)
    trainer._resumed_log = ResumedLog(str(path), resumed_step=2)  # what fit reads first
    trainer.logger = Tracking("project", "experiment", default_backend=["file"])
    trainer.logger.log({"x": 30}, step=3)
    trainer.logger.logger["file"].finish()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["data"]["x"]) for r in rows] == [(1, 1), (2, 2), (3, 30)]
    assert tracking.FileLogger is FileLogger  # verl's module is as verl wrote it
    fresh = FileLogger("project", "experiment")  # verl's own: a fresh run starts the file over
    fresh.finish()
    assert path.read_text() == ""


def test_validation_chair_means_are_over_the_scored_captions():
    """Through verl's own reduction: one unscored caption (NaN) no longer makes a mean NaN."""
    from entropyrl.verl.trainer import EntropyPPOTrainer

    trainer = EntropyPPOTrainer.__new__(EntropyPPOTrainer)  # the method reads no state
    nan = float("nan")
    metrics = trainer._val_metrics_update(
        ["coco", "coco", "coco", "other"],
        ["a", "b", "c", "d"],
        {
            "reward": [1.0, 2.0, 3.0, 4.0],
            "chair_i": [0.5, nan, 0.25, nan],
            "chair_s": [1.0, nan, 1.0, nan],
            "recall": [0.5, nan, 1.0, nan],
        },
        [],
    )
    assert metrics["val-aux/coco/chair_i/mean@1"] == pytest.approx(0.375)
    assert metrics["val-aux/coco/recall/mean@1"] == pytest.approx(0.75)
    assert metrics["val-aux/coco/chair_unscored/count"] == 1.0
    assert metrics["val-aux/other/chair_unscored/count"] == 1.0
    assert "val-aux/other/chair_i/mean@1" not in metrics  # nothing scored there: no number
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in metrics.values())
