"""End to end: `entropyrl demo` with a tiny budget, against a real CHAIR service over HTTP."""

from __future__ import annotations

import json
import math

import pytest

TINY = dict(
    num_train=40,
    num_test=8,
    image_size=56,
    max_objects=1,
    noise_rate=1.0,
    hidden_size=64,
    warmup_steps=60,
    warmup_batch=8,
    warmup_lr=2e-3,
    steps=16,
    prompts_per_step=4,
    samples_per_prompt=4,
    lr=2e-4,
    max_new_tokens=16,
    eval_max_new_tokens=16,
    threads=1,
    progress=False,
)


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} in JSON: jq and JavaScript reject it")


def _rl_rewards(path):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return records, [r["reward"] for r in records if r["phase"] == "rl"]


def _without_timings(records):
    drop = {"seconds", "train_seconds"}
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, entropyrl_cache):
    import os

    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.demo import run_caption_demo

    previous = os.environ.get("CHAIR_CACHE_DIR")
    os.environ["CHAIR_CACHE_DIR"] = str(tmp_path_factory.mktemp("chair-cache"))
    out = tmp_path_factory.mktemp("demo")
    try:
        summary = run_caption_demo(DemoConfig(out=str(out), adv="egpo", **TINY))
        yield out, summary
    finally:
        if previous is None:
            os.environ.pop("CHAIR_CACHE_DIR", None)
        else:
            os.environ["CHAIR_CACHE_DIR"] = previous


@pytest.mark.slow
def test_demo_calls_chair_over_http_and_writes_its_outputs(demo_run):
    out, summary = demo_run
    service = summary["chair_service"]
    assert service["url"].startswith("http://127.0.0.1:")
    # One request per RL step plus one per evaluation, every caption scored, none dropped.
    assert service["requests"] >= TINY["steps"] + 2
    rollouts = TINY["steps"] * TINY["prompts_per_step"] * TINY["samples_per_prompt"]
    assert service["scored_samples"] == rollouts + 2 * TINY["num_test"]
    assert service["fallback_samples"] == 0 and service["error_samples"] == 0
    for name in ("metrics.jsonl", "curves.png", "summary.md", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "summary.md").read_text()
    assert "CHAIR_i %" in text
    saved = json.loads((out / "summary.json").read_text(), parse_constant=_refuse)
    assert saved["rows"][0]["stage"] == "after warm-up"
    # the checks: PASS or FAIL each, the values in summary.json
    assert [c["metric"] for c in saved["checks"]] == ["chair_i_pct", "cider"]
    assert all(isinstance(c["passed"], bool) for c in saved["checks"])
    checks = text[text.index("## Did it work?") :]
    assert checks.count("| PASS |") + checks.count("| FAIL |") == 2
    assert "changed from the defaults" in checks  # the tiny settings: margins set for others
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=_refuse)


@pytest.mark.slow
def test_demo_metrics_are_finite_and_the_rl_reward_rises(demo_run):
    out, summary = demo_run
    records, rewards = _rl_rewards(out / "metrics.jsonl")
    assert len(rewards) == TINY["steps"]
    for record in records:
        for key, value in record.items():
            if isinstance(value, float):
                assert math.isfinite(value), (record["phase"], key)
    rl = [r for r in records if r["phase"] == "rl"]
    for r in rl:
        assert 0.3 - 1e-6 <= r["clip_high"] <= 0.5 + 1e-6  # per-sample bounds, step schedule
        assert 0.0 <= r["chair_i"] <= 1.0
    third = len(rewards) // 3
    assert sum(rewards[-third:]) / third > sum(rewards[:third]) / third
    for row in summary["rows"]:
        assert 0.0 <= row["chair_i_pct"] <= 100.0 and math.isfinite(row["cider"])


@pytest.mark.slow
def test_same_seed_same_metrics(demo_run, tmp_path):
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.demo import run_caption_demo

    first, _ = demo_run
    again = tmp_path / "again"
    run_caption_demo(DemoConfig(out=str(again), adv="egpo", **{**TINY, "steps": 4}))
    a, _ = _rl_rewards(first / "metrics.jsonl")
    b, _ = _rl_rewards(again / "metrics.jsonl")
    a = [r for r in a if r["phase"] == "warmup" or (r["phase"] == "rl" and r["step"] < 4)]
    b = [r for r in b if r["phase"] in ("warmup", "rl")]
    assert _without_timings(a) == _without_timings(b)
