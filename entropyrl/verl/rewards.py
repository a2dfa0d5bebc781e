"""Reward functions for verl's `reward.custom_reward_function.path=pkg://entropyrl.verl.rewards`.

- `caption_score` (async): CIDEr-D with corpus document frequencies plus CHAIR from the service.
  verl's reward loop scores one sample per call; concurrent calls on a reward worker's event loop
  are gathered for `batch_window_s` (or until `max_batch`) and scored together, so CHAIR gets one
  HTTP call per gathered batch instead of one per caption.
- `function_calling_score`: the strict binary function-calling reward.

Both return a dict with `score` plus extra keys; verl stores the extras as reward extra info
(`cider`, `chair_i`, `chair_s`, `recall`, `chair_ok`, `chair_fallback`), where the entropy-aware trainer reads
each sample's CHAIR_i.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

CHAIR_URL_ENV = "ENTROPYRL_CHAIR_URL"
# One name on both sides: the service reads its token from it (`python -m chair_server`), the
# reward's client sends it. The former client-only name is read too, with a warning.
CHAIR_TOKEN_ENV = "CHAIR_SERVER_TOKEN"
DEPRECATED_CHAIR_TOKEN_ENV = "ENTROPYRL_CHAIR_TOKEN"


def chair_token() -> str | None:
    """The CHAIR service's bearer token from `$CHAIR_SERVER_TOKEN` (None when unset)."""
    token = os.environ.get(CHAIR_TOKEN_ENV)
    if not token and os.environ.get(DEPRECATED_CHAIR_TOKEN_ENV):
        import warnings

        warnings.warn(
            f"${DEPRECATED_CHAIR_TOKEN_ENV} is deprecated; set ${CHAIR_TOKEN_ENV} (the name the "
            "CHAIR service reads too)",
            FutureWarning,
            stacklevel=2,
        )
        token = os.environ[DEPRECATED_CHAIR_TOKEN_ENV]
    return token or None


def caption_ground_truth(ground_truth: Any) -> tuple[int, list[str]]:
    """(image_id, references) from a COCO row's `reward_model.ground_truth`.

    Accepts the mapping written by `entropyrl prepare coco` (`image_id` and `references`, or
    `captions`) or the same mapping as a JSON string.
    """
    if isinstance(ground_truth, str | bytes):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise ValueError(f"ground_truth is not JSON: {error}") from error
    if not isinstance(ground_truth, Mapping):
        raise ValueError(
            f"ground_truth must map image_id and references, got {type(ground_truth).__name__}"
        )
    if "image_id" not in ground_truth:
        raise ValueError("ground_truth has no field 'image_id'")
    references = ground_truth.get("references", ground_truth.get("captions"))
    if references is None:
        raise ValueError("ground_truth has no field 'references'")
    if isinstance(references, str):
        references = [references]
    references = [str(reference) for reference in list(references)]
    if not references:
        raise ValueError("ground_truth field 'references' is empty")
    return int(ground_truth["image_id"]), references


class CaptionBatcher:
    """Gathers concurrent per-caption requests on one event loop into batched reward calls."""

    def __init__(self, reward: Any, *, batch_window_s: float = 0.05, max_batch: int = 256) -> None:
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.reward = reward
        self.batch_window_s = float(batch_window_s)
        self.max_batch = int(max_batch)
        self.batches_scored = 0
        self._pending: list[tuple[str, int, list[str], asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def score(self, caption: str, image_id: int, references: Sequence[str]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._pending.append((caption, image_id, list(references), future))
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

    async def _score_batch(self, batch: list[tuple[str, int, list[str], asyncio.Future]]) -> None:
        captions = [item[0] for item in batch]
        image_ids = [item[1] for item in batch]
        references = [item[2] for item in batch]
        try:
            # The CHAIR call blocks on HTTP: keep the event loop (other rollouts) running.
            result = await asyncio.get_running_loop().run_in_executor(
                None, self.reward, captions, image_ids, references
            )
            self.batches_scored += 1
        except Exception as error:  # every waiter gets the error, none hangs
            for *_, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for i, (*_, future) in enumerate(batch):
            if not future.done():
                future.set_result(caption_result_row(result, i))


def caption_result_row(result: Any, i: int) -> dict[str, Any]:
    """Sample i of a `CaptionRewardResult` as verl's reward dict (NaN where CHAIR is missing).

    `chair_fallback` is True where the CHAIR service gave no answer (unreachable): the trainer
    counts those samples in `chair/fallback_samples`.
    """
    fallback = getattr(result, "chair_fallback", None)
    return {
        "score": float(result.scores[i]),
        "cider": float(result.cider[i]),
        "chair_i": float(result.chair_i[i]),
        "chair_s": float(result.chair_s[i]),
        "recall": float(result.recall[i]),
        "chair_ok": bool(result.chair_ok[i]),
        "chair_fallback": bool(fallback[i]) if fallback is not None else False,
    }


_BATCHERS: dict[tuple[Any, ...], CaptionBatcher] = {}


def caption_batcher(
    *,
    cider_df: str,
    chair_url: str | None,
    chair_weight: float,
    recall_weight: float,
    chair_timeout: float,
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
        )
        batcher = CaptionBatcher(reward, batch_window_s=batch_window_s, max_batch=max_batch)
        _BATCHERS[key] = batcher
    return batcher


async def caption_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    cider_df: str | None = None,
    chair_url: str | None = None,
    chair_weight: float = 0.0,
    recall_weight: float = 0.0,
    chair_timeout: float = 30.0,
    chair_retries: int = 2,
    batch_window_s: float = 0.05,
    max_batch: int = 256,
    **_: Any,
) -> dict[str, Any]:
    """Caption reward for one rollout (see module docstring); settings come from `reward_kwargs`.

    cider_df: the document-frequency file of `entropyrl prepare coco` (required).
    chair_url: the CHAIR service (`$ENTROPYRL_CHAIR_URL` when unset; none: CIDEr-D only). Its
        bearer token comes from `$CHAIR_SERVER_TOKEN`, the variable the service reads. A token the
        service refuses stops the run (`ChairAuthError`): a wrong token is a setup error, not an
        outage to train through.
    """
    del data_source, extra_info
    if not cider_df:
        raise ValueError(
            "caption_score needs reward.custom_reward_function.reward_kwargs.cider_df "
            "(the CIDEr-D document-frequency file)"
        )
    image_id, references = caption_ground_truth(ground_truth)
    batcher = caption_batcher(
        cider_df=str(cider_df),
        chair_url=chair_url or os.environ.get(CHAIR_URL_ENV) or None,
        chair_weight=float(chair_weight),
        recall_weight=float(recall_weight),
        chair_timeout=float(chair_timeout),
        chair_retries=int(chair_retries),
        batch_window_s=float(batch_window_s),
        max_batch=int(max_batch),
    )
    return await batcher.score(solution_str, image_id, references)


def function_calling_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **_: Any,
) -> dict[str, Any]:
    """Strict binary function-calling reward (1.0 only for exact format and exact calls)."""
    del data_source
    from entropyrl.rewards.function_calling import compute_score

    score = float(compute_score(solution_str, ground_truth, extra_info))
    return {"score": score, "acc": score}
