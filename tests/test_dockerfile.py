"""The container route (docs/install.md#route-c-the-container) and the GPU install routes hold
together: Docker cannot run on the CI machines, so what is checked is the text.

- the Dockerfile parses into known instructions, builds FROM `stack.CONTAINER_IMAGE` through a
  `BASE_IMAGE` argument, freezes the image's stack with tools/stack_constraints.py and installs
  verl and the `preinstalled` extra against that freeze;
- tools/stack_constraints.py's pins are verl 0.9.1's own (its metadata), and it refuses a stack
  off them in one line with exit status 2;
- the `docker build` command, the route (b) commands and the one flash-attn build spelling in the
  README, docs/install.md, pyproject.toml and the doctor's messages are the same text.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

from entropyrl.verl.checks import stack

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
INSTALL_DOC = ROOT / "docs" / "install.md"
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, `\\` continuations joined."""
    instructions, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        instructions.append((word, rest.strip()))
    if pending:
        raise ValueError(f"a continuation runs past the end of the file: {pending!r}")
    return instructions


def stack_constraints_module():
    spec = importlib.util.spec_from_file_location(
        "stack_constraints", ROOT / "tools" / "stack_constraints.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def test_the_dockerfile_parses_into_known_instructions(dockerfile):
    unknown = [
        word for word, _ in dockerfile if word.upper() not in INSTRUCTIONS or word != word.upper()
    ]
    assert unknown == []
    assert dockerfile[0] == ("ARG", f"BASE_IMAGE={stack.CONTAINER_IMAGE}")
    assert dockerfile[1] == ("FROM", "${BASE_IMAGE}")
    with pytest.raises(ValueError, match="continuation"):
        parse_dockerfile("FROM x\nRUN a \\\n")


def test_the_image_stack_is_frozen_before_anything_installs(dockerfile):
    commands = [args for word, args in dockerfile if word == "RUN"]
    assert len(commands) == 1
    steps = [step.strip() for step in commands[0].split("&&")]
    freeze = "python tools/stack_constraints.py > /opt/stack-constraints.txt"
    assert steps[0] == freeze
    installs = [step for step in steps if step.startswith("pip install")]
    assert installs == [
        f'pip install --no-cache-dir -c /opt/stack-constraints.txt "verl[verl-core]=={stack.SUPPORTED_VERL}"',
        'pip install --no-cache-dir -c /opt/stack-constraints.txt -e ".[preinstalled]"',
    ]
    assert any(step.startswith("python -c") and "import flash_attn" in step for step in steps)


def test_the_preinstalled_extra_pins_no_part_of_the_stack():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    names = {re.split(r"[\[=<>~! ]", req, maxsplit=1)[0].lower() for req in extras["preinstalled"]}
    assert not names & {"torch", "torchvision", "torchaudio", "vllm", "flash-attn", "verl"}
    assert "transformers==5.9.0" in extras["preinstalled"]
    assert "==5.9.0" in str(stack.verl_pins("vllm")["transformers"])
    assert f"verl[vllm]=={stack.SUPPORTED_VERL}" in extras["gpu"]


def test_stack_constraints_pins_are_verls():
    module = stack_constraints_module()
    pins = stack.verl_pins("vllm")
    flash = stack.verl_pins("flash-attn-cu130torch211")["flash-attn"]
    for name, version in {**module.REQUIRED, **module.OPTIONAL}.items():
        spec = flash if name == "flash-attn" else pins[name]
        assert str(spec) == f"=={version}", name
    assert f"flash-attn=={module.REQUIRED['flash-attn']}" in stack.FLASH_ATTN_BUILD


def test_stack_constraints_freezes_a_matching_stack_and_refuses_another(monkeypatch):
    module = stack_constraints_module()
    found = {**module.REQUIRED, "torch": "2.11.0+cu129", "torchvision": "0.26.0+cu129"}
    monkeypatch.setattr(module, "installed", found.get)
    lines, problems = module.constraints()
    assert problems == []
    assert lines == [
        "torch==2.11.0+cu129", "vllm==0.24.0", "flash-attn==2.8.3", "torchvision==0.26.0+cu129"
    ]  # fmt: skip
    monkeypatch.setattr(module, "installed", {**found, "vllm": "0.23.1", "flash-attn": None}.get)
    _, problems = module.constraints()
    assert problems == [
        "vllm 0.23.1 is not verl 0.9.1's pin vllm==0.24.0",
        "flash-attn is not installed (verl 0.9.1's pin: flash-attn==2.8.3)",
    ]


def test_stack_constraints_says_what_is_off_in_one_line_and_exits_2():
    """This machine's torch is the CPU build and it has no vLLM: the script refuses."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "stack_constraints.py")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "vllm is not installed" in result.stderr
    assert "docs/install.md#gpu-nodes" in result.stderr


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _commands(text: str) -> list[str]:
    """Each command of the markdown's bash blocks, comments dropped."""
    return [
        line.split("   #")[0].strip()
        for block in _code_blocks(text)
        for line in block.splitlines()
        if line.strip()
    ]


def test_the_docs_docker_build_is_the_files_and_the_doctors():
    header = DOCKERFILE.read_text().splitlines()
    build = "docker build -t entropyrl:gpu ."
    assert f"#   {build}" in header
    assert build in _commands(INSTALL_DOC.read_text())
    assert "docker build -t entropyrl:gpu ." in stack.ROUTE_C
    assert stack.CONTAINER_IMAGE in INSTALL_DOC.read_text()


def test_route_b_commands_are_the_doctors():
    commands = _commands(INSTALL_DOC.read_text())
    torch_line = next(c for c in commands if c.startswith("pip install torch=="))
    assert torch_line in stack.ROUTE_B
    vllm_line = next(c for c in commands if c.startswith("pip install https://github.com/vllm"))
    assert vllm_line.endswith("vllm-0.24.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert "vLLM 0.24.0's cu129 wheel" in stack.ROUTE_B
    assert 'pip install -c stack.txt -e ".[preinstalled]"' in " ".join(commands)


def test_one_flash_attn_build_spelling_everywhere():
    for path in (ROOT / "README.md", INSTALL_DOC):
        builds = [c for c in _commands(path.read_text()) if "flash-attn" in c and "pip" in c]
        assert builds and all(c == stack.FLASH_ATTN_BUILD for c in builds), path.name
    assert f"`{stack.FLASH_ATTN_BUILD}`" in (ROOT / "pyproject.toml").read_text()
    spellings = set(
        re.findall(r"pip install flash-attn[^\n`'\"#]*[^\s\n`'\"#]", INSTALL_DOC.read_text())
    )
    assert spellings == {"pip install flash-attn==2.8.3 --no-build-isolation"}
