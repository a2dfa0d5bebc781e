"""The warm-up cache: a run that loads the checkpoint ends exactly where a run that trains it does.

Two demos with the same settings and an empty cache: the first trains the warm-up and stores it,
the second loads it; every held-out figure, every RL metric and every warm-up log line agree. A
changed warm-up setting, another thread count or changed code is another slot.
"""

from __future__ import annotations

import json
import os

import pytest

from entropyrl.rig.local import warmup_cache
from entropyrl.rig.local.config import DemoConfig

TINY = dict(
    num_train=24,
    num_test=6,
    image_size=56,
    max_objects=1,
    noise_rate=1.0,
    hidden_size=64,
    warmup_steps=30,
    warmup_batch=8,
    warmup_lr=2e-3,
    steps=3,
    prompts_per_step=2,
    samples_per_prompt=4,
    max_new_tokens=12,
    eval_max_new_tokens=12,
    threads=1,
    progress=False,
)


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "warmups"


def _records(out):
    drop = {"seconds"}
    lines = (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if k not in drop} for r in lines]


def test_a_cached_warm_up_gives_the_run_a_trained_one_gives(tmp_path, empty_cache, capsys):
    from entropyrl.rig.local.demo import run_caption_demo

    first = run_caption_demo(DemoConfig(out=str(tmp_path / "a"), **TINY))
    assert first["warmup"]["cached"] is False
    [slot] = list(empty_cache.iterdir())
    assert {p.name for p in slot.iterdir()} == {"model.pt", "warmup.json"}
    capsys.readouterr()

    second = run_caption_demo(DemoConfig(out=str(tmp_path / "b"), **TINY))
    assert second["warmup"]["cached"] is True
    assert (
        "warm-up: the checkpoint of an earlier run with these settings" in capsys.readouterr().out
    )
    assert _comparable(second["rows"]) == _comparable(first["rows"])
    assert _records(tmp_path / "a") == _records(tmp_path / "b")
    assert first["samples"] == second["samples"]


def test_no_warmup_cache_trains_it_again(tmp_path, empty_cache):
    from entropyrl.rig.local.runner import CaptionSession

    cfg = DemoConfig(out=str(tmp_path), **{**TINY, "warmup_steps": 4})
    with CaptionSession(cfg, tmp_path / "world") as session:
        assert session.warm_up(None)["cached"] is False
        stored = session.state()
        assert session.warm_up(None)["cached"] is True
    off = DemoConfig(out=str(tmp_path), warmup_cache=False, **{**TINY, "warmup_steps": 4})
    with CaptionSession(off, tmp_path / "world") as session:
        assert session.warm_up(None)["cached"] is False
        assert all((stored[name] == value).all() for name, value in session.state().items()), (
            "the same settings train to the same weights"
        )


def _comparable(rows):
    """Rows without their timings, NaN as None (NaN never equals itself)."""
    return [
        {k: (None if v != v else v) for k, v in row.items() if k != "train_seconds"} for row in rows
    ]


def _key(cfg, seed=0, device="cpu"):
    return warmup_cache.warmup_entry(cfg, seed, device).folder.name


@pytest.mark.parametrize(
    "change",
    [
        {"warmup_steps": 25},
        {"warmup_lr": 1e-3},
        {"warmup_batch": 16},
        {"hidden_size": 32},
        {"tokenizer_ranks": 2048},
        {"image_size": 84},
        {"noise_rate": 0.5},
        {"num_train": 30},
        {"threads": 2},
        {"seed": 1},
    ],
)
def test_what_shapes_the_warm_up_keys_its_slot(change):
    base = DemoConfig(**TINY)
    changed = DemoConfig(**{**TINY, **change})
    assert _key(base, seed=base.seed) != _key(changed, seed=changed.seed)


def test_what_only_rl_uses_shares_the_slot():
    base = DemoConfig(**TINY)
    for change in ({"steps": 9}, {"lr": 1e-3}, {"adv": "grpo"}, {"out": "elsewhere"}):
        assert _key(base) == _key(DemoConfig(**{**TINY, **change})), change
    assert _key(base, device="cpu") != _key(base, device="cuda")


def test_changed_code_or_versions_is_another_slot(monkeypatch):
    base = DemoConfig(**TINY)
    before = _key(base)
    monkeypatch.setattr(warmup_cache, "_source_digest", lambda: "edited")
    assert _key(base) != before
    monkeypatch.undo()
    monkeypatch.setattr(warmup_cache, "_version", lambda name: "0.0")
    assert _key(base) != before


def test_a_half_written_slot_is_not_used(empty_cache):
    entry = warmup_cache.warmup_entry(DemoConfig(**TINY), 0, "cpu")
    entry.folder.mkdir(parents=True)
    (entry.folder / "warmup.json").write_text("{}")
    assert not entry.filled
    assert warmup_cache.cache_root() == empty_cache
    assert str(empty_cache).startswith(os.environ["ENTROPYRL_CACHE"])


def test_the_start_line_scales_the_measured_phases_by_the_work():
    from entropyrl.rig.local.demo import PHASE_SECONDS, expected_seconds

    defaults = DemoConfig()
    cached = expected_seconds(defaults, warmup=False)
    assert cached == pytest.approx(
        PHASE_SECONDS["start"] + PHASE_SECONDS["RL"] + 2 * PHASE_SECONDS["evaluation"]
    )
    assert expected_seconds(defaults) == pytest.approx(cached + PHASE_SECONDS["warm-up"])
    twice = DemoConfig(steps=2 * defaults.steps, warmup_steps=2 * defaults.warmup_steps)
    assert expected_seconds(twice) == pytest.approx(
        expected_seconds(defaults) + PHASE_SECONDS["warm-up"] + PHASE_SECONDS["RL"]
    )
    three = DemoConfig(compare="grpo,egpo,egpo+clip")
    assert expected_seconds(three, warmup=False) == pytest.approx(
        cached + 2 * (PHASE_SECONDS["RL"] + PHASE_SECONDS["evaluation"])
    )


def test_warmup_only_fills_the_slot_once(tmp_path, empty_cache, capsys):
    """What `bash tools/setup.sh` runs: the first call trains and stores, the next finds it."""
    from entropyrl.rig.local.demo import main

    cfg = DemoConfig(out=str(tmp_path / "unused"), warmup_only=True, **{**TINY, "warmup_steps": 4})
    assert main(cfg) == 0
    first = capsys.readouterr().out
    assert "training it for these settings, once" in first and "stored (4 steps" in first
    assert main(cfg) == 0
    assert capsys.readouterr().out.strip() == "warm-up checkpoint: in the cache"
    assert not (tmp_path / "unused").exists(), "--warmup-only writes no run folder"
    refused = DemoConfig(warmup_only=True, warmup_cache=False, **TINY)
    assert main(refused) == 2
