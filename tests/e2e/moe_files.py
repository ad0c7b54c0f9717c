"""Small deterministic mixture-of-experts GGUF files for the end-to-end tests.

write_moe(path, arch, seed=None, **overrides) writes a random-weight file of
one of ARCHS ("qwen3moe", "qwen2moe", "mixtral": general.architecture
"llama" with experts, "gpt-oss") with a real vocabulary's tokenizer keys
(llama.cpp's vendored ggml-vocab-*.gguf: qwen2's for the Qwens, llama-spm's
for Mixtral, llama-bpe's for gpt-oss, whose o200k vocabulary llama.cpp
does not vendor), a few layers of n_embd 256 and the tensor types real
files of the family use: F32 norms, biases, routers and sinks; Q4_K / Q6_K
where a row is a multiple of 256 long (the Q4_K_M mix: Q6_K output and
attn_v); Q8_0, Q5_0, Q4_0 on the experts' 128-wide down rows; MXFP4
experts for gpt-oss (as the released gpt-oss files), Q8_0 / F16 attention
there. Weights are scaled for unit-variance products, router logits of
standard deviation 1 to 1.5 (different tokens choose different experts;
qwen3moe's 1 keeps its top-4 weights' sum well below 1, so that the
renormalization matters) and output logits of standard deviation ~2;
gpt-oss's expert gate/up products are wider (std ~4) so that its clamp at
7 bites, and its sinks are near the attention scores' size so that they
take a real share.

  path, tensors = write_moe(tmp / "m.gguf", "qwen3moe")
  path, tensors = write_moe(p, "gpt-oss", n_layer=2, window=128)
  write_moe(p, "qwen2moe", drop=("blk.1.ffn_gate_inp_shexp.weight",))
  write_moe(p, "mixtral", replace={"blk.0.ffn_up_exps.weight": (a, None)})

overrides: any key of the arch's config (moe_config: n_layer, n_embd,
n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff_exp, n_ff_shexp,
n_ctx, window, rope_base, eps, yarn_factor, yarn_orig_ctx, router_sigma,
gate_up_sigma, down_sigma, bias_sigma, vocab, seed, types);
extra: more "<arch>." keys ({"expert_weights_scale": 2.0}); drop: tensor
names left out; replace: name -> (array, raw GGML type or None). Returns
(path, tensors): tensors maps name -> (array, raw type) as written (before
drop / replace), for writing a broken variant with write_gguf.
"""

import os
from pathlib import Path

import gguf
import numpy as np
from gguf_files import LazyTensors, cached_write, kquant_bytes, tokenizer_rows, write_gguf

Q = gguf.GGMLQuantizationType
HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
VENDOR = HOME / "llama.cpp-vendor" / "models"

# Per arch: the GGUF architecture name, the vocabulary file, the seed, the
# dims and the tensor types (types: tensor role -> GGML type, or a list of
# types indexed by layer).
ARCHS = {
    # Qwen3-30B-A3B's layout: head_dim * n_head (512) != n_embd, top-4 of 8
    "qwen3moe": dict(
        arch="qwen3moe", vocab=VENDOR / "ggml-vocab-qwen2.gguf", seed=101,
        n_layer=3, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_expert=8,
        n_expert_used=4, n_ff_exp=128, n_ff_shexp=0, n_ctx=4096, window=0,
        rope_base=1000000.0, eps=1e-6, yarn_factor=0.0, yarn_orig_ctx=0,
        router_sigma=1.0, gate_up_sigma=1.0, down_sigma=1.0, bias_sigma=0.0,
        types=dict(token_embd=Q.Q4_K, output=Q.Q6_K, attn_q=Q.Q4_K, attn_k=Q.Q4_K,
                   attn_v=Q.Q6_K, attn_output=Q.Q4_K, gate_exps=Q.Q4_K, up_exps=Q.Q4_K,
                   down_exps=[Q.Q8_0, Q.Q5_0, Q.Q8_0])),
    # Qwen1.5-MoE's layout: head_dim * n_head == n_embd, Q/K/V biases, a
    # shared expert twice the routed width
    "qwen2moe": dict(
        arch="qwen2moe", vocab=VENDOR / "ggml-vocab-qwen2.gguf", seed=102,
        n_layer=3, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8,
        n_expert_used=2, n_ff_exp=128, n_ff_shexp=256, n_ctx=4096, window=0,
        rope_base=1000000.0, eps=1e-6, yarn_factor=0.0, yarn_orig_ctx=0,
        router_sigma=1.5, gate_up_sigma=1.0, down_sigma=1.0, bias_sigma=0.2,
        types=dict(token_embd=Q.Q4_K, output=Q.Q6_K, attn_q=Q.Q5_0, attn_k=Q.Q5_0,
                   attn_v=Q.Q8_0, attn_output=Q.Q4_K, gate_exps=Q.Q4_K, up_exps=Q.Q4_K,
                   down_exps=[Q.Q8_0, Q.Q5_0, Q.Q8_0], gate_shexp=Q.Q4_K,
                   up_shexp=Q.Q4_K, down_shexp=[Q.Q6_K, Q.Q4_K, Q.Q6_K])),
    # Mixtral: the llama architecture with llama.expert_count 8, top-2; the
    # experts' width is llama.feed_forward_length
    "mixtral": dict(
        arch="llama", vocab=VENDOR / "ggml-vocab-llama-spm.gguf", seed=103,
        n_layer=3, n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_expert=8,
        n_expert_used=2, n_ff_exp=128, n_ff_shexp=0, n_ctx=4096, window=0,
        rope_base=1000000.0, eps=1e-5, yarn_factor=0.0, yarn_orig_ctx=0,
        router_sigma=1.5, gate_up_sigma=1.0, down_sigma=1.0, bias_sigma=0.0,
        types=dict(token_embd=Q.Q4_K, output=Q.Q6_K, attn_q=Q.Q4_K, attn_k=Q.Q4_K,
                   attn_v=Q.Q6_K, attn_output=Q.Q4_K, gate_exps=Q.Q4_K, up_exps=Q.Q4_K,
                   down_exps=[Q.Q5_0, Q.Q8_0, Q.Q4_0])),
    # gpt-oss-20b's layout at n_embd 256: head_dim 64, head_dim * n_head
    # (512) != n_embd, top-4 of 8, sinks, alternating sliding-window layers
    # (a window of 32 here, 128 in the real files), YaRN factor 32 from
    # 4096, base 150000
    "gpt-oss": dict(
        arch="gpt-oss", vocab=VENDOR / "ggml-vocab-llama-bpe.gguf", seed=104,
        n_layer=3, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_expert=8,
        n_expert_used=4, n_ff_exp=128, n_ff_shexp=0, n_ctx=131072, window=32,
        rope_base=150000.0, eps=1e-5, yarn_factor=32.0, yarn_orig_ctx=4096,
        router_sigma=1.5, gate_up_sigma=4.0, down_sigma=0.25, bias_sigma=0.3,
        types=dict(token_embd=Q.Q8_0, output=Q.Q8_0, attn_q=Q.Q8_0, attn_k=Q.F16,
                   attn_v=Q.Q8_0, attn_output=Q.Q8_0, gate_exps=Q.MXFP4, up_exps=Q.MXFP4,
                   down_exps=Q.MXFP4)),
}


def moe_config(arch, **overrides):
    """ARCHS[arch] with overrides applied (types merged per role)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown MoE arch {arch!r}; known: {', '.join(ARCHS)}")
    cfg = dict(ARCHS[arch])
    types = dict(cfg["types"])
    types.update(overrides.pop("types", {}))
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise TypeError(f"unknown override(s) {sorted(unknown)} for {arch}")
    cfg.update(overrides)
    cfg["types"] = types
    cfg["vocab"] = Path(cfg["vocab"])
    return cfg


def moe_hparams(cfg):
    """The "<arch>." keys of the file (write_gguf's hparams)."""
    hp = {"context_length": cfg["n_ctx"], "embedding_length": cfg["n_embd"],
          "block_count": cfg["n_layer"],
          "feed_forward_length": cfg["n_ff_exp"] * (1 if cfg["arch"] == "llama"
                                                    else cfg["n_expert_used"]),
          "attention.head_count": cfg["n_head"], "attention.head_count_kv": cfg["n_head_kv"],
          "attention.key_length": cfg["head_dim"], "attention.value_length": cfg["head_dim"],
          "attention.layer_norm_rms_epsilon": float(cfg["eps"]),
          "rope.freq_base": float(cfg["rope_base"]),
          "expert_count": cfg["n_expert"], "expert_used_count": cfg["n_expert_used"]}
    if cfg["arch"] == "llama":  # as the converter writes Mixtral
        hp["rope.dimension_count"] = cfg["head_dim"]
    else:
        hp["expert_feed_forward_length"] = cfg["n_ff_exp"]
    if cfg["n_ff_shexp"]:
        hp["expert_shared_feed_forward_length"] = cfg["n_ff_shexp"]
    if cfg["window"]:
        hp["attention.sliding_window"] = cfg["window"]
    if cfg["yarn_factor"]:
        hp["rope.scaling.type"] = "yarn"
        hp["rope.scaling.factor"] = float(cfg["yarn_factor"])
        hp["rope.scaling.original_context_length"] = cfg["yarn_orig_ctx"]
    return hp


def q8_0_fast(rng, shape, sigma):
    """Q8_0 blocks drawn as bytes (the embedding tables: quantizing 30 M
    floats with gguf takes seconds): f16 d, 32 int8 codes."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    n = rows * cols // 32
    d = np.full((n, 1), sigma / 73.6, np.float16).view(np.uint8)  # std of U{-127..127} * d
    q = rng.integers(-127, 128, (n, 32), dtype=np.int8).view(np.uint8)
    return np.concatenate([d, q], axis=1).reshape(*shape[:-1], -1)


def random_matrix(rng, shape, qtype, sigma):
    """(array, raw type) of shape (numpy order: [experts,] rows, cols) and
    type qtype, weights of standard deviation ~sigma. hybrid_files draws
    its weights with it too."""
    shape = tuple(int(d) for d in shape)
    rows = int(np.prod(shape[:-1]))
    if qtype in (Q.Q4_K, Q.Q6_K):
        return kquant_bytes(rng, qtype, rows, shape[-1], sigma).reshape(*shape[:-1], -1), qtype
    if qtype == Q.Q8_0 and rows * shape[-1] > 4_000_000:
        return q8_0_fast(rng, shape, sigma), qtype
    w = (rng.standard_normal(shape) * sigma).astype(np.float32)
    if qtype == Q.F32:
        return w, None
    if qtype == Q.F16:
        return w.astype(np.float16), None
    return gguf.quants.quantize(w, qtype), qtype


def moe_tensors(cfg, n_vocab):
    """name -> (array, raw type), deterministic from cfg["seed"]."""
    rng = np.random.default_rng(cfg["seed"])
    arch, ty = cfg["arch"], cfg["types"]
    d, hd, E = cfg["n_embd"], cfg["head_dim"], cfg["n_expert"]
    qd, kvd, ff, fs = cfg["n_head"] * hd, cfg["n_head_kv"] * hd, cfg["n_ff_exp"], cfg["n_ff_shexp"]
    oss = arch == "gpt-oss"

    def typ(role, L):
        t = ty[role]
        return t[L % len(t)] if isinstance(t, list) else t

    def vec(shape, centre, sigma):
        return (centre + sigma * rng.standard_normal(shape)).astype(np.float32), None

    t = {"token_embd.weight": random_matrix(rng, (n_vocab, d), ty["token_embd"], 0.5),
         "output_norm.weight": vec(d, 1.0, 0.2),
         "output.weight": random_matrix(rng, (n_vocab, d), ty["output"], 2.0 / np.sqrt(d))}
    for L in range(cfg["n_layer"]):
        p = f"blk.{L}."
        t[p + "attn_norm.weight"] = vec(d, 1.0, 0.2)
        # gpt-oss's feed-forward norm is post_attention_norm
        t[p + ("post_attention_norm.weight" if oss else "ffn_norm.weight")] = vec(d, 1.0, 0.2)
        for name, rows, cols in (("attn_q", qd, d), ("attn_k", kvd, d), ("attn_v", kvd, d),
                                 ("attn_output", d, qd)):
            t[p + name + ".weight"] = random_matrix(rng, (rows, cols), typ(name, L), 1 / np.sqrt(cols))
        if arch in ("qwen2moe", "gpt-oss"):
            bs = cfg["bias_sigma"]
            t[p + "attn_q.bias"] = vec(qd, 0.0, bs)
            t[p + "attn_k.bias"] = vec(kvd, 0.0, bs)
            t[p + "attn_v.bias"] = vec(kvd, 0.0, bs)
        if oss:
            t[p + "attn_output.bias"] = vec(d, 0.0, cfg["bias_sigma"])
            # near the scores' size (|q.k| / 8 ~ 2 with YaRN's mscale)
            t[p + "attn_sinks.weight"] = vec(cfg["n_head"], 1.0, 1.0)
        if arch == "qwen3moe":
            t[p + "attn_q_norm.weight"] = vec(hd, 1.0, 0.2)
            t[p + "attn_k_norm.weight"] = vec(hd, 1.0, 0.2)
        t[p + "ffn_gate_inp.weight"] = random_matrix(rng, (E, d), Q.F32, cfg["router_sigma"] / np.sqrt(d))
        # gpt-oss: wide gate/up products (the clamp at 7 bites), a small down
        gu, dn = cfg["gate_up_sigma"], cfg["down_sigma"]
        t[p + "ffn_gate_exps.weight"] = random_matrix(rng, (E, ff, d), typ("gate_exps", L), gu / np.sqrt(d))
        t[p + "ffn_up_exps.weight"] = random_matrix(rng, (E, ff, d), typ("up_exps", L), gu / np.sqrt(d))
        t[p + "ffn_down_exps.weight"] = random_matrix(rng, (E, d, ff), typ("down_exps", L), dn / np.sqrt(ff))
        if oss:
            t[p + "ffn_gate_inp.bias"] = vec(E, 0.0, 0.5)
            t[p + "ffn_gate_exps.bias"] = vec((E, ff), 0.0, 0.5)
            t[p + "ffn_up_exps.bias"] = vec((E, ff), 0.0, 0.5)
            t[p + "ffn_down_exps.bias"] = vec((E, d), 0.0, 0.3)
        if fs:
            # the shared expert's gate logit near 0: sigmoid in its slope
            t[p + "ffn_gate_inp_shexp.weight"] = vec(d, 0.0, 1.0 / np.sqrt(d))
            t[p + "ffn_gate_shexp.weight"] = random_matrix(rng, (fs, d), typ("gate_shexp", L), 1 / np.sqrt(d))
            t[p + "ffn_up_shexp.weight"] = random_matrix(rng, (fs, d), typ("up_shexp", L), 1 / np.sqrt(d))
            t[p + "ffn_down_shexp.weight"] = random_matrix(rng, (d, fs), typ("down_shexp", L), 1 / np.sqrt(fs))
    return t


# moe_tensors' small results by config: the same file is written again
# and again (the bad-file variants), and drawing the K-quant blocks takes
# seconds. The arrays are never changed after they are made.
_TENSORS = {}


def write_moe(path, arch, seed=None, extra=None, drop=(), replace=None, **overrides):
    """Writes the small MoE file of arch (see the module docstring), a
    copy of the test-file cache's when it holds it; returns (path,
    tensors), the tensors drawn only when first read."""
    if seed is not None:
        overrides["seed"] = seed
    cfg = moe_config(arch, **overrides)
    rows, n_vocab = tokenizer_rows(cfg["vocab"])
    key = repr(sorted(cfg.items()))

    def draw():
        tensors = _TENSORS.get(key)
        if tensors is None:
            tensors = moe_tensors(cfg, n_vocab)
            if sum(a.nbytes for a, _ in tensors.values()) < 64 << 20:
                _TENSORS[key] = tensors
        return dict(tensors)

    tensors = LazyTensors(draw)
    hp = {**moe_hparams(cfg), **(extra or {})}

    def write(p):
        out = {k: v for k, v in tensors.items() if k not in drop}
        out.update(replace or {})
        write_gguf(p, cfg["arch"], rows, hp, out)

    cached_write(path, "moe_files.write_moe", (cfg, hp, drop, replace), write,
                 sources=(__file__,))
    return path, tensors


# ---- ablations of the float64 reference on these files -------------------
# (the MoE tests change a shallow copy of numpy_llama.Model with these)


def yarn_off(m):
    """Plain linear interpolation by the factor (llama.cpp with
    yarn_ext_factor 0: no ramp, cos/sin unscaled)."""
    m.yarn_ext_factor = 0.0
    m.yarn_tables()
    m.attn_factor = 1.0


def yarn_no_magnitude(m):
    """YaRN's angles with cos/sin unscaled."""
    m.rope_mscale = m.attn_factor = 1.0
