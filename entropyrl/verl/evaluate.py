"""Function-calling evaluation after verl training: generate, score strictly, tabulate.

    python -m entropyrl.verl.evaluate generate --model HF_DIR --data test.parquet --out gen.jsonl
    python -m entropyrl.verl.evaluate score --generations gen.jsonl --out result.json
    python -m entropyrl.verl.evaluate table --result GRPO=grpo.json --result EGPO=egpo.json

`generate` needs vLLM and a GPU (greedy decoding, the chat template of the merged model); `score`
and `table` are plain Python. Scores use the same strict binary reward as training, so a row is
correct only with `<think>...</think>` followed by exactly the expected calls.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not JSON ({error})") from error
    return rows


def score_rows(rows: Iterable[Mapping[str, Any]], *, name: str = "") -> dict[str, Any]:
    """Strict accuracy overall and per `data_source` (e.g. one BFCL category per source).

    Each row needs `response` and `ground_truth`; `data_source` defaults to "all".
    """
    from entropyrl.rewards.function_calling import compute_score

    correct: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for number, row in enumerate(rows, 1):
        for field in ("response", "ground_truth"):
            if field not in row:
                raise ValueError(f"generation row {number} has no field {field!r}")
        source = str(row.get("data_source") or "all")
        score = float(compute_score(row["response"], row["ground_truth"]))
        total[source] += 1
        correct[source] += int(score == 1.0)
    n = sum(total.values())
    return {
        "name": name,
        "n": n,
        "accuracy": sum(correct.values()) / n if n else float("nan"),
        "by_source": {
            source: {"n": total[source], "accuracy": correct[source] / total[source]}
            for source in sorted(total)
        },
    }


def comparison_table(results: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Markdown table: one row per evaluation set, one accuracy column per run (in %)."""
    sources = sorted({source for _, result in results for source in result["by_source"]})
    header = "| eval set | n | " + " | ".join(name for name, _ in results) + " |"
    rule = "|---|---:|" + "---:|" * len(results)
    lines = [header, rule]
    for source in [*sources, "overall"]:
        cells, counts = [], set()
        for _, result in results:
            entry = result if source == "overall" else result["by_source"].get(source)
            if entry is None:
                cells.append("-")
                continue
            counts.add(entry["n"])
            cells.append(f"{100 * entry['accuracy']:.2f}")
        count = "/".join(str(c) for c in sorted(counts)) or "-"
        label = f"**{source}**" if source == "overall" else source
        lines.append(f"| {label} | {count} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def generate(
    model: str,
    data: str,
    out: str,
    *,
    max_new_tokens: int,
    tensor_parallel_size: int,
    max_model_len: int | None,
) -> int:
    """Greedy generations for every row of a verl parquet (needs vLLM); returns the row count."""
    import pyarrow.parquet as pq

    try:
        from vllm import LLM, SamplingParams
    except ImportError as error:
        raise SystemExit(
            f"generate needs vLLM on a GPU machine (pip install 'verl[vllm]'): {error}"
        ) from error
    table = pq.read_table(data).to_pylist()
    for field in ("prompt", "reward_model"):
        if table and field not in table[0]:
            raise SystemExit(
                f"{data}: rows have no {field!r} column (write it with entropyrl prepare fc)"
            )
    llm = LLM(model=model, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len)
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template(
            list(row["prompt"]), tokenize=False, add_generation_prompt=True
        )
        for row in table
    ]
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, skip_special_tokens=True)
    outputs = llm.generate(prompts, params)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for row, output in zip(table, outputs):
            record = {
                "data_source": row.get("data_source"),
                "index": (row.get("extra_info") or {}).get("index"),
                "ground_truth": row["reward_model"]["ground_truth"],
                "response": output.outputs[0].text,
            }
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m entropyrl.verl.evaluate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="greedy generations with vLLM")
    gen.add_argument("--model", required=True, help="merged Hugging Face model folder")
    gen.add_argument("--data", required=True, help="parquet from entropyrl prepare fc")
    gen.add_argument("--out", required=True, help="output JSON lines")
    gen.add_argument("--max-new-tokens", type=int, default=8192)
    gen.add_argument("--tensor-parallel-size", type=int, default=1)
    gen.add_argument("--max-model-len", type=int, default=None)
    score = commands.add_parser("score", help="strict accuracy of generations")
    score.add_argument("--generations", required=True, nargs="+", help="JSON lines files")
    score.add_argument("--name", default="")
    score.add_argument("--out", required=True, help="result JSON")
    table = commands.add_parser("table", help="markdown comparison of result files")
    table.add_argument("--result", action="append", required=True, metavar="NAME=FILE")
    table.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args(argv)

    if args.command == "generate":
        n = generate(
            args.model,
            args.data,
            args.out,
            max_new_tokens=args.max_new_tokens,
            tensor_parallel_size=args.tensor_parallel_size,
            max_model_len=args.max_model_len,
        )
        print(f"{n} generations -> {args.out}")
    elif args.command == "score":
        rows = [row for path in args.generations for row in read_jsonl(path)]
        result = score_rows(rows, name=args.name)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"{args.name or 'run'}: {100 * result['accuracy']:.2f}% of {result['n']}")
    else:
        results = []
        for spec in args.result:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                parser.error(f"--result must be NAME=FILE, got {spec!r}")
            results.append((name, json.loads(Path(path).read_text())))
        text = comparison_table(results)
        if args.out:
            Path(args.out).write_text(text)
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
