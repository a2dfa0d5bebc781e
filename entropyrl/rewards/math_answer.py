"""Math reward: extract the final answer and check it against the ground truth with math-verify.

math-verify (HuggingFace's answer checker, `pip install math-verify`) does the extraction
(`\\boxed{}` first, then LaTeX and plain expressions) and the equivalence (numeric, symbolic,
sets, intervals, percentages: `\\boxed{1/2}` equals `0.5`, `\\frac12` and `50\\%`). The ground
truth is read as verl's own math_verify reward reads it, wrapped in `\\boxed{}`.

Two things are handled here rather than in math-verify:
- percentages inside `\\boxed{}`: with the ANTLR 4.9.3 runtime that Hydra pins, latex2sympy's
  percent rule fails (its 4.9.3 parser lacks a token the rule tests first), so a boxed
  `50\\%` comes back unparsed; such answers are re-read as the plain-text percentage `50%`,
  which math-verify compares both ways (as 0.5 and as 50);
- timeouts: math-verify's own timeouts use SIGALRM, which only works on the main thread. On
  another thread (verl's reward loop calls reward functions from a thread pool)
  `score_math_safely` runs the check in a spawned worker process, where they work, and gives
  up after `timeout_seconds` of wall time.

`MathScorer` is the reward as a `Scorer` (`entropyrl.rewards.scorer`); `score_math` and
`score_math_safely` score one response.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from entropyrl.rewards.scorer import ResponseScorer, Score

__all__ = ["MathScore", "MathScorer", "score_math", "score_math_safely"]

_PERCENT = re.compile(r"^\s*([-+]?\d[\d,]*(?:\.\d+)?)\s*(?:\\,)?\s*\\?%\s*$")
_POOL: ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


@dataclass(frozen=True)
class MathScore:
    """1.0 or 0.0, why, and the extracted answer (empty when none was found)."""

    score: float
    reason: str
    extracted: str = ""


def _gold_texts(ground_truth: Any) -> list[str] | str:
    """Acceptable answers as text, or a string saying why the ground truth is unusable."""
    values = list(ground_truth) if isinstance(ground_truth, list | tuple) else [ground_truth]
    texts = []
    for value in values:
        if value is None:
            continue
        if isinstance(value, float) and math.isnan(value):
            return "ground truth is NaN"
        if isinstance(value, bool):
            return "ground truth is a boolean, not a math answer"
        text = str(value).strip()
        if text.lower() in ("nan", "+nan", "-nan"):
            return "ground truth is NaN"
        if text:
            texts.append(text)
    if not texts:
        return "ground truth is empty"
    for text in texts:
        if text[0] in "{[":
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict):
                return "ground truth is a JSON object, not a math answer (wrong route?)"
    return texts


def _with_percentages(parsed: list, parse: Any, expr_config: Any, timeout: int | None) -> list:
    extra = []
    for item in parsed:
        if isinstance(item, str):
            match = _PERCENT.match(item)
            if match:
                extra += parse(f"{match.group(1)}%", [expr_config], parsing_timeout=timeout)
    return parsed + extra


def score_math(solution: str, ground_truth: Any, *, timeout_seconds: int = 5) -> MathScore:
    """Score one response in this process (math-verify's timeouts only on the main thread)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    golds = _gold_texts(ground_truth)
    if isinstance(golds, str):
        return MathScore(0.0, golds)
    if "<think>" in solution and "</think>" not in solution:
        return MathScore(0.0, "no answer: the thinking segment was never closed")
    answer = solution.rsplit("</think>", 1)[-1]
    on_main = threading.current_thread() is threading.main_thread()
    timeout = timeout_seconds if on_main else None
    latex, expr = LatexExtractionConfig(), ExprExtractionConfig()
    gold = []
    for text in golds:
        found = parse("\\boxed{" + text + "}", [latex], parsing_timeout=timeout)
        if not found or all(isinstance(item, str) for item in found):
            found = found + parse(text, [latex, expr], parsing_timeout=timeout)
        gold += _with_percentages(found, parse, expr, timeout)
    if not gold:
        return MathScore(0.0, "ground truth is not a parseable math answer")
    found = parse(answer, [latex, expr], parsing_timeout=timeout)
    if not found:
        return MathScore(0.0, "no answer found")
    extracted = next((item for item in found if isinstance(item, str)), str(found[0]))
    predicted = _with_percentages(found, parse, expr, timeout)
    if verify(gold, predicted, timeout_seconds=timeout):
        return MathScore(1.0, "correct", extracted)
    return MathScore(0.0, "wrong answer", extracted)


def _pool(*, renew: bool = False) -> ProcessPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if renew and _POOL is not None:
            _POOL.shutdown(wait=False, cancel_futures=True)
            _POOL = None
        if _POOL is None:
            _POOL = ProcessPoolExecutor(
                max_workers=2, mp_context=multiprocessing.get_context("spawn")
            )
        return _POOL


def score_math_safely(solution: str, ground_truth: Any, *, timeout_seconds: int = 5) -> MathScore:
    """`score_math` with a working timeout on any thread (a worker process off the main one)."""
    if threading.current_thread() is threading.main_thread():
        return score_math(solution, ground_truth, timeout_seconds=timeout_seconds)
    limit = 3 * timeout_seconds + 30
    try:
        future = _pool().submit(score_math, solution, ground_truth, timeout_seconds=timeout_seconds)
        # The worker's own (signal) timeouts cover parsing and each comparison; this bounds the
        # whole check, start-up of a fresh worker included.
        return future.result(timeout=limit)
    except FutureTimeout:
        future.cancel()
        return MathScore(0.0, f"math check timed out after {limit} s")
    except BrokenProcessPool:
        # A worker died (or could not start): a fresh pool next time; this answer is still
        # scored, here, only without math-verify's timeouts.
        _pool(renew=True)
        return score_math(solution, ground_truth, timeout_seconds=timeout_seconds)


@dataclass(frozen=True)
class MathScorer(ResponseScorer):
    """The math reward as a `Scorer`: `score_math_safely` on each response.

    The ground truth is the answer (text or a number; a list of acceptable answers too); the
    extra info is not read. Each `Score` is 1.0 or 0.0 with the reason and the detail
    ``extracted`` (the answer found in the response, empty when none was).
    """

    timeout_seconds: int = 5

    def score_response(
        self, solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
    ) -> Score:
        scored = score_math_safely(solution, ground_truth, timeout_seconds=self.timeout_seconds)
        return Score(scored.score, scored.reason, {"extracted": scored.extracted})
