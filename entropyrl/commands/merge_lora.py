"""Fold a LoRA checkpoint's adapter into its base model: one Hugging Face model folder.

verl's merger (`python -m verl.model_merger merge --backend fsdp --local_dir .../actor
--target_dir DIR`) writes a LoRA run's base weights to DIR and its adapter to DIR/lora_adapter
(peft's format). vLLM, transformers and the evaluation scripts want one model, so:

    python -m entropyrl.commands.merge_lora DIR [--out DIR/merged]

loads the base (`entropyrl.models.loading.load_model`), applies the adapter with peft to exactly
the layers it has weights for, checks that every adapter tensor found its layer, merges
(W + scale * B @ A), and saves the model with the tokenizer and processor files beside it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entropyrl.commands.forward import add_forwarded

ADAPTER_DIR = "lora_adapter"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def merge_lora(folder: str | Path, out: str | Path | None = None) -> Path:
    """Merge `folder/lora_adapter` into the base model in `folder`; returns the merged folder."""
    import torch
    from peft import PeftConfig, PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file

    from entropyrl.models.loading import load_model

    folder = Path(folder)
    adapter = folder / ADAPTER_DIR
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"{adapter}: no adapter_config.json (write it with verl's merger: "
            f"python -m verl.model_merger merge --backend fsdp --local_dir .../actor "
            f"--target_dir {folder})"
        )
    out = Path(out) if out is not None else folder / "merged"
    sent = set(load_file(adapter / "adapter_model.safetensors"))
    # verl's merger names the target modules by their last part only ("gate_proj"), which would
    # also wrap layers the run left out (a VLM's vision tower): target exactly the layers the
    # adapter has weights for.
    config = PeftConfig.from_pretrained(adapter)
    config.target_modules = sorted(
        {name.removeprefix("base_model.model.").split(".lora_")[0] for name in sent}
    )
    model = PeftModel.from_pretrained(load_model(folder), adapter, config=config)
    placed = set(get_peft_model_state_dict(model))
    if sent - placed:
        stray = sorted(sent - placed)
        raise ValueError(
            f"{len(stray)} adapter tensors match no layer of the base, e.g. {stray[:3]}"
        )
    merged = model.merge_and_unload()
    merged.to(torch.bfloat16).save_pretrained(out)
    for item in folder.iterdir():  # tokenizer, chat template, processor, generation config
        if (
            item.is_file()
            and not item.name.endswith(_WEIGHT_SUFFIXES)
            and item.name != "config.json"
        ):
            shutil.copy2(item, out / item.name)
    return out


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m entropyrl.commands.merge_lora"
) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Merge the LoRA adapter that verl's model merger wrote (DIR/lora_adapter) "
        "into the base model in DIR: one Hugging Face model folder.",
    )
    parser.add_argument("folder", help="verl's merger target dir (base model + lora_adapter/)")
    parser.add_argument("--out", default=None, help="output folder (default FOLDER/merged)")
    args = parser.parse_args(argv)
    try:
        out = merge_lora(args.folder, args.out)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"merged model -> {out}")
    return 0


def register(subparsers: Any) -> None:
    """Add `merge-lora` to the `entropyrl` command line (the parser of
    `python -m entropyrl.commands.merge_lora`)."""
    add_forwarded(
        subparsers,
        "merge-lora",
        __name__,
        "fold a LoRA adapter of verl's merger output into its base model",
    )


if __name__ == "__main__":
    sys.exit(main())
