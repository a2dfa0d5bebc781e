"""What verl 0.9.1 needs, besides a platform, to train on CPU processes (`VERL_PLATFORM=cpu`).

Each fix below replaces one module-level name of verl's (looked up at call time, so the fix
reaches callers that imported the module earlier) and is installed by the plugin entry point in
every verl process only when the CPU platform is selected. All of them are pinned to verl 0.9.1:
`REQUIRED_NAMES` lists the names they touch and `entropyrl doctor` checks that they exist.

1. Process group: `initialize_global_process_group_ray` builds `cpu:gloo,<device>:<backend>`,
   which is `cpu:gloo,cpu:gloo` (a duplicate device type) here: use plain gloo.
2. Engines: the FSDP engines are registered for cuda/npu only; register the same classes for
   the `cpu` device (FSDP2 trains over gloo; FSDP1 needs an accelerator, so use strategy fsdp2).
3. FSDP2 offload: the reference model is always built with `CPUOffloadPolicy(pin_memory=True)`,
   and pinned memory needs CUDA: the policy keeps parameters on the CPU without pinning.
4. Processor: verl loads the multi-modal processor with `AutoProcessor`, which needs torchvision
   for the Qwen2-VL / Qwen2.5-VL / Qwen3-VL video processors. Where torchvision is missing, such
   a checkpoint gets the same processor class with its Pillow image processor (Qwen2-VL's class,
   which Qwen3-VL also uses with patch 16) and no video processor (image prompts only), bound to
   the model's rope index exactly as verl binds it.
5. Remove-padding attention: verl's remove-padding patch for Qwen2-VL / Qwen2.5-VL
   (`verl/models/transformers/qwen2_vl.py`) packs a micro-batch into one row and calls
   flash-attn's `flash_attn_varlen_func` (and, for a single sequence, transformers' flash
   attention), with the kernel's module globals set only when flash-attn imports. Without
   flash-attn (always, on CPU) the same code runs with PyTorch's scaled-dot-product attention per
   packed sequence (`varlen_attention`), which computes what the kernel computes (tested against
   per-sequence attention), and without the cast to bfloat16 the kernel needs. verl does not
   patch Qwen3-VL's attention: its packed micro-batch keeps sequences apart through transformers'
   own packed-sequence mask, which transformers builds from the text row of verl's 4-row
   position ids (no attention mask, no cache), so Qwen3-VL needs nothing here.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import types
import warnings
from typing import Any

from entropyrl.models.processor import IMAGE_ONLY_PROCESSORS
from entropyrl.models.processor import load_image_only_processor as load_processor
from entropyrl.verl.names import HF_ROLLOUT

logger = logging.getLogger(__name__)

REQUIRED_NAMES: tuple[tuple[str, str], ...] = (
    ("verl.utils.distributed", "initialize_global_process_group_ray"),
    ("verl.workers.engine_workers", "initialize_global_process_group_ray"),
    ("verl.workers.engine.base", "EngineRegistry"),
    ("verl.workers.engine.fsdp.transformer_impl", "CPUOffloadPolicy"),
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithLMHead"),
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithValueHead"),
    ("verl.workers.config.model", "hf_processor"),
    ("verl.workers.rollout.base", "_ROLLOUT_REGISTRY"),
    ("verl.workers.rollout.replica", "RolloutReplicaRegistry"),
    ("verl.utils.config", "validate_config"),
    ("verl.models.transformers.qwen2_vl", "_custom_flash_attention_forward"),
    ("verl.models.transformers.qwen2_vl", "_flash_attention_forward"),
    ("verl.models.transformers.qwen2_vl", "fa_peft_integration_check"),
)

_installed = False


def missing_names() -> list[str]:
    """The verl names the CPU backend relies on that this verl does not have."""
    missing = []
    for module_name, attribute in REQUIRED_NAMES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(f"{module_name} (module)")
            continue
        if not hasattr(module, attribute):
            missing.append(f"{module_name}.{attribute}")
    return missing


def _gloo_process_group() -> None:
    from verl.utils import distributed
    from verl.workers import engine_workers

    original = distributed.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray.__wrapped__ = original
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    engine_workers.initialize_global_process_group_ray = initialize_global_process_group_ray


def _cpu_engines() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        registered = EngineRegistry._engines.get(model_type, {})
        backends = [name for name in ("fsdp", "fsdp2") if "cpu" not in registered.get(name, {})]
        if backends:
            EngineRegistry.register(model_type=model_type, backend=backends, device="cpu")(engine)


def _unpinned_offload() -> None:
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    if getattr(policy, "_entropyrl_unpinned", False):
        return

    class UnpinnedCPUOffloadPolicy(policy):
        """FSDP2's CPU offload policy without pinned memory (pinning needs CUDA)."""

        _entropyrl_unpinned = True

        def __init__(self, pin_memory: bool = False) -> None:
            super().__init__(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def load_image_only_processor(path: str, **kwargs: Any) -> Any:
    """`entropyrl.models.processor.load_image_only_processor` with what verl's workers call on a
    processor: the model's `get_rope_index` (and `get_vision_position_ids`) bound to it."""
    processor = load_processor(path, trust_remote_code=bool(kwargs.get("trust_remote_code")))
    if processor is None:
        return None
    _, _, model_module, model_class = IMAGE_ONLY_PROCESSORS[processor.config.model_type]
    model = getattr(importlib.import_module(model_module), model_class)
    processor.get_rope_index = types.MethodType(model.get_rope_index, processor)
    if hasattr(model, "get_vision_position_ids"):
        processor.get_vision_position_ids = types.MethodType(
            model.get_vision_position_ids, processor
        )
    return processor


def _processor_without_torchvision() -> None:
    if importlib.util.find_spec("torchvision") is not None:
        return
    from verl.workers.config import model as model_config

    original = model_config.hf_processor

    def hf_processor(name_or_path, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            processor = original(name_or_path, **kwargs)
        replaced = False
        if processor is None:
            try:
                processor = load_image_only_processor(name_or_path, **kwargs)
                replaced = processor is not None
            except (OSError, ValueError) as error:
                logger.debug("no image-only processor for %s: %s", name_or_path, error)
        if not replaced:
            # verl's "Failed to create processor" warning stands unless the image-only
            # processor took the place of the one it failed to create.
            for warning in caught:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
        return processor

    hf_processor.__wrapped__ = original
    model_config.hf_processor = hf_processor


def varlen_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **_: Any,
) -> Any:
    """`flash_attn_varlen_func` on PyTorch: q [total_q, heads, dim], k and v [total_k, kv_heads,
    dim], sequences delimited by the cumulative lengths; attention within each sequence only.

    Causal masks align the last query with the last key, as flash-attn's do (equal lengths in
    training, where the two conventions agree). Grouped-query heads are repeated to match q.
    """
    import torch
    import torch.nn.functional as F

    del max_seqlen_q, max_seqlen_k
    out = torch.empty_like(q)
    repeat = q.shape[1] // k.shape[1]
    for i in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        k0, k1 = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        if q1 == q0:
            continue
        query = q[q0:q1].transpose(0, 1)
        key = k[k0:k1].transpose(0, 1).repeat_interleave(repeat, dim=0)
        value = v[k0:k1].transpose(0, 1).repeat_interleave(repeat, dim=0)
        mask = None
        if causal:
            rows, cols = q1 - q0, k1 - k0
            mask = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril(cols - rows)
        out[q0:q1] = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=softmax_scale
        ).transpose(0, 1)
    return out


def padded_attention(
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    query_length: int,
    is_causal: bool = True,
    dropout: float = 0.0,
    softmax_scale: float | None = None,
    **_: Any,
) -> Any:
    """transformers' `_flash_attention_forward` on PyTorch: [batch, seq, heads, dim] inputs, an
    optional [batch, seq] padding mask, causal within each row."""
    import torch

    del query_length
    batch, length = query.shape[0], query.shape[1]
    if attention_mask is None:
        lengths = torch.full((batch,), length, dtype=torch.int64)
    else:
        lengths = attention_mask.to(torch.int64).sum(dim=-1).cpu()
    out = torch.zeros_like(query)
    for row in range(batch):
        # right-padded rows attend over their first `n` positions, left-padded over their last
        n = int(lengths[row])
        if n == 0:
            continue
        valid = (
            slice(0, n)
            if attention_mask is None or bool(attention_mask[row, 0])
            else slice(length - n, length)
        )
        cu = torch.tensor([0, n], dtype=torch.int32)
        out[row, valid] = varlen_attention(
            query[row, valid],
            key[row, valid],
            value[row, valid],
            cu,
            cu,
            n,
            n,
            dropout_p=dropout,
            softmax_scale=softmax_scale,
            causal=is_causal,
        )
    return out


def _remove_padding_without_flash_attn() -> None:
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        return
    from verl.models.transformers import qwen2_vl

    qwen2_vl._flash_supports_window_size = False
    qwen2_vl._flash_supports_deterministic = False
    qwen2_vl._flash_use_top_left_mask = False
    qwen2_vl.flash_attn_varlen_func = varlen_attention
    qwen2_vl._flash_attention_forward = padded_attention
    # flash-attn computes in bfloat16 only; PyTorch's attention keeps the inputs' dtype
    qwen2_vl.fa_peft_integration_check = lambda q, k, v, target_dtype=None: (q, k, v)


ROLLOUT_NAME = HF_ROLLOUT


def register_hf_rollout() -> None:
    """Make `rollout.name=hf` known to verl's replica registry and worker-side rollout table.

    By name only (loaded on first use), so registering never imports `hf_rollout` while it may
    be half-imported. verl 0.9.1 keeps the worker-side table private (`_ROLLOUT_REGISTRY`);
    `entropyrl doctor` checks that it is still there.
    """
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_replica() -> type:
        return importlib.import_module("entropyrl.rig.cpu.hf_rollout").HFRolloutReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = (
        "entropyrl.rig.cpu.hf_rollout.HFServerAdapter"
    )


def install() -> None:
    """Install the CPU fixes in this process (idempotent)."""
    global _installed
    if _installed:
        return
    missing = missing_names()
    if missing:
        raise RuntimeError(
            "the entropyrl CPU backend is written for verl 0.9.1; this verl lacks: "
            + ", ".join(missing)
        )
    _gloo_process_group()
    _cpu_engines()
    _unpinned_offload()
    _processor_without_torchvision()
    _remove_padding_without_flash_attn()
    _installed = True
