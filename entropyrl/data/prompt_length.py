"""The longest prompt of an image data set, in the tokens verl counts, without opening an image.

verl's `data.filter_overlong_prompts` measures every row by opening and processing its images in
one process before the first step (hours of start-up on COCO, at every start and resume). For a
data set whose image sizes are known (`entropyrl prepare coco` records them in `manifest.json`),
the same count follows from the sizes: verl's dataset renders the chat template
(`processor.apply_chat_template`), the image goes through `fetch_image`'s resize (the rules of
`qwen_vl_utils`) and the processor's own, and the processor expands each image placeholder
token into one token per merged patch. `prompt_tokens` gives that count from the model folder's
files (`preprocessor_config.json`, the chat template, `tokenizer.json`) with Pillow-free
arithmetic, `tokenizers` and `jinja2` only; tests/data/test_prompt_length.py checks it against
verl's own count on the tiny models of both architectures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from entropyrl.models.images import MAX_TOKENS, MIN_TOKENS, SPATIAL_MERGE_SIZE, smart_resize

IMAGE_PLACEHOLDER = "<image>"
IMAGE_PAD = "<|image_pad|>"  # the token Qwen-VL's processors expand, one per merged patch


@dataclass(frozen=True)
class VisionGrid:
    """How a Qwen-VL processor turns an image into tokens (its `preprocessor_config.json`)."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_model(cls, model_dir: str | Path) -> VisionGrid:
        """From `preprocessor_config.json`, or the `image_processor` entry of
        `processor_config.json` (how transformers 5 saves a processor)."""
        folder = Path(model_dir)
        if (folder / "preprocessor_config.json").is_file():
            config = json.loads((folder / "preprocessor_config.json").read_text())
        elif (folder / "processor_config.json").is_file():
            config = json.loads((folder / "processor_config.json").read_text())["image_processor"]
        else:
            raise ValueError(f"{folder}: no preprocessor_config.json or processor_config.json")
        patch = int(config.get("patch_size", 14))
        merge = int(config.get("merge_size", SPATIAL_MERGE_SIZE))
        size = config.get("size") or {}
        low = config.get("min_pixels", size.get("shortest_edge"))
        high = config.get("max_pixels", size.get("longest_edge"))
        factor = patch * merge
        return cls(
            patch_size=patch,
            merge_size=merge,
            min_pixels=int(low) if low is not None else MIN_TOKENS * factor**2,
            max_pixels=int(high) if high is not None else MAX_TOKENS * factor**2,
        )


def image_tokens(
    width: int, height: int, grid: VisionGrid, image_patch_size: int | None = None
) -> int:
    """Tokens one `width` x `height` image becomes: `fetch_image`'s resize at verl's
    `image_patch_size` (the processor's patch size unless `data.image_patch_size` is set), then
    the processor's own resize, one token per merge x merge patches."""
    fetch_factor = (image_patch_size or grid.patch_size) * SPATIAL_MERGE_SIZE
    h, w = smart_resize(height, width, fetch_factor)
    h, w = smart_resize(h, w, grid.factor, grid.min_pixels, grid.max_pixels)
    return (h // grid.factor) * (w // grid.factor)


def chat_messages(prompt: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row's prompt as verl's dataset hands it to the chat template (`_build_messages`):
    string contents split at `<image>` into image and text parts."""
    messages = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str) and IMAGE_PLACEHOLDER in content:
            parts = [s for s in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", content) if s]
            content = [
                {"type": "image"} if s == IMAGE_PLACEHOLDER else {"type": "text", "text": s}
                for s in parts
            ]
        messages.append({**message, "content": content})
    return messages


def _chat_template(model_dir: Path) -> str:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        path = model_dir / name
        if path.is_file():
            template = json.loads(path.read_text()).get("chat_template")
            if isinstance(template, str):
                return template
    raise ValueError(f"{model_dir}: no chat template (chat_template.jinja / .json)")


@cache
def _renderer(model_dir: str) -> Any:
    """The model's chat template compiled as transformers compiles it (sandboxed jinja2)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(_chat_template(Path(model_dir)))


@cache
def _tokenizer(model_dir: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def text_tokens(model_dir: str | Path, prompt: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(tokens of the rendered chat, image placeholders in it) for one row's prompt."""
    text = _renderer(str(model_dir)).render(
        messages=chat_messages(prompt), add_generation_prompt=True
    )
    ids = _tokenizer(str(model_dir)).encode(text, add_special_tokens=False).ids
    pad = _tokenizer(str(model_dir)).token_to_id(IMAGE_PAD)
    return len(ids), sum(1 for i in ids if i == pad)


def prompt_tokens(
    model_dir: str | Path,
    prompt: Sequence[dict[str, Any]],
    image_sizes: Sequence[tuple[int, int]],
    image_patch_size: int | None = None,
) -> int:
    """The prompt's length in verl's count: the rendered chat with each image placeholder
    expanded to its image's tokens (`image_sizes`: (width, height) per image, in order)."""
    grid = VisionGrid.from_model(model_dir)
    text, placeholders = text_tokens(model_dir, prompt)
    if placeholders != len(image_sizes):
        raise ValueError(f"{placeholders} image placeholders for {len(image_sizes)} images")
    return text + sum(image_tokens(w, h, grid, image_patch_size) - 1 for w, h in image_sizes)


def longest_prompt(
    model_dir: str | Path,
    prompts: Iterable[Sequence[dict[str, Any]]],
    sizes: Iterable[tuple[int, int]],
    image_patch_size: int | None = None,
) -> tuple[int, tuple[int, int] | None]:
    """(longest prompt in tokens, the image size that gives it) over every distinct prompt with
    one image of every size in `sizes` (a caption row holds one image)."""
    grid = VisionGrid.from_model(model_dir)
    most_image, size = max(
        ((image_tokens(w, h, grid, image_patch_size), (w, h)) for w, h in set(sizes)),
        default=(0, None),
    )
    most_text = 0
    for prompt in {json.dumps(list(p), sort_keys=True) for p in prompts}:
        text, placeholders = text_tokens(model_dir, json.loads(prompt))
        if placeholders != 1:
            raise ValueError(f"a caption prompt holds {placeholders} images; one is expected")
        most_text = max(most_text, text)
    return most_text + most_image - 1, size
