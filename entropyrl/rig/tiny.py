"""Tiny Qwen models built from a config; checkpoints on disk load with `entropyrl.models.loading`.

Nothing is downloaded: a tiny model is initialised from a seed (about 1 M parameters with the
demo's 4096-rank tokenizer, 1.6 M with 8192 ranks). The local runner trains the tiny Qwen2-VL /
Qwen2; the verl smokes build the architectures of the recipes they stand for (Qwen2.5-VL for captioning, Qwen3 for the
text recipes) and Qwen3-VL as the captioning smoke's second variant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "PatchProjection",
    "TinyModelConfig",
    "build_tiny_qwen2",
    "build_tiny_qwen2_5_vl",
    "build_tiny_qwen2vl",
    "build_tiny_qwen3",
    "build_tiny_qwen3_vl",
    "count_parameters",
    "seed_everything",
]


@dataclass(frozen=True)
class TinyModelConfig:
    """Size of a tiny Qwen2-VL; the defaults ground the synthetic world on 2 CPU cores."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    vision_depth: int = 2
    vision_embed_dim: int = 64
    vision_heads: int = 4
    patch_size: int = 14
    merge_size: int = 2
    max_positions: int = 1024
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vision_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) must be an "
                "even integer (rotary head dim)"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.vision_embed_dim % self.vision_heads:
            raise ValueError("vision_embed_dim must be a multiple of vision_heads")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) so that runs repeat."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL splits the rotary half-dim into (time, height, width) = 1/4, 3/8, 3/8."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def _token_ids(tokenizer: Any) -> dict[str, int]:
    ids = {
        name: tokenizer.convert_tokens_to_ids(token)
        for name, token in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    for name, value in ids.items():
        if value is None or value == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer lacks the Qwen2-VL token for {name}")
    return ids


class PatchProjection(torch.nn.Conv3d):
    """Qwen2-VL's patch embedding (a Conv3d whose stride is its kernel) computed as one matmul.

    Each output position sees exactly one input patch, so the convolution is a linear map of the
    flattened patch: the same weights and state-dict key, the same values up to float rounding,
    and several times less CPU time than the convolution and its backward."""

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        weight = self.weight.reshape(self.out_channels, -1)
        out = torch.nn.functional.linear(patches.reshape(patches.shape[0], -1), weight, self.bias)
        return out.reshape(patches.shape[0], self.out_channels, 1, 1, 1)


def _text_config(tokenizer: Any, config: TinyModelConfig, **extra: Any) -> dict[str, Any]:
    """The text decoder's settings every tiny Qwen shares (vocabulary and special ids from the
    tokenizer), plus `extra` (rope parameters, head dim)."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "max_position_embeddings": config.max_positions,
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": config.tie_embeddings,
        **extra,
    }


def _mrope(head_dim: int, section: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": section or _mrope_section(head_dim),
            **extra,
        }
    }


def _finish(model: Any, tokenizer: Any) -> Any:
    """The patch embedding as one matmul (vision models) and the generation ids."""
    projection = getattr(getattr(model.model, "visual", None), "patch_embed", None)
    projection = getattr(projection, "proj", None)
    if (
        isinstance(projection, torch.nn.Conv3d)
        and projection.stride == projection.kernel_size
        and not any(projection.padding)
    ):
        projection.__class__ = PatchProjection  # same module, parameters and checkpoint keys
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _build(config_class: type, model_class: type, tokenizer: Any, seed: int, **settings: Any):
    """`model_class` from `config_class(**settings)`: sdpa attention, weights drawn after
    `torch.manual_seed(seed)`, then `_finish`."""
    hf_config = config_class(**settings)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(model_class(hf_config), tokenizer)


def _vision_language(
    classes: tuple[type, type],
    tokenizer: Any,
    config: TinyModelConfig,
    seed: int,
    text_config: dict[str, Any],
    vision_config: dict[str, Any],
) -> Any:
    """A tiny Qwen-VL: its text and vision settings, the tokenizer's special ids."""
    return _build(
        *classes,
        tokenizer,
        seed,
        text_config=text_config,
        vision_config=vision_config,
        tie_word_embeddings=config.tie_embeddings,
        **_token_ids(tokenizer),
    )


def _gated_tower(config: TinyModelConfig, patch_size: int) -> dict[str, Any]:
    """The vision-tower settings Qwen2.5-VL and Qwen3-VL share (gated MLP twice the width, a
    separate output width: the text model's)."""
    return {
        "depth": config.vision_depth,
        "hidden_size": config.vision_embed_dim,
        "intermediate_size": 2 * config.vision_embed_dim,
        "num_heads": config.vision_heads,
        "out_hidden_size": config.hidden_size,
        "patch_size": patch_size,
        "spatial_merge_size": config.merge_size,
    }


def build_tiny_qwen2vl(tokenizer: Any, config: TinyModelConfig | None = None, *, seed: int = 0):
    """A randomly initialised `Qwen2VLForConditionalGeneration` sized by `config`.

    The vocabulary is `len(tokenizer)`; special-token ids come from the tokenizer, so
    truncated tokenizers and the full Qwen vocabulary both work.
    """
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    config = config or TinyModelConfig()
    head_dim = config.hidden_size // config.num_heads
    return _vision_language(
        (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
        tokenizer,
        config,
        seed,
        text_config=_text_config(tokenizer, config, **_mrope(head_dim)),
        vision_config={
            "depth": config.vision_depth,
            "embed_dim": config.vision_embed_dim,
            "hidden_size": config.hidden_size,
            "num_heads": config.vision_heads,
            "mlp_ratio": 2,
            "patch_size": config.patch_size,
            "spatial_merge_size": config.merge_size,
        },
    )


def build_tiny_qwen2_5_vl(
    tokenizer: Any, config: TinyModelConfig | None = None, *, seed: int = 0
) -> Any:
    """A randomly initialised `Qwen2_5_VLForConditionalGeneration` sized by `config`.

    Qwen2.5-VL's own vision tower (RMSNorm, gated MLP, window attention with full-attention
    blocks, a separate output width): here one window-attention block and one full-attention
    block per two of depth, a window of two merged patches.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = config or TinyModelConfig()
    head_dim = config.hidden_size // config.num_heads
    return _vision_language(
        (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
        tokenizer,
        config,
        seed,
        text_config=_text_config(tokenizer, config, **_mrope(head_dim)),
        vision_config={
            **_gated_tower(config, config.patch_size),
            "window_size": 2 * config.patch_size * config.merge_size,
            "fullatt_block_indexes": list(range(1, config.vision_depth, 2)),
        },
    )


def build_tiny_qwen3_vl(
    tokenizer: Any, config: TinyModelConfig | None = None, *, seed: int = 0, patch_size: int = 16
) -> Any:
    """A randomly initialised `Qwen3VLForConditionalGeneration` sized by `config`.

    Qwen3-VL's own architecture: a Qwen3 text model (per-head q/k norms, explicit head dim) with
    interleaved multimodal RoPE (`mrope_section` in Qwen3-VL's 24:20:20 proportion of the
    rotary half-dim), a vision tower with learned position embeddings (an 8 x 8 grid, bilinearly
    interpolated to each image's grid) and DeepStack: the merged features of every vision block
    but the last, at most three (Qwen3-VL takes three of 27), are added at the image tokens to
    the outputs of the first decoder layers (depth 2: block 0 into layer 0). Qwen3-VL patches 16 px (`patch_size`; `config.patch_size` is Qwen2-VL's 14
    and is not read), so its processor needs `patch_size=16` too.
    """
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = config or TinyModelConfig()
    head_dim = config.hidden_size // config.num_heads
    half = head_dim // 2
    spatial = half * 20 // 64  # height and width each; time takes the rest
    deepstack = list(range(max(config.vision_depth - 1, 1)))[:3]
    if len(deepstack) > config.num_layers:
        raise ValueError(f"num_layers must be >= {len(deepstack)} (DeepStack layers)")
    return _vision_language(
        (Qwen3VLConfig, Qwen3VLForConditionalGeneration),
        tokenizer,
        config,
        seed,
        text_config=_text_config(
            tokenizer,
            config,
            head_dim=head_dim,
            **_mrope(head_dim, [half - 2 * spatial, spatial, spatial], mrope_interleaved=True),
        ),
        vision_config={
            **_gated_tower(config, patch_size),
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": deepstack,
        },
    )


def build_tiny_qwen3(tokenizer: Any, config: TinyModelConfig | None = None, *, seed: int = 0):
    """A randomly initialised text-only `Qwen3ForCausalLM` (Qwen3's per-head q/k norms)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = config or TinyModelConfig()
    return _build(
        Qwen3Config,
        Qwen3ForCausalLM,
        tokenizer,
        seed,
        **_text_config(tokenizer, config, head_dim=config.hidden_size // config.num_heads),
    )


def build_tiny_qwen2(tokenizer: Any, config: TinyModelConfig | None = None, *, seed: int = 0):
    """A randomly initialised text-only `Qwen2ForCausalLM` (the function-calling task)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = config or TinyModelConfig()
    return _build(Qwen2Config, Qwen2ForCausalLM, tokenizer, seed, **_text_config(tokenizer, config))


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
