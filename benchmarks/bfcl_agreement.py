"""Strict reward vs BFCL's checker on BFCL's shipped AST entries: where they agree, and where not.

    python benchmarks/bfcl_agreement.py                                   # every Python AST entry
    python benchmarks/bfcl_agreement.py --categories simple_python --max-entries 5   # smoke run

Each entry of BFCL's Python AST categories (the data files bfcl-eval ships) goes the training
path: `entropyrl prepare fc --format bfcl` converts the category file (`prepare_function_calling`,
every row, no test split), pandas reads the parquet back, and the row's `reward_model.ground_truth`
and `extra_info` are what the reward sees. Candidates are rendered in Qwen's template layout from
BFCL's own possible answer: the first acceptable value of every parameter, then mutations of it
(int <-> float at each nesting depth, one leaf or all, optional and required parameters omitted,
wrong values, bool <-> int, numbers as strings, None, empty lists, an extra parameter, strings
with their case changed, another acceptable value). BFCL's verdict is `bfcl_verdict` (BFCL's Qwen
FC decoder and `ast_checker`); the strict reward is scored three ways:

- the row (verl's path): `function_calling_score` with the row's ground truth and extra_info;
- BFCL's unmodified answer + the row's tools: `compute_score` with BFCL's possible answer as
  shipped and the row's tools (the reward applies the schema's `required` itself);
- the row's ground truth, no schema: `compute_score` with the row's ground truth alone.

"reward 1, BFCL 0" must be 0 in every mode: the strict reward is never looser than BFCL's checker.
"reward 0, BFCL 1" is where it is stricter by design; the breakdown by mutation says why. Java
and JavaScript are left out: there BFCL wants source-code strings ("5", "true") where the strict
reward wants JSON values, so the two cannot agree on any number or boolean.

Needs the `bfcl` extra and bfcl-eval (see the README). Deterministic: mutations are drawn from a
generator seeded with the entry id and `--seed`.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PYTHON_AST_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
ROW, RAW, NO_SCHEMA = (
    "the row (verl's path)",
    "BFCL's unmodified answer + the row's tools",
    "the row's ground truth, no schema",
)
MODES = (ROW, RAW, NO_SCHEMA)


def default_data_dir() -> Path:
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent / "data"


# ---------------------------------------------------------------------------- candidates
def render(calls: list[dict[str, Any]]) -> str:
    """A response in the layout both judges read: reasoning, then one template block per call."""
    blocks = [
        f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>" for call in calls
    ]
    return "<think>\nThe user asks for this.\n</think>\n\n" + "\n".join(blocks)


def _first(values: list[Any]) -> tuple[bool, Any]:
    for value in values:
        if value != "":
            return True, value
    return False, None


def _from_pattern(pattern: dict[str, list[Any]]) -> dict[str, Any]:
    """A dict value from BFCL's ``{key: [acceptable values]}`` pattern: first value per key."""
    out = {}
    for key, values in pattern.items():
        found, value = _first(values)
        if found:
            out[key] = value
    return out


def _is_pattern(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, list) for v in value.values())


def _concrete(value: Any) -> Any:
    """What a model writes for an acceptable value (patterns become their first values)."""
    if _is_pattern(value):
        return _from_pattern(value)
    if isinstance(value, list) and value and all(_is_pattern(item) for item in value):
        return [_from_pattern(item) for item in value]
    return value


def correct_calls(possible_answer: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's first acceptable value of every parameter (those only omittable are omitted)."""
    calls = []
    for entry in possible_answer:
        ((name, params),) = entry.items()
        arguments = {}
        for param, values in params.items():
            found, value = _first(values)
            if found:
                arguments[param] = _concrete(value)
        calls.append({"name": name, "arguments": arguments})
    return calls


def _numbers(value: Any, path: tuple = (), depth: int = 0) -> Iterator[tuple[tuple, int, Any]]:
    """(path, depth, number) of every int/float leaf; depth 1 is a call's argument itself."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield path, depth, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, (*path, key), depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _numbers(item, (*path, index), depth + 1)


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value


def _set(calls: list[dict[str, Any]], path: tuple, new: Any) -> list[dict[str, Any]]:
    """A copy of ``calls`` with the value at ``path`` (call index, "arguments", ...) replaced."""
    changed = copy.deepcopy(calls)
    target = changed
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return changed


def _swap_number(value: int | float) -> int | float | None:
    """int -> float of the same value, integral float -> int; None when the swap changes it."""
    if isinstance(value, int):
        return float(value)
    return int(value) if value.is_integer() else None


def mutation_kind(label: str) -> str:
    """The label without the parameter or the "every"/"one" number part, for the breakdown."""
    kind = label.split(":")[0]
    return kind.removesuffix(", every number").removesuffix(", one number")


def _wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "zq"
    if value is None:
        return "none"
    return "zq"


def mutations(
    calls: list[dict[str, Any]], possible_answer: list[dict[str, Any]], rng: random.Random
) -> dict[str, list[dict[str, Any]]]:
    """The correct calls and the mutations of them, by label (labels name the kind)."""
    out = {"correct": calls}
    numbers = [
        ((c, "arguments", *path), depth, number)
        for c, call in enumerate(calls)
        for path, depth, number in _numbers(call["arguments"])
    ]
    for depth in sorted({depth for _, depth, _ in numbers}):
        for direction, kind in (("int -> float", int), ("float -> int", float)):
            at_depth = [
                (path, number)
                for path, d, number in numbers
                if d == depth and isinstance(number, kind) and _swap_number(number) is not None
            ]
            if not at_depth:
                continue
            every = calls
            for path, number in at_depth:
                every = _set(every, path, _swap_number(number))
            out[f"{direction}, depth {depth}, every number"] = every
            path, number = rng.choice(at_depth)
            out[f"{direction}, depth {depth}, one number"] = _set(calls, path, _swap_number(number))
    for c, (call, entry) in enumerate(zip(calls, possible_answer)):
        ((_, params),) = entry.items()
        for param, values in params.items():
            if param not in call["arguments"]:
                continue
            omitted = copy.deepcopy(calls)
            del omitted[c]["arguments"][param]
            kind = "omitted, marked optional" if "" in values else "omitted, not optional"
            out[f"{kind}: {c}.{param}"] = omitted  # each parameter: required ones among them
            others = [v for v in values if v != ""][1:]
            if others:
                out.setdefault(
                    "another acceptable value",
                    _set(calls, (c, "arguments", param), _concrete(others[-1])),
                )
    optional = copy.deepcopy(calls)
    for call, entry in zip(optional, possible_answer):
        ((_, params),) = entry.items()
        for param, values in params.items():
            if "" in values:
                call["arguments"].pop(param, None)
    if optional != calls:
        out["every optional omitted"] = optional
    leaves = [
        ((c, "arguments", *path), leaf)
        for c, call in enumerate(calls)
        for path, leaf in _leaves(call["arguments"])
        if path
    ]
    if leaves:
        path, leaf = rng.choice(leaves)
        out["wrong value"] = _set(calls, path, _wrong(leaf))
        out["None"] = _set(calls, path, None)
        path = path[:3]  # the argument itself
        out["None argument"] = _set(calls, path, None)
    booleans = [(path, leaf) for path, leaf in leaves if isinstance(leaf, bool)]
    if booleans:
        path, leaf = rng.choice(booleans)
        out["bool -> int"] = _set(calls, path, int(leaf))
    ints = [(path, n) for path, _, n in numbers if isinstance(n, int) and n in (0, 1)]
    if ints:
        path, number = rng.choice(ints)
        out["int -> bool"] = _set(calls, path, bool(number))
    if numbers:
        path, _, number = rng.choice(numbers)
        out["number as string"] = _set(calls, path, str(number))
    strings = [(path, leaf) for path, leaf in leaves if isinstance(leaf, str) and leaf.strip()]
    if strings:
        path, leaf = rng.choice(strings)
        if leaf.swapcase() != leaf:
            out["string case changed"] = _set(calls, path, leaf.swapcase())
        try:
            number = float(leaf)
        except ValueError:
            pass
        else:
            out["numeric string as number"] = _set(calls, path, number)
    lists = [
        ((c, "arguments", param), value)
        for c, call in enumerate(calls)
        for param, value in call["arguments"].items()
        if isinstance(value, list) and value
    ]
    if lists:
        path, _ = rng.choice(lists)
        out["empty list"] = _set(calls, path, [])
    if calls:
        c = rng.randrange(len(calls))
        out["extra parameter"] = _set(calls, (c, "arguments", "zz_extra"), 1)
    return out


# ---------------------------------------------------------------------------- the measurement
def _category_rows(data_dir: Path, category: str, max_entries: int | None, work: Path):
    """The category converted by `entropyrl prepare fc --format bfcl`, read back with pandas."""
    import pandas as pd

    from entropyrl.data.function_calling import prepare_function_calling

    source = data_dir / f"BFCL_v4_{category}.json"
    answers = data_dir / "possible_answer" / source.name
    if max_entries is not None:
        lines = [line for line in source.read_text().splitlines() if line.strip()]
        source = work / category / source.name
        source.parent.mkdir(parents=True)
        source.write_text("\n".join(lines[:max_entries]) + "\n")
    summary = prepare_function_calling(
        source,
        work / category / "out",
        fmt="bfcl",
        answers_path=answers,
        max_samples=None,
        test_size=0,
    )
    frame = pd.read_parquet(summary["outputs"]["train"])
    return frame.to_dict("records"), summary


def measure(data_dir: Path, categories: list[str], max_entries: int | None, seed: int) -> dict:
    from entropyrl.rewards.function_calling import bfcl_verdict, compute_score
    from entropyrl.verl.rewards import function_calling_score

    counts = {mode: Counter() for mode in MODES}
    stricter = {mode: Counter() for mode in MODES}
    looser: dict[str, list[str]] = {mode: [] for mode in MODES}
    unwinnable: list[str] = []
    entries = 0
    converter_rejects: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bfcl-agreement-") as tmp:
        for category in categories:
            rows, summary = _category_rows(data_dir, category, max_entries, Path(tmp))
            converter_rejects += [line.rsplit("/", 1)[-1] for line in summary["first_rejects"]]
            for row in rows:
                extra_info = row["extra_info"]
                ground_truth = row["reward_model"]["ground_truth"]
                entry = json.loads(extra_info["bfcl"])
                answer = entry["possible_answer"]
                entries += 1
                rng = random.Random(f"{seed}-{entry['id']}")
                for label, calls in mutations(correct_calls(answer), answer, rng).items():
                    text = render(calls)
                    bfcl_ok = bfcl_verdict(text, entry, answer, category)
                    scores = {
                        ROW: function_calling_score("bfcl", text, ground_truth, extra_info)[
                            "score"
                        ],
                        RAW: compute_score(text, answer, {"tools": extra_info["tools"]}),
                        NO_SCHEMA: compute_score(text, ground_truth),
                    }
                    for mode, score in scores.items():
                        ours = score == 1.0
                        counts[mode][(ours, bfcl_ok)] += 1
                        if ours and not bfcl_ok:
                            looser[mode].append(f"{entry['id']}: {label}")
                        elif bfcl_ok and not ours:
                            stricter[mode][mutation_kind(label)] += 1
                    if label == "correct" and not (bfcl_ok and scores[ROW] == 1.0):
                        unwinnable.append(
                            f"{entry['id']} (BFCL {int(bfcl_ok)}, reward {scores[ROW]:.0f})"
                        )
    return {
        "entries": entries,
        "counts": counts,
        "stricter": stricter,
        "looser": looser,
        "unwinnable": unwinnable,
        "converter_rejects": converter_rejects,
    }


def report(result: dict, command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        f"{result['entries']} entries converted by `entropyrl prepare fc --format bfcl`; "
        f"{sum(result['counts'][ROW].values())} candidates.",
        "",
        "| strict reward given | candidates | both 1 | both 0 | reward 1, BFCL 0 | reward 0, BFCL 1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        c = result["counts"][mode]
        lines.append(
            f"| {mode} | {sum(c.values())} | {c[(True, True)]} | {c[(False, False)]} "
            f"| {c[(True, False)]} | {c[(False, True)]} |"
        )
    lines += ["", f"Reward 0, BFCL 1 by mutation ({ROW}):", ""]
    lines += ["| mutation | candidates |", "|---|---:|"]
    for label, n in sorted(result["stricter"][ROW].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {label} | {n} |")
    for mode in MODES:
        if result["looser"][mode]:
            shown = ", ".join(result["looser"][mode][:10])
            lines += ["", f"REWARD LOOSER THAN BFCL ({mode}): {shown}"]
    lines += [
        "",
        f"Correct answers not scored 1 by both: {len(result['unwinnable'])}"
        + (f" ({', '.join(result['unwinnable'][:10])})" if result["unwinnable"] else ""),
        f"Rows the converter rejected: {len(result['converter_rejects'])}"
        + (
            f" ({'; '.join(result['converter_rejects'][:10])})"
            if result["converter_rejects"]
            else ""
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="BFCL's data folder")
    parser.add_argument(
        "--categories",
        nargs="+",
        default=list(PYTHON_AST_CATEGORIES),
        choices=PYTHON_AST_CATEGORIES,
    )
    parser.add_argument("--max-entries", type=int, default=None, help="first N entries of each")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    result = measure(data_dir, args.categories, args.max_entries, args.seed)
    command = (
        "python benchmarks/bfcl_agreement.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    )
    print(report(result, command))
    return 1 if any(result["looser"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
