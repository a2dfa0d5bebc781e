"""The local runner's token sections: `DemoConfig` refuses what contradicts them, `rl_settings`
hands them to the RL step, and a tiny captioning run shows each one's metric in its rows."""

from __future__ import annotations

import dataclasses

import pytest

from entropyrl.rig.local.config import DemoConfig
from entropyrl.rig.local.runner import rl_settings

TINY = dict(
    num_train=8,
    num_test=2,
    image_size=56,
    hidden_size=64,
    warmup_steps=0,
    steps=2,
    prompts_per_step=2,
    samples_per_prompt=2,
    max_new_tokens=6,
    num_minibatches=2,
    threads=1,
    progress=False,
)


def test_rl_settings_carry_the_enabled_sections_and_leave_the_others_off():
    off = rl_settings(DemoConfig(), "grpo")
    assert (off.token_penalty_beta, off.token_clip, off.clip_low_schedule) == (None, None, None)
    cfg = DemoConfig(
        clip_schedule={"enable": False},
        token_penalty={"enable": True, "beta": 0.7},
        token_clip={"enable": True, "low": 0.1, "high": 0.6},
    )
    on = rl_settings(cfg, "grpo")
    assert on.token_penalty_beta == 0.7 and on.token_clip == (0.1, 0.6)
    assert on.specs.token_penalty == cfg.token_penalty and on.specs.token_clip == cfg.token_clip
    low = rl_settings(DemoConfig(clip_low_schedule={"enable": True, "high": 0.3}), "egpo+clip")
    assert low.clip_low_schedule.enable and low.clip_low_schedule.high == 0.3
    assert low.specs.clip_schedule.enable


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"token_clip": {"enable": True}},  # the default clip schedule is on
            "token_clip.enable: contradicts clip_schedule of variant egpo+clip (both set "
            "hallucinating samples' bounds): drop --token-clip-enable, or add "
            "--no-clip-schedule-enable",
        ),
        (
            {
                "token_clip": {"enable": True},
                "clip_schedule": {"enable": False},
                "compare": "grpo,grpo+clip",
            },
            "token_clip.enable: contradicts clip_schedule of variant grpo+clip (both set "
            "hallucinating samples' bounds): drop --token-clip-enable, or compare grpo without "
            "+clip",
        ),
        (
            {
                "token_clip": {"enable": True},
                "clip_schedule": {"enable": False},
                "clip_low_schedule": {"enable": True},
            },
            "token_clip.enable: contradicts clip_low_schedule of variant egpo (both set "
            "hallucinating samples' bounds): drop --token-clip-enable, or drop "
            "--clip-low-schedule-enable",
        ),
        (
            {"task": "function-calling", "clip_low_schedule": {"enable": True}},
            "clip_low_schedule.enable: reads CHAIR's hallucinated words, which --task "
            "function-calling does not score; drop --clip-low-schedule-enable",
        ),
        (
            {"task": "function-calling", "token_penalty": {"enable": True}},
            "token_penalty.enable: reads CHAIR's hallucinated words, which --task "
            "function-calling does not score; drop --token-penalty-enable",
        ),
    ],
)
def test_contradicting_settings_are_refused_in_one_line(settings, expected):
    with pytest.raises(ValueError) as refusal:
        DemoConfig(**settings)
    assert str(refusal.value) == expected


def test_the_token_sections_alone_or_together_are_accepted():
    DemoConfig(clip_schedule={"enable": False}, token_clip={"enable": True})
    DemoConfig(token_penalty={"enable": True}, clip_low_schedule={"enable": True})
    DemoConfig(
        compare="grpo,egpo",
        clip_schedule={"enable": False},
        token_penalty={"enable": True},
        token_clip={"enable": True},
    )


class _HandSpans:
    """The session's captioning task with the hallucinated token positions written by hand: the
    first response token of every even row (a response has at least one token)."""

    def __init__(self, task) -> None:
        self.task = task

    def __getattr__(self, name):
        return getattr(self.task, name)

    def reward(self, texts, items, responses=None):
        out = self.task.reward(texts, items)
        positions = [[0] if i % 2 == 0 else [] for i in range(len(texts))]
        return dataclasses.replace(out, hallucinated_positions=positions)


@pytest.fixture(scope="module")
def token_runs(tmp_path_factory, entropyrl_cache):
    """metrics.jsonl rows of a 2-step run per switch, each from the same initial weights."""
    from entropyrl.rig.local.runner import CaptionSession, MetricsLog, run_rl

    root = tmp_path_factory.mktemp("token-runs")
    base = DemoConfig(out=str(root / "out"), clip_schedule={"enable": False}, **TINY)
    runs = {
        "plain": base,
        "token_penalty": DemoConfig(**{**_fields(base), "token_penalty": {"enable": True}}),
        "token_clip": DemoConfig(
            **{**_fields(base), "token_clip": {"enable": True, "low": 0.1, "high": 0.6}}
        ),
        "clip_low": DemoConfig(**{**_fields(base), "clip_low_schedule": {"enable": True}}),
    }
    rows = {}
    with CaptionSession(base, root / "world") as session:
        start = session.state()
        task = _HandSpans(session.task)
        for name, cfg in runs.items():
            session.restore(start)
            log = MetricsLog(root / f"{name}.jsonl")
            run_rl(session.model, task, cfg, "grpo", seed=0, log=log, progress=False)
            rows[name] = log.records
    return rows


def _fields(cfg: DemoConfig) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def test_each_switch_shows_its_metric_in_the_rows(token_runs):
    plain = token_runs["plain"]
    assert len(plain) == 2
    for row in plain:  # nothing token-level without a switch
        assert "hallucinated_token_frac" not in row and "clip_low" not in row
        assert row["clip_high"] == pytest.approx(0.28)
    for name in ("token_penalty", "token_clip"):
        for row in token_runs[name]:
            # half the rows are marked on one token each
            assert 0 < row["hallucinated_token_frac"] <= 0.5
            assert row["token_unscored"] == 0
    for row in token_runs["token_clip"]:
        # a per-token mean: 0.6 / 0.1 on the marked tokens, the base 0.28 / 0.2 elsewhere
        assert 0.28 < row["clip_high"] <= 0.6
        assert 0.1 <= row["clip_low"] < 0.2
    for row in token_runs["clip_low"]:
        assert "hallucinated_token_frac" not in row
        # per-sample clip_low: 0.2 clean or unscored, 0.4 hallucinating
        assert 0.2 <= row["clip_low"] <= 0.4
        assert row["clip_high"] == pytest.approx(0.28)


def test_token_entropy_split_is_the_mean_over_each_side_by_hand():
    """Entropy of hallucinated mention tokens against the other tokens of scored rows; an
    unscored row counts on neither side, padding on none."""
    import torch

    from entropyrl.rig.local.rl import token_entropy_split

    entropy = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 6.0, 7.0], [8.0, 8.0, 8.0, 8.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    got = token_entropy_split([[1], [0, 3], None], entropy, mask)
    assert got == pytest.approx(
        {
            "entropy/hallucinated_tokens": (2.0 + 4.0 + 7.0) / 3,
            "entropy/clean_tokens": (1.0 + 3.0 + 5.0 + 6.0) / 4,
        }
    )
    # no hallucinated token: that side has no key; no CHAIR: no keys at all
    assert token_entropy_split([[], []], entropy[:2], mask[:2]) == pytest.approx(
        {"entropy/clean_tokens": (1 + 2 + 3 + 4 + 5 + 6 + 7) / 7}
    )
    assert token_entropy_split(None, entropy, mask) == {}
    assert token_entropy_split([None, None, None], entropy, mask) == {}
