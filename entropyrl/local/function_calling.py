"""`entropyrl demo --task function-calling`: text EGPO on a synthetic tool-use task.

A few tool schemas and template queries, each with one deterministic correct call; the prompt is
the Qwen2.5 chat template with the tools in the system turn. The reward is the strict binary
function-calling reward (`entropyrl.rewards.function_calling.compute_score`: `<think>` block,
then exact `<tool_call>` JSON equal to the ground truth). A tiny Qwen2 text model is warmed up
on correct answers, then each RL variant (default GRPO vs EGPO) runs from the same checkpoint.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from entropyrl.local.config import DemoConfig
from entropyrl.local.policy import forbidden_token_ids, greedy_texts
from entropyrl.local.report import markdown_table, plot_curves, write_summary
from entropyrl.local.rl import RewardOutput
from entropyrl.local.runner import MetricsLog, run_rl, run_warmup

__all__ = ["TOOLS", "FunctionCallingTask", "ToolQuery", "make_queries", "run_function_calling_demo"]


def _tool(name: str, properties: dict[str, str]) -> dict[str, Any]:
    # Short schemas: the tools block is part of every prompt, and a tiny model on 2 CPU cores
    # pays for each prompt token in every forward.
    return {"name": name, "parameters": properties}


TOOLS: list[dict[str, Any]] = [
    _tool("get_weather", {"city": "string", "unit": "celsius|fahrenheit"}),
    _tool("convert_currency", {"amount": "integer", "source": "string", "target": "string"}),
    _tool("set_timer", {"minutes": "integer"}),
]

_CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Rome", "Delhi", "Quito", "Seoul", "Berlin")
_CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CHF", "INR")


@dataclass(frozen=True)
class ToolQuery:
    """A user query and its one correct call."""

    query: str
    name: str
    arguments: dict[str, Any]

    def ground_truth(self) -> list[dict[str, Any]]:
        return [{"name": self.name, "arguments": self.arguments}]

    def answer(self) -> str:
        """The reference response: a short reasoning block, then the call in Qwen's syntax."""
        call = json.dumps({"name": self.name, "arguments": self.arguments})
        return f"<think>use {self.name}</think>\n<tool_call>\n{call}\n</tool_call>"


def make_queries(count: int, seed: int) -> list[ToolQuery]:
    """`count` deterministic queries spread over the tools."""
    rng = random.Random(f"entropyrl-fc-{seed}")
    out = []
    for k in range(count):
        kind = k % 3
        if kind == 0:
            city, unit = rng.choice(_CITIES), rng.choice(("celsius", "fahrenheit"))
            query = rng.choice(
                ("What is the weather in {c} in {u}?", "Weather for {c}, in {u} please.")
            ).format(c=city, u=unit)
            out.append(ToolQuery(query, "get_weather", {"city": city, "unit": unit}))
        elif kind == 1:
            amount = rng.randint(2, 99)
            source, target = rng.sample(_CURRENCIES, 2)
            query = rng.choice(("Convert {a} {s} to {t}.", "How much is {a} {s} in {t}?")).format(
                a=amount, s=source, t=target
            )
            out.append(
                ToolQuery(
                    query,
                    "convert_currency",
                    {"amount": amount, "source": source, "target": target},
                )
            )
        else:
            minutes = rng.randint(1, 59)
            query = rng.choice(
                ("Set a timer for {m} minutes.", "Start a {m} minute timer.")
            ).format(m=minutes)
            out.append(ToolQuery(query, "set_timer", {"minutes": minutes}))
    return out


class FunctionCallingTask:
    """Prompts (left-padded), strict binary rewards and greedy evaluation; items are queries."""

    def __init__(self, tokenizer: Any, train: list[ToolQuery], test: list[ToolQuery]) -> None:
        self.tokenizer = tokenizer
        self.train_ids = list(range(len(train)))
        self.train = train
        self.test = test
        self._prompt_cache: dict[str, list[int]] = {}

    def _prompt_ids(self, query: ToolQuery) -> list[int]:
        if query.query not in self._prompt_cache:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": query.query}],
                tools=TOOLS,
                tokenize=False,
                add_generation_prompt=True,
            )
            self._prompt_cache[query.query] = self.tokenizer.encode(text)
        return self._prompt_cache[query.query]

    def _queries(self, items: Sequence[Any]) -> list[ToolQuery]:
        return [self.train[i] if isinstance(i, int) else i for i in items]

    def prompts(self, items: Sequence[Any]) -> dict[str, Tensor]:
        rows = [self._prompt_ids(q) for q in self._queries(items)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.as_tensor(row)
            mask[i, width - len(row) :] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def reward(self, texts: Sequence[str], items: Sequence[Any]) -> RewardOutput:
        from entropyrl.rewards.function_calling import score_details

        details = [score_details(t, q.ground_truth()) for t, q in zip(texts, self._queries(items))]
        scores = np.array([d["score"] for d in details], dtype=np.float64)
        metrics = {
            "accuracy": float(scores.mean()),
            "format_ok": float(np.mean([d["format_ok"] for d in details])),
        }
        return RewardOutput(scores=scores, chair_i=None, metrics=metrics)

    def warmup_batch(self, rng: random.Random, size: int) -> tuple[list[int], list[list[int]]]:
        ids = [rng.choice(self.train_ids) for _ in range(size)]
        eos = self.tokenizer.eos_token_id
        return ids, [[*self.tokenizer.encode(self.train[i].answer()), eos] for i in ids]

    @torch.no_grad()
    def evaluate(self, model: Any, *, max_new_tokens: int, batch_size: int = 32):
        texts = greedy_texts(
            model,
            self.tokenizer,
            self.prompts,
            self.test,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            suppress=forbidden_token_ids(self.tokenizer),
        )
        result = self.reward(texts, self.test)
        records = [{"query": q.query, "response": t} for q, t in zip(self.test, texts)]
        return result.metrics, records


FC_COLUMNS = (
    ("stage", "held-out (greedy)"),
    ("accuracy_pct", "strict accuracy %"),
    ("format_pct", "format ok %"),
    ("train_seconds", "train s"),
)


def run_function_calling_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Warm-up, then each variant (`--compare`, default grpo,egpo) from the same checkpoint."""
    from entropyrl.local.model import (
        TinyModelConfig,
        build_tiny_qwen2,
        load_pretrained,
        pick_device,
        seed_everything,
    )
    from entropyrl.local.tokenizer import build_qwen_tokenizer

    if not cfg.compare:
        cfg.compare = "grpo,egpo"
    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(out / "metrics.jsonl")
    started = time.perf_counter()
    if cfg.model:
        model, tokenizer = load_pretrained(cfg.model, vision=False)
    else:
        tokenizer = build_qwen_tokenizer(cfg.tokenizer_ranks)
        model = build_tiny_qwen2(
            tokenizer,
            TinyModelConfig(hidden_size=cfg.hidden_size, num_layers=cfg.num_layers),
            seed=cfg.seed,
        )
    model.to(pick_device(cfg.device))
    queries = make_queries(cfg.num_train + cfg.num_test, cfg.seed)
    task = FunctionCallingTask(tokenizer, queries[: cfg.num_train], queries[cfg.num_train :])
    max_tokens = max(len(tokenizer.encode(q.answer())) for q in queries) + 4
    cfg.max_new_tokens = max(cfg.max_new_tokens, max_tokens)
    warm = run_warmup(model, task, cfg, steps=cfg.warmup_steps, seed=cfg.seed, log=log)
    before, before_records = task.evaluate(model, max_new_tokens=max_tokens)
    log.write("eval", 0, before, variant="warm-up")
    rows = [_row("after warm-up", before, warm["seconds"])]
    checkpoint = {k: v.detach().clone() for k, v in model.state_dict().items()}
    results: dict[str, Any] = {}
    for variant in cfg.variants():  # same seed, data and checkpoint
        model.load_state_dict(checkpoint)
        rl = run_rl(model, task, cfg, variant, seed=cfg.seed, log=log)
        after, records = task.evaluate(model, max_new_tokens=max_tokens)
        log.write("eval", cfg.steps, after, variant=variant)
        rows.append(_row(f"after RL: {variant}", after, rl["seconds"]))
        results[variant] = {"eval": after, "seconds": rl["seconds"], "samples": records[:5]}
    table = markdown_table(rows, FC_COLUMNS)
    summary = {
        "task": "function-calling",
        "settings": {
            "seed": cfg.seed,
            "steps": cfg.steps,
            "warmup_steps": cfg.warmup_steps,
            "lr": cfg.lr,
        },
        "warmup": {**warm, "eval": before, "samples": before_records[:5]},
        "variants": results,
        "rows": rows,
        "seconds": {"total": time.perf_counter() - started},
    }
    write_summary(
        out, summary, table, heading=f"entropyrl demo --task function-calling (seed {cfg.seed})"
    )
    plot_curves(
        log.records,
        out / "curves.png",
        title="function calling: RL from the same warm-up",
        curves=(
            ("reward", "strict reward"),
            ("format_ok", "format ok"),
            ("entropy", "token entropy"),
            ("response_length", "response tokens"),
            ("adv_abs_mean", "|advantage|"),
            ("clip_frac_high", "clip frac (high)"),
        ),
    )
    print(table)
    return summary


def _row(stage: str, metrics: dict[str, float], seconds: float) -> dict[str, Any]:
    return {
        "stage": stage,
        "accuracy_pct": 100 * metrics["accuracy"],
        "format_pct": 100 * metrics["format_ok"],
        "train_seconds": seconds,
    }
