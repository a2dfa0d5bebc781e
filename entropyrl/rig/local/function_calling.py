"""`entropyrl demo --task function-calling`: text GRPO vs EGPO on a tiny tool-use world.

The world: three tools (`TOOLS`) and template requests, each with one correct call whose
arguments are copied from the request. The prompt is Qwen's chat format with a compact tool list
in the system turn (the full Qwen2.5 tools header is ~200 tokens, which a 2-core CPU pays for in
every forward); the response format is the real one: ``<think>...</think>`` then
``<tool_call>\\n{json}\\n</tool_call>``, scored by the strict binary reward
(`entropyrl.rewards.function_calling.FunctionCallingScorer`, as in verl training).

The warm-up data is demonstrations with habits the strict reward rejects, as SFT data from
another source has: in a share ``noise_rate`` of them each tool carries its own habit (integers
written as floats for `convert_currency`, an argument the schema lacks for `get_weather`, an
inline block without the template's newlines for `set_timer`). After the warm-up the model
produces those habits some of the time; RL with the strict reward can remove them. GRPO and
EGPO then run from the same checkpoint with the same seed, and held-out requests are scored
greedily before and after.

`DemoConfig`'s defaults are the captioning recipe. The measured function-calling recipe
(docs/function_calling.md, 3 of 3 seeds above the warm-up) is ``--tokenizer-ranks 2048
--warmup-steps 400 --steps 50 --prompts-per-step 4 --lr 2e-4 --num-test 60`` (a 2k vocabulary
makes the LM head 4x cheaper; other learning rates were not measured on this world).
"""

from __future__ import annotations

import hashlib
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

from entropyrl.rig.local.config import DemoConfig
from entropyrl.rig.local.policy import forbidden_token_ids, greedy_texts
from entropyrl.rig.local.progress import set_position
from entropyrl.rig.local.report import Curve, HeldOut, markdown_table, plot_curves, write_summary
from entropyrl.rig.local.rl import RewardOutput
from entropyrl.rig.local.runner import MetricsLog, run_rl, warm_up_or_load, warmup_source

__all__ = [
    "FLAWS",
    "TOOLS",
    "FunctionCallingTask",
    "ToolQuery",
    "is_held_out",
    "make_queries",
    "run_function_calling_demo",
    "split_queries",
    "system_prompt",
]


def _tool(name: str, properties: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "parameters": properties}


TOOLS: list[dict[str, Any]] = [
    _tool("get_weather", {"city": "string", "unit": "celsius|fahrenheit"}),
    _tool("convert_currency", {"amount": "integer", "source": "string", "target": "string"}),
    _tool("set_timer", {"minutes": "integer"}),
]

# The habit each tool's flawed demonstrations carry; every one scores 0 under the strict reward.
FLAWS: dict[str, str] = {
    "convert_currency": "float",  # "amount": 19.0 for the integer 19 (BFCL: a type error)
    "get_weather": "extra",  # an argument the schema does not have
    "set_timer": "inline",  # <tool_call>{...}</tool_call>: BFCL's Qwen decoder finds no call
}

_CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Rome", "Delhi", "Quito", "Seoul", "Berlin")
_CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CHF", "INR")
# Round numbers from a short list: a 2-layer model copies them after a few hundred warm-up steps
# (arbitrary 2-digit numbers were still miscopied after 400), so the errors left are the habits.
_AMOUNTS = (5, 10, 15, 20, 25, 50, 75, 90)
_MINUTES = (5, 10, 15, 20, 30, 40, 45, 60)


def system_prompt() -> str:
    """The tool list of the system turn: ``name(param, ...)``, types only for the integers."""
    signatures = [
        tool["name"]
        + "("
        + ", ".join(k if v != "integer" else f"{k}: integer" for k, v in tool["parameters"].items())
        + ")"
        for tool in TOOLS
    ]
    return "Tools: " + "; ".join(signatures)


@dataclass(frozen=True)
class ToolQuery:
    """A user request and its one correct call."""

    query: str
    name: str
    arguments: dict[str, Any]

    def ground_truth(self) -> list[dict[str, Any]]:
        return [{"name": self.name, "arguments": self.arguments}]

    def answer(self, flaw: str | None = None) -> str:
        """The reference response (``flaw`` None), or one with a habit from `FLAWS`."""
        arguments = dict(self.arguments)
        if flaw == "float":
            arguments = {k: float(v) if type(v) is int else v for k, v in arguments.items()}
        elif flaw == "extra":
            arguments["lang"] = "en"
        elif flaw not in (None, "inline"):
            raise ValueError(f"flaw must be None or one of {sorted(set(FLAWS.values()))}")
        call = json.dumps({"name": self.name, "arguments": arguments})
        block = (
            f"<tool_call>{call}</tool_call>"
            if flaw == "inline"
            else (f"<tool_call>\n{call}\n</tool_call>")
        )
        return f"<think>use {self.name}</think>\n{block}"


_TEMPLATES = {
    "get_weather": (
        "What is the weather in {c} in {u}?",
        "Weather for {c}, in {u} please.",
        "How warm is {c}? Answer in {u}.",
        "Tell me the {u} temperature in {c}.",
    ),
    "convert_currency": (
        "Convert {a} {s} to {t}.",
        "How much is {a} {s} in {t}?",
        "Change {a} {s} into {t}.",
        "What are {a} {s} worth in {t}?",
    ),
    "set_timer": (
        "Set a timer for {m} minutes.",
        "Start a {m} minute timer.",
        "Remind me in {m} minutes.",
        "Timer: {m} minutes, please.",
    ),
}


def make_queries(count: int, seed: int) -> list[ToolQuery]:
    """`count` deterministic queries spread over the tools (the same text may repeat)."""
    rng = random.Random(f"entropyrl-fc-{seed}")
    out = []
    for k in range(count):
        kind = k % 3
        if kind == 0:
            city, unit = rng.choice(_CITIES), rng.choice(("celsius", "fahrenheit"))
            query = rng.choice(_TEMPLATES["get_weather"]).format(c=city, u=unit)
            out.append(ToolQuery(query, "get_weather", {"city": city, "unit": unit}))
        elif kind == 1:
            amount = rng.choice(_AMOUNTS)
            source, target = rng.sample(_CURRENCIES, 2)
            query = rng.choice(_TEMPLATES["convert_currency"]).format(a=amount, s=source, t=target)
            out.append(
                ToolQuery(
                    query,
                    "convert_currency",
                    {"amount": amount, "source": source, "target": target},
                )
            )
        else:
            minutes = rng.choice(_MINUTES)
            query = rng.choice(_TEMPLATES["set_timer"]).format(m=minutes)
            out.append(ToolQuery(query, "set_timer", {"minutes": minutes}))
    return out


def is_held_out(query: ToolQuery) -> bool:
    """One request text in five (by a hash of the text) is only ever used for evaluation."""
    digest = hashlib.sha1(query.query.encode("utf-8")).digest()
    return digest[0] % 5 == 0


def split_queries(
    num_train: int, num_test: int, seed: int
) -> tuple[list[ToolQuery], list[ToolQuery]]:
    """Training queries (repeats allowed) and distinct held-out ones, no text in both.

    The held-out set takes the tools in turn, so each is evaluated about equally often.
    """
    pool = make_queries(max(3 * (num_train + num_test), 600), seed)
    train = [q for q in pool if not is_held_out(q)][:num_train]
    by_tool: dict[str, list[ToolQuery]] = {name: [] for name in FLAWS}
    distinct = {q.query: q for q in pool if is_held_out(q)}
    for query in distinct.values():
        by_tool[query.name].append(query)
    test: list[ToolQuery] = []
    while len(test) < num_test and any(by_tool.values()):
        for queue in by_tool.values():
            if queue and len(test) < num_test:
                test.append(queue.pop(0))
    return train, test


class FunctionCallingTask:
    """Prompts (left-padded), strict binary rewards and greedy evaluation; items are queries.

    ``noise_rate`` is the share of warm-up demonstrations that carry their tool's habit.
    """

    def __init__(
        self,
        tokenizer: Any,
        train: list[ToolQuery],
        test: list[ToolQuery],
        *,
        noise_rate: float = 0.0,
    ) -> None:
        if not 0.0 <= noise_rate <= 1.0:
            raise ValueError(f"noise_rate must be in [0, 1], got {noise_rate}")
        self.tokenizer = tokenizer
        self.train_ids = list(range(len(train)))
        self.train = train
        self.test = test
        self.noise_rate = noise_rate
        self._prompt_cache: dict[str, list[int]] = {}
        self._system = system_prompt()

    def _prompt_ids(self, query: ToolQuery) -> list[int]:
        if query.query not in self._prompt_cache:
            text = self.tokenizer.apply_chat_template(
                [
                    {"role": "system", "content": self._system},
                    {"role": "user", "content": query.query},
                ],
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

    def reward(
        self, texts: Sequence[str], items: Sequence[Any], responses: Any = None
    ) -> RewardOutput:
        """Strict tool-call scores; `responses` is unused (no token positions here)."""
        from entropyrl.rewards.function_calling import FunctionCallingScorer

        queries = self._queries(items)
        truths = [q.ground_truth() for q in queries]
        scored = FunctionCallingScorer().score_batch(list(texts), truths, [None] * len(truths))
        scores = np.array([s.score for s in scored], dtype=np.float64)
        metrics = {
            "accuracy": float(scores.mean()),
            "format_ok": float(np.mean([s["format_ok"] for s in scored])),
        }
        for tool in FLAWS:
            picked = [s for s, q in zip(scores, queries) if q.name == tool]
            if picked:
                metrics[f"accuracy/{tool}"] = float(np.mean(picked))
        return RewardOutput(scores=scores, chair_i=None, metrics=metrics)

    def warmup_answer(self, query: ToolQuery, rng: random.Random) -> str:
        """A demonstration: the reference, or with probability `noise_rate` the tool's habit."""
        return query.answer(FLAWS[query.name] if rng.random() < self.noise_rate else None)

    def warmup_batch(self, rng: random.Random, size: int) -> tuple[list[int], list[list[int]]]:
        ids = [rng.choice(self.train_ids) for _ in range(size)]
        eos = self.tokenizer.eos_token_id
        targets = [
            [*self.tokenizer.encode(self.warmup_answer(self.train[i], rng)), eos] for i in ids
        ]
        return ids, targets

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
    ("entropy", "rollout entropy (last 10 steps)"),
    ("bonus_mean", "EGPO bonus mean"),
    ("bonus_clip_frac", "EGPO bonus capped"),
    ("train_seconds", "train s"),
)


def _tail_mean(history: Sequence[dict[str, float]], key: str, last: int = 10) -> float:
    values = [h[key] for h in history[-last:] if key in h]
    return float(np.mean(values)) if values else float("nan")


def rl_summary(history: Sequence[dict[str, float]]) -> dict[str, float]:
    """Means over an RL run: rollout entropy (first and last 10 steps), reward, EGPO bonus."""

    def mean(key: str) -> float:
        values = [h[key] for h in history if key in h]
        return float(np.mean(values)) if values else float("nan")

    return {
        "entropy_first": float(np.mean([h["entropy"] for h in history[:10]]))
        if history
        else float("nan"),
        "entropy_last": _tail_mean(history, "entropy"),
        "reward_mean": mean("reward"),
        "reward_last": _tail_mean(history, "reward"),
        "bonus_mean": mean("egpo/bonus/mean"),
        "bonus_clip_frac": mean("egpo/bonus/clip_frac"),
        "seq_entropy_mean": mean("egpo/entropy/seq_mean"),
    }


def build_function_calling(cfg: DemoConfig) -> tuple[Any, FunctionCallingTask]:
    """The demo's model (a tiny Qwen2 built from `cfg`'s seed, or `--model`) on its device, and
    its task; raises `cfg.max_new_tokens` to fit the longest answer."""
    from entropyrl.models.loading import load_pretrained, pick_device
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2, seed_everything
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
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
    train, test = split_queries(cfg.num_train, cfg.num_test, cfg.seed)
    queries = train + test
    task = FunctionCallingTask(tokenizer, train, test, noise_rate=cfg.noise_rate)
    longest = max(len(tokenizer.encode(q.answer(FLAWS[q.name]))) for q in queries[:50])
    max_tokens = max(len(tokenizer.encode(q.answer())) for q in queries) + 4
    cfg.max_new_tokens = max(cfg.max_new_tokens, longest + 4, max_tokens)
    return model, task


def run_function_calling_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Warm-up, then each variant (`--compare`, default grpo,egpo) from the same checkpoint."""
    if not cfg.compare:
        cfg.compare = "grpo,egpo"
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(out / "metrics.jsonl")
    started = time.perf_counter()
    model, task = build_function_calling(cfg)
    warm = warm_up_or_load(model, task, cfg, seed=cfg.seed, log=log, task_name="function-calling")
    if warm["cached"]:
        print(f"warm-up: {warmup_source(warm)}", flush=True)
    set_position("the held-out evaluation after warm-up")
    before, before_records = task.evaluate(model, max_new_tokens=cfg.max_new_tokens)
    log.write("eval", 0, before, variant="warm-up")
    rows = [_row("after warm-up", before, {}, warm["seconds"])]
    checkpoint = {k: v.detach().clone() for k, v in model.state_dict().items()}
    results: dict[str, Any] = {}
    for variant in cfg.variants():  # same seed, data and checkpoint
        model.load_state_dict(checkpoint)
        rl = run_rl(model, task, cfg, variant, seed=cfg.seed, log=log)
        set_position(f"the held-out evaluation after {variant}")
        after, records = task.evaluate(model, max_new_tokens=cfg.max_new_tokens)
        log.write("eval", cfg.steps, after, variant=variant)
        stats = rl_summary(rl["history"])
        rows.append(_row(f"after RL: {variant}", after, stats, rl["seconds"]))
        results[variant] = {
            "eval": after,
            "rl": stats,
            "seconds": rl["seconds"],
            "samples": records[:5],
        }
    model.load_state_dict(checkpoint)
    set_position("writing summary.md and curves.png")
    table = markdown_table(rows, FC_COLUMNS)
    summary = {
        "task": "function-calling",
        "settings": {
            "seed": cfg.seed,
            "steps": cfg.steps,
            "warmup_steps": cfg.warmup_steps,
            "lr": cfg.lr,
            "noise_rate": cfg.noise_rate,
            "num_train": cfg.num_train,
            "num_test": cfg.num_test,
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
            Curve(("reward",), "strict reward (train samples)", "reward (0 or 1)"),
            Curve(("format_ok",), "format ok (train samples)", "format ok (%)", 100.0),
            Curve(("entropy",), "token entropy (sampling temperature)", "nats per token"),
            Curve(("response_length",), "response length", "tokens"),
            Curve(("adv_abs_mean",), "|advantage| (mean)", "|advantage|"),
            Curve(("egpo/bonus/mean",), "EGPO bonus (mean)", "bonus"),
        ),
        held_out=(
            HeldOut("accuracy", "accuracy", 100.0, " %"),
            HeldOut("format_ok", "format ok", 100.0, " %"),
        ),
    )
    print(table)
    return summary


def _row(
    stage: str, metrics: dict[str, float], stats: dict[str, float], seconds: float
) -> dict[str, Any]:
    return {
        "stage": stage,
        "accuracy_pct": 100 * metrics["accuracy"],
        "format_pct": 100 * metrics["format_ok"],
        "entropy": stats.get("entropy_last", float("nan")),
        "bonus_mean": stats.get("bonus_mean", float("nan")),
        "bonus_clip_frac": stats.get("bonus_clip_frac", float("nan")),
        "train_seconds": seconds,
    }
