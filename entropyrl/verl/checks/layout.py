"""Where a run lands: the GPUs this process sees, the inputs it reads, the prompt bound, the
budget of a step, and on several nodes a checkpoint folder they all share."""

from __future__ import annotations

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
    """`entropyrl.verl.checks.prompt_bound`'s verdicts: with verl's length filter off, every prompt fits
    `data.max_prompt_length`, and `rollout.max_model_len` holds a prompt and a response."""
    from entropyrl.verl.checks.prompt_bound import prompt_bound

    return [
        Finding("config" if "max_model_len" in line else "inputs", ok, line)
        for ok, line in prompt_bound(config)
    ]


def budget_lines(config: Any) -> list[str]:
    """The run's budget (`entropyrl.verl.checks.budget`) from what is here: the data files' row
    counts, the image sizes prepare coco recorded, the model's config; empty without data."""
    from entropyrl.verl.checks import budget

    train_files = budget.data_files(config, "data.train_files")
    train_rows = budget.parquet_rows(train_files)
    val_rows = budget.parquet_rows(budget.data_files(config, "data.val_files"))
    if train_rows is None or val_rows is None:
        return ["not computed: the data files are not here yet"]
    from entropyrl.verl.checks.prompt_bound import model_folder

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
