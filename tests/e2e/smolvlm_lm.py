"""A small random-weight SmolVLM-style text model for the idefics3 tests.

SmolLM2-135M's vocabulary (49152 tokens) has none of the markers llama.cpp's
mtmd puts around an idefics3 image ("<fake_token_around_image>",
"<global-img>", "<row_r_col_c>"): looked up there they come out as -1 and the
row/column template as plain text (tests/e2e/vision_files.py). SmolVLM's own
text model is SmolLM2 with these added to the tokenizer, so

  write_smolvlm_lm(path, n_embd=256, ...)  -> path

writes a llama GGUF of a few random layers whose tokenizer is
SmolLM2-135M-Instruct's (every tokenizer.* key copied from the file, BPE
merges and pre-tokenizer "smollm" included) with SmolVLM's added tokens
appended after id 49151, in SmolVLM's order:

  49152          "<global-img>"                 USER_DEFINED
  49153..49188   "<row_r_col_c>", r, c in 1..6  USER_DEFINED (row-major)
  49189          "<fake_token_around_image>"    CONTROL
  49190          "<image>"                      CONTROL
  49191          "<end_of_utterance>"           CONTROL (also the EOS)

The types are what llama.cpp's converter (conversion/base.py
get_vocab_base) gives SmolVLM's tokenizer: transformers' Idefics3
processor adds the fake-token, image and end-of-utterance markers as
special AddedTokens (-> CONTROL), while "<global-img>" and the row/column
tokens are added but not special, and do not look special to the
converter (-> USER_DEFINED). Both kinds are matched as whole tokens when
special tokens are parsed, which is how mtmd tokenizes its markers. (The
real SmolVLM-256M vocabulary has 49280 entries; the reserved ones between
"<image>" and "<end_of_utterance>" are left out here, so the ids past 49190
differ from the real file's. The tests need only that llama.cpp and zinfer
read the same file.)

ADDED lists (text, type) in id order; added_ids() maps text -> id.
The weights: llama architecture, tied output (no output.weight, as
SmolLM2), RoPE base 100000, RMS eps 1e-5, matrices qtype (Q8_0 by default,
as ggml-org's SmolVLM GGUFs), norms F32 near 1. Token embedding rows of
standard deviation 0.3 (logits of a few units), the other matrices
1/sqrt(fan_in). n_embd is the projector's lm_dim (vision_files.write_mmproj).
"""

import os
from pathlib import Path

import gguf
import numpy as np
from gguf_files import stored, tokenizer_rows, write_gguf

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
SMOLLM2 = HOME / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
T = gguf.TokenType
Q = gguf.GGMLQuantizationType

ADDED = ([("<global-img>", T.USER_DEFINED)]
         + [(f"<row_{r}_col_{c}>", T.USER_DEFINED) for r in range(1, 7) for c in range(1, 7)]
         + [("<fake_token_around_image>", T.CONTROL), ("<image>", T.CONTROL),
            ("<end_of_utterance>", T.CONTROL)])


def added_ids(base=49152):
    """Added token text -> id (base: the SmolLM2 vocabulary's size)."""
    return {text: base + i for i, (text, _) in enumerate(ADDED)}


def _tokenizer(vocab_path):
    """SmolLM2's tokenizer rows with ADDED appended; (rows, n_vocab)."""
    rows, n_base = tokenizer_rows(vocab_path)
    ids = added_ids(n_base)
    out = []
    for key, value, vtype, sub in rows:
        if key == "tokenizer.ggml.tokens":
            value = list(value) + [t for t, _ in ADDED]
        elif key == "tokenizer.ggml.token_type":
            value = list(value) + [int(k) for _, k in ADDED]
        elif key == "tokenizer.ggml.eos_token_id":
            value = ids["<end_of_utterance>"]
        out.append((key, value, vtype, sub))
    return out, n_base + len(ADDED)


def _matrix(rng, rows, cols, sigma, qtype):
    return stored((rng.standard_normal((rows, cols)) * sigma).astype(np.float32), qtype)


def write_smolvlm_lm(path, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512, seed=0,
                     qtype=Q.Q8_0, vocab_path=SMOLLM2):
    """Writes the model (see the module comment); returns path."""
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd {n_embd}, n_head {n_head}, n_head_kv {n_head_kv} do not divide")
    rows, n_vocab = _tokenizer(vocab_path)
    hd = n_embd // n_head
    rng = np.random.default_rng(seed)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None

    t = {"token_embd.weight": _matrix(rng, n_vocab, n_embd, 0.3, qtype),
         "output_norm.weight": norm(n_embd)}
    for L in range(n_layer):
        b = f"blk.{L}."
        t[b + "attn_norm.weight"] = norm(n_embd)
        t[b + "attn_q.weight"] = _matrix(rng, n_head * hd, n_embd, n_embd ** -0.5, qtype)
        t[b + "attn_k.weight"] = _matrix(rng, n_head_kv * hd, n_embd, n_embd ** -0.5, qtype)
        t[b + "attn_v.weight"] = _matrix(rng, n_head_kv * hd, n_embd, n_embd ** -0.5, qtype)
        t[b + "attn_output.weight"] = _matrix(rng, n_embd, n_head * hd, (n_head * hd) ** -0.5,
                                              qtype)
        t[b + "ffn_norm.weight"] = norm(n_embd)
        t[b + "ffn_gate.weight"] = _matrix(rng, n_ff, n_embd, n_embd ** -0.5, qtype)
        t[b + "ffn_up.weight"] = _matrix(rng, n_ff, n_embd, n_embd ** -0.5, qtype)
        t[b + "ffn_down.weight"] = _matrix(rng, n_embd, n_ff, n_ff ** -0.5, qtype)
    hp = {"context_length": 8192, "embedding_length": n_embd, "feed_forward_length": n_ff,
          "block_count": n_layer, "attention.head_count": n_head,
          "attention.head_count_kv": n_head_kv, "rope.freq_base": 100000.0,
          "attention.layer_norm_rms_epsilon": 1e-5, "vocab_size": n_vocab,
          "rope.dimension_count": hd}
    meta = [("general.type", "model", gguf.GGUFValueType.STRING, None),
            ("general.name", "zinfer random SmolVLM-style text model",
             gguf.GGUFValueType.STRING, None),
            ("general.file_type", 7 if qtype == Q.Q8_0 else 1 if qtype == Q.F16 else 0,
             gguf.GGUFValueType.UINT32, None)]
    return write_gguf(path, "llama", meta + rows, hp, t)
