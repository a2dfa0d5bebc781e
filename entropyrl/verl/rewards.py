"""Every verl reward entry point of entropyrl, for `reward.custom_reward_function.path=
pkg://entropyrl.verl.rewards` and `.name`.

Each is a thin adapter: verl's arguments in (`data_source, solution_str, ground_truth,
extra_info, **reward_kwargs`, one response per call), the reward's `Scorer`
(`entropyrl.rewards.scorer`) run, its `Score` out as verl's dict (`verl_dict`). The scoring
itself lives in `entropyrl.rewards`, where the local runner calls the same scorers.

- `caption_score` (async): `CaptionReward` (CIDEr-D with corpus document frequencies plus CHAIR
  from the service). verl's reward loop scores one sample per call; concurrent calls on a reward
  worker's event loop are gathered for `batch_window_s` (or until `max_batch`) and scored as one
  batch (`CaptionBatcher`), so CHAIR gets one HTTP call per gathered batch instead of one per
  caption.
- `function_calling_score`: `FunctionCallingScorer`, the strict binary function-calling reward.
- `hybrid_score`: `HybridScorer`, math-verify for math rows and the code sandbox (or Sandbox
  Fusion) for code rows, routed by `extra_info["ability"]`.

Every call that fails is reported to the trainer before verl sees it fail its session
(`entropyrl.verl.failures.reward_failures`), so the step that loses the sample says why: what the scorer
raised, and a response it could not judge (`Score.failure`: a math check that timed out, a code
service that did not answer), raised as `ScoringFailed` rather than trained on as a 0.

All return a dict with `score` plus extra keys; verl stores the extras as reward extra info
(`cider`, `chair_i`, `chair_s`, `recall`, `chair_ok`, `chair_fallback`; `acc`; `route`,
`backend`, `reason`, `passed`, `total`), where the entropy-aware trainer reads each sample's
CHAIR_i.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from entropyrl.rewards.caption import CAPTION_FIELDS, caption_ground_truth
from entropyrl.rewards.hybrid import RESULT_KEYS, HybridScorer
from entropyrl.rewards.scorer import Score, Scorer, ScoringFailed, score_one
from entropyrl.verl.failures.reward_failures import reported

__all__ = [
    "CHAIR_TOKEN_ENV",
    "CHAIR_URL_ENV",
    "CaptionBatcher",
    "caption_batcher",
    "caption_ground_truth",
    "caption_score",
    "chair_token",
    "function_calling_score",
    "hybrid_score",
    "per_response",
    "verl_dict",
]

# The recipe names this function (`reward.custom_reward_function.name`); the trainer logs its
# parts and the smoke check asks for them when it is the reward.
CAPTION_REWARD_NAME = "caption_score"
CHAIR_URL_ENV = "ENTROPYRL_CHAIR_URL"
# One name on both sides: the service reads its token from it (`python -m chair_server`), the
# reward's client sends it.
CHAIR_TOKEN_ENV = "CHAIR_SERVER_TOKEN"


def verl_dict(scored: Score, keys: Sequence[str]) -> dict[str, Any]:
    """`scored` as verl's dict of exactly `keys` (``acc``: the score, verl's name for it).

    A score that is no verdict (`Score.failure`) raises `ScoringFailed` instead: the entry
    point's `reported` counts it with its cause and verl drops the sample.
    """
    if scored.failure:
        raise ScoringFailed(scored.failure)
    return {key: scored.score if key == "acc" else scored[key] for key in keys}


def per_response(
    name: str, build: Callable[..., Scorer], keys: Sequence[str]
) -> Callable[..., dict[str, Any]]:
    """The verl entry point `name` over the `Scorer` that `build(**reward_kwargs)` returns: a
    batch of one per call, the dict of `keys` (`verl_dict`), every failure reported (sync: verl
    runs it in its executor)."""

    def score(
        data_source: Any,
        solution_str: Any,
        ground_truth: Any,
        extra_info: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> dict[str, Any]:
        del data_source  # the row's data set: no scorer reads it
        scored = score_one(build(**settings), solution_str, ground_truth, extra_info)
        return verl_dict(scored, keys)

    score.__name__ = score.__qualname__ = name
    score.__doc__ = f"verl's per-response call of `{build.__qualname__}` ({', '.join(keys)})."
    return reported(score)


def chair_token() -> str | None:
    """The CHAIR service's bearer token from `$CHAIR_SERVER_TOKEN` (None when unset)."""
    return os.environ.get(CHAIR_TOKEN_ENV) or None


class CaptionBatcher:
    """Gathers concurrent per-response requests on one event loop into batched scorer calls.

    `reward` is a `Scorer` (`entropyrl.rewards.scorer`); each waiter gets its response's `Score`.
    """

    def __init__(
        self, reward: Scorer, *, batch_window_s: float = 0.05, max_batch: int = 256
    ) -> None:
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.reward = reward
        self.batch_window_s = float(batch_window_s)
        self.max_batch = int(max_batch)
        self.batches_scored = 0
        self._pending: list[tuple[str, Any, Mapping[str, Any] | None, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def score(
        self, solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
    ) -> Score:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._pending.append((solution, ground_truth, extra_info, future))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.batch_window_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            asyncio.get_running_loop().create_task(self._score_batch(batch))

    async def _score_batch(self, batch: list[tuple[str, Any, Any, asyncio.Future]]) -> None:
        solutions, ground_truths, extra_infos, futures = (list(part) for part in zip(*batch))
        try:
            # The CHAIR call blocks on HTTP: keep the event loop (other rollouts) running.
            scored = await asyncio.get_running_loop().run_in_executor(
                None, self.reward.score_batch, solutions, ground_truths, extra_infos
            )
            if len(scored) != len(batch):
                raise ValueError(f"the scorer returned {len(scored)} scores for {len(batch)}")
            self.batches_scored += 1
        except Exception as error:  # every waiter gets the error, none hangs
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        for future, one in zip(futures, scored):
            if not future.done():
                future.set_result(one)


_BATCHERS: dict[tuple[Any, ...], CaptionBatcher] = {}


def caption_batcher(
    *,
    cider_df: str,
    chair_url: str | None,
    chair_weight: float,
    recall_weight: float,
    chair_timeout: float,
    chair_penalty: str = "fraction",
    chair_retries: int,
    batch_window_s: float,
    max_batch: int,
) -> CaptionBatcher:
    """The batcher for these settings on the running event loop (built once, then reused)."""
    loop = asyncio.get_running_loop()
    key = (
        id(loop),
        cider_df,
        chair_url,
        chair_weight,
        recall_weight,
        chair_penalty,
        chair_timeout,
        chair_retries,
        batch_window_s,
        max_batch,
    )
    batcher = _BATCHERS.get(key)
    if batcher is None:
        from entropyrl.rewards.caption import CaptionReward
        from entropyrl.rewards.cider import CiderD

        client = None
        if chair_url:
            from entropyrl.rewards.chair_client import ChairClient

            client = ChairClient(
                chair_url,
                timeout=chair_timeout,
                retries=chair_retries,
                token=chair_token(),
                max_batch=max_batch,
                strict=False,
            )
        reward = CaptionReward(
            CiderD.load(cider_df),
            client,
            chair_weight=chair_weight if client is not None else 0.0,
            recall_weight=recall_weight if client is not None else 0.0,
            chair_penalty=chair_penalty,
        )
        batcher = CaptionBatcher(reward, batch_window_s=batch_window_s, max_batch=max_batch)
        _BATCHERS[key] = batcher
    return batcher


@reported
async def caption_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    cider_df: str | None = None,
    chair_weight: float = 0.0,
    recall_weight: float = 0.0,
    chair_penalty: str = "fraction",
    chair_url: str | None = None,
    chair_timeout: float = 30.0,
    chair_retries: int = 2,
    batch_window_s: float = 0.05,
    max_batch: int = 256,
    **_: Any,
) -> dict[str, Any]:
    """Caption reward for one rollout (see module docstring); settings come from `reward_kwargs`.

    cider_df: the document-frequency file of `entropyrl prepare coco` (required).
    chair_weight, chair_penalty: the reward is CIDEr-D - chair_weight x penalty, the penalty
        being the caption's CHAIR_i ("fraction") or its number of hallucinated mentions
        ("count"); recall_weight adds that share of the image's objects named.
    chair_url: the CHAIR service (`$ENTROPYRL_CHAIR_URL` when unset; none: CIDEr-D only). Its
        bearer token comes from `$CHAIR_SERVER_TOKEN`, the variable the service reads. A token the
        service refuses stops the run (`ChairAuthError`): a wrong token is a setup error, not an
        outage to train through.
    """
    del data_source
    if not cider_df:
        raise ValueError(
            "caption_score needs reward.custom_reward_function.reward_kwargs.cider_df "
            "(the CIDEr-D document-frequency file)"
        )
    truth = caption_ground_truth(ground_truth)  # a malformed row fails its own call only
    batcher = caption_batcher(
        cider_df=str(cider_df),
        chair_url=chair_url or os.environ.get(CHAIR_URL_ENV) or None,
        chair_weight=float(chair_weight),
        recall_weight=float(recall_weight),
        chair_penalty=str(chair_penalty),
        chair_timeout=float(chair_timeout),
        chair_retries=int(chair_retries),
        batch_window_s=float(batch_window_s),
        max_batch=int(max_batch),
    )
    scored = await batcher.score(solution_str, truth, extra_info)
    return verl_dict(scored, CAPTION_FIELDS)


def _function_calling_scorer(**_: Any) -> Scorer:
    from entropyrl.rewards.function_calling import FunctionCallingScorer

    return FunctionCallingScorer()


# The strict binary function-calling reward (1.0 only for exact format and exact calls).
function_calling_score = per_response(
    "function_calling_score", _function_calling_scorer, ("score", "acc")
)
# The hybrid math + code reward; its settings are `HybridScorer.from_settings`'s.
hybrid_score = per_response("hybrid_score", HybridScorer.from_settings, RESULT_KEYS)
