"""Function-calling evaluation after verl training: generate, score strictly, tabulate.

    python -m entropyrl.commands.eval.fc generate --model HF_DIR --data test.parquet --out gen.jsonl
    python -m entropyrl.commands.eval.fc score --generations gen.jsonl --out result.json
    python -m entropyrl.commands.eval.fc table --result GRPO=grpo.json --result EGPO=egpo.json
    python -m entropyrl.commands.eval.fc compare --runs grpo egpo --checkpoints DIR \
        --data test.parquet --out eval/function_calling [--bfcl-dir DIR] [--dry-run]

`compare` is the whole comparison (examples/eval_function_calling.sh): for each run, verl's model
merger on its last checkpoint (and `entropyrl.commands.merge_lora` for a LoRA run), `generate` on
the test split and every BFCL category, `score`; then `table`. Each step runs in a process of
its own; `--dry-run` prints the steps instead.

`generate` needs vLLM and a GPU (greedy decoding, the chat template of the merged model); `score`
and `table` are plain Python. Two accuracies are reported:

- strict: the binary reward of training (`FunctionCallingScorer`): `<think>...</think>`, then
  exactly the expected calls in Qwen's `<tool_call>\n{...}\n</tool_call>` layout, values exact;
- BFCL: for rows converted from BFCL (`entropyrl prepare fc --format bfcl` keeps BFCL's entry), the
  verdict of BFCL's own checker on the same generation (`bfcl_verdict`: BFCL's Qwen FC decoder,
  then `ast_checker`), which lower-cases strings, ignores spaces and `,./-_*^` in them and needs
  no reasoning block. Needs the `bfcl` extra; without it the BFCL column is left out with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from entropyrl.core.files import json_dumps, write_json


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


def _bfcl_entry(row: Mapping[str, Any], number: int) -> dict[str, Any] | None:
    """BFCL's entry kept by the converter (a JSON string or a mapping), or None."""
    entry = row.get("bfcl")
    if entry is None:
        return None
    if isinstance(entry, str):
        try:
            entry = json.loads(entry)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"generation row {number}: field 'bfcl' is not JSON ({error})"
            ) from None
    if not isinstance(entry, Mapping) or not {"category", "function"} <= set(entry):
        raise ValueError(f"generation row {number}: field 'bfcl' needs 'category' and 'function'")
    return dict(entry)


def bfcl_available() -> tuple[bool, str]:
    """Whether BFCL's checker imports here, and why not."""
    from entropyrl.rewards.function_calling import bfcl_checker

    try:
        bfcl_checker()
    except ImportError as error:
        return False, str(error)
    return True, ""


def score_rows(
    rows: Iterable[Mapping[str, Any]], *, name: str = "", bfcl: str = "auto"
) -> dict[str, Any]:
    """Strict accuracy, and BFCL accuracy where rows carry BFCL's entry, overall and per source.

    Each row needs `response` and `ground_truth`; `data_source` defaults to "all"; `bfcl` is
    BFCL's entry as `entropyrl prepare fc --format bfcl` keeps it. `bfcl`: "auto" scores BFCL
    accuracy when the checker is installed (else a note says why not), "require" makes a missing
    checker an error, "off" skips it.
    """
    from entropyrl.rewards.function_calling import FunctionCallingScorer, bfcl_verdict

    if bfcl not in ("auto", "require", "off"):
        raise ValueError(f"bfcl must be auto, require or off, got {bfcl!r}")
    rows = list(rows)
    entries = [_bfcl_entry(row, number) for number, row in enumerate(rows, 1)]
    use_bfcl, note = bfcl != "off" and any(e is not None for e in entries), ""
    if use_bfcl:
        use_bfcl, note = bfcl_available()
        if not use_bfcl and bfcl == "require":
            raise SystemExit(note)
    correct: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    bfcl_correct: dict[str, int] = defaultdict(int)
    bfcl_total: dict[str, int] = defaultdict(int)
    for number, row in enumerate(rows, 1):
        for field in ("response", "ground_truth"):
            if field not in row:
                raise ValueError(f"generation row {number} has no field {field!r}")
    strict = FunctionCallingScorer().score_batch(
        [row["response"] for row in rows],
        [row["ground_truth"] for row in rows],
        # The row's tool schema, as the training reward gets it through verl's extra_info.
        [{"tools": row["tools"]} if row.get("tools") else None for row in rows],
    )
    for row, entry, scored in zip(rows, entries, strict):
        source = str(row.get("data_source") or "all")
        total[source] += 1
        correct[source] += int(scored.score == 1.0)
        if use_bfcl and entry is not None:
            verdict = bfcl_verdict(
                row["response"], entry, entry.get("possible_answer"), entry["category"]
            )
            bfcl_total[source] += 1
            bfcl_correct[source] += int(verdict)
    n = sum(total.values())
    result: dict[str, Any] = {
        "name": name,
        "n": n,
        "accuracy": sum(correct.values()) / n if n else float("nan"),
        "by_source": {
            source: {"n": total[source], "accuracy": correct[source] / total[source]}
            for source in sorted(total)
        },
    }
    if bfcl_total:
        n_bfcl = sum(bfcl_total.values())
        result["bfcl"] = {
            "n": n_bfcl,
            "accuracy": sum(bfcl_correct.values()) / n_bfcl,
            "by_source": {
                source: {"n": bfcl_total[source], "accuracy": bfcl_correct[source] / count}
                for source, count in sorted(bfcl_total.items())
            },
        }
    if note:
        result["bfcl_note"] = f"BFCL accuracy not computed: {note}"
    return result


def comparison_table(results: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Markdown: strict accuracy per evaluation set and run (in %), then, where any run has it,
    the same table of BFCL accuracy (BFCL's own checker, BFCL rows only)."""
    text = _accuracy_table(results)
    with_bfcl = [(name, result["bfcl"]) for name, result in results if result.get("bfcl")]
    if with_bfcl:
        text += "\nBFCL accuracy (BFCL's own checker on the same generations, BFCL rows only):\n\n"
        text += _accuracy_table(with_bfcl)
    return text


def _accuracy_table(results: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
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
            extra = row.get("extra_info") or {}
            record = {
                "data_source": row.get("data_source"),
                "index": extra.get("index"),
                "ground_truth": row["reward_model"]["ground_truth"],
                "response": output.outputs[0].text,
            }
            if extra.get("tools"):
                record["tools"] = extra["tools"]  # the schema the strict reward follows
            if extra.get("bfcl"):
                record["bfcl"] = extra["bfcl"]  # BFCL's entry, for BFCL's checker
            handle.write(json_dumps(record, ensure_ascii=False) + "\n")
    return len(table)


def latest_step(run_dir: Path) -> Path | None:
    """The last `global_step_N` folder of a run (N compared numerically)."""
    steps = [p for p in run_dir.glob("global_step_*") if p.is_dir()]
    steps = [p for p in steps if p.name.rpartition("_")[2].isdigit()]
    return max(steps, key=lambda p: int(p.name.rpartition("_")[2]), default=None)


def evaluation_sets(data: str, bfcl_dir: str | None) -> list[tuple[str, str]]:
    """The held-out split (`test`), then each BFCL category of `bfcl_dir`: `<category>.parquet`
    or `<category>/test.parquet`."""
    sets = [("test", data)]
    if bfcl_dir:
        folder = Path(bfcl_dir)
        for parquet in [*sorted(folder.glob("*.parquet")), *sorted(folder.glob("*/test.parquet"))]:
            name = parquet.parent.name if parquet.stem == "test" else parquet.stem
            sets.append((name, str(parquet)))
    return sets


def comparison_steps(args: argparse.Namespace) -> list[list[str]]:
    """The commands of `compare`, in order (a missing checkpoint: `SystemExit(2)`, or a note and
    a placeholder in a dry run)."""
    python, out, checkpoints = args.python, Path(args.out), Path(args.checkpoints)
    evaluate = [python, "-m", "entropyrl.commands.eval.fc"]
    if args.bfcl_dir and not Path(args.bfcl_dir).is_dir():
        _problem(args, f"BFCL_DIR={args.bfcl_dir} is not a folder")
    sets = evaluation_sets(args.data, args.bfcl_dir)
    steps: list[list[str]] = []
    results: list[str] = []
    for run in args.runs:
        run_dir = checkpoints / f"{run}_function_calling"
        step = latest_step(run_dir)
        if step is None:
            _problem(
                args,
                f"no checkpoint under {run_dir} (train with examples/{run}_function_calling.sh, "
                "trainer.save_freq > 0)",
            )
            step = run_dir / "global_step_N"
        model = out / run / "hf"
        merge = ["merge", "--backend", "fsdp", "--local_dir", str(step / "actor")]
        steps.append([python, "-m", "verl.model_merger", *merge, "--target_dir", str(model)])
        if (step / "actor" / "lora_train_meta.json").is_file():
            # a LoRA run: the merger wrote the base and model/lora_adapter; evaluate both merged
            merged = ["--out", str(model / "merged")]
            steps.append([python, "-m", "entropyrl.commands.merge_lora", str(model), *merged])
            model = model / "merged"
        generations = []
        for name, data in sets:
            generations.append(str(out / run / f"{name}.jsonl"))
            lengths = ["--max-new-tokens", str(args.max_new_tokens)]
            lengths += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
            generate = ["generate", "--model", str(model), "--data", data]
            steps.append([*evaluate, *generate, "--out", generations[-1], *lengths])
        score = ["score", "--name", run, "--bfcl", args.bfcl, "--generations", *generations]
        steps.append([*evaluate, *score, "--out", str(out / run / "result.json")])
        results += ["--result", f"{run.upper()}={out / run / 'result.json'}"]
    table = [*evaluate, "table", *results]
    return [*steps, [*table, "--out", str(out / "table.md")]]


def _problem(args: argparse.Namespace, line: str) -> None:
    if args.dry_run:
        print(f"# dry-run: prerequisite not met: {line}", file=sys.stderr)
        return
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(2)


def compare(args: argparse.Namespace) -> int:
    """Run (or, in a dry run, print) the steps of the comparison; stop at the first failure."""
    import shlex
    import subprocess

    for step in comparison_steps(args):
        if args.dry_run:
            print(shlex.join(step), flush=True)
            continue
        status = subprocess.run(step).returncode
        if status != 0:
            return status
    return 0


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m entropyrl.commands.eval.fc"
) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
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
    score.add_argument(
        "--bfcl",
        choices=("auto", "require", "off"),
        default="auto",
        help="BFCL accuracy of BFCL rows with BFCL's checker: auto = when installed (default)",
    )
    table = commands.add_parser("table", help="markdown comparison of result files")
    table.add_argument("--result", action="append", required=True, metavar="NAME=FILE")
    table.add_argument("--out", default=None, help="also write the table here")
    both = commands.add_parser(
        "compare",
        help="merge each run's last checkpoint, generate, score and tabulate (the whole comparison)",
    )
    both.add_argument(
        "--runs", nargs="+", required=True, help="runs: CHECKPOINTS/<run>_function_calling"
    )
    both.add_argument("--checkpoints", required=True, help="verl's checkpoint root of the runs")
    both.add_argument("--data", required=True, help="the held-out parquet (entropyrl prepare fc)")
    both.add_argument(
        "--bfcl-dir",
        default="",
        help="folder of BFCL category parquets (<category>.parquet or <category>/test.parquet)",
    )
    both.add_argument("--out", required=True, help="results: merged models, generations, table.md")
    both.add_argument(
        "--max-new-tokens", type=int, default=8192, help="generation length (default 8192)"
    )
    both.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM's (default 1)")
    both.add_argument(
        "--bfcl",
        choices=("auto", "require", "off"),
        default="auto",
        help="BFCL accuracy: auto = when installed (default)",
    )
    both.add_argument(
        "--python",
        default=os.environ.get("PYTHON") or "python3",
        help="interpreter of each step (default: $PYTHON, else python3)",
    )
    both.add_argument("--dry-run", action="store_true", help="print the steps instead")
    args = parser.parse_args(argv)

    if args.command == "compare":
        return compare(args)
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
        result = score_rows(rows, name=args.name, bfcl=args.bfcl)
        write_json(result, args.out, indent=2)
        line = f"{args.name or 'run'}: strict {100 * result['accuracy']:.2f}% of {result['n']}"
        if result.get("bfcl"):
            line += f"; BFCL {100 * result['bfcl']['accuracy']:.2f}% of {result['bfcl']['n']}"
        print(line)
        if result.get("bfcl_note"):
            print(result["bfcl_note"], file=sys.stderr)
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
