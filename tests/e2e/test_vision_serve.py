"""Images served end to end (issue 41): `zinfer serve --mmproj` with
gemma-3-270m and a random-weight gemma3 projector (two layers, 224 px
tiles: tests/e2e/vision_files.py), over OpenAI's chat completions with
data: URLs.

  - a greedy image request's 12 tokens equal the float64 pipeline's
    (scripts/ref/numpy_vision.py + numpy_llama.py, image attention
    non-causal as llama.cpp decodes gemma3 images) except where the
    reference's top-2 logits are within 0.01;
  - 8 image requests (4 images, each twice) beside 8 text streams at
    once: every request's tokens equal the same request alone;
  - a repeated image is not encoded again: /metrics' tiles counter
    grows by the distinct images only, and the prefix cache hits;
  - the same image request over Anthropic's Messages and OpenAI's
    Responses gives the chat completion's text;
  - an image over --max-image-pixels (500 x 500 against 200000) is
    refused with 400 naming the limit;
  - 40 bad image inputs (truncated, wrong magic, empty, a 20000 x 20000
    header, text, an animated WebP header, each in several places of a
    request) each get 400 naming the image's index, and the server then
    answers a good image request as before.

Numbers go to the e2e report (section vision_serve). Under the sanitizers
the two comparisons with the float64 pipeline are skipped (its cost).
"""

import base64
import http.client as httpc
import json
import os
import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port, report, serve_process, wait_http
from test_vision import png_bytes
from vision_files import images, write_mmproj

import numpy_llama
import numpy_vision

LM = Path.home() / ".cache" / "zinfer" / "models" / "gemma-3-270m-q4_k_m.gguf"
CHAT = "/v1/chat/completions"
N_TOKENS = 12
SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"
MAX_PIXELS = 200000  # the test images are at most 333 x 517


def data_url(b):
    return "data:image/png;base64," + base64.b64encode(b).decode()


def image_body(img_bytes, text="What is in this picture?", n=N_TOKENS):
    return {"model": LM.stem, "max_tokens": n, "temperature": 0,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": data_url(img_bytes)}}]}]}


def text_body(text, n=N_TOKENS):
    return {"model": LM.stem, "max_tokens": n, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}


def post(port, body):
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read().decode("utf-8", "replace"))
    c.close()
    return r.status, out


def metric(port, *names):
    """The sum over workers of each named /metrics counter (one name: its
    sum; several: a tuple, read together after one wait), once the
    workers' heartbeats (every second) have carried their latest counts."""
    import time
    time.sleep(2.5)
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    got = tuple(sum(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith(name + "{")) for name in names)
    return got[0] if len(names) == 1 else got


@pytest.fixture(scope="module")
def srv(zinfer_bin, tmp_path_factory):
    if not LM.is_file():
        pytest.skip(f"{LM} missing")
    tmp = tmp_path_factory.mktemp("vision_serve")
    mmproj = write_mmproj(tmp / "gemma3.gguf", "gemma3", 640, seed=9, n_layers=2, image_size=224)
    port = free_port()
    with serve_process(zinfer_bin, LM, tmp / "serve.log", "--mmproj", mmproj, "--chat-template",
                       "gemma", "--slots", 16, "--threads-per-worker", 2, "--max-image-pixels",
                       MAX_PIXELS, "--http",
                       f"127.0.0.1:{port}") as s:
        wait_http(port, s)
        s.port, s.mmproj, s.tmp = port, mmproj, tmp
        yield s


def float64_greedy(lm_path, mmproj, png_path, rgb, prompt, non_causal, tmp, n=N_TOKENS):
    """(prompt ids, greedy text, near ties) of the float64 pipeline: the
    prompt laid out by `zinfer logits` (its ids), the image's soft tokens
    from numpy_vision, the text model's float64 forward pass."""
    import subprocess
    from conftest import ZINFER_BIN
    r = subprocess.run([str(ZINFER_BIN), "logits", "--model", str(lm_path), "--mmproj",
                        str(mmproj), "--image", str(png_path), "--prompt", prompt, "--out",
                        str(tmp / "l.f32")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ids = np.array(json.loads(r.stdout.strip().splitlines()[-1])["prompt_token_ids"])
    lm = numpy_llama.load(lm_path)
    emb = numpy_vision.embed(numpy_vision.load(mmproj), rgb)
    pos = np.where(ids < 0)[0]
    assert len(pos) == len(emb)
    E = np.full((len(ids), emb.shape[1]), np.nan)
    E[pos] = emb
    reach = np.arange(len(ids))
    if non_causal:
        reach[pos] = pos[-1]
    cache = lm.new_cache()
    z = lm.forward(ids, cache=cache, last_only=True, embd=E, reach=reach)[-1]
    want, ties = [], 0
    for _ in range(n):
        top = np.sort(z)[-2:]
        ties += top[1] - top[0] < 0.01
        t = int(np.argmax(z))
        want.append(t)
        z = lm.forward([t], cache=cache)[-1]
    r2 = subprocess.run([str(ZINFER_BIN), "detokenize", "--model", str(lm_path)],
                        input=json.dumps(want) + "\n", capture_output=True, text=True, timeout=60)
    return ids, json.loads(r2.stdout.strip().splitlines()[-1]), int(ties)


def test_greedy_equals_float64(srv):
    """The served tokens of an image request are the float64 pipeline's."""
    if SANITIZED:
        pytest.skip("the float64 reference's cost: release only")
    rgb = images()["odd_333x517"]
    st, out = post(srv.port, image_body(png_bytes(rgb)))
    assert st == 200, out
    got = out["choices"][0]["message"]["content"]
    png = srv.tmp / "g.png"
    png.write_bytes(png_bytes(rgb))
    prompt = ("<bos><start_of_turn>user\nWhat is in this picture?<__media__><end_of_turn>\n"
              "<start_of_turn>model\n")
    ids, want, ties = float64_greedy(LM, srv.mmproj, png, rgb, prompt, True, srv.tmp)
    assert out["usage"]["prompt_tokens"] == len(ids), (out["usage"], len(ids))
    report("vision_serve", "gemma3 greedy vs float64", {"served": got, "float64": want,
                                                        "near_ties": ties})
    if not ties:
        assert got == want


def test_idefics3_served(zinfer_bin, tmp_path_factory):
    """SmolVLM's projector (several tiles, causal) with a random llama
    model whose vocabulary has SmolVLM's markers: served greedy tokens
    equal the float64 pipeline's."""
    if SANITIZED:
        pytest.skip("the float64 reference's cost: release only")
    from smolvlm_lm import write_smolvlm_lm
    tmp = tmp_path_factory.mktemp("vision_serve_idefics3")
    lm = tmp / "smolvlm_lm.gguf"
    write_smolvlm_lm(lm)
    mmproj = write_mmproj(tmp / "idefics3.gguf", "idefics3", 256, seed=4, n_layers=2,
                          image_size=128, preproc_image_size=384)
    rgb = images()["odd_333x517"]
    png = tmp / "i.png"
    png.write_bytes(png_bytes(rgb))
    port = free_port()
    with serve_process(zinfer_bin, lm, tmp / "serve.log", "--mmproj", mmproj, "--chat-template",
                       "chatml", "--slots", 2, "--threads-per-worker", 2, "--http",
                       f"127.0.0.1:{port}") as s:
        wait_http(port, s)
        body = {"model": lm.stem, "max_tokens": N_TOKENS, "temperature": 0,
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": data_url(png.read_bytes())}},
                    {"type": "text", "text": "Describe."}]}]}
        st, out = post(port, body)
    assert st == 200, out
    got = out["choices"][0]["message"]["content"]
    # zinfer-http joins a message's parts with "\n" (as vLLM does)
    prompt = "<|im_start|>user\n<__media__>\nDescribe.<|im_end|>\n<|im_start|>assistant\n"
    ids, want, ties = float64_greedy(lm, mmproj, png, rgb, prompt, False, tmp)
    assert out["usage"]["prompt_tokens"] == len(ids), (out["usage"], len(ids))
    report("vision_serve", "idefics3 greedy vs float64", {"served": got, "float64": want,
                                                          "near_ties": ties,
                                                          "prompt_tokens": len(ids)})
    if not ties:
        assert got == want


def test_concurrent_equal_alone(srv):
    """8 image requests beside 8 text streams: each as alone (under the
    sanitizers 4 beside 4, the same mix at half the cost)."""
    k = 2 if SANITIZED else 4
    imgs = [img[::-1].copy() for img in list(images().values())[:k]]  # not seen before
    bodies = [image_body(png_bytes(img), text=f"Picture {i % k}:") for i, img in
              enumerate(imgs + imgs)]
    bodies += [text_body(f"Count to {j}: one, two,", n=16) for j in range(2 * k)]
    t_start = metric(srv.port, "zinfer_image_tiles_encoded_total")
    alone = [post(srv.port, b) for b in bodies]
    assert all(st == 200 for st, _ in alone), alone
    tiles0 = metric(srv.port, "zinfer_image_tiles_encoded_total")
    res = [None] * len(bodies)

    def go(i):
        res[i] = post(srv.port, bodies[i])

    th = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    for i, ((st, a), (st2, b)) in enumerate(zip(alone, res)):
        assert st2 == 200, b
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"], i
    # every image was seen alone first: the concurrent round encodes none
    # (the prefix cache holds them) unless memory pressure evicted blocks
    tiles1 = metric(srv.port, "zinfer_image_tiles_encoded_total")
    report("vision_serve", "tiles encoded", {"alone round": tiles0 - t_start,
                                             "concurrent round": tiles1 - tiles0})
    assert tiles0 - t_start == k  # each (image, text) pair's second request hits the cache
    assert tiles1 - tiles0 == 0


def test_repeat_hits_cache(srv):
    img = png_bytes(images()["stripes"][:, ::-1].copy())
    t0, s0 = metric(srv.port, "zinfer_image_tiles_encoded_total",
                    "zinfer_image_encode_seconds_total")
    for _ in range(3):
        st, _ = post(srv.port, image_body(img, text="Again:"))
        assert st == 200
    t1, s1 = metric(srv.port, "zinfer_image_tiles_encoded_total",
                    "zinfer_image_encode_seconds_total")
    report("vision_serve", "repeat", {"tiles": t1 - t0, "encode_s": s1 - s0})
    assert t1 - t0 == 1, (t0, t1)
    assert s1 > s0


def bad_images():
    good = png_bytes(images()["gradient"])
    huge = bytearray(good[:33])
    huge[16:24] = struct.pack(">II", 20000, 20000)
    huge[29:33] = struct.pack(">I", zlib.crc32(bytes(huge[12:29])))
    anim_webp = (b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8X" + struct.pack("<I", 10)
                 + bytes([0x02, 0, 0, 0]) + b"\x0f\x00\x00\x0f\x00\x00")
    return {
        "truncated": good[: len(good) // 3],
        "wrong_magic": b"\x89PNX" + good[4:],
        "text": b"this is not an image at all" * 4,
        "bomb": bytes(huge) + good[33:],
        "animated_webp": anim_webp,
        "zeros": bytes(200),
        "corrupt": good[:60] + bytes(x ^ 0x5A for x in good[60:200]) + good[200:],
        "tiny_header": good[:20],
    }


def test_bad_images_then_serves(srv):
    """40 bad inputs: 400 naming the image; the server serves on."""
    good = png_bytes(images()["gradient"])
    n = 0
    for name, bad in bad_images().items():
        # the bad image alone, first of two, second of two, before text, after text
        layouts = [[bad], [bad, good], [good, bad], [bad], [bad]]
        texts = ["a", "b", "c", "", "Look:"]
        for k, (imgs, text) in enumerate(zip(layouts, texts)):
            content = ([{"type": "text", "text": text}] if text else []) + [
                {"type": "image_url", "image_url": {"url": data_url(b)}} for b in imgs]
            body = {"model": LM.stem, "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": content}]}
            st, out = post(srv.port, body)
            idx = imgs.index(bad)
            msg = out["error"]["message"]
            assert st == 400, (name, k, st, out)
            assert f"images[{idx}]" in msg, (name, k, msg)
            n += 1
    assert n == 40
    st, out = post(srv.port, image_body(good))
    assert st == 200, out
    report("vision_serve", "bad images", n)


def test_messages_and_responses(srv):
    """The same image and text over the three APIs: the same completion."""
    png = png_bytes(images()["noise"])
    b64 = base64.b64encode(png).decode()
    st, chat = post(srv.port, image_body(png, text="Name it:"))
    assert st == 200, chat
    want = chat["choices"][0]["message"]["content"]
    c = httpc.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    msg = {"model": LM.stem, "max_tokens": N_TOKENS, "temperature": 0,
           "messages": [{"role": "user", "content": [
               {"type": "text", "text": "Name it:"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": b64}}]}]}
    c.request("POST", "/v1/messages", body=json.dumps(msg),
              headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
    r = c.getresponse()
    out = json.loads(r.read())
    assert r.status == 200, out
    assert "".join(b["text"] for b in out["content"] if b["type"] == "text") == want
    assert out["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    resp = {"model": LM.stem, "max_output_tokens": N_TOKENS, "temperature": 0,
            "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "Name it:"},
                {"type": "input_image", "image_url": data_url(png)}]}]}
    c.request("POST", "/v1/responses", body=json.dumps(resp),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    c.close()
    assert r.status == 200, out
    text = "".join(p["text"] for o in out["output"] if o["type"] == "message"
                   for p in o["content"] if p["type"] == "output_text")
    assert text == want


def test_pixel_limit(srv):
    big = np.zeros((500, 500, 3), np.uint8)
    st, out = post(srv.port, image_body(png_bytes(big)))
    assert st == 400, out
    msg = out["error"]["message"]
    assert "images[0]" in msg and "500 x 500" in msg and str(MAX_PIXELS) in msg, msg
