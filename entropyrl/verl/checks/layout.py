"""Where a run lands: the GPUs this process sees, the inputs it reads, the prompt bound, the
budget of a step, and on several nodes a checkpoint folder they all share."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from entropyrl.verl.checks.findings import Finding
from entropyrl.verl.checks.findings import select as _select
from entropyrl.verl.checks.stack import model_type

# Node-local file systems: a checkpoint folder there is not shared between nodes.
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "vfat", "ramfs"}
)
SHARED_OK_ENV = "CHECKPOINTS_SHARED"


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


def input_findings(config: Any, files: bool = True) -> list[Finding]:
    """What the run reads: the data files and the policy model (training never downloads;
    `files=False` leaves them to a launch script that checks them itself), the model's chat
    template and a wandb logger's credentials (`entropyrl.verl.checks.inputs_extra`). The one
    list `entropyrl doctor` and the preflight report."""
    from entropyrl.verl.checks.inputs_extra import chat_template_findings, logger_findings

    extra = [*chat_template_findings(config), *logger_findings(config)]
    if not files:
        return extra
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
    return findings + extra


def prompt_findings(config: Any) -> list[Finding]:
    """`entropyrl.verl.checks.prompt_bound`'s verdicts: with verl's length filter off, every prompt fits
    `data.max_prompt_length`, and `rollout.max_model_len` holds a prompt and a response."""
    from entropyrl.verl.checks.prompt_bound import prompt_bound

    return [
        Finding("config" if "max_model_len" in line else "inputs", ok, line)
        for ok, line in prompt_bound(config)
    ]


# Row counts of a recipe's data when its files are not here yet: `entropyrl prepare coco
# --karpathy`'s split (Karpathy's train, 82,783 images; val 5,000).
RECIPE_ROWS = {"chair_mscoco": (82_783, 5_000, "entropyrl prepare coco --karpathy's split")}
# A COCO image's usual size, for the image tensors when no manifest records the sizes.
COCO_IMAGE = (640, 480)


def gpu_memory_bytes() -> tuple[float, str]:
    """Memory of this node's first GPU (nvidia-smi), else an 80 GB H100's, and where it came
    from."""
    import shutil
    import subprocess

    from entropyrl.verl.checks.plan import DEFAULT_GPU_BYTES

    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            mib = float(out.split()[0])
            return mib * 2**20, "nvidia-smi"
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
    return DEFAULT_GPU_BYTES, "assumed: an 80 GB H100; no GPU here to ask"


def model_shape(config: Any) -> Any:
    """The policy's `plan.ModelShape`: from its folder's config.json when the folder is here
    (it wins), else the numbers shipped for the recipes' models; None when neither."""
    from entropyrl.verl.checks import plan
    from entropyrl.verl.checks.prompt_bound import model_folder

    model = str(_select(config, "actor_rollout_ref.model.path", ""))
    folder = model_folder(model)
    if folder is not None and model_type(str(folder)) is not None:
        shipped = plan.shape_for(folder.name) or plan.shape_for(model)
        parameters = _parameter_count(str(folder))
        if parameters is None:  # a model transformers cannot build here: the shipped count
            parameters = shipped.parameters if shipped else None
        if parameters is not None:
            shape = plan.folder_shape(folder, parameters)
            if shape is not None:
                return shape
    return plan.shape_for(model)


@functools.lru_cache(maxsize=8)
def _parameter_count(folder: str) -> int | None:
    """`budget.parameter_count` once per folder (the fits check and the budget both ask)."""
    from entropyrl.verl.checks import budget

    try:
        return budget.parameter_count(folder)
    except Exception:
        return None


def run_layout(config: Any) -> Any:
    from entropyrl.verl.checks.plan import Layout

    memory, source = gpu_memory_bytes()
    return Layout(
        nodes=int(_select(config, "trainer.nnodes", 1)),
        per_node=max(int(_select(config, "trainer.n_gpus_per_node", 1) or 1), 1),
        gpu_bytes=memory,
        gpu_from=source,
    )


def fits_findings(config: Any) -> list[Finding]:
    """Whether a rank's GPU memory fits (`plan.fits_finding`); nothing for a model without
    known numbers."""
    from entropyrl.verl.checks.plan import fits_finding

    shape = model_shape(config)
    return [] if shape is None else [fits_finding(config, shape, run_layout(config))]


def budget_lines(config: Any, recipe: str | None = None, mode: str = "gpu") -> list[str]:
    """The run's budget (`entropyrl.verl.checks.budget`, `.plan`) from what is here: the data
    files' row counts (else the recipe's usual data), the image sizes prepare coco recorded,
    the model's config (else the numbers shipped for the recipes' models)."""
    from entropyrl.verl.checks import budget, plan
    from entropyrl.verl.checks.prompt_bound import model_folder

    lines: list[str] = []
    train_files = budget.data_files(config, "data.train_files")
    train_rows = budget.parquet_rows(train_files)
    val_rows = budget.parquet_rows(budget.data_files(config, "data.val_files"))
    data_here = train_rows is not None and val_rows is not None
    if not data_here:
        known = RECIPE_ROWS.get(Path(recipe).stem if recipe else "")
        if known is None:
            return ["not computed: the data files are not here yet"]
        train_rows, val_rows, where = known
        lines.append(f"data: not here yet; planned for {where} ({train_rows} / {val_rows} rows)")
    folder = model_folder(str(_select(config, "actor_rollout_ref.model.path", "")))
    shape = model_shape(config)
    sizes = grid = None
    temporal = 2
    from entropyrl.data.prompt_length import VisionGrid

    if folder is not None and (
        (folder / "preprocessor_config.json").is_file()
        or (folder / "processor_config.json").is_file()
    ):
        grid = VisionGrid.from_model(folder)
        temporal = budget.temporal_patch_size(folder)
        sizes = (
            budget.sizes_from_manifest(Path(train_files[0]).resolve().parent) if data_here else None
        )
    elif shape is not None and shape.vision:
        grid = plan.shipped_grid(shape.name)
    if sizes is None and grid is not None and not data_here:
        sizes = {"train": {COCO_IMAGE: 1}, "val": {COCO_IMAGE: 1}}
        lines.append(f"images: {COCO_IMAGE[0]}x{COCO_IMAGE[1]} assumed (COCO's usual size)")
    lora_rank = int(_select(config, "actor_rollout_ref.model.lora_rank", 0) or 0)
    adapters = shape.lora_parameters(lora_rank) if shape is not None and lora_rank else 0
    b = budget.budget(
        config,
        train_rows,
        val_rows,
        sizes,
        grid,
        temporal,
        shape.parameters if shape is not None else None,
        adapters,
    )
    lines += budget.describe(b)
    if shape is None:
        lines.append(
            "GPU memory, host memory and time: not computed (the model is not one of the "
            "recipes' models, and no config.json with its sizes is here)"
        )
        return lines
    if mode != "gpu":
        return lines
    from entropyrl.verl.checks.findings import run_roles

    layout = run_layout(config)
    reference, _ = run_roles(config)
    lines.append(plan.gpu_line(plan.gpu_plan(config, shape, layout), layout))
    step_images = float(b.step_pixel_bytes[0]) if b.step_pixel_bytes else 0.0
    host = plan.host_plan(config, shape, layout, step_images, reference=reference)
    lines.append(plan.host_line(host, shape))
    tokens, tokens_text = plan.tokens_per_step(config, _longest_prompt(config, folder))
    seconds, label = plan.step_seconds(shape, layout.ranks, tokens)
    lines.append(plan.time_line(seconds, b.total_steps, label, tokens_text))
    return lines


def _longest_prompt(config: Any, folder: Path | None) -> int | None:
    """The manifest's longest prompt in tokens, when the data and the model folder are here."""
    if folder is None:
        return None
    import re

    for _ok, line in prompt_findings_raw(config):
        found = re.match(r"prompts: at most (\d+) tokens", line)
        if found:
            return int(found.group(1))
    return None


def prompt_findings_raw(config: Any) -> list[tuple[bool, str]]:
    from entropyrl.verl.checks.prompt_bound import prompt_bound

    try:
        return prompt_bound(config)
    except Exception:  # no tokenizer to count with: the recipe's maximum instead
        return []


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
