"""`entropyrl.core.files` against written-out expectations: where the caches live, the source
digest, the exact JSON spellings, strict JSON and the parquet round trip."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from entropyrl.core import files


def test_cache_home_reads_its_variables_in_order(monkeypatch, tmp_path):
    monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert files.cache_home() == tmp_path / "mine"
    monkeypatch.delenv("ENTROPYRL_CACHE")
    assert files.cache_home() == tmp_path / "xdg" / "entropyrl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert files.cache_home() == tmp_path / "home" / ".cache" / "entropyrl"


def test_source_digest_is_names_and_bytes_in_order():
    package = Path(files.__file__).resolve().parents[1]
    names = ["core/files.py", "core/specs.py"]
    want = hashlib.sha256()
    for name in names:
        want.update(name.encode() + b"\0" + (package / name).read_bytes() + b"\0")
    assert files.source_digest(names) == want.hexdigest()
    assert files.source_digest(names[::-1]) != want.hexdigest()


def test_canonical_json_and_its_hash_have_one_spelling():
    assert files.canonical_json({"b": [1, 2], "a": "é"}) == '{"a":"é","b":[1,2]}'
    parts = ({"b": 1, "a": 2}, "x")
    want = int(hashlib.sha1(b'[{"a":2,"b":1},"x"]').hexdigest(), 16)
    assert files.stable_hash(*parts) == want


def test_strict_json_has_null_for_every_missing_number():
    value = {
        "nan": math.nan, "inf": [math.inf, -math.inf], "ok": (1.5, 2), "none": None, "flag": True,
        "np": np.float64("nan"), "np0": np.array(3.0), "t": torch.tensor(float("inf")),
        "tensor": torch.tensor(2.5), "text": "a",
    }  # fmt: skip
    assert files.finite_json(value) == {
        "nan": None, "inf": [None, None], "ok": [1.5, 2], "none": None, "flag": True,
        "np": None, "np0": 3.0, "t": None, "tensor": 2.5, "text": "a",
    }  # fmt: skip
    row = np.arange(3)  # not 0-d: left as it is (json refuses it, as it should)
    assert files.finite_json(row) is row
    assert files.json_dumps({"a": math.nan}) == '{"a": null}'
    with pytest.raises(ValueError):
        files.json_dumps({"a": math.nan}, default=lambda o: o, cls=_Sneaky)


class _Sneaky(json.JSONEncoder):
    """An encoder handed NaN after the conversion: allow_nan=False must still refuse it."""

    def encode(self, o):
        return super().encode({"a": math.nan})


def test_write_json_spells_utf8_indented_with_a_final_newline(tmp_path):
    path = tmp_path / "sub" / "out.json"
    files.write_json({"name": "café", "x": [1, math.inf]}, path)
    assert path.read_bytes() == '{\n "name": "café",\n "x": [\n  1,\n  null\n ]\n}\n'.encode()
    files.write_json({"a": 1}, path, indent=None)
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n'
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]


def test_write_parquet_round_trips_atomically(tmp_path):
    import pyarrow.parquet as pq

    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "é"}]
    path = tmp_path / "t" / "rows.parquet"
    files.write_parquet(rows, path)
    assert pq.read_table(path).to_pylist() == rows
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~files.current_umask())
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]


def test_current_umask_is_the_processs_and_leaves_it_unchanged():
    old = os.umask(0o027)
    try:
        assert files.current_umask() == 0o027
        assert files.current_umask() == 0o027
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(old)
