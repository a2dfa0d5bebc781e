"""The image set of a CHAIR evaluation: a deterministic sample of held-out images, or a given
list, never with training images."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.data.io import InputFileError
from entropyrl.evaluation.protocol import (
    ProtocolError,
    check_held_out,
    read_split,
    sample_image_ids,
)


@settings(max_examples=50, deadline=None)
@given(st.sets(st.integers(1, 10**6), min_size=1, max_size=200), st.integers(0, 2**31))
def test_the_sample_depends_on_the_set_n_and_seed_only(pool, seed):
    n = max(1, len(pool) // 3)
    first = sample_image_ids(pool, n, seed)
    shuffled = list(pool)
    shuffled.reverse()
    assert sample_image_ids(shuffled, n, seed) == first  # the listing order does not matter
    assert first == sorted(first) and len(set(first)) == n and set(first) <= pool


def test_the_sample_is_pinned():
    # the same ids on every machine and Python: random.Random(seed).sample of the sorted pool
    assert sample_image_ids(range(100, 200), 5, seed=0) == [105, 133, 149, 153, 197]


def test_asking_for_more_images_than_held_out_is_refused():
    with pytest.raises(ProtocolError, match="only 3 held-out"):
        sample_image_ids([1, 2, 3], 4)


def test_a_list_with_training_images_is_refused_in_one_line():
    with pytest.raises(ProtocolError) as error:
        check_held_out([1, 2, 3, 4], available={1: 0, 2: 0, 3: 0, 4: 0}, training={3, 4, 9})
    message = str(error.value)
    assert "\n" not in message and "2 of the 4" in message and "[3, 4]" in message
    assert "restval" in message


def test_a_list_with_unprepared_images_is_refused():
    with pytest.raises(ProtocolError, match="not in the prepared held-out split"):
        check_held_out([1, 5], available={1: 0}, training=set())
    check_held_out([1], available={1: 0}, training={2})  # held out: fine


def test_read_split_reads_prepared_rows(tmp_path):
    from entropyrl.data.coco import prepare_coco
    from entropyrl.rig.synthetic import build_synthetic_coco

    world = build_synthetic_coco(tmp_path / "world", num_train=6, num_test=6, image_size=56)
    prepare_coco(world.root, world.root, tmp_path / "data", val_size=2, test_size=4)
    split = read_split(tmp_path / "data" / "test.parquet")
    assert len(split) == 4 and all(image_id > 1_000_000 for image_id in split)
    image = next(iter(split.values()))
    assert image.prompt == "Please describe this image in detail."
    assert image.references == tuple(world.references[image.image_id])
    assert image.source == "coco2014"
    train = read_split(tmp_path / "data" / "train.parquet")
    assert not set(train) & set(split)
    with pytest.raises(InputFileError, match="not found"):
        read_split(tmp_path / "data" / "missing.parquet")
    json.dumps([image.path])  # plain strings
