"""MXFP4 (ggml type 39, gpt-oss's expert tensors) through the whole engine.

No public model small enough to commit or download here is stored in
MXFP4, so the default model is requantized: every matrix of its layers
(Q4_1 in the file) is dequantized and quantized again to MXFP4 with the
`gguf` package's own quantizer (gguf.quants.quantize), the rest (norms,
the Q8_0 embedding) kept as it is. Then:
  - `zinfer info` describes the file by type name, MXFP4 runnable, with
    the tensor count and bytes the `gguf` package reads, and the CPU
    backend holding the weights at the file's size (MXFP4 keeps its 17
    bytes per 32 values in the extended 16-row layout);
  - `zinfer logits` (the default kernel table, and the avx2 one) against
    scripts/ref/numpy_llama.py's float64 forward pass, which dequantizes
    MXFP4 with gguf-py: mean KL(ref || zinfer) < MAX_MEAN_KL and the same
    argmax except at near-ties (top-2 gap < NEAR_TIE), as
    test_quant_types.py asks of every other type. The weights' bits are
    checked elsewhere (tests/unit/test_dequant.c, test_repack_x.c); this
    checks that the engine loads and runs such a file, every product of
    every layer on the MXFP4 kernels.
The requantization takes ~10 s (kept in the test-file cache, docs/testing.md);
under the sanitizers one prompt runs.
"""

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import ids_arg, last_json
from gguf_files import cached_write, metadata_rows, write_gguf

import numpy_llama

Q = gguf.GGMLQuantizationType
NEAR_TIE = 0.01
MAX_MEAN_KL = 1e-4
PROMPTS = ("chat_capital", "code_fib", "unicode_mixed")
SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"


@pytest.fixture(scope="module")
def mxfp4_model(model_path, tmp_path_factory):
    """The default model with its layers' matrices in MXFP4; and the
    float64 reference of that file, loaded on first use."""
    r = gguf.GGUFReader(str(model_path))
    is_mx = [t.name.startswith("blk.") and len(t.shape) == 2 for t in r.tensors]

    def write(out):
        tensors = []
        for t, mx in zip(r.tensors, is_mx):
            if mx:
                w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
                tensors.append((t.name, gguf.quants.quantize(w, Q.MXFP4), Q.MXFP4))
            elif t.tensor_type == Q.F32:
                tensors.append((t.name, np.array(t.data), None))
            else:
                tensors.append((t.name, np.array(t.data), t.tensor_type))
        rows, _ = metadata_rows(model_path)
        write_gguf(out, "llama", rows, tensors=tensors)

    # The requantization (~10 s) through the test-file cache: both passes
    # of scripts/test and later runs copy the file.
    path = cached_write(tmp_path_factory.mktemp("mxfp4") / "smollm2-mxfp4.gguf",
                        "test_mxfp4.requantized", (Path(model_path),), write, sources=(__file__,))
    n_mx = sum(is_mx)
    cache = []

    def ref():
        if not cache:
            cache.append(numpy_llama.Model(str(path)))
        return cache[0]

    return {"path": path, "ref": ref, "n_mxfp4": n_mx}


def test_info_describes_mxfp4(run_zinfer, mxfp4_model):
    path = mxfp4_model["path"]
    r = gguf.GGUFReader(str(path))
    mx = [t for t in r.tensors if t.tensor_type == Q.MXFP4]
    assert len(mx) == mxfp4_model["n_mxfp4"] > 0  # every matrix of the layers
    res = run_zinfer("info", "--model", path, "--json")
    assert res.returncode == 0, res.stderr
    j = last_json(res.stdout)
    assert j["tensor_types"]["MXFP4"] == {
        "tensors": len(mx), "elements": sum(int(t.n_elements) for t in mx),
        "bytes": sum(int(t.n_bytes) for t in mx), "runnable": True}
    assert sum(int(t.n_bytes) for t in mx) * 32 == sum(int(t.n_elements) for t in mx) * 17
    assert j["unsupported_types"] == []
    assert j["runnable"] is True
    assert j["memory"]["weights_bytes"] == sum(int(t.n_bytes) for t in r.tensors)
    assert j["memory"]["weights_held_bytes"] == j["memory"]["weights_bytes"]
    res = run_zinfer("info", "--model", path)
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.strip().startswith("MXFP4"))
    assert f"{len(mx)} tensors" in line and "cannot run" not in line, line
    assert "cannot run" not in res.stdout


@pytest.mark.parametrize("isa", [None, "avx2"], ids=["default_isa", "avx2"])
def test_mxfp4_logits_match_reference(isa, mxfp4_model, prompts, run_zinfer, tmp_path):
    if isa and SANITIZED:
        pytest.skip("under the sanitizers the default table alone")
    names = PROMPTS[:1] if SANITIZED else PROMPTS
    extra = ["--isa", isa] if isa else []
    kls, bad = [], {}
    for name in names:
        ids = prompts[name]["ids"]
        out = tmp_path / f"{name}.f32"
        res = run_zinfer("logits", "--model", mxfp4_model["path"], "--prompt-ids", ids_arg(ids),
                         "--out", out, *extra)
        if res.returncode != 0 and isa and "not supported by this CPU" in res.stderr:
            pytest.skip(f"this CPU has no {isa} table")
        assert res.returncode == 0, f"zinfer logits failed: {res.stderr.strip()}"
        assert last_json(res.stdout)["n_tokens"] == len(ids)
        ref_model = mxfp4_model["ref"]()
        raw = np.fromfile(out, dtype="<f4")
        assert raw.size == len(ids) * ref_model.n_vocab, f"{out}: {raw.size} floats"
        got = raw.reshape(len(ids), ref_model.n_vocab).astype(np.float64)
        assert np.isfinite(got).all(), f"{name}: non-finite logits"
        ref = numpy_llama.logits(ref_model, ids)
        kls.append(numpy_llama.kl(ref, got))
        srt = np.partition(ref, -2, axis=-1)  # the two largest last
        gap = srt[:, -1] - srt[:, -2]
        hard = [(int(i), round(float(gap[i]), 4))
                for i in np.nonzero(ref.argmax(-1) != got.argmax(-1))[0] if gap[i] >= NEAR_TIE]
        if hard:
            bad[name] = hard
    kl = np.concatenate(kls)
    print(f"\nMXFP4 ({isa or 'default isa'}): mean KL {kl.mean():.3e}, max {kl.max():.3e} "
          f"over {kl.size} positions")
    assert not bad, f"argmax differs from the reference away from near-ties: (pos, gap) {bad}"
    assert kl.mean() < MAX_MEAN_KL, f"mean KL {kl.mean():.3e} >= {MAX_MEAN_KL}"
