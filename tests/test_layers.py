"""The import graph of the project's code: layers that only point down, and no circles.

Layers, lowest first (a module may import its own layer and the ones below):
  0 core       entropyrl.{files, specs, entropy, advantages, maxent, losses, clip_schedules,
               algorithms, estimator_names, _segments}
  1 parts      entropyrl.models, entropyrl.rewards, entropyrl.data, entropyrl.evaluation (data
               and evaluation may use rewards, not the reverse)
  2 engines    entropyrl.verl (the plugin, with its CPU backend) and entropyrl.local (the
               one-machine runner): neither imports the other
  3 commands   entropyrl.commands (smoke, doctor, preflight, evaluation)
  4 entry      entropyrl.cli, entropyrl.__main__ (they dispatch by module name)
chair_server stands alone below them all: it imports neither entropyrl nor torch.
Every import counts, those inside functions and under TYPE_CHECKING too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = {
    "files",
    "specs",
    "entropy",
    "advantages",
    "maxent",
    "losses",
    "clip_schedules",
    "algorithms",
    "estimator_names",
    "_segments",
    "__init__",
}
RANK = {
    "chair_client": 1,
    "evaluation": 1,
    "models": 1,
    "rewards": 1,
    "data": 1,
    "verl": 2,
    "local": 2,
    "commands": 3,
}


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
        return 0
    if parts[1] in ("cli", "__main__"):
        return 4
    if parts[1] in CORE:
        return 0
    return RANK[parts[1]]


def test_every_module_has_a_layer():
    for name in project_modules():
        layer(name)  # KeyError names a module outside the map above


def test_imports_only_point_down():
    upward = []
    for source, targets in graph().items():
        for target in targets:
            src, dst = layer(source), layer(target)
            package = lambda n: n.split(".")[1] if "." in n else ""  # noqa: E731
            if src == -1 and dst != -1:
                upward.append(f"{source} -> {target} (chair_server stands alone)")
            elif dst > src:
                upward.append(f"{source} -> {target} (layer {src} -> {dst})")
            elif src == dst == 2 and package(source) != package(target):
                upward.append(f"{source} -> {target} (the engines are independent)")
            elif (
                src == dst == 1
                and package(source) == "rewards"
                and package(target) in ("data", "evaluation")
            ):
                upward.append(f"{source} -> {target} (rewards are used, they use neither)")
    assert not upward, "\n".join(sorted(upward))


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
