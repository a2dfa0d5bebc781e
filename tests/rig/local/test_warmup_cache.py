"""The warm-up cache: a run that loads the checkpoint ends exactly where a run that trains it does.

Two demos with the same settings and an empty cache: the first trains the warm-up and stores it,
the second loads it; every held-out figure, every RL metric and every warm-up log line agree. A
changed warm-up setting, another thread count or changed code is another slot. The package's
slots (the shipped quick-start checkpoints) are keyed on the settings alone and come after the
cache; tests/rig/local/test_shipped_warmups.py checks the shipped ones against a fresh training.
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
    monkeypatch.setattr(warmup_cache, "_source_digest", lambda task: "edited")
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


@pytest.fixture
def package_slots(tmp_path, monkeypatch):
    """An empty stand-in for the package's folder of shipped checkpoints."""
    root = tmp_path / "shipped"
    root.mkdir()
    monkeypatch.setattr(warmup_cache, "SHIPPED", root)
    return root


def _ship_from_cache(cfg, empty_cache):
    """Move the cache's only slot to the package's slot for `cfg`: a shipped checkpoint."""
    [slot] = list(empty_cache.iterdir())
    shipped = warmup_cache.shipped_entry(cfg, cfg.seed)
    slot.rename(shipped.folder)
    assert shipped.filled and not any(empty_cache.iterdir())
    return shipped


def test_a_shipped_warm_up_gives_the_run_a_trained_one_gives(
    tmp_path, empty_cache, package_slots, capsys
):
    from entropyrl.rig.local.demo import run_caption_demo

    cfg = DemoConfig(**TINY)
    first = run_caption_demo(DemoConfig(out=str(tmp_path / "a"), **TINY))
    assert first["warmup"]["cached"] is False
    _ship_from_cache(cfg, empty_cache)
    capsys.readouterr()
    from entropyrl.rig.local.demo import main

    assert main(DemoConfig(warmup_only=True, **TINY)) == 0
    assert capsys.readouterr().out.strip() == "warm-up checkpoint: shipped with entropyrl"

    second = run_caption_demo(DemoConfig(out=str(tmp_path / "b"), **TINY))
    assert second["warmup"]["cached"] is True and second["warmup"]["shipped"] is True
    assert "warm-up: the checkpoint shipped with entropyrl" in capsys.readouterr().out
    assert _comparable(second["rows"]) == _comparable(first["rows"])
    assert _records(tmp_path / "a") == _records(tmp_path / "b")
    assert not any(empty_cache.iterdir()), "a shipped warm-up is not copied into the cache"


def test_the_cache_comes_before_the_package_and_no_warmup_cache_uses_neither(
    tmp_path, empty_cache, package_slots
):
    from entropyrl.rig.local.runner import CaptionSession

    cfg = DemoConfig(out=str(tmp_path), **{**TINY, "warmup_steps": 4})
    with CaptionSession(cfg, tmp_path / "world") as session:
        session.warm_up(None)
    shipped = _ship_from_cache(cfg, empty_cache)
    with CaptionSession(cfg, tmp_path / "world") as session:
        assert session.warm_up(None)["shipped"] is True
    longer = {**TINY, "warmup_steps": 5}  # the same slot's key with other weights in it
    with CaptionSession(DemoConfig(**longer), tmp_path / "world") as session:
        session.warm_up(None)
        trained_longer = session.state()
    [slot] = list(empty_cache.iterdir())
    slot.rename(empty_cache / warmup_cache.warmup_entry(cfg, cfg.seed, "cpu").folder.name)
    with CaptionSession(cfg, tmp_path / "world") as session:
        warm = session.warm_up(None)
        assert (warm["cached"], warm["shipped"]) == (True, False)
        assert all((trained_longer[k] == v).all() for k, v in session.state().items())
    off = DemoConfig(out=str(tmp_path), warmup_cache=False, **{**TINY, "warmup_steps": 4})
    assert warmup_cache.stored_warmup(off, off.seed, "cpu") is None
    assert shipped.filled


def _shipped_key(cfg, seed=0, task="captioning"):
    return warmup_cache.shipped_entry(cfg, seed, task).folder.name


@pytest.mark.parametrize(
    "change",
    [
        {"warmup_steps": 25},
        {"warmup_lr": 1e-3},
        {"warmup_batch": 16},
        {"max_grad_norm": 0.5},
        {"hidden_size": 32},
        {"num_layers": 3},
        {"vision_depth": 1},
        {"tokenizer_ranks": 2048},
        {"image_size": 84},
        {"max_objects": 2},
        {"noise_rate": 0.5},
        {"num_train": 30},
        {"num_test": 7},
        {"seed": 1},
    ],
)
def test_what_shapes_the_warm_up_keys_its_shipped_slot(change):
    base = DemoConfig(**TINY)
    changed = DemoConfig(**{**TINY, **change})
    assert _shipped_key(base, seed=base.seed) != _shipped_key(changed, seed=changed.seed)


def test_the_shipped_slot_is_the_settings_alone(monkeypatch):
    """Thread count, device, versions and code make a rerun equal bit for bit (the cache's
    key), not another model: the package's key leaves them out; the task is in it."""
    base = DemoConfig(**TINY)
    before = _shipped_key(base)
    assert _shipped_key(DemoConfig(**{**TINY, "threads": 2})) == before
    assert _shipped_key(DemoConfig(**{**TINY, "device": "cuda"})) == before
    monkeypatch.setattr(warmup_cache, "_source_digest", lambda task: "edited")
    monkeypatch.setattr(warmup_cache, "_version", lambda name: "0.0")
    assert _shipped_key(base) == before
    assert _shipped_key(base, task="function-calling") != before
    assert _key(base) != warmup_cache.warmup_entry(base, 0, "cpu", "function-calling").folder.name


def test_function_calling_keys_its_queries_not_the_images():
    base = DemoConfig(**TINY)
    for change, same in (({"image_size": 84}, True), ({"max_objects": 2}, True),
                         ({"vision_depth": 1}, True), ({"noise_rate": 0.5}, False),
                         ({"num_test": 7}, False), ({"tokenizer_ranks": 2048}, False)):  # fmt: skip
        changed = DemoConfig(**{**TINY, **change})
        assert (
            _shipped_key(base, task="function-calling")
            == _shipped_key(changed, task="function-calling")
        ) is same, change
    with pytest.raises(ValueError, match="task must be one of captioning, function-calling"):
        warmup_cache.warmup_entry(base, 0, "cpu", "captions")
