"""Small deterministic WavTokenizer decoder GGUF files for the speech tests.

write_wavtokenizer(path, seed=None, **overrides) writes a random-weight file
of GGUF architecture "wavtokenizer-dec" as llama.cpp's converter writes
OuteTTS's decoder (conversion/wavtokenizer.py): tokenizer.ggml.model
"none" with wavtokenizer-dec.vocab_size, the features / posnet / convnext
widths and block counts, group-norm groups and epsilons, and the tensors
with llama.cpp's names and shapes (src/models/wavtokenizer-dec.cpp). The
widths are the real model's (features 512, posnet and convnext 768,
n_ff 2304, 4096 codes, output 1282 = n_fft 1280 + 2); only the ConvNeXt
stack is shorter (2 blocks instead of 12). The posnet keeps its fixed
six-layer shape (resnet, resnet, attention, resnet, resnet, norm).

All tensors are F32. Weights are scaled for unit-variance activations; the
output's standard deviation is ~1.5 so that a few log-magnitudes pass
ln(100) and the head's clamp at 100 bites.

  path, tensors, hp = write_wavtokenizer(tmp / "dec.gguf")
  write_wavtokenizer(p, drop=("convnext.1.gamma.weight",))
  write_wavtokenizer(p, replace={"output.weight": np.zeros((1282, 700), np.float32)})

overrides: any key of CONFIG; drop: tensor names left out; replace: name ->
array written instead. Returns (path, tensors, hp): tensors maps name ->
float32 array as written (before drop / replace), hp the config used.
"""

import gguf
import numpy as np
from gguf_files import write_gguf

ARCH = "wavtokenizer-dec"

CONFIG = dict(
    seed=4701, n_vocab=4096, n_features=512, n_embd=768, n_ff=2304, n_out=1282,
    posnet_layers=6, convnext_layers=2, groups=32, group_eps=1e-6, norm_eps=1e-6,
    out_sigma=1.5, n_ctx=8192)


def tensors_for(cfg):
    """name -> float32 array (numpy shape: GGUF ne reversed)."""
    rng = np.random.default_rng(cfg["seed"])
    f, c, ff, no = cfg["n_features"], cfg["n_embd"], cfg["n_ff"], cfg["n_out"]

    def w(shape, fan_in, sigma=1.0):
        return (rng.standard_normal(shape) * sigma / np.sqrt(fan_in)).astype(np.float32)

    def norm(n, shape=None):  # weight near 1, bias near 0
        shape = shape or (n,)
        return ((1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32),
                (0.1 * rng.standard_normal(shape)).astype(np.float32))

    t = {}
    t["token_embd.weight"] = rng.standard_normal((cfg["n_vocab"], f)).astype(np.float32)
    t["conv1d.weight"] = w((c, f, 7), f * 7)
    t["conv1d.bias"] = w((c, 1), 1, 0.1)
    for i in range(cfg["posnet_layers"]):
        p = f"posnet.{i}."
        if i in (0, 1, 3, 4):
            for n in ("norm1", "norm2"):
                t[p + n + ".weight"], t[p + n + ".bias"] = norm(c, (c, 1))
            for n in ("conv1", "conv2"):
                t[p + n + ".weight"] = w((c, c, 3), c * 3)
                t[p + n + ".bias"] = w((c, 1), 1, 0.1)
        elif i == 2:
            t[p + "attn_norm.weight"], t[p + "attn_norm.bias"] = norm(c, (c, 1))
            for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
                t[p + n + ".weight"] = w((c, c, 1), c)
                t[p + n + ".bias"] = w((c, 1), 1, 0.1)
        else:  # 5: the final group norm (llama.cpp names it attn_norm)
            t[p + "attn_norm.weight"], t[p + "attn_norm.bias"] = norm(c, (c, 1))
    t["token_embd_norm.weight"], t["token_embd_norm.bias"] = norm(c)
    for i in range(cfg["convnext_layers"]):
        p = f"convnext.{i}."
        t[p + "dw.weight"] = w((c, 1, 7), 7)
        t[p + "dw.bias"] = w((c, 1), 1, 0.1)
        t[p + "norm.weight"], t[p + "norm.bias"] = norm(c)
        t[p + "pw1.weight"] = w((ff, c), c)
        t[p + "pw1.bias"] = w((ff,), 1, 0.1)
        t[p + "pw2.weight"] = w((c, ff), ff)
        t[p + "pw2.bias"] = w((c,), 1, 0.1)
        t[p + "gamma.weight"] = (0.5 + 0.25 * rng.standard_normal(c)).astype(np.float32)
    t["output_norm.weight"], t["output_norm.bias"] = norm(c)
    t["output.weight"] = w((no, c), c, cfg["out_sigma"])
    t["output.bias"] = w((no,), 1, 0.1)
    return t


def write_wavtokenizer(path, seed=None, drop=(), replace=None, extra=None, **overrides):
    """Writes the file (see the module doc); extra: more '<arch>.' keys
    written after (and so overriding) the config's."""
    cfg = dict(CONFIG)
    cfg.update(overrides)
    if seed is not None:
        cfg["seed"] = seed
    tensors = tensors_for(cfg)
    hp = {
        "vocab_size": cfg["n_vocab"],
        "context_length": cfg["n_ctx"],
        "embedding_length": cfg["n_out"],
        "block_count": max(cfg["posnet_layers"], cfg["convnext_layers"]),
        "feed_forward_length": cfg["n_ff"],
        "attention.head_count": 1,
        "attention.layer_norm_epsilon": float(cfg["norm_eps"]),
        "attention.group_norm_epsilon": float(cfg["group_eps"]),
        "attention.group_norm_groups": cfg["groups"],
        "attention.causal": False,
        "features_length": cfg["n_features"],
        "posnet.embedding_length": cfg["n_embd"],
        "posnet.block_count": cfg["posnet_layers"],
        "convnext.embedding_length": cfg["n_embd"],
        "convnext.block_count": cfg["convnext_layers"],
    }
    hp.update(extra or {})
    rows = [("tokenizer.ggml.model", "none", gguf.GGUFValueType.STRING, None),
            ("general.name", "wavtokenizer-test", gguf.GGUFValueType.STRING, None)]
    out = dict(tensors)
    out.update(replace or {})
    write_gguf(path, ARCH, rows=rows, hparams=hp,
               tensors={k: (v, None) for k, v in out.items()}, drop=drop)
    return path, tensors, cfg
