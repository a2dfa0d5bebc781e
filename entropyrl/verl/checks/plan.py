"""Whether a run fits and how long it takes, before it starts: GPU memory per rank, host memory
per node, disk per checkpoint and an estimated step time (printed by `--dry-run`; a layout whose
GPU memory does not fit is refused).

Where each figure comes from (GB = 10^9 bytes):

- Training state (computed): verl's FSDP2 actor holds its parameters in fp32
  (`fsdp_config.model_dtype: fp32`), and fp32 gradients and Adam's two moments of what trains,
  sharded over all ranks: 16P / ranks in full fine-tuning; with LoRA the frozen base stays fp32
  (4P / ranks) and the adapters carry the rest (16L / ranks). `param_offload` /
  `optimizer_offload` move parameters and gradients / Adam's moments to host memory.
- Gathered bf16 parameters in flight (computed): the embedding, the lm_head (once when tied) and
  two decoder layers (the one computing and the prefetched next).
- Activations (measured on one H200, docs/cuda.md): 19.4 / 19.8 GB for Qwen2.5-VL-3B / -7B on a
  training micro-batch of 5 x 1,280 tokens, 23.4 GB for the no-gradient pass of 10 x 1,280
  tokens; scaled by the tokens of the recipe's micro-batches. Other models take the larger
  Qwen2.5-VL figure (estimated: the same vocabulary, whose float32 logits dominate).
- vLLM (config): `rollout.gpu_memory_utilization` of the GPU, beside the training state, which
  stays on the GPU while vLLM generates unless offloaded.
- Host memory (computed from verl 0.9.1's and vLLM 0.24's code): the reference model (a forward-
  only FSDP engine: `CPUOffloadPolicy`, in the ref's `model_dtype` fp32; not with LoRA, whose
  reference is the actor with its adapter off); at start-up every rank of a tied-embedding
  model builds the whole model in fp32 on the CPU (`get_init_weight_context_manager` uses meta
  tensors only without tied embeddings, and then rank 0 alone reads the weights); vLLM's
  multimodal processor cache, `mm_processor_cache_gb` (default 4 GiB) in each replica's engine
  core; with LoRA, vLLM's level-1 sleep keeps each replica's bf16 weights in host memory while
  the actor trains; a step's image tensors (TransferQueue) and each rank's fetch of its rows.
- Time (estimate): the step's tokens (rows x (prompt + maximum response)) over a published
  throughput: EasyR1 v0.3.2 `assets/baselines.md`, Qwen2.5-VL GRPO on 8 x H100.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entropyrl.verl.checks.findings import Finding
from entropyrl.verl.checks.findings import select as _select

MODELS_FILE = Path(__file__).with_name("models.json")
GIB = 1024**3
DEFAULT_GPU_BYTES = 80e9  # an 80 GB H100 / A100 when no nvidia-smi tells
MM_CACHE_GIB = 4.0  # vLLM 0.24 MultimodalConfig.mm_processor_cache_gb (vllm/config/multimodal.py)

# Measured on one H200 (docs/cuda.md): activation bytes of a training micro-batch of 5 x 1,280
# tokens and of a no-gradient pass of 10 x 1,280 tokens.
MEASURED_TOKENS = (6_400, 12_800)
MEASURED_ACTIVATIONS = {
    "Qwen2.5-VL-3B-Instruct": (19.4e9, 23.4e9),
    "Qwen2.5-VL-7B-Instruct": (19.8e9, 23.4e9),
}
# EasyR1 v0.3.2 assets/baselines.md, "Performance Baselines": Qwen2.5-VL GRPO on Geometry3k,
# 8 x H100 80GB, vLLM TP 2; 3B at micro-batches 1 / 2, 7B at 4 / 8 (1,600 tokens/s at 1 / 2).
THROUGHPUT_SOURCE = "EasyR1 v0.3.2 assets/baselines.md, GRPO on 8 x H100"
# tokens/s per GPU, (the model EasyR1 measured, its s/step, peak host GB, peak GPU GB)
THROUGHPUT = {
    "Qwen2.5-VL-3B-Instruct": (1_800.0, "Qwen2.5-VL-3B", 120, 120, 54),
    "Qwen2.5-VL-7B-Instruct": (2_000.0, "Qwen2.5-VL-7B", 120, 200, 72),
}
# No published figure: the nearest size's.
THROUGHPUT_STAND_IN = {
    "Qwen3-VL-4B-Instruct": "Qwen2.5-VL-3B-Instruct",
    "Qwen3-VL-8B-Instruct": "Qwen2.5-VL-7B-Instruct",
}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model's config.json the plan needs."""

    name: str
    parameters: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    vision: bool
    source: str  # "shipped" or the model folder

    def lora_parameters(self, rank: int) -> int:
        """Adapter parameters of rank `rank` on every linear layer of the language model (the
        recipes' `all-linear`, the vision tower excluded): rank x sum(in + out) per layer."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 3 * (h + i)
        return rank * self.layers * per_layer

    def gathered_bf16_bytes(self) -> float:
        """bf16 bytes FSDP2 gathers at once: embedding, lm_head (once when tied), two layers."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        layer = h * q * 2 + h * kv * 2 + 3 * h * i
        embeddings = self.vocab * h * (1 if self.tied else 2)
        return 2.0 * (embeddings + 2 * layer)


def shipped_shapes() -> dict[str, ModelShape]:
    """The recipes' models, from models.json (no download)."""
    data = json.loads(MODELS_FILE.read_text())
    return {
        name: _shape(name, entry["text"], entry["parameters"], True, "shipped")
        for name, entry in data.items()
        if not name.startswith("_")
    }


def shipped_grid(name: str) -> Any:
    """The image grid of a shipped model's processor (Qwen2.5-VL: 14 px patches, min_pixels
    3,136; Qwen3-VL: 16 px, shortest_edge 65,536; both 16,384 merged patches at most)."""
    from entropyrl.data.prompt_length import VisionGrid

    vision = json.loads(MODELS_FILE.read_text())[name]["vision"]
    patch, merge = int(vision["patch_size"]), int(vision["spatial_merge_size"])
    factor = patch * merge
    least = 65_536 if patch == 16 else 4 * factor**2
    return VisionGrid(
        patch_size=patch, merge_size=merge, min_pixels=least, max_pixels=16384 * factor**2
    )


def _shape(
    name: str, text: Mapping[str, Any], parameters: int, vision: bool, source: str
) -> ModelShape:
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    return ModelShape(
        name=name,
        parameters=int(parameters),
        hidden=hidden,
        intermediate=int(text["intermediate_size"]),
        layers=int(text["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        vocab=int(text["vocab_size"]),
        tied=bool(text.get("tie_word_embeddings", False)),
        vision=vision,
        source=source,
    )


def folder_shape(folder: Path, parameters: int) -> ModelShape | None:
    """A model folder's shape from its config.json (the text settings at its top level or
    under `text_config`); None when it has none."""
    try:
        config = json.loads((folder / "config.json").read_text())
        text = {**config, **(config.get("text_config") or {})}
        if "tie_word_embeddings" in config:
            text["tie_word_embeddings"] = config["tie_word_embeddings"]
        return _shape(folder.name, text, parameters, "vision_config" in config, str(folder))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def shape_for(model: str) -> ModelShape | None:
    """The shipped shape of a hub id or folder name (`Qwen/Qwen2.5-VL-3B-Instruct`), or None."""
    return shipped_shapes().get(Path(model.rstrip("/")).name)


@dataclass(frozen=True)
class Layout:
    nodes: int
    per_node: int
    gpu_bytes: float
    gpu_from: str  # where gpu_bytes comes from

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node


@dataclass(frozen=True)
class GpuPlan:
    state: float  # training state on the GPU
    gathered: float
    train_activations: float
    nograd_activations: float
    activations_measured: bool
    vllm: float
    lora_rank: int

    @property
    def training_peak(self) -> float:
        return self.state + self.gathered + max(self.train_activations, self.nograd_activations)

    @property
    def rollout_peak(self) -> float:
        return self.vllm + self.state

    @property
    def peak(self) -> float:
        return max(self.training_peak, self.rollout_peak)


def _tokens_per_micro_batch(config: Any, role: str) -> int:
    """Tokens of one micro-batch: the token budget with dynamic batch sizes, else rows x
    (max prompt + max response)."""
    prompt = int(_select(config, "data.max_prompt_length", 1024))
    response = int(_select(config, "data.max_response_length", 256))
    if role == "update":
        if _select(config, "actor_rollout_ref.actor.use_dynamic_bsz", False):
            return int(_select(config, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"))
        rows = _select(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") or 1
    else:
        if _select(config, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", False):
            return int(_select(config, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"))
        rows = _select(config, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu") or 1
    return int(rows) * (prompt + response)


def gpu_plan(
    config: Any, shape: ModelShape, layout: Layout, lora_rank: int | None = None
) -> GpuPlan:
    """GPU memory of one rank at the config's batch sizes (the module's docstring)."""
    rank = (
        int(_select(config, "actor_rollout_ref.model.lora_rank", 0) or 0)
        if lora_rank is None
        else lora_rank
    )
    p, ranks = shape.parameters, layout.ranks
    offload_params = bool(
        _select(config, "actor_rollout_ref.actor.fsdp_config.param_offload", False)
    )
    offload_optim = bool(
        _select(config, "actor_rollout_ref.actor.fsdp_config.optimizer_offload", False)
    )
    if rank:
        adapters = shape.lora_parameters(rank)
        weights, grads, moments = 4.0 * p + 4.0 * adapters, 4.0 * adapters, 8.0 * adapters
    else:
        weights, grads, moments = 4.0 * p, 4.0 * p, 8.0 * p
    state = (0 if offload_params else weights + grads) + (0 if offload_optim else moments)
    measured = MEASURED_ACTIVATIONS.get(shape.name)
    train, nograd = measured or max(MEASURED_ACTIVATIONS.values())
    train *= _tokens_per_micro_batch(config, "update") / MEASURED_TOKENS[0]
    nograd *= _tokens_per_micro_batch(config, "log_prob") / MEASURED_TOKENS[1]
    utilization = float(_select(config, "actor_rollout_ref.rollout.gpu_memory_utilization", 0.5))
    return GpuPlan(
        state=state / ranks,
        gathered=shape.gathered_bf16_bytes(),
        train_activations=train,
        nograd_activations=nograd,
        activations_measured=measured is not None,
        vllm=utilization * layout.gpu_bytes,
        lora_rank=rank,
    )


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"


def gpu_line(plan: GpuPlan, layout: Layout) -> str:
    how = "measured" if plan.activations_measured else "estimated from the Qwen2.5-VL measurement"
    return (
        f"GPU memory per rank: {_gb(plan.peak)} of {_gb(layout.gpu_bytes)} "
        f"({layout.gpu_from}): training state {_gb(plan.state)} (computed"
        + (f", LoRA rank {plan.lora_rank}" if plan.lora_rank else ", full fine-tuning")
        + f", sharded over {layout.ranks} rank(s)), training peak {_gb(plan.training_peak)} "
        f"(+ bf16 parameters in flight {_gb(plan.gathered)}, activations "
        f"{_gb(max(plan.train_activations, plan.nograd_activations))} {how}, docs/cuda.md), "
        f"rollout peak {_gb(plan.rollout_peak)} (vLLM's gpu_memory_utilization share "
        f"{_gb(plan.vllm)} + the training state)"
    )


def fits_finding(
    config: Any, shape: ModelShape, layout: Layout, lora_flag: str = "LORA_RANK=64"
) -> Finding:
    """Whether a rank's peak fits the GPU; when not, one line with the ways out and what each
    gives."""
    plan = gpu_plan(config, shape, layout)
    if plan.peak <= layout.gpu_bytes:
        return Finding("config", True, "fits: " + gpu_line(plan, layout))
    ways = []
    if not plan.lora_rank:
        lora = gpu_plan(config, shape, layout, lora_rank=64)
        ways.append(f"{lora_flag} ({_gb(lora.peak)})")
    for more in (2, 4, 8):
        wider = Layout(layout.nodes, layout.per_node * more, layout.gpu_bytes, layout.gpu_from)
        if layout.per_node * more <= 8 and gpu_plan(config, shape, wider).peak <= layout.gpu_bytes:
            ways.append(
                f"N_GPUS={layout.per_node * more} ({_gb(gpu_plan(config, shape, wider).peak)})"
            )
            break
    else:
        ways.append("more GPUs (trainer.nnodes)")
    ways.append(
        "a smaller micro-batch (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu)"
    )
    offloaded = _with_offload(config)
    ways.append(
        "offload (actor_rollout_ref.actor.fsdp_config.param_offload=true "
        f"optimizer_offload=true: {_gb(gpu_plan(offloaded, shape, layout).peak)})"
    )
    what = f"LoRA rank {plan.lora_rank}" if plan.lora_rank else "full fine-tuning"
    return Finding(
        "config",
        False,
        f"fits: no: {what} of {shape.name} on {layout.ranks} GPU(s) needs "
        f"{_gb(plan.peak)} per rank (rollout {_gb(plan.rollout_peak)}: vLLM {_gb(plan.vllm)} + "
        f"training state {_gb(plan.state)}; training {_gb(plan.training_peak)}), over the "
        f"{_gb(layout.gpu_bytes)} GPU ({layout.gpu_from}): use " + ", or ".join(ways),
    )


def _with_offload(config: Any) -> Any:
    from omegaconf import OmegaConf

    copy = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    OmegaConf.update(
        copy, "actor_rollout_ref.actor.fsdp_config.param_offload", True, force_add=True
    )
    OmegaConf.update(
        copy, "actor_rollout_ref.actor.fsdp_config.optimizer_offload", True, force_add=True
    )
    return copy


@dataclass(frozen=True)
class HostPlan:
    reference: float
    startup: float  # the start-up fp32 copies, on the node of rank 0
    mm_cache: float
    vllm_sleep: float
    offload: float
    images_step: float  # the step's image tensors (TransferQueue), on the driver's node
    images_fetch: float  # the node's ranks' fetch of their rows, in each of three passes

    @property
    def steady(self) -> float:
        return (
            self.reference
            + self.mm_cache
            + self.vllm_sleep
            + self.offload
            + self.images_step
            + self.images_fetch
        )

    @property
    def peak(self) -> float:
        return max(self.steady, self.startup)


def host_plan(
    config: Any,
    shape: ModelShape,
    layout: Layout,
    step_image_bytes: float = 0.0,
    reference: bool = True,
    lora_rank: int | None = None,
) -> HostPlan:
    """Host memory of one node (the module's docstring). `step_image_bytes`: the image tensors
    of a whole step (`budget.Budget.step_pixel_bytes`)."""
    rank = (
        int(_select(config, "actor_rollout_ref.model.lora_rank", 0) or 0)
        if lora_rank is None
        else lora_rank
    )
    p = float(shape.parameters)
    node_share = layout.per_node / layout.ranks
    ref_bytes = 4.0 * p * node_share if reference and not rank else 0.0
    startup = 4.0 * p * (layout.per_node if shape.tied else 1)
    tp = int(_select(config, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1) or 1)
    replicas_per_node = max(layout.per_node // tp, 1)
    cache_gib = _select(
        config, "actor_rollout_ref.rollout.engine_kwargs.vllm.mm_processor_cache_gb"
    )
    cache_gib = MM_CACHE_GIB if cache_gib is None else float(cache_gib)
    mm_cache = cache_gib * GIB * replicas_per_node if shape.vision else 0.0
    sleep = 2.0 * p * replicas_per_node / tp if rank else 0.0
    offload = 0.0
    if _select(config, "actor_rollout_ref.actor.fsdp_config.param_offload", False):
        offload += (8.0 * p if not rank else 4.0 * p) * node_share
    if _select(config, "actor_rollout_ref.actor.fsdp_config.optimizer_offload", False):
        offload += (8.0 * p if not rank else 8.0 * shape.lora_parameters(rank)) * node_share
    return HostPlan(
        reference=ref_bytes,
        startup=startup,
        mm_cache=mm_cache,
        vllm_sleep=sleep,
        offload=offload,
        images_step=step_image_bytes,
        images_fetch=step_image_bytes * node_share,
    )


def host_line(plan: HostPlan, shape: ModelShape) -> str:
    parts = []
    if plan.reference:
        parts.append(f"reference model offloaded in fp32 {_gb(plan.reference)}")
    if plan.mm_cache:
        parts.append(f"vLLM's multimodal cache {_gb(plan.mm_cache)} (mm_processor_cache_gb)")
    if plan.vllm_sleep:
        parts.append(f"vLLM's bf16 weights while asleep (LoRA) {_gb(plan.vllm_sleep)}")
    if plan.offload:
        parts.append(f"offloaded training state {_gb(plan.offload)}")
    if plan.images_step:
        parts.append(
            f"a step's image tensors {_gb(plan.images_step)} + the ranks' fetch of their rows "
            f"{_gb(plan.images_fetch)}"
        )
    copies = "every rank's fp32 copy (tied embeddings)" if shape.tied else "rank 0's fp32 copy"
    return (
        f"host memory per node: {_gb(plan.peak)} at most (computed): while training "
        f"{_gb(plan.steady)}: "
        + (", ".join(parts) or "nothing large")
        + f"; at start-up {_gb(plan.startup)}, {copies} before FSDP shards it"
    )


def tokens_per_step(config: Any, prompt_tokens: int | None = None) -> tuple[int, str]:
    """Tokens of a step: rows x (prompt + maximum response); the prompt is `prompt_tokens`
    (the manifest's longest) when given, else `data.max_prompt_length`."""
    rows = int(_select(config, "data.train_batch_size")) * int(
        _select(config, "actor_rollout_ref.rollout.n", 1)
    )
    response = int(_select(config, "data.max_response_length", 256))
    if prompt_tokens is None:
        prompt, where = (
            int(_select(config, "data.max_prompt_length", 1024)),
            "data.max_prompt_length",
        )
    else:
        prompt, where = prompt_tokens, "the manifest's longest prompt"
    return rows * (prompt + response), (
        f"{rows} rows x ({prompt} prompt tokens, {where}, + {response} response)"
    )


def step_seconds(shape: ModelShape, ranks: int, tokens: int) -> tuple[float, str]:
    """Estimated seconds per step and the source of the throughput it assumes."""
    anchor = THROUGHPUT_STAND_IN.get(shape.name, shape.name)
    if anchor not in THROUGHPUT:  # other models: by size, the nearer published one
        anchor = "Qwen2.5-VL-3B-Instruct" if shape.parameters < 6e9 else "Qwen2.5-VL-7B-Instruct"
    rate, measured_on, seconds, _host, _gpu = THROUGHPUT[anchor]
    label = f"{THROUGHPUT_SOURCE}: {measured_on} {rate:,.0f} tokens/s/GPU ({seconds} s/step there)"
    if anchor != shape.name:
        label += f"; no published figure for {shape.name}, {measured_on}'s taken"
    return tokens / (rate * ranks), label


def time_line(seconds: float, steps: int, label: str, tokens_text: str) -> str:
    return (
        f"time: estimate {seconds:.0f} s/step, {seconds * steps / 3600:.1f} h for {steps} "
        f"steps ({tokens_text}; {label}; validation and checkpoints not counted)"
    )


# --- the planning table of docs/scaling.md -------------------------------------------------

GPUS = {"8xH100": 80e9, "8xH200": 141e9}
TABLE_MODELS = (
    "Qwen2.5-VL-3B-Instruct",
    "Qwen2.5-VL-7B-Instruct",
    "Qwen3-VL-4B-Instruct",
    "Qwen3-VL-8B-Instruct",
)
TABLE_LORA_RANK = 64
TABLE_TRAIN_ROWS = 82_783  # entropyrl prepare coco --karpathy: Karpathy's train split
TABLE_IMAGE = (640, 480)  # COCO's usual image size


def table_rows(config: Any) -> list[list[str]]:
    """One row per model x GPU x {full, LoRA} for the captioning recipe's config on one node."""
    from entropyrl.verl.checks.budget import checkpoint_bytes, pixel_values_bytes
    from entropyrl.verl.checks.findings import run_roles

    reference, _ = run_roles(config)
    steps = TABLE_TRAIN_ROWS // int(_select(config, "data.train_batch_size"))
    rows_per_step = int(_select(config, "data.train_batch_size")) * int(
        _select(config, "actor_rollout_ref.rollout.n", 1)
    )
    tokens, _ = tokens_per_step(config)
    shapes = shipped_shapes()
    rows = []
    for name in TABLE_MODELS:
        shape = shapes[name]
        for gpu, memory in GPUS.items():
            layout = Layout(1, 8, memory, gpu)
            for rank in (0, TABLE_LORA_RANK):
                gpu_mem = gpu_plan(config, shape, layout, lora_rank=rank)
                images = rows_per_step * pixel_values_bytes(*TABLE_IMAGE, shipped_grid(name))
                host = host_plan(config, shape, layout, images, reference, lora_rank=rank)
                seconds, _ = step_seconds(shape, layout.ranks, tokens)
                disk = checkpoint_bytes(shape.parameters, shape.lora_parameters(rank))
                rows.append(
                    [
                        name,
                        gpu,
                        f"LoRA {rank}" if rank else "full",
                        f"{steps} (computed)",
                        f"{seconds * steps / 3600:.1f} (estimated)",
                        f"{gpu_mem.peak / 1e9:.1f} ("
                        + (
                            "computed + measured"
                            if gpu_mem.activations_measured
                            else "computed + estimated"
                        )
                        + ")",
                        f"{host.peak / 1e9:.1f} (computed)",
                        f"{disk / 1e9:.1f} (computed)",
                    ]
                )
    return rows


TABLE_HEADER = (
    "| model | node | training | steps | hours | GPU memory per rank, GB | host RAM per node, GB "
    "| disk per checkpoint, GB |\n|---|---|---|---:|---:|---:|---:|---:|"
)


def planning_table(config: Any) -> str:
    """docs/scaling.md's planning table, as markdown, for a composed captioning recipe
    (`python -m entropyrl.commands.plan_table` composes it and prints this)."""
    lines = [TABLE_HEADER] + ["| " + " | ".join(row) + " |" for row in table_rows(config)]
    return "\n".join(lines)
