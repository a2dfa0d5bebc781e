"""The import graph of the project's code: layers that only point down, and no circles.

Every package has a rank of its own, lowest first (a module may import its own package and the
ones ranked below it):
  0 core        entropyrl.core (specs, entropy, advantages, maxent, losses, clip_schedules,
                algorithms, estimator_names, _segments, files), with the package face
                `entropyrl` (its version)
  1 models      entropyrl.models (checkpoint loading, processors, images)
  2 rewards     entropyrl.rewards (the scorers, the CHAIR client)
  3 data        entropyrl.data (converters, the shared input readers)
  4 evaluation  entropyrl.evaluation (uses data's readers; data never imports it)
  5 verl        entropyrl.verl (the plugin only)
  6 rig         entropyrl.rig (the CPU wing: verl's CPU backend, the smoke and its recorder,
                tiny models, the synthetic world, the one-machine runner `rig.local`, which
                imports nothing of verl's side)
  7 commands    entropyrl.commands (every `entropyrl <verb>`)
  8 entry       entropyrl.cli, entropyrl.__main__ (they collect the commands)
chair_server stands alone below them all: it imports neither entropyrl nor torch.
Since no two packages share a rank, two packages that import each other always fail.
Every import counts, those inside functions and under TYPE_CHECKING too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RANK = {
    "core": 0,
    "models": 1,
    "rewards": 2,
    "data": 3,
    "evaluation": 4,
    "verl": 5,
    "rig": 6,
    "commands": 7,
}
ENTRY = 8
# The one-machine runner runs without verl installed: it imports neither the plugin nor the
# parts of the rig that drive verl (a GPU run under verl loads no rig at all: the ranks).
LOCAL_RUNNER = "entropyrl.rig.local"
VERL_SIDE = (
    "entropyrl.verl",
    "entropyrl.rig.cpu",
    "entropyrl.rig.dataset",
    "entropyrl.rig.smoke",
    "entropyrl.rig.trace",
)


def _within(name: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    files = [
        *REPO.joinpath("entropyrl").rglob("*.py"),
        *REPO.joinpath("chair_server").rglob("*.py"),
    ]
    return {module_name(path): path for path in files}


def imported(path: Path, name: str) -> set[str]:
    """Every module `path` imports (absolute names; relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {
        name: {target for target in imported(path, name) if target in modules and target != name}
        for name, path in modules.items()
    }


def layer(name: str) -> int:
    parts = name.split(".")
    if parts[0] == "chair_server":
        return -1
    if len(parts) == 1:
        return RANK["core"]  # entropyrl/__init__.py: the version, below every layer
    if parts[1] in ("cli", "__main__"):
        return ENTRY
    return RANK[parts[1]]


def test_every_module_has_a_layer():
    for name in project_modules():
        layer(name)  # KeyError names a module outside the map above


def package(name: str) -> str:
    """The package a module belongs to (`entropyrl.data.io` -> `data`); the package face
    `entropyrl` is `core`, `entropyrl.cli` and `entropyrl.__main__` are `entry`."""
    parts = name.split(".")
    if parts[0] != "entropyrl":
        return parts[0]
    if len(parts) == 1:
        return "core"
    return parts[1] if parts[1] in RANK else "entry"


def upward_imports(edges: dict[str, set[str]], rank=None) -> list[str]:
    """Every import that points up a layer, across a tie or between the independent engines."""
    rank = rank or layer
    upward = []
    for source, targets in edges.items():
        for target in targets:
            src, dst = rank(source), rank(target)
            if src == -1 and dst != -1:
                upward.append(f"{source} -> {target} (chair_server stands alone)")
            elif dst > src:
                upward.append(f"{source} -> {target} (layer {src} -> {dst})")
            elif src == dst and package(source) != package(target):
                upward.append(f"{source} -> {target} (two packages share rank {src})")
            elif _within(source, LOCAL_RUNNER) and _within(target, VERL_SIDE):
                upward.append(f"{source} -> {target} (the engines are independent)")
    return sorted(upward)


def test_every_package_has_a_rank_of_its_own():
    ranks = [*RANK.values(), ENTRY]
    assert len(set(ranks)) == len(ranks), RANK
    assert min(RANK.values()) == RANK["core"] == 0 and max(RANK.values()) < ENTRY
    packages = {p.name for p in REPO.joinpath("entropyrl").iterdir() if p.is_dir()}
    assert packages - {"__pycache__"} == set(RANK)


def test_imports_only_point_down():
    upward = upward_imports(graph())
    assert not upward, "\n".join(upward)


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between packages (`entropyrl.data.cli -> entropyrl.evaluation.protocol` is
    `data -> evaluation`)."""
    packages: dict[str, set[str]] = {}
    for source, targets in edges.items():
        for target in targets:
            if package(target) != package(source):
                packages.setdefault(package(source), set()).add(package(target))
    return packages


def test_no_two_packages_import_each_other():
    assert circles(package_graph(graph())) == []


def test_a_planted_two_way_tie_fails():
    # data and evaluation importing each other (the tie there was): whichever ranks lower
    # imports upwards, and the package graph has a circle
    planted = {
        "entropyrl.data.cli": {"entropyrl.evaluation.protocol"},
        "entropyrl.evaluation.protocol": {"entropyrl.data.io"},
        "entropyrl.data.io": set(),
    }
    assert upward_imports(planted) == [
        "entropyrl.data.cli -> entropyrl.evaluation.protocol (layer 3 -> 4)"
    ]
    assert circles(package_graph(planted)) == [["data", "evaluation"]]
    # with both at one rank (what the old map allowed) the shared rank itself is refused
    tied = {**RANK, "evaluation": RANK["data"]}
    assert upward_imports(planted, lambda n: tied[package(n)]) == [
        "entropyrl.data.cli -> entropyrl.evaluation.protocol (two packages share rank 3)",
        "entropyrl.evaluation.protocol -> entropyrl.data.io (two packages share rank 3)",
    ]


def test_the_engines_stay_independent():
    assert upward_imports({"entropyrl.rig.local.rl": {"entropyrl.verl.loss"}}) == [
        "entropyrl.rig.local.rl -> entropyrl.verl.loss (the engines are independent)"
    ]
    assert upward_imports({"entropyrl.rig.local.rl": {"entropyrl.rig.cpu.backend"}}) == [
        "entropyrl.rig.local.rl -> entropyrl.rig.cpu.backend (the engines are independent)"
    ]
    assert upward_imports({"entropyrl.rig.smoke.assets": {"entropyrl.rig.local.rl"}}) == []


def test_chair_server_imports_no_torch():
    for name, path in project_modules().items():
        if name.startswith("chair_server"):
            roots = {target.split(".")[0] for target in imported(path, name)}
            assert not roots & {"torch", "entropyrl", "transformers"}, name


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    # A package's __init__ importing its own modules is not a circle of the design: leave
    # the package faces out.
    edges = {
        source: {t for t in targets if project_modules()[t].name != "__init__.py"}
        for source, targets in graph().items()
    }
    assert circles(edges) == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [({"a": {"b"}, "b": {"a"}}, [["a", "b"]]), ({"a": {"b"}, "b": {"c"}}, [])],
)
def test_the_circle_finder_finds_circles(edges, expected):
    assert circles(edges) == expected
