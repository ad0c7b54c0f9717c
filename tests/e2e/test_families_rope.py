"""Random-weight files of the families whose RoPE or layout differs from
plain llama: Llama 3 (rope_freqs), llama with linear RoPE scaling, a
Mistral-style llama file (SentencePiece vocabulary), and phi3 (fused QKV
and gate/up, NEOX RoPE, rope_factors_long/short with an attention factor).

Each file is small (3 layers, embedding 64, 4 heads of 16, 2 KV heads, Q8_0
matrices but for the FFN's down projections, Q6_K, Q4_K, Q6_K by layer as
in a real Q4_K_M file (the only matrices whose rows are long enough for the
256-value K blocks here), an F16 embedding) and deterministic from a seed, with the
tokenizer keys of one of llama.cpp's vendored vocabularies, so its
vocabulary (and so the output head) is the real one. For several prompts,
`zinfer logits` is compared with scripts/ref/numpy_llama.py (float64):
argmax equal except near-ties (top-2 gap < 0.01), mean KL < 1e-4; and
with llama.cpp on the same file (llama-cpp-python), mean KL < 1e-2. The
RoPE variant must matter: the reference without it is far from zinfer.
Errors: a missing or mis-shaped tensor is named, and so is an unsupported
rope.scaling.type.

Skipped without the vendored vocabularies ($ZINFER_HOME/llama.cpp-vendor).
"""

import copy
import math
import os
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import llamacpp_logits, logits_each, report
from gguf_files import cached_write, kquant_bytes, tokenizer_rows, write_gguf

import numpy_llama
import random_gguf

# Under the sanitizers (ZINFER_SANITIZED=1) only phi3's comparison at its
# short context and the error cases run; the rest, mostly Python
# reference work, run in the release build only (README).
SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
VOCABS = HOME / "llama.cpp-vendor" / "models"
NEAR_TIE = 0.01
MAX_KL_REF = 1e-4
MAX_KL_LLAMACPP = 1e-2

DIM, HEAD, NH, NKV, FF, LAYERS = 64, 16, 4, 2, 256, 3
QD, KVD = NH * HEAD, NKV * HEAD

pytestmark = pytest.mark.skipif(not (VOCABS / "ggml-vocab-phi-3.gguf").is_file(),
                                reason=f"{VOCABS} absent (llama.cpp's vendored vocabularies)")


def vocab_keys(name):
    """The tokenizer.* keys of a vendored vocabulary, and its size."""
    return tokenizer_rows(VOCABS / f"ggml-vocab-{name}.gguf")


def llama3_factors(base, dim):
    """Llama 3.1's per-pair divisors (its rope_scaling "llama3" as the
    converter writes rope_freqs), for a small original context so that
    the short test prompts see them."""
    return random_gguf.llama3_rope_factors(base, dim, 8.0, 1.0, 4.0, 64)


def q8(a):
    return gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)


def make_tensors(n_vocab, arch, seed):
    """name -> (data, raw_type or None)."""
    rng = np.random.default_rng(seed)
    t = {"token_embd.weight": ((rng.standard_normal((n_vocab, DIM)) * 0.25).astype(np.float16),
                               None),
         "output_norm.weight": ((1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32), None)}
    for L in range(LAYERS):
        p = f"blk.{L}."

        def mat(rows, cols):
            return q8(rng.standard_normal((rows, cols)) * 0.15), gguf.GGMLQuantizationType.Q8_0

        t[p + "attn_norm.weight"] = ((1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32), None)
        t[p + "ffn_norm.weight"] = ((1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32), None)
        t[p + "attn_output.weight"] = mat(DIM, QD)
        down = gguf.GGMLQuantizationType.Q4_K if L % 2 else gguf.GGMLQuantizationType.Q6_K
        t[p + "ffn_down.weight"] = kquant_bytes(rng, down, DIM, FF, 0.15), down
        if arch == "phi3":
            t[p + "attn_qkv.weight"] = mat(QD + 2 * KVD, DIM)
            t[p + "ffn_up.weight"] = mat(2 * FF, DIM)
        else:
            t[p + "attn_q.weight"] = mat(QD, DIM)
            t[p + "attn_k.weight"] = mat(KVD, DIM)
            t[p + "attn_v.weight"] = mat(KVD, DIM)
            t[p + "ffn_gate.weight"] = mat(FF, DIM)
            t[p + "ffn_up.weight"] = mat(FF, DIM)
    return t


# family name -> (arch, vocabulary, extra keys, extra tensors, ctx sizes)
BASE_LLAMA3 = 500000.0
SPECS = {
    "llama3_rope_freqs": ("llama", "llama-bpe", {"rope.freq_base": BASE_LLAMA3},
                          {"rope_freqs.weight": llama3_factors(BASE_LLAMA3, HEAD)}, [256]),
    "llama_linear": ("llama", "llama-bpe",
                     {"rope.freq_base": 10000.0, "rope.scaling.type": "linear",
                      "rope.scaling.factor": 4.0}, {}, [256]),
    "mistral_spm": ("llama", "llama-spm", {"rope.freq_base": 1000000.0}, {}, [256]),
    # YaRN (gpt-oss's scaling; llama.cpp runs it for any family): factor 8
    # from an original context of 64, so the ramp and magnitude both act
    "llama_yarn": ("llama", "llama-bpe",
                   {"rope.freq_base": 10000.0, "rope.scaling.type": "yarn",
                    "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 64},
                   {}, [256]),
    # original context 300: llama.cpp (n_ctx padded to 256s) and zinfer use
    # the short factors at a context of 256 and the long ones at 512.
    "phi3_longrope": ("phi3", "phi-3",
                      {"rope.freq_base": 10000.0, "rope.scaling.original_context_length": 300,
                       "rope.scaling.attn_factor": 1.1902380714238083},
                      {"rope_factors_long.weight":
                           np.linspace(1.0, 12.0, HEAD // 2).astype(np.float32),
                       "rope_factors_short.weight":
                           np.linspace(1.0, 2.5, HEAD // 2).astype(np.float32)}, [256, 512]),
}


def write_file(path, spec_name, drop=(), replace=None, extra_keys=None):
    """The family's file at path (a copy of the test-file cache's when it
    holds it: drawing the K-quant weights takes seconds)."""
    arch, vocab, keys, extra_t, _ = SPECS[spec_name]
    hp = {"block_count": LAYERS, "context_length": 1024, "embedding_length": DIM,
          "feed_forward_length": FF, "attention.head_count": NH, "attention.head_count_kv": NKV,
          "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": HEAD}
    hp.update(keys)
    hp.update(extra_keys or {})

    def write(p):
        rows, n_vocab = vocab_keys(vocab)
        tensors = make_tensors(n_vocab, arch, seed=sum(map(ord, spec_name)))
        tensors.update({k: (v, None) for k, v in extra_t.items()})
        tensors.update(replace or {})
        write_gguf(p, arch, rows, hp, tensors, drop=drop)

    return cached_write(path, "test_families_rope.write_file", (
        spec_name, VOCABS / f"ggml-vocab-{vocab}.gguf", hp, extra_t, drop, replace), write,
        sources=(__file__, random_gguf.__file__))


class LazyFiles(dict):
    """name -> the family's file, written on first use (the sanitizer
    build uses one of them; writing the K-quant ones takes seconds)."""

    def __init__(self, d):
        super().__init__()
        self.d = d

    def __missing__(self, name):
        self[name] = write_file(self.d / f"{name}.gguf", name)
        return self[name]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return LazyFiles(tmp_path_factory.mktemp("families_rope"))


def prompts(n_vocab):
    rng = np.random.default_rng(7)
    return [[int(i) for i in rng.integers(1, n_vocab, size=n)] for n in (5, 17, 40, 100, 230)]


def zinfer_logits(run_zinfer, path, ids, ctx, tmp_path):
    return zinfer_logits_each(run_zinfer, path, [ids], ctx, tmp_path)[0]


def zinfer_logits_each(run_zinfer, path, ps, ctx, tmp_path):
    """`zinfer logits` of each prompt, two runs at a time (conftest.logits_each)."""
    return [z.astype(np.float64) for z in logits_each(
        run_zinfer, path, ps, [tmp_path / f"z{i}.f32" for i in range(len(ps))], "--ctx-size", ctx)]


def compare(ref, got):
    kl = numpy_llama.kl(ref, got)
    top2 = np.partition(ref, -2, axis=-1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    flips = np.nonzero(ref.argmax(-1) != got.argmax(-1))[0]
    bad = [int(i) for i in flips if gap[i] >= NEAR_TIE]
    return float(kl.mean()), len(flips), bad


CASES = [(name, ctx) for name, spec in SPECS.items() for ctx in spec[4]]
# (case, prompt index) -> (reference, zinfer) logits, for the llama.cpp test.
# One case's at a time: ~0.8 GB for a 128k vocabulary's five prompts.
_SEEN = {}


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-ctx{c}" for n, c in CASES])
def case(request):
    """(name, ctx). Module-scoped, so pytest runs both tests of one case
    before the next case: the earlier case's logits can go."""
    _SEEN.clear()
    return request.param


def test_logits_match_reference(case, files, run_zinfer, tmp_path):
    name, ctx = case
    if SANITIZED and (name, ctx) != CASES[-2]:
        pytest.skip("release build only (the sanitizer build checks one phi3 case)")
    path = files[name]
    m = numpy_llama.Model(str(path), n_ctx_seq=ctx)
    kls, flips_total, positions = [], 0, 0
    ps = prompts(m.n_vocab)
    for i, (ids, got) in enumerate(zip(ps, zinfer_logits_each(run_zinfer, path, ps, ctx,
                                                              tmp_path))):
        assert np.isfinite(got).all()
        ref = m.forward(ids)
        mean_kl, n_flips, bad = compare(ref, got)
        assert not bad, f"{name}: argmax differs at {bad} (not near-ties)"
        assert mean_kl < MAX_KL_REF, f"{name} {len(ids)} tokens: mean KL {mean_kl:.3e}"
        kls.append(mean_kl)
        flips_total += n_flips
        positions += len(ids)
        _SEEN[(name, ctx, i)] = (ref, got)  # for the llama.cpp comparison below
    res = {"zinfer_vs_ref_mean_kl": float(np.mean(kls)), "argmax_flips": flips_total,
           "positions": positions}
    report("families_rope", f"{name}-ctx{ctx}", res)
    print(f"\n{name} ctx {ctx}: {res}")


def test_llamacpp_beside_reference(case, files, run_zinfer, tmp_path):
    """llama.cpp on the same file and context: its KL from the reference and
    from zinfer, for the report, under a loose bound (it is the less exact
    engine). Needs llama-cpp-python (scripts/setup --with-llamacpp);
    skipped without."""
    name, ctx = case
    pytest.importorskip("llama_cpp")
    if SANITIZED and (name, ctx) != CASES[-2]:
        pytest.skip("release build only (the sanitizer build checks one phi3 case)")
    path = files[name]
    m = numpy_llama.Model(str(path), n_ctx_seq=ctx)
    ps = prompts(m.n_vocab)
    cpps = llamacpp_logits(path, ps, n_ctx=ctx, n_batch=ctx, n_threads=2)
    kls_cpp = []
    for i, (ids, cpp) in enumerate(zip(ps, cpps)):
        if (name, ctx, i) in _SEEN:
            ref, got = _SEEN.pop((name, ctx, i))
        else:  # the zinfer test above did not run in this session
            ref, got = m.forward(ids), zinfer_logits(run_zinfer, path, ids, ctx, tmp_path)
        kls_cpp.append((float(numpy_llama.kl(ref, cpp).mean()),
                        float(numpy_llama.kl(cpp, got).mean())))
    res = {"llamacpp_vs_ref_mean_kl": float(np.mean([a for a, _ in kls_cpp])),
           "zinfer_vs_llamacpp_mean_kl": float(np.mean([b for _, b in kls_cpp]))}
    report("families_rope", f"{name}-ctx{ctx}-llamacpp", res)
    # over the family's prompts (llama.cpp's int8 activations: noisy per prompt)
    assert res["llamacpp_vs_ref_mean_kl"] < MAX_KL_LLAMACPP, res
    assert res["zinfer_vs_llamacpp_mean_kl"] < MAX_KL_LLAMACPP, res


@pytest.mark.parametrize("name", ["llama3_rope_freqs", "llama_linear", "llama_yarn",
                                  "phi3_longrope"])
def test_rope_variant_matters(name, files, run_zinfer, tmp_path):
    """The reference without the file's RoPE scaling is far from zinfer:
    the factors, the scale and the attention factor are really applied."""
    if SANITIZED:
        pytest.skip("release build only (a check of the reference's switches)")
    ctx = SPECS[name][4][-1]
    m = numpy_llama.Model(str(files[name]), n_ctx_seq=ctx)
    ids = prompts(m.n_vocab)[3]
    got = zinfer_logits(run_zinfer, files[name], ids, ctx, tmp_path)
    kl = numpy_llama.kl(m.forward(ids), got).mean()
    if name == "llama_yarn":  # YaRN's ramp and magnitude, not linear scaling
        from moe_files import yarn_off
        lin = copy.copy(m)
        yarn_off(lin)
        linear = numpy_llama.kl(lin.forward(ids), got).mean()
        assert linear > 100 * kl and linear > 1e-3, (linear, kl)
    i = np.arange(0, m.rope_dim, 2, dtype=np.float64)
    m.inv_freq = m.rope_base ** (-i / m.rope_dim)
    m.attn_factor = 1.0
    plain = numpy_llama.kl(m.forward(ids), got).mean()
    assert plain > 100 * kl and plain > 1e-3, (plain, kl)


def test_phi3_long_and_short_differ(files, run_zinfer, tmp_path):
    """A context past the original one switches to the long factors."""
    if SANITIZED:
        pytest.skip("release build only")
    ids = prompts(32064)[2]
    a = zinfer_logits(run_zinfer, files["phi3_longrope"], ids, 256, tmp_path)
    b = zinfer_logits(run_zinfer, files["phi3_longrope"], ids, 512, tmp_path)
    assert numpy_llama.kl(a, b).mean() > 1e-3


def run_bad(run_zinfer, path, tmp_path):
    res = run_zinfer("logits", "--model", path, "--prompt-ids", "1,2,3", "--out", tmp_path / "o")
    err = res.stderr.strip()
    assert 0 < res.returncode < 128, err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("name,tensor,shape", [
    ("phi3_longrope", "blk.1.attn_qkv.weight", (QD + KVD, DIM)),
    ("phi3_longrope", "blk.2.ffn_up.weight", (FF, DIM)),
    ("phi3_longrope", "rope_factors_long.weight", (HEAD,)),
    ("phi3_longrope", "blk.0.ffn_down.weight", None),
    ("llama3_rope_freqs", "rope_freqs.weight", (HEAD // 2 + 1,)),
    ("mistral_spm", "blk.2.attn_v.weight", None),
])
def test_missing_or_misshaped_tensor_named(name, tensor, shape, tmp_path, run_zinfer):
    if SANITIZED and name != "phi3_longrope":
        pytest.skip("release build only (the sanitizer build checks phi3's)")
    if shape is None:
        path = write_file(tmp_path / "bad.gguf", name, drop=(tensor,))
    else:
        data = np.zeros(shape, np.float32)
        path = write_file(tmp_path / "bad.gguf", name, replace={tensor: (data, None)})
    err = run_bad(run_zinfer, path, tmp_path)
    assert re.search(re.escape(tensor), err), err
    msg = err.split("bad.gguf: ", 1)[1]  # the temporary path has "missing" in it
    assert ("missing" in msg) == (shape is None), err


@pytest.mark.parametrize("stype", ["dynamic", "llama3-ish"])
def test_unsupported_rope_scaling_named(stype, tmp_path, run_zinfer):
    path = write_file(tmp_path / "bad.gguf", "llama_linear",
                      extra_keys={"rope.scaling.type": stype})
    err = run_bad(run_zinfer, path, tmp_path)
    assert "llama.rope.scaling.type" in err and f"'{stype}'" in err, err
