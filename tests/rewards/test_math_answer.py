"""Math answers checked with math-verify: equivalent forms, wrong and missing answers, NaN."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("math_verify")

from entropyrl.rewards.math_answer import score_math, score_math_safely


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (r"so the answer is \boxed{0.5}", "1/2"),
        (r"\boxed{\frac12}", "1/2"),
        (r"\boxed{\dfrac{1}{2}}", "0.5"),
        (r"\boxed{50\%}", "1/2"),
        (r"The answer is $50\%$.", "50"),
        (r"\boxed{12.5\%}", "0.125"),
        (r"\boxed{1/2}", r"\frac{1}{2}"),
        (r"\boxed{x^2+2x+1}", "(x+1)^2"),
        (r"\boxed{3}", 3),
        (r"\boxed{3}", ["2", "3"]),
        (r"\boxed{A}", "A"),
        ("<think>maybe 7</think> Final: \\boxed{1/2}", "1/2"),
    ],
)
def test_equivalent_answers_score_one(response, truth):
    scored = score_math(response, truth)
    assert scored.score == 1.0, scored
    assert scored.reason == "correct"


@pytest.mark.parametrize(
    ("response", "truth", "reason"),
    [
        (r"\boxed{1/3}", "1/2", "wrong answer"),
        (r"\boxed{2}", "50", "wrong answer"),
        (r"\boxed{nan}", "1/2", "wrong answer"),
        ("I could not solve it.", "1/2", "no answer found"),
        ("", "1/2", "no answer found"),
        (r"<think>\boxed{1/2} ... still thinking", "1/2", "never closed"),
        (r"\boxed{1/2}", float("nan"), "NaN"),
        (r"\boxed{nan}", "NaN", "NaN"),
        (r"\boxed{1/2}", "", "empty"),
        (r"\boxed{1/2}", None, "empty"),
        (r"\boxed{1}", True, "boolean"),
        (r"\boxed{1}", '{"inputs": ["1"], "outputs": ["1"]}', "wrong route"),
    ],
)
def test_wrong_missing_and_unusable_score_zero_with_a_reason(response, truth, reason):
    scored = score_math(response, truth)
    assert scored.score == 0.0
    assert reason in scored.reason


def test_extracted_answer_is_reported():
    assert score_math(r"\boxed{1/3}", "1/2").extracted == r"\frac{1}{3}"
    assert score_math("nothing", "1/2").extracted == ""


def test_off_the_main_thread_the_check_runs_in_a_worker_process():
    """verl calls reward functions from a thread pool, where SIGALRM timeouts cannot work."""
    results = []

    def work() -> None:
        results.append(score_math_safely(r"\boxed{0.5}", "1/2"))
        results.append(score_math_safely(r"\boxed{0.4}", "1/2"))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert [r.score for r in results] == [1.0, 0.0]
    assert score_math_safely(r"\boxed{0.5}", "1/2").score == 1.0  # main thread: in process
