"""The float64 reference's mixture-of-experts families against llama.cpp.

For each arch of moe_files.ARCHS (qwen3moe, qwen2moe, mixtral, gpt-oss) the
small random-weight file is written (tests/e2e/moe_files.py) and
scripts/ref/numpy_llama.py's forward pass is compared with llama.cpp's
(llama-cpp-python, logits_all) on three prompts of random token ids (3, 11
and 48 tokens: past gpt-oss's window of 32), so that the reference the C
engine is checked against is itself checked against llama.cpp:

  - mean KL(ref || llama.cpp) < 1e-2 over the prompts' positions without
    a routing near-tie (in some layer the k-th and (k+1)-th router logits
    within 0.1: llama.cpp's slightly different activations may choose the
    other expert there, a different function of the token, and one such
    position can reach a KL of 0.8), and < 0.1 per prompt over all;
  - argmax equal except at near-ties: the reference's top-2 logit gap
    < 0.1 (llama.cpp's Q8_K / Q8_0 activations move logits by a few
    hundredths), or a routing near-tie at that position;
  - routing is not degenerate: on the longest prompt every layer uses at
    least half the experts and the tokens choose many different sets;
  - each ablation (a switch of the reference turned off: renormalization,
    the shared expert, sinks, the clamp, ...) moves the reference far from
    llama.cpp: on the longest prompt's positions without a routing
    near-tie, its mean KL is above 10 x the reference's own and above
    5e-3, so the file exercises that feature.

Numbers go to the e2e report (section moe_reference). Needs
llama-cpp-python (skipped without) and the vendored vocab files.
"""

import copy

import numpy as np
import pytest
from conftest import report
from moe_files import ARCHS, write_moe, yarn_no_magnitude, yarn_off

import numpy_llama

# No zinfer binary here (the reference against llama.cpp): skipped under the
# sanitizers, where it would repeat the release pass (conftest.py).
pytestmark = pytest.mark.no_zinfer

llama_cpp = pytest.importorskip("llama_cpp")

MAX_MEAN_KL = 1e-2  # positions without a routing near-tie
MAX_MEAN_KL_ALL = 1e-1
NEAR_TIE = 0.1  # output logits' top-2 gap
ROUTE_TIE = 0.1  # router logits' gap between the k-th and (k+1)-th expert
ABLATION_FACTOR = 10.0
ABLATION_MIN_KL = 5e-3
LENGTHS = (3, 11, 48)


# name -> a change to a (shallow) copy of the reference Model
ABLATIONS = {
    "qwen3moe": {
        "no renormalization": lambda m: setattr(m, "norm_w", False),
        "no q/k norm": lambda m: setattr(m, "qk_norm", False),
        "normal rope": lambda m: setattr(m, "neox", False),
    },
    "qwen2moe": {
        "renormalized weights": lambda m: setattr(m, "norm_w", True),
        "no shared expert": lambda m: setattr(m, "shexp", False),
        "ungated shared expert": lambda m: setattr(m, "shexp_gate", False),
        "no biases": lambda m: setattr(m, "w", {k: v for k, v in m.w.items()
                                                  if not k.endswith("bias")}),
    },
    "mixtral": {
        "no renormalization": lambda m: setattr(m, "norm_w", False),
        "top-1": lambda m: setattr(m, "n_expert_used", 1),
        "neox rope": lambda m: setattr(m, "neox", True),
    },
    "gpt-oss": {
        "no sinks": lambda m: setattr(m, "sinks", False),
        "unclamped swiglu": lambda m: setattr(m, "swiglu_limit", np.inf),
        "softmax over all experts": lambda m: setattr(m, "gating", "softmax"),
        "no window": lambda m: setattr(m, "local", [False] * m.n_layer),
        "window on odd layers": lambda m: setattr(m, "local", [L % 2 == 1
                                                              for L in range(m.n_layer)]),
        "linear scaling, not yarn": yarn_off,
        "yarn without mscale": yarn_no_magnitude,
        "no expert biases": lambda m: setattr(m, "w", {k: v for k, v in m.w.items()
                                                         if "_exps.bias" not in k}),
    },
}

_BUILT = {}


def built(arch, tmp_path_factory):
    """(path, reference Model, llama.cpp Llama) of the arch's file, once."""
    if arch not in _BUILT:
        path, _ = write_moe(tmp_path_factory.mktemp(f"moe_{arch}") / f"{arch}.gguf", arch)
        ref = numpy_llama.Model(str(path))
        llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=128, n_batch=128,
                              n_threads=2, verbose=False)
        _BUILT[arch] = (path, ref, llm)
    return _BUILT[arch]


def prompts(n_vocab, seed):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, n_vocab, n)] for n in LENGTHS]


def route_ties(routing, k):
    """Positions where some layer's k-th and (k+1)-th router logits are
    within ROUTE_TIE (boolean [n])."""
    tie = None
    for _, _, z in routing:
        if z.shape[1] <= k:
            continue
        zs = -np.sort(-z, axis=-1)
        t = zs[:, k - 1] - zs[:, k] < ROUTE_TIE
        tie = t if tie is None else tie | t
    return tie


def _params():
    return [pytest.param(a, id=a, marks=pytest.mark.skipif(
        not ARCHS[a]["vocab"].is_file(), reason=f"{ARCHS[a]['vocab']} absent "
        "(scripts/fetch-llamacpp-vendor)")) for a in ARCHS]


@pytest.mark.parametrize("arch", _params())
def test_moe_reference_matches_llamacpp(arch, tmp_path_factory):
    path, ref_model, llm = built(arch, tmp_path_factory)
    assert ref_model.moe and ref_model.n_expert == ARCHS[arch]["n_expert"]
    k = ref_model.n_expert_used
    clean_kls = []
    for i, ids in enumerate(prompts(ref_model.n_vocab, ARCHS[arch]["seed"])):
        routing = []
        ref = ref_model.forward(ids, routing=routing)
        llm.reset()
        llm.eval(ids)
        lc = np.array(llm.scores[: len(ids)], dtype=np.float64)
        assert np.isfinite(lc).all()
        kl = numpy_llama.kl(ref, lc)
        top2 = np.partition(ref, -2, axis=-1)[:, -2:]
        gap = top2[:, 1] - top2[:, 0]
        ties = route_ties(routing, k)
        flips = np.nonzero(ref.argmax(-1) != lc.argmax(-1))[0]
        bad = [int(p) for p in flips if gap[p] >= NEAR_TIE and not ties[p]]
        clean = ~ties
        entry = {"n_tokens": len(ids), "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                 "mean_kl_no_route_ties": float(kl[clean].mean()) if clean.any() else None,
                 "route_tie_positions": int(ties.sum()),
                 "argmax_flips": [int(p) for p in flips], "logit_std": float(ref.std(-1).mean())}
        report("moe_reference", f"{arch}_{len(ids)}", entry)
        print(f"\n{arch} {len(ids)} tokens: {entry}")
        assert not bad, f"argmax differs from llama.cpp at {bad} (no near-tie)"
        assert kl.mean() < MAX_MEAN_KL_ALL, entry
        clean_kls.append(kl[clean])
    clean_kl = np.concatenate(clean_kls)
    report("moe_reference", f"{arch}_mean_kl_no_route_ties", float(clean_kl.mean()))
    assert len(clean_kl) >= sum(LENGTHS) // 3 and clean_kl.mean() < MAX_MEAN_KL, (
        len(clean_kl), clean_kl.mean())

    # routing: not one expert set for every token
    for L, (sel, _, _) in enumerate(routing):
        used = len(np.unique(sel))
        sets = len({tuple(sorted(r)) for r in sel})
        assert used >= ref_model.n_expert // 2 and sets >= len(ids) // 4, (L, used, sets)

    # each ablation moves the reference far from llama.cpp (positions
    # without a routing near-tie, where the two route alike)
    base = float(kl[clean].mean())
    far = {}
    for what, change in ABLATIONS[arch].items():
        m = copy.copy(ref_model)  # the weights shared; each change replaces attributes
        change(m)
        far[what] = float(numpy_llama.kl(m.forward(ids), lc)[clean].mean())
        print(f"{arch} reference with {what}: mean KL from llama.cpp {far[what]:.3e}")
    report("moe_reference", f"{arch}_ablations", {"base": base, **far})
    for what, v in far.items():
        assert v > max(ABLATION_FACTOR * base, ABLATION_MIN_KL), (what, v, base)
