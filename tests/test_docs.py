"""The README stays short and the user-facing text stays clean.

- README.md is at most 300 lines and draws one training step as a mermaid diagram;
- every relative link in README.md and docs/*.md reaches an existing file, and a `#anchor` a
  heading of that file (GitHub's slug rules);
- no lab notes ("this machine", "the previous release", ...) in README.md, docs/*.md, or the
  strings the code prints (string literals and module docstrings, which serve as CLI help, of
  entropyrl/ and chair_server/): a figure says what it was measured on in plain words.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
MARKDOWN = [README, *PAGES]
CODE = sorted(p for folder in ("entropyrl", "chair_server") for p in (ROOT / folder).rglob("*.py"))

MAX_README_LINES = 300
LAB_NOTES = (
    "this machine",
    "this 2-core machine",
    "a busy machine",
    "busy machine",
    "the previous release",
    "previous release",
    "an earlier measurement",
    "earlier measurement",
    "the table predates",
)
LAB_NOTE = re.compile("|".join(re.escape(p) for p in LAB_NOTES), re.IGNORECASE)

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(text: str) -> str:
    """Markdown without code blocks and code spans (a link there is not a link)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(text):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move detail to docs/"
    )


def test_the_readme_draws_one_training_step_in_mermaid():
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"^```mermaid\n(.*?)^```\s*$", text, re.MULTILINE | re.DOTALL)
    assert blocks, "README.md has no ```mermaid block"
    diagram = blocks[0].lower()
    steps = ["rollout", "reward", "chair", "entropy", "advantages", "clip", "loss"]
    missing = [step for step in steps if step not in diagram]
    assert missing == [], f"the training-step diagram does not name {missing}"


def test_the_docs_pages_exist_and_the_readme_links_each():
    assert PAGES, "docs/ holds no pages"
    links = {target.split("#")[0] for target in LINK.findall(_prose(README.read_text("utf-8")))}
    unlinked = [_name(p) for p in PAGES if _name(p) not in links]
    assert unlinked == [], f"README.md does not link {unlinked}"


@pytest.mark.parametrize("path", MARKDOWN, ids=_name)
def test_relative_links_resolve(path):
    broken = []
    for target in LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no file {file_part})")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor} in {_name(linked)})")
    assert broken == [], f"{_name(path)}: broken links: {broken}"


@pytest.mark.parametrize("path", MARKDOWN, ids=_name)
def test_no_lab_notes_in_the_docs(path):
    found = [
        f"{_name(path)}:{number}: {match.group(0)!r}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for match in LAB_NOTE.finditer(line)
    ]
    assert found == [], "lab notes in user-facing text:\n" + "\n".join(found)


def _printed_strings(tree: ast.Module) -> list[ast.Constant]:
    """String literals of a module, less function and class docstrings (developer notes);
    the module docstring stays in, since CLI modules print it as their --help."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_no_lab_notes_in_strings_the_code_prints():
    assert CODE, "no code found"
    found = []
    for path in CODE:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _printed_strings(tree):
            for match in LAB_NOTE.finditer(node.value):
                found.append(f"{_name(path)}:{node.lineno}: {match.group(0)!r}")
    assert found == [], "lab notes in strings printed to users:\n" + "\n".join(found)


CURL = re.compile(r"curl -s localhost:5000/v1/chair -d '(?P<body>\{.*\})'")


def test_the_chair_examples_work_against_the_world_they_name(tmp_path) -> None:
    """The README's and docs/chair_service.md's requests to the quick start's world (the demo's
    default world, seed 0) name images it has, with the answer the text describes."""
    from chair_server.scorer import ChairScorer
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.synthetic import build_synthetic_coco

    build_synthetic_coco(tmp_path, **DemoConfig().world_settings(), write_images=False)
    scorer = ChairScorer.from_coco(tmp_path, use_cache=False)
    examples = []
    for page in (README, ROOT / "docs" / "chair_service.md"):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            match = CURL.search(line)
            if match and any("runs/demo/world" in lines[j] for j in range(max(0, i - 2), i)):
                examples.append((page.name, json.loads(match["body"])["captions"]))
    assert {name for name, _ in examples} == {"README.md", "chair_service.md"}
    for name, captions in examples:
        entries = scorer.score(captions)
        assert all("error" not in entry for entry in entries), (name, entries)
        if captions == [{"image_id": 3, "caption": "A cat next to a dog."}]:
            assert entries[0]["hallucinated"] == [["dog", "dog"]], name
            assert entries[0]["metrics"]["CHAIRi"] == 0.5


DOC_LINK_IN_CODE = re.compile(r"docs/([\w\-]+\.md)#([\w\-]+)")


def test_docs_anchors_the_code_prints_exist():
    """A message that sends a user to `docs/page.md#section` names a heading that exists."""
    broken = []
    for path in CODE:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _printed_strings(tree):
            for page, anchor in DOC_LINK_IN_CODE.findall(node.value):
                target = ROOT / "docs" / page
                if not target.is_file() or anchor not in _anchors(target):
                    broken.append(f"{_name(path)}:{node.lineno}: docs/{page}#{anchor}")
    assert broken == [], "links to missing docs sections:\n" + "\n".join(broken)
