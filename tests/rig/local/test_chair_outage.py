"""The CHAIR service dies mid-run: the demo says so, scores come back, nothing is faked.

A real `entropyrl demo` run (tiny budget) against the real supervised service over HTTP. The
service is killed with SIGKILL twice from inside the reward call of chosen RL steps. While it is
down its annotation files are moved away, so the launcher's restarts fail until the test puts
them back: the outage spans the step's reward call whatever the machine's speed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from pathlib import Path

import pytest

TINY = dict(
    num_train=40,
    num_test=8,
    image_size=56,
    max_objects=1,
    noise_rate=1.0,
    hidden_size=64,
    warmup_steps=20,
    warmup_batch=8,
    warmup_lr=2e-3,
    steps=10,
    prompts_per_step=2,
    samples_per_prompt=4,
    lr=2e-4,
    max_new_tokens=12,
    eval_max_new_tokens=12,
    threads=1,
    progress=False,
)
KILL = 3  # the first outage starts at this RL step; the second at the last step
COCO_FILES = ("instances_train2014.json", "instances_val2014.json")
COCO_FILES += ("captions_train2014.json", "captions_val2014.json")


def _wait(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


class Outages:
    """Wraps `CaptionTask.reward` (one call per RL step) to kill and revive the service."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.calls = 0
        self.server = None
        self.root: Path | None = None
        self.hidden: Path | None = None
        self.restarts_at_kill = 0

    def hide(self) -> None:
        self.hidden.mkdir(exist_ok=True)
        for name in COCO_FILES:
            if (self.root / name).exists():
                (self.root / name).rename(self.hidden / name)

    def restore(self) -> None:
        for name in COCO_FILES:
            if (self.hidden / name).exists():
                (self.hidden / name).rename(self.root / name)

    def kill(self) -> None:
        self.hide()
        pid = self.server.pid
        self.restarts_at_kill = self.server.restarts
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: _gone(pid), "the service to die")

    def before_reward(self, task) -> None:
        step, self.calls = self.calls, self.calls + 1
        if step == 0:
            client = task.reward_fn.chair_client
            client.backoff = 0.01  # failed calls cost little; the breaker is what is tested
            client.breaker_cooldown = 0.2
            self.root = task.world.root
            self.hidden = self.root.parent / "hidden-annotations"
        elif step in (KILL, self.steps - 1):
            self.kill()  # stays down through this step's reward call (restarts cannot load)
        elif step == KILL + 1:
            self.restore()  # the next restart succeeds; wait for it, not for the clock
            _wait(
                lambda: self.server.restarts > self.restarts_at_kill and self.server.alive(),
                "the restart",
            )


@pytest.fixture(scope="module")
def outage_run(tmp_path_factory, entropyrl_cache):
    from chair_server import launch
    from entropyrl.rig.local import captioning
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.demo import run_caption_demo

    out = tmp_path_factory.mktemp("outage")
    temp = tmp_path_factory.mktemp("tmp")
    outages = Outages(TINY["steps"])
    patch = pytest.MonkeyPatch()
    real_start, real_reward = launch.start_server, captioning.CaptionTask.reward

    def start_server(**kwargs):
        outages.server = real_start(**kwargs, restart_delay=0.05)
        return outages.server

    def reward(task, texts, items, responses=None):
        outages.before_reward(task)
        return real_reward(task, texts, items, responses=responses)

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    loggers = [
        logging.getLogger(n) for n in ("entropyrl.rewards.chair_client", "chair_server.launch")
    ]
    patch.setattr(launch, "start_server", start_server)
    patch.setattr(captioning.CaptionTask, "reward", reward)
    patch.setenv("CHAIR_CACHE_DIR", str(tmp_path_factory.mktemp("chair-cache")))
    patch.setenv("TMPDIR", str(temp))
    patch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    for logger in loggers:
        logger.addHandler(handler)
    try:
        summary = run_caption_demo(DemoConfig(out=str(out), adv="egpo", **TINY))
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        if outages.hidden is not None:
            outages.restore()
        patch.undo()
    yield out, summary, records, temp


def _unavailable(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["chair/unavailable_frac"] for r in rows if r["phase"] == "rl"]


@pytest.mark.slow
def test_outage_is_announced_and_scores_come_back(outage_run) -> None:
    out, summary, records, _ = outage_run
    unavailable = _unavailable(out)
    assert len(unavailable) == TINY["steps"]
    assert unavailable[:KILL] == [0.0] * KILL
    assert unavailable[KILL] == 1.0
    back = next(i for i in range(KILL + 1, len(unavailable)) if unavailable[i] == 0.0)
    assert back <= KILL + 3, unavailable  # within a few steps of the restart
    assert unavailable[-1] == 1.0
    client_lines = [r.getMessage() for r in records if r.name == "entropyrl.rewards.chair_client"]
    assert [line.split(" (")[0].split(" at http")[0] for line in client_lines] == [
        "CHAIR service"
    ] * 3
    assert ["stopped answering" in m for m in client_lines] == [True, False, True]
    assert "answers again" in client_lines[1]
    launcher = [r.getMessage() for r in records if r.name == "chair_server.launch"]
    assert sum("was killed by SIGKILL" in m for m in launcher) == 2
    assert any("restarted at" in m for m in launcher)
    service = summary["chair_service"]
    assert service["outages"] == 2 and service["restarts"] >= 1
    assert service["skipped_calls"] >= 1  # the open circuit answered without a request


@pytest.mark.slow
def test_unscored_evaluation_is_null_with_its_count(outage_run) -> None:
    out, summary, _, _ = outage_run
    before, after = summary["rows"]
    assert before["chair_unscored"] == 0 and math.isfinite(before["chair_s_pct"])
    assert after["chair_unscored"] == TINY["num_test"]
    written = json.loads((out / "summary.json").read_text(), parse_constant=_refuse)
    saved = written["rows"][1]
    assert saved["chair_i_pct"] is None and saved["chair_s_pct"] is None
    assert saved["recall_pct"] is None and saved["chair_unscored"] == TINY["num_test"]
    table = (out / "summary.md").read_text()
    assert "CHAIR unscored" in table
    assert "| n/a | n/a | n/a |" in table and f"| {TINY['num_test']} |" in table
    # CHAIR_i not measured after RL: its check cannot hold, so it fails (n/a, never a PASS)
    chair = next(c for c in written["checks"] if c["metric"] == "chair_i_pct")
    assert chair["after_rl"] is None and chair["change"] is None and chair["passed"] is False
    assert "held-out CHAIR_i falls by more than 1.0 point | " in table and "| n/a | FAIL |" in table
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=_refuse)  # the unscored evaluation: null, not NaN


@pytest.mark.slow
def test_no_temporary_files_of_the_service_are_left(outage_run) -> None:
    *_, temp = outage_run
    assert [p.name for p in temp.iterdir() if p.name.startswith("chair_server")] == []


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} in JSON: jq and JavaScript reject it")


def test_demo_summary_shows_na_and_the_unscored_count(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from entropyrl.rig.local.report import eval_columns, eval_row, markdown_table, write_summary

    nan = math.nan
    scored = {"chair_i": 0.1, "chair_s": 0.2, "recall": 0.9, "cider": 5.0, "length": 9.0}
    unscored = {**scored, "chair_i": nan, "chair_s": nan, "recall": nan, "chair_unscored": 8.0}
    rows = [eval_row("after warm-up", scored, 1.0), eval_row("after RL", unscored, 2.0)]
    table = markdown_table(rows, eval_columns(rows))
    assert table.splitlines()[0].endswith("| CHAIR unscored |")
    assert "| after RL | n/a | n/a | n/a | 5.00 | 9.00 | 2.00 | 8 |" in table
    json_path, md_path = write_summary(tmp_path, {"rows": rows}, table)
    summary = json.loads(json_path.read_text(), parse_constant=_refuse)  # strict JSON: no NaN
    assert summary["rows"][1]["chair_i_pct"] is None and summary["rows"][1]["chair_unscored"] == 8
    assert summary["rows"][0]["chair_i_pct"] == pytest.approx(10.0)
    assert "n/a" in md_path.read_text()
    # every caption scored: the table keeps its usual columns
    assert "unscored" not in markdown_table(rows[:1], eval_columns(rows[:1]))
