"""The Qwen-VL processors without their video half (which needs torchvision), one class per
model type, named as verl expects (verl dispatches on the processor's class name)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["IMAGE_ONLY_PROCESSORS", "image_only_processor_class", "load_image_only_processor"]

# model_type -> (processor module, processor class, model module, model class): what verl's
# hf_processor binds (verl/utils/tokenizer/tokenizer.py), for the types without torchvision here.
IMAGE_ONLY_PROCESSORS: dict[str, tuple[str, str, str, str]] = {
    "qwen2_vl": (
        "transformers.models.qwen2_vl.processing_qwen2_vl",
        "Qwen2VLProcessor",
        "transformers.models.qwen2_vl.modeling_qwen2_vl",
        "Qwen2VLModel",
    ),
    "qwen2_5_vl": (
        "transformers.models.qwen2_5_vl.processing_qwen2_5_vl",
        "Qwen2_5_VLProcessor",
        "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        "Qwen2_5_VLModel",
    ),
    # Qwen3-VL's image processor is Qwen2-VL's class (patch 16, normalisation 0.5); its video
    # processor (frame timestamps) is the torchvision part.
    "qwen3_vl": (
        "transformers.models.qwen3_vl.processing_qwen3_vl",
        "Qwen3VLProcessor",
        "transformers.models.qwen3_vl.modeling_qwen3_vl",
        "Qwen3VLModel",
    ),
}
# Processors whose __init__ also names the vision delimiter tokens (Qwen3VLProcessor does).
_VISION_DELIMITERS = frozenset({"qwen3_vl"})


def image_only_processor_class(model_type: str = "qwen2_vl") -> type:
    """The Qwen-VL processor of `model_type` that accepts a missing video processor, named as
    verl expects (verl dispatches on the class name)."""
    from transformers.processing_utils import ProcessorMixin

    module_name, class_name, _, _ = IMAGE_ONLY_PROCESSORS[model_type]
    base = getattr(importlib.import_module(module_name), class_name)

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(
            self, image_processor, tokenizer, chat_template=chat_template, **kwargs
        )
        if model_type in _VISION_DELIMITERS:
            self.vision_start_token = getattr(tokenizer, "vision_start_token", "<|vision_start|>")
            self.vision_end_token = getattr(tokenizer, "vision_end_token", "<|vision_end|>")
            self.vision_start_token_id = tokenizer.convert_tokens_to_ids(self.vision_start_token)
            self.vision_end_token_id = tokenizer.convert_tokens_to_ids(self.vision_end_token)

    # `get_attributes` reads the __init__ signature: no video slot, images and text only.
    cls = type(class_name, (base,), {"__init__": __init__, "__module__": __name__})
    cls.__qualname__ = class_name
    return cls


def load_image_only_processor(path: str, *, trust_remote_code: bool = False) -> Any:
    """A Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoint's processor without torchvision: its
    tokenizer and chat template, and its Pillow image processor as the checkpoint configures it
    (patch size, pixel limits). None for other model types."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if config.model_type not in IMAGE_ONLY_PROCESSORS:
        return None
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    processor = image_only_processor_class(config.model_type)(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(path),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    processor.config = config
    return processor
