"""The float64 reference's hybrid recurrent families against llama.cpp.

For each arch of hybrid_files.ARCHS (lfm2, granitehybrid, qwen35) the small
random-weight file is written (tests/e2e/hybrid_files.py) and
scripts/ref/numpy_hybrid.py's forward pass is compared with llama.cpp's
(llama-cpp-python, logits_all) on three prompts of random token ids (3, 11
and 48 tokens), so that the reference the C engine is checked against is
itself checked against llama.cpp:

  - mean KL(ref || llama.cpp) < 1e-3 per prompt (F16 matrices, Q8_0
    embeddings: llama.cpp is ~7e-5 off float64 here);
  - argmax equal except at near-ties (the reference's top-2 gap < 0.1);
  - on an all-F32 variant of the file the two agree to a mean KL < 1e-6
    (~1e-8 measured: what is left is llama.cpp's float32 and F16 KV cache),
    so the reference is the same function as llama.cpp's, not just close;
  - llama.cpp prefilling the longest prompt in ubatches of 8 (its state
    carried across them) agrees with the reference as well as in one batch;
  - each ablation (a feature of the reference turned off: the conv, a gate,
    the state carried from token to token, a scale, the head mapping, ...)
    moves the reference far from llama.cpp on the longest prompt's last 24
    positions: mean KL above 10 x the reference's own and above 1e-3;
    among them "state dropped between chunks": the first 24 tokens
    prefilled, the conv tails and recurrent states zeroed (KV kept), the
    rest continued;
  - the reference's own state semantics, which the C state cache must
    have: one pass == three chunks carrying the state == token by token
    (the recurrences written per token, against the chunked matrix forms),
    to 1e-9.

Numbers go to the e2e report (section hybrid_reference). Needs
llama-cpp-python (skipped without) and the vendored vocab files.
"""

import copy

import gguf
import numpy as np
import pytest
from conftest import report
from hybrid_files import ARCHS, write_hybrid

import numpy_hybrid

# No zinfer binary here (the reference against llama.cpp): skipped under the
# sanitizers, where it would repeat the release pass (conftest.py).
pytestmark = pytest.mark.no_zinfer

llama_cpp = pytest.importorskip("llama_cpp")

MAX_MEAN_KL = 1e-3
MAX_MEAN_KL_F32 = 1e-6
NEAR_TIE = 0.1
ABLATION_FACTOR = 10.0
ABLATION_MIN_KL = 1e-3
LENGTHS = (3, 11, 48)
SPLIT = 24  # the state-drop ablation's first chunk
UBATCH = 8  # llama.cpp's chunked prefill


def _drop_state_between_chunks(m, ids):
    st = m.new_state()
    first = m.forward(ids[:SPLIT], st)
    m.drop_recurrent_state(st)
    return np.concatenate([first, m.forward(ids[SPLIT:], st)])


def _set(**changes):
    return lambda m, ids: numpy_hybrid.ablated(m, **changes).forward(ids)


# name -> f(reference Model, ids) -> logits of a changed reference
ABLATIONS = {
    "lfm2": {
        "conv without its past": _set(conv=False),
        "no B gate": _set(b_gate=False),
        "no C gate": _set(c_gate=False),
        "no q/k norm": _set(qk_norm=False),
        "normal rope": _set(neox=False),
        "state dropped between chunks": _drop_state_between_chunks,
    },
    "granitehybrid": {
        "conv without its past": _set(conv=False),
        "no state carry": _set(carry=False),
        "no D skip": _set(ssm_D=False),
        "no z gate": _set(z_gate=False),
        "one norm group": _set(norm_groups=1),
        "no residual scale": _set(res_scale=0.0),
        "no embedding scale": _set(emb_scale=0.0),
        "attention scale 1/sqrt(head_dim)": _set(attn_scale=0.0),
        "rope": _set(rope=True),
        "state dropped between chunks": _drop_state_between_chunks,
    },
    "qwen35": {
        "conv without its past": _set(conv=False),
        "no state carry": _set(carry=False),
        "no q/k L2 norm": _set(l2_norm=False),
        "beta 1": _set(beta=False),
        "no decay": _set(decay=False),
        "no output gate": _set(out_gate=False),
        "no attention gate": _set(attn_gate=False),
        "key heads interleaved": _set(kv_heads_tiled=False),
        "rope on the whole head": lambda m, ids: numpy_hybrid.ablated(
            m, rope_dim=m.head_dim, imrope=False).forward(ids),
        "state dropped between chunks": _drop_state_between_chunks,
    },
}

_BUILT = {}


def _llama(path, n_batch=128, n_ubatch=None):
    return llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=128, n_batch=n_batch,
                           n_ubatch=n_ubatch or n_batch, n_threads=2, verbose=False)


def built(arch, tmp_path_factory):
    """(path, reference Model, llama.cpp Llama) of the arch's file, once."""
    if arch not in _BUILT:
        path, _ = write_hybrid(tmp_path_factory.mktemp(f"hybrid_{arch}") / f"{arch}.gguf", arch)
        _BUILT[arch] = (path, numpy_hybrid.Model(str(path)), _llama(path))
    return _BUILT[arch]


def prompts(n_vocab, seed):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, n_vocab, n)] for n in LENGTHS]


def llama_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    lc = np.array(llm.scores[: len(ids)], dtype=np.float64)
    assert np.isfinite(lc).all()
    return lc


def _params():
    return [pytest.param(a, id=a, marks=pytest.mark.skipif(
        not ARCHS[a]["vocab"].is_file(), reason=f"{ARCHS[a]['vocab']} absent "
        "(scripts/fetch-llamacpp-vendor)")) for a in ARCHS]


@pytest.mark.parametrize("arch", _params())
def test_hybrid_reference_matches_llamacpp(arch, tmp_path_factory):
    path, ref_model, llm = built(arch, tmp_path_factory)
    assert "a" in ref_model.kinds and "r" in ref_model.kinds, ref_model.kinds
    for ids in prompts(ref_model.n_vocab, ARCHS[arch]["seed"]):
        ref = ref_model.forward(ids)
        lc = llama_logits(llm, ids)
        kl = numpy_hybrid.kl(ref, lc)
        top2 = np.partition(ref, -2, axis=-1)[:, -2:]
        gap = top2[:, 1] - top2[:, 0]
        flips = np.nonzero(ref.argmax(-1) != lc.argmax(-1))[0]
        bad = [int(p) for p in flips if gap[p] >= NEAR_TIE]
        entry = {"n_tokens": len(ids), "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                 "argmax_flips": [int(p) for p in flips],
                 "flip_gaps": [round(float(gap[p]), 4) for p in flips],
                 "logit_std": float(ref.std(-1).mean())}
        report("hybrid_reference", f"{arch}_{len(ids)}", entry)
        print(f"\n{arch} {len(ids)} tokens: {entry}")
        assert not bad, f"argmax differs from llama.cpp at {bad} (no near-tie)"
        assert kl.mean() < MAX_MEAN_KL, entry

    # llama.cpp prefilling in ubatches of UBATCH: its state carried across them
    chunked = _llama(path, n_batch=UBATCH)
    kl_chunked = float(numpy_hybrid.kl(ref, llama_logits(chunked, ids)).mean())
    del chunked
    report("hybrid_reference", f"{arch}_ubatch{UBATCH}_mean_kl", kl_chunked)
    print(f"{arch} llama.cpp in ubatches of {UBATCH}: mean KL {kl_chunked:.2e}")
    assert kl_chunked < MAX_MEAN_KL, kl_chunked

    # each ablation moves the reference far from llama.cpp, on the positions
    # after SPLIT (those the state-drop ablation changes; KL over a 150k
    # vocabulary is most of the cost)
    base = float(kl[SPLIT:].mean())
    lq = numpy_hybrid.log_softmax(lc[SPLIT:])
    far = {}
    for what, run in ABLATIONS[arch].items():
        lp = numpy_hybrid.log_softmax(run(ref_model, ids)[SPLIT:])
        far[what] = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
        print(f"{arch} reference with {what}: mean KL from llama.cpp {far[what]:.3e}")
    report("hybrid_reference", f"{arch}_ablations", {"base": base, **far})
    for what, v in far.items():
        assert v > max(ABLATION_FACTOR * base, ABLATION_MIN_KL), (what, v, base)


@pytest.mark.parametrize("arch", _params())
def test_hybrid_reference_exact_on_f32(arch, tmp_path):
    """All tensors F32: llama.cpp computes in float32 throughout (but its
    F16 KV cache), so what is left is rounding."""
    types = dict.fromkeys(ARCHS[arch]["types"], gguf.GGMLQuantizationType.F32)
    path, _ = write_hybrid(tmp_path / f"{arch}_f32.gguf", arch, types=types)
    m = numpy_hybrid.Model(str(path))
    ids = prompts(m.n_vocab, ARCHS[arch]["seed"] + 1)[1]
    kl = numpy_hybrid.kl(m.forward(ids), llama_logits(_llama(path), ids))
    report("hybrid_reference", f"{arch}_f32_mean_kl", float(kl.mean()))
    print(f"\n{arch} all-F32 file: mean KL {kl.mean():.2e}, max {kl.max():.2e}")
    assert kl.mean() < MAX_MEAN_KL_F32, kl.mean()


@pytest.mark.parametrize("arch", _params())
def test_hybrid_reference_state_semantics(arch, tmp_path_factory):
    """One pass == chunks carrying the state == token by token."""
    _, m, _ = built(arch, tmp_path_factory)
    ids = prompts(m.n_vocab, ARCHS[arch]["seed"] + 2)[2][:30]
    one = m.forward(ids)
    st = m.new_state()
    parts = np.concatenate([m.forward(ids[:13], st), m.forward(ids[13:14], st),
                            m.forward(ids[14:], st)])
    assert st["n"] == len(ids)
    step_st = m.new_state()
    step = m.forward_stepwise(ids, step_st)
    scale = np.abs(one).max()
    d_parts, d_step = np.abs(one - parts).max() / scale, np.abs(one - step).max() / scale
    report("hybrid_reference", f"{arch}_state_semantics", {"chunks": float(d_parts),
                                                             "stepwise": float(d_step)})
    assert d_parts < 1e-9 and d_step < 1e-9, (d_parts, d_step)
    # the two paths leave the same state behind
    for a, b in zip(st["layers"], step_st["layers"]):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-9, atol=1e-9)
    # and the state is what a cache must hold: continuing from a copy of it
    # equals continuing the original
    more = prompts(m.n_vocab, ARCHS[arch]["seed"] + 3)[1]
    cont = m.forward(more, copy.deepcopy(st))
    again = m.forward(ids + more)[len(ids):]
    np.testing.assert_allclose(cont, again, rtol=0, atol=1e-9 * scale)
