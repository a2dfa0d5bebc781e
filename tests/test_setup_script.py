"""tools/setup.sh composes the install a machine needs, and installs nothing it should not.

Run with `ENTROPYRL_SETUP_DRY_RUN=1`, which prints each pip command instead of running it:
- a Linux machine without an NVIDIA driver and without torch gets torch's CPU build from
  PyTorch's CPU wheel index (a local index stands in for it); that index out of reach: one line
  and the default index;
- a machine with a driver (a stand-in `nvidia-smi`) gets the default index, unasked;
- an installed torch is kept and pinned for the rest;
- a Python that is not a virtual environment is refused in one line (exit 2) unless
  ENTROPYRL_INSTALL_ANYWHERE=1; so is Python 3.13, with the route;
- `--help` of every script under examples/ and tools/ prints its usage and runs no pip.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "tools" / "setup.sh"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A virtual environment without torch (and without entropyrl)."""
    folder = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder / "bin" / "python"


@pytest.fixture(scope="module")
def cpu_index(tmp_path_factory):
    """A stand-in for PyTorch's CPU wheel index: answers `<index>/torch/`."""
    root = tmp_path_factory.mktemp("index")
    (root / "torch").mkdir()
    (root / "torch" / "index.html").write_text("<a href='torch-2.13.0+cpu.whl'>torch</a>")
    handler = lambda *args: http.server.SimpleHTTPRequestHandler(*args, directory=str(root))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _closed_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _path_with_nvidia_smi(tmp_path: Path, works: bool) -> str:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\nexit 0\n" if works else "#!/bin/sh\nexit 9\n")
    tool.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def setup(python: Path | str, tmp_path: Path, *args: str, driver: bool = False, **env: str):
    full = {k: v for k, v in os.environ.items() if k not in ("CONDA_PREFIX", "VIRTUAL_ENV")}
    full.update(
        PYTHON=str(python),
        ENTROPYRL_SETUP_DRY_RUN="1",
        PATH=_path_with_nvidia_smi(tmp_path, works=driver),
        **env,
    )
    return subprocess.run(
        ["bash", str(SETUP), *args], capture_output=True, text=True, env=full, timeout=120
    )


def pip_lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("+ ")]


@pytest.mark.skipif(
    Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver"
)
def test_no_driver_no_torch_gets_the_cpu_build_from_pytorchs_cpu_index(
    bare_python, cpu_index, tmp_path
):
    result = setup(bare_python, tmp_path, ENTROPYRL_TORCH_CPU_INDEX=cpu_index)
    assert result.returncode == 0, result.stderr
    torch_line, rest = pip_lines(result)
    assert (
        torch_line
        == f"+ {bare_python} -m pip install --quiet torch==2.13.0 --index-url {cpu_index}"
    )
    assert rest.startswith(f"+ {bare_python} -m pip install --quiet -c ")
    assert rest.endswith(f"-e {REPO}[server,local]")
    assert "its CPU build from PyTorch's CPU wheel index" in result.stdout


def test_an_unreachable_cpu_index_is_one_line_and_the_default_index(bare_python, tmp_path):
    closed = _closed_url()
    result = setup(bare_python, tmp_path, ENTROPYRL_TORCH_CPU_INDEX=closed)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if "cannot be reached" in line]
    assert len(said) == 1 and said[0].startswith(f"setup: PyTorch's CPU wheel index ({closed})")
    assert pip_lines(result)[0] == f"+ {bare_python} -m pip install --quiet torch==2.13.0"


def test_a_machine_with_an_nvidia_driver_gets_the_default_index(bare_python, cpu_index, tmp_path):
    result = setup(bare_python, tmp_path, driver=True, ENTROPYRL_TORCH_CPU_INDEX=cpu_index)
    assert result.returncode == 0, result.stderr
    assert pip_lines(result)[0] == f"+ {bare_python} -m pip install --quiet torch==2.13.0"
    assert "CPU wheel index" not in result.stdout


def test_an_installed_torch_is_kept_and_pinned(tmp_path):
    from importlib.metadata import version

    result = setup(sys.executable, tmp_path, "dev")
    assert result.returncode == 0, result.stderr
    assert f"setup: keeping torch {version('torch')}" in result.stdout
    lines = pip_lines(result)
    assert not any("torch==" in line for line in lines)
    assert lines[0].endswith(f"-e {REPO}[dev]") and " -c " in lines[0]


def test_a_python_outside_a_virtual_environment_is_refused_in_one_line(tmp_path):
    base = Path(sys.base_prefix) / "bin" / "python3"
    result = setup(base, tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"setup: {base} ({sys.base_prefix}) is not a virtual environment")
    assert "python3 -m venv .venv && . .venv/bin/activate" in line
    assert "ENTROPYRL_INSTALL_ANYWHERE=1" in line
    assert pip_lines(result) == []
    asked = setup(base, tmp_path, ENTROPYRL_INSTALL_ANYWHERE="1")
    assert asked.returncode == 0, asked.stderr
    assert pip_lines(asked)


def test_python_3_13_is_refused_with_the_route(tmp_path):
    stand_in = tmp_path / "python3.13"
    stand_in.write_text("#!/bin/sh\necho 3.13\n")
    stand_in.chmod(0o755)
    result = setup(stand_in, tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"setup: entropyrl needs Python 3.10-3.12, found 3.13 ({stand_in}): make the environment "
        "with one of them, e.g. python3.12 -m venv .venv && . .venv/bin/activate"
    ]


SCRIPTS = sorted(
    [p for p in (REPO / "examples").glob("*.sh")] + [p for p in (REPO / "tools").iterdir()]
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_help_prints_usage_and_installs_nothing(script, tmp_path):
    """A stand-in python records every `-m pip` and refuses it; the rest runs for real."""
    log = tmp_path / "pip.log"
    stand_in = tmp_path / "python"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *"-m pip"*) echo "$*" >> {log}; exit 3 ;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    stand_in.chmod(0o755)
    env = {
        **os.environ,
        "PYTHON": str(stand_in),
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
    }
    runner = [str(stand_in)] if script.suffix == ".py" else ["bash"]
    result = subprocess.run(
        [*runner, str(script), "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()
    assert not log.exists(), log.read_text()
