"""The float64 image-tower reference against llama.cpp's mtmd.

For both projector kinds of tests/e2e/vision_files.py (gemma3, idefics3) a
small random-weight file (2 layers, the real widths; images shrunk so that
the reference stays fast: Gemma 3 at 224 px, i.e. 16 x 16 patches pooled to
4 x 4 = 16 soft tokens; SmolVLM tiles of 128 px, 4 soft tokens each, with a
longest edge of 384, i.e. up to 3 x 3 tiles and the overview) is written,
and scripts/ref/numpy_vision.py's embeddings are compared with llama.cpp's
(tests/e2e/mtmd_ref.py, llama-cpp-python's mtmd with the real text models
SmolLM2-135M and gemma-3-270m) on five images made here: a gradient,
stripes, noise, an odd 333 x 517 (width x height) and a wide 640 x 160:

  - the same soft-token count and the same layout of image chunks and
    marker tokens (numpy_vision.token_layout vs mtmd's chunks);
  - per image, the cosine distance between the two [n_tokens][lm_dim]
    embeddings (flattened) below MAX_DIST, and per token below
    MAX_TOKEN_DIST (measured 0.4-1.7e-7: the reference reads the same F16
    weights, llama.cpp computes in f32; the bounds leave a margin of ~8x
    and are tight enough to see a resize run in the other pass order);
  - the images' soft tokens differ clearly (the files are not degenerate);
  - each ablation of the reference (a feature switched off or changed:
    the soft-embedding RMS norm, average pooling, padding to a square,
    the resize filter, the pixel-shuffle order, the overview's place) moves
    it far from llama.cpp on the odd and wide images, or for the resize
    ablations the noise and odd ones (worst distance
    above ABLATION_MIN and above 100 x the reference's own), so the files
    and images exercise that feature; the resize's pass order (vertical
    first, as Pillow itself sometimes does) moves it above 2 x MAX_DIST
    and 20 x the reference's own.

At the real sizes (write_mmproj's defaults, 2 layers; not run here, too
slow) the same comparison gave 5.3e-8 for Gemma 3 at 896 px (256 soft
tokens; the reference 65 s, llama.cpp 21 s on 2 cores) and 1.2e-7 for
SmolVLM's 512 px tiles (longest edge set to 512: one tile and the
overview, 64 + 64 tokens).

Also records which marker tokens the two text vocabularies have.
Numbers go to the e2e report (section vision_reference). Needs
llama-cpp-python (skipped without).
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import report

if os.environ.get("ZINFER_SANITIZED") == "1":  # no zinfer binary here: once, in release
    pytest.skip("the references against each other run in the release build", allow_module_level=True)
pytest.importorskip("llama_cpp.mtmd_cpp")
from mtmd_ref import MtmdRef  # noqa: E402
from vision_files import (SMALL, TEXT_MODELS, cos_dist, images, token_dists,  # noqa: E402
                          vocab_markers, write_mmproj)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "ref"))
import numpy_vision  # noqa: E402

OVERRIDES = SMALL
ABLATIONS = {
    "gemma3": ["soft_emb_norm", "pool_max", "no_pad", "resize", "resize_order"],
    "idefics3": ["pixel_shuffle", "tile_order", "resize", "resize_order"],
}
MAX_DIST = 1e-6
MAX_TOKEN_DIST = 2e-6
ABLATION_MIN = 1e-3
# ablations at the level of rounding (a resize's pass order moves a few
# pixels by a few levels): they need only clear MAX_DIST and 20 x the
# reference's own distance
FINE = {"resize_order"}
# the images an ablation is measured on: high-frequency noise shows a
# resize's differences best, the odd and wide shapes the rest
ABLATION_IMAGES = {"resize": ("noise", "odd_333x517"), "resize_order": ("noise", "odd_333x517")}
ABLATION_IMAGES_DEFAULT = ("odd_333x517", "wide_640x160")


@pytest.fixture(scope="module", params=["gemma3", "idefics3"])
def setup(request, tmp_path_factory):
    kind = request.param
    text_model, lm_dim = TEXT_MODELS[kind]
    if not text_model.is_file():
        pytest.skip(f"text model {text_model} missing")
    path = write_mmproj(tmp_path_factory.mktemp("vision") / f"{kind}.gguf", kind, lm_dim,
                        seed=11, n_layers=2, **OVERRIDES[kind])
    model = numpy_vision.load(path)
    imgs = images()
    with MtmdRef(path, text_model) as ref:
        cpp = {name: ref.embed(img) for name, img in imgs.items()}
    ours = {name: numpy_vision.embed(model, img) for name, img in imgs.items()}
    return dict(kind=kind, model=model, imgs=imgs, cpp=cpp, ours=ours, text_model=text_model)


def test_reference_matches_llamacpp(setup):
    kind, model = setup["kind"], setup["model"]
    dists, tok, enc = {}, {}, {}
    for name, img in setup["imgs"].items():
        a, c = setup["ours"][name], setup["cpp"][name]
        assert a.shape == c.embd.shape, (name, a.shape, c.embd.shape)
        dists[name] = cos_dist(a, c.embd)
        tok[name] = float(token_dists(a, c.embd).max())
        enc[name] = round(c.encode_s, 4)
        # the layout: image chunk sizes in order, text between them
        want = numpy_vision.token_layout(model, img)
        got_images = [n for t, n in c.chunks if t == "image"]
        assert got_images == [n for t, n in want if t == "image"], (name, c.chunks)
        assert sum(got_images) == a.shape[0]
    report("vision_reference", kind, dict(cos_dist=dists, max_token_dist=tok, encode_s=enc,
                                          n_tokens={n: int(v.shape[0])
                                                    for n, v in setup["ours"].items()}))
    print(kind, "cosine distances", dists, "max per token", tok, "llama.cpp encode s", enc)
    assert max(dists.values()) < MAX_DIST, dists
    assert max(tok.values()) < MAX_TOKEN_DIST, tok


def test_layout_text(setup):
    """mtmd's text chunks hold the marker tokens token_layout names."""
    kind, model = setup["kind"], setup["model"]
    ids = vocab_markers(setup["text_model"], kind)
    c = setup["cpp"]["odd_333x517"]
    texts = [t for k, t in c.chunks if k == "text"]
    if kind == "gemma3":
        assert texts == [[ids["<start_of_image>"]], [ids["<end_of_image>"]]], texts
        return
    # SmolLM2's vocabulary lacks the idefics3 markers: mtmd's looked-up ones
    # come out as -1 and the row/col template as plain text; "\n\n" and "\n"
    # are single tokens
    pre = numpy_vision.preprocess(model, setup["imgs"]["odd_333x517"])
    gx, gy = pre.grid
    assert (gx, gy) == (2, 3)
    assert texts[-2] == [ids["\n\n"], -1, -1], texts[-2]
    assert texts[-1] == [-1]
    row_starts = [t for t in texts[:-2] if t and t[0] == ids["\n"]]
    assert len(row_starts) == gy - 1


def test_images_differ(setup):
    """Different images give clearly different soft tokens."""
    ours = setup["ours"]
    first = {n: v[:4] for n, v in ours.items()}  # every image has at least 4 tokens
    names = list(first)
    worst = min(cos_dist(first[a], first[b]) for i, a in enumerate(names) for b in names[i + 1:])
    report("vision_reference", setup["kind"] + "_min_image_pair_dist", worst)
    assert worst > 0.02, worst
    for n, v in ours.items():
        assert np.all(np.isfinite(v)) and 0.3 < float(v.std()) < 5.0, (n, float(v.std()))


def test_ablations_move_far(setup):
    kind, model = setup["kind"], setup["model"]
    base = max(cos_dist(setup["ours"][n], setup["cpp"][n].embd) for n in setup["imgs"])
    got = {}
    for ab in ABLATIONS[kind]:
        d = {}
        for name in ABLATION_IMAGES.get(ab, ABLATION_IMAGES_DEFAULT):
            img = setup["imgs"][name]
            a = numpy_vision.embed(model, img, ablate=(ab,))
            c = setup["cpp"][name].embd
            d[name] = cos_dist(a, c) if a.shape == c.shape else 1.0
        got[ab] = max(d.values())
    report("vision_reference", kind + "_ablations", got)
    print(kind, "ablations (worst image)", got, "reference", base)
    for ab, d in got.items():
        if ab in FINE:
            assert d > 2 * MAX_DIST and d > 20 * base, (ab, d, base)
        else:
            assert d > ABLATION_MIN and d > 100 * base, (ab, d, base)


def test_markers_in_vocabularies():
    """Which of mtmd's marker strings the two text models have."""
    found = {}
    for kind, (path, _) in TEXT_MODELS.items():
        if not path.is_file():
            pytest.skip(f"text model {path} missing")
        found[kind] = vocab_markers(path, kind)
    report("vision_reference", "markers", {k: {m: v for m, v in d.items()}
                                           for k, d in found.items()})
    assert found["gemma3"]["<start_of_image>"] == 255999
    assert found["gemma3"]["<end_of_image>"] == 256000
    smol = found["idefics3"]
    assert smol["\n"] == 198 and smol["\n\n"] == 1116
    for m in ("<fake_token_around_image>", "<global-img>", "<row_1_col_1>"):
        assert smol[m] is None, m  # SmolVLM adds these; SmolLM2-135M has none
