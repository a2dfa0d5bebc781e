"""A small mixed math + code data set in verl's RLHF parquet layout, for dry runs.

Problems are generated from a seed (no download): fraction arithmetic and percentages for math,
stdin/stdout programs and function-call (LeetCode-style) programs for code, in the test formats
of verl's code rewards. Each row carries `ability` as a column and in `extra_info` (verl hands
the reward function only `extra_info`), and a reference answer in `extra_info["reference"]` that
scores 1 under `entropyrl.rewards.hybrid`, so a dry run can check its reward path end to end.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from entropyrl.core.files import write_parquet

__all__ = ["DATA_SOURCES", "mixed_debug_rows", "prepare_mixed_debug"]

DATA_SOURCES = {"math": "entropyrl/mixed_debug_math", "code": "entropyrl/mixed_debug_code"}
MATH_SUFFIX = "Reason step by step, then put the final answer in \\boxed{}."
CODE_SUFFIX = "Answer with one Python program in a ```python code block."


def _fraction_text(value: Fraction) -> str:
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def _math_sum(rng: random.Random) -> tuple[str, str]:
    a, b, c, d = rng.randint(1, 9), rng.randint(2, 9), rng.randint(1, 9), rng.randint(2, 9)
    value = Fraction(a, b) + Fraction(c, d)
    return f"Compute {a}/{b} + {c}/{d} as a fraction in lowest terms.", _fraction_text(value)


def _math_percent(rng: random.Random) -> tuple[str, str]:
    part, whole = rng.randint(1, 20), rng.choice([20, 25, 40, 50, 80])
    value = Fraction(100 * part, whole)
    return f"What percent of {whole} is {part}? Give the number of percent.", _fraction_text(value)


def _math_linear(rng: random.Random) -> tuple[str, str]:
    a, x, b = rng.randint(2, 9), rng.randint(-9, 9), rng.randint(-20, 20)
    sign = "+" if b >= 0 else "-"
    return f"Solve {a}x {sign} {abs(b)} = {a * x + b} for x.", str(x)


def _code_sum(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    cases = [(rng.randint(-99, 99), rng.randint(-99, 99)) for _ in range(3)]
    tests = {
        "inputs": [f"{a} {b}\n" for a, b in cases],
        "outputs": [f"{a + b}\n" for a, b in cases],
    }
    prompt = "Read two integers from one line of standard input and print their sum."
    return prompt, tests, "a, b = map(int, input().split())\nprint(a + b)\n"


def _code_max(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    inputs, outputs = [], []
    for _ in range(3):
        values = [rng.randint(-50, 50) for _ in range(rng.randint(1, 6))]
        inputs.append(f"{len(values)}\n{' '.join(map(str, values))}\n")
        outputs.append(f"{max(values)}\n")
    prompt = "The first line of standard input holds n, the second n integers. Print the largest."
    program = "n = int(input())\nprint(max(map(int, input().split())))\n"
    return prompt, {"inputs": inputs, "outputs": outputs}, program


def _code_call(rng: random.Random) -> tuple[str, dict[str, Any], str]:
    inputs, outputs = [], []
    for _ in range(3):
        values = [rng.randint(0, 9) for _ in range(rng.randint(0, 5))]
        target = rng.randint(0, 9)
        inputs.append(f"{json.dumps(values)}\n{target}")
        outputs.append(json.dumps(values.count(target)))
    prompt = (
        "Write `class Solution` with a method `countTarget(self, nums: List[int], target: int)"
        " -> int` that returns how many times target occurs in nums."
    )
    program = (
        "class Solution:\n    def countTarget(self, nums, target):\n"
        "        return sum(1 for x in nums if x == target)\n"
    )
    return prompt, {"fn_name": "countTarget", "inputs": inputs, "outputs": outputs}, program


MATH_MAKERS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _math_sum,
    _math_percent,
    _math_linear,
)
CODE_MAKERS: tuple[Callable[[random.Random], tuple[str, dict[str, Any], str]], ...] = (
    _code_sum,
    _code_max,
    _code_call,
)


def mixed_debug_rows(count: int, *, split: str, seed: int) -> list[dict[str, Any]]:
    """`count` rows alternating math and code (math first), reproducible from `seed`."""
    rng = random.Random(f"{seed}/{split}")
    rows = []
    for index in range(count):
        if index % 2 == 0:
            maker = MATH_MAKERS[(index // 2) % len(MATH_MAKERS)]
            question, answer = maker(rng)
            ability, content = "math", f"{question}\n{MATH_SUFFIX}"
            ground_truth, reference = answer, f"The answer is \\boxed{{{answer}}}."
            kind = maker.__name__.lstrip("_")
        else:
            maker = CODE_MAKERS[(index // 2) % len(CODE_MAKERS)]
            question, tests, program = maker(rng)
            ability, content = "code", f"{question}\n{CODE_SUFFIX}"
            ground_truth, reference = json.dumps(tests), f"```python\n{program}```"
            kind = maker.__name__.lstrip("_")
        rows.append(
            {
                "data_source": DATA_SOURCES[ability],
                "prompt": [{"role": "user", "content": content}],
                "ability": ability,
                "reward_model": {"style": "rule", "ground_truth": ground_truth},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "ability": ability,
                    "kind": kind,
                    "reference": reference,
                },
            }
        )
    return rows


def prepare_mixed_debug(
    out_dir: str | os.PathLike[str], *, train_size: int = 32, val_size: int = 8, seed: int = 0
) -> dict[str, Any]:
    """Write ``out_dir/train.parquet`` and ``out_dir/val.parquet`` (atomically); a summary."""
    if train_size < 2 or val_size < 2:
        raise ValueError("train_size and val_size must be >= 2 (one math and one code row)")
    out_dir = Path(out_dir)
    summary: dict[str, Any] = {"out": str(out_dir), "seed": seed, "outputs": {}, "abilities": {}}
    for split, size in (("train", train_size), ("val", val_size)):
        rows = mixed_debug_rows(size, split=split, seed=seed)
        path = out_dir / f"{split}.parquet"
        write_parquet(rows, path)
        summary[split] = len(rows)
        summary["outputs"][split] = str(path)
        summary["abilities"][split] = dict(sorted(Counter(r["ability"] for r in rows).items()))
    return summary
