"""Models from checkpoint folders on disk (no download): the local runner's `--model PATH`, the
caption evaluation's runs, the LoRA merge and the CPU backend's `hf` rollout. The tiny models
built from a config are in `entropyrl.rig.tiny`.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["load_model", "load_pretrained", "pick_device"]


def pick_device(device: str | None = None) -> torch.device:
    """`device` if given, else the one CUDA GPU when there is one, else the CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(
    path: str | os.PathLike[str],
    *,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> Any:
    """The model in a local folder, float32 on the CPU: the image-text class when its config has
    a vision tower (Qwen-VL), else the causal-LM class."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    vision = getattr(config, "vision_config", None) is not None
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return auto.from_pretrained(
        path, dtype=torch.float32, trust_remote_code=trust_remote_code, **extra
    )


def load_pretrained(path: str | os.PathLike[str], *, vision: bool = True):
    """`(model, tokenizer)` from a local checkpoint folder (no download).

    Any Qwen2-VL / Qwen2.5-VL checkpoint (`vision=True`) or Qwen2 / Qwen2.5 text checkpoint
    works; the folder must hold the tokenizer files too.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--model: {path} is not a local checkpoint folder")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if vision:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(
            path, local_files_only=True, dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32
        )
    return model, tokenizer
