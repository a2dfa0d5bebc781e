"""The commands the docs show run as written: no alternatives spelt `a|b|c` in a shell line,
which a shell runs as a pipeline (`prepare fc --format xlam|messages|bfcl` piped into a
command named `messages`)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# `--flag a|b`: a choice written as alternatives, outside quotes
ALTERNATIVES = re.compile(r"--[\w-]+[ =][\w.-]+\|[\w.-]+")


def shell_lines(text: str) -> list[str]:
    """The lines of the ```bash / ```sh / ```shell blocks of a Markdown text."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside and line[3:].strip() in ("bash", "sh", "shell", "console")
            continue
        if inside:
            lines.append(line)
    return lines


def test_no_doc_command_is_a_pipeline_of_choices() -> None:
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in shell_lines(page.read_text()):
            unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", line.split(" #")[0])
            if ALTERNATIVES.search(unquoted):
                found.append(f"{page.relative_to(REPO)}: {line.strip()}")
    assert found == []
