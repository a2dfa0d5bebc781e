"""The function-calling world of `entropyrl demo --task function-calling`, and a tiny run of it."""

from __future__ import annotations

import json
import random

import pytest

from entropyrl.rewards.function_calling import compute_score, score_details
from entropyrl.rig.local.function_calling import (
    FLAWS,
    FunctionCallingTask,
    make_queries,
    rl_summary,
    system_prompt,
)


def test_every_habit_scores_zero_and_the_reference_one():
    queries = make_queries(9, seed=3)
    assert set(FLAWS) == {q.name for q in queries}
    for query in queries:
        assert compute_score(query.answer(), query.ground_truth()) == 1.0
        flawed = query.answer(FLAWS[query.name])
        assert flawed != query.answer()
        details = score_details(flawed, query.ground_truth())
        assert details["score"] == 0.0
        # the inline block is a format error; the other habits are wrong values
        assert details["format_ok"] is (FLAWS[query.name] != "inline")
    with pytest.raises(ValueError, match="flaw"):
        queries[0].answer("typo")


def test_float_habit_writes_integers_as_floats():
    query = next(q for q in make_queries(6, seed=0) if q.name == "convert_currency")
    call = json.loads(query.answer("float").split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    amount = call["arguments"]["amount"]
    assert isinstance(amount, float) and amount == query.arguments["amount"]
    assert call["arguments"]["source"] == query.arguments["source"]


@pytest.mark.parametrize("noise_rate", [0.0, 0.3, 1.0])
def test_warmup_demonstrations_carry_habits_at_the_noise_rate(small_tokenizer, noise_rate):
    queries = make_queries(60, seed=1)
    task = FunctionCallingTask(small_tokenizer, queries, queries, noise_rate=noise_rate)
    rng = random.Random(5)
    answers = [task.warmup_answer(q, rng) for q in queries for _ in range(20)]
    flawed = sum(a not in {q.answer() for q in queries} for a in answers)
    # The same draws by hand: one uniform per demonstration, habit when below the rate.
    reference = random.Random(5)
    expected = sum(reference.random() < noise_rate for _ in range(len(answers)))
    assert flawed == expected
    with pytest.raises(ValueError, match="noise_rate"):
        FunctionCallingTask(small_tokenizer, queries, queries, noise_rate=1.5)


def test_prompt_names_every_tool_and_the_integer_types(small_tokenizer):
    text = system_prompt()
    assert text.startswith("Tools: get_weather(city, unit); convert_currency(amount: integer")
    queries = make_queries(3, seed=0)
    task = FunctionCallingTask(small_tokenizer, queries, queries)
    prompt = small_tokenizer.decode(task.prompts([0])["input_ids"][0])
    assert prompt.startswith("<|im_start|>system\n" + text + "<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith(queries[0].query + "<|im_end|>\n<|im_start|>assistant\n")


def test_reward_reports_accuracy_per_tool(small_tokenizer):
    queries = make_queries(3, seed=0)
    task = FunctionCallingTask(small_tokenizer, queries, queries)
    texts = [queries[0].answer(), queries[1].answer("float"), queries[2].answer()]
    out = task.reward(texts, [0, 1, 2])
    assert out.scores.tolist() == [1.0, 0.0, 1.0]
    assert out.metrics["accuracy"] == pytest.approx(2 / 3)
    assert out.metrics["accuracy/convert_currency"] == 0.0
    assert out.metrics["accuracy/get_weather"] == out.metrics["accuracy/set_timer"] == 1.0


def test_rl_summary_by_hand():
    history = [
        {
            "entropy": float(i),
            "reward": i / 20,
            "egpo/bonus/mean": 0.1 * i,
            "egpo/bonus/clip_frac": 0.5,
        }
        for i in range(20)
    ]
    stats = rl_summary(history)
    assert stats["entropy_first"] == pytest.approx(4.5)  # mean of 0..9
    assert stats["entropy_last"] == pytest.approx(14.5)  # mean of 10..19
    assert stats["reward_mean"] == pytest.approx(9.5 / 20)
    assert stats["bonus_mean"] == pytest.approx(0.95)
    assert stats["bonus_clip_frac"] == 0.5
    grpo = rl_summary([{"entropy": 1.0, "reward": 0.0}])
    assert grpo["bonus_mean"] != grpo["bonus_mean"]  # NaN: GRPO has no bonus


def test_tiny_demo_runs_and_repeats(tmp_path, small_tokenizer):
    """Two runs with one seed give the same numbers (the session's cached 8k tokenizer)."""
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.function_calling import run_function_calling_demo

    def run(out):
        cfg = DemoConfig(
            task="function-calling",
            out=str(out),
            tokenizer_ranks=8192,
            hidden_size=32,
            num_train=8,
            num_test=3,
            warmup_steps=2,
            warmup_batch=2,
            steps=1,
            prompts_per_step=1,
            samples_per_prompt=2,
            threads=1,
            progress=False,
        )
        return run_function_calling_demo(cfg)

    first = run(tmp_path / "a")
    assert [row["stage"] for row in first["rows"]] == [
        "after warm-up",
        "after RL: grpo",
        "after RL: egpo",
    ]
    egpo = first["variants"]["egpo"]["rl"]
    assert egpo["bonus_mean"] >= 0 and 0 <= egpo["bonus_clip_frac"] <= 1
    assert (
        first["variants"]["grpo"]["rl"]["bonus_mean"]
        != first["variants"]["grpo"]["rl"]["bonus_mean"]
    )
    for name in ("metrics.jsonl", "summary.md", "summary.json", "curves.png"):
        assert (tmp_path / "a" / name).is_file()
    second = run(tmp_path / "b")
    assert (first["warmup"]["cached"], second["warmup"]["cached"]) == (False, True), (
        "the second run loads the first one's warm-up from the cache"
    )
    for key in ("grpo", "egpo"):  # same seed, same numbers (NaN included, hence JSON)
        for part in ("eval", "rl"):
            assert json.dumps(second["variants"][key][part], sort_keys=True) == json.dumps(
                first["variants"][key][part], sort_keys=True
            )


def test_held_out_requests_never_appear_in_training():
    from entropyrl.rig.local.function_calling import is_held_out, split_queries

    train, test = split_queries(300, 24, seed=2)
    assert len(train) == 300 and len(test) == 24
    assert not {q.query for q in train} & {q.query for q in test}
    assert len({q.query for q in test}) == 24 and all(is_held_out(q) for q in test)
    assert {q.name for q in test} == set(FLAWS)
    assert split_queries(300, 24, seed=2) == (train, test)
