"""curves.png: axis labels with units, the smoothing said, held-out values, the clip fraction.

Checks the matplotlib objects `curves_figure` builds, not pixels.
"""

from __future__ import annotations

import pytest

from entropyrl.rig.local.report import SMOOTHING, curves_figure, plot_curves

VARIANTS = ("grpo", "egpo+clip")


def _records(steps: int = 12) -> list[dict]:
    records = [{"phase": "warmup", "step": 0, "loss": 3.0}]
    records.append({"phase": "eval", "step": 0, "variant": "warm-up", "chair_i": 0.3, "cider": 0.4})
    for i, variant in enumerate(VARIANTS):
        for step in range(steps):
            records.append(
                {
                    "phase": "rl",
                    "step": step,
                    "variant": variant,
                    "reward": 0.1 * step,
                    "cider": 0.4,
                    "chair_i": 0.25,
                    "entropy": 1.5,
                    "clip_frac_high": 0.02 + 0.01 * i,
                    "clip_frac_low": 0.005,
                    "clip_high": 0.4,
                    "response_length": 12.0,
                }
            )
        after = {"chair_i": 0.2 - 0.05 * i, "cider": 0.5 if i == 0 else float("nan")}
        records.append({"phase": "eval", "step": steps, "variant": variant, **after})
    return records


@pytest.fixture
def figure():
    import matplotlib.pyplot as plt

    fig = curves_figure(_records(), title="RL from the same warm-up (seed 0)")
    yield fig
    plt.close(fig)


def _axis(fig, ylabel: str):
    found = [ax for ax in fig.axes if ax.get_ylabel() == ylabel]
    assert len(found) == 1, [ax.get_ylabel() for ax in fig.axes]
    return found[0]


def test_every_panel_has_a_y_label_with_its_unit(figure):
    labels = {ax.get_ylabel() for ax in figure.axes if ax.get_visible() and ax.axison}
    assert {
        "reward",
        "CIDEr-D",
        "CHAIR_i (%)",
        "entropy (nats per token)",
        "clipped tokens (%)",
        "clip_high",
        "tokens",
    } <= labels
    assert all(ax.get_xlabel() == "RL step" for ax in figure.axes if ax.get_ylabel())


def test_the_smoothing_is_stated(figure):
    title = figure.get_suptitle()
    assert f"{SMOOTHING}-step moving average" in title
    assert title.startswith("RL from the same warm-up (seed 0)")


def test_chair_is_in_percent_with_held_out_markers(figure):
    ax = _axis(figure, "CHAIR_i (%)")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["grpo"].get_ydata()) == pytest.approx([25.0] * 12)
    warm = lines["held-out after warm-up"]
    assert (list(warm.get_xdata()), list(warm.get_ydata())) == ([0], [pytest.approx(30.0)])
    after = lines["held-out after RL: egpo+clip"]
    assert (list(after.get_xdata()), list(after.get_ydata())) == ([12], [pytest.approx(15.0)])


def test_held_out_table_in_the_figure(figure):
    texts = [t.get_text() for ax in figure.axes for t in ax.texts]
    assert len(texts) == 1
    table = texts[0].splitlines()
    assert table[0].split() == ["held-out", "(greedy)", "CHAIR_i", "CIDEr-D"]
    assert table[1].split() == ["after", "warm-up", "30.00", "%", "0.40"]
    assert table[2].split() == ["after", "RL:", "grpo", "20.00", "%", "0.50"]
    assert table[3].split() == ["after", "RL:", "egpo+clip", "15.00", "%", "n/a"]


def test_clip_panel_shows_the_fraction_of_tokens_clipped_high_and_low(figure):
    ax = _axis(figure, "clipped tokens (%)")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {
        "grpo",
        "grpo (clip_frac_low)",
        "egpo+clip",
        "egpo+clip (clip_frac_low)",
    }
    assert lines["egpo+clip"].get_ydata()[0] == pytest.approx(3.0)  # 0.03 of the tokens
    assert lines["grpo (clip_frac_low)"].get_linestyle() == "--"
    assert "high" in ax.get_title() and "low" in ax.get_title()
    # the bound keeps a panel of its own
    assert list(_axis(figure, "clip_high").get_lines()[0].get_ydata()) == pytest.approx([0.4] * 12)


def test_plot_curves_writes_a_png_and_takes_plain_key_label_pairs(tmp_path):
    path = plot_curves(_records(), tmp_path / "curves.png", curves=(("reward", "reward"),))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.pyplot as plt

    fig = curves_figure(_records(), curves=(("reward", "reward"),), held_out=())
    try:
        assert [ax.get_ylabel() for ax in fig.axes if ax.axison] == ["reward"]
        assert not [t for ax in fig.axes for t in ax.texts]  # no held-out box asked for
    finally:
        plt.close(fig)
