"""The mutation score of the formulas and contracts users rely on, written to docs/testing.md.

    python tools/mutation.py run [--max-children N] [--group NAME ...] [--module PATH ...]
    python tools/mutation.py report          # the report from the last runs' results

mutmut 3 (`pip install -e '.[mutation]'`) plants one small fault at a time (an operator, a
constant, an argument dropped) into the modules `[tool.mutmut]` of pyproject.toml lists, and
runs the tests that reach the changed function; a mutant no test fails on *survived*. `run`
takes the groups of `[tool.mutmut.groups]` one after another, each in its own copy of the tree
under mutants-work/<group>/ (its modules against its own tests), and gathers their results
under mutants/; a group run again resumes where it stopped (both folders are git-ignored).
`--module` runs one module of its group again (after its tests changed, say): the report then
rewrites that module's rows and keeps every other module's as docs/testing.md has them, each
row with the day its mutants ran.

The report counts, per module, the mutants killed (a test failed or timed out), survived and
reached by no test, and lists every survivor with its changed line and its class:
- `axis`: `dim=-1` read as `dim=+1`, or `unsqueeze(-1)` as `(+1)`, on a two-dimensional tensor,
  where both name the same axis: equivalent;
- `device`: a `device=` argument dropped or set to None: on this CPU-only suite both put the
  tensor on the CPU; the CUDA check (docs/cuda.md) is what sees placement;
- `codec`: an encoding's name in other letters (`"UTF-8"` for `"utf-8"`): Python reads codec
  names case-insensitively, equivalent;
- `dtype`: a `.to(dtype)` or `dtype=` made None or dropped: a no-op where the input already
  has that type, so a test kills it only by passing another (tests/core/test_dtypes.py);
- `wording`: a change inside an error message's text (case, `XX` around it): the tests hold each
  message's key and fix, not every character;
- `open`: none of these; a test should kill it or a line below says why it is equivalent.
The score is killed / (mutants - axis - device - codec - those judged equivalent below); the raw
share killed / mutants beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- mutation:begin -->", "<!-- mutation:end -->"
KILLED = {1, 3, 36, 37, -24, 24, 152, 255}  # a failing test, pytest's error, a timeout, mypy
STATUS = {0: "survived", 5: "no tests", 33: "no tests", None: "not checked"}
EXCLUDED = ("axis", "device", "codec")
CODECS = {"utf-8", "utf8", "ascii"}

# Survivors read and judged equivalent, by mutant name: why no test can tell them apart.
_FAST_PATH = (
    "which of group_index's two paths runs (dense ids below 2 x length + 1024 take the fast "
    "one): both give the same inverse index"
)
_EMPTY_GROUP = "one more, empty, group: every caller gathers per sample or leaves empty groups out"
EQUIVALENT: dict[str, str] = {
    **{f"entropyrl.core._segments.x_group_index__mutmut_{n}": _FAST_PATH for n in range(25, 32)},
    "entropyrl.core._segments.x_group_index__mutmut_33": _EMPTY_GROUP,
    "entropyrl.core._segments.x_group_index__mutmut_42": _EMPTY_GROUP,
}


def fail(message: str) -> None:
    print(f"mutation: {message}", file=sys.stderr)
    raise SystemExit(2)


def status(code: int | None) -> str:
    return "killed" if code in KILLED else STATUS.get(code, "suspicious")


def classify(diff: str) -> str:
    """The class of a mutant from its diff (see the module docstring)."""
    minus = " ".join(
        line[1:]
        for line in diff.splitlines()
        if line.startswith("-") and not line.startswith("---")
    )
    plus = " ".join(
        line[1:]
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )
    if re.search(r"(dim=|unsqueeze\()\+1", plus) and plus.replace("+1", "-1") == minus:
        return "axis"
    # the string literals either side, and whether the code around them is the same
    before, after = re.findall(r'"[^"]*"', minus), re.findall(r'"[^"]*"', plus)
    strings_only = re.sub(r'"[^"]*"', '""', minus) == re.sub(r'"[^"]*"', '""', plus)
    if (
        strings_only
        and [b.lower() for b in before] == [a.lower() for a in after]
        and all(b.strip('"').lower() in CODECS for b, a in zip(before, after) if b != a)
    ):
        return "codec"
    if "device=" in minus and (
        "device=None" in plus or plus.count("device=") < minus.count("device=")
    ):
        return "device"
    if re.search(r"\.to\(None\)|dtype=None", plus) or (
        "dtype=" in minus and plus.count("dtype=") < minus.count("dtype=")
    ):
        return "dtype"
    if ("raise " in minus or "Error(" in minus) and strings_only and before != after:
        return "wording"
    return "open"


def settings() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def run_group(name: str, group: dict, max_children: int) -> None:
    """mutmut over one group's modules with its tests, in mutants-work/<name>/."""
    work = ROOT / "mutants-work" / name
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for relative in files:
        source, target = ROOT / relative, work / relative
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    base = settings()
    lines = [
        "[tool.mutmut]",
        f"source_paths = {_toml_list(base['source_paths'])}",
        f"only_mutate = {_toml_list(group['only_mutate'])}",
        f"do_not_mutate = {_toml_list(base.get('do_not_mutate', []))}",
        f"also_copy = {_toml_list(base.get('also_copy', []))}",
        f"pytest_add_cli_args_test_selection = {_toml_list(group['tests'])}",
        "pytest_add_cli_args = "
        + _toml_list([*base.get("pytest_add_cli_args", []), *group.get("pytest_args", [])]),
    ]
    # the project's pyproject.toml with its [tool.mutmut] tables replaced by this group's
    project = (ROOT / "pyproject.toml").read_text()
    kept = re.sub(r"(?ms)^\[tool\.mutmut(\.[^\]]*)?\].*?(?=^\[(?!tool\.mutmut))", "", project)
    (work / "pyproject.toml").write_text(kept.rstrip() + "\n\n" + "\n".join(lines) + "\n")
    print(f"mutation: group {name}: {', '.join(group['only_mutate'])}", flush=True)
    done = subprocess.run(["mutmut", "run", "--max-children", str(max_children)], cwd=work)
    if done.returncode != 0:
        fail(f"group {name}: mutmut run exited {done.returncode}: its output above says why")
    gather(work)


def gather(work: Path) -> None:
    """Copy a group's mutated modules and results into mutants/, where `report` reads them."""
    for meta in (work / "mutants").rglob("*.py.meta"):
        relative = meta.relative_to(work / "mutants")
        if not json.loads(meta.read_text())["exit_code_by_key"]:
            continue
        module = str(relative)[: -len(".meta")]  # path/to/module.py
        for suffix in ("", ".meta", ".spans"):
            source = work / "mutants" / (module + suffix)
            if source.exists():
                target = ROOT / "mutants" / (module + suffix)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


def results() -> list[tuple[str, str, int | None]]:
    """(module path, mutant name, exit code) of every mutant of the last run."""
    metas = sorted((ROOT / "mutants").rglob("*.py.meta"))
    if not metas:
        fail("no results under mutants/: run `python tools/mutation.py run` first")
    rows = []
    for meta in metas:
        path = meta.relative_to(ROOT / "mutants").as_posix()[: -len(".meta")]
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            rows.append((path, name, code))
    return rows


def diff_of(name: str, path: str) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    return get_diff_for_mutant(name, path=path)


def changed_line(diff: str) -> str:
    lines = [line for line in diff.splitlines()[2:] if line[:1] in "-+"]
    return " → ".join(" ".join(line[1:].split()) for line in lines)[:240]


def decorated() -> list[str]:
    """`path:function` of the functions mutmut leaves alone: a decorator other than
    staticmethod/classmethod runs at definition (a registry, a route), so mutmut cannot put its
    switch in front of it."""
    import ast
    import fnmatch

    import tomllib

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    paths = sorted(
        path.relative_to(ROOT).as_posix()
        for pattern in settings["only_mutate"]
        for path in ROOT.glob(pattern if pattern.endswith(".py") else pattern + ".py")
        if not any(
            fnmatch.fnmatch(path.relative_to(ROOT).as_posix(), skip)
            for skip in settings.get("do_not_mutate", [])
        )
    )
    found = []
    for path in dict.fromkeys(paths):
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                not (isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod"))
                for d in node.decorator_list
            ):
                found.append(f"{path}:{node.name}")
    return found


SURVIVOR_ROW = re.compile(r"^\| `[^`]+` \((?P<path>[^)]+)\) \| (?P<state>[^|]+?) \| (?P<kind>\w+)")


def earlier_rows(section: str) -> dict[str, tuple[str, Counter, list[str]]]:
    """Per module of the section docs/testing.md holds: (its table row, its counts, its
    survivor rows), kept for the modules a run did not reach (one group or module run again)."""
    kept: dict[str, tuple[str, Counter, list[str]]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[0].endswith(".py") and cells[2].isdigit():
            path, date, _mutants, killed, survived, no_test, not_run = cells[:7]
            counts = Counter(
                {"killed": int(killed), "survived": int(survived), "no tests": int(no_test),
                 "not checked": int(not_run)}
            )  # fmt: skip
            kept[path] = (date, counts, [])
    for line in section.splitlines():
        match = SURVIVOR_ROW.match(line)
        if match and match["path"] in kept:
            date, counts, rows = kept[match["path"]]
            counts[f"{match['state']}:{match['kind']}"] += 1
            rows.append(line)
    return kept


def run_date(path: str) -> str:
    """The day a module's mutants last ran (its results file's time, UTC)."""
    import datetime

    stamp = (ROOT / "mutants" / (path + ".meta")).stat().st_mtime
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%d")


def report(earlier: str = "") -> str:
    """The section: this run's modules from mutants/, the others as `earlier` (the section
    docs/testing.md holds) had them, each row with the day its mutants ran."""
    rows = results()
    per_module: dict[str, Counter] = {}
    dates: dict[str, str] = {}
    survivors = []
    for path, name, code in rows:
        state = status(code)
        counts = per_module.setdefault(path, Counter())
        if path not in dates:
            dates[path] = run_date(path)  # one stat per module, not per mutant
        counts[state] += 1
        if state in ("survived", "no tests"):
            diff = diff_of(name, path)
            kind = "equivalent" if name in EQUIVALENT else classify(diff)
            counts[f"{state}:{kind}"] += 1
            survivors.append((path, name, state, kind, changed_line(diff)))
    kept_rows: dict[str, list[str]] = {}
    for path, (date, counts, lines) in earlier_rows(earlier).items():
        if path not in per_module:
            per_module[path], dates[path], kept_rows[path] = counts, date, lines
    total = Counter()
    for counts in per_module.values():
        total.update(counts)

    def score(c: Counter) -> str:
        excluded = sum(
            c[f"{s}:{k}"] for s in ("survived", "no tests") for k in (*EXCLUDED, "equivalent")
        )
        checked = sum(c.values()) - c["not checked"] - sum(v for k, v in c.items() if ":" in k)
        base = checked - excluded
        if base <= 0:
            return "–", "–"
        return f"{100 * c['killed'] / base:.1f} %", f"{100 * c['killed'] / checked:.1f} %"

    lines = [
        BEGIN,
        "",
        "| module | run | mutants | killed | survived | no test | not run | score | raw |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path, c in [*sorted(per_module.items()), ("**all**", total)]:
        mutants = sum(v for k, v in c.items() if ":" not in k)
        adjusted, raw = score(c)
        date = dates.get(path, "")
        lines.append(
            f"| {path} | {date} | {mutants} | {c['killed']} | {c['survived']} | "
            f"{c['no tests']} | {c['not checked']} | {adjusted} | {raw} |"
        )
    kinds = Counter(key.split(":", 1)[1] for key in total.elements() if ":" in key)
    lines += [
        "",
        "Survivors and unreached mutants by class: "
        + ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
        + ". Score: killed / (run − axis − device − codec − equivalent); raw: killed / run.",
        "",
        "<details><summary>Every surviving mutant</summary>",
        "",
        "| mutant | state | class | change |",
        "|---|---|---|---|",
    ]
    listed = [
        (path, f"| `{name.split('.')[-1]}` ({path}) | {state} | {kind}{why} | `{change}` |")
        for path, name, state, kind, change in survivors
        for why in [f" ({EQUIVALENT[name]})" if name in EQUIVALENT else ""]
        for change in [change.replace("|", "\\|")]
    ]
    listed += [(path, line) for path, rows in kept_rows.items() for line in rows]
    lines += [line for _, line in sorted(listed, key=lambda item: item[0])]
    lines += [
        "",
        "</details>",
        "",
        "Not mutated (a decorator runs at definition; tests/verl/test_loss.py, "
        "tests/core/test_verl_parity.py and tests/chair/ test them by behaviour): "
        + ", ".join(f"`{name}`" for name in decorated())
        + ".",
        "",
        END,
    ]
    return "\n".join(lines)


def write(section: str) -> None:
    text = DOC.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Mutation score\n\n" + section + "\n"
    DOC.write_text(text)
    print(f"mutation: wrote {DOC.relative_to(ROOT)}")


def _matches(module: str, patterns: list[str]) -> bool:
    """Whether `module` (a path) is one of a group's `only_mutate` entries (paths or globs)."""
    import fnmatch

    return any(module == p or fnmatch.fnmatch(module, p) for p in patterns)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/mutation.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="mutmut over each group (resumes), then the report")
    run.add_argument("--max-children", type=int, default=2, help="mutants run at once (default: 2)")
    run.add_argument("--group", action="append", help="only this group (repeatable; default: all)")
    run.add_argument(
        "--module",
        action="append",
        help="only this module of its group, as [tool.mutmut.groups] lists it (repeatable); "
        "the report keeps the other modules' rows as docs/testing.md has them",
    )
    sub.add_parser("report", help="write docs/testing.md from the last run's results")
    args = parser.parse_args(argv)
    if shutil.which("mutmut") is None:
        fail("mutmut is not installed: pip install -e '.[mutation]'")
    if args.verb == "run":
        groups = settings().get("groups", {})
        unknown = sorted(set(args.group or []) - set(groups))
        if unknown:
            fail(f"no group {unknown[0]!r} in [tool.mutmut.groups]; known: {', '.join(groups)}")
        patterns = [m for name in args.group or groups for m in groups[name]["only_mutate"]]
        missing = [m for m in args.module or [] if not _matches(m, patterns)]
        if missing:
            fail(f"{missing[0]} is not a module of the groups run: name it as pyproject lists it")
        for name in args.group or groups:
            group = dict(groups[name])
            if args.module:
                group["only_mutate"] = [m for m in args.module if _matches(m, group["only_mutate"])]
                if not group["only_mutate"]:
                    continue
            run_group(name, group, args.max_children)
    os.chdir(ROOT)  # mutmut reads its settings from ./pyproject.toml
    text = DOC.read_text()
    earlier = text.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in text and END in text else ""
    write(report(earlier))


if __name__ == "__main__":
    main()
