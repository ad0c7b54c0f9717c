"""End-to-end tests of images in requests, from HTTP to the tokenizer
process (docs/protocol.md "Images", docs/http.md "Images"; issue 41).

One `zinfer serve --http` runs the default model (a text-only model, no
image projector) with small image limits (--max-images 3,
--max-image-bytes 4096). An image sent as a data: URL in OpenAI's chat
completions, Anthropic's Messages and OpenAI's Responses reaches the
tokenizer process, which answers that images need --mmproj (400); the
protocol's `images` (msgpack bin) from a ZeroMQ client gets the same
answer; the marker count is checked against the images. Bad image inputs
(a remote URL, a data: URL that is not base64, bad base64, too many
images, too large an image) each get their status and a message naming
the part, and the server keeps serving text requests after all of them.
The test images are small PNG files written here with zlib and struct.
"""

import base64
import http.client as httpc
import json
import struct
import zlib

import pytest

from conftest import Client, ZinferError, free_port, serve_process, wait_http

MAX_IMAGES = 3
MAX_IMAGE_BYTES = 4096
CHAT, MSG, RESP = "/v1/chat/completions", "/v1/messages", "/v1/responses"


def png(w, h, seed=0):
    """A w x h RGB PNG file: a gradient with a seed-dependent tint."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    rows = b"".join(b"\x00" + bytes(c for x in range(w)
                                     for c in (x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1),
                                               (seed * 37 + x + y) & 255))
                    for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def data_url(b, media="image/png"):
    return f"data:{media};base64," + base64.b64encode(b).decode()


IMG = png(8, 6)
NOISE = bytes((i * 7919 + (i >> 3)) & 255 for i in range(MAX_IMAGE_BYTES + 1))  # too large


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("images") / "serve.log"
    with serve_process(zinfer_bin, model_path, log, "--threads-per-worker", 1, "--slots", 2,
                       "--http", f"127.0.0.1:{port}", "--max-images", MAX_IMAGES,
                       "--max-image-bytes", MAX_IMAGE_BYTES) as srv:
        wait_http(port, srv)
        srv.port = port
        yield srv


def post(port, path, body):
    """(status, parsed JSON body)."""
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body),
              headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    c.close()
    return r.status, json.loads(data)


def message_of(path, out):
    """The error message, in OpenAI's or Anthropic's shape."""
    return out["error"]["message"]


def chat(*parts, n_msgs=1):
    return {"max_tokens": 4, "messages": [{"role": "user", "content": "hello"}] * (n_msgs - 1)
            + [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}]}


def oai_image(url, **kw):
    return {"type": "image_url", "image_url": {"url": url, **kw}}


def anthropic(*blocks):
    return {"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, *blocks]}]}


def ant_image(data=None, media="image/png", url=None):
    src = ({"type": "url", "url": url} if url is not None
           else {"type": "base64", "media_type": media, "data": data})
    return {"type": "image", "source": src}


def responses(*parts):
    return {"max_output_tokens": 4, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, *parts]}]}


def resp_image(url, **kw):
    return {"type": "input_image", "image_url": url, **kw}


B64 = base64.b64encode(IMG).decode()

# An image that reaches the tokenizer process: without a projector, a 400
# naming --mmproj, in each API's error shape.
REACHES = [
    (CHAT, chat(oai_image(data_url(IMG)))),
    (CHAT, chat(oai_image(data_url(IMG), detail="high"), oai_image(data_url(png(3, 3, 1))))),
    (CHAT, chat({"type": "image_url", "image_url": data_url(IMG)})),  # a bare URL string
    (MSG, anthropic(ant_image(B64))),
    (MSG, anthropic(ant_image(B64, "image/jpeg"), ant_image(url=data_url(IMG)))),
    (RESP, responses(resp_image(data_url(IMG)))),
    (RESP, responses(resp_image(data_url(IMG), detail="low"), resp_image(data_url(IMG)))),
]


@pytest.mark.parametrize("case", REACHES, ids=[f"{c[0].split('/')[-1]}-{i}"
                                               for i, c in enumerate(REACHES)])
def test_image_reaches_tokenizer(server, case):
    path, body = case
    st, out = post(server.port, path, body)
    assert st == 400, (st, out)
    msg = message_of(path, out)
    assert "image projector" in msg and "--mmproj" in msg, out


def too_many_chat():
    return chat(*[oai_image(data_url(png(2, 2, i))) for i in range(MAX_IMAGES + 1)])


# (path, body, status, words the message holds, in order: the field first)
BAD = [
    (CHAT, chat(oai_image("https://example.com/cat.png")), 400,
     ["messages[0].content[1].image_url.url", "remote image URLs are not fetched", "data:"]),
    (CHAT, chat(oai_image("data:image/png,rawbytes")), 400,
     ["messages[0].content[1].image_url.url", "not base64"]),
    (CHAT, chat(oai_image("data:image/png;base64,iVBOR!!w0KGgo=")), 400,
     ["messages[0].content[1].image_url.url", "not valid base64"]),
    (CHAT, chat(oai_image("data:image/png;base64,iVBORw0KG")), 400,
     ["messages[0].content[1].image_url.url", "cut short"]),
    (CHAT, chat(oai_image(data_url(IMG)), n_msgs=2), 400, ["image projector"]),  # message 1
    (CHAT, chat(oai_image("ftp://x/y.png")), 400, ["not a data: URL"]),
    (CHAT, chat(oai_image(data_url(b"abc", "text/plain"))), 400, ["not an image type"]),
    (CHAT, chat(oai_image(data_url(IMG), detail="ultra")), 400,
     ["messages[0].content[1].image_url.detail"]),
    (CHAT, chat({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}), 400,
     ["messages[0].content[1].type", "not supported"]),
    (CHAT, too_many_chat(), 400,
     [f"messages[0].content[{MAX_IMAGES + 1}].image_url.url",
      f"more than {MAX_IMAGES} images", "--max-images"]),
    (CHAT, chat(oai_image(data_url(NOISE))), 413,
     ["messages[0].content[1].image_url.url", f"{len(NOISE)} bytes",
      f"limit of {MAX_IMAGE_BYTES}", "--max-image-bytes"]),
    # a marker written by the client besides an image: the counts differ
    (CHAT, {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<__media__> twice"}, oai_image(data_url(IMG))]}]}, 400,
     ["images", "1 image", "2 <__media__> markers"]),
    (MSG, anthropic(ant_image(url="https://example.com/cat.png")), 400,
     ["messages.0.content.1.source.url", "remote image URLs are not fetched"]),
    (MSG, anthropic(ant_image("iVBOR%%%")), 400,
     ["messages.0.content.1.source.data", "not valid base64"]),
    (MSG, anthropic(ant_image(B64, "text/plain")), 400,
     ["messages.0.content.1.source.media_type"]),
    (MSG, anthropic({"type": "image", "source": {"type": "file", "file_id": "f1"}}), 400,
     ["messages.0.content.1.source.type", "not supported"]),
    (MSG, anthropic(ant_image(base64.b64encode(NOISE).decode())), 413,
     ["messages.0.content.1.source.data", "--max-image-bytes"]),
    (MSG, anthropic(*[ant_image(B64)] * (MAX_IMAGES + 1)), 400,
     [f"messages.0.content.{MAX_IMAGES + 1}.source.data", "--max-images"]),
    (MSG, anthropic({"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                    "data": "x"}}), 400,
     ["messages.0.content.1", "not supported"]),
    (RESP, responses(resp_image("http://example.com/a.png")), 400,
     ["input[0].content[1].image_url", "remote image URLs are not fetched"]),
    (RESP, responses(resp_image("data:image/png;base64,@@@@")), 400,
     ["input[0].content[1].image_url", "not valid base64"]),
    (RESP, responses(resp_image("x")), 400, ["input[0].content[1].image_url", "not a data: URL"]),
    (RESP, responses({"type": "input_image", "file_id": "file-1"}), 400,
     ["input[0].content[1].image_url", "file ids are not served"]),
    (RESP, responses(resp_image(data_url(NOISE))), 413,
     ["input[0].content[1].image_url", "--max-image-bytes"]),
    (RESP, responses({"type": "input_file", "file_id": "x"}), 400,
     ["input[0].content[1].type", "not supported"]),
]


@pytest.mark.parametrize("case", BAD, ids=[f"{c[0].split('/')[-1]}-{i}"
                                           for i, c in enumerate(BAD)])
def test_bad_images(server, case):
    path, body, status, words = case
    st, out = post(server.port, path, body)
    assert st == status, (st, out)
    msg = message_of(path, out)
    for w in words:
        assert w in msg, (w, out)


def test_protocol_images(server):
    """The protocol's images (msgpack bin) from a ZeroMQ client: checked by
    the router against the markers, then answered by the tokenizer."""
    with Client(server.addr, timeout_s=60) as c:
        for kw in ({"prompt": "<__media__> What is it?"},
                   {"messages": [{"role": "user", "content": "<__media__>\n<__media__> Same?"}],
                    "more": True}):
            more = kw.pop("more", False)
            images = [IMG, png(4, 4, 2)] if more else [IMG]
            with pytest.raises(ZinferError) as ex:
                c.complete(**kw, images=images, sampling_params={"max_new_tokens": 2})
            assert ex.value.code == "unsupported", ex.value.reply
            assert "--mmproj" in str(ex.value)
        with pytest.raises(ZinferError) as ex:  # no marker
            c.complete(prompt="What is it?", images=[IMG], sampling_params={"max_new_tokens": 2})
        assert ex.value.code == "invalid_request"
        assert "1 image, but the prompt holds 0 <__media__> markers" in str(ex.value)
        with pytest.raises(ZinferError) as ex:  # not bin
            c.complete(prompt="<__media__>", images=["a string"],
                       sampling_params={"max_new_tokens": 2})
        assert "images[0]: expected bytes (msgpack bin)" in str(ex.value)
        with pytest.raises(ZinferError) as ex:  # token ids place no image
            c.complete(prompt=[1, 2, 3], images=[IMG], sampling_params={"max_new_tokens": 2})
        assert "token ids cannot place images" in str(ex.value)
        # an empty list is no images: a marker is then plain text
        text, _, final = c.complete(prompt="<__media__> hi", images=[],
                                    sampling_params={"max_new_tokens": 2})
        assert final["event"] == "final"


def test_serves_text_after_bad_images(server):
    """After every bad input above, text requests on all three APIs."""
    st, out = post(server.port, CHAT, {"max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Name a color."}]}]})
    assert st == 200 and out["choices"][0]["message"]["content"] is not None, out
    st, out = post(server.port, MSG, {"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": "Name a color."}]})
    assert st == 200 and out["type"] == "message", out
    st, out = post(server.port, RESP, {"max_output_tokens": 4, "input": "Name a color."})
    assert st == 200 and out["object"] == "response", out
    assert server.proc.poll() is None
