"""Model families without their real weights: small random-weight GGUF files.

For each family of FAMILIES (a table: add a row for a new family) a small
file is written with gguf's GGUFWriter, deterministic from a seed: the
family's architecture name and hyper-parameter keys, a real vocabulary's
tokenizer keys (llama.cpp's vendored vocab files, or the Gemma 3 270M
file's), a few layers of dims ~64, and the tensor types a real file of the
family uses (F32 norms and biases, F16, Q8_0, Q5_0, Q4_0, and Q4_K / Q6_K
where a row is 256 long). Then, on a few prompts of random token ids (one
longer than any sliding window):
  - `zinfer logits` against scripts/ref/numpy_llama.py's float64 forward
    pass: mean KL(ref || zinfer) < 1e-4, argmax equal except at near-ties
    (top-2 gap < 0.01);
  - llama.cpp (llama-cpp-python, logits_all) on the same file: mean
    KL(ref || llama.cpp) < 1e-2 (its int8 activations are the larger
    error);
  - a tensor of the family missing or mis-shaped is named in a one-line
    error.
Skipped when the vendored vocab files (or, for gemma2, the Gemma 3 file)
are absent. Numbers go to the e2e report (section families_logits).
"""

import copy
import os
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import ids_arg, last_json, logits_each, report
from gguf_files import kquant_bytes, stored, tokenizer_rows, write_gguf

import numpy_llama

# Under the sanitizers (scripts/run_tests.py sets ZINFER_SANITIZED=1) one
# family's comparison runs (qwen2: biases and NEOX RoPE through the C
# code); the others, whose cost is mostly the Python references, run in
# the release build only (README).
SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
VENDOR = HOME / "llama.cpp-vendor" / "models"
GEMMA3 = Path(os.environ.get("ZINFER_GEMMA3", HOME / "models" / "gemma-3-270m-q4_k_m.gguf"))
Q = gguf.GGMLQuantizationType
NEAR_TIE = 0.01
MAX_MEAN_KL_REF = 1e-4
MAX_MEAN_KL_LLAMACPP = 1e-2

# ---- the table of families ----------------------------------------------
#
# hparams: the "<arch>." keys written (anything else takes the family's
# default). layer: per-layer tensors name -> (numpy shape [rows, cols] or
# [n], type, scale); a type may be a list, indexed by layer. top: the
# non-layer tensors. bad: (tensor, None to drop it | a wrong shape).
# ablate: name -> a change to the reference Model that drops one of the
# family's differences; each must move the reference far from zinfer (the
# file exercises it).
D, FF, NH, NKV, HD = 64, 256, 4, 2, 16


def _attn(qd, kvd, types):
    tq, tk, tv, to = types
    return {"attn_norm.weight": ((D,), Q.F32, "norm"), "ffn_norm.weight": ((D,), Q.F32, "norm"),
            "attn_q.weight": ((qd, D), tq, None), "attn_k.weight": ((kvd, D), tk, None),
            "attn_v.weight": ((kvd, D), tv, None), "attn_output.weight": ((D, qd), to, None)}


def _ffn(tgate, tup, tdown):
    return {"ffn_gate.weight": ((FF, D), tgate, None), "ffn_up.weight": ((FF, D), tup, None),
            "ffn_down.weight": ((D, FF), tdown, None)}


FAMILIES = [
    dict(arch="qwen2", vocab=VENDOR / "ggml-vocab-qwen2.gguf", seed=21, layers=3,
         hparams={"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6},
         layer={**_attn(NH * HD, NKV * HD, (Q.F16, Q.F16, Q.Q8_0, Q.Q5_0)),
                **_ffn(Q.Q4_0, Q.Q4_0, [Q.Q6_K, Q.Q4_K, Q.Q6_K]),
                "attn_q.bias": ((NH * HD,), Q.F32, "bias"),
                "attn_k.bias": ((NKV * HD,), Q.F32, "bias"),
                "attn_v.bias": ((NKV * HD,), Q.F32, "bias")},
         # output.bias: optional in llama.cpp's qwen2 loader, so written here
         top={"token_embd.weight": ("vocab", Q.Q8_0, None),
              "output_norm.weight": ((D,), Q.F32, "norm"),
              "output.bias": ("vocab_row", Q.F32, "bias")},
         ablate={"biases": lambda m: [m.w.pop(k) for k in list(m.w) if k.endswith(".bias")],
                 "no output bias": lambda m: setattr(m, "out_b", None),
                 "norm rope": lambda m: setattr(m, "neox", False)},
         bad=[("blk.2.ffn_up.weight", None), ("blk.0.attn_q.bias", (NH * HD + 1,))]),
    dict(arch="qwen3", vocab=VENDOR / "ggml-vocab-qwen2.gguf", seed=31, layers=3,
         # head_dim 32 with 4 heads: Q is 128 wide, not embedding_length
         hparams={"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6,
                  "attention.key_length": 32, "attention.value_length": 32},
         layer={**_attn(NH * 32, NKV * 32, (Q.Q8_0, Q.Q8_0, Q.F16, Q.Q4_0)),
                **_ffn(Q.Q5_0, Q.Q5_0, [Q.Q4_K, Q.Q6_K, Q.Q4_K]),
                "attn_q_norm.weight": ((32,), Q.F32, "norm"),
                "attn_k_norm.weight": ((32,), Q.F32, "norm")},
         top={"token_embd.weight": ("vocab", Q.Q5_0, None),
              "output.weight": ("vocab", Q.Q8_0, None),
              "output_norm.weight": ((D,), Q.F32, "norm")},
         ablate={"no q/k norm": lambda m: setattr(m, "qk_norm", False),
                 "norm rope": lambda m: setattr(m, "neox", False)},
         bad=[("blk.1.attn_k_norm.weight", None), ("blk.0.attn_q_norm.weight", (16,))]),
    dict(arch="gemma2", vocab=GEMMA3, seed=41, layers=3,
         # small caps so that they bend the random model's scores and logits;
         # no sliding_window_pattern / rope.freq_base_swa: the defaults (every
         # even layer local, the global base)
         hparams={"rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-6,
                  "attention.key_length": HD, "attention.value_length": HD,
                  "attention.sliding_window": 6, "attn_logit_softcapping": 1.5,
                  "final_logit_softcapping": 4.0},
         layer={**_attn(NH * HD, NKV * HD, (Q.Q5_0, Q.Q5_0, Q.Q8_0, Q.F16)),
                **_ffn(Q.Q4_0, Q.Q4_0, [Q.Q6_K, Q.Q4_K, Q.Q6_K]),
                "post_attention_norm.weight": ((D,), Q.F32, "norm"),
                "post_ffw_norm.weight": ((D,), Q.F32, "norm")},
         top={"token_embd.weight": ("vocab", Q.Q8_0, None),
              "output_norm.weight": ((D,), Q.F32, "norm")},
         ablate={"no attention cap": lambda m: setattr(m, "attn_softcap", 0.0),
                 "no window": lambda m: setattr(m, "local", [False] * m.n_layer),
                 "window on odd layers": lambda m: setattr(m, "local", [False, True, False]),
                 "no final cap": lambda m: setattr(m, "softcap", 0.0)},
         bad=[("blk.1.post_ffw_norm.weight", None),
              ("blk.2.post_attention_norm.weight", (D - 1,))]),
]

COMMON = {"context_length": 512, "embedding_length": D, "feed_forward_length": FF,
          "attention.head_count": NH, "attention.head_count_kv": NKV}


def _present(spec):
    return spec["vocab"].is_file()


def _skip_reason(spec):
    return f"{spec['vocab']} absent (the vendored vocab files / scripts/fetch-model gemma3-270m)"


# ---- writing a file -------------------------------------------------------



def make_tensor(rng, shape, qtype, kind):
    """(array, raw_dtype) for GGUFWriter.add_tensor."""
    if kind == "norm":  # norms near 1, as stored (Gemma's +1 already added)
        return (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32), None
    if kind == "bias":
        return (0.5 * rng.standard_normal(shape)).astype(np.float32), None
    rows, cols = shape
    # unit-variance products inside the blocks; embedding rows of ~0.3 give
    # logits with a standard deviation of a few units (real gaps)
    sigma = 0.3 if rows > 4096 else 1.0 / np.sqrt(cols)
    if qtype in (Q.Q4_K, Q.Q6_K):
        return kquant_bytes(rng, qtype, rows, cols, sigma), qtype
    return stored((rng.standard_normal((rows, cols)) * sigma).astype(np.float32), qtype)


def family_tensors(spec, n_vocab):
    """name -> (array, raw_dtype), deterministic from the spec's seed."""
    rng = np.random.default_rng(spec["seed"])
    out = {}
    for name, (shape, qtype, kind) in spec["top"].items():
        shape = {"vocab": (n_vocab, D), "vocab_row": (n_vocab,)}.get(shape, shape)
        out[name] = make_tensor(rng, shape, qtype, kind)
    for L in range(spec["layers"]):
        for name, (shape, qtype, kind) in spec["layer"].items():
            qt = qtype[L] if isinstance(qtype, list) else qtype
            out[f"blk.{L}.{name}"] = make_tensor(rng, shape, qt, kind)
    return out


def write_family(path, spec, tensors):
    rows, _ = tokenizer_rows(spec["vocab"])
    hp = {"block_count": spec["layers"], **COMMON, **spec["hparams"]}
    return write_gguf(path, spec["arch"], rows, hp, tensors)


_BUILT = {}


def built(spec, tmp_path_factory):
    """(path, tensors, n_vocab) of the family's file, written once."""
    arch = spec["arch"]
    if arch not in _BUILT:
        _, n_vocab = tokenizer_rows(spec["vocab"])
        tensors = family_tensors(spec, n_vocab)
        d = tmp_path_factory.mktemp(f"family_{arch}")
        _BUILT[arch] = (write_family(d / f"{arch}.gguf", spec, tensors), tensors, n_vocab)
    return _BUILT[arch]


def prompts(n_vocab, seed):
    """Random token ids: lengths 3, 11 and 40 (past every window here)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, n_vocab, n)] for n in (3, 11, 40)]


def zinfer_logits(run_zinfer, path, ids, out):
    res = run_zinfer("logits", "--model", path, "--prompt-ids", ids_arg(ids), "--out", out,
                     timeout=300)
    assert res.returncode == 0, f"zinfer logits failed: {res.stderr.strip()}"
    info = last_json(res.stdout)
    raw = np.fromfile(out, dtype="<f4")
    assert raw.size == len(ids) * info["n_vocab"]
    return raw.reshape(len(ids), -1).astype(np.float64)


def _params(specs):
    return [pytest.param(s, id=s["arch"],
                         marks=pytest.mark.skipif(not _present(s), reason=_skip_reason(s)))
            for s in specs]


# Reference logits per (arch, prompt) from the zinfer test, so the llama.cpp
# test does not run the float64 reference again.
_REF = {}


# ---- tests ----------------------------------------------------------------

@pytest.mark.parametrize("spec", _params(FAMILIES))
def test_family_matches_reference(spec, run_zinfer, tmp_path, tmp_path_factory):
    if SANITIZED and spec["arch"] != "qwen2":
        pytest.skip("release build only (the sanitizer build checks qwen2's)")
    path, _, n_vocab = built(spec, tmp_path_factory)
    ref_model = numpy_llama.Model(str(path))
    assert ref_model.arch == spec["arch"]
    totals = {"positions": 0, "argmax_equal": 0, "near_tie_flips": 0}
    ps = prompts(n_vocab, spec["seed"])
    zs = logits_each(run_zinfer, path, ps, [tmp_path / f"{i}.f32" for i in range(len(ps))])
    for i, ids in enumerate(ps):
        ref = ref_model.forward(ids)
        got = zs[i].astype(np.float64)
        assert np.isfinite(got).all(), "non-finite logits"
        kl = numpy_llama.kl(ref, got)
        top2 = np.partition(ref, -2, axis=-1)[:, -2:]
        gap = top2[:, 1] - top2[:, 0]
        flips = np.nonzero(ref.argmax(-1) != got.argmax(-1))[0]
        bad = [int(p) for p in flips if gap[p] >= NEAR_TIE]
        entry = {"n_tokens": len(ids), "zinfer_mean_kl": float(kl.mean()),
                 "zinfer_max_kl": float(kl.max()), "argmax_flips": [int(p) for p in flips]}
        _REF[(spec["arch"], i)] = ref  # for the llama.cpp comparison below
        report("families_logits", f"{spec['arch']}_{len(ids)}", entry)
        print(f"\n{spec['arch']} {len(ids)} tokens: {entry}")
        totals["positions"] += len(ids)
        totals["argmax_equal"] += len(ids) - len(flips)
        totals["near_tie_flips"] += len(flips) - len(bad)
        assert not bad, f"argmax differs from the reference at {bad} (not near-ties)"
        assert kl.mean() < MAX_MEAN_KL_REF, f"mean KL from the reference {kl.mean():.3e}"
    report("families_logits", f"{spec['arch']}_argmax", totals)
    # each difference of the family matters on this file: without it the
    # reference is far from zinfer (on the longest prompt, past the window)
    for what, change in spec["ablate"].items():
        m = copy.copy(ref_model)  # the weights shared; each change is a setattr
        change(m)
        far = float(numpy_llama.kl(m.forward(ids), got).mean())
        print(f"{spec['arch']} reference with {what}: mean KL from zinfer {far:.3e}")
        assert far > 100 * max(float(kl.mean()), 1e-7), (what, far)


@pytest.mark.no_zinfer
@pytest.mark.parametrize("spec", _params(FAMILIES))
def test_family_llamacpp_beside_reference(spec, tmp_path_factory):
    """llama.cpp on the same file, against the same float64 reference: a
    loose bound (it is the less exact engine) and its KL for the report.
    Needs llama-cpp-python (scripts/setup --with-llamacpp); skipped without."""
    llama_cpp = pytest.importorskip("llama_cpp")
    if SANITIZED and spec["arch"] != "qwen2":
        pytest.skip("release build only (the sanitizer build checks qwen2's)")
    path, _, n_vocab = built(spec, tmp_path_factory)
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=128, n_batch=128,
                          n_threads=2, verbose=False)
    ref_model = None
    for i, ids in enumerate(prompts(n_vocab, spec["seed"])):
        ref = _REF.get((spec["arch"], i))
        if ref is None:  # the zinfer test above did not run in this session
            ref_model = ref_model or numpy_llama.Model(str(path))
            ref = ref_model.forward(ids)
        llm.reset()
        llm.eval(ids)
        lc = np.array(llm.scores[: len(ids)], dtype=np.float64)
        entry = {"n_tokens": len(ids), "llamacpp_mean_kl": float(numpy_llama.kl(ref, lc).mean()),
                 "llamacpp_argmax_equal": int((lc.argmax(-1) == ref.argmax(-1)).sum())}
        report("families_logits", f"{spec['arch']}_{len(ids)}_llamacpp", entry)
        assert entry["llamacpp_mean_kl"] < MAX_MEAN_KL_LLAMACPP, entry


def test_gemma2_defaults_and_switches(tmp_path_factory):
    """What the gemma2 reference takes from the keys and the defaults (the
    C side's are unit-tested in test_family_ops): even layers local, the
    global RoPE base on them, the file's caps."""
    if SANITIZED:
        pytest.skip("release build only (a check of the Python reference)")
    spec = next(s for s in FAMILIES if s["arch"] == "gemma2")
    if not _present(spec):
        pytest.skip(_skip_reason(spec))
    path, _, _ = built(spec, tmp_path_factory)
    m = numpy_llama.Model(str(path))
    assert m.local == [True, False, True] and m.window == 6
    assert m.rope_base_swa == m.rope_base == 10000.0
    assert m.attn_softcap == 1.5 and m.softcap == 4.0
    assert m.neox and m.post_norms and m.geglu and not m.qk_norm


def _bad_cases():
    out = []
    for s in FAMILIES:
        for tensor, shape in s["bad"]:
            out.append(pytest.param(s, tensor, shape, id=f"{s['arch']}-{tensor}",
                                    marks=pytest.mark.skipif(not _present(s),
                                                             reason=_skip_reason(s))))
    return out


@pytest.mark.parametrize("spec,tensor,shape", _bad_cases())
def test_missing_or_misshaped_tensor_named(spec, tensor, shape, run_zinfer, tmp_path,
                                           tmp_path_factory):
    if SANITIZED and spec["arch"] != "qwen2":
        pytest.skip("release build only (the sanitizer build checks qwen2's)")
    _, tensors, _ = built(spec, tmp_path_factory)
    t = dict(tensors)
    if shape is None:
        del t[tensor]
    else:
        t[tensor] = (np.zeros(shape, np.float32), None)
    path = write_family(tmp_path / "bad.gguf", spec, t)
    res = run_zinfer("logits", "--model", path, "--prompt-ids", "2,3", "--out", tmp_path / "o")
    err = res.stderr.strip()
    assert 0 < res.returncode < 128, err
    assert len(err.splitlines()) == 1, err
    assert re.search(re.escape(tensor), err), err
    assert ("missing tensor" in err) == (shape is None), err
