"""Print pip constraints that freeze an installed GPU stack (torch, vLLM, flash-attn and the
torch vision/audio packages), so that `pip install -c` adds entropyrl and verl beside the stack
and refuses, rather than performs, any replacement of it.

Routes (b) and (c) of docs/install.md run it after the stack is installed (a CUDA 12.9 pip
install, or a published image) and before `pip install -c stack.txt -e '.[preinstalled]'`.
It needs only the standard library: entropyrl is not installed yet when it runs.

Exit status 2 with one line when the stack is incomplete or off verl 0.9.1's pins.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

# verl 0.9.1's pins (its `vllm` extra and its flash-attn extra); tests/test_dockerfile.py holds
# them equal to verl's metadata and to entropyrl.verl.checks.stack.
REQUIRED = {"torch": "2.11.0", "vllm": "0.24.0", "flash-attn": "2.8.3"}
OPTIONAL = {"torchvision": "0.26.0", "torchaudio": "2.11.0"}


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def constraints() -> tuple[list[str], list[str]]:
    """(constraint lines, problems): one `name==version` per package found."""
    lines, problems = [], []
    for name, pin in {**REQUIRED, **OPTIONAL}.items():
        found = installed(name)
        if found is None:
            if name in REQUIRED:
                problems.append(f"{name} is not installed (verl 0.9.1's pin: {name}=={pin})")
            continue
        if found.split("+")[0] != pin:
            problems.append(f"{name} {found} is not verl 0.9.1's pin {name}=={pin}")
        lines.append(f"{name}=={found}")
    return lines, problems


def main() -> int:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    lines, problems = constraints()
    if problems:
        print(
            "stack_constraints: "
            + "; ".join(problems)
            + ": install the stack of your route first (docs/install.md#gpu-nodes)",
            file=sys.stderr,
        )
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
