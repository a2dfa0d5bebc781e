"""CIDEr-D: parity with pycocoevalcap 1.2, corpus df, persistence, normalisation."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pycocoevalcap.cider.cider import Cider

from entropyrl.rewards.cider import CiderD, normalize_caption


def coco_scores(gts: dict, res: dict) -> np.ndarray:
    """pycocoevalcap's per-image scores, in the order of gts' keys."""
    _, scores = Cider().compute_score(gts, res)
    return np.asarray(scores, dtype=np.float64)


def ours(gts: dict, res: dict) -> np.ndarray:
    cider = CiderD.from_references(gts)
    keys = list(gts)
    return cider.score_batch([res[k][0] for k in keys], [gts[k] for k in keys])


def random_corpus(rng: random.Random, images: int, vocab: int, max_len: int):
    words = [f"w{i}" for i in range(vocab)]

    def sentence(min_len: int = 1) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(min_len, max_len)))

    gts = {i: [sentence() for _ in range(rng.randint(1, 5))] for i in range(images)}
    res = {i: [sentence(0)] for i in range(images)}
    return gts, res


@pytest.mark.parametrize("seed", range(6))
def test_parity_random_corpora(seed):
    rng = random.Random(seed)
    gts, res = random_corpus(rng, images=rng.randint(2, 40), vocab=rng.randint(3, 40), max_len=14)
    np.testing.assert_allclose(ours(gts, res), coco_scores(gts, res), rtol=0, atol=1e-9)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    refs=st.lists(
        st.lists(
            st.lists(st.sampled_from(["a", "b", "c", "dog", "cat"]), min_size=1, max_size=9),
            min_size=1,
            max_size=4,
        ),
        min_size=2,
        max_size=6,
    ),
    cands=st.lists(st.lists(st.sampled_from(["a", "b", "c", "dog", "x"]), max_size=9), min_size=6),
)
def test_parity_property(refs, cands):
    gts = {i: [" ".join(r) for r in image] for i, image in enumerate(refs)}
    res = {i: [" ".join(cands[i])] for i in gts}
    np.testing.assert_allclose(ours(gts, res), coco_scores(gts, res), rtol=0, atol=1e-9)


def test_parity_edge_cases():
    gts = {
        0: ["dog", "cat", "a dog"],  # one-word references
        1: ["a a a a a a", "a a b a a"],  # repeated n-grams
        2: ["a man riding a horse on a beach", "a person on a horse"],
        3: ["two birds on a wire", "birds sit on a wire"],
        4: ["a red bus", "the red bus on the street"],
    }
    res = {
        0: ["dog"],  # one-word candidate
        1: ["a a a a a a a a"],  # repeated n-grams, longer than every reference
        2: [""],  # empty candidate
        3: ["two birds on a wire"],  # identical to a reference
        4: ["bus"],
    }
    expected = coco_scores(gts, res)
    got = ours(gts, res)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    assert got[2] == 0.0
    assert got[3] > got[4] > 0.0


def test_per_batch_zero_phenomenon():
    """pycocoevalcap per GRPO group gives 0 to every rollout; corpus df does not."""
    corpus = {
        1: ["a dog runs on the grass", "a brown dog running in a field"],
        2: ["a cat sleeps on a sofa", "a cat lying on a couch"],
        3: ["a man rides a bike", "a person riding a bicycle down the street"],
        4: ["two dogs play in the snow", "dogs playing in snow"],
    }
    rollouts = ["a dog running on grass", "a cat on the grass", "a dog", "a brown dog in a field"]
    refs = corpus[1]
    group_gts = {k: refs for k in range(len(rollouts))}
    group_res = {k: [c] for k, c in enumerate(rollouts)}
    assert np.all(coco_scores(group_gts, group_res) == 0.0)
    single = coco_scores({0: refs}, {0: [rollouts[0]]})
    assert single[0] == 0.0
    scores = CiderD.from_references(corpus).score_batch(rollouts, [refs] * len(rollouts))
    assert np.all(scores > 0) and len(set(scores.round(12))) == len(rollouts)
    assert scores.argmax() in (0, 3)


def test_normalisation_applies_to_candidates_and_references():
    corpus = {1: ["A Dog, running!", "the dog's ball."], 2: ["A cat."]}
    cider = CiderD.from_references(corpus)
    normal = CiderD.from_references(
        {k: [normalize_caption(c) for c in v] for k, v in corpus.items()}
    )
    assert cider.score("A DOG running...", corpus[1]) == pytest.approx(
        normal.score("a dog running", [normalize_caption(c) for c in corpus[1]]), abs=1e-12
    )
    assert normalize_caption("  Two  dogs -- playing; ") == "two dogs playing"
    assert normalize_caption("The dog's T-shirt") == "the dog 's t-shirt"
    assert normalize_caption(normalize_caption("The dog's T-shirt")) == "the dog 's t-shirt"


@pytest.mark.parametrize("name", ["df.json", "df.json.gz"])
def test_save_load_round_trip(tmp_path, name):
    rng = random.Random(3)
    gts, res = random_corpus(rng, images=15, vocab=12, max_len=10)
    cider = CiderD.from_references(gts, sigma=5.0)
    path = tmp_path / "sub" / name
    cider.save(path)
    loaded = CiderD.load(path)
    assert (loaded.n, loaded.sigma, loaded.num_images) == (4, 5.0, 15)
    cands, refs = [res[k][0] for k in gts], [gts[k] for k in gts]
    np.testing.assert_array_equal(loaded.score_batch(cands, refs), cider.score_batch(cands, refs))
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert CiderD.load(path, sigma=6.0).sigma == 6.0


def test_load_rejects_bad_files(tmp_path):
    path = tmp_path / "df.json"
    with pytest.raises(FileNotFoundError, match=r"df\.json"):
        CiderD.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON"):
        CiderD.load(path)
    CiderD.from_references({1: ["a b"]}).save(path)
    payload = json.loads(path.read_text())
    payload["version"] = 99
    path.write_bytes(gzip.compress(json.dumps(payload).encode()))
    with pytest.raises(ValueError, match="'version'"):
        CiderD.load(path)
    payload.update(version=1, format="other")
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="'format'"):
        CiderD.load(path)


def test_reference_cache_is_transparent():
    rng = random.Random(5)
    gts, res = random_corpus(rng, images=10, vocab=10, max_len=8)
    big = CiderD.from_references(gts)
    tiny = CiderD.from_references(gts, cache_size=1)
    cands = [res[k][0] for k in gts] * 3
    refs = [gts[k] for k in gts] * 3
    np.testing.assert_array_equal(big.score_batch(cands, refs), tiny.score_batch(cands, refs))
    assert len(tiny._cache) == 1 and len(big._cache) == len({tuple(r) for r in refs})
    assert big.score(cands[0], refs[0]) == big.score_batch(cands[:1], refs[:1])[0]


def test_bad_arguments():
    cider = CiderD.from_references({1: ["a dog"], 2: ["a cat"]})
    with pytest.raises(ValueError, match="differ in length"):
        cider.score_batch(["a"], [])
    with pytest.raises(TypeError, match="not one str"):
        cider.score("a dog", "a dog")
    with pytest.raises(ValueError, match="at least one reference"):
        cider.score("a dog", [])
    with pytest.raises(ValueError, match="image 3"):
        CiderD.from_references({3: []})
    with pytest.raises(ValueError, match="empty"):
        CiderD.from_references({})


def test_package_exports():
    import entropyrl.rewards as rewards

    assert rewards.CiderD is CiderD and rewards.normalize_caption is normalize_caption
    with pytest.raises(AttributeError, match="nope"):
        rewards.nope  # noqa: B018


def plain_cider_d(candidate: str, refs: list[str], df: dict, num_images: int, n=4, sigma=6.0):
    """CIDEr-D written out directly from the paper's formulas, with a given df table."""
    import math

    def vector(text):
        words = text.split()
        vec = [{} for _ in range(n)]
        for k in range(1, n + 1):
            for i in range(len(words) - k + 1):
                gram = tuple(words[i : i + k])
                vec[k - 1][gram] = vec[k - 1].get(gram, 0) + 1
        ref_len = math.log(num_images)
        weights = [
            {g: tf * (ref_len - math.log(max(1.0, df.get(g, 0)))) for g, tf in order.items()}
            for order in vec
        ]
        norms = [math.sqrt(sum(w * w for w in order.values())) for order in weights]
        length = max(len(words) - 1, 0) if n >= 2 else 0
        return weights, norms, length

    cw, cn, cl = vector(candidate)
    total = 0.0
    for ref in refs:
        rw, rn, rl = vector(ref)
        penalty = math.exp(-((cl - rl) ** 2) / (2 * sigma**2))
        for k in range(n):
            val = sum(min(w, rw[k].get(g, 0.0)) * rw[k].get(g, 0.0) for g, w in cw[k].items())
            if cn[k] and rn[k]:
                val /= cn[k] * rn[k]
            total += val * penalty
    return total / n / len(refs) * 10.0


@pytest.mark.parametrize("n", [1, 2, 4])
def test_grpo_batches_match_a_plain_implementation(n):
    """Corpus df, repeated reference tuples, unseen words and references outside the corpus."""
    rng = random.Random(20 + n)
    corpus, _ = random_corpus(rng, images=30, vocab=15, max_len=10)
    cider = CiderD.from_references(corpus, n=n)
    df = {}
    for refs in corpus.values():
        for gram in {
            tuple(r.split()[i : i + k])
            for r in refs
            for k in range(1, n + 1)
            for i in range(len(r.split()) - k + 1)
        }:
            df[gram] = df.get(gram, 0) + 1
    held_out = ["w1 w2 unseen w3", "unseen words only"]
    cands, refs_list = [], []
    for image in [0, 3, 3, 7]:
        for _ in range(4):
            words = corpus[image][0].split()
            words[rng.randrange(len(words))] = rng.choice(["w0", "w5", "zzz"])
            cands.append(" ".join(words))
            refs_list.append(corpus[image])
    cands += ["w1 w2 unseen", ""]
    refs_list += [held_out, held_out]
    got = cider.score_batch(cands, refs_list)
    expected = [plain_cider_d(c, r, df, 30, n=n) for c, r in zip(cands, refs_list)]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    singles = [cider.score(c, r) for c, r in zip(cands, refs_list)]
    np.testing.assert_allclose(got, singles, rtol=0, atol=1e-12)
