#!/usr/bin/env python3
"""Writes a random-weight GGUF model with a real model's shapes.

For checking a backend on full-size shapes where the real weights cannot
travel (scripts/gpu-check runs this on the GPU machine), and as the base
file that scripts/make-bench-models quantizes with llama.cpp into the
benchmark models: the metadata of the named shape, and every tensor filled
with random blocks of the chosen type, drawn straight as block bytes (scales
and integer codes), so a 270 M parameter file is written in seconds and
needs no quantizer. Tensors are drawn and written one at a time (a 4 B
parameter Q8_0 file needs well under 1 GB of memory). Deterministic from
--seed. Weight scales give each product unit variance and logits with a
standard deviation near 2, so greedy decoding has real gaps to compare.

No tokenizer unless --tokenizer-from names a GGUF whose tokenizer.* keys
are copied (feed token ids otherwise). A vocabulary smaller than the
shape's is padded with "[PAD<id>]" tokens of type UNUSED, as llama.cpp's
converter pads Qwen's 151643 tokens to the model's 151936 rows.

Shapes: smollm2-135m and gemma3-270m (tied heads, as both real files);
llama3.2-1b (tied, Llama 3 rope_freqs), qwen3-4b (tied) and qwen3-8b
(untied: output.weight), from the models' HF config.json files; and two
mixture-of-experts shapes, untied as the real files:

  qwen3-30b-a3b (qwen3moe): 48 layers of dim 2048, 32 heads / 4 KV heads
    of 128, Q/K norms, 128 experts of 768 with 8 used (the experts take
    the --type), an F32 router; 30.5 B parameters, so --layers cuts it
    (8 layers: 5.6 B, 6.0 GB at Q8_0);
  gpt-oss-20b (gpt-oss): 24 layers of dim 2880, 64 heads / 8 KV heads of
    64, Q/K/V/O biases, attention sinks, a sliding window of 128 on the
    even layers, YaRN (factor 32 from 4096, base 150000), 32 experts of
    2880 with 4 used, always MXFP4 (drawn as E8M0 scale + E2M1 nibbles,
    as the released files), with biases, an F32 router with bias; the
    other matrices take the --type (Q8_0 is the released files' mix,
    llama.cpp's MXFP4_MOE); vocabulary 201088 rows (o200k, which llama.cpp
    does not vendor: --tokenizer-from pads a smaller one); 20.9 B
    parameters, --layers 8: 7.7 B, 4.9 GB.

  random_gguf.py --shape NAME [--type Q4_1] [--layers N] [--window N]
                 [--tokenizer-from GGUF] [--seed 1] OUT.gguf
"""

import argparse
import math

import numpy as np

import gguf

Q = gguf.GGMLQuantizationType

# The real files' hyper-parameters (smollm2-135m and gemma3-270m read from
# SmolLM2-135M-Instruct.Q4_1.gguf and gemma-3-270m-q4_k_m.gguf with `zinfer
# info` and gguf's reader; the others from the HF config.json of
# meta-llama/Llama-3.2-1B, Qwen/Qwen3-4B and Qwen/Qwen3-8B). embd: the
# token embedding's type. Optional: window (gemma3's sliding window),
# qk_norm (per-head attn_q_norm / attn_k_norm), untied (an output.weight),
# llama3_rope (rope_scaling "llama3": factor, low, high, original context,
# written as the converter does, a rope_freqs.weight of head/2 factors),
# extra ("<arch>." keys the real GGUF files carry), vocab_file (the
# llama.cpp vendored vocabulary, ggml-vocab-<name>.gguf, that
# scripts/make-bench-models copies the tokenizer of). Mixture of experts:
# moe (experts, used, their width, and a fixed type for them or None for
# --type), biases (Q/K/V/O biases, router and expert biases), sinks
# (attn_sinks), yarn (factor, original context), bench_layers (the layers
# scripts/make-bench-models writes by default: the whole model does not
# fit the development machine).
SHAPES = {
    "smollm2-135m": dict(arch="llama", dim=576, layers=30, ffn=1536, heads=9, kv=3, head=64,
                         vocab=49152, ctx=8192, eps=1e-5, rope=100000.0, embd=Q.Q8_0),
    "gemma3-270m": dict(arch="gemma3", dim=640, layers=18, ffn=2048, heads=4, kv=1, head=256,
                        vocab=262144, ctx=32768, eps=1e-6, rope=1000000.0, embd=Q.Q8_0,
                        window=512),
    "llama3.2-1b": dict(arch="llama", dim=2048, layers=16, ffn=8192, heads=32, kv=8, head=64,
                        vocab=128256, ctx=131072, eps=1e-5, rope=500000.0, embd=Q.Q8_0,
                        llama3_rope=(32.0, 1.0, 4.0, 8192),
                        extra={"vocab_size": 128256, "rope.dimension_count": 64},
                        vocab_file="llama-bpe"),
    "qwen3-4b": dict(arch="qwen3", dim=2560, layers=36, ffn=9728, heads=32, kv=8, head=128,
                     vocab=151936, ctx=40960, eps=1e-6, rope=1000000.0, embd=Q.Q8_0,
                     qk_norm=True, vocab_file="qwen2"),
    "qwen3-8b": dict(arch="qwen3", dim=4096, layers=36, ffn=12288, heads=32, kv=8, head=128,
                     vocab=151936, ctx=40960, eps=1e-6, rope=1000000.0, embd=Q.Q8_0,
                     qk_norm=True, untied=True, vocab_file="qwen2"),
    # Qwen/Qwen3-30B-A3B: intermediate_size 6144 (unused by the MoE layers),
    # moe_intermediate_size 768, norm_topk_prob (llama.cpp: always)
    "qwen3-30b-a3b": dict(arch="qwen3moe", dim=2048, layers=48, ffn=6144, heads=32, kv=4,
                          head=128, vocab=151936, ctx=40960, eps=1e-6, rope=1000000.0,
                          embd=Q.Q8_0, qk_norm=True, untied=True, vocab_file="qwen2",
                          moe=dict(experts=128, used=8, ffn=768, type=None), bench_layers=8),
    # openai/gpt-oss-20b: rope_scaling yarn (factor 32, beta_fast 32,
    # beta_slow 1, original_max_position_embeddings 4096), sliding_window 128
    "gpt-oss-20b": dict(arch="gpt-oss", dim=2880, layers=24, ffn=2880, heads=64, kv=8, head=64,
                        vocab=201088, ctx=131072, eps=1e-5, rope=150000.0, embd=Q.Q8_0,
                        untied=True, window=128, biases=True, sinks=True, yarn=(32.0, 4096),
                        moe=dict(experts=32, used=4, ffn=2880, type=Q.MXFP4),
                        vocab_file="llama-bpe", bench_layers=8),
}

# The matrices' types drawn here (--type). Q4_K_M is llama.cpp's mix
# of that name, simplified: Q4_K matrices but attn_v and ffn_down in Q6_K,
# and the token embedding (the tied output head) in Q6_K.
TYPES = ["Q4_0", "Q4_1", "Q8_0", "F16", "Q4_K", "Q6_K", "IQ4_XS", "Q4_K_M"]
MIXES = {"Q4_K_M": dict(base=Q.Q4_K, embd=Q.Q6_K, attn_v=Q.Q6_K, ffn_down=Q.Q6_K)}

# Types drawn as random bytes but for their f16 scales (byte offset, and
# the std of the value over d for random codes and sub-scales: Q4_K
# d (sc q - 7.5 mn) with sc, mn, q uniform, ~258 d; Q6_K an int8 scale
# times (q - 32), ~1366 d; IQ4_XS (scale - 32) times the code book, ~1246 d;
# Q5_0 (q - 16), ~9.2 d; IQ4_NL the code book, ~67.4 d), so every code and
# sub-scale is random, as in tests/unit/test_rand.h's random blocks.
BYTE_SCALES = {Q.Q4_K: ((0, 258.0), (2, 258.0 / 7.5)), Q.Q6_K: ((208, 1366.0),),
               Q.IQ4_XS: ((0, 1246.0),), Q.Q5_0: ((0, 9.23),), Q.IQ4_NL: ((0, 67.4),)}
# A 256-value type on a matrix whose rows are not a multiple of 256 values
# (SmolLM2's 576): llama.cpp's quantizer falls back to these.
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}


def blocks(rng, qtype, rows, cols, sigma):
    """rows x cols weights of type qtype with standard deviation ~sigma, as
    the file's bytes: uint8 [rows, bytes per row]."""
    n = rows * cols // 32
    if qtype == Q.Q8_0:  # f16 d, 32 x int8: d * q
        d = np.full((n, 1), sigma / 73.6, np.float16).view(np.uint8)
        q = rng.integers(-127, 128, (n, 32), dtype=np.int8).view(np.uint8)
        b = np.concatenate([d, q], axis=1)
    elif qtype == Q.Q4_0:  # f16 d, 16 bytes of nibbles: d * (q - 8)
        d = np.full((n, 1), sigma / 4.6, np.float16).view(np.uint8)
        q = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        b = np.concatenate([d, q], axis=1)
    elif qtype == Q.Q4_1:  # f16 d, f16 m, nibbles: d * q + m
        dv = sigma / 4.6
        d = np.full((n, 1), dv, np.float16).view(np.uint8)
        m = np.full((n, 1), -7.5 * dv, np.float16).view(np.uint8)
        q = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        b = np.concatenate([d, m, q], axis=1)
    elif qtype == Q.MXFP4:  # E8M0 exponent e, 16 bytes of E2M1 nibbles: 2^(e-128) * k
        # the codes' values (doubled) have std sqrt(34.25); the scale a power of 2
        e = int(round(math.log2(2 * sigma / math.sqrt(34.25)))) + 127
        d = np.full((n, 1), e, np.uint8)
        q = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        b = np.concatenate([d, q], axis=1)
    elif qtype in BYTE_SCALES:
        be, bs = gguf.GGML_QUANT_SIZES[qtype]
        nk = rows * cols // be
        b = rng.integers(0, 256, (nk, bs), dtype=np.uint8)
        for off, div in BYTE_SCALES[qtype]:
            b[:, off:off + 2] = np.full((nk, 1), sigma / div, np.float16).view(np.uint8)
    elif qtype == Q.F16:
        return (rng.standard_normal((rows, cols)) * sigma).astype(np.float16)
    else:
        raise SystemExit(f"random_gguf: type {qtype.name} is not drawn here")
    return b.reshape(rows, -1)


def llama3_rope_factors(base, head, factor, low, high, orig):
    """rope_freqs.weight as llama.cpp's converter writes it for rope_scaling
    "llama3": one divisor per rotated pair (head / 2)."""
    out = []
    for i in range(0, head, 2):
        wavelen = 2 * math.pi * base ** (i / head)
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def tokenizer_rows(path, n_vocab):
    """(key, value, type, sub type) of the tokenizer.* keys of the GGUF at
    path, the per-token arrays padded to n_vocab rows. Returns (rows, the
    file's own vocabulary size)."""
    r = gguf.GGUFReader(path)
    tokens = r.fields.get("tokenizer.ggml.tokens")
    have = len(tokens.data) if tokens is not None else 0
    if have > n_vocab:
        raise SystemExit(f"random_gguf: {path} has {have} tokens, more than the shape's "
                         f"{n_vocab} rows")
    pad = n_vocab - have
    rows = []
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if pad and key == "tokenizer.ggml.tokens":
            value = value + [f"[PAD{i}]" for i in range(have, n_vocab)]
        elif pad and key == "tokenizer.ggml.token_type":
            value = value + [int(gguf.TokenType.UNUSED)] * pad
        elif pad and key == "tokenizer.ggml.scores":
            value = value + [-1000.0] * pad
        rows.append((key, value, vtype, sub))
    return rows, have


def tensor_plan(s, qtype, layers, rng):
    """The file's tensors in order: (name, shape for the header as numpy
    sees the data, numpy dtype, raw GGML type or None, nbytes, a function
    drawing the data). Drawing happens when the tensor is written, in this
    order, so the file is the same for a seed whether written at once or
    tensor by tensor."""
    dim, ffn, head = s["dim"], s["ffn"], s["head"]
    qd, kvd = s["heads"] * head, s["kv"] * head
    plan = []
    # qtype: a TYPES name, or a GGML type (scripts/make-bench-models)
    mix = MIXES.get(qtype, {}) if isinstance(qtype, str) else {}
    qt = mix.get("base") or (Q[qtype] if isinstance(qtype, str) else qtype)
    embd = mix.get("embd", s["embd"])

    def matrix(name, rows, cols, t, sigma, experts=0):
        """rows x cols (experts x rows x cols when experts)."""
        lead = (experts,) if experts else ()
        n = (experts or 1) * rows
        if t == Q.F16:
            plan.append((name, lead + (rows, cols), np.float16, None, n * cols * 2,
                         lambda: blocks(rng, t, n, cols, sigma).reshape(lead + (rows, cols))))
            return
        if t in FALLBACK and cols % 256:
            t = FALLBACK[t]
        bs, ts = gguf.GGML_QUANT_SIZES[t]
        rb = cols // bs * ts
        plan.append((name, lead + (rows, rb), np.uint8, t, n * rb,
                     lambda: blocks(rng, t, n, cols, sigma).reshape(lead + (rows, rb))))

    def vector(name, n, make=None):
        make = make or (lambda: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))
        plan.append((name, (n,), np.float32, None, n * 4, make))

    def f32(name, shape, sigma):
        """A float32 tensor (router, biases, sinks) of N(0, sigma^2)."""
        plan.append((name, shape, np.float32, None, int(np.prod(shape)) * 4,
                     lambda: (sigma * rng.standard_normal(shape)).astype(np.float32)))

    # the embedding doubles as the output head when tied (as in the real
    # files but qwen3-8b); logits std ~2 either way
    emb_sigma = 2.0 / math.sqrt(dim)
    matrix("token_embd.weight", s["vocab"], dim, embd, emb_sigma)
    vector("output_norm.weight", dim)
    if s.get("untied"):
        matrix("output.weight", s["vocab"], dim, embd, emb_sigma)
    if s.get("llama3_rope"):
        f = llama3_rope_factors(s["rope"], head, *s["llama3_rope"])
        vector("rope_freqs.weight", head // 2, lambda: f)
    moe = s.get("moe")
    for L in range(layers):
        p = f"blk.{L}."
        mats = [("attn_q", qd, dim), ("attn_k", kvd, dim), ("attn_v", kvd, dim),
                ("attn_output", dim, qd)]
        if not moe:
            mats += [("ffn_gate", ffn, dim), ("ffn_up", ffn, dim), ("ffn_down", dim, ffn)]
        for name, rows, cols in mats:
            matrix(p + name + ".weight", rows, cols, mix.get(name, qt), 1.0 / math.sqrt(cols))
        if moe:
            E, fe, et = moe["experts"], moe["ffn"], moe["type"] or qt
            f32(p + "ffn_gate_inp.weight", (E, dim), 1.0 / math.sqrt(dim))
            for name, rows, cols in (("ffn_gate_exps", fe, dim), ("ffn_up_exps", fe, dim),
                                     ("ffn_down_exps", dim, fe)):
                matrix(p + name + ".weight", rows, cols, et, 1.0 / math.sqrt(cols), experts=E)
            if s.get("biases"):
                f32(p + "ffn_gate_inp.bias", (E,), 0.1)
                f32(p + "ffn_gate_exps.bias", (E, fe), 0.1)
                f32(p + "ffn_up_exps.bias", (E, fe), 0.1)
                f32(p + "ffn_down_exps.bias", (E, dim), 0.1)
        if s.get("biases"):
            for name, n in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd), ("attn_output", dim)):
                f32(p + name + ".bias", (n,), 0.1)
        if s.get("sinks"):
            f32(p + "attn_sinks.weight", (s["heads"],), 1.0)
        vector(p + "attn_norm.weight", dim)
        # gpt-oss's feed-forward norm is named post_attention_norm
        vector(p + ("post_attention_norm.weight" if s["arch"] == "gpt-oss" else "ffn_norm.weight"),
               dim)
        if s["arch"] == "gemma3" or s.get("qk_norm"):
            vector(p + "attn_q_norm.weight", head)
            vector(p + "attn_k_norm.weight", head)
        if s["arch"] == "gemma3":
            vector(p + "post_attention_norm.weight", dim)
            vector(p + "post_ffw_norm.weight", dim)
    return plan


def write(out, shape, qtype="Q4_1", layers=0, window=0, tokenizer_from=None, seed=1):
    """Writes the random file of shape (a SHAPES key) to out; returns the
    number of bytes of tensor data."""
    s = SHAPES[shape]
    arch, dim, head = s["arch"], s["dim"], s["head"]
    layers = layers or s["layers"]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, arch)
    w.add_name(f"random {shape} ({qtype}, seed {seed})")
    w.add_uint32(f"{arch}.context_length", s["ctx"])
    w.add_uint32(f"{arch}.embedding_length", dim)
    w.add_uint32(f"{arch}.block_count", layers)
    w.add_uint32(f"{arch}.feed_forward_length", s["ffn"])
    w.add_uint32(f"{arch}.attention.head_count", s["heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", s["kv"])
    w.add_uint32(f"{arch}.attention.key_length", head)
    w.add_uint32(f"{arch}.attention.value_length", head)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", s["eps"])
    w.add_float32(f"{arch}.rope.freq_base", s["rope"])
    if "window" in s:
        w.add_uint32(f"{arch}.attention.sliding_window", window or s["window"])
    if s.get("moe"):
        w.add_uint32(f"{arch}.expert_count", s["moe"]["experts"])
        w.add_uint32(f"{arch}.expert_used_count", s["moe"]["used"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", s["moe"]["ffn"])
    if s.get("yarn"):
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", s["yarn"][0])
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", s["yarn"][1])
    for k, v in s.get("extra", {}).items():
        w.add_uint32(f"{arch}.{k}", v)
    if tokenizer_from:
        rows, _ = tokenizer_rows(tokenizer_from, s["vocab"])
        for key, value, vtype, sub in rows:
            w.add_key_value(key, value, vtype, sub_type=sub)
    plan = tensor_plan(s, qtype, layers, rng)
    for name, tshape, dtype, raw, nbytes, _ in plan:
        w.add_tensor_info(name, tshape, np.dtype(dtype), nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for name, tshape, dtype, raw, nbytes, make in plan:
        data = make()
        assert data.nbytes == nbytes and data.dtype == dtype, name
        w.write_tensor_data(data)
        total += nbytes
        del data
    w.close()
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--type", default="Q4_1", choices=TYPES,
                    help="the matrices' type (default Q4_1)")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the shape's")
    ap.add_argument("--window", type=int, default=0,
                    help="a smaller sliding window than the shape's (gemma3, gpt-oss), so short "
                         "tests reach it")
    ap.add_argument("--tokenizer-from", metavar="GGUF",
                    help="copy the tokenizer.* keys of this file (its vocabulary padded to the "
                         "shape's with [PAD] tokens when smaller), so the file can be served")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("out")
    a = ap.parse_args()
    write(a.out, a.shape, a.type, a.layers, a.window, a.tokenizer_from, a.seed)
    layers = a.layers or SHAPES[a.shape]["layers"]
    print(f"random_gguf: {a.out}: {a.shape}, {layers} layers, {a.type}, seed {a.seed}")


if __name__ == "__main__":
    main()
