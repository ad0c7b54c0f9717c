"""A random-weight OuteTTS codec LLM (the text-to-codec half of the TTS
pipeline) for the speech tests.

OuteTTS-0.2-500M is Qwen2.5-0.5B (HF Qwen2ForCausalLM, GGUF architecture
"qwen2") trained further on prompts in which each word of the text is
followed by its WavTokenizer codes. write_codec_llm(path, ...) writes that
model as llama.cpp's converter would, with random weights and fewer
layers:

  qwen2: dim 896, 24 layers (n_layers here, default 2), 14 heads / 2 KV
         heads of 64, feed-forward 4864, RoPE base 1e6, RMS eps 1e-6,
         Q/K/V biases, tied output head (no output.weight), context 4096
  vocabulary: ggml-vocab-qwen2.gguf's 151646 tokens (Qwen2's BPE, merges
         and pre-tokenizer), then Qwen2.5's specials to 151664, then the
         tokens OuteTTS 0.2 adds, as USER_DEFINED tokens (the tokenizer
         matches them in any text, as the HF tokenizer does its added tokens):
           151665 <|text_start|>   151666 <|text_end|>
           151667 <|audio_start|>  151668 <|audio_end|>
           151669 <|code_start|>   151670 <|code_end|>
           151671 <|text_sep|>
           151672..155771  <|0|> .. <|4099|>   (codec tokens)
           155772..156772  <|t_0.00|> .. <|t_10.00|>   (word durations)
         and [PAD<id>] up to the model's 157696 rows.
  (these ids are the ones llama.cpp's OuteTTS example used: its default
   speaker's tokens have <|code_start|> 151669, <|code_end|> 151670,
   <|t_0.08|> 155780, and it kept tokens 151672..155772 as codes.)

EOS is <|im_end|> (151645), BOS <|endoftext|> (not added).

The embedding (which is also the output head) has standard deviation
embd_sigma, 0.07: logits of standard deviation ~2, so that greedy choices
among the 4100 codes have real gaps without one token taking all the
probability. Weights are drawn as Q8_0 block bytes (int8 codes, an f16 scale per 32)
so that the 157696 x 896 embedding is written in a second; norms and
biases F32. `code_end_bias` adds an output.bias (which llama.cpp's qwen2
and zinfer both apply) that is zero but for <|code_end|>: with random
weights the model would otherwise almost never close a word (one token
against 4100 codes), and the tests want words that end.
"""

import os
from pathlib import Path

import gguf
import numpy as np

from gguf_files import cached_write, tokenizer_rows, write_gguf

VOCAB = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer")) / \
    "llama.cpp-vendor" / "models" / "ggml-vocab-qwen2.gguf"

QWEN25_SPECIALS = ["<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                   "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                   "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                   "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                   "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
OUTETTS_MARKERS = ["<|text_start|>", "<|text_end|>", "<|audio_start|>", "<|audio_end|>",
                   "<|code_start|>", "<|code_end|>", "<|text_sep|>"]
N_CODES = 4100
N_TIMES = 1001
N_ROWS = 157696

TEXT_START, TEXT_END, AUDIO_START, AUDIO_END = 151665, 151666, 151667, 151668
CODE_START, CODE_END, TEXT_SEP = 151669, 151670, 151671
CODE0 = 151672
TIME0 = CODE0 + N_CODES  # 155772
IM_START, IM_END = 151644, 151645

REAL = dict(dim=896, layers=24, heads=14, kv=2, ffn=4864, ctx=4096, eps=1e-6, rope=1000000.0)


def vocabulary():
    """(tokens, types): the OuteTTS 0.2 vocabulary, N_ROWS entries."""
    rows, n = tokenizer_rows(VOCAB)
    r = {k: v for k, v, _, _ in rows}
    toks = list(r["tokenizer.ggml.tokens"][:151646])
    types = list(r["tokenizer.ggml.token_type"][:151646])
    T = gguf.TokenType
    add = QWEN25_SPECIALS
    toks += add
    types += [T.CONTROL] * len(add)
    assert len(toks) == TEXT_START
    toks += OUTETTS_MARKERS + [f"<|{i}|>" for i in range(N_CODES)]
    toks += [f"<|t_{i / 100:.2f}|>" for i in range(N_TIMES)]
    types += [T.USER_DEFINED] * (len(toks) - len(types))
    assert toks[TIME0 + 8] == "<|t_0.08|>" and toks[CODE0 + 4099] == "<|4099|>"
    pad = N_ROWS - len(toks)
    toks += [f"[PAD{len(toks) + i}]" for i in range(pad)]
    types += [T.UNUSED] * pad
    return toks, types, r


def q8_bytes(rng, rows, cols, sigma):
    """rows x cols Q8_0 blocks (f16 d, 32 int8) of standard deviation ~sigma."""
    nb = rows * cols // 32
    q = rng.integers(-127, 128, (nb, 32), dtype=np.int8)
    d = np.full((nb, 1), sigma / 73.3, np.float16)  # std of uniform int8 codes: 73.3
    return np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=1).reshape(rows, -1)


def write_codec_llm(path, n_layers=2, seed=0, code_end_bias=0.0, embd_sigma=0.07, **shape):
    """Writes the codec LLM GGUF at path (REAL shapes, n_layers layers, any
    REAL key overridden by shape), a copy of the test-file cache's when it
    holds it, and returns path."""
    return cached_write(path, "tts_llm_files.write_codec_llm", (
        VOCAB, n_layers, seed, code_end_bias, embd_sigma, shape), lambda p: _write_codec_llm(
            p, n_layers, seed, code_end_bias, embd_sigma, **shape), sources=(__file__,))


def _write_codec_llm(path, n_layers, seed, code_end_bias, embd_sigma, **shape):
    s = dict(REAL, **shape)
    D, FF, NH, NKV = s["dim"], s["ffn"], s["heads"], s["kv"]
    hd = D // NH
    rng = np.random.default_rng(seed)
    Q = gguf.GGMLQuantizationType
    toks, types, r = vocabulary()

    def mat(rows, cols, sigma=None):
        return q8_bytes(rng, rows, cols, sigma or 1.0 / np.sqrt(cols)), Q.Q8_0

    def vec(n, centre=0.0, sigma=0.1):
        return (centre + sigma * rng.standard_normal(n)).astype(np.float32), None

    t = {"token_embd.weight": mat(N_ROWS, D, embd_sigma), "output_norm.weight": vec(D, 1.0)}
    for i in range(n_layers):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": vec(D, 1.0), b + "ffn_norm.weight": vec(D, 1.0),
                  b + "attn_q.weight": mat(D, D), b + "attn_q.bias": vec(D),
                  b + "attn_k.weight": mat(NKV * hd, D), b + "attn_k.bias": vec(NKV * hd),
                  b + "attn_v.weight": mat(NKV * hd, D), b + "attn_v.bias": vec(NKV * hd),
                  b + "attn_output.weight": mat(D, D),
                  b + "ffn_gate.weight": mat(FF, D), b + "ffn_up.weight": mat(FF, D),
                  b + "ffn_down.weight": mat(D, FF)})
    if code_end_bias:
        ob = np.zeros(N_ROWS, np.float32)
        ob[CODE_END] = code_end_bias
        t["output.bias"] = (ob, None)
    V = gguf.GGUFValueType
    rows = [("general.name", "OuteTTS-0.2-500M (random weights)", V.STRING, None),
            ("tokenizer.ggml.model", "gpt2", V.STRING, None),
            ("tokenizer.ggml.pre", "qwen2", V.STRING, None),
            ("tokenizer.ggml.tokens", toks, V.ARRAY, V.STRING),
            ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
            ("tokenizer.ggml.merges", list(r["tokenizer.ggml.merges"]), V.ARRAY, V.STRING),
            ("tokenizer.ggml.bos_token_id", 151643, V.UINT32, None),
            ("tokenizer.ggml.eos_token_id", IM_END, V.UINT32, None),
            ("tokenizer.ggml.padding_token_id", 151643, V.UINT32, None),
            ("tokenizer.ggml.add_bos_token", False, V.BOOL, None)]
    hp = {"block_count": n_layers, "context_length": s["ctx"], "embedding_length": D,
          "feed_forward_length": FF, "attention.head_count": NH, "attention.head_count_kv": NKV,
          "rope.freq_base": float(s["rope"]), "attention.layer_norm_rms_epsilon": float(s["eps"])}
    return write_gguf(path, "qwen2", rows, hp, t)


if __name__ == "__main__":
    import sys
    write_codec_llm(sys.argv[1], n_layers=int(sys.argv[2]) if len(sys.argv) > 2 else 2)
