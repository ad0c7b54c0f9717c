"""Text logits after an image: zinfer against the float64 pipeline and llama.cpp.

For both projector kinds, a prompt with one media marker and three images
made here (a gradient 400 x 300, stripes 256 x 256 and an odd 333 x 517,
written as PNG for zinfer):

  gemma3:   gemma-3-270m (Q4_K_M) and a random 2-layer Gemma 3 projector at
            224 px (16 soft tokens, decoded non-causally: each image token
            sees the whole image);
  idefics3: tests/e2e/smolvlm_lm.py's random SmolVLM-style text model
            (SmolLM2's vocabulary plus SmolVLM's marker tokens, dim 256,
            Q8_0) and a random 2-layer projector with 128 px tiles and a
            longest edge of 384 (up to 3 x 3 tiles and the overview, 4 soft
            tokens each; causal).

`zinfer logits --mmproj --image` is compared with
  - llama.cpp's mtmd pipeline (tests/e2e/mtmd_ref.py, prompt_logits): the
    ids at zinfer's text positions equal llama.cpp's text chunks' ids,
    position for position, and the image positions (negative keys) are as
    many as llama.cpp's image chunks' tokens;
  - the float64 pipeline: scripts/ref/numpy_vision.py's embeddings put in
    at the image positions of scripts/ref/numpy_llama.py's forward pass
    (gemma3's image positions reaching to the end of their image): over
    the text positions after the image, mean KL(ref || zinfer) below
    MAX_MEAN_KL and below llama.cpp's own mean KL(ref || llama.cpp) there
    (its activations are rounded to 8 bits against quantized weights, its
    KV cache is F16); argmax equal except at near-ties (top-2 gap < 0.01).
    For the odd image the report also has both KLs at the text positions
    before the image (llama.cpp's is about the same there: its error is
    not the image's).
  - an ablation per kind moves the reference far from zinfer (> 100 x the
    KL): gemma3 with causal attention over the image; idefics3 with the
    overview's embeddings first instead of last (numpy_vision's
    "tile_order").

Numbers go to the e2e report (section vision_text). Needs llama-cpp-python
(skipped without) and the gemma-3-270m and SmolLM2-135M files.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import last_json, report

if os.environ.get("ZINFER_SANITIZED") == "1":  # llama.cpp and float64 dominate: release only
    pytest.skip("llama.cpp and the float64 pipeline run in the release build",
                allow_module_level=True)
pytest.importorskip("llama_cpp.mtmd_cpp")
from mtmd_ref import MtmdRef  # noqa: E402
from smolvlm_lm import SMOLLM2, added_ids, write_smolvlm_lm  # noqa: E402
from test_vision import png_bytes  # noqa: E402
from vision_files import images as all_images  # noqa: E402
from vision_files import SMALL, TEXT_MODELS, write_mmproj  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "ref"))
import numpy_llama  # noqa: E402
import numpy_vision  # noqa: E402

GEMMA3 = Path(os.environ.get("ZINFER_GEMMA3", TEXT_MODELS["gemma3"][0]))
PROMPTS = {
    "gemma3": "<start_of_turn>user\nDescribe this picture: <__media__> in a few words."
              "<end_of_turn>\n<start_of_turn>model\n",
    "idefics3": "<|im_start|>User:<__media__>Describe this image.<end_of_utterance>\nAssistant:",
}
OVERRIDES = SMALL
SMOL_DIM = 256
MAX_MEAN_KL = 1e-4
NEAR_TIE = 0.01
CONTROL_IMAGE = "odd_333x517"


def images():
    """The three test images of vision_files.images() this file uses."""
    return {k: v for k, v in all_images().items() if k in ("gradient", "stripes", "odd_333x517")}


def image_reach(ids, non_causal):
    """numpy_llama's reach: None (causal), or each image position reaching
    the last position of its run of image positions (negative ids)."""
    if not non_causal:
        return None
    reach = np.arange(len(ids))
    img = ids < 0
    end = None
    for i in range(len(ids) - 1, -1, -1):
        if img[i]:
            end = i if end is None else end
            reach[i] = end
        else:
            end = None
    return reach


def reference(lm, ids, emb, non_causal, rows):
    """float64 logits at rows of the prompt ids with the image embeddings emb."""
    e = np.full((len(ids), emb.shape[1]), np.nan)
    e[ids < 0] = emb
    return lm.forward(ids, embd=e, reach=image_reach(ids, non_causal), rows=rows)


@pytest.fixture(scope="module", params=["gemma3", "idefics3"])
def setup(request, tmp_path_factory, run_zinfer):
    kind = request.param
    d = tmp_path_factory.mktemp(f"vision_text_{kind}")
    if kind == "gemma3":
        if not GEMMA3.is_file():
            pytest.skip(f"{GEMMA3} missing")
        text_model, lm_dim = GEMMA3, 640
        lm = numpy_llama.load(str(GEMMA3))
    else:
        if not SMOLLM2.is_file():
            pytest.skip(f"{SMOLLM2} missing (its vocabulary is the test model's)")
        text_model, lm_dim = write_smolvlm_lm(d / "smolvlm_lm.gguf", n_embd=SMOL_DIM), SMOL_DIM
        lm = numpy_llama.Model(str(text_model))
    mmproj = write_mmproj(d / f"{kind}.gguf", kind, lm_dim, seed=11, n_layers=2,
                          **OVERRIDES[kind])
    vis = numpy_vision.load(mmproj)
    imgs = images()
    prompt = PROMPTS[kind]
    out = {}
    with MtmdRef(mmproj, text_model) as cpp:
        for name, img in imgs.items():
            png = d / f"{name}.png"
            png.write_bytes(png_bytes(img))
            res = run_zinfer("logits", "--model", text_model, "--mmproj", mmproj, "--image", png,
                             "--prompt", prompt, "--out", d / f"{name}.f32", timeout=300)
            assert res.returncode == 0, f"zinfer logits failed: {res.stderr.strip()}"
            info = last_json(res.stdout)
            ids = np.array(info["prompt_token_ids"], np.int64)
            got = np.fromfile(d / f"{name}.f32", "<f4").reshape(len(ids), info["n_vocab"])
            out[name] = dict(ids=ids, got=got, info=info, cpp=cpp.prompt_logits(prompt, [img]),
                             emb=numpy_vision.embed(vis, img))
    return dict(kind=kind, lm=lm, vis=vis, imgs=imgs, out=out, text_model=text_model)


def after_image(ids):
    """Text positions after the last image position."""
    txt = np.nonzero(ids >= 0)[0]
    return txt[txt > np.nonzero(ids < 0)[0].max()]


def test_token_ids_match_llamacpp(setup):
    for name, o in setup["out"].items():
        ids, cpp = o["ids"], o["cpp"]
        txt = np.nonzero(ids >= 0)[0]
        assert np.array_equal(ids[txt], cpp.text_ids), (name, ids.tolist(), cpp.chunks)
        assert np.array_equal(txt, cpp.text_pos), (name, txt.tolist(), cpp.text_pos.tolist())
        assert int((ids < 0).sum()) == cpp.n_image, (name, int((ids < 0).sum()), cpp.n_image)
        assert cpp.n_image == o["emb"].shape[0]
    if setup["kind"] == "idefics3":
        # the markers are single tokens of the vocabulary, not -1 or text
        marks = added_ids()
        ids = setup["out"]["odd_333x517"]["ids"]
        assert int((ids == marks["<fake_token_around_image>"]).sum()) == 6 + 2  # 2 x 3 tiles
        assert int((ids == marks["<global-img>"]).sum()) == 1
        assert int((ids == marks["<row_3_col_2>"]).sum()) == 1


def test_logits_after_image(setup):
    kind, lm = setup["kind"], setup["lm"]
    non_causal = kind == "gemma3"
    got_report, worst = {}, {}
    for name, o in setup["out"].items():
        ids = o["ids"]
        rows = after_image(ids)
        ref = reference(lm, ids, o["emb"], non_causal, rows)
        o["ref"] = ref
        ours = o["got"][rows].astype(np.float64)
        cpp = o["cpp"].logits[np.searchsorted(o["cpp"].text_pos, rows)].astype(np.float64)
        kz, kc = numpy_llama.kl(ref, ours), numpy_llama.kl(ref, cpp)
        top2 = np.partition(ref, -2, axis=-1)[:, -2:]
        gap = top2[:, 1] - top2[:, 0]
        flips = np.nonzero(ref.argmax(-1) != ours.argmax(-1))[0]
        got_report[name] = dict(n_tokens=len(ids), n_image=int((ids < 0).sum()),
                                n_after=len(rows), zinfer_mean_kl=float(kz.mean()),
                                zinfer_max_kl=float(kz.max()), llamacpp_mean_kl=float(kc.mean()),
                                llamacpp_max_kl=float(kc.max()),
                                argmax_flips=[int(rows[p]) for p in flips],
                                encode_ms=o["info"].get("encode_ms"))
        if name == CONTROL_IMAGE:
            # the same KLs before the image: llama.cpp's own error is not
            # the image's (it is about the same there)
            txt = np.nonzero(ids >= 0)[0]
            pre = txt[txt < np.nonzero(ids < 0)[0].min()]
            rb = reference(lm, ids, o["emb"], non_causal, pre)
            cb = o["cpp"].logits[np.searchsorted(o["cpp"].text_pos, pre)].astype(np.float64)
            got_report[name]["before_image"] = dict(
                n=len(pre), zinfer_mean_kl=float(numpy_llama.kl(rb, o["got"][pre]).mean()),
                llamacpp_mean_kl=float(numpy_llama.kl(rb, cb).mean()))
        print(f"\n{kind} {name}: {got_report[name]}")
        worst[name] = [int(rows[p]) for p in flips if gap[p] >= NEAR_TIE]
    report("vision_text", kind, got_report)
    for name, r in got_report.items():
        assert not worst[name], f"{name}: argmax differs at {worst[name]} (not near-ties)"
        assert r["zinfer_mean_kl"] < MAX_MEAN_KL, (name, r)
        assert r["zinfer_mean_kl"] < r["llamacpp_mean_kl"], (name, r)


def test_ablation_moves_far(setup):
    """gemma3: causal attention over the image; idefics3: the overview's
    embeddings before the tiles'. Measured on the odd image."""
    kind, lm = setup["kind"], setup["lm"]
    o = setup["out"]["odd_333x517"]
    ids, rows = o["ids"], after_image(o["ids"])
    ours = o["got"][rows].astype(np.float64)
    base = o.get("ref")
    if base is None:
        base = reference(lm, ids, o["emb"], kind == "gemma3", rows)
    if kind == "gemma3":
        ab = reference(lm, ids, o["emb"], False, rows)
    else:
        emb = numpy_vision.embed(setup["vis"], setup["imgs"]["odd_333x517"], ablate=("tile_order",))
        ab = reference(lm, ids, emb, False, rows)
    k0 = float(numpy_llama.kl(base, ours).mean())
    k1 = float(numpy_llama.kl(ab, ours).mean())
    report("vision_text", kind + "_ablation", dict(reference=k0, ablated=k1))
    print(f"{kind} ablation: mean KL {k1:.3e} (reference {k0:.3e})")
    assert k1 > 100 * max(k0, 1e-8), (k0, k1)
