"""Hybrid reward for mixed data sets: each row's `ability` picks the math or the code scorer.

verl loads it as ``reward.custom_reward_function.path=pkg://entropyrl.verl.rewards`` and
``name=hybrid_score`` (the adapter over `HybridScorer`), and calls it once per response;
settings come from ``reward.custom_reward_function.reward_kwargs`` (`HybridScorer.from_settings`).

Where the route comes from: ``extra_info["ability"]`` (verl hands the reward function the row's
`extra_info`, not its other columns, so `entropyrl prepare mixed-debug` writes it there), else
the ``ability=`` keyword (a reward manager that passes the row's column, or one ability for a
whole data set). verl may hand values over wrapped (a 0-d numpy array, one-element lists): they
are unwrapped. A missing or unknown ability is a data error: ValueError, or a 0 with the reason
when ``unknown_ability="zero"``.

Every score has the same keys (verl builds its extra-info columns from the first sample's):
``score`` (float in [0, 1], never NaN), ``route`` ("math" | "code" | "none"), ``backend``,
``reason``, ``passed`` and ``total`` (tests, or 1 for a math answer).

A response the routes could not judge (the math check timed out, the Sandbox Fusion service did
not answer) is a `Score` with ``failure`` set (`entropyrl.rewards.scorer`): the verl entry point
reports it instead of training on its 0. A checker that raises (a local sandbox that cannot
start a program, math-verify's own errors) propagates, and the entry point reports that too.
A program that runs past its limits is the response's fault: it scores 0, a verdict.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from entropyrl.rewards.code import CODE_SCORE_MODES, CodeScorer, SandboxFusionScorer
from entropyrl.rewards.math_answer import MathScorer
from entropyrl.rewards.sandbox import Sandbox, SandboxLimits
from entropyrl.rewards.scorer import GroundTruths, Score, Scorer, batch_size, score_one

__all__ = [
    "ABILITY_ALIASES",
    "CODE_BACKENDS",
    "RESULT_KEYS",
    "UNJUDGED_REASONS",
    "HybridScorer",
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
# The routes' zeros that are no verdict on the response, by the reason their scorer gives
# (`math_answer.score_math_safely`'s timeout, `code.score_code_sandbox_fusion`'s failed requests).
UNJUDGED_REASONS = ("math check timed out", "sandbox fusion unreachable or failing")


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


def _result(score: float, route: str, backend: str, reason: str, passed: int, total: int) -> Score:
    score = float(score)
    if not math.isfinite(score):
        score, reason = 0.0, f"non-finite score replaced by 0 ({reason})"
    details = {"route": route, "backend": backend, "passed": int(passed), "total": int(total)}
    unjudged = reason.startswith(UNJUDGED_REASONS)
    return Score(0.0 if unjudged else score, reason, details, reason if unjudged else "")


@dataclass(frozen=True)
class HybridScorer:
    """The hybrid reward as a `Scorer`: each row's ability picks `math` or `code`, and each
    route scores its rows of the batch in one `score_batch` call.

    `code` is a factory, called only for a batch with code rows: the local sandbox probes the
    host when it is built, and Sandbox Fusion needs its URL only when there is code to run.
    `ability` is the route of rows whose extra info names none; `unknown_ability` "raise"
    (ValueError) or "zero" (score 0, route "none", the reason); `tokenizer` decodes responses
    given as token ids (see `solution_text`). Each `Score` has the details ``route``,
    ``backend``, ``passed`` and ``total`` (`RESULT_KEYS` with ``score`` and ``reason``).
    """

    math: Scorer
    code: Callable[[], Scorer]
    code_backend: str = "local"
    ability: Any = None
    unknown_ability: str = "raise"
    tokenizer: Any = None

    def __post_init__(self) -> None:
        if self.unknown_ability not in ("raise", "zero"):
            raise ValueError(
                f"unknown_ability must be 'raise' or 'zero', got {self.unknown_ability!r}"
            )

    @classmethod
    def from_settings(
        cls,
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
    ) -> HybridScorer:
        """The scorer for verl's ``reward_kwargs`` (other keywords are ignored).

        ability, unknown_ability, tokenizer: as the class's fields; tokenizer may be a local path.
        math_timeout: seconds for math-verify's parsing and each comparison.
        code_backend: "local" (a sandbox on the local host) or "sandbox_fusion" (needs
            sandbox_fusion_url; verl's client; an unreachable service scores 0 with the reason).
        code_score: "all" (1 only if every test passes) or "fraction" (share of tests passed).
        cpu_seconds, wall_seconds, memory_limit_mb, max_output_bytes: limits per test run.
        isolation: "auto" | "namespaces" | "none" for the local sandbox (see
            entropyrl.rewards.sandbox).
        max_concurrent: local sandbox processes at once in this process (default: CPU count).
        """
        if code_backend not in CODE_BACKENDS:
            raise ValueError(f"code_backend must be one of {CODE_BACKENDS}, got {code_backend!r}")
        if code_score not in CODE_SCORE_MODES:
            raise ValueError(f"code_score must be one of {CODE_SCORE_MODES}, got {code_score!r}")

        def code() -> Scorer:
            if code_backend == "sandbox_fusion":
                if not sandbox_fusion_url:
                    raise ValueError("code_backend='sandbox_fusion' needs sandbox_fusion_url")
                return SandboxFusionScorer(
                    sandbox_fusion_url,
                    code_score,
                    require_code_block,
                    memory_limit_mb=int(memory_limit_mb),
                    timeout=int(sandbox_fusion_timeout),
                    concurrent_semaphore=concurrent_semaphore,
                )
            limits = SandboxLimits(
                cpu_seconds=float(cpu_seconds),
                wall_seconds=float(wall_seconds),
                memory_mb=int(memory_limit_mb),
                max_output_bytes=int(max_output_bytes),
            )
            sandbox = _sandbox(limits, isolation, max_concurrent, tmp_root)
            return CodeScorer(sandbox, code_score, require_code_block)

        return cls(
            MathScorer(int(math_timeout)), code, code_backend, ability, unknown_ability, tokenizer
        )

    def score_batch(
        self, solutions: Sequence[Any], ground_truths: GroundTruths, extra_infos: Sequence[Any]
    ) -> list[Score]:
        """Scores in order; a response may also be token ids (decoded with `tokenizer`), an
        extra info wrapped as verl may hand it over (see `resolve_ability`)."""
        size = batch_size(solutions, ground_truths, extra_infos)
        out: dict[int, Score] = {}
        rows: dict[str, list[int]] = {"math": [], "code": []}
        for i, info in enumerate(extra_infos):
            try:
                rows[resolve_ability(info, self.ability)].append(i)
            except ValueError as error:
                if self.unknown_ability == "raise":
                    raise
                out[i] = _result(0.0, "none", "none", str(error), 0, 0)
        for route, picked in rows.items():
            if not picked:
                continue
            texts = [solution_text(solutions[i], self.tokenizer) for i in picked]
            truths = [_unwrap(ground_truths[i]) for i in picked]
            scorer = self.math if route == "math" else self.code()
            scored = scorer.score_batch(texts, truths, [extra_infos[i] for i in picked])
            for i, one in zip(picked, scored):
                if route == "math":
                    out[i] = _result(one.score, route, "math-verify", one.reason, int(one.score), 1)
                else:
                    passed, total = one["passed"], one["total"]
                    out[i] = _result(one.score, route, self.code_backend, one.reason, passed, total)
                if one.failure and not out[i].failure:  # a route's own scorer said so
                    out[i] = Score(0.0, out[i].reason, out[i].details, one.failure)
        return [out[i] for i in range(size)]


def compute_score(
    data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **settings: Any
) -> dict[str, Any]:
    """Deprecated (0.2): verl's entry point is ``pkg://entropyrl.verl.rewards``, name
    ``hybrid_score``, which reports the calls it could not score; this one scores them 0 as
    before. One response through `HybridScorer.from_settings(**settings)`, as `RESULT_KEYS`."""
    warnings.warn(_MOVED, DeprecationWarning, stacklevel=2)
    return score_one(
        HybridScorer.from_settings(**settings), solution_str, ground_truth, extra_info
    ).as_dict(RESULT_KEYS)


_MOVED = (
    "entropyrl.rewards.hybrid.compute_score is deprecated: name pkg://entropyrl.verl.rewards, "
    "hybrid_score in reward.custom_reward_function (it reports the calls it cannot score)"
)
