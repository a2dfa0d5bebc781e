"""`PillowRLHFDataset`: verl's dataset with qwen_vl_utils' image rules and no torchvision."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import pytest
from PIL import Image

from entropyrl.rig.dataset import PillowRLHFDataset, fetch_image, smart_resize


@pytest.mark.parametrize(
    ("size", "factor", "bounds", "expected"),
    [
        ((112, 112), 28, {}, (112, 112)),  # already a multiple: unchanged
        ((100, 130), 28, {}, (112, 140)),  # rounded to the nearest multiple
        ((10, 10), 28, {}, (56, 56)),  # below 4 tokens: scaled up to min_pixels
        ((13, 13), 28, {}, (56, 56)),
        ((2000, 3000), 28, {"max_pixels": 256 * 28 * 28}, (364, 532)),  # scaled down
        ((64, 64), 28, {"min_pixels": 112 * 112, "max_pixels": 112 * 112}, (112, 112)),
        ((60, 30), 28, {}, (84, 56)),  # 56x28 is below 4 tokens: scaled up
    ],
)
def test_smart_resize_hand_computed(size, factor, bounds, expected):
    assert smart_resize(*size, factor=factor, **bounds) == expected


def test_smart_resize_invariants():
    for height in range(20, 400, 37):
        for width in range(20, 400, 41):
            h, w = smart_resize(height, width, 28, min_pixels=4 * 784, max_pixels=64 * 784)
            assert h % 28 == 0 and w % 28 == 0
            assert 4 * 784 <= h * w <= 64 * 784


def test_smart_resize_refuses_bad_input():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 5000, 28)
    with pytest.raises(ValueError, match="max_pixels"):
        smart_resize(100, 100, 28, min_pixels=10, max_pixels=5)
    with pytest.raises(ValueError, match="positive"):
        smart_resize(0, 100, 28)


def test_fetch_image_sources(tmp_path):
    image = Image.new("RGBA", (90, 60), (10, 20, 30, 128))
    path = tmp_path / "a.png"
    image.save(path)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    for source in (str(path), f"file://{path}", data_url, buffer.getvalue(), image):
        out = fetch_image({"type": "image", "image": source})
        assert out.mode == "RGB" and out.size == (84, 56)
    out = fetch_image({"image": str(path), "resized_height": 200, "resized_width": 100})
    assert out.size == (112, 196)
    with pytest.raises(ValueError, match="no downloads"):
        fetch_image({"image": "https://example.com/a.png"})
    with pytest.raises(ValueError, match="needs 'image'"):
        fetch_image({"type": "image"})


def test_video_is_refused_with_a_clear_error():
    messages = [{"role": "user", "content": [{"type": "video", "video": "x.mp4"}]}]
    with pytest.raises(ValueError, match="images only"):
        PillowRLHFDataset._process_multi_modal_info(messages, 14, None)


def test_text_prompt_has_no_images():
    messages = [{"role": "user", "content": "hello"}]
    assert PillowRLHFDataset._process_multi_modal_info(messages, 14, None) == (None, None, None)


def test_reads_prepare_coco_parquet_like_the_agent_loop(compose, tmp_path):
    """The rows of `entropyrl prepare coco` through verl's dataset and the agent loop's call."""
    from entropyrl.data.coco import prepare_coco
    from entropyrl.rig.synthetic import build_synthetic_coco
    from entropyrl.rig.tokenizer import build_qwen2vl_processor, build_qwen_tokenizer

    world = build_synthetic_coco(tmp_path / "world", num_train=6, num_test=2, image_size=112)
    prepare_coco(world.root, world.root, tmp_path / "data", val_size=1, test_size=1)
    tokenizer = build_qwen_tokenizer(num_ranks=8192)
    processor = build_qwen2vl_processor(tokenizer, image_size=112)
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(compose("chair_mscoco"), resolve=True)["data"]
    data.update(cache_dir=str(tmp_path / "cache"), filter_overlong_prompts=True)
    dataset = PillowRLHFDataset(
        str(tmp_path / "data" / "train.parquet"),
        tokenizer,
        OmegaConf.create(data),
        processor=processor,
    )
    assert len(dataset) == 6  # the length filter ran with Pillow only and kept every row
    item = dataset[0]
    images, videos, audios = asyncio.run(
        PillowRLHFDataset.process_multi_modal_info(item["raw_prompt"], 14, None)
    )
    assert videos is None and audios is None
    assert len(images) == 1 and images[0].size == (112, 112)
    truth = json.loads(item["reward_model"]["ground_truth"])
    assert truth["image_id"] == item["extra_info"]["image_id"]


@pytest.fixture(scope="module")
def qwen_vl_utils_images(qwen_vl_utils_module):
    return qwen_vl_utils_module.process_vision_info


@pytest.mark.parametrize("size", [(112, 112), (640, 480), (57, 300), (10, 10), (1400, 90)])
@pytest.mark.parametrize("patch", [14, 16])
def test_pillow_images_equal_qwen_vl_utils_images(qwen_vl_utils_images, tmp_path, size, patch):
    """verl's GPU path (RLHFDataset -> qwen_vl_utils.process_vision_info) and the CPU smoke's
    (PillowRLHFDataset) give the same images, pixel for pixel, for Qwen2/2.5-VL (patch 14) and
    Qwen3-VL (patch 16) patch sizes, bounds from the message included."""
    import numpy as np

    path = tmp_path / "image.png"
    rng = np.random.default_rng(sum(size) + patch)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    for extra in ({}, {"min_pixels": 64 * 32 * 32, "max_pixels": 128 * 32 * 32}):
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": str(path), **extra},
                    {"type": "text", "text": "Describe."},
                ],
            }
        ]
        theirs, _ = qwen_vl_utils_images(messages, image_patch_size=patch)
        ours, videos, _ = PillowRLHFDataset._process_multi_modal_info(messages, patch, None)
        assert videos is None and len(ours) == len(theirs) == 1
        assert ours[0].size == theirs[0].size
        assert np.array_equal(np.asarray(ours[0]), np.asarray(theirs[0]))
