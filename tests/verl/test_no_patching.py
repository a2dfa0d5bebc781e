"""The plugin patches no object of verl's in place (`entropyrl/verl/` outside `checks/`): no
assignment to an attribute of an imported verl module or class, nor of what a `super()` call
returned (verl built it: `buffer = super()._build_replay_buffer(); buffer.sample = ...`)."""

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


def test_the_plugin_assigns_no_attribute_of_verls():
    files = [p for p in PLUGIN.rglob("*.py") if "checks" not in p.relative_to(PLUGIN).parts]
    assert files
    found = {
        str(p.relative_to(PLUGIN)): patches(p.read_text()) for p in files if patches(p.read_text())
    }
    assert found == {}


def test_the_scan_finds_the_patches_it_looks_for():
    assert patches("from verl.utils import tracking\ntracking.FileLogger = object\n")
    assert patches("import verl.utils.tracking\nverl.utils.tracking.FileLogger = 1\n")
    assert patches(
        "class T:\n    def f(self):\n        buffer = super().f()\n        buffer.sample = len\n"
    )
    assert patches("from verl.x import y\nsetattr(y, 'z', 1)\n")
    assert not patches("from verl.x import y\nz = object()\nz.a = 1\nself_value = 1\n")
