"""The on-disk graph cache (``archplace.workloads.capture_cache``): a hit gives back the very graph that
was stored, any change of the key misses, a corrupt entry is recaptured and rewritten, and the
builders really go through it."""

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from archplace.workloads import capture_cache as cc
from archplace.workloads.graph import OpGraph
from archplace.workloads.models import PRESETS, _forward_graph, build_graph


def _small_graph(scale: int = 1) -> OpGraph:
    """Three ops with an extra node column and tuples in ``meta`` (pickle must keep both)."""
    return OpGraph.from_columns(
        dict(id=[0, 1, 2], kind=["matmul", "gelu", "matmul"], gemm_b=[1, 0, 1], gemm_m=[64, 0, 64],
             gemm_n=[128, 0, 64], gemm_k=[64, 0, 128], flops=[scale * 2.0 * 64 * 128 * 64, 5e3, 1e6],
             input_bytes=[100, 200, 300], output_bytes=[200, 300, 400], weight_bytes=[10, 0, 20]),
        dict(src=[0, 1], dst=[1, 2], bytes=[200, 300]),
        meta={"model": "tiny", "shape": (1, 64), "layers": []},
        extra_nodes={"coloc_group": np.array([0, -1, 1], dtype=np.int64)})


class _Builder:
    """A build function that counts its calls."""

    def __init__(self, graph: OpGraph):
        self.graph, self.calls = graph, 0

    def __call__(self) -> OpGraph:
        self.calls += 1
        return self.graph


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cc.ENV_CACHE_DIR, str(tmp_path / "c"))
    return tmp_path / "c" / "graphs"


def _same_graph(a: OpGraph, b: OpGraph) -> None:
    assert a.equals(b) and a.content_hash() == b.content_hash()
    assert a.meta == b.meta  # exact: a tuple stays a tuple
    for cols_a, cols_b in ((a.nodes, b.nodes), (a.edges, b.edges), (a.extra_nodes, b.extra_nodes)):
        assert {k: v.dtype for k, v in cols_a.items()} == {k: v.dtype for k, v in cols_b.items()}


def test_hit_returns_the_stored_graph_and_does_not_build(cache):
    g = _small_graph()
    first = _Builder(g)
    assert cc.cached_graph("t", {"n": 1}, first) is g and first.calls == 1
    assert len(list(cache.glob("t-*.pkl"))) == 1 and not list(cache.glob(".*.tmp"))
    second = _Builder(_small_graph(scale=2))
    got = cc.cached_graph("t", {"n": 1}, second)
    assert second.calls == 0
    _same_graph(got, g)
    assert got.meta["shape"] == (1, 64) and isinstance(got.meta["shape"], tuple)


def test_a_captured_model_round_trips_exactly(cache):
    g = _forward_graph("bert-base", 128, 1, 2, 3, True, "")
    key = cc.entry_key("forward", {"name": "bert-base"})
    assert cc.store(key, g) == cache / f"{key}.pkl"
    _same_graph(cc.load(key), g)


def test_build_graph_writes_the_session_cache():
    """conftest points ARCHPLACE_CACHE_DIR at one folder per session; build_graph's forward graph is
    there under its key, equal to the one in memory."""
    assert os.environ.get(cc.ENV_CACHE_DIR), "conftest sets the session cache"
    build_graph("bert-base", seq=128, mbs=2)
    identity = {"name": "bert-base", "seq": 128, "mbs": 2, "bytes_per_element": 2, "capture_blocks": 3,
                "fuse": True, "fingerprint": ""}
    stored = cc.load(cc.entry_key("forward", identity))
    assert stored is not None and stored.equals(_forward_graph("bert-base", 128, 2, 2, 3, True, ""))


def test_every_part_of_the_key_misses(cache, monkeypatch):
    g = _small_graph()
    cc.cached_graph("t", {"seq": 128, "model": "a"}, _Builder(g))
    for kind, identity in (("t", {"seq": 256, "model": "a"}), ("t", {"seq": 128, "model": "b"}),
                           ("u", {"seq": 128, "model": "a"})):
        b = _Builder(g)
        cc.cached_graph(kind, identity, b)
        assert b.calls == 1, (kind, identity)
    # another code version (an edited workloads source, another torch) names another entry
    monkeypatch.setattr(cc, "_code_version", "0" * 32)
    b = _Builder(g)
    cc.cached_graph("t", {"seq": 128, "model": "a"}, b)
    assert b.calls == 1
    assert len(list(cache.glob("*.pkl"))) == 5


def test_code_version_follows_the_sources_and_the_libraries(tmp_path, monkeypatch):
    src = tmp_path / "workloads"
    shutil.copytree(cc._PACKAGE_DIR, src, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cc, "_PACKAGE_DIR", src)

    def version() -> str:
        monkeypatch.setattr(cc, "_code_version", None)
        return cc.code_version()

    base = version()
    assert version() == base  # deterministic
    (src / "gdp_models" / "presets.py").write_text((src / "gdp_models" / "presets.py").read_text() + "#\n")
    edited = version()
    assert edited != base
    real = cc._version
    monkeypatch.setattr(cc, "_version", lambda dist: "9.9" if dist == "torch" else real(dist))
    assert version() not in (base, edited)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "other_key", "not_a_graph"])
def test_a_corrupt_entry_warns_is_recaptured_and_rewritten(cache, damage):
    g = _small_graph()
    cc.cached_graph("t", {"n": 1}, _Builder(g))
    (path,) = cache.glob("t-*.pkl")
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        path.write_bytes(raw[:-10] + bytes([raw[-10] ^ 0xFF]) + raw[-9:])
    elif damage == "garbage":
        path.write_bytes(b"\x00" * 100)
    else:  # well-formed files (right digest) written for another key, or holding no graph
        body = pickle.dumps(("t-other", g) if damage == "other_key" else (path.stem, {"not": "a graph"}))
        path.write_bytes(cc._MAGIC + hashlib.blake2b(body, digest_size=cc._DIGEST_BYTES).digest() + body)
    b = _Builder(g)
    with pytest.warns(cc.CacheWarning, match="ignoring corrupt entry"):
        got = cc.cached_graph("t", {"n": 1}, b)
    assert b.calls == 1 and got is g
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same_graph(cc.load(path.stem), g)  # rewritten: reads cleanly


def test_empty_variable_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv(cc.ENV_CACHE_DIR, "")
    assert cc.cache_dir() is None
    b = _Builder(_small_graph())
    cc.cached_graph("t", {"n": 1}, b)
    cc.cached_graph("t", {"n": 1}, b)
    assert b.calls == 2
    monkeypatch.delenv(cc.ENV_CACHE_DIR)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cc.cache_dir() == tmp_path / ".cache" / "archplace" / "graphs"


def test_an_unwritable_folder_warns_and_still_returns_the_graph(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cc.ENV_CACHE_DIR, str(tmp_path / "file"))  # its "graphs" cannot be made
    b = _Builder(_small_graph())
    with pytest.warns(cc.CacheWarning, match="cannot write"):
        assert cc.cached_graph("t", {"n": 1}, b) is b.graph


def test_concurrent_writers_never_expose_a_partial_entry(cache):
    """Writers replace the entry while readers read it: every read is a whole graph (os.replace is
    atomic), no warning, and no temporary file is left behind."""
    g = _small_graph()
    key = cc.entry_key("t", {"n": 1})
    cc.store(key, g)
    bad: list[str] = []

    def write() -> None:
        for _ in range(30):
            cc.store(key, g)

    def read() -> None:
        for _ in range(60):
            got = cc.load(key)
            if got is None or not got.equals(g):
                bad.append(repr(got))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=f) for f in (write, write, read, read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not bad and not [w for w in caught if issubclass(w.category, cc.CacheWarning)]
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.pkl"]


def test_the_key_is_json_of_the_identity():
    """Identities are JSON values: dict order does not matter, a value's type does."""
    assert cc.entry_key("k", {"a": 1, "b": 2}) == cc.entry_key("k", {"b": 2, "a": 1})
    assert cc.entry_key("k", {"a": 1}) != cc.entry_key("k", {"a": "1"})
    with pytest.raises(TypeError):
        cc.entry_key("k", {"a": object()})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_max_positions_match_the_transformers_config(name):
    """build_graph checks seq against ``max_positions`` without importing transformers; it must be
    what the transformers config says."""
    cfg = PRESETS[name].make_config()
    assert PRESETS[name].max_positions == (getattr(cfg, "n_positions", None)
                                           or getattr(cfg, "max_position_embeddings", None))


def test_a_cached_graph_needs_neither_torch_nor_transformers(tmp_path):
    """A process that finds its graph in the cache does not import torch (~2 s of CPU per CLI call):
    the entry written here, under the key ``_forward_graph`` uses, is what a fresh process reads."""
    identity = {"name": "bert-base", "seq": 128, "mbs": 1, "bytes_per_element": 2, "capture_blocks": 3,
                "fuse": True, "fingerprint": ""}
    cc.store(cc.entry_key("forward", identity), _forward_graph("bert-base", 128, 1, 2, 3, True, ""),
             tmp_path / "graphs")
    env = {**os.environ, cc.ENV_CACHE_DIR: str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[1])}
    code = ("import sys; from archplace.workloads.models import build_graph; "
            "g = build_graph('bert-base', seq=128, tmp=2); "
            "print(g.content_hash(), 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == [build_graph("bert-base", seq=128, tmp=2).content_hash(), "False", "False"]


def test_cli_no_cache_captures_without_reading_or_writing(tmp_path, monkeypatch, capsys):
    from archplace.cli import main

    monkeypatch.setenv(cc.ENV_CACHE_DIR, str(tmp_path))  # restored after the test: main() clears it
    # a sequence length no other test captures, so the in-process lru_cache cannot answer either
    assert main(["--no-cache", "graph", "bert-base", "--seq", "40", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seq"] == 40
    assert os.environ[cc.ENV_CACHE_DIR] == "" and cc.cache_dir() is None
    assert not list(tmp_path.iterdir())
