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

Speed: a batch is scored with array operations. Every n-gram becomes its 64-bit Python hash
(``hash(tuple_of_words)``, computed in C through ``map``), document frequencies are looked up by
binary search in a sorted hash table, and candidate/reference matches are found with one sorted
search per n-gram order for the whole batch. Two different n-grams with the same 64-bit hash would
be confused; at ~1e-19 per pair this never matters for caption vocabularies. Sums run in hash
order, and str hashes are salted per process (PYTHONHASHSEED), so two processes can differ in the
last bit (~1e-16) of a score; fix PYTHONHASHSEED for bitwise-identical runs.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from entropyrl.rewards.text import normalize_caption

__all__ = ["DF_FORMAT", "DF_VERSION", "CiderD", "normalize_caption"]

DF_FORMAT = "entropyrl.cider_df"
DF_VERSION = 1

# An n-gram is a tuple of words (hashable, built by zip in C).
Gram = tuple[str, ...]
# Odd 64-bit constant (golden ratio): mixes an image slot into an n-gram hash, see _slot_keys.
_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class _Weights:
    """tf-idf vectors of several captions, one sparse row per caption.

    For order k: ``rows[k]``, ``keys[k]`` (n-gram hash) and ``weights[k]`` list the distinct
    n-grams of every caption; ``norms`` is ``[captions, n]`` and ``lengths`` ``[captions]`` (the
    bigram count pycocoevalcap compares in its length penalty).
    """

    rows: list[np.ndarray]
    keys: list[np.ndarray]
    weights: list[np.ndarray]
    norms: np.ndarray
    lengths: np.ndarray


@dataclass(frozen=True)
class _References:
    """One image's references, cached: per order the n-gram hashes, reference index, weight and
    weight / reference norm (the norm divided out once here instead of once per candidate)."""

    keys: list[np.ndarray]
    ref: list[np.ndarray]
    weights: list[np.ndarray]
    scaled: list[np.ndarray]
    lengths: np.ndarray


def _ngrams(words: list[str], k: int) -> Iterable[Gram]:
    return zip(*[words[i:] for i in range(k)])


def _int_counts(order: Mapping[str | Gram, float], k: int) -> dict[Gram, int]:
    """df table of order k+1 keyed by word tuples (space-joined strings are split)."""
    grams = list(order)
    if not all(type(gram) is tuple for gram in grams):
        intern = sys.intern  # one str object per distinct word across all tables
        grams = [
            tuple(map(intern, gram.split())) if isinstance(gram, str) else tuple(gram)
            for gram in grams
        ]
    counts = np.asarray(list(order.values()), dtype=np.float64)
    bad_length = grams and set(map(len, grams)) != {k + 1}
    if bad_length or bool(np.any((counts < 1) | (counts != np.floor(counts)))):
        raise ValueError(f"document_frequency[{k}] must map {k + 1}-grams to counts >= 1")
    return dict(zip(grams, counts.astype(np.int64).tolist()))


def _runs(sorted_values: np.ndarray, *more: np.ndarray) -> np.ndarray:
    """Start indices of the runs of equal (value, *more) tuples in lexicographically sorted arrays."""
    change = np.ones(len(sorted_values), dtype=bool)
    if len(sorted_values):
        diff = sorted_values[1:] != sorted_values[:-1]
        for other in more:
            diff |= other[1:] != other[:-1]
        change[1:] = diff
    return np.flatnonzero(change)


def _slot_keys(keys: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """One uint64 per (image slot, n-gram hash): xor with a slot-specific odd multiple keeps
    n-grams of one slot distinct and makes cross-slot coincidences ~2^-64."""
    return keys.view(np.uint64) ^ ((slots.astype(np.uint64) + np.uint64(1)) * _MIX)


class CiderD:
    """CIDEr-D scorer whose df and ``ref_len`` come from a fixed reference corpus.

    Build it with :meth:`from_references` (the training split's captions) or :meth:`load`; call
    :meth:`score` / :meth:`score_batch`. Each distinct tuple of references has its vectors
    computed once and kept in an LRU cache of ``cache_size`` entries (~9 KiB each for five
    COCO-length references: the default 8192 entries stay under ~80 MB).
    """

    def __init__(
        self,
        document_frequency: Sequence[Mapping[str | Gram, float]],
        num_images: int,
        *,
        sigma: float = 6.0,
        cache_size: int = 8192,
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
        # idf = ref_len - log(max(1, df)) for every possible df: scoring does look-ups, not logs
        self._idf = np.array(
            [self.ref_len]
            + [self.ref_len - math.log(float(count)) for count in range(1, self.num_images + 1)]
        )
        self._df_keys: list[np.ndarray] = []
        self._df_counts: list[np.ndarray] = []
        for order in self._df:
            keys = np.fromiter(map(hash, order), dtype=np.int64, count=len(order))
            counts = np.fromiter(order.values(), dtype=np.int64, count=len(order))
            sort = np.argsort(keys, kind="stable")
            keys, counts = keys[sort], counts[sort]
            if len(keys) > 1 and bool(np.any(keys[1:] == keys[:-1])):
                raise ValueError(
                    "two n-grams share a 64-bit hash; rebuild with another PYTHONHASHSEED"
                )
            if len(counts) and int(counts.max()) > self.num_images:
                raise ValueError("a document frequency exceeds num_images")
            self._df_keys.append(keys)
            self._df_counts.append(counts)
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
        cache_size: int = 8192,
    ) -> CiderD:
        """df(g) = number of images whose pooled (normalised) references contain n-gram g."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        df: list[Counter[Gram]] = [Counter() for _ in range(n)]
        for image_id, captions in refs.items():
            if isinstance(captions, str) or len(captions) == 0:
                raise ValueError(
                    f"references of image {image_id!r} must be a non-empty list of str"
                )
            words = [normalize_caption(caption).split() for caption in captions]
            for k in range(1, n + 1):
                # each image counts once per n-gram, however many references repeat it
                df[k - 1].update({gram for ws in words for gram in _ngrams(ws, k)})
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
        from entropyrl.core.files import atomic_path

        with atomic_path(path) as tmp:  # never half a file; mode from the umask
            tmp.write_bytes(data)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        sigma: float | None = None,
        cache_size: int = 8192,
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
    def _weights(self, captions: Sequence[str]) -> _Weights:
        """tf-idf vectors of normalised captions, all captions at once."""
        words_list = [caption.split() for caption in captions]
        n_rows = len(words_list)
        rows_out, keys_out, weights_out = [], [], []
        norms = np.zeros((n_rows, self.n))
        for k in range(1, self.n + 1):
            hashes: list[int] = []
            sizes = np.zeros(n_rows, dtype=np.int64)
            for row, words in enumerate(words_list):
                if len(words) >= k:
                    hashes.extend(map(hash, _ngrams(words, k)))
                    sizes[row] = len(words) - k + 1
            keys = np.array(hashes, dtype=np.int64)
            rows = np.repeat(np.arange(n_rows), sizes)
            # distinct (row, n-gram) pairs and their term frequencies
            order = np.lexsort((keys, rows))
            keys, rows = keys[order], rows[order]
            starts = _runs(rows, keys)
            tf = np.diff(np.append(starts, len(keys)))
            keys, rows = keys[starts], rows[starts]
            # df by binary search in the sorted corpus table (0 when absent)
            table, counts = self._df_keys[k - 1], self._df_counts[k - 1]
            df = np.zeros(len(keys), dtype=np.int64)
            if len(table):
                pos = np.minimum(np.searchsorted(table, keys), len(table) - 1)
                found = table[pos] == keys
                df[found] = counts[pos[found]]
            weights = tf * self._idf[df]
            norms[:, k - 1] = np.sqrt(
                np.bincount(rows, weights=weights * weights, minlength=n_rows)
            )
            rows_out.append(rows)
            keys_out.append(keys)
            weights_out.append(weights)
        if self.n >= 2:
            lengths = np.array([max(len(words) - 1, 0) for words in words_list], dtype=np.int64)
        else:
            lengths = np.zeros(n_rows, dtype=np.int64)  # pycocoevalcap: bigram count, none here
        return _Weights(rows_out, keys_out, weights_out, norms, lengths)

    def _references(self, refs_list: Sequence[tuple[str, ...]]) -> list[_References]:
        """Cached per-image reference vectors; the missing ones are computed in one pass."""
        out: list[_References | None] = []
        missing: dict[tuple[str, ...], list[int]] = {}
        for position, key in enumerate(refs_list):
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
            else:
                if len(key) == 0:
                    raise ValueError("refs must hold at least one reference caption")
                missing.setdefault(key, []).append(position)
            out.append(cached)
        if missing:
            keys = list(missing)
            captions = [normalize_caption(ref) for key in keys for ref in key]
            first = np.cumsum([0] + [len(key) for key in keys])
            vectors = self._weights(captions)
            owner = np.repeat(np.arange(len(keys)), [len(key) for key in keys])
            per_order = []
            for k in range(self.n):
                rows = vectors.rows[k]
                norm = vectors.norms[rows, k]
                weights = vectors.weights[k]
                # a zero norm means all-zero weights: pycocoevalcap then skips the division
                scaled = np.divide(weights, norm, out=np.zeros_like(weights), where=norm != 0)
                bounds = np.searchsorted(owner[rows], np.arange(len(keys) + 1))
                per_order.append((rows, vectors.keys[k], weights, scaled, bounds))
            for j, key in enumerate(keys):
                parts = [(rows, ks, ws, sc, b[j], b[j + 1]) for rows, ks, ws, sc, b in per_order]
                entry = _References(
                    keys=[ks[lo:hi] for _, ks, _, _, lo, hi in parts],
                    ref=[rows[lo:hi] - first[j] for rows, _, _, _, lo, hi in parts],
                    weights=[ws[lo:hi] for _, _, ws, _, lo, hi in parts],
                    scaled=[sc[lo:hi] for _, _, _, sc, lo, hi in parts],
                    lengths=vectors.lengths[first[j] : first[j + 1]],
                )
                self._cache[key] = entry
                for position in missing[key]:
                    out[position] = entry
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ scoring
    def score(self, candidate: str, refs: Sequence[str]) -> float:
        """CIDEr-D of one candidate against its image's references (x10 scale, as COCO)."""
        return float(self.score_batch([candidate], [refs])[0])

    def score_batch(
        self, candidates: Sequence[str], refs_list: Sequence[Sequence[str]]
    ) -> np.ndarray:
        """Scores ``[B]`` (float64) of ``candidates[i]`` against ``refs_list[i]``.

        Per candidate: mean over orders k and references r of ``pen(r) * sum_g min(c_g, r_g)
        r_g / (|c_k| |r_k|)``, times 10, with ``pen(r) = exp(-(len_c - len_r)^2 / (2 sigma^2))``.
        """
        if isinstance(candidates, str) or isinstance(refs_list, str):
            raise TypeError("candidates and refs_list must be sequences, not one str")
        if len(candidates) != len(refs_list):
            raise ValueError(
                f"candidates ({len(candidates)}) and refs_list ({len(refs_list)}) differ in length"
            )
        batch = len(candidates)
        if batch == 0:
            return np.zeros(0)
        ref_keys = []
        for i, refs in enumerate(refs_list):
            if isinstance(refs, str):
                raise TypeError(f"refs_list[{i}] must be a sequence of captions, not one str")
            ref_keys.append(tuple(refs))
        slots_of: dict[tuple[str, ...], int] = {}
        slot = np.array([slots_of.setdefault(key, len(slots_of)) for key in ref_keys])
        images = self._references(list(slots_of))
        n_refs = np.array([len(image.lengths) for image in images])
        max_refs = int(n_refs.max())
        ref_lengths = np.zeros((len(images), max_refs))
        for s, image in enumerate(images):
            ref_lengths[s, : len(image.lengths)] = image.lengths
        cand = self._weights([normalize_caption(candidate) for candidate in candidates])
        delta = cand.lengths[:, None] - ref_lengths[slot]  # [B, max_refs]
        penalty = np.exp(-(delta * delta) / self._penalty_scale)
        totals = np.zeros(batch)
        for k in range(self.n):
            # reference side of the batch: every (image slot, n-gram) with its ref and weights
            ref_slot = np.repeat(np.arange(len(images)), [len(image.keys[k]) for image in images])
            ref_key = _slot_keys(np.concatenate([image.keys[k] for image in images]), ref_slot)
            ref_idx = np.concatenate([image.ref[k] for image in images])
            ref_w = np.concatenate([image.weights[k] for image in images])
            ref_scaled = np.concatenate([image.scaled[k] for image in images])
            sort = np.argsort(ref_key, kind="stable")
            ref_key = ref_key[sort]
            # candidate side: each distinct (candidate, n-gram) looks up its image's references
            rows = cand.rows[k]
            cand_key = _slot_keys(cand.keys[k], slot[rows])
            lo = np.searchsorted(ref_key, cand_key, side="left")
            hi = np.searchsorted(ref_key, cand_key, side="right")
            hits = hi - lo
            total_hits = int(hits.sum())
            if total_hits == 0:
                continue
            which = np.repeat(np.arange(len(cand_key)), hits)
            offsets = np.arange(total_hits) - np.repeat(np.cumsum(hits) - hits, hits)
            matched = sort[np.repeat(lo, hits) + offsets]
            cand_w = cand.weights[k][which]
            hit_rows = rows[which]
            contribution = (
                np.minimum(cand_w, ref_w[matched])
                * ref_scaled[matched]
                * penalty[hit_rows, ref_idx[matched]]
            )
            sums = np.bincount(hit_rows, weights=contribution, minlength=batch)
            norm = cand.norms[:, k]
            totals += np.divide(sums, norm, out=np.zeros(batch), where=norm != 0)
        return totals / self.n / n_refs[slot] * 10.0

    def clear_cache(self) -> None:
        """Forget every cached reference vector (they are rebuilt on demand)."""
        self._cache.clear()

    def __repr__(self) -> str:
        sizes = ", ".join(str(len(order)) for order in self._df)
        return f"CiderD(n={self.n}, sigma={self.sigma}, num_images={self.num_images}, df=[{sizes}])"
