"""The warm-up checkpoints shipped with the package are what the code trains for the quick starts.

A new user's first quick start loads them instead of training (entropyrl.rig.local.warmup_cache),
so they must be the warm-up of the settings the quick start runs with, trained by this code: the
example scripts' arguments map to the shipped slots, and a fresh training on this machine gives
the same log lines and weights. A change to the warm-up's code or defaults that moves the result
fails here until `python tools/ship_warmups.py` ships them again.

Tolerances: the shipped checkpoints were trained with one CPU thread; another processor's kernels
round differently (README), so the weights are compared to 1e-3 of their scale and the warm-up's
loss curve to 1e-3. Measured on the function-calling warm-up: two threads give the same weights
bit for bit; a learning rate 1 % higher moves them by 0.24 of their scale and the loss by 0.028.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from entropyrl.rig.local.warmup_cache import SHIPPED, shipped_entry
from entropyrl.rig.local.warmup_shipping import QUICKSTARTS, quickstart_config, train_warmup

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = {
    "captioning": "examples/quickstart.sh",
    "function-calling": "examples/function_calling_quickstart.sh",
}
WEIGHT_TOLERANCE = 1e-3
LOSS_TOLERANCE = 1e-3


def _script_config(name: str):
    """The `DemoConfig` the quick start script `name` runs with (its `demo` arguments)."""
    from chair_server.options import from_args
    from entropyrl.cli import build_parser
    from entropyrl.rig.local.config import DemoConfig

    text = (ROOT / SCRIPTS[name]).read_text().replace("\\\n", " ")
    [line] = [
        line for line in text.splitlines() if line.startswith('exec "$python" -m entropyrl demo')
    ]
    args = shlex.split(line.split("-m entropyrl demo", 1)[1].replace('"$@"', ""))
    return from_args(build_parser().parse_args(["demo", *args]), DemoConfig)


def _differences(shipped, fresh):
    """(largest weight difference relative to the tensor's scale, largest loss difference)."""
    state, _, records = shipped
    fresh_state, _, fresh_records = fresh
    assert state.keys() == fresh_state.keys()
    weights = max(
        float((state[k] - fresh_state[k]).abs().max() / state[k].abs().max().clamp_min(1e-12))
        for k in state
    )
    assert [r["step"] for r in records] == [r["step"] for r in fresh_records]
    losses = max(abs(a["loss"] - b["loss"]) for a, b in zip(records, fresh_records, strict=True))
    return weights, losses


def test_every_quick_start_ships_its_warm_up_and_nothing_else():
    slots = [shipped_entry(quickstart_config(n), 0, quickstart_config(n).task) for n in QUICKSTARTS]
    assert all(slot.filled for slot in slots), "run python tools/ship_warmups.py"
    assert {p.name for p in SHIPPED.iterdir()} == {slot.folder.name for slot in slots}


@pytest.mark.parametrize("name", sorted(QUICKSTARTS))
def test_the_quick_start_scripts_run_with_the_shipped_settings(name):
    cfg = quickstart_config(name)
    assert shipped_entry(_script_config(name), 0, cfg.task) == shipped_entry(cfg, 0, cfg.task)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICKSTARTS))
def test_a_fresh_training_gives_the_shipped_checkpoint(name):
    cfg = quickstart_config(name)
    shipped = shipped_entry(cfg, cfg.seed, cfg.task).load()
    weights, losses = _differences(shipped, train_warmup(cfg))
    assert weights <= WEIGHT_TOLERANCE and losses <= LOSS_TOLERANCE, (
        f"{name}: the shipped warm-up differs from a fresh training (weights by {weights:.2e} "
        f"of their scale, the loss by {losses:.2e}): run python tools/ship_warmups.py"
    )
