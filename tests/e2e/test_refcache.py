"""scripts/ref/refcache.py, the disk cache of the float64 references' outputs
(docs/testing.md, "Reference cache"), on a tiny random llama file:
  - a second Model(path) answers forward and greedy from the disk, exactly,
    without loading the file, and gives its scalar attributes (n_vocab);
  - calls with state (a KV cache, routing) load the file and compute;
  - a corrupt entry is recomputed and rewritten; editing the reference's
    code (its sources' hash) misses every entry; ZINFER_REFCACHE=0 gives a
    plain Model and writes nothing; the size bound removes old entries;
  - copy.copy gives the real model with its own weight dict (ablations);
  - a file's sha256 is memoized by its stat and recomputed when it changes.
"""

import copy
import hashlib

import numpy as np
import pytest
from gguf_files import write_random_llama

import numpy_llama
import refcache

pytestmark = pytest.mark.no_zinfer
N_VOCAB = 300
IDS = [1, 5, 9, 200, 7]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ZINFER_REFCACHE_DIR", str(tmp_path / "rc"))
    monkeypatch.delenv("ZINFER_REFCACHE", raising=False)
    monkeypatch.delenv("ZINFER_REFCACHE_MAX_MB", raising=False)
    return tmp_path / "rc"


@pytest.fixture
def model_file(tmp_path):
    return str(write_random_llama(tmp_path / "m.gguf", (), N_VOCAB))


def entries(d):
    return sorted(d.glob("v1/*/*.npz"))


def test_second_model_reads_the_disk(cache_dir, model_file):
    m = numpy_llama.Model(model_file)
    assert isinstance(m, numpy_llama.Model) and not refcache.loaded(m)
    want = m.forward(IDS)
    rows = m.forward(IDS, rows=[1, 3])
    toks, gaps = m.greedy(IDS, 6)
    assert refcache.loaded(m) and len(entries(cache_dir)) == 3
    m2 = numpy_llama.Model(model_file)
    assert m2.n_vocab == N_VOCAB and m2.n_layer == 2
    assert np.array_equal(m2.forward(np.array(IDS)), want)  # a list and an array: one key
    assert np.array_equal(m2.forward(IDS, rows=np.array([1, 3])), rows)
    assert m2.greedy(IDS, 6) == (toks, gaps) and all(isinstance(t, int) for t in toks)
    assert np.array_equal(numpy_llama.logits(m2, IDS), want)
    assert not refcache.loaded(m2)
    # with a KV cache the call is the model's own: the file loads
    cache = m2.new_cache()
    assert refcache.loaded(m2)
    z = np.concatenate([m2.forward(IDS[:2], cache), m2.forward(IDS[2:], cache)])
    assert np.abs(z - want).max() < 1e-9
    routing = []
    m2.forward(IDS, routing=routing)
    assert len(entries(cache_dir)) == 3


def test_corrupt_entry_recomputed(cache_dir, model_file):
    want = numpy_llama.Model(model_file).forward(IDS)
    (e,) = entries(cache_dir)
    e.write_bytes(e.read_bytes()[:100])
    m = numpy_llama.Model(model_file)
    assert np.array_equal(m.forward(IDS), want) and refcache.loaded(m)
    (e2,) = entries(cache_dir)
    assert e2 == e and e2.stat().st_size > 100
    assert np.array_equal(numpy_llama.Model(model_file).forward(IDS), want)


def test_source_change_misses(cache_dir, model_file, monkeypatch):
    numpy_llama.Model(model_file).forward(IDS)
    monkeypatch.setattr(refcache, "_SOURCES", ["an edited reference"])
    m = numpy_llama.Model(model_file)
    m.forward(IDS)
    assert refcache.loaded(m) and len(entries(cache_dir)) == 2


def test_off(cache_dir, model_file, monkeypatch):
    monkeypatch.setenv("ZINFER_REFCACHE", "0")
    m = numpy_llama.Model(model_file)
    assert type(m) is numpy_llama.Model
    m.forward(IDS)
    assert not cache_dir.exists()


def test_size_bound(cache_dir, model_file, monkeypatch):
    m = numpy_llama.Model(model_file)
    m.forward(IDS)
    one = entries(cache_dir)[0].stat().st_size
    monkeypatch.setenv("ZINFER_REFCACHE_MAX_MB", str(3.5 * one / 2**20))
    for n in range(2, 8):
        m.forward(IDS[:n] * 2)
        total = sum(e.stat().st_size for e in entries(cache_dir))
        assert total <= 3.5 * one, (n, total)
    assert len(entries(cache_dir)) >= 2


def test_copy_is_the_real_model(cache_dir, model_file):
    m = numpy_llama.Model(model_file)
    want = m.forward(IDS)
    c = copy.copy(m)
    assert type(c) is numpy_llama.Model
    c.w.pop("blk.0.attn_q.weight")
    assert "blk.0.attn_q.weight" in m.w
    m.neox = True  # an attribute set on the proxy: its results are no longer the file's
    assert not np.allclose(m.forward(IDS), want)
    assert np.array_equal(numpy_llama.Model(model_file).forward(IDS), want)


def test_file_sha256_memoized(cache_dir, tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"abc" * 1000)
    assert refcache.file_sha256(p) == hashlib.sha256(b"abc" * 1000).hexdigest()
    assert len(list(cache_dir.glob("ids/*"))) == 1
    p.write_bytes(b"abcd" * 1000)
    assert refcache.file_sha256(p) == hashlib.sha256(b"abcd" * 1000).hexdigest()
