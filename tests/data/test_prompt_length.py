"""`entropyrl.data.prompt_length` against verl's own count: verl's dataset, with its
`filter_overlong_prompts`, keeps a caption row at `max_prompt_length` = our count and drops it at
one token less, for images of several sizes and shapes, on processors of both architectures (the
tiny models' and Qwen2.5-VL's real pixel limits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from PIL import Image

from entropyrl.core.files import write_parquet
from entropyrl.data.prompt_length import (
    VisionGrid,
    chat_messages,
    image_tokens,
    longest_prompt,
    prompt_tokens,
)

PROMPT = [{"role": "user", "content": "<image>Describe this image in one sentence."}]
SIZES = [(640, 480), (97, 33), (1000, 250)]  # COCO's usual, under the minimum, wide


def processor_folder(folder: Path, arch: str, real_limits: bool) -> Path:
    from entropyrl.rig.smoke.assets import IMAGE_PROCESSORS
    from entropyrl.rig.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

    tokenizer = build_qwen_tokenizer(num_ranks=1024)
    settings = IMAGE_PROCESSORS.get(arch, {})
    side = 32 * 4 if arch == "qwen3_vl" else 28 * 4
    processor = build_qwen2vl_processor(tokenizer, image_size=side, **settings)
    if real_limits:  # Qwen2.5-VL's own: 4 .. 16384 merged patches of 28 px
        factor = settings.get("patch_size", 14) * 2
        processor.image_processor.size = {
            "shortest_edge": 4 * factor**2,
            "longest_edge": 16384 * factor**2,
        }
    # as the smoke's model folders hold it; config.json names the processor class
    processor.image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": arch}))
    return folder


@pytest.fixture(
    scope="module",
    params=[("qwen2_5_vl", False), ("qwen3_vl", False), ("qwen2_5_vl", True)],
    ids=["qwen2_5_vl-tiny", "qwen3_vl-tiny", "qwen2_5_vl-real-limits"],
)
def model_dir(request, tmp_path_factory) -> Path:
    arch, real = request.param
    return processor_folder(tmp_path_factory.mktemp(f"{arch}-{real}"), arch, real)


@pytest.fixture(scope="module")
def verl_dataset(model_dir, tmp_path_factory):
    """verl's dataset (our Pillow subclass of it) over one caption row per size, unfiltered;
    `keeps(row, limit)` runs verl's own `filter_overlong_prompts` on that row at that limit."""
    from entropyrl.rig.cpu import backend as cpu_backend

    cpu_backend.install()  # the processor without torchvision, as in a smoke run

    from verl.utils import hf_tokenizer
    from verl.workers.config.model import hf_processor

    from entropyrl.rig.dataset import PillowRLHFDataset

    folder = tmp_path_factory.mktemp("rows")
    rows = []
    for width, height in SIZES:
        image = folder / f"{width}x{height}.png"
        Image.new("RGB", (width, height), (120, 30, 200)).save(image)
        rows.append({"data_source": "coco_caption", "prompt": PROMPT, "images": [str(image)]})
    write_parquet(rows, folder / "rows.parquet")
    config = OmegaConf.create(
        {
            "max_prompt_length": 100_000,
            "filter_overlong_prompts": False,
            "filter_overlong_prompts_workers": 1,
            "truncation": "error",
            "cache_dir": str(folder / "cache"),
        }
    )
    dataset = PillowRLHFDataset(
        [str(folder / "rows.parquet")],
        hf_tokenizer(str(model_dir)),
        config,
        processor=hf_processor(str(model_dir)),
    )
    assert dataset.processor is not None  # else verl would count the text alone
    dataset.filter_overlong_prompts = True
    rows = dataset.dataframe

    def keeps(row: int, limit: int) -> bool:
        dataset.max_prompt_length = limit
        return len(dataset.maybe_filter_out_long_prompts(rows.select([row]))) == 1

    return keeps


@pytest.mark.parametrize("row", range(len(SIZES)), ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_count_is_verls(model_dir, verl_dataset, row):
    ours = prompt_tokens(model_dir, PROMPT, [SIZES[row]])
    assert verl_dataset(row, ours)
    assert not verl_dataset(row, ours - 1)


def test_the_longest_prompt_bounds_every_row(model_dir):
    prompts = [PROMPT, [{"role": "user", "content": "<image>Caption it."}]]
    longest, size = longest_prompt(model_dir, prompts, SIZES)
    rows = [prompt_tokens(model_dir, p, [s]) for p in prompts for s in SIZES]
    assert longest == max(rows)  # the longest text and the largest image share a row here
    assert size is not None and prompt_tokens(model_dir, PROMPT, [size]) == longest


def test_coco_images_at_qwen2_5_vls_limits():
    """COCO's largest images (640 px a side) at Qwen2.5-VL's limits: 391 tokens for 640 x 480,
    529 for 640 x 640 (23 x 23 merged patches of 28 px)."""
    grid = VisionGrid(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=12845056)
    assert image_tokens(640, 480, grid) == 23 * 17
    assert image_tokens(640, 640, grid) == 23 * 23


def test_the_messages_are_verls():
    assert chat_messages(PROMPT) == [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "Describe this image in one sentence."},
            ],
        }
    ]


# -- the launch's preflight proves the bound (verl's filter is off in the caption recipe) ---------


@pytest.fixture(scope="module")
def coco_data(tmp_path_factory) -> Path:
    """`entropyrl prepare coco` on a synthetic world of 112 px images."""
    from entropyrl.data.coco import prepare_coco
    from entropyrl.rig.synthetic import build_synthetic_coco

    root = tmp_path_factory.mktemp("coco")
    world = build_synthetic_coco(root / "world", num_train=6, num_test=2, image_size=112)
    prepare_coco(world.root, world.root, root / "data", val_size=1, test_size=1)
    return root / "data"


def recipe(model_dir: Path, data: Path, *overrides: str):
    from entropyrl.commands.preflight import compose_recipe

    return compose_recipe(
        "chair_mscoco",
        [
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'val.parquet'}",
            f"actor_rollout_ref.model.path={model_dir}",
            *overrides,
        ],
    )


def test_the_preflight_proves_the_recipes_prompts_fit(model_dir, coco_data):
    from entropyrl.verl.checks.layout import prompt_findings

    config = recipe(model_dir, coco_data)
    assert config.data.filter_overlong_prompts is False  # the recipe's
    (finding,) = prompt_findings(config)
    prompt = json.loads((coco_data / "manifest.json").read_text())["prompts"][0]
    longest = prompt_tokens(model_dir, prompt, [(112, 112)])
    assert finding.ok
    assert finding.line == (
        f"prompts: at most {longest} tokens (the largest image 112x112, 1 image sizes recorded) "
        "<= data.max_prompt_length=1024"
    )


def test_a_prompt_limit_below_the_longest_prompt_is_refused(model_dir, coco_data):
    from entropyrl.verl.checks.layout import prompt_findings

    prompt = json.loads((coco_data / "manifest.json").read_text())["prompts"][0]
    longest = prompt_tokens(model_dir, prompt, [(112, 112)])
    limit = f"data.max_prompt_length={longest - 1}"
    findings = prompt_findings(recipe(model_dir, coco_data, limit))
    (refusal,) = [f for f in findings if not f.ok]
    assert refusal.line.endswith(
        f"> data.max_prompt_length={longest - 1}: raise it to {longest} (and "
        "actor_rollout_ref.rollout.max_model_len with it), or set "
        "data.filter_overlong_prompts=true to drop the longer rows"
    )
    assert prompt_findings(recipe(model_dir, coco_data, f"data.max_prompt_length={longest}"))[-1].ok


def test_data_without_recorded_sizes_is_refused_unless_verl_filters(model_dir, coco_data, tmp_path):
    import shutil

    from entropyrl.verl.checks.layout import prompt_findings

    data = tmp_path / "data"
    shutil.copytree(coco_data, data)
    (data / "manifest.json").unlink()
    (refusal,) = prompt_findings(recipe(model_dir, data))
    assert not refusal.ok
    assert "records no image sizes to prove every prompt fits data.max_prompt_length" in (
        refusal.line
    )
    assert "set data.filter_overlong_prompts=true" in refusal.line
    assert prompt_findings(recipe(model_dir, data, "data.filter_overlong_prompts=true")) == []


def test_a_context_shorter_than_prompt_and_response_is_refused(model_dir, coco_data):
    from entropyrl.verl.checks.layout import prompt_findings

    config = recipe(model_dir, coco_data, "actor_rollout_ref.rollout.max_model_len=1024")
    (refusal,) = [f for f in prompt_findings(config) if not f.ok]
    assert refusal.line == (
        "actor_rollout_ref.rollout.max_model_len=1024 is shorter than a prompt and its response "
        "(data.max_prompt_length + data.max_response_length = 1280): set it to 1280"
    )
