"""End-to-end tests of zinfer-http, the OpenAI HTTP front end (docs/http.md).

One `zinfer serve --http` is started for the module on free ports, with an
API key and a small body limit, on the real default model. It is driven by
the official `openai` SDK and by raw HTTP (http.client, sockets): chat and
completions, streamed and not, n = 3, stop strings, seeds, logprobs against
the msgpack protocol's, json_schema output against `jsonschema`, usage
counts, a client that disconnects mid-stream, and a table of bad inputs,
each with its status and an OpenAI error naming the problem, after which
the server still serves.
"""

import contextlib
import http.client as httpc
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import jsonschema
import numpy as np
import openai
import pytest

from conftest import serve_process
from zinfer_client import Client, decode_array

KEY = "sk-test-zinfer"
MAX_BODY = 64 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Http:
    """Raw HTTP to the front end: (status, headers, parsed JSON or text)."""

    def __init__(self, port):
        self.port = port

    def req(self, method, path, body=None, headers=None, key=KEY, timeout=60):
        c = httpc.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = f"Bearer {key}"
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        try:
            return r.status, dict(r.getheaders()), json.loads(data)
        except ValueError:
            return r.status, dict(r.getheaders()), data.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("http") / "serve.log"
    hport = free_port()
    with serve_process(zinfer_bin, model_path, log, "--threads-per-worker", 2, "--slots", 8,
                       "--http", f"127.0.0.1:{hport}", "--api-key", KEY,
                       "--http-max-body-bytes", MAX_BODY, "--http-header-timeout", 30) as srv:
        h = Http(hport)
        deadline = time.time() + 30
        while True:
            try:
                if h.req("GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, srv.log()
            time.sleep(0.05)
        srv.http = h
        srv.port = hport
        yield srv


@pytest.fixture(scope="module")
def web(server):
    return server.http


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY,
                         max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(web):
    st, _, body = web.req("GET", "/v1/models")
    assert st == 200 and body["object"] == "list" and len(body["data"]) == 1, body
    return body["data"][0]["id"]


@pytest.fixture(scope="module")
def zc(server):
    with Client(server.addr, timeout_s=60) as c:
        yield c


MSGS = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three colors."}]


def test_health_models_tokenize(web, model, zc, sdk):
    st, _, body = web.req("GET", "/health", key=None)  # no key needed
    assert st == 200 and body["status"] == "ok" and body["workers"] == 1, body
    assert model == "SmolLM2-135M-Instruct.Q4_1"
    assert [m.id for m in sdk.models.list().data] == [model]
    st, _, m = web.req("GET", f"/v1/models/{model}")
    assert st == 200 and m["id"] == model and m["max_model_len"] > 0
    text = "The capital of France is Paris."
    st, _, tok = web.req("POST", "/tokenize", {"prompt": text, "model": model})
    assert st == 200, tok
    want = list(decode_array(zc.call("tokenize", text=text)["token_ids"]))
    assert tok["tokens"] == want and tok["count"] == len(want)
    st, _, de = web.req("POST", "/detokenize", {"tokens": want})
    assert st == 200 and de["prompt"] == text, de


def test_embeddings(web, sdk, model, zc):
    texts = ["The cat sleeps all day.", "Paris is in France."]
    want = decode_array(zc.call("embed", input=texts, normalize=True)["embeddings"], as_numpy=True)
    # the SDK asks for base64 (and decodes it) unless told float
    r = sdk.embeddings.create(model=model, input=texts)
    assert [d.index for d in r.data] == [0, 1] and r.model == model
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0
    for d, w in zip(r.data, want):
        assert len(d.embedding) == 576 and np.allclose(d.embedding, w, rtol=0, atol=1e-7)
    rf = sdk.embeddings.create(model=model, input=texts[0], encoding_format="float")
    assert np.array_equal(np.float32(rf.data[0].embedding), want[0])  # JSON keeps float32 exact
    ids = list(decode_array(zc.call("tokenize", text=texts[1])["token_ids"]))
    st, _, b = web.req("POST", "/v1/embeddings", {"input": [ids], "normalize": False,
                                                  "pooling": "last"})
    assert st == 200, b
    raw = decode_array(zc.call("embed", input=[ids], pooling="last")["embeddings"], as_numpy=True)
    assert np.array_equal(np.float32(b["data"][0]["embedding"]), raw[0])
    for body, param in [({}, "input"), ({"input": []}, "input"), ({"input": [1.5]}, "input[0]"),
                        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
                        ({"input": "x", "dimensions": 8}, "dimensions"),
                        ({"input": "x", "colour": 1}, "colour"),
                        ({"input": ["a", [2, -1]]}, "input[1]"),
                        ({"input": "word " * 5000}, "input")]:
        st, _, b = web.req("POST", "/v1/embeddings", body)
        assert st == 400 and b["error"]["param"] == param, (body, b)


def test_chat_matches_msgpack_and_usage(sdk, model, zc):
    r = sdk.chat.completions.create(model=model, messages=MSGS, max_tokens=24, temperature=0)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    text, ids, final = zc.complete(messages=MSGS, sampling_params={
        "top_k": 0, "temperature": 0.0, "max_new_tokens": 24})
    assert c.message.content == text
    assert r.usage.completion_tokens == len(ids) == final["usage"]["completion_tokens"]
    assert r.usage.prompt_tokens == final["usage"]["prompt_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert c.finish_reason == ("length" if final["status"] == "maximum_length" else "stop")


def test_chat_stream_sdk_and_raw(sdk, model, server):
    full = sdk.chat.completions.create(model=model, messages=MSGS, max_tokens=20, temperature=0)
    chunks = list(sdk.chat.completions.create(
        model=model, messages=MSGS, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    choice_chunks = [ch for ch in chunks if ch.choices]
    assert choice_chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    text = "".join(ch.choices[0].delta.content or "" for ch in choice_chunks)
    assert text == full.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in choice_chunks]
    assert finishes[-1] == full.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    # Raw: SSE framing exactly, ending with data: [DONE].
    c = httpc.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"model": model, "messages": MSGS, "max_tokens": 8, "stream": True}),
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), raw
    assert events[-1] == "data: [DONE]"
    assert "usage" not in json.loads(events[0][6:])  # not asked for


def test_completions_n3_seed_repeats(sdk, model):
    kw = dict(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.0, n=3,
              seed=1234)
    a = sdk.completions.create(**kw)
    b = sdk.completions.create(**kw)
    ta = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    tb = [c.text for c in sorted(b.choices, key=lambda c: c.index)]
    assert [c.index for c in sorted(a.choices, key=lambda c: c.index)] == [0, 1, 2]
    assert ta == tb  # a seed repeats
    assert len(set(ta)) >= 2, ta  # the choices are drawn apart
    # vLLM's ignore_eos: every choice runs to max_tokens; usage counts the
    # prompt once and the three completions together
    u = sdk.completions.create(**kw, extra_body={"ignore_eos": True}).usage
    assert u.completion_tokens == 36 and u.prompt_tokens == 4 and u.total_tokens == 40, u
    c = sdk.completions.create(**{**kw, "seed": 99})
    assert [x.text for x in sorted(c.choices, key=lambda c: c.index)] != ta
    # streamed n = 3: each choice's chunks carry its index; each ends once
    chunks = list(sdk.completions.create(**kw, stream=True))
    texts = {0: "", 1: "", 2: ""}
    ends = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                ends[c.index] = ends.get(c.index, 0) + 1
    assert [texts[i] for i in range(3)] == ta and ends == {0: 1, 1: 1, 2: 1}


def test_stop_strings(sdk, model):
    kw = dict(model=model, messages=MSGS, max_tokens=30, temperature=0)
    full = sdk.chat.completions.create(**kw).choices[0].message.content
    words = full.split()
    assert len(words) >= 4, full
    stop = words[2]
    cut = full[:full.index(stop)]
    r = sdk.chat.completions.create(**kw, stop=[stop, "zzzqqq"])
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    r = sdk.chat.completions.create(**kw, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in r if c.choices) == cut


def test_logprobs_equal_msgpack(web, model, zc):
    prompt = "The capital of France is"
    st, _, body = web.req("POST", "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3})
    assert st == 200, body
    lp = body["choices"][0]["logprobs"]
    text, ids, final = zc.complete(prompt=prompt, logprobs=3, sampling_params={
        "top_k": 0, "temperature": 0.0, "max_new_tokens": 6})
    want = final["logprobs"]
    assert body["choices"][0]["text"] == text
    assert len(lp["token_logprobs"]) == len(ids) == len(want["token_log_probabilities"])
    for got, w in zip(lp["token_logprobs"], want["token_log_probabilities"]):
        assert got == pytest.approx(float(w), abs=1e-6)
    for got, w in zip(lp["top_logprobs"], want["top_log_probabilities"]):
        assert sorted(got.values()) == pytest.approx(sorted(float(v) for v in w.values()),
                                                     abs=1e-6)
    assert "".join(lp["tokens"]) == text
    assert lp["text_offset"][0] == 0
    # chat: the same numbers in chat's shape
    st, _, chat = web.req("POST", "/v1/chat/completions", {
        "messages": MSGS, "max_tokens": 5, "temperature": 0, "logprobs": True,
        "top_logprobs": 2})
    assert st == 200, chat
    content = chat["choices"][0]["logprobs"]["content"]
    text, ids, final = zc.complete(messages=MSGS, logprobs=2, sampling_params={
        "top_k": 0, "temperature": 0.0, "max_new_tokens": 5})
    assert [c["logprob"] for c in content] == pytest.approx(
        [float(x) for x in final["logprobs"]["token_log_probabilities"]], abs=1e-6)
    assert all(len(c["top_logprobs"]) == 2 for c in content)
    assert "".join(c["token"] for c in content) == chat["choices"][0]["message"]["content"]
    assert all(bytes(c["bytes"]).decode() == c["token"] for c in content)


def test_logit_bias(web, model, zc):
    """Greedy: -100 on the first token gives the unbiased runner-up; +100
    on a token makes the model emit it."""
    prompt = "The capital of France is"
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": 2}
    st, _, free = web.req("POST", COMP, body)
    assert st == 200, free
    lp = free["choices"][0]["logprobs"]
    (best, _), (second, _) = sorted(lp["top_logprobs"][0].items(), key=lambda kv: -kv[1])
    assert lp["tokens"][0] == best
    _, ids, _ = zc.complete(prompt=prompt, sampling_params={"max_new_tokens": 1})
    st, _, banned = web.req("POST", COMP, {**body, "logit_bias": {str(ids[0]): -100}})
    assert st == 200, banned
    assert banned["choices"][0]["logprobs"]["tokens"][0] == second, (lp, banned)
    st, _, forced = web.req("POST", COMP, {**body, "logit_bias": {"1000": 100}})
    st2, _, de = web.req("POST", "/detokenize", {"tokens": [1000, 1000]})
    assert st == st2 == 200, (forced, de)
    assert forced["choices"][0]["text"] == de["prompt"], (forced, de)


def test_skip_special_tokens(web, model):
    """A control token's text (<|im_start|>, forced by logit_bias) is left
    out of the completion by default, kept with skip_special_tokens false,
    and kept by default when tools are on (a tool-call format's markers may
    be control tokens: Mistral's [TOOL_CALLS], Kimi K2's, Command R's);
    skip_special_tokens true then leaves it out again."""
    base = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "temperature": 0, "logit_bias": {"1": 100}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

    def content(**kw):
        st, _, body = web.req("POST", CHAT, {**base, **kw})
        assert st == 200, body
        return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]

    assert content() == ("", 2)
    assert content(skip_special_tokens=False) == ("<|im_start|><|im_start|>", 2)
    assert content(tools=[tool]) == ("<|im_start|><|im_start|>", 2)
    assert content(tools=[tool], skip_special_tokens=True) == ("", 2)
    st, _, body = web.req("POST", CHAT, {**base, "skip_special_tokens": "no"})
    assert st == 400 and body["error"]["param"] == "skip_special_tokens", body


def test_echo_completion(web, model):
    st, _, body = web.req("POST", "/v1/completions", {
        "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "echo": True,
        "logprobs": 1})
    assert st == 200, body
    ch = body["choices"][0]
    assert ch["text"].startswith("The capital of France is")
    assert ch["logprobs"]["token_logprobs"][0] is None
    assert "".join(ch["logprobs"]["tokens"]) == ch["text"]


def test_json_schema_validates(sdk, model):
    schema = {"type": "object",
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                             "color": {"enum": ["red", "green", "blue"]}},
              "required": ["name", "age", "color"]}
    r = sdk.chat.completions.create(
        model=model, max_tokens=80, temperature=0,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    jsonschema.validate(json.loads(c.message.content), schema)
    r = sdk.chat.completions.create(
        model=model, max_tokens=80, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r
    assert json.loads(r.choices[0].message.content) == {"city": "Paris"}



def test_structured_outputs_and_grammar(sdk, model):
    """vLLM's structured_outputs (choice, regex, json) and llama.cpp's
    grammar field hold the completion; two constraints at once are a 400."""
    ask = [{"role": "user", "content": "Is the sky blue?"}]
    r = sdk.chat.completions.create(model=model, max_tokens=16, temperature=0, messages=ask,
                                    extra_body={"structured_outputs": {"choice": ["Yes.", "No!"]}})
    assert r.choices[0].message.content in ("Yes.", "No!"), r
    assert r.choices[0].finish_reason == "stop", r
    r = sdk.completions.create(model=model, max_tokens=16, temperature=1.0, seed=5,
                               prompt="My phone number is ",
                               extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].text), r
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                               "sure": {"type": "boolean"}},
              "required": ["answer", "sure"]}
    r = sdk.chat.completions.create(model=model, max_tokens=32, temperature=0, messages=ask,
                                    extra_body={"structured_outputs": {"json": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = sdk.completions.create(model=model, max_tokens=16, temperature=0, prompt="Count: ",
                               extra_body={"grammar": 'root ::= [1-3] (", " [1-3]){2}'})
    assert re.fullmatch(r"[1-3](, [1-3]){2}", r.choices[0].text), r
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=model, max_tokens=8, messages=ask,
                                    response_format={"type": "json_object"},
                                    extra_body={"grammar": 'root ::= "x"'})
    assert "grammar" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=model, max_tokens=8, messages=ask,
                                    extra_body={"structured_outputs": {"regex": "a(?=b)"}})
    assert "regex" in str(e.value) and "lookaround" in str(e.value)

# zinfer's tool-call ids: 9 letters and digits, which Mistral's templates demand
CALL_ID = re.compile(r"[A-Za-z0-9]{9}")
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_tool_call_round_trip(sdk, model):
    """A forced call (named, then required) decodes to a valid call of the
    tool's schema; streamed, it arrives as tool_calls deltas; then the tool's
    result goes back and the model answers in text."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = sdk.chat.completions.create(model=model, messages=msgs, tools=WEATHER,
                                        tool_choice=choice, temperature=0, max_tokens=40)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None, c
        (call,) = c.message.tool_calls
        assert call.type == "function" and CALL_ID.fullmatch(call.id), call.id
        assert call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, WEATHER[0]["function"]["parameters"])
    chunks = [x for x in sdk.chat.completions.create(
        model=model, messages=msgs, tools=WEATHER, tool_choice="required", temperature=0,
        max_tokens=40, stream=True) if x.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [t for x in chunks for t in (x.choices[0].delta.tool_calls or [])]
    # the call starts with its name, then its arguments arrive piece by piece
    # and join to exactly the unstreamed reply's arguments
    assert deltas[0].index == 0 and CALL_ID.fullmatch(deltas[0].id), deltas[0].id
    assert deltas[0].function.name == "get_weather" and deltas[0].function.arguments == ""
    assert len(deltas) > 2 and all(t.index == 0 and t.id is None for t in deltas[1:])
    assert "".join(t.function.arguments for t in deltas[1:]) == call.function.arguments
    assert not any(x.choices[0].delta.content for x in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    follow = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id,
         "content": json.dumps({"temperature_c": 21, "sky": "sunny"})}]
    r = sdk.chat.completions.create(model=model, messages=follow, tools=WEATHER, temperature=0,
                                    max_tokens=40)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length") and not c.message.tool_calls
    assert c.message.content and r.usage.prompt_tokens > 40  # the call and result were sent


def test_tools_auto_streams_text(sdk, model):
    """With tools on and no call made, the text streams token by token (not
    held to the end) and says what the unstreamed reply says."""
    kw = dict(model=model, messages=[{"role": "user", "content": "Say hello to Anna."}],
              tools=WEATHER, temperature=0, max_tokens=12)
    whole = sdk.chat.completions.create(**kw).choices[0]
    chunks = [x for x in sdk.chat.completions.create(stream=True, **kw) if x.choices]
    texts = [x.choices[0].delta.content for x in chunks if x.choices[0].delta.content]
    assert not whole.message.tool_calls and len(texts) > 3, texts
    assert "".join(texts) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


HERMES3 = (Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
           / "llama.cpp-vendor" / "models" / "templates"
           / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")


@contextlib.contextmanager
def serve_with_template(zinfer_bin, model_path, tmp_path, template):
    """A small server of its own with --chat-template template and HTTP,
    healthy and rendering tool messages by the template: (srv, Http, port)."""
    port = free_port()
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log", "--threads-per-worker", 2,
                       "--slots", 2, "--chat-template", template,
                       "--http", f"127.0.0.1:{port}") as srv:
        h = Http(port)
        deadline = time.time() + 30
        while h.req("GET", "/health", key=None, timeout=5)[0] != 200:
            assert time.time() < deadline, srv.log()
            time.sleep(0.05)
        assert "tool messages rendered by the template" in srv.log()
        yield srv, h, port


def bos_eos(zinfer_bin, model_path):
    """The model's BOS and EOS token texts, which the server's templates get."""
    info = json.loads(subprocess.run([str(zinfer_bin), "info", "--model", str(model_path),
                                      "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    return info["tokenizer"]["bos_token"], info["tokenizer"]["eos_token"]


def hf_render(template, messages, tools, bos, eos):
    """jinja2 as Hugging Face's apply_chat_template renders (its tojson)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
        return json.dumps(x, indent=indent, separators=separators, sort_keys=sort_keys,
                          ensure_ascii=ensure_ascii)

    def raise_exception(msg):
        raise TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, tools=tools, bos_token=bos,
                                            eos_token=eos, add_generation_prompt=True)


@pytest.mark.skipif(not HERMES3.is_file(), reason=f"{HERMES3} absent")
def test_tool_messages_in_template_roles(zinfer_bin, model_path, tmp_path):
    """With a template that renders tools (Hermes 3's), a tool-call round
    trip over HTTP reaches it natively: the assistant's tool_calls (their
    arguments as a map) and the `tool` message in its own role, the tools
    listed by the template; the prompt is jinja2's rendering of exactly
    that, token for token in number, and not the text-turn fallback's."""
    with serve_with_template(zinfer_bin, model_path, tmp_path, HERMES3) as (srv, h, port):
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0,
                            timeout=60)
        model = sdk.models.list().data[0].id
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = sdk.chat.completions.create(model=model, messages=msgs, tools=WEATHER, tool_choice="required",
                                        temperature=0, max_tokens=40)
        (call,) = r.choices[0].message.tool_calls
        follow = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "name": "get_weather",
             "content": json.dumps({"temperature_c": 21})}]
        r = sdk.chat.completions.create(model=model, messages=follow,
                                        tools=WEATHER, temperature=0, max_tokens=2)
        template = HERMES3.read_text(encoding="utf-8")
        special = bos_eos(zinfer_bin, model_path)
        native = [dict(m) for m in follow]
        native[1]["tool_calls"] = [{"id": call.id, "type": "function", "function": {
            "name": call.function.name, "arguments": json.loads(call.function.arguments)}}]
        text = hf_render(template, native, WEATHER, *special)
        assert "<|im_start|>tool\n<tool_response>" in text and "temperature_c" in text
        st, _, tok = h.req("POST", "/tokenize", {"prompt": text, "add_special_tokens": False},
                           key=None)
        assert st == 200, tok
        assert r.usage.prompt_tokens == tok["count"], (r.usage, tok["count"], text)
        # the text-turn fallback would have given another prompt
        args = json.dumps(json.loads(call.function.arguments))
        fallback = [msgs[0], {"role": "assistant", "content": "<tool_call>\n{\"name\": "
                              f"\"get_weather\", \"arguments\": {args}}}\n</tool_call>"},
                    {"role": "user", "content": "<tool_response>\n" + follow[2]["content"]
                     + "\n</tool_response>"}]
        other = hf_render(template, fallback, WEATHER, *special)
        assert other != text
        st, _, tok2 = h.req("POST", "/tokenize", {"prompt": other, "add_special_tokens": False},
                            key=None)
        assert tok2["count"] != tok["count"]


MISTRAL = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates" / "mistral_v0_3.jinja"


def test_tool_call_ids_fit_mistral_templates(zinfer_bin, model_path, tmp_path):
    """Mistral's templates raise on a tool-call id that is not 9 long:
    zinfer's generated ids go back through Mistral v0.3's template (the
    call and its result rendered natively), and OpenAI's "call_" + 24
    characters is refused by the template, naming the rule."""
    with serve_with_template(zinfer_bin, model_path, tmp_path, MISTRAL) as (srv, h, port):
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        st, _, r = h.req("POST", CHAT, {"messages": msgs, "tools": WEATHER, "max_tokens": 30,
                                        "tool_choice": "required", "temperature": 0}, key=None)
        assert st == 200, r
        (call,) = r["choices"][0]["message"]["tool_calls"]
        assert CALL_ID.fullmatch(call["id"]), call

        def follow(call_id):
            c = dict(call, id=call_id)
            return {"messages": msgs + [
                {"role": "assistant", "content": None, "tool_calls": [c]},
                {"role": "tool", "tool_call_id": call_id, "content": "{\"temperature_c\": 21}"}],
                "tools": WEATHER, "max_tokens": 2, "temperature": 0}
        st, _, r = h.req("POST", CHAT, follow(call["id"]), key=None)
        assert st == 200, r
        assert r["usage"]["prompt_tokens"] > 60  # the call and its result were rendered
        st, _, r = h.req("POST", CHAT, follow("call_" + "a1" * 12), key=None)
        assert st == 400 and "length 9" in r["error"]["message"], r


def test_deadline_is_an_error(web, sdk, model):
    """timeout_ms (zinfer's extension) reaches the router; a request that
    passes it is no normal finish: non-streamed a 504 "deadline_exceeded"
    (x-should-retry: false), streamed the tokens so far then an error
    event, which the openai SDK raises; a generous deadline changes
    nothing."""
    long = {"prompt": "Count:", "max_tokens": 4000, "ignore_eos": True, "temperature": 0}
    t0 = time.time()
    st, h, r = web.req("POST", COMP, dict(long, timeout_ms=300))
    assert st == 504 and time.time() - t0 < 5, (st, r)
    assert r["error"]["code"] == "deadline_exceeded" and r["error"]["type"] == "timeout_error", r
    assert r["error"]["param"] == "timeout_ms" and "300 ms" in r["error"]["message"], r
    assert h.get("x-should-retry") == "false", h
    with pytest.raises(openai.APIStatusError) as ei:
        sdk.completions.create(model=model, prompt="Hi", max_tokens=4000, temperature=0,
                               extra_body={"ignore_eos": True, "timeout_ms": 1})
    assert ei.value.status_code == 504 and ei.value.code == "deadline_exceeded"
    got = []
    with pytest.raises(openai.APIError) as ei:
        for x in sdk.chat.completions.create(
                model=model, messages=MSGS, max_tokens=4000, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "timeout_ms": 1500}):
            got += [x.choices[0].delta.content or ""] if x.choices else []
            assert x.choices[0].finish_reason is None  # never a normal end
    assert ei.value.code == "deadline_exceeded" and "1500 ms" in ei.value.message, ei.value
    assert len(got) > 2, got  # the tokens before the deadline were streamed
    r = sdk.completions.create(model=model, prompt="Hi", max_tokens=3,
                               extra_body={"timeout_ms": 60000})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    st, _, r = web.req("POST", COMP, {"prompt": "Hi", "timeout_ms": 0})
    assert st == 400 and r["error"]["param"] == "timeout_ms", r


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_cancels(server, model, zc, stream):
    s = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": "Count:", "max_tokens": 4000, "ignore_eos": True,
                       "stream": stream}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n" + body)
    if stream:
        got = s.recv(4096)
        assert b"200" in got.split(b"\r\n")[0], got
    else:  # nothing comes before the end: wait until it runs
        deadline = time.time() + 5
        while not zc.call("health")["running"] and time.time() < deadline:
            time.sleep(0.02)
    assert zc.call("health")["running"] >= 1
    s.close()
    deadline = time.time() + 5
    while zc.call("health")["running"] and time.time() < deadline:
        time.sleep(0.05)
    assert zc.call("health")["running"] == 0


def scrape(web):
    """GET /metrics parsed with prometheus_client's text parser: a function
    (sample name, **labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families
    st, h, text = web.req("GET", "/metrics")
    assert st == 200 and h["Content-Type"].startswith("text/plain"), text
    samples = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value

    def val(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]
    val.samples = samples
    return val


def test_metrics_count_what_was_sent(web, sdk, model):
    b = scrape(web)
    r1 = sdk.completions.create(model=model, prompt="Once upon a time", max_tokens=6,
                                extra_body={"ignore_eos": True})
    r2 = sdk.chat.completions.create(model=model, messages=MSGS, max_tokens=5, n=2,
                                     temperature=0)
    assert web.req("POST", COMP, comp(temperature=-1))[0] == 400  # refused at admission
    a = scrape(web)

    def d(name, **labels):
        return a(name, **labels) - b(name, **labels)
    choices = r1.choices + r2.choices  # three router requests
    fin = [c.finish_reason for c in choices]
    assert d("zinfer_requests_finished_total", reason="maximum_length") == fin.count("length")
    assert (d("zinfer_requests_finished_total", reason="end_of_sequence")
            + d("zinfer_requests_finished_total", reason="stop")) == fin.count("stop")
    assert d("zinfer_requests_finished_total", reason="error") == 0
    assert d("zinfer_generation_tokens_total") == (r1.usage.completion_tokens
                                                   + r2.usage.completion_tokens)
    # the router counts each choice's prompt
    assert d("zinfer_prompt_tokens_total") == r1.usage.prompt_tokens + 2 * r2.usage.prompt_tokens
    for h in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert d(f"zinfer_{h}_seconds_count") == 3, h
        assert a(f"zinfer_{h}_seconds_bucket", le="+Inf") == a(f"zinfer_{h}_seconds_count")
    itl = d("zinfer_inter_token_latency_seconds_count")
    assert 1 <= itl <= r1.usage.completion_tokens + r2.usage.completion_tokens - 3
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in a.samples.items()
                     if k[0] == "zinfer_e2e_request_latency_seconds_bucket")
    assert all(x[1] <= y[1] for x, y in zip(buckets, buckets[1:]))  # cumulative
    assert a("zinfer_requests_running") == 0 and a("zinfer_requests_waiting") == 0
    assert a("zinfer_kv_cache_blocks", worker="0") > 0
    assert 0 <= a("zinfer_kv_cache_usage_ratio", worker="0") <= 1
    assert d("zinfer_prefix_cache_queries_total", worker="0") >= 0
    # speculation's counters (this server does not speculate: docs/speculative.md)
    for name in ("verifications", "draft_tokens", "accepted_tokens"):
        assert d(f"zinfer_spec_{name}_total", worker="0") == 0, name
    assert a("zinfer_spec_acceptance_rate", worker="0") == 0
    # sequences dropped for want of a router (--orphan-timeout): none here
    assert a("zinfer_orphaned_sequences_dropped_total", worker="0") == 0


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
U = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return json.dumps({"messages": U, "max_tokens": 2, **kw})


def comp(**kw):
    return json.dumps({"prompt": "hi", "max_tokens": 2, **kw})


# (method, path, body, headers/key, status, what the error must name)
BAD = [
    ("POST", CHAT, '{"messages": [', None, 400, "not valid JSON"),
    ("POST", CHAT, "[]", None, 400, "JSON object"),
    ("POST", CHAT, '"x"', None, 400, "JSON object"),
    ("POST", CHAT, "", None, 400, "not valid JSON"),
    ("POST", CHAT, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', None, 400, "JSON"),
    ("POST", CHAT, '{"messages":[{"role":"user","content":"a\\u0000b"}]}', None, 400, "JSON"),
    ("POST", CHAT, '{"messages": [], "messages": []}', None, 400, "duplicate"),
    ("POST", CHAT, "[" * 5000 + "]" * 5000, None, 400, "JSON"),
    ("POST", CHAT, '{"max_tokens": 2}', None, 400, "messages"),
    ("POST", CHAT, '{"messages": "hi"}', None, 400, "messages"),
    ("POST", CHAT, '{"messages": []}', None, 400, "messages"),
    ("POST", CHAT, '{"messages": [5]}', None, 400, "messages[0]"),
    ("POST", CHAT, '{"messages": [{"content": "x"}]}', None, 400, "messages[0].role"),
    ("POST", CHAT, '{"messages": [{"role": "wizard", "content": "x"}]}', None, 400,
     "messages[0].role"),
    ("POST", CHAT, '{"messages": [{"role": "function", "content": "x"}]}', None, 400,
     "messages[0].role"),
    ("POST", CHAT, '{"messages": [{"role": "user", "content": 5}]}', None, 400,
     "messages[0].content"),
    ("POST", CHAT, '{"messages": [{"role": "user"}]}', None, 400, "messages[0].content"),
    ("POST", CHAT, json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}), None, 400,
     "messages[0].content[0].image_url.url"),
    ("POST", CHAT, json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": 3}]}]}), None, 400, "messages[0].content[0].text"),
    ("POST", CHAT, json.dumps({"messages": [{"role": "assistant", "content": None,
                                             "tool_calls": [{"id": "1"}]}]}), None, 400,
     "messages[0].tool_calls"),
    ("POST", CHAT, chat(temperature="hot"), None, 400, "temperature"),
    ("POST", CHAT, chat(temperature=-1), None, 400, "temperature"),
    ("POST", CHAT, chat(top_p=0), None, 400, "top_p"),
    ("POST", CHAT, chat(top_p=2), None, 400, "top_p"),
    ("POST", CHAT, chat(max_tokens=0), None, 400, "max_tokens"),
    ("POST", CHAT, chat(max_tokens="10"), None, 400, "max_tokens"),
    ("POST", CHAT, chat(max_completion_tokens=-5), None, 400, "max_completion_tokens"),
    ("POST", CHAT, chat(n=0), None, 400, "n"),
    ("POST", CHAT, chat(n=17), None, 400, "n"),
    ("POST", CHAT, chat(stop=5), None, 400, "stop"),
    ("POST", CHAT, chat(stop=[1]), None, 400, "stop[0]"),
    ("POST", CHAT, chat(stop=["a"] * 20), None, 400, "stop"),
    ("POST", CHAT, chat(seed="x"), None, 400, "seed"),
    ("POST", CHAT, chat(logprobs="yes"), None, 400, "logprobs"),
    ("POST", CHAT, chat(logprobs=True, top_logprobs=21), None, 400, "top_logprobs"),
    ("POST", CHAT, chat(top_logprobs=2), None, 400, "top_logprobs"),
    ("POST", CHAT, chat(logit_bias={"x50": 5}), None, 400, "logit_bias"),
    ("POST", CHAT, chat(logit_bias={"50": 101}), None, 400, "logit_bias"),
    ("POST", COMP, comp(logit_bias={"50": "ban"}), None, 400, "logit_bias"),
    ("POST", COMP, comp(logit_bias={"99999": 1}), None, 400, "logit_bias"),  # past the vocabulary
    ("POST", CHAT, chat(tools=[{"type": "function", "function": {"name": ""}}]), None, 400,
     "tools[0].function"),
    ("POST", CHAT, chat(tools={"f": 1}), None, 400, "tools"),
    ("POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                        tool_choice={"type": "function", "function": {"name": "g"}}), None, 400,
     "tool_choice"),
    ("POST", CHAT, json.dumps({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}),
     None, 400, "messages[0].tool_calls[0]"),
    ("POST", COMP, comp(tools=[{"type": "function", "function": {"name": "f"}}]), None, 400,
     "tools"),
    ("POST", CHAT, chat(tool_choice="required"), None, 400, "tool_choice"),
    ("POST", CHAT, chat(response_format="json"), None, 400, "response_format"),
    ("POST", CHAT, chat(response_format={"type": "xml"}), None, 400, "response_format"),
    ("POST", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "properties": {"z": {"type": "string",
                                                          "not": {"const": "a"}}}}}}), None, 400,
     "'not'"),
    ("POST", CHAT, chat(response_format={"type": "json_object"}, ignore_eos=True), None, 400,
     "ignore_eos"),
    ("POST", CHAT, chat(model="gpt-4o"), None, 404, "gpt-4o"),
    ("POST", CHAT, chat(model=5), None, 400, "model"),
    ("POST", CHAT, chat(frequency_penalty=3), None, 400, "frequency_penalty"),
    ("POST", CHAT, chat(stream="yes"), None, 400, "stream"),
    ("POST", CHAT, chat(stream=True, stream_options={"include_usage": "x"}), None, 400,
     "stream_options.include_usage"),
    ("POST", CHAT, chat(min_tokens=-1), None, 400, "min_tokens"),
    ("POST", CHAT, chat(top_k=-5), None, 400, "top_k"),
    ("POST", CHAT, chat(repetition_penalty=0), None, 400, "repetition_penalty"),
    ("POST", CHAT, chat(ignore_eos="x"), None, 400, "ignore_eos"),
    ("POST", CHAT, chat(modalities=["text", "audio"]), None, 400, "modalities"),
    ("POST", COMP, '{"max_tokens": 2}', None, 400, "prompt"),
    ("POST", COMP, comp(prompt=[-1]), None, 400, "prompt[0]"),
    ("POST", COMP, comp(prompt=[99999999]), None, 400, "prompt"),
    ("POST", COMP, comp(prompt=["a", "b"]), None, 400, "prompt"),
    ("POST", COMP, comp(prompt={}), None, 400, "prompt"),
    ("POST", COMP, comp(suffix="end"), None, 400, "suffix"),
    ("POST", COMP, comp(best_of=3), None, 400, "best_of"),
    ("POST", COMP, comp(logprobs=30), None, 400, "logprobs"),
    ("POST", COMP, comp(echo="x"), None, 400, "echo"),
    ("POST", "/tokenize", '{"prompt": 5}', None, 400, "prompt"),
    ("POST", "/tokenize", '{"messages": []}', None, 400, "messages"),
    ("POST", "/detokenize", '{"tokens": "x"}', None, 400, "tokens"),
    ("POST", "/detokenize", '{"tokens": [-1]}', None, 400, "tokens[0]"),
    ("POST", CHAT, chat(), {"key": None}, 401, "API key"),
    ("POST", CHAT, chat(), {"key": "sk-wrong"}, 401, "API key"),
    ("POST", CHAT, chat(), {"key": None, "Authorization": "Basic " + KEY}, 401, "API key"),
    ("GET", "/v1/models", None, {"key": KEY + "x"}, 401, "API key"),
    ("GET", "/v2/everything", None, None, 404, "/v2/everything"),
    ("GET", "/v1/models/nope", None, None, 404, "nope"),
    ("GET", CHAT, None, None, 405, "POST"),
    ("DELETE", "/v1/models", None, None, 405, "GET"),
    ("POST", "/health", "{}", None, 405, "GET"),
    ("POST", "/metrics", "{}", None, 405, "GET"),
    ("GET", "/metrics", None, {"key": None}, 401, "API key"),
    ("POST", CHAT, '{"messages": [{"role": "user", "content": "' + "a" * MAX_BODY + '"}]}',
     None, 413, "limit"),
]


def test_bad_inputs(web, sdk, model):
    assert len(BAD) >= 40
    for method, path, body, hd, status, names in BAD:
        hd = dict(hd or {})
        key = hd.pop("key", KEY)
        st, _, out = web.req(method, path, body, headers=hd, key=key)
        case = f"{method} {path} {str(body)[:80]!r}"
        assert st == status, (case, st, out)
        assert isinstance(out, dict) and set(out) == {"error"}, (case, out)
        e = out["error"]
        assert set(e) == {"message", "type", "param", "code"}, (case, e)
        assert names in e["message"] or names == e["param"], (case, e)
    # the server still serves
    r = sdk.chat.completions.create(model=model, messages=MSGS, max_tokens=4)
    assert r.choices[0].message.content


def test_chunked_too_large_truncated_and_sdk_errors(web, server, sdk, model):
    # a chunked body over the limit: 413 once it passes it
    c = httpc.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.putrequest("POST", CHAT)
    c.putheader("Authorization", f"Bearer {KEY}")
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    piece = b"x" * 8192
    for _ in range(MAX_BODY // len(piece) + 2):
        c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    c.send(b"0\r\n\r\n")
    r = c.getresponse()
    assert r.status == 413 and "limit" in json.loads(r.read())["error"]["message"]
    c.close()
    # a body cut short: the connection closes without an answer being owed
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n{\"messages\":")
    s.shutdown(socket.SHUT_WR)
    try:
        s.recv(100)
    except OSError:
        pass
    s.close()
    # the SDK raises the status's exception, with OpenAI's error body
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="nope", messages=MSGS)
    with pytest.raises(openai.BadRequestError) as ei:
        sdk.chat.completions.create(model=model, messages=MSGS, temperature=-3)
    assert ei.value.body["param"] == "temperature"
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="nope",
                        max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert web.req("GET", "/health")[0] == 200


# ---- zinfer-http alone, against a scripted router ---------------------------
# The statuses that a healthy server cannot be made to give on demand (429,
# 503, an error mid-stream) and the connection limits, against a fake
# router (a pyzmq ROUTER socket answering as docs/protocol.md says).

SLOW_SENT = {}  # when the fake router sent each chunk of the "slow" reply


def fake_router(addr, stop):
    import msgpack
    import zmq
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(addr)
    try:
        while not stop.is_set():
            if not s.poll(50):
                continue
            ident, data = s.recv_multipart()
            m = msgpack.unpackb(data, raw=False)

            def send(**kw):
                s.send_multipart([ident, msgpack.packb({"id": m["id"], **kw})])

            op = m.get("op")
            if op == "health":
                send(event="result", status="unavailable", workers=0, tokenizers=1,
                     waiting=0, running=0)
            elif op == "models":
                send(event="result", models=[{"name": "fake", "max_length": 128, "vocab": 10}])
            elif op == "generate":
                what = m["messages"][-1]["content"] if "messages" in m else m["prompt"]
                if what in ("overloaded", "unavailable", "internal"):
                    send(event="error", code=what, message=f"{what}: scripted")
                elif what == "slow":  # a token, a pause, a token
                    for i, t in enumerate("ABC"):
                        time.sleep(0.5 if i else 0)
                        SLOW_SENT[t] = time.perf_counter()
                        send(event="chunk", text=t, token_ids=[i])
                    send(event="final", status="maximum_length", index=m.get("index", 0),
                         usage={"prompt_tokens": 3, "completion_tokens": 3})
                elif what == "lost":
                    send(event="chunk", text="Hel", token_ids=[1])
                    send(event="error", code="worker_lost", message="the worker stopped")
                else:
                    send(event="chunk", text="ok", token_ids=[2])
                    send(event="final", status="end_of_sequence", index=m.get("index", 0),
                         usage={"prompt_tokens": 3, "completion_tokens": 1})
    finally:
        s.close()


@pytest.fixture(scope="module")
def lone(zinfer_bin, tmp_path_factory):
    import subprocess
    import threading
    rport, hport = free_port(), free_port()
    stop = threading.Event()
    t = threading.Thread(target=fake_router, args=(f"tcp://127.0.0.1:{rport}", stop),
                         daemon=True)
    t.start()
    log = open(tmp_path_factory.mktemp("lone") / "http.log", "w")
    p = subprocess.Popen([str(zinfer_bin.parent / "zinfer-http"), "--listen",
                          f"127.0.0.1:{hport}", "--router", f"tcp://127.0.0.1:{rport}",
                          "--timeout", "1", "--header-timeout", "1", "--max-connections", "4"],
                         stdout=log, stderr=subprocess.STDOUT)
    h = Http(hport)
    deadline = time.time() + 10
    while True:
        try:
            h.req("GET", "/health", timeout=2)
            break
        except OSError:
            assert p.poll() is None and time.time() < deadline
            time.sleep(0.1)
    yield h
    p.terminate()
    p.wait(timeout=10)
    stop.set()
    t.join()
    log.close()


def test_lone_statuses(lone):
    st, _, b = lone.req("GET", "/health")
    assert st == 503 and b["status"] == "unavailable", b
    for what, status, typ in [("overloaded", 429, "rate_limit_error"),
                              ("unavailable", 503, "service_unavailable_error"),
                              ("internal", 500, "server_error")]:
        st, _, b = lone.req("POST", CHAT, {"messages": [{"role": "user", "content": what}]})
        assert st == status and b["error"]["type"] == typ and what in b["error"]["message"], b
        st, _, b = lone.req("POST", COMP, {"prompt": what, "stream": True})
        assert st == status, b  # refused at once: the status, even for a stream
    st, _, b = lone.req("POST", CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    assert st == 200 and b["model"] == "fake" and b["choices"][0]["message"]["content"] == "ok"
    assert b["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    # an error after the stream began: an error event, then [DONE]
    st, h, raw = lone.req("POST", CHAT, {"messages": [{"role": "user", "content": "lost"}],
                                         "stream": True})
    assert st == 200 and h["Content-Type"] == "text/event-stream"
    ev = [e[6:] for e in raw.split("\n\n") if e]
    assert json.loads(ev[0])["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(ev[1])["choices"][0]["delta"]["content"] == "Hel"
    assert json.loads(ev[2])["error"]["code"] == "worker_lost"
    assert ev[3:] == ["[DONE]"]


def test_lone_stream_not_held_back(lone):
    """Each chunk reaches the client when the router sends it, not with the
    next one (libmicrohttpd corks a response's chunks unless pushed)."""
    s = socket.create_connection(("127.0.0.1", lone.port), timeout=10)
    body = json.dumps({"prompt": "slow", "stream": True}).encode()
    t0 = time.perf_counter()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    buf, seen = b"", {}
    while b"[DONE]" not in buf:
        b = s.recv(65536)
        assert b, buf
        buf += b
        for t in "ABC":
            if t not in seen and b'"text":"%s"' % t.encode() in buf:
                seen[t] = time.perf_counter() - t0
    s.close()
    # Sent 0.5 s apart: each chunk reached the client before the next left
    # the router (times from the same clock, no bound on the machine's speed).
    sent = {t: SLOW_SENT[t] - t0 for t in "ABC"}
    assert seen["A"] < sent["B"] and seen["B"] < sent["C"], (seen, sent)


def dribble(s, data, meanwhile=None):
    """Sends data a byte every 0.2 s until the server closes s: (what came
    back, seconds from the start to the close or None); meanwhile() runs
    after the third byte."""
    import select
    t0 = time.time()
    for i, ch in enumerate(data):
        if select.select([s], [], [], 0.2)[0]:
            try:
                return s.recv(100), time.time() - t0
            except ConnectionResetError:
                return b"", time.time() - t0
        s.send(bytes([ch]))
        if i == 2 and meanwhile:
            meanwhile()
    return None, None


def test_lone_header_time_limit(lone):
    """--header-timeout 1: a header dribbled a byte every 0.2 s (so never
    idle for --timeout 1) is cut about 1 s after the connection opened, with
    no answer, while a request on another connection is served; a kept-alive
    connection's next header must be whole --timeout + --header-timeout
    (2 s) after the previous answer."""
    header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
    served = []
    s = socket.create_connection(("127.0.0.1", lone.port), timeout=10)
    got, cut_at = dribble(s, header, lambda: served.append(lone.req("GET", "/health")[0]))
    s.close()
    assert served == [503]  # the fake router's health, answered during the dribble
    assert got == b"" and 0.9 <= cut_at <= 2.5, (got, cut_at)
    s = socket.create_connection(("127.0.0.1", lone.port), timeout=10)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 503")
    got, cut_at = dribble(s, header)
    s.close()
    assert got == b"" and 1.9 <= cut_at <= 3.5, (got, cut_at)


def test_lone_limits(lone, zinfer_bin):
    import subprocess

    def raw(data, wait=5):
        s = socket.create_connection(("127.0.0.1", lone.port), timeout=wait)
        s.sendall(data)
        out = b""
        try:
            while (b := s.recv(4096)):
                out += b
        except OSError:
            pass
        s.close()
        return out

    # a header over the per-connection memory: 431
    assert raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n"
               ).startswith(b"HTTP/1.1 431")
    # a stalled header is closed after --timeout (1 s)
    t = time.time()
    assert raw(b"GET /health HTTP/1.1\r\nHost: x\r\n", wait=10) == b""
    assert time.time() - t < 5
    # a header dribbled byte by byte (within the timeout) is served
    s = socket.create_connection(("127.0.0.1", lone.port), timeout=5)
    for ch in b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n":
        s.send(bytes([ch]))
        time.sleep(0.005)
    assert s.recv(100).startswith(b"HTTP/1.1 503")
    s.close()
    # --max-connections 4: a fifth is closed at once, and served again once they go
    held = [socket.create_connection(("127.0.0.1", lone.port)) for _ in range(4)]
    time.sleep(0.2)
    assert raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") == b""
    for h in held:
        h.close()
    time.sleep(0.3)
    assert lone.req("GET", "/health")[0] == 503
    # --help, and a bad option
    exe = str(zinfer_bin.parent / "zinfer-http")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and "--max-body-bytes" in r.stdout
    r = subprocess.run([exe, "--listen", "nope"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "--listen" in r.stderr


TEMPLATES = (Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
             / "llama.cpp-vendor" / "models" / "templates")
DAYS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]
CITY = '[A-Z] [a-z] [a-z] [a-z] [a-z]'
# (serve's extra args, the format its log names, a grammar writing one call
# in that format after some text)
FORMAT_CASES = [
    (["--tool-call-format", "glm-4.5"], "glm-4.5 (--tool-call-format)",
     'root ::= "Checking.\\n<tool_call>get_weather\\n<arg_key>city</arg_key>\\n<arg_value>" '
     + CITY + ' "</arg_value>\\n<arg_key>days</arg_key>\\n<arg_value>" [1-9] '
     '"</arg_value>\\n</tool_call>"'),
    (["--chat-template", TEMPLATES / "Qwen3-Coder.jinja"], "qwen3-coder (the chat template's)",
     'root ::= "Checking.\\n<tool_call>\\n<function=get_weather>\\n<parameter=city>\\n" '
     + CITY + ' "\\n</parameter>\\n<parameter=days>\\n" [1-9] '
     '"\\n</parameter>\\n</function>\\n</tool_call>"'),
    (["--chat-template", TEMPLATES / "deepseek-ai-DeepSeek-V3.2.jinja"],
     "deepseek-v3.2 (the chat template's)",
     'root ::= "Checking.\\n\\n<｜DSML｜function_calls>\\n<｜DSML｜invoke name=\\"get_weather\\">\\n'
     '<｜DSML｜parameter name=\\"city\\" string=\\"true\\">" ' + CITY + ' "</｜DSML｜parameter>\\n'
     '<｜DSML｜parameter name=\\"days\\" string=\\"false\\">" [1-9] "</｜DSML｜parameter>\\n'
     '</｜DSML｜invoke>\\n</｜DSML｜function_calls>"'),
]


@pytest.mark.parametrize("args,logged,grammar", FORMAT_CASES, ids=["glm-4.5", "qwen3-coder-auto",
                                                                "deepseek-v3.2-auto"])
def test_tool_call_formats(zinfer_bin, model_path, tmp_path, args, logged, grammar):
    """A family's tool-call format, forced by --tool-call-format or found in
    the chat template (Qwen3-Coder's, DeepSeek V3.2's): an output held by
    `grammar` to a call in that format, its parameters written as XML
    (DSML), comes back as message.tool_calls with the arguments as JSON
    (days an integer, as the tool's schema or DSML's string="false" types
    it) and the text before as content; streamed, the name first, then
    argument fragments joining to the same JSON."""
    if "--chat-template" in args and not Path(args[1]).is_file():
        pytest.skip(f"{args[1]} absent")
    port = free_port()
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log", "--threads-per-worker", 2,
                       "--slots", 2, "--http", f"127.0.0.1:{port}", *args) as srv:
        h = Http(port)
        deadline = time.time() + 60
        while True:
            with contextlib.suppress(OSError):  # a busy machine: a slow first answer
                if h.req("GET", "/health", key=None, timeout=10)[0] == 200:
                    break
            assert time.time() < deadline, srv.log()
            time.sleep(0.05)
        assert f"tool-call format: {logged}" in srv.log()
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0,
                            timeout=60)
        model = sdk.models.list().data[0].id
        kw = dict(model=model, messages=[{"role": "user", "content": "Weather, 3 days?"}],
                  tools=DAYS, temperature=0, max_tokens=300, extra_body={"grammar": grammar})
        c = sdk.chat.completions.create(**kw).choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.content == "Checking."
        (call,) = c.message.tool_calls
        assert call.function.name == "get_weather" and CALL_ID.fullmatch(call.id)
        args_ = json.loads(call.function.arguments)
        assert set(args_) == {"city", "days"} and re.fullmatch(r"[A-Z][a-z]{4}", args_["city"])
        assert type(args_["days"]) is int and 1 <= args_["days"] <= 9, args_
        chunks = [x for x in sdk.chat.completions.create(stream=True, **kw) if x.choices]
        text = "".join(x.choices[0].delta.content or "" for x in chunks)
        deltas = [t for x in chunks for t in (x.choices[0].delta.tool_calls or [])]
        assert text == "Checking."
        assert deltas[0].function.name == "get_weather" and deltas[0].function.arguments == ""
        assert len(deltas) > 2 and all(t.index == 0 and t.id is None for t in deltas[1:])
        assert "".join(t.function.arguments for t in deltas[1:]) == call.function.arguments
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
