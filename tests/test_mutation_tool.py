"""tools/mutation.py sorts survivors into the classes docs/testing.md explains; an open mutant
is never filed as an equivalent one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)


def diff(before: str, after: str) -> str:
    return f"--- a.py\n+++ a.py\n@@ -1 +1 @@\n-    {before}\n+    {after}"


@pytest.mark.parametrize(
    ("before", "after", "kind"),
    [
        ("total = p.sum(dim=-1)", "total = p.sum(dim=+1)", "axis"),
        ("x = h.unsqueeze(-1) * m", "x = h.unsqueeze(+1) * m", "axis"),
        ("x = torch.zeros(3, device=m.device)", "x = torch.zeros(3, device=None)", "device"),
        ("x = torch.zeros(3, device=m.device)", "x = torch.zeros(3, )", "device"),
        ('raise ValueError("bad key")', 'raise ValueError("XXbad keyXX")', "wording"),
        ('t = raw.decode("utf-8")', 't = raw.decode("UTF-8")', "codec"),
        ('t = raw.decode("utf-8")', 't = raw.decode("XXutf-8XX")', "open"),
        ('open(p, encoding="ascii")', "open(p, encoding=None)", "open"),
        ('raise ValueError("bad key")', 'raise ValueError("BAD KEY")', "wording"),
        ('raise ValueError("bad key")', "raise ValueError(None)", "open"),
        ("if n > 1:", "if n >= 1:", "open"),
        ("x = scores.to(torch.float32)", "x = scores.to(None)", "dtype"),
        ("o = torch.zeros(2, dtype=torch.long)", "o = torch.zeros(2, )", "dtype"),
        ("y = a - b", "y = a + b", "open"),
        ("total = p.sum(dim=-1) - 1", "total = p.sum(dim=+1) - 2", "open"),
    ],
)
def test_classes(before, after, kind):
    assert mutation.classify(diff(before, after)) == kind


def test_status_reads_mutmuts_exit_codes():
    assert [mutation.status(c) for c in (1, 0, 33, None, 36, 99)] == [
        "killed",
        "survived",
        "no tests",
        "not checked",
        "killed",
        "suspicious",
    ]
