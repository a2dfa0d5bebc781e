"""The ablation study: a tiny grid end to end (real CHAIR service), and its statistics by hand;
the acceptance study, which runs each seed through the same loop, end to end."""

from __future__ import annotations

import json
import math
import os

import pytest

from entropyrl.rig.local.study import GRID, REFERENCE, aggregate, run_summary

TINY = dict(
    num_train=40,
    num_test=8,
    image_size=56,
    max_objects=1,
    noise_rate=1.0,
    hidden_size=64,
    warmup_steps=10,
    warmup_batch=8,
    warmup_lr=2e-3,
    steps=3,
    prompts_per_step=2,
    samples_per_prompt=4,
    lr=1e-3,
    num_minibatches=2,
    ppo_epochs=2,
    max_new_tokens=10,
    eval_max_new_tokens=10,
    threads=1,
    progress=False,
)
KEYS = ("grpo-low", "grpo-step", "egpo_ratio-step", "cider-grpo")


@pytest.fixture(scope="module")
def study_runs(tmp_path_factory, entropyrl_cache):
    """Seeds 0 and 1 run as two separate studies (as on two cores), then combined."""
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.study import combine, run_study

    previous = os.environ.get("CHAIR_CACHE_DIR")
    os.environ["CHAIR_CACHE_DIR"] = str(tmp_path_factory.mktemp("chair-cache"))
    root = tmp_path_factory.mktemp("study")
    variants = [v for v in GRID if v.key in KEYS]
    try:
        for seed in (0, 1):
            cfg = DemoConfig(out=str(root / f"s{seed}"), seeds=str(seed), **TINY)
            run_study(cfg, variants)
        summary = combine([root / "s0", root / "s1"], root / "all")
        yield root, summary
    finally:
        if previous is None:
            os.environ.pop("CHAIR_CACHE_DIR", None)
        else:
            os.environ["CHAIR_CACHE_DIR"] = previous


@pytest.mark.slow
def test_study_runs_every_variant_and_the_control_from_one_warm_up(study_runs):
    _root, summary = study_runs
    runs = summary["runs"]
    for seed in (0, 1):
        keys = [r["variant"] for r in runs if r["seed"] == seed]
        assert keys == ["warm-up", *KEYS, "control"]
        rl = [r for r in runs if r["seed"] == seed and r["variant"] in KEYS]
        control = next(r for r in runs if r["seed"] == seed and r["variant"] == "control")
        # The control ran at least the mean CPU time of the seed's RL runs.
        assert control["cpu_seconds"] >= sum(r["cpu_seconds"] for r in rl) / len(rl)
        for row in rl:
            assert row["steps"] == TINY["steps"]
            # CHAIR_i over captions that mention no object is n/a (NaN), not 0.
            assert math.isnan(row["eval/chair_i"]) or 0.0 <= row["eval/chair_i"] <= 1.0
            assert math.isfinite(row["eval/cider"])
            assert math.isfinite(row["train/entropy"]) and row["train/entropy"] > 0
            assert 0.0 <= row["train/clip_frac_high"] <= 1.0
    # Fixed bound: every sample got the schedule's low end; step rule: in [low, high].
    fixed = [r for r in runs if r["variant"] == "grpo-low"]
    assert all(r["train/clip_high"] == pytest.approx(0.3) for r in fixed)
    stepped = [r for r in runs if r["variant"] == "grpo-step"]
    assert all(0.3 - 1e-6 <= r["train/clip_high"] <= 0.5 + 1e-6 for r in stepped)
    # CIDEr-D alone: the reward is the CIDEr-D of each sample, though the session's reward has
    # the sequence penalty (which the reference, from the same warm-up, pays).
    for row in (r for r in runs if r["variant"] == "cider-grpo"):
        assert row["train/reward"] == pytest.approx(row["train/cider"])
        assert "reward CIDEr-D;" not in row["label"] and row["label"].endswith("reward CIDEr-D")
    penalised = [r for r in runs if r["variant"] == REFERENCE]
    assert any(r["train/reward"] < r["train/cider"] - 1e-6 for r in penalised)


@pytest.mark.slow
def test_study_outputs_combine_seeds_into_mean_and_spread(study_runs):
    root, summary = study_runs
    out = root / "all"
    for name in ("summary.md", "summary.json", "metrics.jsonl", "study.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "summary.md").read_text()
    assert "mean ± standard deviation over 2 seeds" in text and "±" in text
    assert "control: warm-up continued" in text
    stats = summary["aggregate"]["variants"]["grpo-step"]["eval/cider"]
    values = [r["eval/cider"] for r in summary["runs"] if r["variant"] == "grpo-step"]
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(sum(values) / 2)
    assert stats["sd"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in records if r["phase"] == "rl"]
    assert {r["seed"] for r in rl} == {0, 1} and {r["variant"] for r in rl} == set(KEYS)
    assert any("entropy/clean" in r or "entropy/hallucinated" in r for r in rl)


@pytest.mark.slow
def test_combine_refuses_a_seed_twice(study_runs, tmp_path):
    from entropyrl.rig.local.study import combine

    root, _ = study_runs
    with pytest.raises(ValueError, match="more than one folder"):
        combine([root / "s0", root / "s0"], tmp_path / "twice")


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} in JSON: jq and JavaScript reject it")


@pytest.mark.slow
def test_acceptance_runs_rl_and_the_control_from_one_warm_up(
    tmp_path, monkeypatch, entropyrl_cache
):
    """The acceptance study goes through the same per-seed loop (`runner.warm_start`): one
    warm-up, RL and the equal-CPU-time control from its checkpoint, strict JSON."""
    from entropyrl.rig.local.acceptance import run_acceptance
    from entropyrl.rig.local.config import DemoConfig

    monkeypatch.setenv("CHAIR_CACHE_DIR", str(tmp_path / "chair-cache"))
    out = tmp_path / "acceptance"
    summary = run_acceptance(DemoConfig(out=str(out), seeds="0", adv="egpo", **TINY))
    warm, rl, control = summary["rows"]
    assert [r["stage"] for r in (warm, rl, control)] == [
        "warm-up",
        "RL (egpo+clip)",
        "control (same time)",
    ]
    assert warm["train_steps"] == TINY["warmup_steps"] and rl["train_steps"] == TINY["steps"]
    # the control continued the warm-up for at least RL's CPU time (the default clock)
    assert control["train_cpu_seconds"] >= rl["train_cpu_seconds"] and control["train_steps"] > 0
    (verdict,) = summary["verdicts"]
    assert verdict["cider_rl_minus_control"] == pytest.approx(rl["cider"] - control["cider"])
    assert summary["wins"] == int(verdict["rl_beats_control"])
    saved = json.loads((out / "summary.json").read_text(), parse_constant=_refuse)
    assert [r["stage"] for r in saved["rows"]] == [r["stage"] for r in summary["rows"]]
    assert "RL beats the equal-time control" in (out / "summary.md").read_text()
    records = [
        json.loads(line, parse_constant=_refuse)
        for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    phases = [r["phase"] for r in records]
    assert phases.index("warmup") < phases.index("rl") < phases.index("control")
    assert [r["variant"] for r in records if r["phase"] == "eval"] == ["warmup", "rl", "control"]
    assert sum(r["phase"] == "rl" for r in records) == TINY["steps"]
    for row in summary["rows"]:
        assert math.isfinite(row["cider"])


def _row(seed, variant, chair_i, cider):
    return {
        "seed": seed,
        "variant": variant,
        "label": variant,
        "eval/chair_i": chair_i,
        "eval/cider": cider,
    }


def test_aggregate_means_spreads_and_paired_differences_by_hand():
    runs = [
        _row(0, REFERENCE, 0.20, 5.0),
        _row(1, REFERENCE, 0.30, 4.0),
        _row(2, REFERENCE, 0.10, 6.0),
        # 2 points lower CHAIR_i in every seed, up to 0.1 noise; CIDEr-D: mixed signs.
        _row(0, "grpo-step", 0.18, 5.5),
        _row(1, "grpo-step", 0.27, 3.5),
        _row(2, "grpo-step", 0.08, 6.2),
    ]
    got = aggregate(runs)
    ref = got["variants"][REFERENCE]["eval/chair_i"]
    assert ref["mean"] == pytest.approx(0.2) and ref["sd"] == pytest.approx(0.1)
    assert ref["n"] == 3
    chair = got["paired"]["grpo-step"]["eval/chair_i"]
    assert chair["per_seed"] == pytest.approx({0: -0.02, 1: -0.03, 2: -0.02})
    assert chair["mean"] == pytest.approx(-0.07 / 3)
    sd = math.sqrt(((0.01 / 3) ** 2 * 2 + (0.02 / 3) ** 2) / 2)
    assert chair["sd"] == pytest.approx(sd)
    # Same sign in 3 of 3 and |mean| = 0.0233 > 2 * sd / sqrt(3) = 0.0067: beyond noise.
    assert chair["same_sign"] and chair["beyond_noise"]
    cider = got["paired"]["grpo-step"]["eval/cider"]
    assert cider["per_seed"] == pytest.approx({0: 0.5, 1: -0.5, 2: 0.2})
    assert not cider["same_sign"] and not cider["beyond_noise"]
    assert REFERENCE not in got["paired"]


def test_the_paired_interval_is_the_t_interval_over_seeds():
    from scipy import stats

    from entropyrl.rig.local.study import paired_interval

    diffs = [-0.02, -0.03, -0.02, 0.01]
    n, mean, sd = len(diffs), sum(diffs) / len(diffs), statistics_sd(diffs)
    low, high = stats.t.interval(0.95, n - 1, loc=mean, scale=sd / math.sqrt(n))
    assert paired_interval({"n": n, "mean": mean, "sd": sd}) == pytest.approx([low, high])
    # one seed: no spread, no interval
    assert all(math.isnan(v) for v in paired_interval({"n": 1, "mean": 0.1, "sd": math.nan}))
    got = aggregate(
        [_row(s, REFERENCE, 0.2, 5.0) for s in range(4)]
        + [_row(s, "grpo-step", 0.2 + d, 5.0) for s, d in enumerate(diffs)]
    )
    assert got["paired"]["grpo-step"]["eval/chair_i"]["ci95"] == pytest.approx([low, high])


def statistics_sd(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_the_credit_variants_set_their_reward_and_sections():
    """Each credit variant names its reward, and turns on the section its key says and no
    other: a token mechanism on CIDEr-D alone or beside the sequence penalty."""
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.study import CREDIT, PRESETS

    assert PRESETS["credit"] == CREDIT and set(CREDIT) <= {v.key for v in GRID}
    assert REFERENCE in CREDIT and "grpo-step" in CREDIT  # the sequence penalty, the seed's rule
    cfg = DemoConfig(**TINY)
    sections = {"token-penalty": "token_penalty", "token-clip": "token_clip",
                "clip-low": "clip_low_schedule"}  # fmt: skip
    by_key = {v.key: v for v in GRID}
    for key in CREDIT:
        run, name = by_key[key].config(cfg)
        base = key.removesuffix("+seq")
        on = {s for s in ("token_penalty", "token_clip", "clip_low_schedule")
              if getattr(run, s).enable}  # fmt: skip
        assert on == ({sections[base]} if base in sections else set()), key
        alone = key in ("cider-grpo", "token-penalty", "token-clip", "clip-low")
        assert run.chair_weight == (0.0 if alone else cfg.chair_weight), key
        label = by_key[key].label(cfg)
        assert label.endswith("reward CIDEr-D" if alone else "reward CIDEr-D - CHAIR count"), key
        assert name == ("grpo+clip" if key == "grpo-step" else "grpo")


def test_run_summary_averages_present_keys_only():
    history = [
        {"reward": 1.0, "entropy": 2.0, "entropy/clean": 1.0},
        {"reward": 3.0, "entropy": 4.0, "entropy/hallucinated": 5.0, "entropy/clean": 3.0},
    ]
    row = run_summary(history, {"chair_i": 0.1, "chair_s": 0.2, "recall": 0.9, "cider": 5.0})
    assert row["train/entropy"] == 3.0 and row["train/entropy/clean"] == 2.0
    assert row["train/entropy/hallucinated"] == 5.0  # one step had hallucinated samples
    assert row["train/reward_last"] == 2.0 and row["eval/cider"] == 5.0
    assert math.isnan(row["train/clip_frac_high"])  # never measured: NaN, shown as n/a
