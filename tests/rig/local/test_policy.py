"""Rollout helpers, the tiny models and the advantage routing of the local runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entropyrl.rig.local.policy import (
    expand_prompts,
    forbidden_token_ids,
    generate,
    response_log_probs,
    response_mask,
    select_rows,
)


def test_response_mask_keeps_up_to_the_first_eos():
    eos = 7
    responses = torch.tensor([[1, 2, 7, 3, 7], [7, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert response_mask(responses, eos).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
    ]


def test_expand_and_select_move_each_image_block_with_its_row():
    grid = torch.tensor([[1, 2, 2], [1, 2, 4]])  # 4 and 8 patches
    pixels = torch.cat([torch.zeros(4, 3), torch.ones(8, 3)])
    batch = {
        "input_ids": torch.tensor([[5, 6], [8, 9]]),
        "pixel_values": pixels,
        "image_grid_thw": grid,
    }
    big = expand_prompts(batch, 3)
    assert big["input_ids"][:, 0].tolist() == [5, 5, 5, 8, 8, 8]
    assert big["pixel_values"].shape == (3 * 4 + 3 * 8, 3)
    assert big["pixel_values"][:12].sum() == 0 and big["pixel_values"][12:].min() == 1
    picked = select_rows(big, torch.tensor([4, 0]))
    assert picked["input_ids"][:, 0].tolist() == [8, 5]
    assert picked["pixel_values"].shape == (12, 3)
    assert picked["pixel_values"][:8].min() == 1 and picked["pixel_values"][8:].max() == 0
    assert picked["image_grid_thw"].tolist() == [[1, 2, 4], [1, 2, 2]]


@pytest.fixture(scope="module")
def vlm(small_tokenizer):
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2vl
    from entropyrl.rig.tokenizer import build_qwen2vl_processor

    model = build_tiny_qwen2vl(small_tokenizer, TinyModelConfig(hidden_size=64), seed=0)
    processor = build_qwen2vl_processor(small_tokenizer, image_size=56)
    return model, processor


def _prompts(tokenizer, processor, n_images):
    from PIL import Image

    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    images = [Image.new("RGB", (56, 56), c) for c in ("red", "blue", "green")[:n_images]]
    return dict(processor(images=images, text=[text] * n_images, return_tensors="pt"))


def test_sampling_never_emits_forbidden_specials_and_log_probs_match_a_plain_forward(
    small_tokenizer, vlm
):
    model, processor = vlm
    torch.manual_seed(0)
    prompts = expand_prompts(_prompts(small_tokenizer, processor, 2), 4)
    forbidden = forbidden_token_ids(small_tokenizer)
    assert small_tokenizer.eos_token_id not in forbidden
    assert small_tokenizer.convert_tokens_to_ids("<|image_pad|>") in forbidden
    responses, mask = generate(
        model, prompts, eos_id=small_tokenizer.eos_token_id, pad_id=small_tokenizer.pad_token_id,
        max_new_tokens=12, temperature=1.0, suppress=forbidden,
    )  # fmt: skip
    assert responses.shape[0] == 8
    assert not torch.isin(responses[mask.bool()], torch.tensor(forbidden)).any()
    temperature = 0.7
    log_prob, entropy = response_log_probs(
        model, prompts, responses, mask, temperature=temperature, with_entropy=True
    )
    # Reference: one full forward, logits of the positions before each response token.
    full_ids = torch.cat([prompts["input_ids"], responses], 1)
    with torch.no_grad():
        logits = model(
            input_ids=full_ids,
            attention_mask=torch.cat([prompts["attention_mask"], mask], 1),
            mm_token_type_ids=torch.cat(
                [prompts["mm_token_type_ids"], torch.zeros_like(responses)], 1
            ),
            pixel_values=prompts["pixel_values"],
            image_grid_thw=prompts["image_grid_thw"],
        ).logits
    p = prompts["input_ids"].shape[1]
    ref_logits = logits[:, p - 1 : -1].double() / temperature
    ref_lp = torch.log_softmax(ref_logits, -1).gather(-1, responses[..., None])[..., 0]
    probs = torch.softmax(ref_logits, -1)
    ref_entropy = -(probs * torch.log(probs)).sum(-1)
    keep = mask.bool()
    assert torch.allclose(log_prob[keep].double(), ref_lp[keep], atol=1e-4)
    assert torch.allclose(entropy[keep].double(), ref_entropy[keep], atol=1e-4)
    assert not log_prob[~keep].any() and not entropy[~keep].any()  # padding: no LM head work


def test_patch_projection_is_the_convolution(vlm):
    from entropyrl.rig.tiny import PatchProjection

    model, _ = vlm
    projection = model.model.visual.patch_embed.proj
    assert isinstance(projection, PatchProjection)
    assert "model.visual.patch_embed.proj.weight" in model.state_dict()
    patches = torch.randn(
        12, *projection.weight.shape[1:], generator=torch.Generator().manual_seed(0)
    )
    expected = torch.nn.functional.conv3d(patches, projection.weight, stride=projection.stride)
    assert torch.allclose(projection(patches), expected, atol=1e-5)


def test_text_model_log_probs_ignore_left_padding(small_tokenizer):
    from entropyrl.rig.tiny import TinyModelConfig, build_tiny_qwen2

    model = build_tiny_qwen2(small_tokenizer, TinyModelConfig(hidden_size=64), seed=1)
    pad = small_tokenizer.pad_token_id
    ids = small_tokenizer.encode("hello there, set a timer")
    response = torch.tensor([small_tokenizer.encode(" ok")])
    mask = torch.ones_like(response)
    plain = {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
    }
    padded = {
        "input_ids": torch.tensor([[pad, pad, *ids]]),
        "attention_mask": torch.tensor([[0, 0] + [1] * len(ids)]),
    }
    with torch.no_grad():
        a, _ = response_log_probs(model, plain, response, mask)
        b, _ = response_log_probs(model, padded, response, mask)
    assert torch.allclose(a, b, atol=1e-5)


def settings_for(adv: str, **sections):
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.runner import rl_settings

    cfg = DemoConfig(adv=adv, **sections)
    return rl_settings(cfg, cfg.variants()[0])


def test_advantage_routing_uses_the_core_estimators():
    from entropyrl.core.advantages import egpo_bonus_advantage, grpo_advantage
    from entropyrl.rig.local.rl import compute_advantages, sample_clip_high

    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 1.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    entropy = torch.rand(6, 5, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(6, 5, dtype=torch.long)
    mask[1, 3:] = 0
    result = compute_advantages(settings_for("grpo"), scores, group, entropy, mask)
    assert torch.equal(result.sample, grpo_advantage(scores, group))
    result = compute_advantages(
        settings_for("egpo", egpo_bonus={"lam": 0.3}), scores, group, entropy, mask
    )
    h = (entropy * mask).sum(1) / mask.sum(1)
    expected, _ = egpo_bonus_advantage(scores, h, group, lam=0.3, alpha=2.0)
    assert torch.allclose(result.sample, expected)
    assert torch.allclose(result.token, expected[:, None] * mask)
    token = compute_advantages(settings_for("entropy_adv"), scores, group, entropy, mask).token
    assert token.shape == (6, 5)
    with pytest.raises(ValueError, match="reference policy"):
        compute_advantages(settings_for("maxent_grpo"), scores, group, entropy, mask)
    bounds = sample_clip_high(settings_for("grpo"), np.array([0.0, 0.5, float("nan")]), 3)
    assert bounds.tolist() == pytest.approx([0.3, 0.5, 0.3])
    assert sample_clip_high(settings_for("grpo"), None, 2).tolist() == pytest.approx([0.3] * 2)
    off = settings_for("grpo", clip_schedule={"enable": False})
    assert off.ppo.clip_high == 0.28
    assert sample_clip_high(off, None, 2).tolist() == pytest.approx([0.28] * 2)


def test_misspelt_section_key_is_refused_naming_it():
    from entropyrl.rig.local.config import DemoConfig

    with pytest.raises(ValueError, match="clip_schedule: unknown key 'treshold'"):
        DemoConfig(clip_schedule={"treshold": 0.1})
    with pytest.raises(ValueError, match=r"egpo_bonus\.alpha"):
        DemoConfig(egpo_bonus={"alpha": -1.0})


def test_function_calling_queries_and_reference_answers(small_tokenizer):
    from entropyrl.rewards.function_calling import compute_score
    from entropyrl.rig.local.function_calling import FunctionCallingTask, make_queries

    queries = make_queries(30, seed=0)
    assert queries == make_queries(30, seed=0)
    assert {q.name for q in queries} == {"get_weather", "convert_currency", "set_timer"}
    for q in queries:
        assert compute_score(q.answer(), q.ground_truth()) == 1.0
    task = FunctionCallingTask(small_tokenizer, queries[:20], queries[20:])
    # The tags survive decoding with special tokens skipped.
    ids = small_tokenizer.encode(queries[0].answer())
    assert small_tokenizer.decode(ids, skip_special_tokens=True) == queries[0].answer()
    out = task.reward([queries[0].answer(), "no call"], [0, 0])
    assert out.scores.tolist() == [1.0, 0.0]
    prompts = task.prompts([0, 1, 2])
    assert (prompts["attention_mask"].sum(1) > 0).all()
    assert (prompts["input_ids"][:, -1] == prompts["input_ids"][0, -1]).all()  # left padded


def test_phases_reject_an_ambiguous_budget():
    from entropyrl.rig.local.config import DemoConfig
    from entropyrl.rig.local.runner import run_warmup

    cfg = DemoConfig()
    with pytest.raises(ValueError, match="steps= or seconds="):
        run_warmup(None, None, cfg, steps=1, seconds=1.0, seed=0)
    with pytest.raises(ValueError, match="clock"):
        run_warmup(None, None, cfg, seconds=1.0, seed=0, clock="gpu")
    with pytest.raises(ValueError, match="control_clock"):
        DemoConfig(control_clock="sundial")
    with pytest.raises(ValueError, match="chair_penalty"):
        DemoConfig(chair_penalty="ratio")


def test_cached_caption_prompts_equal_the_processor_batch(small_tokenizer, vlm, tmp_path):
    """CaptionTask keeps each image's processor output: the batch it builds (repeats included)
    is the very tensor set the processor gives for the whole batch."""
    import torch

    from entropyrl.rig.local.captioning import CaptionTask
    from entropyrl.rig.synthetic import build_synthetic_coco

    _, processor = vlm
    world = build_synthetic_coco(tmp_path, num_train=6, num_test=2, image_size=56, seed=3)
    task = CaptionTask(world, small_tokenizer, processor, reward=None)
    items = [task.train_ids[2], task.train_ids[0], task.train_ids[2], task.test_ids[1]]
    cached = task.prompts(items)
    images = [world.image(i) for i in items]
    direct = dict(processor(images=images, text=[task.prompt_text] * 4, return_tensors="pt"))
    assert cached.keys() == direct.keys()
    for key in direct:
        assert cached[key].dtype == direct[key].dtype and torch.equal(cached[key], direct[key]), key
    assert len(task._prompt_cache) == 3
