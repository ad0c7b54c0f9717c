#!/usr/bin/env python3
"""Independent float64 reference of llama.cpp's image towers (tools/mtmd) for
Gemma 3 and SmolVLM / Idefics3 projector files (GGUF architecture "clip").

Used only by tests (never linked into zinfer). Three parts:

(a) preprocess(model, rgb) -> Preproc: the float32 images llama.cpp feeds
    the tower for an RGB uint8 array [H][W][3], in encode order.
    Resizing is llama.cpp's Pillow-exact resampler (mtmd-image.cpp
    resize_pillow): separable, horizontal pass then vertical, each on uint8,
    filter support 1 (bilinear, triangle), 3 (lanczos, sinc(x) sinc(x/3));
    when shrinking the support widens by in/out; for output pixel i the
    center is (i + 0.5) * in/out, inputs int(center - support + 0.5) ..
    int(center + support + 0.5) - 1 (clamped), weights normalized to sum 1,
    then to 22-bit fixed point (w * 2^22 +- 0.5, truncated); each output is
    (2^21 + sum(p * w)) >> 22 clamped to 0..255. A pass runs only where the
    size changes. Then x / 255 and (x - mean[c]) / std[c] in float32.
      gemma3 (fixed size): scale = min(S/w, S/h) in float32, the image
        resized bilinearly to min(ceil(w * scale), S) x min(ceil(h * scale),
        S) and pasted on an S x S black canvas at ((S - w') / 2, (S - h') / 2)
        (integer division): aspect kept, padded (PAD_CEIL).
      idefics3 (longest edge L = clip.vision.preproc_image_size, tile T =
        image_size), all resizes lanczos: if w >= h, w' = L, h' = int(L / (w
        / h)) (double), plus 1 when odd; else the same with sides swapped.
        The image is resized to w' x h', that to the refined size (ceil(w'/T)
        T) x (ceil(h'/T) T), the refined image to T x T for the overview;
        the tiles are the T x T crops of the refined image, row-major.
        Encode order: the tiles, then the overview (mtmd puts the overview
        last for idefics3).
(b) embed(model, rgb) -> [n_soft_tokens, lm_dim] float64, all tiles in
    llama.cpp's order. The tower (clip.cpp build_inp/build_vit,
    models/siglip.cpp), weights dequantized with gguf.quants:
      x = conv(patch_embd, image, stride ps) + patch_bias + position_embd
          (patch p = py * (W / ps) + px; the kernel [n_embd][c][ky][kx])
      per layer: h = x + Wo . attn(Wq ln1(x) + bq, Wk ln1(x) + bk, Wv ln1(x) + bv) + bo
                 x = h + W2 . gelu_tanh(W1 ln2(h) + b1) + b2
      x = post_ln(x)        (LayerNorm with weight and bias, eps from the file)
    attention over all patches, no mask, scale 1/sqrt(n_embd / n_head).
      gemma3: patches as a P x P grid averaged over n_merge x n_merge blocks
        (row-major blocks), RMS-normalized (the same eps) times
        mm.soft_emb_norm.weight, then @ mm.input_projection.weight
        ([n_embd][lm_dim]).
      idefics3: pixel shuffle with s = n_merge (build_patch_merge_permute):
        the [H/ps][W/ps] grid of n_embd vectors becomes [H/ps/s][W/ps/s]
        vectors of s*s*n_embd, block (by, bx)'s vector the concatenation
        over dy, then dx of patch (by*s + dy, bx*s + dx); then
        mm.model.fc.weight ([lm_dim][s*s*n_embd]) times it, no bias.
(c) token_layout(model, rgb or Preproc) -> the text-side layout mtmd.cpp
    builds around the image: a list of ("text", str) and ("image", n)
    items (n soft tokens, one image chunk).

Ablations for the tests (embed(..., ablate=...)): "soft_emb_norm" (gemma3
without the RMS norm and its weight), "pool_max" (gemma3 max instead of
average pool), "pixel_shuffle" (idefics3 with the shuffle's inner order
dx-major), "resize" (bicubic instead of the kind's filter), "resize_order" (each
resize's vertical pass first, as Pillow itself sometimes does), "no_pad"
(gemma3 stretched to S x S instead of padded), "tile_order" (idefics3 with
the overview first).

Module use:
    m = numpy_vision.load(path); e = numpy_vision.embed(m, rgb)
    pre = numpy_vision.preprocess(m, rgb)   # pre.u8: the uint8 images, pre.images: float32
Command line: numpy_vision.py MMPROJ [--image FILE] [--out emb.npy]
"""

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

# one BLAS thread: OpenBLAS's spinning threads are many times slower on the
# shared 2-core machines (as numpy_llama.py; only effective before numpy loads)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import gguf  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_meta  # noqa: E402
import refcache  # noqa: E402

PRECISION_BITS = 22
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}
RESIZE = {"gemma3": "bilinear", "idefics3": "lanczos"}


@dataclass
class Model:
    kind: str            # "gemma3" or "idefics3"
    image_size: int
    patch_size: int
    n_embd: int
    n_head: int
    n_layer: int
    eps: float
    n_merge: int
    longest_edge: int    # idefics3's clip.vision.preproc_image_size (0: absent)
    mean: np.ndarray     # float32 [3]
    std: np.ndarray
    lm_dim: int
    w: dict = field(default_factory=dict)   # name -> float64 array (numpy shape)
    path: str = ""       # the file load() read: embed()'s results are kept by its sha256


def _field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(f"{key} missing")
        return default
    return f.contents()


def load(path):
    """Reads a clip GGUF of projector gemma3 or idefics3 into a Model."""
    r = gguf_meta.read(str(path))
    proj = _field(r, "clip.projector_type")
    if proj not in RESIZE:
        raise ValueError(f"{path}: projector {proj!r} is not gemma3 or idefics3")
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
    n_merge = int(_field(r, "clip.vision.projector.scale_factor", 4))
    m = Model(kind=proj, image_size=int(_field(r, "clip.vision.image_size")),
              patch_size=int(_field(r, "clip.vision.patch_size")),
              n_embd=int(_field(r, "clip.vision.embedding_length")),
              n_head=int(_field(r, "clip.vision.attention.head_count")),
              n_layer=int(_field(r, "clip.vision.block_count")),
              eps=float(np.float32(_field(r, "clip.vision.attention.layer_norm_epsilon"))),
              n_merge=n_merge,
              longest_edge=int(_field(r, "clip.vision.preproc_image_size", 0)),
              mean=np.array(_field(r, "clip.vision.image_mean"), np.float32)[:3],
              std=np.array(_field(r, "clip.vision.image_std"), np.float32)[:3],
              lm_dim=0, w=w, path=str(path))
    if proj == "gemma3":
        m.lm_dim = w["mm.input_projection.weight"].shape[1]
    else:
        m.lm_dim = w["mm.model.fc.weight"].shape[0]
    return m


# ---------------------------------------------------------------- (a) preprocessing

def _filter(algo, x):
    if algo == "lanczos":
        def sinc(v):
            out = np.ones_like(v)
            nz = v != 0.0
            pv = v[nz] * math.pi
            out[nz] = np.sin(pv) / pv
            return out
        return np.where((x >= -3.0) & (x < 3.0), sinc(x) * sinc(x / 3.0), 0.0)
    x = np.abs(x)
    if algo == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5  # Pillow's bicubic
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _weights(in_size, out_size, algo):
    """(index [out][k], fixed-point weights [out][k]) of one resize pass."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    idx = np.zeros((out_size, ksize), np.int64)
    wts = np.zeros((out_size, ksize), np.int64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)  # int() truncates toward 0 as C's cast
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = np.arange(xmax)
        w = _filter(algo, (k + xmin - center + 0.5) * ss)
        ww = w.sum()
        if ww != 0.0:
            w = w / ww
        fx = w * float(1 << PRECISION_BITS)
        fx = np.trunc(fx + np.where(w < 0, -0.5, 0.5))
        idx[xx, :xmax] = xmin + k
        wts[xx, :xmax] = fx.astype(np.int64)
    return idx, wts


def _pass(img, axis, out_size, algo):
    idx, wts = _weights(img.shape[axis], out_size, algo)
    src = img.astype(np.int64)
    taken = np.take(src, idx, axis=axis)  # axis grows to [out][k]
    shape = [1] * taken.ndim
    shape[axis], shape[axis + 1] = wts.shape
    acc = (taken * wts.reshape(shape)).sum(axis=axis + 1) + (1 << (PRECISION_BITS - 1))
    return np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)


def resize(img, width, height, algo, vertical_first=False):
    """llama.cpp's resize_pillow of an RGB uint8 [H][W][3] to width x height:
    always the horizontal pass first (Pillow 13 itself runs the vertical
    pass first in some cases, e.g. 333x517 -> 224x224, and then differs by
    up to 15 levels for lanczos; vertical_first does that, for ablations)."""
    out = img
    passes = [(1, width), (0, height)]
    for axis, size in (passes[::-1] if vertical_first else passes):
        if size != img.shape[axis]:
            out = _pass(out, axis, size, algo)
    return out


def normalize(model, img):
    """uint8 [H][W][3] -> float32 (x / 255 - mean) / std, as clip_image_f32."""
    x = img.astype(np.float32) / np.float32(255.0)
    return (x - model.mean) / model.std


@dataclass
class Preproc:
    images: list         # float32 [H][W][3] each, encode order
    grid: tuple = (0, 0)  # idefics3: (columns, rows) of tiles; gemma3 (0, 0)
    u8: list = field(default_factory=list)  # the uint8 images before normalization


def _fixed_size(img, size, algo, pad=True, vf=False):
    h, w = img.shape[:2]
    if (w, h) == (size, size):
        return img.copy()
    if not pad:
        return resize(img, size, size, algo, vf)
    s32 = np.float32
    scale = min(s32(size) / s32(w), s32(size) / s32(h))
    nw = min(int(math.ceil(s32(w) * scale)), size)
    nh = min(int(math.ceil(s32(h) * scale)), size)
    small = resize(img, nw, nh, algo, vf)
    out = np.zeros((size, size, 3), np.uint8)
    ox, oy = (size - nw) // 2, (size - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = small
    return out


def idefics3_grid(w, h, tile, longest):
    """llama.cpp's idefics3 sizes for a w x h image: the long side resized
    to `longest` (the short side even), then (rw, rh) and the tile grid
    (gx, gy) that covers it."""
    aspect = w / h
    if w >= h:
        rw, rh = longest, int(longest / aspect)
        rh += rh % 2
    else:
        rw, rh = int(longest * aspect), longest
        rw += rw % 2
    return rw, rh, (rw + tile - 1) // tile, (rh + tile - 1) // tile


def _idefics3_tiles(img, tile, longest, algo, vf=False):
    h, w = img.shape[:2]
    if longest <= 0:
        raise ValueError("idefics3 file without clip.vision.preproc_image_size: "
                         "llama.cpp's other tiling path is not modelled here")
    rw, rh, gx, gy = idefics3_grid(w, h, tile, longest)
    resized = resize(img, rw, rh, algo, vf)
    refined = resize(resized, gx * tile, gy * tile, algo, vf)
    overview = resize(refined, tile, tile, algo, vf)
    tiles = [refined[y * tile:(y + 1) * tile, x * tile:(x + 1) * tile]
             for y in range(gy) for x in range(gx)]
    return tiles, overview, (gx, gy)


def preprocess(model, rgb, ablate=()):
    """(a): an RGB uint8 array [H][W][3] -> Preproc (encode order)."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    assert rgb.ndim == 3 and rgb.shape[2] == 3, rgb.shape
    algo = "bicubic" if "resize" in ablate else RESIZE[model.kind]
    vf = "resize_order" in ablate
    if model.kind == "gemma3":
        u8 = [_fixed_size(rgb, model.image_size, algo, pad="no_pad" not in ablate, vf=vf)]
        grid = (0, 0)
    else:
        tiles, overview, grid = _idefics3_tiles(rgb, model.image_size, model.longest_edge, algo,
                                                vf)
        u8 = [overview] + tiles if "tile_order" in ablate else tiles + [overview]
    return Preproc(images=[normalize(model, x) for x in u8], grid=grid, u8=u8)


# ---------------------------------------------------------------- (b) the tower

def _layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def tower(model, img):
    """The ViT on one float image [H][W][3] -> [n_patches][n_embd] float64
    (after post_ln), patches row-major."""
    w, ps, d = model.w, model.patch_size, model.n_embd
    x = np.asarray(img, np.float64)
    hh, ww = x.shape[0] // ps, x.shape[1] // ps
    patches = (x[:hh * ps, :ww * ps].reshape(hh, ps, ww, ps, 3)
               .transpose(0, 2, 4, 1, 3).reshape(hh * ww, 3 * ps * ps))
    h = patches @ w["v.patch_embd.weight"].reshape(d, -1).T + w["v.patch_embd.bias"]
    h = h + w["v.position_embd.weight"]
    nh = model.n_head
    dh = d // nh
    for i in range(model.n_layer):
        p = f"v.blk.{i}."
        a = _layer_norm(h, w[p + "ln1.weight"], w[p + "ln1.bias"], model.eps)
        q = (a @ w[p + "attn_q.weight"].T + w[p + "attn_q.bias"]).reshape(-1, nh, dh).transpose(1, 0, 2)
        k = (a @ w[p + "attn_k.weight"].T + w[p + "attn_k.bias"]).reshape(-1, nh, dh).transpose(1, 0, 2)
        v = (a @ w[p + "attn_v.weight"].T + w[p + "attn_v.bias"]).reshape(-1, nh, dh).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(-1, d)
        h = h + o @ w[p + "attn_out.weight"].T + w[p + "attn_out.bias"]
        a = _layer_norm(h, w[p + "ln2.weight"], w[p + "ln2.bias"], model.eps)
        f = _gelu(a @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"])
        h = h + f @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
    return _layer_norm(h, w["v.post_ln.weight"], w["v.post_ln.bias"], model.eps), (hh, ww)


def project(model, h, grid_hw, ablate=()):
    """The projector: tower output [n_patches][n_embd] -> [n_tokens][lm_dim]."""
    w, s, d = model.w, model.n_merge, model.n_embd
    hh, ww = grid_hw
    x = h.reshape(hh, ww, d)
    if model.kind == "gemma3":
        assert hh == ww and hh % s == 0, (hh, ww, s)
        blocks = x.reshape(hh // s, s, ww // s, s, d)
        pooled = blocks.max(axis=(1, 3)) if "pool_max" in ablate else blocks.mean(axis=(1, 3))
        t = pooled.reshape(-1, d)
        if "soft_emb_norm" not in ablate:
            t = t / np.sqrt((t * t).mean(axis=-1, keepdims=True) + model.eps)
            t = t * w["mm.soft_emb_norm.weight"]
        return t @ w["mm.input_projection.weight"]
    # idefics3: zero-pad the grid to multiples of s (llama.cpp's ggml_pad), then shuffle
    ph, pw = -hh % s, -ww % s
    if ph or pw:
        x = np.pad(x, ((0, ph), (0, pw), (0, 0)))
    gh, gw = x.shape[0] // s, x.shape[1] // s
    blocks = x.reshape(gh, s, gw, s, d)
    order = (0, 2, 3, 1, 4) if "pixel_shuffle" in ablate else (0, 2, 1, 3, 4)
    t = blocks.transpose(order).reshape(gh * gw, s * s * d)
    return t @ w["mm.model.fc.weight"].T


def encode(model, img, ablate=()):
    """One preprocessed float image -> its soft tokens [n][lm_dim]."""
    h, grid_hw = tower(model, img)
    return project(model, h, grid_hw, ablate)


def embed(model, rgb, ablate=()):
    """(b): an RGB uint8 array -> the image's embeddings [n_soft_tokens][lm_dim]
    float64, every tile in llama.cpp's order (tiles row-major, overview).
    Kept in refcache (scripts/ref/refcache.py) by the model file's sha256,
    the pixels and the ablations, for a model as load() read it."""
    def compute():
        pre = preprocess(model, rgb, ablate)
        return np.concatenate([encode(model, x, ablate) for x in pre.images], axis=0)

    if not model.path or not refcache.enabled():
        return compute()
    parts = (refcache.file_sha256(model.path), np.asarray(rgb), [str(a) for a in ablate])
    return refcache.cached("numpy_vision.embed", parts, compute)


def n_tokens(model, img_shape):
    """Soft tokens of one preprocessed image of shape [H][W][3]."""
    hh, ww = img_shape[0] // model.patch_size, img_shape[1] // model.patch_size
    s = model.n_merge
    if model.kind == "gemma3":
        return (hh // s) * (ww // s)
    return (-(-hh // s)) * (-(-ww // s))


# ---------------------------------------------------------------- (c) token layout

def token_layout(model, rgb_or_pre):
    """(c): what mtmd_tokenize puts where the media marker was, in order:
    ("text", s) items (s tokenized with special tokens parsed; idefics3's
    "\\n", "\\n\\n" and marker pieces are looked up as single tokens by
    mtmd) and ("image", n) items, one per image chunk of n soft tokens.
      gemma3:   text "<start_of_image>", image 256 (n_merge 4 at 896 px),
                text "<end_of_image>"
      idefics3: per tile row y (1-based), per column x:
                "<fake_token_around_image><row_y_col_x>" then the tile;
                "\\n" after each row but the last; then "\\n\\n",
                "<fake_token_around_image>", "<global-img>", the overview,
                "<fake_token_around_image>".
    The text around (a BOS when the text model adds one, the prompt) is the
    caller's."""
    pre = rgb_or_pre if isinstance(rgb_or_pre, Preproc) else preprocess(model, rgb_or_pre)
    ntok = [n_tokens(model, x.shape) for x in pre.images]
    if model.kind == "gemma3":
        return [("text", "<start_of_image>"), ("image", ntok[0]), ("text", "<end_of_image>")]
    gx, gy = pre.grid
    out = []
    for y in range(gy):
        for x in range(gx):
            out.append(("text", f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>"))
            out.append(("image", ntok[y * gx + x]))
        if y != gy - 1:
            out.append(("text", "\n"))
    out += [("text", "\n\n"), ("text", "<fake_token_around_image>"), ("text", "<global-img>"),
            ("image", ntok[-1]), ("text", "<fake_token_around_image>")]
    return out


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mmproj")
    ap.add_argument("--image", help="an image file (read with Pillow); default a synthetic one")
    ap.add_argument("--width", type=int, default=333, help="the synthetic image's width")
    ap.add_argument("--height", type=int, default=517, help="the synthetic image's height")
    ap.add_argument("--out", help="write the embeddings [n][lm_dim] here (.npy, float64)")
    a = ap.parse_args()
    mdl = load(a.mmproj)
    if a.image:
        try:
            from PIL import Image
        except ImportError:
            sys.exit("numpy_vision.py: --image needs Pillow (pip install pillow)")
        im = np.asarray(Image.open(a.image).convert("RGB"))
    else:
        yy, xx = np.mgrid[0:a.height, 0:a.width]
        im = np.stack([xx * 255 // max(a.width - 1, 1), yy * 255 // max(a.height - 1, 1),
                       (xx + yy) % 256], axis=-1).astype(np.uint8)
    e = embed(mdl, im)
    if a.out:
        np.save(a.out, e)
    print(mdl.kind, e.shape, token_layout(mdl, im))
