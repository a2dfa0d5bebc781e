"""The captioning task of the local runner: synthetic COCO images, CIDEr-D + CHAIR rewards.

Rewards come from `entropyrl.rewards.CaptionReward`, the scorer verl's `caption_score` runs
(CIDEr-D with corpus document frequencies and the CHAIR service over HTTP, one call per rollout
batch); held-out evaluation decodes greedily and scores CHAIR through the same service.
The reward also says which response tokens carry each hallucinated mention
(`RewardOutput.hallucinated_positions`, from CHAIR's mention spans through the tokenizer's
offsets: `entropyrl.rewards.token_spans`), what the token-level mechanisms act on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from entropyrl.rewards.caption import CaptionReward
from entropyrl.rewards.token_spans import caption_positions
from entropyrl.rig.local.policy import greedy_texts
from entropyrl.rig.local.rl import RewardOutput
from entropyrl.rig.synthetic import SyntheticWorld

__all__ = ["PROMPT", "CaptionTask"]

PROMPT = "Describe the image."


class CaptionTask:
    """Prompts, rewards, warm-up batches and evaluation over a `SyntheticWorld`.

    Items are image ids.
    """

    def __init__(
        self,
        world: SyntheticWorld,
        tokenizer: Any,
        processor: Any,
        reward: CaptionReward,
        *,
        prompt: str = PROMPT,
    ) -> None:
        self.world = world
        self.tokenizer = tokenizer
        self.processor = processor
        self.reward_fn = reward
        self.prompt_text = tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        self.train_ids = [im.image_id for im in world.train]
        self.test_ids = [im.image_id for im in world.test]
        self._prompt_cache: dict[int, dict[str, Tensor]] = {}

    def prompts(self, items: Sequence[int]) -> dict[str, Tensor]:
        """Model inputs of `items`; each image is processed once, then kept (same tensors as
        processing the batch: every prompt has the same length, pixel rows are per image)."""
        rows = [self._prompt(i) for i in items]
        lengths = {row["input_ids"].shape[-1] for row in rows}
        if len(lengths) != 1:  # images of different sizes: let the processor pad
            images = [self.world.image(i) for i in items]
            batch = self.processor(
                images=images, text=[self.prompt_text] * len(items), return_tensors="pt"
            )
            return dict(batch)
        return {key: torch.cat([row[key] for row in rows]) for key in rows[0]}

    def _prompt(self, item: int) -> dict[str, Tensor]:
        if item not in self._prompt_cache:
            batch = self.processor(
                images=[self.world.image(item)], text=[self.prompt_text], return_tensors="pt"
            )
            self._prompt_cache[item] = dict(batch)
        return self._prompt_cache[item]

    def reward(
        self,
        texts: Sequence[str],
        items: Sequence[int],
        responses: Tensor | Sequence[Sequence[int]] | None = None,
    ) -> RewardOutput:
        """The scorer verl's caption_score runs, on the whole batch (one CHAIR call).

        `hallucinated_positions` index each response's tokens: those of `responses` ([N, R]
        ids the texts were decoded from with ``skip_special_tokens=True``, padding included)
        when given, else the tokenizer's own tokenisation of each text (the same ids for any
        response the tokenizer would produce). None without CHAIR; a row's None where CHAIR did
        not score it.
        """
        truths = [(i, self.world.references[i]) for i in items]
        result = self.reward_fn.score_batch(list(texts), truths, [None] * len(truths))
        metrics = {
            "cider": float(result.cider.mean()),
            **{k: float(v) for k, v in result.metrics().items()},
        }
        chair_i = result.chair_i if result.chair_requested else None
        positions = None
        if result.hallucinated_spans is not None:
            if responses is not None and len(responses) != len(texts):
                raise ValueError(f"{len(responses)} responses for {len(texts)} texts")
            rows = [None] * len(texts) if responses is None else list(responses)
            positions = [
                None
                if spans is None
                else caption_positions(
                    self.tokenizer,
                    spans,
                    texts[i],
                    rows[i].tolist() if isinstance(rows[i], Tensor) else rows[i],
                )
                for i, spans in enumerate(result.hallucinated_spans)
            ]
        return RewardOutput(
            scores=result.scores,
            chair_i=chair_i,
            metrics=metrics,
            hallucinated_positions=positions,
        )

    def warmup_batch(self, rng: random.Random, size: int) -> tuple[list[int], list[list[int]]]:
        """`size` (image, noisy warm-up caption) pairs as (image ids, target token ids)."""
        ids = [rng.choice(self.train_ids) for _ in range(size)]
        eos = self.tokenizer.eos_token_id
        targets = [
            [*self.tokenizer.encode(rng.choice(self.world.warmup_captions[i])), eos] for i in ids
        ]
        return ids, targets

    @torch.no_grad()
    def evaluate(
        self,
        model: Any,
        chair: Any,
        *,
        max_new_tokens: int = 24,
        suppress: list[int] | None = None,
        batch_size: int = 50,
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Greedy captions of the held-out images; corpus CHAIR_i / CHAIR_s / recall from the
        CHAIR service (micro-averaged, as papers report) and mean CIDEr-D.

        CHAIR metrics cover the captions the service scored; `chair_unscored` counts the others
        (service unavailable), and a metric over none is NaN (n/a in the summary), not 0.

        Returns (metrics, per-image records).
        """
        from chair_server.scorer import overall_metrics

        captions = greedy_texts(
            model,
            self.tokenizer,
            self.prompts,
            self.test_ids,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            suppress=suppress,
        )
        items = [{"image_id": i, "caption": c} for i, c in zip(self.test_ids, captions)]
        entries = chair.score(items)
        scored = [e for e in entries if e is not None and "metrics" in e]
        overall = overall_metrics(scored)
        refs = [self.world.references[i] for i in self.test_ids]
        cider = self.reward_fn.cider.score_batch(captions, refs)
        metrics = {
            "chair_i": _float(overall["CHAIRi"]),
            "chair_s": _float(overall["CHAIRs"]),
            "recall": _float(overall["Recall"]),
            "cider": float(np.mean(cider)),
            "length": float(np.mean([len(c.split()) for c in captions])),
            "chair_unscored": float(len(entries) - len(scored)),
        }
        records = [
            {
                "image_id": i,
                "caption": c,
                "cider": float(s),
                # the words CHAIR found hallucinated (None: the service did not score it)
                "hallucinated": None
                if e is None or "metrics" not in e
                else [word for word, _ in e.get("hallucinated", [])],
            }
            for i, c, s, e in zip(self.test_ids, captions, cider, entries)
        ]
        return metrics, records


def _float(value: float | None) -> float:
    """A corpus metric as a float; None (nothing to average over) becomes NaN."""
    return float("nan") if value is None else float(value)
