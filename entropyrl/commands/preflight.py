"""What a launch script checks before it starts anything: the recipe as verl would compose it.

    python -m entropyrl.commands.preflight CONFIG [--mode gpu|smoke] [--dry-run] [--env-out FILE]
        -- OVERRIDE ...

CONFIG is a recipe name (`configs/<name>.yaml`) or a path to a config file; the overrides are
exactly those the training command will get. The config is composed with Hydra as
`verl.trainer.main_ppo` composes it, then checked:

- config (always refused): unknown or out-of-range `algorithm.*` keys and a batch geometry verl
  would assert on later (`entropyrl.verl.geometry`), the same checks the plugin runs inside
  `main_ppo`, here before the CHAIR service, Ray or a smoke's asset build start;
- stack (GPU runs): verl, vLLM, torch and transformers against verl 0.9.1's pins, flash-attn
  when the recipe's attention needs it (`stack_problems`);
- layout (GPU runs): the GPUs this process sees against the config's `n_gpus_per_node`, and on
  more than one node a checkpoint folder every node shares;
- prompts (always): with verl's length filter off, every prompt fits `data.max_prompt_length`,
  proven from the image sizes `entropyrl prepare coco` records (`prompt_findings`), and
  `rollout.max_model_len` holds a prompt and its response;
- checkpoints (always): a folder holding another run's checkpoint is refused; a run already at
  its last step is reported, and the launch script stops there (`entropyrl.verl.checkpoints`).

Each problem is one line on stderr; the exit status is 2 when the run must not start. With
`--dry-run` the split of a step is printed too, and environment problems are notes. `--env-out`
writes what the launch script needs from the composed config (nodes, checkpoint folder) as
shell assignments. `entropyrl doctor --recipe` runs the same checks and reports each.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropyrl.commands.forward import add_forwarded

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SUPPORTED_VERL = "0.9.1"
# Attention implementations verl's FSDP engine asks transformers for that need flash-attn.
FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3")
# verl 0.9.1 patches the Qwen2-VL / Qwen2.5-VL attention for remove-padding with
# flash_attn_varlen_func (verl/models/transformers/qwen2_vl.py), whatever the implementation.
FLASH_VARLEN_MODELS = ("qwen2_vl", "qwen2_5_vl")
# Node-local file systems: a checkpoint folder there is not shared between nodes.
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "vfat", "ramfs"}
)
SHARED_OK_ENV = "CHECKPOINTS_SHARED"


@dataclass(frozen=True)
class Finding:
    """One check's verdict: `ok` False means the run cannot start as configured."""

    check: str  # config | stack | gpus | inputs | nodes
    ok: bool
    line: str
    # False: the run may still start (a version off verl's pins): a warning in the launch
    # scripts, the dry run and the doctor alike.
    blocking: bool = True


# What a GPU node installs (verl[vllm] at verl's pins, and ours): never a CPU machine's advice.
GPU_INSTALL = "on the GPU node: pip install -e '.[gpu]' (docs/install.md)"
# Without verl (and the Hydra it brings) no recipe can be composed. A planning machine needs
# the CPU route, a GPU node the gpu extra: never the other way round (docs/install.md).
NO_VERL = (
    "verl is not installed (nor Hydra, which comes with it), so the recipe cannot be composed: "
    "to plan on a CPU machine, the CPU route: pip install torch==2.13.0, then pip install -e "
    "'.[local,verl]' (or bash tools/setup.sh dev; docs/install.md), never the gpu extra there; "
    "on a GPU node: pip install -e '.[gpu]'"
)


def verl_installed() -> bool:
    """Whether verl's distribution is installed here (read from its metadata, no import)."""
    return _version("verl") is not None


def config_path(recipe: str) -> Path:
    """`configs/<recipe>.yaml` for a recipe name, else the path given (ValueError if neither)."""
    path = Path(recipe)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path.resolve()
    named = REPO_CONFIGS / f"{recipe}.yaml"
    if named.is_file():
        return named
    names = ", ".join(sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml") if "common" not in p.stem))
    raise ValueError(f"no recipe {recipe!r}: give one of {names} or a path to a .yaml config")


def verl_config_dir() -> Path:
    """verl's own config folder (`verl/trainer/config`), found without importing verl."""
    from entropyrl.verl.validation import verl_source_dir

    folder = verl_source_dir()
    if folder is None:
        raise ValueError("verl is not installed: pip install 'verl[verl-core]==0.9.1'")
    return folder / "trainer" / "config"


def compose_recipe(recipe: str, overrides: Sequence[str] = ()) -> Any:
    """The config `python -m verl.trainer.main_ppo --config-path DIR --config-name NAME
    OVERRIDES` trains with (Hydra's own composition; its `hydra.*` overrides do not matter).

    The recipes find verl's config as `pkg://verl.trainer.config`, which imports verl (torch,
    Ray, ...: seconds); the same folder is given here as a file path, so checking a config takes
    well under a second (tests/commands/test_preflight.py: the same config either way)."""
    from hydra import compose, initialize_config_dir

    path = config_path(recipe)
    job = [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]
    job.append(f"hydra.searchpath=[file://{verl_config_dir()}]")
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        return compose(config_name=path.stem, overrides=job)


def run_roles(config: Any) -> tuple[bool, bool]:
    """(reference policy, critic) as verl's `need_reference_policy` and `need_critic` decide
    them (verl/trainer/ppo/utils.py), without importing verl (tested equal)."""
    reference = bool(_select(config, "algorithm.use_kl_in_reward", False)) or bool(
        _select(config, "actor_rollout_ref.actor.use_kl_loss", False)
    )
    critic = _select(config, "critic.enable")
    if critic is None:
        critic = _select(config, "algorithm.adv_estimator") == "gae"
    return reference, bool(critic)


def _select(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    value = OmegaConf.select(config, key, default=default, throw_on_missing=False)
    return default if value is None else value


def config_findings(config: Any) -> list[Finding]:
    """Algorithm settings and batch geometry: what the plugin refuses inside main_ppo."""
    from entropyrl.verl.validation import config_problems

    reference, critic = run_roles(config)
    problems = config_problems(config, use_reference_policy=reference, use_critic=critic)
    return [Finding("config", False, line) for line in problems]


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


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


def vision_stack_findings(config: Any) -> list[Finding]:
    """An image model through verl's own dataset and agent loop needs `qwen_vl_utils` and the
    torchvision it imports: without them verl's length filter drops every image row (an
    exception in its `doc2len` counts as too long) and every rollout fails."""
    import importlib.util

    kind = model_type(str(_select(config, "actor_rollout_ref.model.path", "")))
    custom = str(_select(config, "data.custom_cls.path", "") or "")
    if kind not in IMAGE_MODELS or PILLOW_DATASET in custom:
        return []
    findings = []
    for module, install in (
        ("torchvision", "pip install torchvision==0.26.0 (verl 0.9.1's pin, with torch 2.11)"),
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


# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA toolkit release notes,
# "CUDA Toolkit and Minimum Required Driver Version"): minor-version compatibility holds within
# a major version, not across.
DRIVER_FOR_CUDA = {13: (580, 65, 6), 12: (525, 60, 13), 11: (450, 80, 2)}


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


def driver_findings(
    driver: str | None, torch_version: str | None, cuda: str | None
) -> list[Finding]:
    """The node's NVIDIA driver against the CUDA the installed torch was built for: a driver too
    old for it leaves `torch.cuda.is_available()` False while `nvidia-smi` lists every GPU."""
    try:
        have = tuple(int(part) for part in (driver or "").split("."))
    except ValueError:
        have = ()
    if not have or torch_version is None:
        return []  # no NVIDIA driver to judge (the GPU check says so) or no torch (above)
    if cuda is None:
        return [
            Finding(
                "stack",
                False,
                f"torch {torch_version} is a CPU build on a node with NVIDIA driver {driver}: "
                "pip install -e '.[gpu]' installs verl's CUDA build (torch 2.11.0, CUDA 13.0)",
            )
        ]
    major = int(cuda.split(".")[0])
    need = DRIVER_FOR_CUDA.get(major)
    ok = need is None or have >= need
    line = f"NVIDIA driver {driver}, torch {torch_version} built for CUDA {cuda}"
    if not ok:
        line += (
            f": CUDA {major} needs driver {'.'.join(map(str, need))} or newer (the R{need[0]} "
            "series); with this driver torch sees no GPU: upgrade the driver (PyPI's torch "
            "2.11.0 and vLLM 0.24.0, verl 0.9.1's pins, are CUDA 13 builds)"
        )
    return [Finding("stack", ok, line)]


def stack_findings(config: Any) -> list[Finding]:
    """verl, vLLM, torch, transformers and flash-attn as the GPU recipe needs them."""
    from packaging.version import Version

    findings = []
    verl_version = _version("verl")
    findings.append(
        Finding(
            "stack",
            verl_version == SUPPORTED_VERL,
            f"verl {verl_version or 'not installed'}"
            + (
                ""
                if verl_version == SUPPORTED_VERL
                else f": entropyrl's plugin needs verl {SUPPORTED_VERL}; {GPU_INSTALL}"
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
                    f"{name} is not installed (rollout '{rollout}'): {GPU_INSTALL} "
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
                f"{name} {found}: verl {SUPPORTED_VERL} pins {name}{pin}; {GPU_INSTALL} installs "
                "the tested stack"
            )
        findings.append(Finding("stack", ok, line, blocking=False))
    driver = nvidia_driver()  # torch is imported only where there is a driver to compare
    findings += driver_findings(driver, *(torch_build() if driver else (None, None)))
    findings += vision_stack_findings(config)
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
                    else f"not installed, and {why}: MAX_JOBS=8 pip install flash-attn==2.8.3 "
                    "--no-build-isolation (after torch), or run without it: "
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


def visible_gpus() -> int:
    """CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies), 0 without CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def gpu_findings(config: Any, visible: int | None = None) -> list[Finding]:
    visible = visible_gpus() if visible is None else visible
    per_node = int(_select(config, "trainer.n_gpus_per_node", 0))
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
    if visible == 0:
        return [
            Finding(
                "gpus",
                False,
                f"GPUs: none visible to this process{where}; the recipe asks for {per_node} "
                "per node (trainer.n_gpus_per_node): run it on a GPU node, or on the local CPU "
                "with --smoke",
            )
        ]
    ok = visible >= per_node
    return [
        Finding(
            "gpus",
            ok,
            f"GPUs: {visible} visible{where}, the recipe uses {per_node} per node"
            + (
                ""
                if ok
                else f": set trainer.n_gpus_per_node={visible} (or N_GPUS), or make more GPUs "
                "visible"
            ),
        )
    ]


def input_findings(config: Any) -> list[Finding]:
    """The data files and the policy model the run reads (training never downloads)."""
    findings = []
    for key in ("data.train_files", "data.val_files"):
        value = _select(config, key)
        files = [value] if isinstance(value, str) else list(value or [])
        missing = [f for f in files if not Path(str(f)).is_file()]
        findings.append(
            Finding(
                "inputs",
                not missing,
                f"{key}: "
                + (
                    ", ".join(map(str, files))
                    if not missing
                    else f"{', '.join(map(str, missing))} not found (entropyrl prepare ... "
                    "writes it; give the path with DATA_DIR or the override)"
                ),
            )
        )
    model = str(_select(config, "actor_rollout_ref.model.path", ""))
    local = Path(model).is_dir() and (Path(model) / "config.json").is_file()
    cached = local or _in_hub_cache(model)
    findings.append(
        Finding(
            "inputs",
            cached,
            f"model {model}: "
            + (
                "local folder"
                if local
                else "in the Hugging Face cache"
                if cached
                else f"neither a local folder nor in the Hugging Face cache (hf download {model}, "
                "or MODEL_PATH=/a/local/folder)"
            ),
        )
    )
    return findings


def prompt_findings(config: Any) -> list[Finding]:
    """`entropyrl.verl.prompt_bound`'s verdicts: with verl's length filter off, every prompt fits
    `data.max_prompt_length`, and `rollout.max_model_len` holds a prompt and a response."""
    from entropyrl.verl.prompt_bound import prompt_bound

    return [
        Finding("config" if "max_model_len" in line else "inputs", ok, line)
        for ok, line in prompt_bound(config)
    ]


def budget_lines(config: Any) -> list[str]:
    """The run's budget (`entropyrl.verl.budget`) from what is here: the data files' row
    counts, the image sizes prepare coco recorded, the model's config; empty without data."""
    from entropyrl.verl import budget

    train_files = budget.data_files(config, "data.train_files")
    train_rows = budget.parquet_rows(train_files)
    val_rows = budget.parquet_rows(budget.data_files(config, "data.val_files"))
    if train_rows is None or val_rows is None:
        return ["not computed: the data files are not here yet"]
    from entropyrl.verl.prompt_bound import model_folder

    folder = model_folder(str(_select(config, "actor_rollout_ref.model.path", "")))
    sizes = grid = None
    temporal = 2
    parameters = None
    if folder is not None:
        if (folder / "preprocessor_config.json").is_file() or (
            folder / "processor_config.json"
        ).is_file():
            from entropyrl.data.prompt_length import VisionGrid

            grid = VisionGrid.from_model(folder)
            temporal = budget.temporal_patch_size(folder)
            data = Path(train_files[0]).resolve().parent
            sizes = budget.sizes_from_manifest(data)
        if model_type(str(folder)) is not None:  # a real config.json, not a stand-in
            try:
                parameters = budget.parameter_count(folder)
            except Exception:  # a model transformers cannot build here: no disk figure
                parameters = None
    plan = budget.budget(config, train_rows, val_rows, sizes, grid, temporal, parameters)
    return budget.describe(plan)


def _in_hub_cache(model: str) -> bool:
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(model, local_files_only=True)
    except Exception:
        return False
    return True


def filesystem_type(path: Path) -> str | None:
    """The type of the file system holding `path` (longest mount point of /proc/mounts)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    best, kind = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (str(path) == point or str(path).startswith(point.rstrip("/") + "/")) and len(
            point
        ) > len(best):
            best, kind = point, fields[2]
    return kind


def node_findings(config: Any) -> list[Finding]:
    """On more than one node: a checkpoint folder every node writes to and resumes from."""
    nodes = int(_select(config, "trainer.nnodes", 1))
    if nodes <= 1:
        return []
    folder = str(_select(config, "trainer.default_local_dir", ""))
    key = "trainer.default_local_dir"
    if not os.path.isabs(folder):
        return [
            Finding(
                "nodes",
                False,
                f"{key}={folder} is relative: on {nodes} nodes each rank saves its shard under "
                "its own working folder and no node can resume or merge the checkpoint; set "
                f"{key} to an absolute folder every node mounts (NFS, Lustre, ...)",
            )
        ]
    kind = filesystem_type(Path(folder))
    shared_by_user = os.environ.get(SHARED_OK_ENV) == "1"
    if kind in LOCAL_FILESYSTEMS and not shared_by_user:
        return [
            Finding(
                "nodes",
                False,
                f"{key}={folder} is on this node's local disk ({kind}): on {nodes} nodes each "
                "rank would save its shard on its own node and no node could resume or merge "
                f"the checkpoint; set {key} to a folder every node mounts, or {SHARED_OK_ENV}=1 "
                "if this one is shared another way",
            )
        ]
    return [Finding("nodes", True, f"checkpoints: {folder} ({kind or 'unknown'} file system)")]


def run_values(config: Any, *, nothing_to_do: bool = False) -> dict[str, str]:
    """What the launcher reads from the composed config: nodes, GPUs per node, the checkpoint
    folder, and whether the checkpoint is already at the run's last step."""
    return {
        "ER_NNODES": str(int(_select(config, "trainer.nnodes", 1))),
        "ER_GPUS_PER_NODE": str(int(_select(config, "trainer.n_gpus_per_node", 0))),
        "ER_CHECKPOINT_DIR": str(_select(config, "trainer.default_local_dir", "")),
        "ER_NOTHING_TO_DO": "1" if nothing_to_do else "0",
    }


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


_NOT_IN_STRUCT = re.compile(r"Could not override '([^']+)'")


def composition_problem(recipe: str, error: Exception, overrides: Sequence[str] = ()) -> str:
    """Hydra's composition error as one line with the fix. A key the recipe does not have
    (Hydra: "Could not override ... use +key"): under one of our algorithm sections, the
    section's accepted keys (a `+` would only move the refusal to our check); elsewhere, that the
    key is not in the config, so a misspelling is the likelier cause than a missing `+`."""
    text = " ".join(str(error).split())
    match = _NOT_IN_STRUCT.search(text)
    if match:
        key = match.group(1)
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "algorithm":
            from entropyrl.core.specs import SpecError, algorithm_specs

            try:
                algorithm_specs({parts[1]: {parts[2]: None}})
            except SpecError as refusal:
                return str(refusal)
        near = _near_keys(recipe, overrides, key)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        return (
            f"{key} is not a key of the {recipe} config{hint} (a key it lacks on purpose takes a "
            f"leading +: +{key}=...)"
        )
    return f"{recipe}: {text}"


def _near_keys(recipe: str, overrides: Sequence[str], key: str) -> list[str]:
    """Keys of the config beside `key` that look like it (composed without the override)."""
    import difflib

    from omegaconf import OmegaConf

    rest = [item for item in overrides if item.split("=", 1)[0].lstrip("+~") != key]
    try:
        parent_key, _, name = key.rpartition(".")
        config = compose_recipe(recipe, rest)
        parent = OmegaConf.select(config, parent_key) if parent_key else config
        names = [str(k) for k in parent] if OmegaConf.is_dict(parent) else []
    except Exception:  # the rest does not compose either: no suggestion
        return []
    prefix = f"{parent_key}." if parent_key else ""
    return [prefix + near for near in difflib.get_close_matches(name, names, n=2)]


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m entropyrl.commands.preflight"
) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check a recipe with the run's overrides before anything starts.",
    )
    parser.add_argument("config", help="recipe name (configs/<name>.yaml) or a config path")
    parser.add_argument(
        "--mode",
        choices=("gpu", "smoke"),
        default="gpu",
        help="gpu: also check the stack, the GPUs and multi-node folders (default)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the step's split; environment as notes"
    )
    parser.add_argument("--env-out", type=Path, help="write ER_NNODES=... for the launch script")
    parser.epilog = "Hydra overrides follow a `--`, exactly as the training command gets them."
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.overrides = argv[split + 1 :]
    status, values = check(args.config, args.overrides, mode=args.mode, dry_run=args.dry_run)
    if args.env_out is not None and values:
        args.env_out.write_text(
            "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items())
        )
    return status


def check(
    recipe: str, overrides: Sequence[str], *, mode: str = "gpu", dry_run: bool = False
) -> tuple[int, dict[str, str]]:
    """Compose `recipe` with `overrides` and check it, one line on stderr per finding (notes in
    a dry run). Returns the exit status (2: something would stop the run) and `run_values`
    (empty when the recipe did not compose)."""
    try:
        config = compose_recipe(recipe, overrides)
    except Exception as error:  # Hydra's composition errors: one line, not a traceback
        _say(f"error: {composition_problem(recipe, error, overrides)}")
        return 2, {}
    findings = config_findings(config)  # with the prompt bound's refusals
    if dry_run and not findings:
        from entropyrl.verl.geometry import batch_geometry, describe

        reference, critic = run_roles(config)
        geometry = batch_geometry(config, use_reference_policy=reference, use_critic=critic)
        for line in describe(geometry):
            _say(f"# dry-run: batch {line}")
        for finding in prompt_findings(config):
            _say(f"# dry-run: {finding.line}")
        for line in budget_lines(config):
            _say(f"# dry-run: budget: {line}")
    if mode == "gpu":
        # No GPU at all is the launch script's own first check (and a dry run's note).
        gpus = gpu_findings(config) if visible_gpus() > 0 else []
        environment = [*stack_findings(config), *gpus, *node_findings(config)]
        for finding in environment:
            if finding.ok:
                continue
            if dry_run:
                verdict = "would stop" if finding.blocking else "would warn"
                _say(f"# dry-run: {verdict}: {finding.line}")
            elif finding.blocking:
                findings.append(finding)
            else:
                _say(f"warning: {finding.line}")
    # The checkpoint folder: another run's checkpoint is refused, a finished run stops here.
    from entropyrl.verl.checkpoints import resume_decision

    decision = resume_decision(config)
    if decision.kind == "other_run":
        findings.append(Finding("checkpoints", False, decision.line))
    elif decision.kind in ("resume", "unknown", "finished") and not findings:
        _say(f"# dry-run: {decision.line}" if dry_run else decision.line)
    values = run_values(config, nothing_to_do=decision.kind == "finished")
    for finding in findings:
        _say(f"error: {finding.line}")
    return (2 if findings else 0), values


def register(subparsers: Any) -> None:
    """Add `preflight` to the `entropyrl` command line (the parser of
    `python -m entropyrl.commands.preflight`)."""
    add_forwarded(
        subparsers,
        "preflight",
        __name__,
        "check a recipe and its overrides without starting verl (what the launch scripts run first)",
    )


if __name__ == "__main__":
    sys.exit(main())
