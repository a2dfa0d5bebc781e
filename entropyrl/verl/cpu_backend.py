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
   for the Qwen2-VL video processor. Where torchvision is missing, a Qwen2-VL checkpoint gets
   the same processor with its Pillow image processor and no video processor (image prompts
   only), bound to the model's rope index exactly as verl binds it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import types
import warnings
from typing import Any

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


def image_only_qwen2vl_processor_class() -> type:
    """`Qwen2VLProcessor` that accepts a missing video processor (named as verl expects)."""
    from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor as Base
    from transformers.processing_utils import ProcessorMixin

    class Qwen2VLProcessor(Base):
        """Images and text only; `get_attributes` reads this signature, so no video slot."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(
                self, image_processor, tokenizer, chat_template=chat_template, **kwargs
            )

    Qwen2VLProcessor.__module__ = __name__
    Qwen2VLProcessor.__qualname__ = "Qwen2VLProcessor"
    return Qwen2VLProcessor


def load_image_only_processor(path: str, **kwargs: Any) -> Any:
    """A Qwen2-VL checkpoint's processor without torchvision, or None for other models."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    trust_remote_code = bool(kwargs.get("trust_remote_code", False))
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if config.model_type != "qwen2_vl":
        return None
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    processor = image_only_qwen2vl_processor_class()(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    processor.config = config
    processor.get_rope_index = types.MethodType(Qwen2VLModel.get_rope_index, processor)
    if hasattr(Qwen2VLModel, "get_vision_position_ids"):
        processor.get_vision_position_ids = types.MethodType(
            Qwen2VLModel.get_vision_position_ids, processor
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


ROLLOUT_NAME = "hf"


def register_hf_rollout() -> None:
    """Make `rollout.name=hf` known to verl's replica registry and worker-side rollout table.

    By name only (loaded on first use), so registering never imports `hf_rollout` while it may
    be half-imported. verl 0.9.1 keeps the worker-side table private (`_ROLLOUT_REGISTRY`);
    `entropyrl doctor` checks that it is still there.
    """
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_replica() -> type:
        return importlib.import_module("entropyrl.verl.hf_rollout").HFRolloutReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = (
        "entropyrl.verl.hf_rollout.HFServerAdapter"
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
    _installed = True
