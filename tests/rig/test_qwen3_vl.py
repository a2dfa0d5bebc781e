"""Qwen3-VL as the captioning smoke's second architecture (`SMOKE_MODEL=qwen3_vl`).

The tiny model builds, its checkpoint's processor loads through verl's `hf_processor` without
torchvision, the `hf` rollout generates on an image with the model's own log-probs, and verl's
remove-padding forward (which does not patch Qwen3-VL's attention) keeps packed sequences apart
on PyTorch's attention. The whole smoke with Qwen3-VL (LoRA and token-level entropy shaping,
through Ray) is the session's `lora_caption_entropy_adv` run (tests/rig/smoke/test_smoke.py).
"""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import pytest
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SIDE = 128  # 8 x 8 patches of 16 px, 16 image tokens: the smoke's images for Qwen3-VL


@pytest.fixture(scope="module")
def tokenizer():
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(num_ranks=8192)


@pytest.fixture(scope="module")
def model(tokenizer):
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen3_vl

    return build_tiny_qwen3_vl(tokenizer, TinyModelConfig(hidden_size=64), seed=4).eval()


@pytest.fixture(scope="module")
def processor(tokenizer):
    from entropyrl.rig.smoke.assets import IMAGE_PROCESSORS
    from entropyrl.rig.tokenizer import build_qwen2vl_processor

    return build_qwen2vl_processor(tokenizer, image_size=SIDE, **IMAGE_PROCESSORS["qwen3_vl"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, model, tokenizer, processor):
    from entropyrl.rig.smoke.assets import _save_checkpoint

    folder = tmp_path_factory.mktemp("qwen3_vl") / "model"
    _save_checkpoint(model, tokenizer, processor, folder)
    return folder


@pytest.fixture(scope="module")
def cpu_fixes():
    from entropyrl.rig.cpu import backend as cpu_backend

    cpu_backend.install()


def image(seed: int) -> Image.Image:
    pixels = torch.randint(0, 256, (SIDE, SIDE, 3), generator=torch.Generator().manual_seed(seed))
    return Image.fromarray(pixels.to(torch.uint8).numpy())


def caption_prompt(processor) -> str:
    return processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        add_generation_prompt=True,
        tokenize=False,
    )


def test_tiny_qwen3_vl_has_qwen3_vls_architecture(model, tokenizer):
    from transformers import Qwen3VLForConditionalGeneration

    from entropyrl.rig.tiny import PatchProjection

    config = model.config
    assert isinstance(model, Qwen3VLForConditionalGeneration) and config.model_type == "qwen3_vl"
    assert config._attn_implementation == "sdpa"
    assert config.vision_config.patch_size == 16 and config.vision_config.spatial_merge_size == 2
    assert list(config.vision_config.deepstack_visual_indexes) == [0]
    assert len(model.model.visual.deepstack_merger_list) == 1
    rope = config.text_config.rope_parameters
    assert (
        rope["mrope_interleaved"] and sum(rope["mrope_section"]) == config.text_config.head_dim // 2
    )
    for name, token in (
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ):
        assert getattr(config, name) == tokenizer.convert_tokens_to_ids(token)
    assert config.text_config.vocab_size == len(tokenizer)
    assert isinstance(model.model.visual.patch_embed.proj, PatchProjection)


def test_smoke_assets_know_qwen3_vl():
    from entropyrl.rig.smoke.assets import MODELS, caption_image_size
    from entropyrl.rig.smoke.settings import SmokeSettings

    assert MODELS["qwen3_vl"] == "build_tiny_qwen3_vl"
    assert caption_image_size(SmokeSettings(task="caption", model="qwen3_vl")) == SIDE
    assert caption_image_size(SmokeSettings(task="caption")) == 112  # the default is unchanged


def test_pil_image_processor_reproduces_qwen3_vls_patches(processor):
    """Qwen3-VL's checkpoints name Qwen2-VL's image processor (torchvision backend) with patch 16
    and normalisation 0.5. That backend needs torchvision; its patch layout is written out here
    (from `Qwen2VLImageProcessor._preprocess`) and the Pillow backend gives the same values on an
    image at its native size (no resize, which is where the two backends' code differs)."""
    picture = image(0)
    got = processor.image_processor(images=[picture], return_tensors="pt")
    assert got["image_grid_thw"].tolist() == [[1, 8, 8]]
    pixels = torch.tensor(list(picture.getdata()), dtype=torch.float32).reshape(SIDE, SIDE, 3)
    pixels = ((pixels / 255.0 - 0.5) / 0.5).permute(2, 0, 1)[None]  # [1, C, H, W]
    grid, merge, patch, temporal = 8, 2, 16, 2
    patches = pixels.reshape(1, 3, grid // merge, merge, patch, grid // merge, merge, patch)
    patches = patches.permute(0, 2, 5, 3, 6, 1, 4, 7).unsqueeze(6)
    expected = patches.expand(-1, -1, -1, -1, -1, -1, temporal, -1, -1).reshape(
        grid * grid, 3 * temporal * patch * patch
    )
    torch.testing.assert_close(got["pixel_values"].float(), expected, atol=1e-5, rtol=0)


def test_processor_loads_through_verls_hf_processor(checkpoint, cpu_fixes, tokenizer, model):
    """`AutoProcessor` fails here (Qwen3-VL's video processor needs torchvision); verl's
    `hf_processor` gets the image-only `Qwen3VLProcessor`, bound to Qwen3-VL's rope index."""
    import warnings

    from transformers import AutoProcessor
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
    from verl.workers.config import model as model_config

    if importlib_missing("torchvision"):
        with pytest.raises(ImportError):
            AutoProcessor.from_pretrained(str(checkpoint))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        processor = model_config.hf_processor(str(checkpoint))
    assert not [w for w in caught if "Failed to create processor" in str(w.message)]
    assert type(processor).__name__ == "Qwen3VLProcessor"  # the name verl's loader matches on
    assert processor.config.model_type == "qwen3_vl"
    assert processor.get_rope_index.__func__ is Qwen3VLModel.get_rope_index
    assert processor.get_vision_position_ids.__func__ is Qwen3VLModel.get_vision_position_ids
    assert processor.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert processor.vision_end_token_id == tokenizer.convert_tokens_to_ids("<|vision_end|>")
    image_processor = processor.image_processor
    assert type(image_processor).__name__ == "Qwen2VLImageProcessorPil"
    assert image_processor.patch_size == 16 and list(image_processor.image_mean) == [0.5] * 3
    inputs = processor(text=[caption_prompt(processor)], images=[image(1)], return_tensors="pt")
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == pad).sum()) == 16
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    positions, _ = processor.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"],
        attention_mask=inputs["attention_mask"],
    )
    own, _ = model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"],
        attention_mask=inputs["attention_mask"],
    )
    assert torch.equal(positions, own)


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def test_hf_rollout_generates_on_an_image(compose, checkpoint, cpu_fixes, tokenizer):
    """The `hf` rollout server: sampled tokens with their log-probs under the policy (computed
    again with a plain forward, `mm_token_type_ids` marking the image), no vision tokens."""
    from omegaconf import OmegaConf

    from entropyrl.rig.cpu.hf_rollout import HFRolloutServer

    overrides = [
        f"actor_rollout_ref.model.path={checkpoint}",
        "data.max_prompt_length=64",
        "data.max_response_length=12",
    ]
    config = OmegaConf.create(
        OmegaConf.to_container(compose("chair_mscoco", overrides), resolve=True)
    )
    server = HFRolloutServer(
        config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, replica_rank=0
    )
    processor = server.processor
    assert type(processor).__name__ == "Qwen3VLProcessor"
    text = caption_prompt(processor)
    pictures = [image(2), image(3)]
    prompts = [
        processor(text=[text], images=[p], return_tensors="pt")["input_ids"][0].tolist()
        for p in pictures
    ]
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}

    async def both():
        return await asyncio.gather(
            *[
                server.generate(prompt, dict(params), f"r{i}", image_data=[picture])
                for i, (prompt, picture) in enumerate(zip(prompts, pictures))
            ]
        )

    outputs = asyncio.run(both())  # decoded together: one left-padded batch of two images
    vision = {
        tokenizer.convert_tokens_to_ids(t)
        for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    }
    for prompt, picture, output in zip(prompts, pictures, outputs):
        assert 1 <= len(output.token_ids) <= 12
        assert len(output.log_probs) == len(output.token_ids)
        assert not vision & set(output.token_ids)
        full = processor(text=[text], images=[picture], return_tensors="pt")
        response = torch.tensor([output.token_ids])
        with torch.no_grad():
            logits = server.model(
                input_ids=torch.cat([full["input_ids"], response], dim=1),
                pixel_values=full["pixel_values"],
                image_grid_thw=full["image_grid_thw"],
                mm_token_type_ids=torch.cat(
                    [full["mm_token_type_ids"], torch.zeros_like(response)], dim=1
                ),
            ).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, response.T)[:, 0]
        torch.testing.assert_close(torch.tensor(output.log_probs), expected, atol=1e-4, rtol=0)


def test_verls_remove_padding_forward_keeps_packed_sequences_apart(
    checkpoint, cpu_fixes, model, tokenizer
):
    """verl's remove-padding path for Qwen3-VL on CPU: position ids as verl's agent loop builds
    them ((1, 4, L): text row + mRoPE rows), packed into one row as its FSDP engine packs them
    ((4, 1, total), no attention mask, no cache), through verl's own Qwen3-VL forward
    (`qwen3_vl_base_forward` + the LM head, what `forward_with_normal_backend` runs) with sdpa.
    transformers finds the packed sequences from the text row, so each sequence's log-probs equal
    its own forward; with only the 3 mRoPE rows (no text row) they would leak (checked)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.models.transformers.qwen3_vl import qwen3_vl_base_forward
    from verl.workers.config import model as model_config

    processor = model_config.hf_processor(str(checkpoint))
    worker = types.SimpleNamespace(processor=processor)
    text = caption_prompt(processor)
    rows = []
    for seed, answer in ((5, "a red circle"), (6, "two blue squares and one green star")):
        inputs = processor(text=[text + answer], images=[image(seed)], return_tensors="pt")
        positions = AgentLoopWorker._compute_position_ids(
            worker,
            inputs["input_ids"],
            inputs["attention_mask"],
            {
                "image_grid_thw": inputs["image_grid_thw"],
                "mm_token_type_ids": inputs["mm_token_type_ids"],
            },
        )
        assert positions.shape == (1, 4, inputs["input_ids"].shape[1])
        rows.append((inputs, positions))

    def log_probs(input_ids, position_ids, pixel_values, grid):
        with torch.no_grad():
            hidden = qwen3_vl_base_forward(
                model.model,
                input_ids,
                attention_mask=None,
                position_ids=position_ids,
                pixel_values=pixel_values,
                image_grid_thw=grid,
                use_cache=False,
            )[0]
            return torch.log_softmax(model.lm_head(hidden)[0].float(), -1)

    alone = [
        log_probs(
            inputs["input_ids"],
            positions.transpose(0, 1),
            inputs["pixel_values"],
            inputs["image_grid_thw"],
        )
        for inputs, positions in rows
    ]
    packed_ids = torch.cat([inputs["input_ids"] for inputs, _ in rows], dim=1)
    packed_positions = torch.cat([positions[0] for _, positions in rows], dim=1).unsqueeze(1)
    pixels = torch.cat([inputs["pixel_values"] for inputs, _ in rows])
    grids = torch.cat([inputs["image_grid_thw"] for inputs, _ in rows])
    packed = log_probs(packed_ids, packed_positions, pixels, grids)
    first = rows[0][0]["input_ids"].shape[1]
    torch.testing.assert_close(packed[:first], alone[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(packed[first:], alone[1], atol=1e-4, rtol=0)
    leaked = log_probs(packed_ids, packed_positions[1:], pixels, grids)
    assert (leaked[first:] - alone[1]).abs().max() > 1e-2


def test_caption_warm_up_trains_qwen3_vl(tokenizer, processor, tmp_path):
    """The smoke's warm-up (`CaptionTask` + `supervised_step`) on Qwen3-VL: a few steps lower
    the loss on a fixed batch."""
    import random

    from entropyrl.rig.local.captioning import CaptionTask
    from entropyrl.rig.local.rl import supervised_step
    from entropyrl.rig.synthetic import build_synthetic_coco
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen3_vl

    world = build_synthetic_coco(tmp_path / "world", num_train=8, num_test=2, image_size=SIDE)
    model = build_tiny_qwen3_vl(tokenizer, TinyModelConfig(hidden_size=64), seed=5)
    task = CaptionTask(world, tokenizer, processor, reward=None)
    ids, targets = task.warmup_batch(random.Random(0), 4)
    prompts = task.prompts(ids)
    assert (
        int((prompts["input_ids"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()) == 64
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = [
        supervised_step(model, optimizer, prompts, targets, pad_id=tokenizer.pad_token_id)
        for _ in range(8)
    ]
    assert losses[-1] < losses[0]
