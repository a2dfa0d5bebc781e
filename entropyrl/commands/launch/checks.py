"""The prerequisites a launch checks before it starts anything: the GPUs (nvidia-smi,
CUDA_VISIBLE_DEVICES, N_GPUS), verl, the recipe composed with every override
(`entropyrl.commands.preflight`), the input files, the model, and the plugin's entry point."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from entropyrl.commands.launch.args import Launch, Stop, say


@dataclass
class Gpus:
    """The GPUs this process can use, and the GPUs per node the run asks for."""

    here: int = 0
    seen: str = "nvidia-smi not run"
    per_node: str = ""  # empty: the config's own
    per_node_from: str = "the config"
    smi: bool = False


def count_gpus() -> Gpus:
    """What nvidia-smi lists, cut to CUDA_VISIBLE_DEVICES when it is set (CUDA stops at the
    first empty or negative entry)."""
    gpus = Gpus()
    if shutil.which("nvidia-smi"):
        gpus.smi = True
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout
        gpus.here = sum(1 for line in listed.splitlines() if line)
        gpus.seen = f"nvidia-smi lists {gpus.here}"
    else:
        gpus.seen = "nvidia-smi not found"
    visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible_devices is not None:
        visible = 0
        for device in visible_devices.split(","):
            if device == "" or device.startswith("-"):
                break
            visible += 1
        gpus.here = min(gpus.here, visible)
        gpus.seen += f", CUDA_VISIBLE_DEVICES={visible_devices} leaves {gpus.here}"
    return gpus


def require_gpu(fail: Callable[[str], None]) -> Gpus:
    """At least one NVIDIA GPU visible; GPUs per node from N_GPUS, else those visible. A dry run
    on a machine without GPUs plans for the config's own GPUs per node."""
    gpus = count_gpus()
    if os.environ.get("N_GPUS"):
        gpus.per_node = os.environ["N_GPUS"]
        gpus.per_node_from = f"N_GPUS={gpus.per_node}"
    elif gpus.here >= 1:
        gpus.per_node = str(gpus.here)
        gpus.per_node_from = f"the GPUs this process sees ({gpus.seen})"
    else:
        gpus.per_node_from = (
            f"the config (no GPU here: {gpus.seen}; N_GPUS=... plans another layout)"
        )
    if not gpus.smi:
        fail(
            "nvidia-smi not found: verl training needs NVIDIA GPUs (a GPU node installs the "
            "route for its NVIDIA driver, docs/install.md#gpu-nodes; here --dry-run plans the "
            "run and --smoke runs the recipe on the CPU)"
        )
    elif gpus.here < 1:
        fail(f"no GPU visible ({gpus.seen})")
    return gpus


def note_no_gpu(gpus: Gpus, what: str, hint: str) -> None:
    """Dry run: the local host has no GPU for `what`, said plainly."""
    say(
        f"# dry-run: no GPU on the local host ({gpus.seen}): {what} needs NVIDIA GPUs and "
        f"would stop at once here.{' ' + hint if hint else ''}"
    )


def verl_version() -> str | None:
    """The installed verl's version, from its metadata (no import)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_verl(launch: Launch) -> None:
    found = verl_version()
    if found is None:
        launch.fail(
            f"verl is not installed in {launch.python} (install it with: pip install "
            "'verl[verl-core]==0.9.1', or bash tools/setup.sh dev)"
        )
    elif found != "0.9.1":
        launch.fail(
            f"verl {found} is installed; entropyrl's plugin is written for verl 0.9.1 (pip "
            "install 'verl[verl-core]==0.9.1')"
        )


def preflight(launch: Launch, config: str, overrides: Sequence[str]) -> dict[str, str]:
    """Before anything starts: the recipe composed with the overrides the training command gets
    and checked, one line per problem (exit 2). A run whose checkpoint is at its last step stops
    here (exit 0), having said so."""
    if verl_version() is None:
        from entropyrl.commands.preflight import NO_VERL

        launch.fail(NO_VERL)
        say("# dry-run: the recipe's checks and the step's split need verl; skipped")
        return {}
    from entropyrl.commands import preflight as checks

    mode = "smoke" if launch.smoke else "gpu"
    status, values = checks.check(config, overrides, mode=mode, dry_run=launch.dry_run)
    if status != 0:
        raise Stop(status)
    if values.get("ER_NOTHING_TO_DO") == "1" and not launch.dry_run:
        raise Stop(0)  # the checkpoint is at the run's last step (said above)
    return values


def require_file(launch: Launch, path: str, what: str) -> None:
    if not Path(path).is_file():
        launch.fail(f"missing {path} ({what})")


def require_model(launch: Launch, model: str) -> None:
    """A local folder with config.json, or a hub id already in the local cache (training never
    downloads at run time)."""
    if Path(model).is_dir():
        if not (Path(model) / "config.json").is_file():
            launch.fail(f"model folder {model} has no config.json")
        return
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(model, local_files_only=True)
    except Exception:
        launch.fail(
            f"model {model} is neither a local folder nor in the Hugging Face cache (download "
            f"it first: hf download {model}, or set MODEL_PATH to a local folder)"
        )


def plugin_problem(python: str, *flags: str) -> str | None:
    """Whether verl loads our plugin in a fresh process (`entropyrl doctor --discovery`)."""
    result = subprocess.run(
        [python, "-m", "entropyrl", "doctor", "--discovery", *flags],
        capture_output=True,
        text=True,
    )
    if result.returncode == 0:
        return None
    problem = result.stdout.strip() or "entropyrl doctor failed"
    return f"the entropyrl verl plugin does not load: {problem} (run: {python} -m entropyrl doctor)"
