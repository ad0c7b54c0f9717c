"""Small deterministic hybrid recurrent GGUF files for the end-to-end tests.

write_hybrid(path, arch, seed=None, **overrides) writes a random-weight file
of one of ARCHS, with the hyper-parameter keys and tensor names llama.cpp
reads for that architecture (src/models/lfm2.cpp, granite-hybrid.cpp,
qwen35.cpp) and a real vocabulary's tokenizer keys (llama.cpp's vendored
ggml-vocab-*.gguf):

  lfm2           LiquidAI LFM2: double-gated short convolutions (in_proj to
                 B, C, x; C * conv(B * x); L_cache 3) and GQA attention
                 layers with per-head Q/K RMS norms, NEOX RoPE; the layer
                 kind from attention.head_count_kv[l] (0: conv layer); the
                 output norm is named token_embd_norm; tied output head.
                 4 layers [conv, conv, attn, conv] (LFM2-350M's first four).
                 Vocabulary: llama-bpe's (LFM2's own 65536-token byte-level
                 BPE is not vendored; llama-bpe is the nearest: byte-level
                 BPE with the same kind of pre-tokenizer).
  granitehybrid  IBM Granite 4.0-H: Mamba-2 layers (ssm_in to z, xBC, dt;
                 causal conv with bias + silu; scan with softplus(dt + dt_b),
                 A = ssm_a, D = ssm_d; silu(z) gate; grouped RMS norm) and
                 NoPE attention layers (rope.scaling.finetuned false, as the
                 converter writes for Granite 4), layer kind from
                 head_count_kv[l]; embedding/residual/attention/logit scales.
                 4 layers [ssm, ssm, attn, ssm]; 2 SSM groups (the real
                 files have 1: 2 exercises the group mapping and the
                 grouped norm). Vocabulary: llama-bpe's (Granite 4's 100k
                 cl100k-style BPE is not vendored; llama-bpe has the same
                 pre-tokenizer). An untied output.weight (sized so that the
                 logit scale leaves logits of std ~2).
  qwen35         Qwen3.5: gated DeltaNet layers (attn_qkv to q, k, v through
                 a causal conv + silu; L2-normed q/k; beta = sigmoid(ssm_beta
                 x), g = softplus(ssm_alpha x + dt_b) * ssm_a; the gated delta
                 rule; RMS norm * silu(attn_gate x)) and gated full attention
                 layers (attention.recurrent_layers false; the converter
                 also writes full_attention_interval, llama.cpp's fallback)
                 (Q and a sigmoid gate
                 from one attn_q, per-head Q/K norms, interleaved M-RoPE on
                 rope.dimension_count of head_dim, sections from
                 rope.dimension_sections); post_attention_norm before the
                 FFN; tied output head. 4 layers [delta, delta, delta, attn]
                 (interval 4, as the real files); 2 key heads and 4 value
                 heads (value head h reads key head h % 2, as llama.cpp
                 maps them). Vocabulary: the vendored qwen35 one.

Dimensions: n_embd 256, head_dim 64, n_ff 512 to 768. Tensor types as
the F16 releases store them: F32 norms, conv kernels, SSM vectors (A, D,
dt bias) and the small ssm_alpha / ssm_beta; F16 matrices; Q8_0 embeddings
and output head (drawn as bytes: the vocabularies have 128k-152k rows).
F16 rather than Q8_0 matrices because llama.cpp quantizes the activations
of a Q8_0 product to Q8_0, which moves it ~50x further from float64 (mean
KL ~3e-3 instead of ~7e-5 here) and blurs the comparison. types=
overrides make the Q8_0 variant, or an all-F32 file
(types=dict.fromkeys(ARCHS[arch]["types"], Q.F32)), on which llama.cpp and
the float64 reference agree to a mean KL of ~1e-8. Weights are scaled
for O(1) activations and output logits of standard deviation ~2; the SSM
decays and step sizes are drawn so that the recurrences remember a few to
tens of tokens.

  path, tensors = write_hybrid(tmp / "q.gguf", "qwen35")
  write_hybrid(p, "lfm2", n_layer=6)
  write_hybrid(p, "granitehybrid", drop=("blk.0.ssm_a",))
  write_hybrid(p, "qwen35", layers="rara")   # attention.recurrent_layers
  write_hybrid(p, "qwen35", recurrent_layers_key=False, full_attention_interval=2)
  write_hybrid(p, "qwen35", replace={"blk.0.ssm_conv1d.weight": (a, None)})

overrides: any key of the arch's config (hybrid_config; layers: a string
of "a"/"r" per layer, n_layer: the arch's pattern repeated); extra: more
"<arch>." keys written after (or instead of, same name) the real ones; drop:
tensor names left out; replace: name -> (array, raw GGML type or None).
Returns (path, tensors): tensors maps name -> (array, raw type) as written
(before drop / replace).
"""

from pathlib import Path

import numpy as np
import moe_files
from gguf_files import LazyTensors, cached_write, tokenizer_rows, write_gguf
from moe_files import VENDOR, Q, random_matrix  # the same weight writers as the MoE files

# layer kinds: "a" attention, "r" the arch's recurrent block
ARCHS = {
    "lfm2": dict(
        arch="lfm2", vocab=VENDOR / "ggml-vocab-llama-bpe.gguf", seed=201,
        layers="rrar", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=768,
        n_ctx=128000, rope_base=1000000.0, eps=1e-5, l_cache=3,
        embd_sigma=0.125, out_sigma=None,
        types=dict(token_embd=Q.Q8_0, attn_q=Q.F16, attn_k=Q.F16, attn_v=Q.F16,
                   attn_output=Q.F16, ffn_gate=Q.F16, ffn_up=Q.F16, ffn_down=Q.F16,
                   in_proj=Q.F16, out_proj=Q.F16)),
    "granitehybrid": dict(
        arch="granitehybrid", vocab=VENDOR / "ggml-vocab-llama-bpe.gguf", seed=202,
        layers="rrar", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
        n_ctx=1048576, rope_base=10000.0, eps=1e-5,
        d_conv=4, d_inner=512, d_state=64, n_group=2, n_ssm_head=8,
        embedding_scale=12.0, residual_scale=0.22, attention_scale=0.0078125,
        logit_scale=6.0, embd_sigma=1.0 / 12.0, out_sigma=2.0 * 6.0 / 16.0,
        qk_sigma=3.0,
        types=dict(token_embd=Q.Q8_0, output=Q.Q8_0, attn_q=Q.F16, attn_k=Q.F16,
                   attn_v=Q.F16, attn_output=Q.F16, ffn_gate=Q.F16, ffn_up=Q.F16,
                   ffn_down=Q.F16, ssm_in=Q.F16, ssm_out=Q.F16)),
    "qwen35": dict(
        arch="qwen35", vocab=VENDOR / "ggml-vocab-qwen35.gguf", seed=203,
        layers=None, full_attention_interval=4, n_layer=4, recurrent_layers_key=True,
        n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
        n_ctx=262144, rope_base=10000000.0, rope_dim=16, rope_sections=(3, 3, 2, 0),
        eps=1e-6, d_conv=4, d_state=64, n_group=2, n_ssm_head=4,
        embd_sigma=0.125, out_sigma=None,
        types=dict(token_embd=Q.Q8_0, attn_q=Q.F16, attn_k=Q.F16, attn_v=Q.F16,
                   attn_output=Q.F16, ffn_gate=Q.F16, ffn_up=Q.F16, ffn_down=Q.F16,
                   attn_qkv=Q.F16, attn_gate=Q.F16, ssm_out=Q.F16,
                   ssm_alpha=Q.F32, ssm_beta=Q.F32)),
}


def hybrid_config(arch, **overrides):
    """ARCHS[arch] with overrides applied (types merged per role); adds
    "kinds", the per-layer list of "a" / "r"."""
    if arch not in ARCHS:
        raise ValueError(f"unknown hybrid arch {arch!r}; known: {', '.join(ARCHS)}")
    cfg = dict(ARCHS[arch])
    types = dict(cfg["types"])
    types.update(overrides.pop("types", {}))
    unknown = set(overrides) - set(cfg) - {"n_layer"}
    if unknown:
        raise TypeError(f"unknown override(s) {sorted(unknown)} for {arch}")
    cfg.update(overrides)
    cfg["types"] = types
    cfg["vocab"] = Path(cfg["vocab"])
    if arch == "qwen35" and cfg["layers"] is None:
        iv = cfg["full_attention_interval"]
        cfg["kinds"] = ["a" if (L + 1) % iv == 0 else "r" for L in range(cfg["n_layer"])]
    else:
        if "n_layer" in overrides and "layers" not in overrides:  # repeat the pattern
            pat = ARCHS[arch]["layers"]
            cfg["layers"] = "".join(pat[L % len(pat)] for L in range(overrides["n_layer"]))
        cfg["kinds"] = list(cfg["layers"])
        cfg["n_layer"] = len(cfg["kinds"])
    return cfg


def hybrid_hparams(cfg, n_vocab):
    """The "<arch>." keys of the file (write_gguf's hparams), as the
    converters write them."""
    arch = cfg["arch"]
    hp = {"context_length": cfg["n_ctx"], "embedding_length": cfg["n_embd"],
          "block_count": cfg["n_layer"], "feed_forward_length": cfg["n_ff"],
          "attention.head_count": cfg["n_head"]}
    if arch == "qwen35":
        hp["attention.head_count_kv"] = cfg["n_head_kv"]
        hp["attention.key_length"] = cfg["head_dim"]
        hp["attention.value_length"] = cfg["head_dim"]
    else:  # the layer kind: 0 kv heads marks a recurrent layer
        hp["attention.head_count_kv"] = [cfg["n_head_kv"] if k == "a" else 0
                                         for k in cfg["kinds"]]
    hp["rope.freq_base"] = float(cfg["rope_base"])
    hp["attention.layer_norm_rms_epsilon"] = float(cfg["eps"])
    if arch == "lfm2":
        hp["vocab_size"] = n_vocab
        hp["shortconv.l_cache"] = cfg["l_cache"]
    if arch == "granitehybrid":
        hp["rope.scaling.finetuned"] = False  # Granite 4.0-H: no RoPE
        hp["attention.scale"] = float(cfg["attention_scale"])
        hp["embedding_scale"] = float(cfg["embedding_scale"])
        hp["residual_scale"] = float(cfg["residual_scale"])
        hp["logit_scale"] = float(cfg["logit_scale"])
    if arch in ("granitehybrid", "qwen35"):
        inner = cfg["d_inner"] if arch == "granitehybrid" else cfg["n_ssm_head"] * cfg["d_state"]
        hp["ssm.conv_kernel"] = cfg["d_conv"]
        hp["ssm.inner_size"] = inner
        hp["ssm.state_size"] = cfg["d_state"]
        hp["ssm.time_step_rank"] = cfg["n_ssm_head"]
        hp["ssm.group_count"] = cfg["n_group"]
    if arch == "qwen35":
        hp["rope.dimension_count"] = cfg["rope_dim"]
        hp["rope.dimension_sections"] = list(cfg["rope_sections"])
        if cfg["recurrent_layers_key"]:  # the converter writes both; llama.cpp prefers this
            hp["attention.recurrent_layers"] = [k == "r" for k in cfg["kinds"]]
        hp["full_attention_interval"] = cfg["full_attention_interval"]
    return hp


def hybrid_tensors(cfg, n_vocab):
    """name -> (array, raw type), deterministic from cfg["seed"]."""
    rng = np.random.default_rng(cfg["seed"])
    arch, ty = cfg["arch"], cfg["types"]
    d, hd, ff = cfg["n_embd"], cfg["head_dim"], cfg["n_ff"]
    nh, nkv = cfg["n_head"], cfg["n_head_kv"]

    def vec(shape, centre, sigma):
        return (centre + sigma * rng.standard_normal(shape)).astype(np.float32), None

    def mat(role, rows, cols, gain=1.0):
        return random_matrix(rng, (rows, cols), ty[role], gain / np.sqrt(cols))

    def uniform(shape, lo, hi):
        return rng.uniform(lo, hi, shape).astype(np.float32)

    def softplus_inv(y):  # the bias whose softplus is y
        return np.log(np.expm1(y)).astype(np.float32)

    t = {"token_embd.weight": random_matrix(rng, (n_vocab, d), ty["token_embd"], cfg["embd_sigma"])}
    # LFM2's output norm carries the name token_embd_norm (llama.cpp's
    # LLM_TENSOR_OUTPUT_NORM_LFM2)
    t["token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight"] = vec(d, 1.0, 0.2)
    if cfg["out_sigma"] is not None:
        t["output.weight"] = random_matrix(rng, (n_vocab, d), ty["output"], cfg["out_sigma"])
    # Granite scales every block's output by residual_scale (0.22): larger
    # output projections keep the blocks' share of the residual stream
    gain = 2.5 if arch == "granitehybrid" else 1.0
    for L, kind in enumerate(cfg["kinds"]):
        p = f"blk.{L}."
        t[p + "attn_norm.weight"] = vec(d, 1.0, 0.2)
        # qwen35's FFN norm is post_attention_norm
        ffn_norm = "post_attention_norm" if arch == "qwen35" else "ffn_norm"
        t[p + ffn_norm + ".weight"] = vec(d, 1.0, 0.2)
        if kind == "a":
            qk = cfg.get("qk_sigma", 1.0)
            q_rows = nh * hd * (2 if arch == "qwen35" else 1)  # qwen35: Q and its gate per head
            t[p + "attn_q.weight"] = mat("attn_q", q_rows, d, qk)
            t[p + "attn_k.weight"] = mat("attn_k", nkv * hd, d, qk)
            t[p + "attn_v.weight"] = mat("attn_v", nkv * hd, d)
            t[p + "attn_output.weight"] = mat("attn_output", d, nh * hd, gain)
            if arch in ("lfm2", "qwen35"):
                t[p + "attn_q_norm.weight"] = vec(hd, 1.0, 0.2)
                t[p + "attn_k_norm.weight"] = vec(hd, 1.0, 0.2)
        elif arch == "lfm2":
            # kernel taps of std 0.6: the conv mixes 3 tokens without
            # growing the activations
            t[p + "shortconv.conv.weight"] = vec((d, cfg["l_cache"]), 0.0, 0.6)
            t[p + "shortconv.in_proj.weight"] = mat("in_proj", 3 * d, d)
            t[p + "shortconv.out_proj.weight"] = mat("out_proj", d, d)
        elif arch == "granitehybrid":
            di, ds, ng = cfg["d_inner"], cfg["d_state"], cfg["n_group"]
            nsh, dc = cfg["n_ssm_head"], cfg["d_conv"]
            conv_dim = di + 2 * ng * ds
            t[p + "ssm_in.weight"] = mat("ssm_in", 2 * di + 2 * ng * ds + nsh, d)
            t[p + "ssm_conv1d.weight"] = vec((conv_dim, dc), 0.0, 0.5)
            t[p + "ssm_conv1d.bias"] = vec(conv_dim, 0.0, 0.2)
            # dt = softplus(dt_raw + dt_b) in ~[0.05, 0.5]; A in [-4, -1]:
            # each head remembers ~1 to 20 tokens
            t[p + "ssm_dt.bias"] = (softplus_inv(uniform(nsh, 0.05, 0.5)), None)
            t[p + "ssm_a"] = (-uniform((nsh, 1), 1.0, 4.0), None)  # GGUF {1, n_head}
            t[p + "ssm_d"] = vec((nsh, 1), 1.0, 0.3)
            # GGUF {d_inner/n_group, n_group}
            t[p + "ssm_norm.weight"] = vec((ng, di // ng), 1.0, 0.2)
            t[p + "ssm_out.weight"] = mat("ssm_out", d, di, gain)
        else:  # qwen35 gated DeltaNet
            ds, ngk, nv, dc = cfg["d_state"], cfg["n_group"], cfg["n_ssm_head"], cfg["d_conv"]
            kd, vd = ngk * ds, nv * ds
            t[p + "attn_qkv.weight"] = mat("attn_qkv", 2 * kd + vd, d)
            t[p + "attn_gate.weight"] = mat("attn_gate", vd, d)
            t[p + "ssm_conv1d.weight"] = vec((2 * kd + vd, dc), 0.0, 0.5)
            # g = softplus(alpha + dt_b) * a: per-token log decay ~ -0.01 .. -1
            t[p + "ssm_dt.bias"] = (softplus_inv(uniform(nv, 0.05, 0.4)), None)
            t[p + "ssm_a"] = (-uniform(nv, 0.5, 3.0), None)
            t[p + "ssm_alpha.weight"] = mat("ssm_alpha", nv, d, 0.5)
            t[p + "ssm_beta.weight"] = mat("ssm_beta", nv, d, 1.0)
            t[p + "ssm_norm.weight"] = vec(ds, 1.0, 0.2)
            t[p + "ssm_out.weight"] = mat("ssm_out", d, vd)
        t[p + "ffn_gate.weight"] = mat("ffn_gate", ff, d)
        t[p + "ffn_up.weight"] = mat("ffn_up", ff, d)
        t[p + "ffn_down.weight"] = mat("ffn_down", d, ff, gain)
    return t


# hybrid_tensors' last small result, by config, as moe_files keeps its own:
# the bad-file tests write the same small file of one arch after another
# two dozen times. The arrays are never changed after they are made.
_TENSORS = {}


def write_hybrid(path, arch, seed=None, extra=None, drop=(), replace=None, **overrides):
    """Writes the small hybrid file of arch (see the module docstring), a
    copy of the test-file cache's when it holds it; returns (path,
    tensors), the tensors drawn only when first read."""
    if seed is not None:
        overrides["seed"] = seed
    cfg = hybrid_config(arch, **overrides)
    rows, n_vocab = tokenizer_rows(cfg["vocab"])
    key = repr(sorted(cfg.items()))

    def draw():
        tensors = _TENSORS.get(key)
        if tensors is None:
            tensors = hybrid_tensors(cfg, n_vocab)
            _TENSORS.clear()
            if sum(a.nbytes for a, _ in tensors.values()) < 128 << 20:
                _TENSORS[key] = tensors
        return dict(tensors)

    tensors = LazyTensors(draw)
    hp = {**hybrid_hparams(cfg, n_vocab), **(extra or {})}

    def write(p):
        out = {k: v for k, v in tensors.items() if k not in drop}
        out.update(replace or {})
        write_gguf(p, cfg["arch"], rows, hp, out)

    # moe_files draws the weights (random_matrix), so its text is part of the key
    cached_write(path, "hybrid_files.write_hybrid", (cfg, hp, drop, replace), write,
                 sources=(__file__, moe_files.__file__))
    return path, tensors
