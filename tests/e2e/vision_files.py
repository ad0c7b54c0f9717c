"""Random-weight llama.cpp projector files (`--mmproj`, GGUF architecture
"clip") for the image-tower tests.

write_mmproj(path, kind, lm_dim, seed=0, n_layers=2, **overrides) writes the
vision tower of one of KINDS with the keys, tensor names, shapes and types
that llama.cpp's converter (convert_hf_to_gguf.py: conversion/base.py
MmprojModel, gemma.py Gemma3VisionModel, smolvlm.py SmolVLMModel) writes
with --outtype f16, which is how the published mmproj files are made:

  general.architecture "clip", general.type "mmproj", general.file_type 1
  clip.has_vision_encoder true, clip.projector_type, clip.use_gelu true
  clip.vision.image_size, .patch_size, .embedding_length,
    .feed_forward_length, .block_count, .attention.head_count,
    .attention.layer_norm_epsilon, .projection_dim (the text model's
    embedding length), .image_mean, .image_std
  gemma3:   clip.vision.projector.scale_factor only when it is not 4 (the
            converter's rule; clip.cpp defaults n_merge to 4)
  idefics3: clip.vision.projector.scale_factor (always) and
            clip.vision.preproc_image_size (the processor's longest edge)

  v.patch_embd.weight       F32 [ps, ps, 3, n_embd]  (numpy [n_embd][3][ps][ps])
  v.patch_embd.bias         F32 [n_embd]
  v.position_embd.weight    F32 [n_embd, n_patches]
  v.blk.N.ln1/ln2.{weight,bias}                      F32 [n_embd]
  v.blk.N.attn_{q,k,v,out}.weight F16 [n_embd, n_embd], .bias F32
  v.blk.N.ffn_up.weight     F16 [n_embd, n_ff] (SigLIP fc1), .bias F32 [n_ff]
  v.blk.N.ffn_down.weight   F16 [n_ff, n_embd] (fc2), .bias F32 [n_embd]
  v.post_ln.{weight,bias}   F32 [n_embd]
  gemma3:   mm.soft_emb_norm.weight F32 [n_embd] (stored with Gemma's +1),
            mm.input_projection.weight F16 [lm_dim, n_embd]
            (numpy [n_embd][lm_dim]: HF's parameter as it is, used x @ W)
  idefics3: mm.model.fc.weight F16 [n_embd * sf^2, lm_dim]
            (numpy [lm_dim][n_embd * sf^2], no bias)

(the converter forces every "*.embeddings.*" tensor, patch and position
embedding, to F32 for these two; 1-D tensors are always F32.)

Defaults are the real towers except the layer count: Gemma 3 (SigLIP-So400m
at 896 px: patch 14, hidden 1152, ffn 4304, 16 heads, eps 1e-6, 256 soft
tokens after the 4x4 average pool) and SmolVLM-256M (SigLIP-B/16 at 512 px:
hidden 768, ffn 3072, 12 heads, scale factor 4, longest edge 2048, eps
1e-5: the converter's default, SmolVLM's config does not give one).
overrides: any key of the kind's config (image_size, patch_size, n_embd,
n_ff, n_head, eps, n_merge, preproc_image_size, mean, std) and the weight
scales (patch_sigma, pos_sigma, ln_sigma, bias_sigma, attn_sigma,
proj_sigma). The tests shrink image_size (and idefics3's longest edge) so
that the float64 reference stays fast.

Scales: patch embedding ~N(0, 1) per element of a [-1, 1] image, position
embedding 0.3, LayerNorm weights 1 + N(0, ln_sigma), biases N(0, 0.05),
Q/K/V/out and fc1/fc2 with standard deviation 1/sqrt(fan_in) (unit-variance
products of the LayerNorm outputs; attention logits of standard deviation
~1 with attn_sigma 1), the projector 1/sqrt(fan_in): soft tokens of
standard deviation ~1 that differ clearly between images.

Text-side tokens (what llama.cpp's mtmd.cpp puts around the image
embeddings; see numpy_vision.token_layout):
  gemma3:   "<start_of_image>" [256 soft tokens] "<end_of_image>"
            (gemma-3-270m: ids 255999 and 256000, special tokens; Gemma 3's
            own "<image_soft_token>" 262144 is not in the 270m vocabulary
            and mtmd does not use it: it puts embeddings, not tokens)
  idefics3: per tile (row r, column c, 1-based, row-major)
            "<fake_token_around_image><row_r_col_c>" [tile's tokens], "\\n"
            after every row but the last; then "\\n\\n",
            "<fake_token_around_image>", "<global-img>" [overview's tokens]
            "<fake_token_around_image>". These exist in SmolVLM's extended
            vocabulary, not in SmolLM2-135M's (49152 tokens): there
            lookup_token finds only "\\n\\n" (id 1116; "\\n" is 198), the two
            marker ids come out as -1 (LLAMA_TOKEN_NULL) and the row/col
            template is tokenized as plain text. The embeddings do not
            depend on this.
MARKERS lists these strings per kind; vocab_markers(model_path, kind) maps
each to its id in a text model's vocabulary (None where absent).
"""

import os
from pathlib import Path

import gguf
import numpy as np
from gguf_files import cached_write

F16 = gguf.GGMLQuantizationType.F16
F32 = gguf.GGMLQuantizationType.F32

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
# the text models the tests pair each kind with, and their embedding length
TEXT_MODELS = {
    "gemma3": (HOME / "models" / "gemma-3-270m-q4_k_m.gguf", 640),
    "idefics3": (HOME / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf", 576),
}
# the tests' towers: the real widths, smaller tiles (gemma3: 16 soft tokens;
# idefics3: several 128 px tiles of an image at most 384 px on its long side)
SMALL = {
    "gemma3": dict(image_size=224),
    "idefics3": dict(image_size=128, preproc_image_size=384),
}

KINDS = {
    # google/gemma-3-*-it's vision tower (siglip-so400m-patch14-896)
    "gemma3": dict(projector="gemma3", image_size=896, patch_size=14, n_embd=1152, n_ff=4304,
                   n_head=16, eps=1e-6, n_merge=4, preproc_image_size=0,
                   mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    # HuggingFaceTB/SmolVLM-256M-Instruct's vision tower
    "idefics3": dict(projector="idefics3", image_size=512, patch_size=16, n_embd=768, n_ff=3072,
                     n_head=12, eps=1e-5, n_merge=4, preproc_image_size=2048,
                     mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
}
SCALES = dict(patch_sigma=1.0, pos_sigma=0.3, ln_sigma=0.1, bias_sigma=0.05, attn_sigma=1.0,
              proj_sigma=1.0)

MARKERS = {
    "gemma3": ["<start_of_image>", "<end_of_image>"],
    "idefics3": ["<fake_token_around_image>", "<global-img>", "<row_1_col_1>", "\n", "\n\n"],
}


def config(kind, **overrides):
    """The kind's config with overrides applied (KINDS + SCALES)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (one of {sorted(KINDS)})")
    cfg = dict(KINDS[kind], **SCALES)
    for k, v in overrides.items():
        if k not in cfg:
            raise ValueError(f"unknown override {k!r} for {kind}")
        cfg[k] = v
    return cfg


def tower_tensors(rng, kind, lm_dim, n_layers, cfg):
    """name -> (array, GGML type) of the tower, numpy shapes (GGUF reversed)."""
    d, ff, ps = cfg["n_embd"], cfg["n_ff"], cfg["patch_size"]
    n_patches = (cfg["image_size"] // ps) ** 2
    bs = cfg["bias_sigma"]

    def mat(rows, cols, sigma=1.0):
        return (rng.standard_normal((rows, cols)) * sigma / np.sqrt(cols)).astype(np.float16)

    def vec(n, mean, sigma):
        return (mean + sigma * rng.standard_normal(n)).astype(np.float32)

    t = {}
    t["v.patch_embd.weight"] = (
        (rng.standard_normal((d, 3, ps, ps)) * cfg["patch_sigma"] / np.sqrt(3 * ps * ps))
        .astype(np.float32), F32)
    t["v.patch_embd.bias"] = (vec(d, 0.0, bs), F32)
    t["v.position_embd.weight"] = (
        (rng.standard_normal((n_patches, d)) * cfg["pos_sigma"]).astype(np.float32), F32)
    for i in range(n_layers):
        p = f"v.blk.{i}."
        t[p + "ln1.weight"] = (vec(d, 1.0, cfg["ln_sigma"]), F32)
        t[p + "ln1.bias"] = (vec(d, 0.0, bs), F32)
        for name in ("attn_q", "attn_k", "attn_v"):
            t[p + name + ".weight"] = (mat(d, d, cfg["attn_sigma"] if name != "attn_v" else 1.0), F16)
            t[p + name + ".bias"] = (vec(d, 0.0, bs), F32)
        t[p + "attn_out.weight"] = (mat(d, d), F16)
        t[p + "attn_out.bias"] = (vec(d, 0.0, bs), F32)
        t[p + "ln2.weight"] = (vec(d, 1.0, cfg["ln_sigma"]), F32)
        t[p + "ln2.bias"] = (vec(d, 0.0, bs), F32)
        t[p + "ffn_up.weight"] = (mat(ff, d), F16)
        t[p + "ffn_up.bias"] = (vec(ff, 0.0, bs), F32)
        t[p + "ffn_down.weight"] = (mat(d, ff), F16)
        t[p + "ffn_down.bias"] = (vec(d, 0.0, bs), F32)
    t["v.post_ln.weight"] = (vec(d, 1.0, cfg["ln_sigma"]), F32)
    t["v.post_ln.bias"] = (vec(d, 0.0, bs), F32)
    if kind == "gemma3":
        t["mm.soft_emb_norm.weight"] = (vec(d, 1.0, 0.3), F32)
        t["mm.input_projection.weight"] = (
            (rng.standard_normal((d, lm_dim)) * cfg["proj_sigma"] / np.sqrt(d)).astype(np.float16), F16)
    else:
        k = d * cfg["n_merge"] ** 2
        t["mm.model.fc.weight"] = (mat(lm_dim, k, cfg["proj_sigma"]), F16)
    return t


def write_mmproj(path, kind, lm_dim, seed=0, n_layers=2, **overrides):
    """Writes a random-weight projector file of kind ("gemma3" or
    "idefics3") for a text model of embedding length lm_dim, a copy of the
    test-file cache's when it holds it; returns path."""
    cfg = config(kind, **overrides)
    ps, size = cfg["patch_size"], cfg["image_size"]
    if size % ps:
        raise ValueError(f"image_size {size} is not a multiple of patch_size {ps}")
    if cfg["n_embd"] % cfg["n_head"]:
        raise ValueError(f"n_embd {cfg['n_embd']} is not a multiple of n_head {cfg['n_head']}")
    return cached_write(path, "vision_files.write_mmproj", (kind, lm_dim, seed, n_layers, cfg),
                        lambda p: _write_mmproj(p, kind, lm_dim, seed, n_layers, cfg),
                        sources=(__file__,))


def _write_mmproj(path, kind, lm_dim, seed, n_layers, cfg):
    ps, size = cfg["patch_size"], cfg["image_size"]
    rng = np.random.default_rng(seed)
    tensors = tower_tensors(rng, kind, lm_dim, n_layers, cfg)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.type", "mmproj")
    w.add_uint32("general.file_type", 1)  # MOSTLY_F16
    w.add_string("general.name", f"zinfer random {kind} tower")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", cfg["projector"])
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.projection_dim", lm_dim)
    w.add_uint32("clip.vision.image_size", size)
    w.add_uint32("clip.vision.patch_size", ps)
    w.add_uint32("clip.vision.embedding_length", cfg["n_embd"])
    w.add_uint32("clip.vision.feed_forward_length", cfg["n_ff"])
    w.add_uint32("clip.vision.block_count", n_layers)
    w.add_uint32("clip.vision.attention.head_count", cfg["n_head"])
    w.add_array("clip.vision.image_mean", [float(x) for x in cfg["mean"]])
    w.add_array("clip.vision.image_std", [float(x) for x in cfg["std"]])
    w.add_float32("clip.vision.attention.layer_norm_epsilon", cfg["eps"])
    if kind == "gemma3":
        if cfg["n_merge"] != 4:
            w.add_uint32("clip.vision.projector.scale_factor", cfg["n_merge"])
    else:
        w.add_uint32("clip.vision.projector.scale_factor", cfg["n_merge"])
        w.add_uint32("clip.vision.preproc_image_size", cfg["preproc_image_size"])
    for name, (data, raw) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def vocab_markers(model_path, kind):
    """Marker string -> token id in the text model's vocabulary (None when
    absent), matching each token's text as llama.cpp's lookup_token does
    (byte-level BPE vocabularies store "\\n" as "Ċ")."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "ref"))
    import gguf_meta
    r = gguf_meta.read(model_path, tensors=False)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    bpe = r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    index = {t: i for i, t in enumerate(toks)}
    out = {}
    for m in MARKERS[kind]:
        key = m.replace("\n", "\u010a").replace(" ", "\u0120") if bpe else m
        out[m] = index.get(key)
    return out


def images():
    """name -> RGB uint8 [H][W][3]."""
    rng = np.random.default_rng(7)
    out = {}
    yy, xx = np.mgrid[0:300, 0:400]
    out["gradient"] = np.stack([xx * 255 // 399, yy * 255 // 299,
                                255 - (xx + yy) * 255 // 698], -1).astype(np.uint8)
    yy, xx = np.mgrid[0:256, 0:256]
    out["stripes"] = np.stack([((xx // 8) % 2) * 255, ((yy // 16) % 2) * 200,
                               ((xx + yy) // 12 % 2) * 160], -1).astype(np.uint8)
    out["noise"] = rng.integers(0, 256, (240, 180, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:517, 0:333]
    r = np.hypot(xx - 160.0, yy - 300.0)
    out["odd_333x517"] = np.stack([(np.sin(r / 9) * 127 + 128), xx * 255 / 332,
                                   (yy * 7 + xx * 3) % 256], -1).astype(np.uint8)
    yy, xx = np.mgrid[0:160, 0:640]
    out["wide_640x160"] = np.stack([((xx // 20 + yy // 20) % 2) * 230 + 10,
                                    np.abs(np.sin(xx / 30.0)) * 255,
                                    yy * 255 // 159], -1).astype(np.uint8)
    return out


def cos_dist(a, b):
    """1 - cos of two arrays as flat vectors, in float64."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(1.0 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def token_dists(a, b):
    """1 - cos of each row pair of two [n][d] arrays, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return 1.0 - (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
