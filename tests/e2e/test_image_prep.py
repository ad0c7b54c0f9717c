"""Image decoding and preprocessing (tokenizer_proc/image*.c) against
references in Python.

- zi_image_resize against Pillow's Image.resize, which llama.cpp's
  img_tool::resize_pillow transcribes (same filters, same 22-bit fixed
  point): bit for bit, for bilinear, bicubic and lanczos, up and down, one
  axis at a time in llama.cpp's order (horizontal first).
- The decoder against Pillow on files written by build/tests/make_image in
  every format (PNG, lossless WebP and GIF exact; JPEG within a few levels).
- The whole preprocessing (gemma3 and both idefics3 paths) against a
  transcription of llama.cpp's rules (tools/mtmd/mtmd-image.cpp) built on
  Pillow's resize and numpy: the float tiles must be equal.

Needs build/tests/make_image and build/tests/image_prep_dump (built with
the unit tests) and Pillow in the venv.
"""

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from numpy_vision import idefics3_grid

Image = pytest.importorskip("PIL.Image")

REPO = Path(__file__).resolve().parents[2]
MAKE_IMAGE = REPO / "build" / "tests" / "make_image"
DUMP = REPO / "build" / "tests" / "image_prep_dump"

pytestmark = pytest.mark.skipif(
    not (MAKE_IMAGE.exists() and DUMP.exists()), reason="build/tests/make_image not built"
)

FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}


def rand_image(w, h, seed, ch=3):
    rng = np.random.default_rng(seed)
    # smooth plus noise: both the filters' lobes and clamping get exercised
    yy, xx = np.mgrid[0:h, 0:w]
    base = (xx * 255 // max(w - 1, 1) + yy * 3)[..., None] % 256
    noise = rng.integers(0, 256, (h, w, ch))
    return np.where(rng.random((h, w, 1)) < 0.3, noise, base).astype(np.uint8)


def c_resize(tmp, img, dw, dh, algo):
    h, w, _ = img.shape
    src, dst = tmp / "in.raw", tmp / "out.raw"
    src.write_bytes(img.tobytes())
    subprocess.run([DUMP, "resize", algo, src, str(w), str(h), str(dw), str(dh), dst], check=True)
    return np.frombuffer(dst.read_bytes(), np.uint8).reshape(dh, dw, 3)


def pil_resize(img, dw, dh, algo):
    # resize_pillow: the horizontal pass, then the vertical one, each
    # through 8 bits. Pillow itself may run the vertical pass first (13.0
    # does when that is cheaper), so each pass is asked of it alone.
    h, w, _ = img.shape
    im = Image.fromarray(img, "RGB")
    if dw != w:
        im = im.resize((dw, h), FILTERS[algo])
    if dh != h:
        im = im.resize((dw, dh), FILTERS[algo])
    return np.asarray(im)


@pytest.mark.parametrize("algo", sorted(FILTERS))
@pytest.mark.parametrize(
    "src,dst",
    [((37, 23), (64, 5)), ((300, 200), (896, 896)), ((1000, 37), (512, 512)), ((5, 7), (5, 100)),
     ((333, 517), (990, 1536)), ((1536, 1024), (512, 512)), ((1, 1), (3, 2))],
)
def test_resize_matches_pillow(tmp_path, algo, src, dst):
    img = rand_image(*src, seed=src[0] * 7 + src[1])
    got = c_resize(tmp_path, img, *dst, algo)
    want = pil_resize(img, *dst, algo)
    diff = np.argwhere(got != want)
    assert diff.size == 0, f"{algo} {src}->{dst}: {len(diff)} samples differ, first {diff[:3]}"


def make(tmp, kind, img):
    h, w, ch = img.shape
    raw, out = tmp / "px.raw", tmp / f"img.{kind}"
    raw.write_bytes(img.tobytes())
    subprocess.run([MAKE_IMAGE, kind, str(w), str(h), str(ch), raw, out], check=True)
    return out


def c_decode(tmp, path):
    out = tmp / "dec.rgb"
    r = subprocess.run([DUMP, "decode", path, out], check=True, capture_output=True, text=True)
    w, h = map(int, r.stdout.split())
    return np.frombuffer(out.read_bytes(), np.uint8).reshape(h, w, 3)


def few_colours(w, h):
    img = rand_image(w, h, 3)
    return (img // 64 * 64).astype(np.uint8)  # 64 colours: fits a GIF palette


@pytest.mark.parametrize("kind", ["png", "png16", "png-interlace", "png-palette", "webp", "gif",
                                  "gif-interlace", "jpeg", "jpeg-q100"])
@pytest.mark.parametrize("size", [(1, 1), (333, 517), (3000, 10)])
def test_decode_matches_pillow(tmp_path, kind, size):
    img = few_colours(*size)
    path = make(tmp_path, kind, img)
    got = c_decode(tmp_path, path)
    want = np.asarray(Image.open(path).convert("RGB"))
    assert got.shape == want.shape
    if kind.startswith("jpeg"):
        # libjpeg-turbo on both sides; Pillow's bundled build may differ in
        # its IDCT, so only closeness is asked
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 4
    else:
        assert np.array_equal(got, want)
        assert np.array_equal(got, img)


def test_decode_errors(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"<html>not an image</html>")
    r = subprocess.run([DUMP, "decode", bad, tmp_path / "x"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "not a JPEG/PNG/WebP/GIF image (magic 3c 68 74 6d 6c 3e 6e 6f ...)" in r.stderr
    png = make(tmp_path, "png", rand_image(50, 40, 1))
    cut = tmp_path / "cut.png"
    cut.write_bytes(png.read_bytes()[:-20])
    r = subprocess.run([DUMP, "decode", cut, tmp_path / "x"], capture_output=True, text=True)
    assert r.returncode == 1 and "image is truncated" in r.stderr


# ---- llama.cpp's preprocessing, transcribed ------------------------------------


def normalize(u8):
    # clip_image_f32::from_u8 then normalize, in float32 (mean = std = 0.5)
    f = u8.astype(np.float32) / np.float32(255.0)
    return (f - np.float32(0.5)) / np.float32(0.5)


def resize_pad_ceil(img, tw, th, algo):
    # img_tool::resize with PAD_CEIL: float scale, ceil, integer centring
    h, w, _ = img.shape
    if (w, h) == (tw, th):
        return img.copy()
    f32 = np.float32
    scale = min(f32(tw) / f32(w), f32(th) / f32(h))
    nw = min(int(math.ceil(f32(w) * scale)), tw)
    nh = min(int(math.ceil(f32(h) * scale)), th)
    out = np.zeros((th, tw, 3), np.uint8)
    ox, oy = (tw - nw) // 2, (th - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = pil_resize(img, nw, nh, algo)
    return out


def ref_gemma3(img, size=896):
    return normalize(resize_pad_ceil(img, size, size, "bilinear"))[None], 0, 0


def ref_idefics3_a(img, tile, longest):
    # mtmd_image_preprocessor_idefics3, preproc_image_size given
    h, w, _ = img.shape
    rw, rh, gx, gy = idefics3_grid(w, h, tile, longest)
    resized = pil_resize(img, rw, rh, "lanczos") if (rw, rh) != (w, h) else img
    refined = resized
    if (gx * tile, gy * tile) != (rw, rh):
        refined = pil_resize(resized, gx * tile, gy * tile, "lanczos")
    overview = pil_resize(refined, tile, tile, "lanczos") if refined.shape[:2] != (tile, tile) else refined
    tiles = [refined[y * tile:(y + 1) * tile, x * tile:(x + 1) * tile] for y in range(gy) for x in range(gx)]
    return normalize(np.stack(tiles + [overview])), gy, gx


def ref_idefics3_b(img, tile):
    # calc_size_preserved_ratio (align = tile, no limits) then llava-uhd slicing
    h, w, _ = img.shape
    f32 = np.float32

    def round_by(x):  # std::round on a float: half away from zero
        return int(math.floor(float(f32(x) / f32(tile)) + 0.5)) * tile

    rw, rh = max(tile, round_by(w)), max(tile, round_by(h))
    gx, gy = rw // tile, rh // tile
    overview = pil_resize(img, tile, tile, "bicubic") if (w, h) != (tile, tile) else img
    refined = resize_pad_ceil(img, rw, rh, "bicubic")
    tiles = [refined[y * tile:(y + 1) * tile, x * tile:(x + 1) * tile] for y in range(gy) for x in range(gx)]
    return normalize(np.stack(tiles + [overview])), gy, gx


def c_prep(tmp, img, proj, size, patch, merge, longest):
    path = make(tmp, "png", img)
    out = tmp / "tiles.f32"
    r = subprocess.run([DUMP, "prep", proj, path, out, str(size), str(patch), str(merge), str(longest)],
                       check=True, capture_output=True, text=True)
    n, rows, cols, tok = map(int, r.stdout.split())
    data = np.frombuffer(out.read_bytes(), np.float32).reshape(n, size, size, 3)
    return data, rows, cols, tok


@pytest.mark.parametrize("size", [(640, 480), (480, 640), (896, 896), (1, 1), (3000, 10), (123, 457)])
def test_gemma3_prep(tmp_path, size):
    img = rand_image(*size, seed=11)
    got, rows, cols, tok = c_prep(tmp_path, img, "gemma3", 896, 14, 4, 0)
    want, _, _ = ref_gemma3(img)
    assert (rows, cols, tok) == (0, 0, 256)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("size", [(640, 480), (480, 640), (333, 517), (100, 100), (1000, 500), (2000, 30)])
def test_idefics3_prep_longest_edge(tmp_path, size):
    img = rand_image(*size, seed=5)
    got, rows, cols, tok = c_prep(tmp_path, img, "idefics3", 512, 16, 4, 1536)
    want, gy, gx = ref_idefics3_a(img, 512, 1536)
    assert (rows, cols, tok) == (gy, gx, 64)
    assert got.shape == want.shape
    assert np.array_equal(got, want)


@pytest.mark.parametrize("size", [(640, 480), (1300, 700), (100, 100), (512, 512)])
def test_idefics3_prep_rounded(tmp_path, size):
    img = rand_image(*size, seed=9)
    got, rows, cols, tok = c_prep(tmp_path, img, "idefics3", 512, 16, 4, 0)
    want, gy, gx = ref_idefics3_b(img, 512)
    assert (rows, cols, tok) == (gy, gx, 64)
    assert np.array_equal(got, want)
