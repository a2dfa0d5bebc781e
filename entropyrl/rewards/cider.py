"""CIDEr-D with document frequencies fixed once over a reference corpus.

pycocoevalcap's ``Cider`` recomputes document frequencies (df) and ``ref_len = log(#images)`` over
the images of each call, so a reward called per image or per GRPO group is always 0 and a mixed
batch's scores depend on the rest of the batch. Self-critical sequence training (Rennie et al.
2017, https://arxiv.org/abs/1612.00563) computes them once over the training references; this
module does the same and otherwise follows pycocoevalcap 1.2 formula for formula (Vedantam et
al. 2015, https://arxiv.org/abs/1411.5726), so that with df built from exactly the references of
a pycocoevalcap call the per-image scores agree to floating-point rounding.

Kept pycocoevalcap quirks (for parity): the length compared by the Gaussian penalty is the number
of bigrams (words - 1, and 0 when ``n == 1``); the clipped similarity is not divided by the norms
when either norm is 0; the score is mean over n-gram orders, mean over references, times 10.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import mul
from pathlib import Path

import numpy as np

from entropyrl.rewards.text import normalize_caption

__all__ = ["DF_FORMAT", "DF_VERSION", "CiderD", "normalize_caption"]

DF_FORMAT = "entropyrl.cider_df"
DF_VERSION = 1

# An n-gram is a tuple of words: zip() builds them in C, far cheaper than joining strings.
Gram = tuple[str, ...]
# (per-order n-gram -> weight dicts, per-order L2 norms, bigram count used as "length")
_Vector = tuple[list[dict[Gram, float]], list[float], int]


@dataclass(frozen=True)
class _References:
    """One image's references, indexed for scoring.

    ``index[k][gram]`` lists ``(ref, weight, weight / norm)`` for every reference holding the
    (k+1)-gram, so one look-up per candidate n-gram serves all references (most n-grams miss),
    and the reference norm is divided out once here instead of once per candidate.
    """

    index: list[dict[Gram, list[tuple[int, float, float]]]]
    lengths: list[int]


def _ngram_counts(caption: str, n: int) -> list[dict[Gram, int]]:
    """Per order k = 1..n, the counts of the caption's k-grams (tuples of k words)."""
    words = caption.split()
    counts: list[dict[Gram, int]] = []
    for k in range(1, n + 1):
        slices = [words[i:] for i in range(k)]
        # n-grams are nearly always distinct: dict.fromkeys is the cheap path, Counter the exact one
        order = dict.fromkeys(zip(*slices), 1)
        counts.append(order if len(order) == max(len(words) - k + 1, 0) else Counter(zip(*slices)))
    return counts


def _int_counts(order: Mapping[str | Gram, float], k: int) -> dict[Gram, int]:
    """df table of order k+1 keyed by word tuples (space-joined strings are split)."""
    table: dict[Gram, int] = {}
    intern = sys.intern  # one str object per distinct word across all tables
    for gram, count in order.items():
        words = tuple(map(intern, gram.split() if isinstance(gram, str) else gram))
        if len(words) != k + 1 or int(count) != count or count < 1:
            raise ValueError(
                f"document_frequency[{k}]: {gram!r} -> {count!r} is not a {k + 1}-gram count >= 1"
            )
        table[words] = int(count)
    return table


class CiderD:
    """CIDEr-D scorer whose df and ``ref_len`` come from a fixed reference corpus.

    Build it with :meth:`from_references` (the training split's captions) or :meth:`load`; call
    :meth:`score` / :meth:`score_batch`. Each distinct tuple of references has its vectors
    computed once and kept in an LRU cache of ``cache_size`` entries (about 60 KiB each for
    five COCO-length references: the default 2048 holds several reward batches in ~120 MB).
    """

    def __init__(
        self,
        document_frequency: Sequence[Mapping[str | Gram, float]],
        num_images: int,
        *,
        sigma: float = 6.0,
        cache_size: int = 2048,
    ) -> None:
        if len(document_frequency) < 1:
            raise ValueError("document_frequency must hold one table per n-gram order (n >= 1)")
        if int(num_images) < 1:
            raise ValueError(f"num_images must be >= 1, got {num_images}")
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        self.n = len(document_frequency)
        self.sigma = float(sigma)
        self.num_images = int(num_images)
        self.ref_len = math.log(float(self.num_images))
        self._df: list[dict[Gram, int]] = [
            _int_counts(order, k) for k, order in enumerate(document_frequency)
        ]
        if any(count > self.num_images for order in self._df for count in order.values()):
            raise ValueError("a document frequency exceeds num_images")
        # idf = ref_len - log(max(1, df)) for every possible df: scoring does look-ups, not logs
        self._idf = [self.ref_len] + [
            self.ref_len - math.log(float(count)) for count in range(1, self.num_images + 1)
        ]
        self._penalty_scale = 2.0 * self.sigma**2
        self._cache: OrderedDict[tuple[str, ...], _References] = OrderedDict()
        self.cache_size = int(cache_size)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_references(
        cls,
        refs: Mapping[Hashable, Sequence[str]],
        *,
        n: int = 4,
        sigma: float = 6.0,
        cache_size: int = 2048,
    ) -> CiderD:
        """df(g) = number of images whose pooled (normalised) references contain n-gram g."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        df: list[dict[Gram, int]] = [{} for _ in range(n)]
        for image_id, captions in refs.items():
            if isinstance(captions, str) or len(captions) == 0:
                raise ValueError(
                    f"references of image {image_id!r} must be a non-empty list of str"
                )
            seen: list[set[Gram]] = [set() for _ in range(n)]
            for caption in captions:
                for k, order in enumerate(_ngram_counts(normalize_caption(caption), n)):
                    seen[k].update(order)
            for k in range(n):
                table = df[k]
                for gram in seen[k]:
                    table[gram] = table.get(gram, 0) + 1
        if not refs:
            raise ValueError("refs is empty: df needs at least one image")
        return cls(df, len(refs), sigma=sigma, cache_size=cache_size)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write df as versioned JSON (gzip when the name ends in ``.gz``), atomically."""
        path = Path(path)
        payload = {
            "format": DF_FORMAT,
            "version": DF_VERSION,
            "n": self.n,
            "sigma": self.sigma,
            "num_images": self.num_images,
            "document_frequency": [
                {" ".join(gram): count for gram, count in order.items()} for order in self._df
            ],
        }
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if path.suffix == ".gz":
            data = gzip.compress(data, compresslevel=6, mtime=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        sigma: float | None = None,
        cache_size: int = 2048,
    ) -> CiderD:
        """Read a file written by :meth:`save`; ``sigma`` overrides the stored one if given."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"CIDEr df file not found: {path}")
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        try:
            payload = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not a JSON CIDEr df file ({error})") from error
        if not isinstance(payload, dict) or payload.get("format") != DF_FORMAT:
            raise ValueError(f"{path}: field 'format' must be {DF_FORMAT!r}")
        if payload.get("version") != DF_VERSION:
            raise ValueError(
                f"{path}: field 'version' is {payload.get('version')!r}, "
                f"this entropyrl reads version {DF_VERSION}"
            )
        tables = payload.get("document_frequency")
        if not isinstance(tables, list) or len(tables) != payload.get("n"):
            raise ValueError(f"{path}: field 'document_frequency' must be a list of 'n' tables")
        if not isinstance(payload.get("num_images"), int):
            raise ValueError(f"{path}: field 'num_images' must be an int")
        return cls(
            tables,
            payload["num_images"],
            sigma=payload.get("sigma", 6.0) if sigma is None else sigma,
            cache_size=cache_size,
        )

    # ------------------------------------------------------------------ vectors
    def _vector(self, caption: str) -> _Vector:
        """tf-idf weights per order, their L2 norms, and pycocoevalcap's "length" (bigram count)."""
        idf = self._idf.__getitem__
        vecs: list[dict[Gram, float]] = []
        norms: list[float] = []
        counts_per_order = _ngram_counts(caption, self.n)
        for counts, df in zip(counts_per_order, self._df):
            # tf * (ref_len - log(max(1, df))), looked up for all n-grams of the order in C loops
            weights = list(map(mul, counts.values(), map(idf, map(df.get, counts, repeat(0)))))
            vecs.append(dict(zip(counts, weights)))
            norms.append(math.sqrt(sum(map(mul, weights, weights))))
        # pycocoevalcap counts bigram occurrences as the length (words - 1; 0 when n == 1).
        length = sum(counts_per_order[1].values()) if self.n >= 2 else 0
        return vecs, norms, length

    def _reference_vectors(self, refs: Sequence[str]) -> _References:
        key = tuple(refs)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        if len(key) == 0:
            raise ValueError("refs must hold at least one reference caption")
        index: list[dict[Gram, list[tuple[int, float, float]]]] = [{} for _ in range(self.n)]
        lengths = []
        for r, ref in enumerate(key):
            vecs, norms, length = self._vector(normalize_caption(ref))
            for k, vec in enumerate(vecs):
                table, norm = index[k], norms[k]
                for gram, weight in vec.items():
                    # a zero norm means all-zero weights: pycocoevalcap skips the division
                    table.setdefault(gram, []).append((r, weight, weight / norm if norm else 0.0))
            lengths.append(length)
        entry = _References(index, lengths)
        self._cache[key] = entry
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return entry

    def _similarity(self, cand: _Vector, refs: _References) -> float:
        """sum_k sum_r pen_r * sum_g min(w_c, w_r) w_r / (|c_k| |r_k|), / n / #refs * 10."""
        cand_vecs, cand_norms, cand_len = cand
        scale = self._penalty_scale
        penalties = [math.exp(-(float(cand_len - length) ** 2) / scale) for length in refs.lengths]
        total = 0.0
        for k in range(self.n):
            cand_norm = cand_norms[k]
            if cand_norm == 0:
                continue  # all candidate weights are 0, so is every similarity
            index = refs.index[k]
            order_sum = 0.0
            for gram, weight in cand_vecs[k].items():
                hits = index.get(gram)
                if hits is not None:
                    for r, ref_weight, scaled in hits:
                        clipped = weight if weight < ref_weight else ref_weight
                        order_sum += clipped * scaled * penalties[r]
            total += order_sum / cand_norm
        return total / self.n / len(refs.lengths) * 10.0

    # ------------------------------------------------------------------ scoring
    def score(self, candidate: str, refs: Sequence[str]) -> float:
        """CIDEr-D of one candidate against its image's references (x10 scale, as COCO)."""
        if isinstance(refs, str):
            raise TypeError("refs must be a sequence of reference captions, not one str")
        ref_vectors = self._reference_vectors(refs)
        return self._similarity(self._vector(normalize_caption(candidate)), ref_vectors)

    def score_batch(
        self, candidates: Sequence[str], refs_list: Sequence[Sequence[str]]
    ) -> np.ndarray:
        """Scores ``[B]`` (float64) of ``candidates[i]`` against ``refs_list[i]``."""
        if len(candidates) != len(refs_list):
            raise ValueError(
                f"candidates ({len(candidates)}) and refs_list ({len(refs_list)}) differ in length"
            )
        out = np.empty(len(candidates), dtype=np.float64)
        cand_cache: dict[str, _Vector] = {}
        for i, (candidate, refs) in enumerate(zip(candidates, refs_list)):
            if isinstance(refs, str):
                raise TypeError(f"refs_list[{i}] must be a sequence of captions, not one str")
            vector = cand_cache.get(candidate)
            if vector is None:
                vector = cand_cache[candidate] = self._vector(normalize_caption(candidate))
            out[i] = self._similarity(vector, self._reference_vectors(refs))
        return out

    def clear_cache(self) -> None:
        """Forget every cached reference vector (they are rebuilt on demand)."""
        self._cache.clear()

    def __repr__(self) -> str:
        sizes = ", ".join(str(len(order)) for order in self._df)
        return f"CiderD(n={self.n}, sigma={self.sigma}, num_images={self.num_images}, df=[{sizes}])"
