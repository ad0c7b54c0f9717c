"""Hybrid recurrent models run by zinfer, without their real weights.

For each hybrid architecture zinfer runs (RUN; tests/e2e/hybrid_files.py
writes the files: a real vocabulary, recurrent and attention layers in
the family's pattern) against scripts/ref/numpy_hybrid.py's float64
reference (itself checked against llama.cpp in test_hybrid_reference.py):
  - 8 prompts of random ids on a file of the real model's per-layer
    shapes (REAL: LFM2-350M's, 1024 wide, 16 heads, 8 KV heads,
    feed-forward 4608; for qwen35 1024 wide as Qwen3.5-0.8B, gated
    attention heads of 256, DeltaNet heads of 128; for granitehybrid
    Granite 4.0-H-1B's / H-Tiny's widths, 1536 wide, 48 Mamba-2 heads of 64
    with a state of 128 in one group, attention 12 heads of 128 with 4 KV
    heads, no RoPE; 4 layers each, in the family's pattern): mean KL(ref || zinfer) < 1e-4 per prompt
    and below llama.cpp's own, the argmax equal except at near-ties (top-2
    gap < 0.01); on the small test file (256 wide), one prompt of 2,100
    tokens run in passes of 512 (the state carried across them);
  - 64 greedy tokens equal the reference's (small file), except after a
    near-tie;
  - batch invariance: every position's logits are bit-identical in one
    pass, in passes of 7 and one token per pass; served, 16 prompts at
    once each get the tokens they get alone, and a prompt cut into chunks
    beside running streams gets the tokens it gets alone;
  - a file with a recurrent layer's tensor missing or an inconsistent
    layer pattern is refused with one line naming it.
Numbers go to the e2e report (section hybrid_logits).
"""

import os
import re

import numpy as np
import pytest
from conftest import (ids_arg, kv_when, last_json, llamacpp_logits, logits_each, report,
                      serve_process)
from hybrid_files import ARCHS, write_hybrid
from zinfer_client import Client

import numpy_hybrid
import refcache

SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"
NEAR_TIE = 0.01
MAX_MEAN_KL_REF = 1e-4
N_GREEDY = 64
LONG = 2100

# The architectures zinfer runs (hybrid_files.ARCHS may hold more).
RUN = ["lfm2", "qwen35", "granitehybrid"]

# The real models' per-layer shapes (the layer pattern and count stay the
# test file's); the sanitizer build keeps the small default.
REAL = {"lfm2": dict(n_embd=1024, n_head=16, n_head_kv=8, head_dim=64, n_ff=4608),
        # Qwen3.5-0.8B's width (llama.cpp's size table); its heads as the
        # family's larger files have them (attention head_dim 256, 2 KV
        # heads; DeltaNet heads of 128)
        "qwen35": dict(n_embd=1024, n_head=8, n_head_kv=2, head_dim=256, n_ff=3584,
                       d_state=128, n_group=8, n_ssm_head=16, rope_dim=64,
                       rope_sections=(11, 11, 10, 0)),
        # Granite 4.0-H-1B's widths (H-Tiny's too, which has experts
        # instead of the dense feed-forward): d_inner = 2 n_embd as
        # llama.cpp requires, P = 64, N = 128, G = 1; the separate output
        # head's spread as the small file's (logits / logit_scale of std ~2)
        "granitehybrid": dict(n_embd=1536, n_head=12, n_head_kv=4, head_dim=128, n_ff=4096,
                              d_inner=3072, d_state=128, n_group=1, n_ssm_head=48,
                              out_sigma=2.0 * 6.0 / np.sqrt(1536))}


def _params(archs):
    return [pytest.param(a, id=a, marks=pytest.mark.skipif(
        not ARCHS[a]["vocab"].is_file(), reason="llama.cpp's vendored vocab files are absent "
        "(scripts/fetch-llamacpp-vendor)")) for a in archs]


_BUILT = {}
_LAST = {}  # arch -> (ids, reference logits, zinfer's KL) of the last prompt compared


@pytest.fixture(scope="module", params=_params(RUN))
def arch(request):
    """The architecture under test. Module-scoped, so pytest runs one
    architecture's tests together and the float64 reference of the one
    before can go (three real-width ones held 11.6 GB)."""
    _BUILT.clear()
    _LAST.clear()
    return request.param


def built(arch, tmp_path_factory, real=not SANITIZED):
    """(path, reference model) of the arch's file, made once."""
    key = (arch, real)
    if key not in _BUILT:
        d = tmp_path_factory.mktemp(f"hybrid_{arch}")
        path, _ = write_hybrid(d / f"{arch}.gguf", arch, **(REAL[arch] if real else {}))
        _BUILT[key] = (path, numpy_hybrid.Model(str(path)))
    return _BUILT[key]


def prompts(n_vocab, seed, n=8):
    rng = np.random.default_rng(seed)
    lens = np.linspace(2, 48, n).astype(int)
    return [[int(t) for t in rng.integers(0, n_vocab, k)] for k in lens]


def zinfer_logits(run_zinfer, path, ids, out, *extra):
    res = run_zinfer("logits", "--model", path, "--prompt-ids", ids_arg(ids), "--out", out,
                     *extra, timeout=600)
    assert res.returncode == 0, f"zinfer logits failed: {res.stderr.strip()}"
    info = last_json(res.stdout)
    raw = np.fromfile(out, dtype="<f4")
    assert raw.size == info["rows_written"] * info["n_vocab"]
    return raw.reshape(info["rows_written"], -1)


def _check(ref, got, what):
    """Mean KL and the argmax flips (near-ties only) of got against ref."""
    assert np.isfinite(got).all(), f"{what}: non-finite logits"
    kl = numpy_hybrid.kl(ref, got)
    top2 = np.partition(ref, -2, axis=-1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    flips = np.nonzero(ref.argmax(-1) != got.argmax(-1))[0]
    bad = [int(p) for p in flips if gap[p] >= NEAR_TIE]
    assert not bad, f"{what}: argmax differs at {bad} (not near-ties)"
    assert kl.mean() < MAX_MEAN_KL_REF, f"{what}: mean KL {kl.mean():.3e}"
    return float(kl.mean()), len(flips)


def test_hybrid_matches_reference(arch, run_zinfer, tmp_path, tmp_path_factory):
    path, ref_model = built(arch, tmp_path_factory)
    n_vocab = ref_model.n_vocab
    kls, flips = [], 0
    ps = prompts(n_vocab, ARCHS[arch]["seed"])
    zs = logits_each(run_zinfer, path, ps, [tmp_path / f"{i}.f32" for i in range(len(ps))],
                     timeout=600)
    for i, ids in enumerate(ps):
        ref = ref_model.forward(ids)
        got = zs[i].astype(np.float64)
        kl, f = _check(ref, got, f"prompt {i}")
        kls.append(kl)
        flips += f
    entry = {"prompts": len(kls), "zinfer_mean_kl": float(np.mean(kls)),
             "zinfer_max_prompt_kl": max(kls), "near_tie_flips": flips,
             "zinfer_last_prompt_kl": kls[-1], "shape": "real" if not SANITIZED else "small"}
    report("hybrid_logits", arch, entry)
    print(f"\n{arch}: {entry}")
    _LAST[arch] = (ids, ref, kls[-1])
    # the reference without the state carried from earlier tokens is far
    # from zinfer: the file exercises the recurrence
    half = len(ids) // 2

    def dropped():
        st = ref_model.new_state()
        ref_model.forward(ids[:half], st)
        ref_model.drop_recurrent_state(st)
        return ref_model.forward(ids[half:], st)

    # kept with the references' outputs: only it would load the real-width
    # weights (~15 s) on a run whose references all come from the cache
    far_ref = refcache.cached("test_hybrids.dropped_state",
                              (refcache.file_sha256(path), ids, half), dropped)
    far = float(numpy_hybrid.kl(far_ref, got[half:]).mean())
    assert far > 100 * max(kls[-1], 1e-7), far


def test_hybrid_llamacpp_further_from_reference(arch, tmp_path_factory):
    """llama.cpp on the same file and prompt (test_hybrid_matches_reference's
    last) is further from the float64 reference than zinfer."""
    pytest.importorskip("llama_cpp")
    if arch not in _LAST:
        pytest.skip("test_hybrid_matches_reference did not run for this arch")
    path, _ = built(arch, tmp_path_factory)
    ids, ref, zkl = _LAST[arch]
    lc, = llamacpp_logits(path, [ids], n_ctx=128, n_batch=128, n_threads=2)
    lkl = float(numpy_hybrid.kl(ref, lc).mean())
    report("hybrid_logits", f"{arch}_llamacpp", {"llamacpp_last_prompt_kl": lkl,
                                                 "zinfer_last_prompt_kl": zkl})
    assert zkl < lkl, (zkl, lkl)


def test_hybrid_long_prompt(arch, run_zinfer, tmp_path, tmp_path_factory):
    """2,100 tokens in passes of 512: the last 32 positions' logits (on
    the small file: the recurrence over many passes is what is checked,
    and the reference's cost grows with the width)."""
    if SANITIZED:
        pytest.skip("release build only (the reference's 2,100 positions)")
    path, ref_model = built(arch, tmp_path_factory, real=False)
    ids = [int(t) for t in np.random.default_rng(5).integers(0, ref_model.n_vocab, LONG)]

    def last_logits():
        h = ref_model.forward(ids, chunk=300, hidden=True)[-32:]
        ref = h @ ref_model.out_w.T
        if ref_model.logit_scale:  # granitehybrid divides its logits
            ref = ref / ref_model.logit_scale
        return ref

    # cached whole: the output head (out_w) would load the weights
    ref = refcache.cached("test_hybrids.long_last_32", (refcache.file_sha256(path), ids),
                          last_logits)
    got = zinfer_logits(run_zinfer, path, ids, tmp_path / "long.f32", "--last", "32",
                        "--batch-size", "512").astype(np.float64)
    kl, flips = _check(ref, got, "long prompt")
    report("hybrid_logits", f"{arch}_long", {"tokens": LONG, "mean_kl_last_32": kl,
                                             "near_tie_flips": flips})


def test_hybrid_greedy_matches_reference(arch, run_zinfer, tmp_path_factory):
    if SANITIZED:
        pytest.skip("release build only (the Python reference's 64 steps)")
    path, ref_model = built(arch, tmp_path_factory, real=False)
    ids = prompts(ref_model.n_vocab, ARCHS[arch]["seed"] + 7, n=1)[0][:12]
    want, gaps = ref_model.greedy(ids, N_GREEDY)
    res = run_zinfer("generate", "--model", path, "--prompt-ids", ids_arg(ids), "--max-tokens",
                     str(N_GREEDY), "--ignore-eos", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    got = last_json(res.stdout)["token_ids"]
    assert len(got) == N_GREEDY
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    report("hybrid_logits", f"{arch}_greedy", {"tokens": N_GREEDY, "first_difference": first,
                                               "gap_there": None if first is None else gaps[first]})
    if first is not None:  # only where the reference itself nearly tied
        assert gaps[first] < NEAR_TIE, (first, gaps[first], want, got)


def test_hybrid_batch_invariant_logits(arch, run_zinfer, tmp_path, tmp_path_factory):
    """One pass of 40 tokens, passes of 7 (the state carried between
    them) and one token per pass give bit-identical logits."""
    path, ref_model = built(arch, tmp_path_factory, real=False)
    ids = prompts(ref_model.n_vocab, 11)[-1][:40]
    outs = [zinfer_logits(run_zinfer, path, ids, tmp_path / f"b{bs}.f32", "--batch-size", str(bs))
            for bs in (512, 7, 1)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def _generate(c, prompt, sp):
    rid = c.send({"op": "generate", "prompt": prompt, "sampling_params": sp})
    toks = []
    for ev in c.events(rid):
        toks.extend(ev.get("token_ids", []))
    return toks


def test_hybrid_served_batch_invariance(arch, zinfer_bin, tmp_path, tmp_path_factory):
    """16 different prompts at once on one worker, each in its own state
    slot: each gets the tokens it gets alone (greedy); then a long prompt
    cut into chunks of 16 beside the 15 others decoding gets the tokens it
    got alone too, and a slot reused by a new request starts from an empty
    state."""
    path, ref_model = built(arch, tmp_path_factory, real=False)
    rng = np.random.default_rng(17)
    ps = [[int(t) for t in rng.integers(0, ref_model.n_vocab, 6 + 2 * i)] for i in range(16)]
    ps[0] = [int(t) for t in rng.integers(0, ref_model.n_vocab, 150)]
    sp = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    with serve_process(zinfer_bin, path, tmp_path / "serve.log", "--slots", "16",
                       "--prefill-chunk", "16") as srv:
        with Client(srv.addr, timeout_s=120) as c:
            alone = [_generate(c, p, sp) for p in ps]
            rids = [c.send({"op": "generate", "prompt": p, "sampling_params": sp})
                    for p in ps[::-1]]
            together = []
            for rid in rids:
                toks = []
                for ev in c.events(rid):
                    toks.extend(ev.get("token_ids", []))
                together.append(toks)
            again = _generate(c, ps[3], sp)
    assert all(len(t) == 12 for t in alone), alone
    assert together[::-1] == alone
    assert again == alone[3]
    want, _ = ref_model.greedy(ps[5], 12)
    assert alone[5][: len(want)] == want


def test_hybrid_multiturn_prefix_resume(arch, zinfer_bin, tmp_path, tmp_path_factory):
    """A conversation of 6 turns, each prompt the last one plus its reply
    plus new tokens: with the prefix cache each turn resumes from a state
    checkpoint (prefix hits counted) and gets the tokens it gets on a
    server without the cache; first tokens come sooner."""
    path, ref_model = built(arch, tmp_path_factory, real=False)
    n_vocab = ref_model.n_vocab
    sp = {"temperature": 0.0, "max_new_tokens": 9, "ignore_eos": True}
    runs = {}
    for mode in ("cache", "nocache"):
        extra = () if mode == "cache" else ("--no-prefix-cache",)
        rng = np.random.default_rng(23)
        prompt, outs, kv = [int(t) for t in rng.integers(0, n_vocab, 70)], [], None
        with serve_process(zinfer_bin, path, tmp_path / f"{mode}.log", "--slots", "2",
                           *extra) as srv:
            with Client(srv.addr, timeout_s=120) as c:
                for turn in range(6):
                    out = _generate(c, prompt, sp)
                    outs.append(out)
                    prompt = prompt + out + [int(t) for t in rng.integers(0, n_vocab, 5)]
                kv = kv_when(c, lambda kv: mode == "nocache" or kv["prefix_hit_tokens"] >= 5 * 64)
        runs[mode] = (outs, kv)
    assert runs["cache"][0] == runs["nocache"][0]
    kv = runs["cache"][1]
    # every turn after the first resumes past its predecessor's prompt
    assert kv["prefix_hit_tokens"] >= 5 * 64, kv
    assert runs["nocache"][1]["prefix_hit_tokens"] == 0, runs["nocache"][1]
    report("hybrid_logits", f"{arch}_multiturn", {"turns": 6, "prefix_hit_tokens":
                                                  kv["prefix_hit_tokens"]})


def test_hybrid_served_features(arch, zinfer_bin, run_zinfer, tmp_path, tmp_path_factory):
    """A hybrid with everything else the server does: two workers, the
    prefix cache (resumed from state checkpoints), speculation asked for
    (off for a hybrid: the worker says so, the tokens are unchanged), a
    regex-constrained request, and a worker killed mid-stream. Greedy
    tokens equal `zinfer generate`'s throughout."""
    from served_checks import check_regex, run_all, run_killing_a_worker
    from test_failover import collect
    if SANITIZED:
        pytest.skip("release build only")
    path, ref_model = built(arch, tmp_path_factory, real=False)
    rng = np.random.default_rng(29)
    base = [int(t) for t in rng.integers(0, ref_model.n_vocab, 40)]
    ps = [base + [int(t) for t in rng.integers(0, ref_model.n_vocab, 6)] * 3 for _ in range(6)]
    sp = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}
    want = []
    for p in ps[:2]:
        res = run_zinfer("generate", "--model", path, "--prompt-ids", ids_arg(p), "--max-tokens",
                         "16", "--ignore-eos", "--json", timeout=300)
        assert res.returncode == 0, res.stderr
        want.append(last_json(res.stdout)["token_ids"])
    with serve_process(zinfer_bin, path, tmp_path / "serve.log", "--spec-lookup", "--slots", 6,
                       "--threads-per-worker", 1, "--heartbeat-timeout", 1500,
                       "--failover-timeout", 30000, workers=2) as srv:
        with Client(srv.addr, timeout_s=120) as c:
            first, fins = run_all(c, ps, sp)
            assert all(f["event"] == "final" for f in fins), fins
            assert first[:2] == want
            again, _ = run_all(c, ps, sp)  # from the checkpoints of the first round
            assert again == first
            kv = kv_when(c, lambda kv: kv["prefix_hit_tokens"] > 0)
            assert kv["prefix_hit_tokens"] > 0 and kv["spec_drafted"] == 0, kv
            check_regex(c, ps[0])
            # an embedding request beside streaming generations is refused
            # alone (a hybrid has no embeddings): the generations go on
            rids = [c.send({"op": "generate", "prompt": p, "sampling_params": sp}) for p in ps]
            erid = c.send({"op": "embed", "input": [ps[0][:8]]})
            got = collect(c, rids + [erid])
            fin = got[erid][2]
            assert fin["event"] == "error" and "hybrid" in fin["message"], fin
            assert [got[r][0] for r in rids] == first
            killed, fins = run_killing_a_worker(c, srv, ps, sp)
        assert "speculation is off" in srv.log()
    assert killed == first
    assert all(f["event"] == "final" for f in fins)


def _bad_files():
    """(id, write_hybrid overrides, the key or tensor the error must name)."""
    return [
        ("missing-conv", dict(drop=("blk.1.shortconv.conv.weight",)),
         "blk.1.shortconv.conv.weight"),
        ("missing-in-proj", dict(drop=("blk.3.shortconv.in_proj.weight",)),
         "blk.3.shortconv.in_proj.weight"),
        ("pattern-length", dict(extra={"attention.head_count_kv": [0, 0, 2]}),
         "lfm2.attention.head_count_kv"),
        ("pattern-kv-differ", dict(layers="rara", extra={"attention.head_count_kv": [0, 2, 0, 4]}),
         "lfm2.attention.head_count_kv"),
        ("no-l-cache", dict(extra={"shortconv.l_cache": 1}), "lfm2.shortconv.l_cache"),
        # an attention layer's tensors where the pattern says recurrent
        ("pattern-vs-tensors", dict(extra={"attention.head_count_kv": [0, 0, 0, 2]}),
         "blk.2.shortconv.conv.weight"),
        ("no-attention-layer", dict(extra={"attention.head_count_kv": [0, 0, 0, 0]}),
         "lfm2.attention.head_count_kv"),
    ]


def _bad_qwen35():
    return [
        ("missing-gate", dict(drop=("blk.0.attn_gate.weight",)), "blk.0.attn_gate.weight"),
        ("missing-a", dict(drop=("blk.1.ssm_a",)), "blk.1.ssm_a"),
        ("missing-conv", dict(drop=("blk.2.ssm_conv1d.weight",)), "blk.2.ssm_conv1d.weight"),
        ("heads-indivisible", dict(extra={"ssm.group_count": 3}), "qwen35.ssm.time_step_rank"),
        ("pattern-length", dict(extra={"attention.recurrent_layers": [True, False]}),
         "qwen35.attention.recurrent_layers"),
        ("pattern-vs-tensors",
         dict(extra={"attention.recurrent_layers": [True, False, True, False]}),
         "blk.1.attn_q_norm.weight"),
        ("rope-e-section", dict(extra={"rope.dimension_sections": [2, 2, 2, 2]}),
         "qwen35.rope.dimension_sections"),
        ("no-attention-layer",
         dict(extra={"attention.recurrent_layers": [True, True, True, True]}),
         "attention.recurrent_layers"),
    ]


def _bad_granite():
    # the small file's pattern is [ssm, ssm, attn, ssm] (rrar)
    return [
        ("missing-conv-bias", dict(drop=("blk.0.ssm_conv1d.bias",)), "blk.0.ssm_conv1d.bias"),
        ("missing-d", dict(drop=("blk.3.ssm_d",)), "blk.3.ssm_d"),
        ("missing-norm", dict(drop=("blk.1.ssm_norm.weight",)), "blk.1.ssm_norm.weight"),
        ("heads-indivisible", dict(extra={"ssm.group_count": 3}),
         "granitehybrid.ssm.time_step_rank"),
        ("experts", dict(extra={"expert_count": 4}), "granitehybrid.expert_count"),
        ("pattern-length", dict(extra={"attention.head_count_kv": [0, 0, 2]}),
         "granitehybrid.attention.head_count_kv"),
        # the pattern says recurrent where the file has attention, and back
        ("pattern-vs-tensors", dict(extra={"attention.head_count_kv": [0, 0, 0, 2]}),
         "blk.2.ssm_conv1d.weight"),
        ("no-attention-layer", dict(extra={"attention.head_count_kv": [0, 0, 0, 0]}),
         "granitehybrid.attention.head_count_kv"),
        ("pattern-vs-tensors-attn", dict(extra={"attention.head_count_kv": [0, 2, 2, 0]}),
         "blk.1.attn_output.weight"),
    ]


@pytest.mark.parametrize("arch,case,kw,name",
                         [pytest.param("lfm2", *c, id=f"lfm2-{c[0]}") for c in _bad_files()] +
                         [pytest.param("qwen35", *c, id=f"qwen35-{c[0]}") for c in _bad_qwen35()] +
                         [pytest.param("granitehybrid", *c, id=f"granitehybrid-{c[0]}")
                          for c in _bad_granite()])
def test_hybrid_bad_file_named(arch, case, kw, name, run_zinfer, tmp_path):
    if not ARCHS[arch]["vocab"].is_file():
        pytest.skip("vocab files absent")
    path, _ = write_hybrid(tmp_path / "bad.gguf", arch, **kw)
    res = run_zinfer("logits", "--model", path, "--prompt-ids", "2,3", "--out", tmp_path / "o")
    err = res.stderr.strip()
    assert 0 < res.returncode < 128, err
    assert len(err.splitlines()) == 1, err
    assert re.search(re.escape(name), err), err
