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


def section() -> str:
    text = (ROOT / "docs" / "testing.md").read_text()
    return text.split(mutation.BEGIN, 1)[1].split(mutation.END, 1)[0]


def test_earlier_rows_read_back_the_section_they_were_written_as():
    """A run of one module keeps the others' rows: read back, they sum to the section's total
    and to its count of survivors by class."""
    import re
    from collections import Counter

    kept = mutation.earlier_rows(section())
    assert "entropyrl/core/advantages.py" in kept
    total = Counter()
    for _date, counts, _rows in kept.values():
        total.update(counts)
    all_row = next(line for line in section().splitlines() if line.startswith("| **all**"))
    cells = [cell.strip() for cell in all_row.strip("|").split("|")]
    assert [total["killed"], total["survived"], total["no tests"], total["not checked"]] == [
        int(cells[3]),
        int(cells[4]),
        int(cells[5]),
        int(cells[6]),
    ]
    by_class = Counter(key.split(":", 1)[1] for key in total.elements() if ":" in key)
    stated = re.search(r"by class: ([^.]*)\.", section())[1]
    assert dict(by_class) == {k: int(n) for k, n in (p.rsplit(" ", 1) for p in stated.split(", "))}
    # each kept module keeps its survivor rows, and only its own
    date, counts, rows = kept["entropyrl/core/advantages.py"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", date)
    assert len(rows) == counts["survived"] + counts["no tests"]
    assert all("(entropyrl/core/advantages.py)" in row for row in rows)


def test_a_module_is_matched_by_its_group_s_paths_and_globs():
    assert mutation._matches("entropyrl/rewards/chair_client.py", ["entropyrl/rewards/*"])
    assert mutation._matches("entropyrl/verl/loss.py", ["entropyrl/verl/loss.py"])
    assert not mutation._matches("entropyrl/verl/loss.py", ["entropyrl/rewards/*"])
