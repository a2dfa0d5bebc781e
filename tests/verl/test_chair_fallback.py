"""CHAIR fallbacks bounded like lost samples (entropyrl.verl.failures.chair_fallback), on hand-made
batches through the trainer's advantage step (the caption recipe: clip schedule on, and an
EXPERIMENT=penalty run: the caption reward's penalty, schedule off)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensordict import NonTensorData

from entropyrl.verl.failures.chair_fallback import ChairFallbackError, judge
from entropyrl.verl.hooks import chair_fallback_rows, chair_reporting_rows


def _trainer_hook_module():
    """The trainer hook's test module, loaded by path: verl's wheel installs a top-level
    `tests` package, so `import tests...` could find verl's instead of ours."""
    import importlib.util

    path = Path(__file__).with_name("test_trainer_hook.py")
    spec = importlib.util.spec_from_file_location("_trainer_hook_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_hook = _trainer_hook_module()
FakeTransferQueue = _hook.FakeTransferQueue
fill_store = _hook.fill_store
make_trainer = _hook.make_trainer
tokenizer = _hook.tokenizer  # the fixture

URL = "http://127.0.0.1:8000"


def rows(scored: int, fallback: int, padding_fallback: int = 0):
    infos = [{"chair_i": 0.1, "chair_fallback": False}] * scored
    infos += [{"chair_i": math.nan, "chair_fallback": True}] * (fallback + padding_fallback)
    extra = [{"reward_extra_info": NonTensorData(dict(info))} for info in infos]
    valid = torch.tensor([True] * (scored + fallback) + [False] * padding_fallback)
    return extra, valid


def verdict(scored, fallback, environ=None, padding_fallback=0, max_fraction=0.05):
    extra, valid = rows(scored, fallback, padding_fallback)
    return judge(
        where="step 4",
        fallback_rows=chair_fallback_rows(extra, valid),
        samples=chair_reporting_rows(extra, valid),
        max_fraction=max_fraction,
        url=URL,
        environ=environ or {},
        driver="driver-host",
    )


def test_past_the_limit_the_run_stops_naming_the_service_and_the_node():
    v = verdict(scored=90, fallback=6, padding_fallback=3)  # padding rows do not count
    assert v.stop == (
        "step 4: 6 of 96 samples got no CHAIR score, more than "
        "algorithm.chair_fallback.max_fraction=0.05 allows (4): the CHAIR service at "
        f"{URL} did not answer the reward on node driver-host (the driver's; the reward did not "
        "report its worker's); start it or make it reachable from there, raise the limit, or set "
        "CHAIR_OPTIONAL=1 to train on without CHAIR"
    )
    with pytest.raises(ChairFallbackError):
        v.apply()


def test_a_reported_worker_node_is_named():
    extra, valid = rows(0, 2)
    for fields in extra:
        fields["reward_extra_info"].data["node"] = "gpu-node-7"
    v = judge(where="step 1", fallback_rows=chair_fallback_rows(extra, valid), samples=2,
              max_fraction=0.05, url=URL, environ={}, driver="driver-host")  # fmt: skip
    assert "on node gpu-node-7;" in v.stop


def test_at_or_below_the_limit_one_warning_line(capsys):
    v = verdict(scored=92, fallback=4)
    assert v.stop is None and v.warning.startswith("step 4: 4 of 96 samples got no CHAIR score")
    v.apply()
    assert capsys.readouterr().err.count("\n") == 1
    assert verdict(scored=96, fallback=0) == verdict(scored=96, fallback=0)
    assert (verdict(96, 0).warning, verdict(96, 0).stop, verdict(96, 0).notice) == (None,) * 3


def test_chair_optional_lifts_the_limit_and_says_so_every_step(capsys):
    for fallback in (96, 0):
        v = verdict(scored=96 - fallback, fallback=fallback, environ={"CHAIR_OPTIONAL": "1"})
        assert v.stop is None and v.notice.startswith("step 4: training on without CHAIR")
        v.apply()
    assert capsys.readouterr().err.count("training on without CHAIR (CHAIR_OPTIONAL=1") == 2


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the recipe: the clip schedule
        [  # EXPERIMENT=penalty: the caption reward's chair_penalty, schedule off
            "algorithm.clip_schedule.enable=false",
            "reward.custom_reward_function.reward_kwargs.chair_weight=1.0",
        ],
    ],
)
def test_the_trainers_step_stops_past_the_limit(monkeypatch, compose, tokenizer, overrides):
    """The hook's fixture: one caption the service did not answer of five reporting CHAIR."""
    monkeypatch.delenv("CHAIR_OPTIONAL", raising=False)
    store = FakeTransferQueue()
    meta = fill_store(store, tokenizer, entropy=True, chair=True)
    limit = ["algorithm.chair_fallback.max_fraction=0.05"]
    trainer = make_trainer(monkeypatch, compose, tokenizer, store, [*overrides, *limit])
    with pytest.raises(ChairFallbackError, match="1 of 5 samples got no CHAIR score"):
        trainer._compute_advantage(meta, {})
    monkeypatch.setenv("CHAIR_OPTIONAL", "1")
    trainer._compute_advantage(meta, {})  # trains on, and says so
