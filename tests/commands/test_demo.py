"""`entropyrl demo`: its options are the fields of `DemoConfig`, bad values refused."""

from __future__ import annotations

import argparse

import pytest


def test_demo_options_mirror_the_config_and_reject_bad_values():
    from chair_server.options import from_args
    from entropyrl.commands.demo import register
    from entropyrl.rig.local.config import DemoConfig

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "demo",
            "--steps",
            "3",
            "--adv",
            "egpo_ratio",
            "--compare",
            "grpo,egpo+clip",
            "--no-progress",
        ]
    )
    cfg = from_args(args, DemoConfig)
    assert (cfg.steps, cfg.adv, cfg.progress) == (3, "egpo_ratio", False)
    assert cfg.variants() == ["grpo", "egpo+clip"]
    assert DemoConfig(clip_schedule={"enable": False}, adv="grpo").variants() == ["grpo"]
    args = parser.parse_args(
        ["demo", "--no-clip-schedule-enable", "--clip-schedule-rule", "linear",
         "--egpo-bonus-lam", "0.2", "--ppo-clip-high", "0.3"]
    )  # fmt: skip
    cfg = from_args(args, DemoConfig)
    assert not cfg.clip_schedule.enable and cfg.clip_schedule.rule == "linear"
    assert (cfg.egpo_bonus.lam, cfg.ppo.clip_high) == (0.2, 0.3)
    assert cfg.clip_schedule.low == 0.3  # untouched fields keep the spec's default
    with pytest.raises(ValueError, match="compare"):
        DemoConfig(compare="grpo,ppo")
    with pytest.raises(ValueError, match="noise_rate"):
        DemoConfig(noise_rate=2.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--adv", "nope"])
