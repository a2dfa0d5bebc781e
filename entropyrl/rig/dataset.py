"""`data.custom_cls`: verl's `RLHFDataset` with image handling that needs Pillow only.

verl's dataset and agent loop take each prompt's images from `qwen_vl_utils.process_vision_info`,
which imports torchvision at module import; on a machine without torchvision every image prompt
fails there. `PillowRLHFDataset` overrides that one class method with the same rules
(`entropyrl.models.images.fetch_image`, the rules of `qwen_vl_utils.fetch_image`). Videos are
refused with a clear error.

Select it with `data.custom_cls.path=pkg://entropyrl.rig.dataset` and
`data.custom_cls.name=PillowRLHFDataset`.
"""

from __future__ import annotations

from typing import Any

from PIL import Image
from verl.utils.dataset.rl_dataset import RLHFDataset

from entropyrl.models.images import fetch_image, smart_resize, vision_parts

__all__ = ["PillowRLHFDataset", "fetch_image", "smart_resize", "vision_parts"]


class PillowRLHFDataset(RLHFDataset):
    """`RLHFDataset` whose images are prepared with Pillow only (see the module docstring)."""

    @classmethod
    def _process_multi_modal_info(
        cls, messages: list[dict], image_patch_size: int, config: Any
    ) -> tuple[list[Image.Image] | None, None, list[Any] | None]:
        parts = vision_parts(messages)
        if any(part.get("type") == "video" for part in parts):
            raise ValueError(
                "PillowRLHFDataset handles images only; video prompts need qwen_vl_utils "
                "(torchvision)"
            )
        images = [fetch_image(part, image_patch_size) for part in parts] or None
        return images, None, cls._extract_audio_info(messages)

    @classmethod
    async def process_vision_info(
        cls, messages: list[dict], image_patch_size: int, config: Any
    ) -> tuple[list[Image.Image] | None, None]:
        images, videos, _ = await cls.process_multi_modal_info(messages, image_patch_size, config)
        return images, videos
