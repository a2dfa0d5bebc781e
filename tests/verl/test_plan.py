"""`entropyrl.verl.checks.plan`: the dry run's GPU, host, disk and time figures against a
written-out reference (docs/scaling.md, docs/lora.md), the shipped model numbers against the
models transformers builds from them, and the planning table of docs/scaling.md against its
generator."""

from __future__ import annotations

import json
import re

import pytest

from entropyrl.verl.checks import plan
from entropyrl.verl.checks.budget import checkpoint_bytes

P3B, P7B, P4B, P8B = 3_754_622_976, 8_292_166_656, 4_437_815_808, 8_767_123_696
H100 = 80e9


@pytest.fixture(scope="module")
def recipe():
    from entropyrl.commands.preflight import compose_recipe

    return compose_recipe("chair_mscoco", ["trainer.n_gpus_per_node=8"])


def node(gpus: int, memory: float = H100) -> plan.Layout:
    return plan.Layout(nodes=1, per_node=gpus, gpu_bytes=memory, gpu_from="test")


def test_the_shipped_numbers_build_the_models_with_their_parameter_counts():
    """Each shipped config, built on the meta device by transformers' own classes, has the
    parameter count the plan uses (3B and 7B: the counts docs/scaling.md gives)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    data = json.loads(plan.MODELS_FILE.read_text())
    counted = {}
    for name, entry in data.items():
        if name.startswith("_"):
            continue
        config = AutoConfig.for_model(
            entry["model_type"],
            text_config=dict(entry["text"]),
            vision_config=dict(entry["vision"]),
            tie_word_embeddings=entry["text"]["tie_word_embeddings"],
        )
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
        counted[name] = sum(p.numel() for p in model.parameters())
        assert counted[name] == entry["parameters"], name
    assert counted == {
        "Qwen2.5-VL-3B-Instruct": P3B,
        "Qwen2.5-VL-7B-Instruct": P7B,
        "Qwen3-VL-4B-Instruct": P4B,
        "Qwen3-VL-8B-Instruct": P8B,
    }


def test_lora_parameters_are_docs_loras():
    """docs/lora.md: rank 64 on the language model's linear layers, 3B 64 x 36 x 51,968 and
    7B 64 x 28 x 90,112."""
    shapes = plan.shipped_shapes()
    assert shapes["Qwen2.5-VL-3B-Instruct"].lora_parameters(64) == 64 * 36 * 51_968
    assert shapes["Qwen2.5-VL-7B-Instruct"].lora_parameters(64) == 64 * 28 * 90_112
    # Qwen3-VL-4B: q projects 2,560 to 32 x 128 = 4,096; k, v to 8 x 128 = 1,024
    per_layer = (2560 + 4096) + 2 * (2560 + 1024) + (4096 + 2560) + 3 * (2560 + 9728)
    assert shapes["Qwen3-VL-4B-Instruct"].lora_parameters(64) == 64 * 36 * per_layer


def test_gpu_memory_per_rank_3b_on_8_gpus(recipe):
    """docs/scaling.md's column: 16P / 8 of state, the bf16 embedding and two layers in
    flight, the measured no-gradient pass (23.4 GB at 10 x 1,280 tokens), vLLM 0.6 x 80 GB."""
    shape = plan.shipped_shapes()["Qwen2.5-VL-3B-Instruct"]
    got = plan.gpu_plan(recipe, shape, node(8))
    layer = 2048 * 2048 * 2 + 2048 * 256 * 2 + 3 * 2048 * 11008
    assert got.state == pytest.approx(16 * P3B / 8)
    assert got.gathered == 2 * (151_936 * 2048 + 2 * layer)  # tied: the embedding once
    assert (got.train_activations, got.nograd_activations) == (19.4e9, 23.4e9)
    assert got.vllm == pytest.approx(48e9)
    assert round(got.training_peak / 1e9, 1) == 31.8
    assert round(got.rollout_peak / 1e9, 1) == 55.5


def test_full_3b_on_one_gpu_does_not_fit_and_says_the_ways_out(recipe):
    """60.1 GB of training state beside vLLM's 48 GB: 108.1 GB, over an 80 GB GPU."""
    shape = plan.shipped_shapes()["Qwen2.5-VL-3B-Instruct"]
    finding = plan.fits_finding(recipe, shape, node(1))
    assert not finding.ok and finding.blocking
    assert finding.line.startswith(
        "fits: no: full fine-tuning of Qwen2.5-VL-3B-Instruct on 1 GPU(s) needs 108.1 GB per rank"
    )
    for way in ("LORA_RANK=64 (64.9 GB)", "N_GPUS=2", "micro_batch_size_per_gpu", "offload"):
        assert way in finding.line
    assert "\n" not in finding.line


def test_lora_3b_on_one_gpu_fits(recipe):
    """4P + 16L = 16.9 GB of state: 41.3 GB training, 64.9 GB with vLLM's share."""
    shape = plan.shipped_shapes()["Qwen2.5-VL-3B-Instruct"]
    got = plan.gpu_plan(recipe, shape, node(1), lora_rank=64)
    assert got.state == pytest.approx(4 * P3B + 16 * 64 * 36 * 51_968)
    assert round(got.peak / 1e9, 1) == 64.9
    lora = recipe.copy()
    lora.actor_rollout_ref.model.lora_rank = 64
    assert plan.fits_finding(lora, shape, node(1)).ok


def test_a_larger_gpu_or_offload_changes_the_verdict(recipe):
    shape = plan.shipped_shapes()["Qwen2.5-VL-3B-Instruct"]
    assert not plan.fits_finding(recipe, shape, node(1, 141e9)).ok  # 0.6 x 141 + 60.1 > 141
    offloaded = plan._with_offload(recipe)
    assert plan.gpu_plan(offloaded, shape, node(1)).state == 0
    assert plan.fits_finding(offloaded, shape, node(1)).ok


@pytest.mark.parametrize(
    ("name", "reference", "startup", "reference_gb"),
    [
        ("Qwen2.5-VL-3B-Instruct", 4 * P3B, 8 * 4 * P3B, 15.0),  # tied: every rank's fp32 copy
        ("Qwen2.5-VL-7B-Instruct", 4 * P7B, 4 * P7B, 33.2),  # untied: rank 0's alone
        ("Qwen3-VL-4B-Instruct", 4 * P4B, 8 * 4 * P4B, 17.8),
    ],
)
def test_host_memory_per_node(recipe, name, reference, startup, reference_gb):
    """One node of 8: the fp32 reference (15.0 / 33.2 / 17.8 GB), the start-up copies, 8
    engine cores' 4 GiB multimodal caches, and the step's image tensors twice."""
    shape = plan.shipped_shapes()[name]
    got = plan.host_plan(recipe, shape, node(8), step_image_bytes=18.8e9)
    assert got.reference == pytest.approx(reference)
    assert got.startup == pytest.approx(startup)
    assert got.mm_cache == 8 * 4 * 1024**3
    assert (got.images_step, got.images_fetch, got.vllm_sleep) == (18.8e9, 18.8e9, 0.0)
    assert round(got.reference / 1e9, 1) == reference_gb


def test_lora_has_no_reference_model_but_vllm_keeps_its_weights_on_the_host(recipe):
    """LoRA: the reference is the actor with its adapter off; vLLM sleeps at level 1 (verl's
    `_resolve_sleep_level` for adapters), its bf16 weights in host memory."""
    shape = plan.shipped_shapes()["Qwen2.5-VL-3B-Instruct"]
    got = plan.host_plan(recipe, shape, node(8), lora_rank=64)
    assert got.reference == 0
    assert got.vllm_sleep == pytest.approx(8 * 2 * P3B)


def test_disk_with_and_without_lora():
    """docs/lora.md: 45.1 GB full (12P), 16.5 GB at rank 64 (4P + 12L)."""
    assert round(checkpoint_bytes(P3B) / 1e9, 1) == 45.1
    assert round(checkpoint_bytes(P3B, 64 * 36 * 51_968) / 1e9, 1) == 16.5
    assert round(checkpoint_bytes(P7B, 64 * 28 * 90_112) / 1e9, 1) == 35.1


def test_the_time_estimate_names_its_source(recipe):
    """512 x 5 rows of 1,024 + 256 tokens over 8 GPUs at EasyR1's 1,800 tokens/s/GPU."""
    shapes = plan.shipped_shapes()
    tokens, text = plan.tokens_per_step(recipe)
    assert tokens == 2560 * 1280 and "data.max_prompt_length" in text
    seconds, label = plan.step_seconds(shapes["Qwen2.5-VL-3B-Instruct"], 8, tokens)
    assert seconds == pytest.approx(2560 * 1280 / (1800 * 8))
    assert "EasyR1 v0.3.2 assets/baselines.md" in label and "1,800 tokens/s/GPU" in label
    seconds, label = plan.step_seconds(shapes["Qwen3-VL-4B-Instruct"], 8, tokens)
    assert "no published figure for Qwen3-VL-4B-Instruct" in label
    assert plan.time_line(seconds, 161, label, text).startswith("time: estimate 228 s/step")


def test_the_docs_planning_table_is_the_generators(repo_root):
    """docs/scaling.md's planning table equals `python -m entropyrl.commands.plan_table`'s."""
    text = (repo_root / "docs" / "scaling.md").read_text()
    found = re.search(r"<!-- planning table -->\n(.*?)\n<!-- end -->", text, re.S)
    assert found, "docs/scaling.md has no planning table between its markers"
    from entropyrl.commands.preflight import compose_recipe

    config = compose_recipe("chair_mscoco", ["trainer.n_gpus_per_node=8"])
    assert found.group(1).strip() == plan.planning_table(config).strip()


def test_the_time_takes_the_manifests_longest_prompt(tmp_path):
    """With the data and the model's processor here, the step's tokens take the longest prompt
    the preflight proves from the manifest, not data.max_prompt_length; a folder whose
    config.json lacks the sizes plans with the shipped numbers of its name."""
    from entropyrl.commands.preflight import compose_recipe
    from entropyrl.data.coco import prepare_coco
    from entropyrl.rig.synthetic import build_synthetic_coco
    from entropyrl.rig.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer
    from entropyrl.verl.checks import layout

    world = build_synthetic_coco(tmp_path / "world", num_train=6, num_test=2, image_size=112)
    data = tmp_path / "data"
    prepare_coco(world.root, world.root, data, val_size=1, test_size=1)
    model = tmp_path / "Qwen2.5-VL-3B-Instruct"
    tokenizer = build_qwen_tokenizer(num_ranks=1024)
    processor = build_qwen2vl_processor(tokenizer, image_size=112)
    processor.image_processor.save_pretrained(model)
    tokenizer.save_pretrained(model)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    config = compose_recipe(
        "chair_mscoco",
        [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'val.parquet'}",
            f"actor_rollout_ref.model.path={model}",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.n_gpus_per_node=8",
        ],
    )
    (proved,) = [line for _, line in layout.prompt_findings_raw(config) if "prompts:" in line]
    longest = int(re.match(r"prompts: at most (\d+) tokens", proved).group(1))
    lines = layout.budget_lines(config, "chair_mscoco", "gpu")
    time = next(line for line in lines if line.startswith("time: estimate"))
    assert f"10 rows x ({longest} prompt tokens, the manifest's longest prompt, + 256" in time
    assert any(line.startswith("GPU memory per rank:") for line in lines)
