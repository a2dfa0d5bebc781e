"""Images as Qwen-VL's pre-processing prepares them, with Pillow only.

The rules of `qwen_vl_utils.fetch_image` (which verl's dataset uses, and which imports
torchvision): RGB, then resize so both sides are multiples of patch x merge and the pixel count
lies in [4, 16384] x (patch x merge)^2 unless the part sets `min_pixels` / `max_pixels` /
`resized_height` / `resized_width`. Training (`entropyrl.rig.dataset`) and the caption
evaluation (`entropyrl.evaluation.generation`) both go through `fetch_image`, so a model is
evaluated on the pixels it was trained on. Images come from local paths, `file://` paths, base64
`data:image` URLs, raw bytes or PIL images; nothing is downloaded.
"""

from __future__ import annotations

import base64
import math
from io import BytesIO
from typing import Any

from PIL import Image

__all__ = [
    "MAX_TOKENS",
    "MIN_TOKENS",
    "SPATIAL_MERGE_SIZE",
    "fetch_image",
    "pixel_limits",
    "smart_resize",
    "vision_parts",
]

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


def pixel_limits(image_patch_size: int = 14) -> dict[str, int]:
    """The default `min_pixels` / `max_pixels` of `fetch_image` for this patch size."""
    factor = int(image_patch_size * SPATIAL_MERGE_SIZE)
    return {"min_pixels": MIN_TOKENS * factor**2, "max_pixels": MAX_TOKENS * factor**2}
