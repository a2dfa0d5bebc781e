"""`python -m entropyrl.commands.merge_lora`: verl's merger output (base + lora_adapter/) folded
into one model, equal to peft's own merge; a folder without an adapter is one line and exit 2.
The whole path from a real LoRA checkpoint runs in tests/rig/smoke/test_smoke.py."""

from __future__ import annotations

import subprocess
import sys

import torch

from entropyrl.commands.merge_lora import merge_lora
from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen3
from entropyrl.rig.tokenizer import build_qwen_tokenizer


def test_the_merged_model_is_base_plus_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    tokenizer = build_qwen_tokenizer(num_ranks=8192)
    base = build_tiny_qwen3(tokenizer, TinyModelConfig(hidden_size=32, num_layers=1))
    base.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    policy = get_peft_model(base, config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    adapter = tmp_path / "lora_adapter"  # as verl's merger writes it
    adapter.mkdir()
    config.save_pretrained(adapter)
    state = {k: v.contiguous() for k, v in get_peft_model_state_dict(policy).items()}
    save_file(state, adapter / "adapter_model.safetensors")
    expected = policy.merge_and_unload().state_dict()

    merged = merge_lora(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name].to(torch.bfloat16).float())
    assert (merged / "tokenizer.json").is_file()


def test_a_folder_without_an_adapter_is_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "entropyrl.commands.merge_lora", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "verl.model_merger" in lines[0]
