"""Hybrid reward for mixed data sets: each row's `ability` picks the math or the code scorer.

verl loads it with ``reward.custom_reward_function.path=pkg://entropyrl.rewards.hybrid`` and
``name=compute_score``, and calls it once per response; settings come from
``reward.custom_reward_function.reward_kwargs``.

Where the route comes from: ``extra_info["ability"]`` (verl hands the reward function the row's
`extra_info`, not its other columns, so `entropyrl prepare mixed-debug` writes it there), else
the ``ability=`` keyword (a reward manager that passes the row's column, or one ability for a
whole data set). verl may hand values over wrapped (a 0-d numpy array, one-element lists): they
are unwrapped. A missing or unknown ability is a data error: ValueError, or a 0 with the reason
when ``unknown_ability="zero"``.

Every call returns the same keys (verl builds its extra-info columns from the first sample's):
``score`` (float in [0, 1], never NaN), ``route`` ("math" | "code" | "none"), ``backend``,
``reason``, ``passed`` and ``total`` (tests, or 1 for a math answer).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from entropyrl.rewards.code import CODE_SCORE_MODES, score_code, score_code_sandbox_fusion
from entropyrl.rewards.math_answer import score_math_safely
from entropyrl.rewards.sandbox import Sandbox, SandboxLimits

__all__ = [
    "ABILITY_ALIASES",
    "CODE_BACKENDS",
    "RESULT_KEYS",
    "compute_score",
    "resolve_ability",
    "solution_text",
]

ABILITY_ALIASES = {
    "math": "math",
    "mathematics": "math",
    "code": "code",
    "coding": "code",
    "programming": "code",
}
CODE_BACKENDS = ("local", "sandbox_fusion")
RESULT_KEYS = ("score", "route", "backend", "reason", "passed", "total")


def _unwrap(value: Any) -> Any:
    """The single value inside 0-d arrays, one-element lists/tuples/arrays and tensors."""
    for _ in range(32):
        if hasattr(value, "tolist") and not isinstance(value, str | bytes):
            value = value.tolist()  # numpy arrays (0-d ones give their item) and tensors
        elif isinstance(value, list | tuple) and len(value) == 1:
            value = value[0]
        else:
            break
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value


def resolve_ability(extra_info: Any, ability: Any = None) -> str:
    """The route ("math" | "code") for a row; ValueError naming what was found otherwise."""
    info = _unwrap(extra_info)
    found = None
    if isinstance(info, Mapping) and info.get("ability") is not None:
        found = _unwrap(info["ability"])
    if found is None:
        found = _unwrap(ability)
    if found is None or (isinstance(found, float) and math.isnan(found)):
        raise ValueError(
            "no ability for this row: expected extra_info['ability'] (or the ability= keyword) "
            f"to be one of {sorted(set(ABILITY_ALIASES.values()))}"
        )
    if not isinstance(found, str):
        raise ValueError(f"ability must be a string, got {type(found).__name__}: {found!r}")
    route = ABILITY_ALIASES.get(found.strip().lower())
    if route is None:
        raise ValueError(
            f"unknown ability {found!r}: expected one of {sorted(ABILITY_ALIASES)} "
            "(case-insensitive)"
        )
    return route


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _flatten(value: Any) -> list[Any]:
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, list | tuple):
        out: list[Any] = []
        for item in value:
            out.extend(_flatten(item))
        return out
    return [value]


def solution_text(solution: Any, tokenizer: Any = None) -> str:
    """The response as text: a string as is, token ids (any nesting, lists, arrays, tensors)
    flattened and decoded with `tokenizer` (a local path or an object with `decode`)."""
    if isinstance(solution, str):
        return solution
    if isinstance(solution, bytes):
        return solution.decode("utf-8", "replace")
    items = _flatten(solution)
    if len(items) == 1 and isinstance(items[0], str | bytes):
        return solution_text(items[0])
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        raise TypeError("solution_str must be text or token ids (integers in any nesting)")
    if tokenizer is None:
        raise ValueError("solution_str holds token ids: pass tokenizer=<local path> to decode them")
    if isinstance(tokenizer, str):
        tokenizer = _load_tokenizer(tokenizer)
    return tokenizer.decode(items, skip_special_tokens=True)


@functools.lru_cache(maxsize=8)
def _sandbox(
    limits: SandboxLimits, isolation: str, max_concurrent: int | None, tmp_root: str | None
) -> Sandbox:
    return Sandbox(limits, isolation=isolation, max_concurrent=max_concurrent, tmp_root=tmp_root)


def _result(
    score: float, route: str, backend: str, reason: str, passed: int, total: int
) -> dict[str, Any]:
    score = float(score)
    if not math.isfinite(score):
        score, reason = 0.0, f"non-finite score replaced by 0 ({reason})"
    return {
        "score": score,
        "route": route,
        "backend": backend,
        "reason": reason,
        "passed": int(passed),
        "total": int(total),
    }


def compute_score(
    data_source: Any,
    solution_str: Any,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    ability: Any = None,
    unknown_ability: str = "raise",
    tokenizer: Any = None,
    math_timeout: int = 5,
    code_backend: str = "local",
    code_score: str = "all",
    require_code_block: bool = True,
    cpu_seconds: float = 4.0,
    wall_seconds: float = 8.0,
    memory_limit_mb: int = 1024,
    max_output_bytes: int = 1 << 20,
    isolation: str = "auto",
    max_concurrent: int | None = None,
    tmp_root: str | None = None,
    sandbox_fusion_url: str | None = None,
    sandbox_fusion_timeout: int = 10,
    concurrent_semaphore: Any = None,
    **_: Any,
) -> dict[str, Any]:
    """Score one response by its row's ability (see the module docstring).

    unknown_ability: "raise" (ValueError) or "zero" (score 0, route "none", the reason).
    tokenizer: local path (or tokenizer object) to decode token-id responses.
    math_timeout: seconds for math-verify's parsing and each comparison.
    code_backend: "local" (a sandbox on the local host) or "sandbox_fusion" (needs
        sandbox_fusion_url; verl's client; an unreachable service scores 0 with the reason).
    code_score: "all" (1 only if every test passes) or "fraction" (share of tests passed).
    cpu_seconds, wall_seconds, memory_limit_mb, max_output_bytes: limits per test run.
    isolation: "auto" | "namespaces" | "none" for the local sandbox (see entropyrl.rewards.sandbox).
    max_concurrent: local sandbox processes at once in this process (default: CPU count).
    """
    del data_source  # routing is by ability; the data source only names the set
    if unknown_ability not in ("raise", "zero"):
        raise ValueError(f"unknown_ability must be 'raise' or 'zero', got {unknown_ability!r}")
    if code_backend not in CODE_BACKENDS:
        raise ValueError(f"code_backend must be one of {CODE_BACKENDS}, got {code_backend!r}")
    if code_score not in CODE_SCORE_MODES:
        raise ValueError(f"code_score must be one of {CODE_SCORE_MODES}, got {code_score!r}")
    try:
        route = resolve_ability(extra_info, ability)
    except ValueError as error:
        if unknown_ability == "raise":
            raise
        return _result(0.0, "none", "none", str(error), 0, 0)
    text = solution_text(solution_str, tokenizer)
    truth = _unwrap(ground_truth)
    if route == "math":
        scored = score_math_safely(text, truth, timeout_seconds=int(math_timeout))
        return _result(scored.score, "math", "math-verify", scored.reason, int(scored.score), 1)
    if code_backend == "sandbox_fusion":
        if not sandbox_fusion_url:
            raise ValueError("code_backend='sandbox_fusion' needs sandbox_fusion_url")
        scored = score_code_sandbox_fusion(
            text,
            truth,
            url=sandbox_fusion_url,
            mode=code_score,
            memory_limit_mb=int(memory_limit_mb),
            timeout=int(sandbox_fusion_timeout),
            concurrent_semaphore=concurrent_semaphore,
            require_code_block=require_code_block,
        )
    else:
        limits = SandboxLimits(
            cpu_seconds=float(cpu_seconds),
            wall_seconds=float(wall_seconds),
            memory_mb=int(memory_limit_mb),
            max_output_bytes=int(max_output_bytes),
        )
        sandbox = _sandbox(limits, isolation, max_concurrent, tmp_root)
        scored = score_code(
            text,
            truth,
            sandbox=sandbox,
            mode=code_score,
            require_code_block=require_code_block,
        )
    return _result(scored.score, "code", code_backend, scored.reason, scored.passed, scored.total)
