"""`data.custom_cls`: verl's `RLHFDataset` with image handling that needs Pillow only.

verl's dataset and agent loop take each prompt's images from `qwen_vl_utils.process_vision_info`,
which imports torchvision at module import; on a machine without torchvision every image prompt
fails there. `PillowRLHFDataset` overrides that one class method with the same rules
(`qwen_vl_utils.fetch_image`: RGB, then resize so both sides are multiples of patch x merge
and the pixel count lies in [4, 16384] x (patch x merge)^2 unless the row sets
`min_pixels` / `max_pixels` / `resized_height` / `resized_width`). Images come from local paths,
`file://` paths, base64 `data:image` URLs, raw bytes or PIL images; nothing is downloaded.
Videos are refused with a clear error.

Select it with `data.custom_cls.path=pkg://entropyrl.verl.dataset` and
`data.custom_cls.name=PillowRLHFDataset`.
"""

from __future__ import annotations

import base64
import math
from io import BytesIO
from typing import Any

from PIL import Image
from verl.utils.dataset.rl_dataset import RLHFDataset

SPATIAL_MERGE_SIZE = 2
MIN_TOKENS = 4
MAX_TOKENS = 16384
MAX_RATIO = 200


def smart_resize(
    height: int,
    width: int,
    factor: int,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor` with the pixel count inside the bounds.

    The rule of `qwen_vl_utils.smart_resize` (Qwen2-VL's image pre-processing), which verl uses.
    """
    max_pixels = MAX_TOKENS * factor**2 if max_pixels is None else max_pixels
    min_pixels = MIN_TOKENS * factor**2 if min_pixels is None else min_pixels
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    if min(height, width) <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _open(image: Any) -> Image.Image:
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, bytes | bytearray):
        return Image.open(BytesIO(image))
    if not isinstance(image, str):
        raise TypeError(f"unsupported image type {type(image).__name__}")
    if image.startswith(("http://", "https://")):
        raise ValueError(f"remote images are not fetched (no downloads at run time): {image[:80]}")
    if image.startswith("data:image"):
        if "base64," not in image:
            raise ValueError("a data:image URL must be base64-encoded")
        return Image.open(BytesIO(base64.b64decode(image.split("base64,", 1)[1])))
    if image.startswith("file://"):
        image = image[len("file://") :]
    return Image.open(image)


def _rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGBA":
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.split()[3])
        return background
    return image.convert("RGB")


def fetch_image(element: dict[str, Any], image_patch_size: int = 14) -> Image.Image:
    """One message part's image, opened and resized as `qwen_vl_utils.fetch_image` does."""
    source = element.get("image", element.get("image_url"))
    if isinstance(source, dict):  # OpenAI-style {"url": ...}
        source = source.get("url")
    if source is None:
        raise ValueError("an image part needs 'image' or 'image_url'")
    image = _rgb(_open(source))
    factor = int(image_patch_size * SPATIAL_MERGE_SIZE)
    if "resized_height" in element and "resized_width" in element:
        height, width = smart_resize(
            int(element["resized_height"]), int(element["resized_width"]), factor=factor
        )
    else:
        width0, height0 = image.size
        height, width = smart_resize(
            height0,
            width0,
            factor=factor,
            min_pixels=element.get("min_pixels", MIN_TOKENS * factor**2),
            max_pixels=element.get("max_pixels", MAX_TOKENS * factor**2),
        )
    return image.resize((width, height))


def vision_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The image and video parts of a chat, in order."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts += [
                item
                for item in content
                if isinstance(item, dict) and item.get("type") in {"image", "image_url", "video"}
            ]
    return parts


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
