"""The software stack a GPU recipe needs: verl, vLLM, torch, transformers, flash-attn, the
vision packages, and the NVIDIA driver against the CUDA torch was built for."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from entropyrl.verl.checks.findings import Finding
from entropyrl.verl.checks.findings import installed_version as _version
from entropyrl.verl.checks.findings import select as _select

SUPPORTED_VERL = "0.9.1"
# Attention implementations verl's FSDP engine asks transformers for that need flash-attn.
FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3")
# verl 0.9.1 patches the Qwen2-VL / Qwen2.5-VL attention for remove-padding with
# flash_attn_varlen_func (verl/models/transformers/qwen2_vl.py), whatever the implementation.
FLASH_VARLEN_MODELS = ("qwen2_vl", "qwen2_5_vl")
# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA toolkit release notes,
# "CUDA Toolkit and Minimum Required Driver Version"): minor-version compatibility holds within
# a major version, not across.
DRIVER_FOR_CUDA = {13: (580, 65, 6), 12: (525, 60, 13), 11: (450, 80, 2)}


# Without a driver to read (a planning machine), the GPU install is named by its routes.
GPU_INSTALL = "on the GPU node: the install route for its NVIDIA driver (docs/install.md#gpu-nodes)"
# Without verl (and the Hydra it brings) no recipe can be composed. A planning machine needs
# the CPU route, a GPU node the gpu extra: never the other way round (docs/install.md).
NO_VERL = (
    "verl is not installed (nor Hydra, which comes with it), so the recipe cannot be composed: "
    "to plan on a CPU machine, the CPU route: pip install torch==2.13.0, then pip install -e "
    "'.[local,verl]' (or bash tools/setup.sh dev; docs/install.md), never the gpu extra there; "
    "on a GPU node: the install route for its NVIDIA driver (docs/install.md#gpu-nodes)"
)
# The one spelling of flash-attn's build (verl 0.9.1's pin; PyPI has only its source and
# Dao-AILab publishes no wheel for torch 2.11), the same in the README, docs/install.md and
# pyproject.toml (tests/test_dockerfile.py holds them together).
FLASH_ATTN_BUILD = (
    'MAX_JOBS=8 FLASH_ATTN_CUDA_ARCHS="80;90" pip install flash-attn==2.8.3 --no-build-isolation'
)
# The container route's published base image: verl's own stable vLLM image (CUDA 13.0.2, torch
# 2.11.0, vLLM 0.24.0, flash-attn 2.8.3; verl's docker/Dockerfile.stable.vllm and CI).
CONTAINER_IMAGE = "verlai/verl:vllm024.dev2"
ROUTE_A = "route (a), CUDA 13 from PyPI: pip install -e '.[gpu]' (docs/install.md#route-a-cuda-13-drivers-r580)"
ROUTE_B = (
    "route (b), the CUDA 12.9 builds of verl's pins: pip install torch==2.11.0 torchvision==0.26.0 "
    "torchaudio==2.11.0 --index-url https://download.pytorch.org/whl/cu129, then vLLM 0.24.0's "
    "cu129 wheel and flash-attn, python tools/stack_constraints.py > stack.txt, pip install -c "
    "stack.txt -e '.[preinstalled]' (docs/install.md#route-b-cuda-12-drivers-r525-r579)"
)
ROUTE_C = (
    f"route (c), the container FROM {CONTAINER_IMAGE}: docker build -t entropyrl:gpu . "
    "(docs/install.md#route-c-the-container)"
)


def driver_tuple(driver: str | None) -> tuple[int, ...]:
    """`550.54.15` -> (550, 54, 15); () for no driver or an unreadable one."""
    try:
        return tuple(int(part) for part in (driver or "").split("."))
    except ValueError:
        return ()


def gpu_install_for(driver: str | None) -> str:
    """The install route that works with NVIDIA `driver` (`nvidia-smi`'s version), one line.

    R580+ runs PyPI's CUDA 13 builds (route a); a CUDA 12 driver runs the CUDA 12.9 builds by
    minor-version compatibility (route b) or the container (route c); older drivers run none of
    the pip routes."""
    have = driver_tuple(driver)
    if not have:
        return GPU_INSTALL
    if have >= DRIVER_FOR_CUDA[13]:
        return f"{ROUTE_A}, or {ROUTE_C}"
    if have >= DRIVER_FOR_CUDA[12]:
        return f"NVIDIA driver {driver} is a CUDA 12 driver: {ROUTE_B}; or {_COMPAT}{ROUTE_C}"
    return (
        f"NVIDIA driver {driver} runs neither CUDA 13 nor CUDA 12.9: upgrade it (R580+ for "
        f"route (a), R525.60.13+ for route (b)); or {_COMPAT}{ROUTE_C}"
    )


# The image's CUDA 13 on an older driver: NVIDIA's forward compatibility, data-centre GPUs only.
_COMPAT = (
    "on data-centre GPUs whose driver branch NVIDIA's CUDA 13 forward-compatibility table lists, "
)


def verl_pins(extra: str = "vllm") -> dict[str, Any]:
    """{package: SpecifierSet} that verl 0.9.1 requires with `extra` (and in its base)."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    pins: dict[str, Any] = {}
    for text in requires("verl") or ():
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or marker.evaluate({"extra": extra}):
            name = requirement.name.lower()
            if name in pins:
                pins[name] = pins[name] & requirement.specifier
            else:
                pins[name] = requirement.specifier
    return pins


def model_type(model_path: str) -> str | None:
    """`model_type` of a local checkpoint's config.json, or a guess from a hub id."""
    import json

    config = Path(model_path) / "config.json"
    if config.is_file():
        try:
            return str(json.loads(config.read_text()).get("model_type") or "") or None
        except (OSError, ValueError):
            return None
    name = model_path.lower()
    if "qwen2.5-vl" in name or "qwen2_5_vl" in name:
        return "qwen2_5_vl"
    if "qwen2-vl" in name:
        return "qwen2_vl"
    if "qwen3-vl" in name:
        return "qwen3_vl"
    return None


IMAGE_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
PILLOW_DATASET = "entropyrl.rig.dataset"  # data.custom_cls that needs neither (CPU runs)


def vision_stack_findings(config: Any, driver: str | None = None) -> list[Finding]:
    """An image model through verl's own dataset and agent loop needs `qwen_vl_utils` and the
    torchvision it imports: without them verl's length filter drops every image row (an
    exception in its `doc2len` counts as too long) and every rollout fails. On a CUDA 12
    driver (`driver`) torchvision comes from the CUDA 12.9 index, as its torch does."""
    import importlib.util

    kind = model_type(str(_select(config, "actor_rollout_ref.model.path", "")))
    custom = str(_select(config, "data.custom_cls.path", "") or "")
    if kind not in IMAGE_MODELS or PILLOW_DATASET in custom:
        return []
    findings = []
    for module, install in (
        ("torchvision", _torchvision_install(driver)),
        ("qwen_vl_utils", "pip install qwen-vl-utils"),
    ):
        found = importlib.util.find_spec(module) is not None
        findings.append(
            Finding(
                "stack",
                found,
                f"{module}: "
                + (
                    "importable"
                    if found
                    else f"not installed, and verl's dataset and agent loop read {kind}'s images "
                    f"through qwen_vl_utils: {install}"
                ),
            )
        )
    return findings


def _torchvision_install(driver: str | None) -> str:
    """verl 0.9.1's torchvision pin, from the index of the route the driver needs."""
    have = driver_tuple(driver)
    if have and DRIVER_FOR_CUDA[12] <= have < DRIVER_FOR_CUDA[13]:
        return (
            "pip install torchvision==0.26.0 --index-url https://download.pytorch.org/whl/cu129 "
            "(verl 0.9.1's pin, route (b)'s CUDA 12.9 build)"
        )
    return "pip install torchvision==0.26.0 (verl 0.9.1's pin, with torch 2.11)"


def attention_needs_flash(config: Any) -> str | None:
    """Why this config needs the flash-attn package in the actor and reference (None: it
    does not). vLLM brings its own kernels for the rollout."""
    attention = _select(
        config, "actor_rollout_ref.model.override_config.attn_implementation", "flash_attention_2"
    )
    if attention in FLASH_ATTENTION:
        return (
            f"the actor's attention is {attention} (verl's default; "
            "actor_rollout_ref.model.override_config.attn_implementation)"
        )
    kind = model_type(str(_select(config, "actor_rollout_ref.model.path", "")))
    if _select(config, "actor_rollout_ref.model.use_remove_padding", False) and (
        kind in FLASH_VARLEN_MODELS
    ):
        return (
            f"verl's remove-padding patch for {kind} calls flash_attn_varlen_func "
            "(actor_rollout_ref.model.use_remove_padding=true)"
        )
    return None


def nvidia_driver() -> str | None:
    """The NVIDIA driver version `nvidia-smi` reports (first GPU), None without one."""
    import subprocess

    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = result.stdout.split()
    if result.returncode != 0 or not lines or not re.fullmatch(r"\d+(\.\d+)+", lines[0]):
        return None
    return lines[0]


def torch_build() -> tuple[str | None, str | None]:
    """(torch's version, the CUDA version it was built for; None for a CPU build)."""
    version = _version("torch")
    if version is None:
        return None, None
    import torch

    return version, torch.version.cuda


def torch_sees_gpu() -> bool:
    """Whether the installed torch reaches a GPU (CUDA initialises through the driver, or
    through CUDA's forward-compatibility libraries where they are on the library path)."""
    import torch

    return bool(torch.cuda.is_available())


def driver_findings(
    driver: str | None,
    torch_version: str | None,
    cuda: str | None,
    sees_gpu: bool | None = None,
) -> list[Finding]:
    """The node's NVIDIA driver against the CUDA the installed torch was built for, and so the
    install route in use: a driver too old for torch's CUDA leaves `torch.cuda.is_available()`
    False while `nvidia-smi` lists every GPU, unless CUDA's forward-compatibility libraries
    carry it (`sees_gpu`: what torch reports; None when not asked)."""
    have = driver_tuple(driver)
    if not have or torch_version is None:
        return []  # no NVIDIA driver to judge (the GPU check says so) or no torch (above)
    route = gpu_install_for(driver)
    if cuda is None:
        return [
            Finding(
                "stack",
                False,
                f"torch {torch_version} is a CPU build on a node with NVIDIA driver {driver}: "
                f"{route}",
            )
        ]
    major = int(cuda.split(".")[0])
    need = DRIVER_FOR_CUDA.get(major)
    line = f"NVIDIA driver {driver}, torch {torch_version} built for CUDA {cuda}"
    if need is None or have >= need:
        which = "route (a)" if major >= 13 else "route (b)" if major == 12 else "an old CUDA"
        return [Finding("stack", True, f"{line} ({which})")]
    if sees_gpu:
        return [
            Finding(
                "stack",
                True,
                f"{line}: CUDA {major} runs on this driver through CUDA's forward-compatibility "
                "libraries (route (c), or NVIDIA's cuda-compat package)",
            )
        ]
    return [
        Finding(
            "stack",
            False,
            f"{line}: CUDA {major} needs driver {'.'.join(map(str, need))} or newer (the "
            f"R{need[0]} series); with this driver torch sees no GPU: {route}",
        )
    ]


def stack_findings(config: Any) -> list[Finding]:
    """verl, vLLM, torch, transformers and flash-attn as the GPU recipe needs them."""
    from packaging.version import Version

    findings = []
    driver = nvidia_driver()  # torch is imported only where there is a driver to compare
    install = gpu_install_for(driver)
    verl_version = _version("verl")
    findings.append(
        Finding(
            "stack",
            verl_version == SUPPORTED_VERL,
            f"verl {verl_version or 'not installed'}"
            + (
                ""
                if verl_version == SUPPORTED_VERL
                else f": entropyrl's plugin needs verl {SUPPORTED_VERL}; {install}"
            ),
        )
    )
    rollout = _select(config, "actor_rollout_ref.rollout.name", "vllm")
    pins = verl_pins("vllm" if rollout == "vllm" else "verl-core") if verl_version else {}
    wanted = ["transformers"] + (["vllm", "torch"] if rollout == "vllm" else [])
    for name in wanted:
        found = _version(name)
        spec = pins.get(name)
        if found is None:
            findings.append(
                Finding(
                    "stack",
                    False,
                    f"{name} is not installed (rollout '{rollout}'): {install} "
                    f"(verl's pin: {name}{_pin(spec)})",
                )
            )
            continue
        ok = spec is None or Version(found.split("+")[0]) in spec
        pin = _pin(spec)
        if ok:
            line = f"{name} {found}" + (f" (verl {SUPPORTED_VERL} pins {name}{pin})" if pin else "")
        else:
            line = (
                f"{name} {found}: verl {SUPPORTED_VERL} pins {name}{pin}; the tested stack: "
                f"{install}"
            )
        findings.append(Finding("stack", ok, line, blocking=False))
    if driver:
        version, cuda = torch_build()
        sees = torch_sees_gpu() if cuda is not None else None
        findings += driver_findings(driver, version, cuda, sees)
    findings += vision_stack_findings(config, driver)
    why = attention_needs_flash(config)
    if why is not None:
        available = _flash_attn_importable()
        findings.append(
            Finding(
                "stack",
                available,
                "flash-attn: "
                + (
                    "importable"
                    if available
                    else f"not installed, and {why}: {FLASH_ATTN_BUILD} (after torch, with the "
                    "nvcc of torch's CUDA; the container has it built), or run without it: "
                    "actor_rollout_ref.model.use_remove_padding=false "
                    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
                ),
            )
        )
    return findings


def _pin(spec: Any) -> str:
    """`==5.9.0` when the specifier pins one version, else the specifier ('' for none)."""
    if spec is None:
        return ""
    exact = [str(item) for item in spec if item.operator == "=="]
    return exact[0] if exact else str(spec)


def _flash_attn_importable() -> bool:
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        import flash_attn  # noqa: F401
    except Exception:  # an install built for another torch or CUDA fails at import
        return False
    return True
