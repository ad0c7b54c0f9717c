#!/usr/bin/env python3
"""Writes a random-weight GGUF model with a real model's shapes.

For checking a backend on full-size shapes where the real weights cannot
travel (scripts/gpu-check runs this on the GPU machine): the metadata of
the named shape, and every tensor filled with random blocks of the chosen
type, drawn straight as block bytes (scales and integer codes), so a 270 M
parameter file is written in seconds and needs no quantizer. Deterministic
from --seed. Weight scales give each product unit variance and logits with
a standard deviation near 2, so greedy decoding has real gaps to compare.
No tokenizer: feed token ids.

  random_gguf.py --shape smollm2-135m|gemma3-270m [--type Q4_1] [--layers N]
                 [--window N] [--tokenizer-from GGUF] [--seed 1] OUT.gguf
"""

import argparse
import math

import numpy as np

import gguf

Q = gguf.GGMLQuantizationType

# The real files' hyper-parameters (read from SmolLM2-135M-Instruct.Q4_1.gguf
# and gemma-3-270m-q4_k_m.gguf with `zinfer info` and gguf's reader).
SHAPES = {
    "smollm2-135m": dict(arch="llama", dim=576, layers=30, ffn=1536, heads=9, kv=3, head=64,
                         vocab=49152, ctx=8192, eps=1e-5, rope=100000.0, embd=Q.Q8_0),
    "gemma3-270m": dict(arch="gemma3", dim=640, layers=18, ffn=2048, heads=4, kv=1, head=256,
                        vocab=262144, ctx=32768, eps=1e-6, rope=1000000.0, embd=Q.Q8_0,
                        window=512),
}


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
    elif qtype == Q.F16:
        return (rng.standard_normal((rows, cols)) * sigma).astype(np.float16)
    else:
        raise SystemExit(f"random_gguf: type {qtype.name} is not drawn here")
    return b.reshape(rows, -1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--type", default="Q4_1", choices=["Q4_0", "Q4_1", "Q8_0", "F16"],
                    help="the matrices' type (default Q4_1)")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the shape's")
    ap.add_argument("--window", type=int, default=0,
                    help="a smaller sliding window than the shape's (gemma3), so short tests reach it")
    ap.add_argument("--tokenizer-from", metavar="GGUF",
                    help="copy the tokenizer.* keys of this file (same vocabulary size), so the "
                         "file can be served")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("out")
    a = ap.parse_args()
    s = SHAPES[a.shape]
    arch, dim, ffn, head = s["arch"], s["dim"], s["ffn"], s["head"]
    layers = a.layers or s["layers"]
    qd, kvd = s["heads"] * head, s["kv"] * head
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"random {a.shape} ({a.type}, seed {a.seed})")
    w.add_uint32(f"{arch}.context_length", s["ctx"])
    w.add_uint32(f"{arch}.embedding_length", dim)
    w.add_uint32(f"{arch}.block_count", layers)
    w.add_uint32(f"{arch}.feed_forward_length", ffn)
    w.add_uint32(f"{arch}.attention.head_count", s["heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", s["kv"])
    w.add_uint32(f"{arch}.attention.key_length", head)
    w.add_uint32(f"{arch}.attention.value_length", head)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", s["eps"])
    w.add_float32(f"{arch}.rope.freq_base", s["rope"])
    if "window" in s:
        w.add_uint32(f"{arch}.attention.sliding_window", a.window or s["window"])
    if a.tokenizer_from:
        r = gguf.GGUFReader(a.tokenizer_from)
        for key, field in r.fields.items():
            if key.startswith("tokenizer."):
                vtype = field.types[0]
                sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
                w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    qt = Q[a.type]
    one = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    # the embedding doubles as the output head (tied, as in both real files)
    w.add_tensor("token_embd.weight", blocks(rng, s["embd"], s["vocab"], dim, 2.0 / math.sqrt(dim)),
                 raw_dtype=s["embd"])
    w.add_tensor("output_norm.weight", one(dim))
    for L in range(layers):
        p = f"blk.{L}."
        mats = [("attn_q", qd, dim), ("attn_k", kvd, dim), ("attn_v", kvd, dim),
                ("attn_output", dim, qd), ("ffn_gate", ffn, dim), ("ffn_up", ffn, dim),
                ("ffn_down", dim, ffn)]
        for name, rows, cols in mats:
            data = blocks(rng, qt, rows, cols, 1.0 / math.sqrt(cols))
            w.add_tensor(p + name + ".weight", data, raw_dtype=None if qt == Q.F16 else qt)
        w.add_tensor(p + "attn_norm.weight", one(dim))
        w.add_tensor(p + "ffn_norm.weight", one(dim))
        if arch == "gemma3":
            w.add_tensor(p + "attn_q_norm.weight", one(head))
            w.add_tensor(p + "attn_k_norm.weight", one(head))
            w.add_tensor(p + "post_attention_norm.weight", one(dim))
            w.add_tensor(p + "post_ffw_norm.weight", one(dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"random_gguf: {a.out}: {a.shape}, {layers} layers, {a.type}, seed {a.seed}")


if __name__ == "__main__":
    main()
