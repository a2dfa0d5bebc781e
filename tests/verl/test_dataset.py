"""verl's `RLHFDataset` reads the parquet of `entropyrl prepare coco` and `prepare fc`.

Tokenizer and processor are the offline Qwen2 / Qwen2-VL ones built from `qwen-tokenizer`.
verl's multi-modal length filter imports `qwen_vl_utils`, which needs torchvision (absent on CPU
machines): there the multi-modal rows are checked with the filter off plus the processor call
the rollout makes, and the filter itself runs where torchvision exists.
"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from PIL import Image

from entropyrl.cli import main as entropyrl_main

TRAIN_IDS, VAL_IDS = (1, 2, 3), (11, 12, 13, 14)


@pytest.fixture(scope="module")
def tokenizer():
    module = pytest.importorskip("entropyrl.rig.tokenizer")
    return module.build_qwen_tokenizer(num_ranks=8192)


@pytest.fixture(scope="module")
def coco_parquet(tmp_path_factory):
    """A tiny COCO 2014 layout (captions files + images) converted by `entropyrl prepare coco`."""
    root = tmp_path_factory.mktemp("coco")
    (root / "annotations").mkdir()
    for split, ids in (("train2014", TRAIN_IDS), ("val2014", VAL_IDS)):
        (root / "images" / split).mkdir(parents=True)
        images, annotations = [], []
        for image_id in ids:
            name = f"COCO_{split}_{image_id:012d}.jpg"
            Image.new("RGB", (64, 64), (image_id * 20 % 255, 90, 40)).save(
                root / "images" / split / name
            )
            images.append({"id": image_id, "file_name": name, "height": 64, "width": 64})
            for k in range(3):
                annotations.append(
                    {
                        "image_id": image_id,
                        "id": image_id * 10 + k,
                        "caption": f"a dog on a sofa {k}",
                    }
                )
        (root / "annotations" / f"captions_{split}.json").write_text(
            json.dumps({"images": images, "annotations": annotations})
        )
    out = root / "out"
    code = entropyrl_main(
        [
            "prepare", "coco",
            "--annotations", str(root / "annotations"),
            "--images", str(root / "images"),
            "--out", str(out),
            "--val-size", "1",
            "--test-size", "1",
        ]
    )  # fmt: skip
    assert code in (0, None)
    return out


@pytest.fixture(scope="module")
def fc_parquet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fc")
    tools = [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"city": {"type": "str", "description": "city name"}},
        }
    ]
    rows = [
        {
            "id": i,
            "query": f"What is the weather in city number {i}?",
            "tools": json.dumps(tools),
            "answers": json.dumps([{"name": "get_weather", "arguments": {"city": f"c{i}"}}]),
        }
        for i in range(40)
    ]
    source = root / "xlam.json"
    source.write_text(json.dumps(rows))
    out = root / "out"
    code = entropyrl_main(
        [
            "prepare",
            "fc",
            "--format",
            "xlam",
            "--input",
            str(source),
            "--out",
            str(out),
            "--test-size",
            "4",
        ]
    )
    assert code in (0, None)
    return out


def data_config(compose, config_name: str, tmp_path, **changes):
    data = OmegaConf.to_container(compose(config_name), resolve=True)["data"]
    data.update(cache_dir=str(tmp_path / "cache"), **changes)
    return OmegaConf.create(data)


def test_rlhf_dataset_reads_fc_parquet(compose, tokenizer, fc_parquet, tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    config = data_config(compose, "egpo_function_calling", tmp_path)
    assert config.filter_overlong_prompts  # verl tokenizes every prompt to filter
    dataset = RLHFDataset(str(fc_parquet / "train.parquet"), tokenizer, config)
    assert len(dataset) == 36
    item = dataset[0]
    assert item["data_source"] == "function_calling"
    roles = [message["role"] for message in item["raw_prompt"]]
    assert roles == ["system", "user"]
    assert "get_weather" in item["raw_prompt"][0]["content"]
    ground_truth = json.loads(item["reward_model"]["ground_truth"])
    assert ground_truth[0]["name"] == "get_weather"
    batch = collate_fn([dataset[i] for i in range(4)])
    assert len(batch["raw_prompt"]) == 4
    test = RLHFDataset(str(fc_parquet / "test.parquet"), tokenizer, config)
    assert len(test) == 4


def test_rlhf_dataset_reads_coco_parquet_with_images(compose, tokenizer, coco_parquet, tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    module = pytest.importorskip("entropyrl.rig.tokenizer")
    processor = module.build_qwen2vl_processor(tokenizer, image_size=112)
    config = data_config(compose, "chair_mscoco", tmp_path, filter_overlong_prompts=False)
    dataset = RLHFDataset(
        str(coco_parquet / "train.parquet"), tokenizer, config, processor=processor
    )
    # 3 train2014 images: by default no val2014 image trains (CHAIR and POPE score val2014)
    assert len(dataset) == 3
    for i in range(len(dataset)):
        item = dataset[i]
        content = item["raw_prompt"][0]["content"]
        images = [part for part in content if part["type"] == "image"]
        texts = [part for part in content if part["type"] == "text"]
        assert len(images) == 1 and len(texts) == 1  # verl matched the <image> placeholder
        truth = json.loads(item["reward_model"]["ground_truth"])
        assert truth["image_id"] == item["extra_info"]["image_id"]
        assert len(truth["references"]) == 3
        # The rollout's processor call on this row: one square image -> 16 image tokens at 112 px.
        prompt = processor.apply_chat_template(
            item["raw_prompt"], add_generation_prompt=True, tokenize=False
        )
        pil = Image.open(images[0]["image"]).convert("RGB")
        inputs = processor(text=[prompt], images=[pil], return_tensors="pt")
        pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        assert int((inputs["input_ids"][0] == pad).sum()) == module.image_token_count(112)


def test_rlhf_dataset_multimodal_filter(
    compose, tokenizer, coco_parquet, tmp_path, qwen_vl_utils_module
):
    """verl's own RLHFDataset with its overlong-prompt filter on (what the GPU recipe runs),
    qwen_vl_utils loaded without torchvision (its image path does not use it)."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    module = pytest.importorskip("entropyrl.rig.tokenizer")
    processor = module.build_qwen2vl_processor(tokenizer, image_size=112)
    config = data_config(compose, "chair_mscoco", tmp_path)
    dataset = RLHFDataset(
        str(coco_parquet / "train.parquet"), tokenizer, config, processor=processor
    )
    assert len(dataset) == 3
