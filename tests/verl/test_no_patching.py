"""The plugin patches no object of verl's in place (all of `entropyrl/verl/`): no assignment to
an attribute of an imported verl module or class, nor of what a `super()` call returned (verl
built it: `buffer = super()._build_replay_buffer(); buffer.sample = ...`), but for the one
documented wrapper of verl's `validate_config`, whose effect is scoped to runs that use ours."""

from __future__ import annotations

import ast
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[2] / "entropyrl" / "verl"


def verl_names(tree: ast.Module) -> set[str]:
    """Names bound to verl modules or objects: imports from verl, and variables assigned from
    a `super()` call's result or from an attribute of a verl name."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] == "verl"
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            root = value
            while isinstance(root, ast.Call | ast.Attribute):
                root = root.func if isinstance(root, ast.Call) else root.value
            from_super = isinstance(root, ast.Name) and root.id == "super"
            if isinstance(target, ast.Name) and (
                from_super or (isinstance(root, ast.Name) and root.id in names)
            ):
                names.add(target.id)
    return names


def patches(source: str) -> list[str]:
    """`name.attr = ...` (or `setattr(name, ...)`) where `name` holds a verl object."""
    tree = ast.parse(source)
    names = verl_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if (
                isinstance(target, ast.Attribute)
                and isinstance(root, ast.Name)
                and root.id in names
            ):
                found.append(f"line {node.lineno}: {ast.unparse(target)} = ...")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in names
        ):
            found.append(f"line {node.lineno}: setattr({node.args[0].id}, ...)")
    return found


# The one wrapper: verl has no extension point for checking a config before Ray starts, so
# `validate_config` is wrapped once; it adds our checks to runs that use entropyrl and hands
# every other run to verl's own function unchanged (tests/verl/test_validation_scope.py).
DOCUMENTED_WRAPPERS = {"checks/validation.py": ["verl_config.validate_config = ..."]}


def test_the_plugin_assigns_no_attribute_of_verls_but_its_one_wrapper():
    files = list(PLUGIN.rglob("*.py"))
    assert len(files) > 20
    found = {}
    for path in files:
        lines = [line.split(": ", 1)[1] for line in patches(path.read_text())]
        if lines:
            found[path.relative_to(PLUGIN).as_posix()] = lines
    assert found == DOCUMENTED_WRAPPERS


def test_the_scan_finds_the_patches_it_looks_for():
    assert patches("from verl.utils import tracking\ntracking.FileLogger = object\n")
    assert patches("import verl.utils.tracking\nverl.utils.tracking.FileLogger = 1\n")
    assert patches(
        "class T:\n    def f(self):\n        buffer = super().f()\n        buffer.sample = len\n"
    )
    assert patches("from verl.x import y\nsetattr(y, 'z', 1)\n")
    assert not patches("from verl.x import y\nz = object()\nz.a = 1\nself_value = 1\n")
