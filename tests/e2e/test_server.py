"""End-to-end tests of the server: `zinfer serve` (router + tokenizer +
worker processes) driven over real ZeroMQ sockets with msgpack frames, as
any client would (client protocol v1, docs/protocol.md).

One server is started for the module on a free port pair of 127.0.0.1
(ZINFER_BIN's directory must hold zinfer-router, zinfer-tokenizer and
zinfer-worker) and always stopped in the fixture's teardown. The tests
check the streamed tokens against `zinfer generate` (the in-process
engine), concurrency on one socket, non-streamed replies, cancellation,
admission limits, malformed input (each answered with an "error" frame that
names the field, after which the server still serves), stop strings, and a
worker killed mid-request (the request resumes on the restarted worker and
completes, every token streamed once).
"""

import functools
import json
import math
import os
import re
import signal
import time

import msgpack
import numpy as np
import pytest
import zmq

from conftest import ZINFER_BIN, ids_arg, last_json, serve_process

PROMPT = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
MAX_PROMPT = 256
SLOTS = 4
MAX_QUEUE = 8


def ids_of(v):
    """Token ids from a numpy-style array map or a plain list."""
    if isinstance(v, dict):
        assert v["__np__"] is True and v["dtype"] == "int64"
        return np.frombuffer(v["data"], dtype="<i8").tolist()
    return list(v)


class Client:
    def __init__(self, ctx, addr):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(addr)

    def send(self, msg):
        self.sock.send(msgpack.packb(msg, use_bin_type=True))

    def send_raw(self, data):
        self.sock.send(data)

    def recv(self, timeout=20.0):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError("no reply from the server")
        return msgpack.unpackb(self.sock.recv(), raw=False, strict_map_key=False)

    def quiet(self, seconds):
        """True when nothing arrives for `seconds`."""
        return not self.sock.poll(int(seconds * 1000))

    def generate(self, rid, timeout=30.0, **kw):
        """Sends one generate request and collects its frames up to the
        terminal one: (chunks, terminal)."""
        self.send({"op": "generate", "id": rid, **kw})
        chunks = []
        while True:
            m = self.recv(timeout)
            assert m["id"] == rid, m
            if m["event"] == "chunk":
                chunks.append(m)
            else:
                return chunks, m

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_process(zinfer_bin, model_path, log, "--threads-per-worker", 2, "--slots", SLOTS,
                       "--ctx-size", 512, "--max-queue", MAX_QUEUE, "--max-prompt-tokens",
                       MAX_PROMPT, "--max-new-tokens", 400, "--heartbeat-timeout", 1500) as srv:
        yield srv


@pytest.fixture
def client(server, zctx):
    c = Client(zctx, server.addr)
    yield c
    c.close()


@pytest.fixture(scope="module")
def prompt_ids(server, zctx):
    c = Client(zctx, server.addr)
    c.send({"op": "tokenize", "id": "tok", "text": PROMPT})
    m = c.recv()
    c.close()
    assert m["event"] == "result", m
    ids = ids_of(m["token_ids"])
    assert 5 < len(ids) < MAX_PROMPT
    return ids


@pytest.fixture(scope="module")
def cli_reference(run_zinfer, model_path, prompt_ids):
    """`zinfer generate` on the same ids: the in-process engine's answer."""
    r = run_zinfer("generate", "--model", model_path, "--prompt-ids", ids_arg(prompt_ids),
                   "--max-tokens", "24", "--threads", "2", "--json")
    assert r.returncode == 0, r.stderr
    return last_json(r.stdout)


def test_health_models_tokenize_detokenize(client, prompt_ids):
    client.send({"op": "health", "id": "h1"})
    m = client.recv()
    kv = m.pop("kv")
    assert m == {"id": "h1", "event": "result", "status": "ok", "workers": 1, "tokenizers": 1,
                 "waiting": 0, "running": 0}
    # The worker's KV cache, from its heartbeats (one may not have come yet).
    assert set(kv) == {"blocks", "block_size", "used", "cached", "free", "prefix_query_tokens",
                       "prefix_hit_tokens", "preemptions", "evictions", "prefix_hit_rate",
                       "spec_steps", "spec_drafted", "spec_accepted", "image_tiles",
                       "image_encode_us", "mem_hit_blocks", "mem_miss_blocks",
                       "disk_hit_blocks", "disk_miss_blocks", "disk_bytes", "disk_written",
                       "disk_dropped", "disk_rejected", "disk_read_us", "disk_write_us",
                       "orphans_dropped"}
    assert kv["blocks"] == 0 or kv["used"] + kv["cached"] + kv["free"] == kv["blocks"], kv
    client.send({"op": "models", "id": "m1"})
    m = client.recv()
    assert m["event"] == "result"
    assert [x["name"] for x in m["models"]] == ["SmolLM2-135M-Instruct.Q4_1"]
    assert m["models"][0]["max_length"] == 512
    client.send({"op": "detokenize", "id": "d1", "token_ids": prompt_ids})
    m = client.recv()
    assert m == {"id": "d1", "event": "result", "text": "user\nName three colors.\nassistant\n"}


def test_stream_matches_cli(client, prompt_ids, cli_reference):
    chunks, final = client.generate("s1", prompt=prompt_ids,
                                    sampling_params={"max_new_tokens": 24, "temperature": 0.0})
    got = [t for c in chunks for t in ids_of(c["token_ids"])]
    assert got == cli_reference["token_ids"]
    assert "".join(c["text"] for c in chunks) == cli_reference["text"]
    assert final["event"] == "final"
    assert final["status"] == cli_reference["finish_reason"]
    assert final["usage"] == {"prompt_tokens": len(prompt_ids),
                              "completion_tokens": len(cli_reference["token_ids"])}
    assert "text" not in final  # streamed: the text came in the chunks


def test_text_prompt_encodes_like_tokenize(client, prompt_ids, cli_reference):
    chunks, final = client.generate("s2", prompt=PROMPT, sampling_params={"max_new_tokens": 24})
    assert [t for c in chunks for t in ids_of(c["token_ids"])] == cli_reference["token_ids"]
    assert final["usage"]["prompt_tokens"] == len(prompt_ids)


def test_final_echoes_index_and_router_logs_timings(server, client, prompt_ids):
    """The seed's `index` comes back in the final frame (0 when not given),
    and the router logs each finished request with its timings."""
    _, final = client.generate("ix\nfake", prompt=prompt_ids, index=7,
                               sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert final["event"] == "final" and final["index"] == 7, final
    assert final["status"] == "maximum_length"
    _, final = client.generate("ix0", prompt=prompt_ids, stream=False,
                               sampling_params={"max_new_tokens": 2, "ignore_eos": True})
    assert final["index"] == 0, final
    deadline = time.time() + 5
    pat = (r"request \d+ \(id 'ix\?fake'\) maximum_length: %d prompt \+ 3 completion tokens, "
           r"first token \d+ ms, total \d+ ms" % len(prompt_ids))
    while not re.search(pat, server.log()) and time.time() < deadline:
        time.sleep(0.1)
    assert re.search(pat, server.log()), server.log()[-2000:]


def test_non_streamed_returns_whole_text(client, prompt_ids, cli_reference):
    chunks, final = client.generate("ns", prompt=prompt_ids, stream=False,
                                    sampling_params={"max_new_tokens": 24})
    assert chunks == []
    assert final["event"] == "final"
    assert final["text"] == cli_reference["text"]
    assert final["status"] == cli_reference["finish_reason"]
    assert final["usage"]["completion_tokens"] == len(cli_reference["token_ids"])


def test_eight_concurrent_on_one_socket(client, prompt_ids, cli_reference):
    prompts = {f"c{i}": prompt_ids if i == 0 else [1 + i, 100 + 7 * i, 2000 + 13 * i]
               for i in range(8)}
    for rid, p in prompts.items():
        client.send({"op": "generate", "id": rid, "prompt": p,
                     "sampling_params": {"max_new_tokens": 12 if rid != "c0" else 24}})
    toks = {rid: [] for rid in prompts}
    finals = {}
    while len(finals) < len(prompts):
        m = client.recv(60)
        assert m["id"] in prompts, m
        assert m["id"] not in finals, f"frame after the final: {m}"
        if m["event"] == "chunk":
            toks[m["id"]] += ids_of(m["token_ids"])
        else:
            assert m["event"] == "final", m
            finals[m["id"]] = m
    assert client.quiet(0.3)
    for rid, f in finals.items():
        assert f["usage"]["completion_tokens"] == len(toks[rid])
        assert f["usage"]["prompt_tokens"] == len(prompts[rid])
        assert 1 <= len(toks[rid]) <= (24 if rid == "c0" else 12)
    # Batching does not change a request's tokens.
    assert toks["c0"] == cli_reference["token_ids"]


def test_cancel_mid_stream(client, prompt_ids):
    client.send({"op": "generate", "id": "cx", "prompt": prompt_ids,
                 "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})
    n = 0
    while n < 3:
        m = client.recv()
        assert m["event"] == "chunk", m
        n += 1
    client.send({"op": "cancel", "id": "cx"})
    while True:
        m = client.recv()
        if m["event"] != "chunk":
            break
    assert m["event"] == "final" and m["status"] == "cancelled", m
    assert 3 <= m["usage"]["completion_tokens"] < 400
    assert client.quiet(0.5)  # nothing after the final
    # The slot was freed: the server still serves.
    _, f = client.generate("after-cancel", prompt=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    assert f["event"] == "final"


def test_detokenize_false_returns_ids_only(client, prompt_ids, cli_reference):
    chunks, final = client.generate("dk", prompt=prompt_ids,
                                    sampling_params={"max_new_tokens": 24, "detokenize": False})
    assert [t for c in chunks for t in ids_of(c["token_ids"])] == cli_reference["token_ids"]
    assert all(c["text"] == "" for c in chunks)
    assert final["status"] == cli_reference["finish_reason"]


def test_client_disconnect_frees_the_slot(server, zctx, prompt_ids):
    c = Client(zctx, server.addr)
    c.send({"op": "generate", "id": "gone", "prompt": prompt_ids,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})
    assert c.recv()["event"] == "chunk"
    c.close()  # goes away without cancelling
    probe = Client(zctx, server.addr)
    try:
        deadline = time.time() + 3.0
        while True:
            probe.send({"op": "health", "id": "p"})
            h = probe.recv()
            if h["running"] == 0 and h["waiting"] == 0:
                break
            assert time.time() < deadline, f"request still held after the client left: {h}"
            time.sleep(0.05)
    finally:
        probe.close()


def test_stop_string_across_tokens(client, prompt_ids, cli_reference):
    text = cli_reference["text"]
    # A stop string that starts inside the completion and spans tokens.
    pieces = [client_text for client_text in re.findall(r"\S+\s+\S+", text)]
    assert pieces, text
    stop = pieces[1] if len(pieces) > 1 else pieces[0]
    cut = text.index(stop)
    chunks, final = client.generate("st", prompt=prompt_ids, stop=[stop, "NEVER-SEEN"],
                                    sampling_params={"max_new_tokens": 24})
    streamed = "".join(c["text"] for c in chunks)
    assert final["event"] == "final" and final["status"] == "stop", final
    assert streamed == text[:cut]
    assert stop not in streamed
    # Non-streamed, via sampling_params.stop, same answer.
    _, f2 = client.generate("st2", prompt=prompt_ids, stream=False,
                            sampling_params={"max_new_tokens": 24, "stop": [stop]})
    assert f2["status"] == "stop" and f2["text"] == text[:cut]


def test_stop_string_with_detokenize_false(client, prompt_ids, cli_reference):
    """Stop strings still end the stream when no text is returned: the ids
    are those of the same request with text, and no text goes out."""
    text = cli_reference["text"]
    stop = re.findall(r"\S+\s+\S+", text)[1]
    with_text, f1 = client.generate("sd1", prompt=prompt_ids, stop=[stop],
                                    sampling_params={"max_new_tokens": 24})
    no_text, f2 = client.generate("sd2", prompt=prompt_ids, stop=[stop],
                                  sampling_params={"max_new_tokens": 24, "detokenize": False})
    assert f1["status"] == f2["status"] == "stop", (f1, f2)
    ids1 = [t for c in with_text for t in ids_of(c["token_ids"])]
    ids2 = [t for c in no_text for t in ids_of(c["token_ids"])]
    assert ids2 == ids1 and len(ids2) < len(cli_reference["token_ids"])
    assert all(c["text"] == "" for c in no_text)


def test_stop_string_waits_for_min_new_tokens(client, prompt_ids, cli_reference):
    """No stop string ends a response before min_new_tokens tokens: with
    min = max = n the reference's first n tokens all come back, although the
    stop string is the completion's first words."""
    text, ref_ids = cli_reference["text"], cli_reference["token_ids"]
    n = len(ref_ids) - 1  # the reference ends with its end-of-sequence token
    assert n >= 6 and cli_reference["finish_reason"] == "end_of_sequence", cli_reference
    stop = re.findall(r"\S+\s+\S+", text)[0]
    assert text.startswith(stop)
    chunks, final = client.generate("sm", prompt=prompt_ids, stop=[stop],
                                    sampling_params={"max_new_tokens": n, "min_new_tokens": n})
    assert [t for c in chunks for t in ids_of(c["token_ids"])] == ref_ids[:n]
    client.send({"op": "detokenize", "id": "smd", "token_ids": ref_ids[:n]})
    assert "".join(c["text"] for c in chunks) == client.recv()["text"]
    assert final["status"] == "maximum_length", final
    # Without the minimum the same stop string ends it at once.
    chunks, final = client.generate("sm2", prompt=prompt_ids, stop=[stop],
                                    sampling_params={"max_new_tokens": n})
    assert final["status"] == "stop" and "".join(c["text"] for c in chunks) == ""


def test_structured_output_json_object(client, prompt_ids, cli_reference):
    """response_format json_object holds decoding to a JSON object: the
    greedy answer to a chat message parses as one (unconstrained, it is
    prose); sampled answers are JSON too, or a cut-off prefix of it. An
    unknown type is `unsupported`, field response_format; type "text" is
    served as usual."""
    msgs = [{"role": "user", "content": "Hello!"}]
    _, plain = client.generate("js0", messages=msgs, stream=False,
                               sampling_params={"max_new_tokens": 64})
    if plain["event"] == "error" and plain["code"] == "unsupported":
        pytest.skip("this build has no chat-template renderer: " + plain["message"])
    _, constrained = client.generate("js1", messages=msgs, stream=False,
                                     response_format={"type": "json_object"},
                                     sampling_params={"max_new_tokens": 64})
    assert constrained["status"] == "end_of_sequence", constrained
    assert isinstance(json.loads(constrained["text"]), dict), constrained
    with pytest.raises(ValueError):
        json.loads(plain["text"])
    for seed in range(4):
        _, f = client.generate(f"js2-{seed}", stream=False,
                               messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                               response_format={"type": "json_object"},
                               sampling_params={"max_new_tokens": 96, "temperature": 1.0,
                                                "top_k": 0, "seed": seed})
        assert f["event"] == "final", f
        if f["status"] == "end_of_sequence":
            assert isinstance(json.loads(f["text"]), dict), f
        else:
            assert f["status"] == "maximum_length" and f["text"].lstrip().startswith("{"), f
    _, m = client.generate("js3", prompt=prompt_ids, response_format={"type": "json_xml"})
    assert m["event"] == "error" and m["code"] == "unsupported", m
    assert m.get("field") == "response_format" and "json_xml" in m["message"], m
    _, m = client.generate("js4", prompt=prompt_ids, response_format={"type": "json_object"},
                           sampling_params={"ignore_eos": True})
    assert m["event"] == "error" and m["code"] == "invalid_request", m
    assert m.get("field") == "response_format" and "ignore_eos" in m["message"], m
    assert client.quiet(0.05)
    chunks, final = client.generate("rft", prompt=prompt_ids, response_format={"type": "text"},
                                    sampling_params={"max_new_tokens": 24})
    assert final["event"] == "final", final
    assert [t for c in chunks for t in ids_of(c["token_ids"])] == cli_reference["token_ids"]


PERSON_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "color": {"enum": ["red", "green", "blue"]}, "pet": {"type": "boolean"}},
    "required": ["name", "age", "color"]}


def check_person(obj):
    assert isinstance(obj, dict) and set(obj) <= set(PERSON_SCHEMA["properties"]), obj
    assert {"name", "age", "color"} <= set(obj), obj
    assert isinstance(obj["name"], str) and type(obj["age"]) is int, obj
    assert obj["color"] in ("red", "green", "blue"), obj
    assert type(obj.get("pet", True)) is bool, obj


def test_structured_output_json_schema(client, prompt_ids):
    """response_format json_schema: the answer is an object of the schema
    (only its properties, the required ones, their types, enum values),
    given as the schema or as OpenAI's {"name", "schema", "strict"}; a
    keyword that cannot be held to is `unsupported`, naming it and where."""
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    finals = []
    for rid, js in [("jss0", PERSON_SCHEMA),
                    ("jss1", {"name": "person", "schema": PERSON_SCHEMA, "strict": True})]:
        _, f = client.generate(rid, messages=msgs, stream=False,
                               response_format={"type": "json_schema", "json_schema": js},
                               sampling_params={"max_new_tokens": 96})
        if f["event"] == "error" and f["code"] == "unsupported" and "messages" in f["message"]:
            pytest.skip("this build has no chat-template renderer: " + f["message"])
        assert f["status"] == "end_of_sequence", f
        check_person(json.loads(f["text"]))
        finals.append(f["text"])
    assert finals[0] == finals[1]
    for seed in range(4):
        _, f = client.generate(f"jss2-{seed}", stream=False, messages=msgs,
                               response_format={"type": "json_schema", "json_schema": PERSON_SCHEMA},
                               sampling_params={"max_new_tokens": 96, "temperature": 1.0,
                                                "top_k": 0, "seed": seed})
        assert f["event"] == "final", f
        if f["status"] == "end_of_sequence":
            check_person(json.loads(f["text"]))
        else:
            assert f["status"] == "maximum_length" and f["text"].lstrip().startswith("{"), f
    bad = {"type": "object", "properties": {"zip": {"type": "string", "not": {"const": "0"}}}}
    _, m = client.generate("jss3", prompt=prompt_ids,
                           response_format={"type": "json_schema", "json_schema": bad})
    assert m["event"] == "error" and m["code"] == "unsupported", m
    assert m.get("field") == "response_format.json_schema.properties.zip", m
    assert "'not'" in m["message"] and "#/properties/zip" in m["message"], m
    _, m = client.generate("jss4", prompt=prompt_ids, response_format={"type": "json_schema"})
    assert m["event"] == "error" and m["code"] == "invalid_request", m
    assert m.get("field") == "response_format.json_schema", m
    assert client.quiet(0.05)


def test_structured_output_beside_plain_requests(client):
    """Constrained and plain requests in one batch (the masks go to the
    right rows): sent at once, each gives what it gives alone."""
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    kinds = {"mix-plain0": {}, "mix-json": {"response_format": {"type": "json_object"}},
             "mix-plain1": {}, "mix-schema": {"response_format": {
                 "type": "json_schema", "json_schema": PERSON_SCHEMA}}}
    alone = {}
    for rid, kw in kinds.items():
        _, f = client.generate(rid + "-alone", messages=msgs, stream=False,
                               sampling_params={"max_new_tokens": 48}, **kw)
        if f["event"] == "error" and f["code"] == "unsupported" and "messages" in f["message"]:
            pytest.skip("this build has no chat-template renderer: " + f["message"])
        assert f["event"] == "final", f
        alone[rid] = f["text"]
    for rid, kw in kinds.items():
        client.send({"op": "generate", "id": rid, "messages": msgs, "stream": False,
                     "sampling_params": {"max_new_tokens": 48}, **kw})
    together = {}
    while len(together) < len(kinds):
        m = client.recv(60)
        assert m["event"] == "final", m
        together[m["id"]] = m["text"]
    assert together == alone
    for rid in ("mix-json", "mix-schema"):  # JSON, cut off at 48 tokens or whole
        assert together[rid].lstrip().startswith("{"), together[rid]


def test_tools_and_template_options_reach_the_template(client):
    """tools and chat_template_options are template variables (HF's
    apply_chat_template(messages, tools=..., **options)); the default
    model's template reads neither, so the answer is the same as without.
    Their errors name the path; with a prompt (no template) they are
    refused rather than ignored. Rendering with templates that use them is
    checked against jinja2 in test_chat_template."""
    msgs = [{"role": "user", "content": "Name three colors."}]
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    _, plain = client.generate("tv0", messages=msgs, stream=False,
                               sampling_params={"max_new_tokens": 16})
    if plain["event"] == "error" and plain["code"] == "unsupported":
        pytest.skip("this build has no chat-template renderer: " + plain["message"])
    _, with_vars = client.generate("tv1", messages=msgs, stream=False, tools=[tool],
                                   chat_template_options={"enable_thinking": False},
                                   sampling_params={"max_new_tokens": 16})
    assert with_vars["event"] == "final", with_vars
    assert with_vars["text"] == plain["text"] and with_vars["usage"] == plain["usage"]
    bad = [("tv2", {"messages": msgs, "tools": [{"type": "function", "function": {}}]},
            "tools[0].function.name", "missing"),
           ("tv3", {"messages": msgs, "chat_template_options": {"messages": 1}},
            "chat_template_options.messages", "sets itself"),
           ("tv4", {"prompt": "hi", "tools": [tool]}, "tools", "only used with messages")]
    for rid, kw, field, words in bad:
        _, m = client.generate(rid, **kw)
        assert m["event"] == "error" and m["code"] == "invalid_request", m
        assert m.get("field") == field and words in m["message"], m
        assert client.quiet(0.05)


def test_messages_use_the_chat_template(client):
    system, user = "Be brief.", "Name three colors."
    text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")
    _, by_text = client.generate("mt", prompt=text, stream=False,
                                 sampling_params={"max_new_tokens": 12})
    _, by_msgs = client.generate("mm", stream=False,
                                 messages=[{"role": "system", "content": system},
                                           {"role": "user", "content": user}],
                                 sampling_params={"max_new_tokens": 12})
    if by_msgs["event"] == "error" and by_msgs["code"] == "unsupported":
        pytest.skip("this build has no chat-template renderer: " + by_msgs["message"])
    assert by_msgs["event"] == "final", by_msgs
    assert by_msgs["usage"] == by_text["usage"]
    assert by_msgs["text"] == by_text["text"]


def test_tool_messages_reach_the_template(client):
    """A tool-call round trip (assistant tool_calls, then a tool result)
    renders through the served path. The default model's template does not
    render tools (the probe at start finds it; it cannot even take a null
    content), so they reach it as text turns (docs/protocol.md): the
    assistant's call as a Hermes <tool_call> block, the result as a user
    turn in <tool_response>; the prompt the server echoes is exactly that,
    with a null content too."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    msgs = [{"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "get_weather",
             "content": "22 C, sunny"}]
    want = ("<|im_start|>system\nUse tools.<|im_end|>\n<|im_start|>user\nWeather in "
            "Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
            "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")
    for i, content in enumerate(("", None)):
        msgs[2] = {"role": "assistant", "content": content, "tool_calls": [call]}
        _, m = client.generate(f"tm{i}", messages=msgs, stream=False, echo=True,
                               sampling_params={"max_new_tokens": 1})
        assert m["event"] == "final", m
        assert m["prompt_text"] == want, m["prompt_text"]
    assert client.quiet(0.05)


BAD_INPUTS = [
    # (name, raw frame bytes or message, expected id, expected field or None, message regex)
    ("not msgpack", b"\xc1\x00garbage", "", None, r"not one msgpack object"),
    ("truncated msgpack", b"\x82\xa2id", "", None, r"not one msgpack object"),
    ("not a map", [1, 2, 3], "", None, r"not a msgpack map"),
    ("missing id", {"op": "health"}, "", "id", r"id"),
    ("id not a string", {"op": "health", "id": 7}, "", "id", r"id"),
    ("missing op", {"id": "b1"}, "b1", "op", r"op"),
    ("unknown op", {"op": "explode", "id": "b2"}, "b2", "op", r"unknown operation"),
    ("missing prompt", {"op": "generate", "id": "b3"}, "b3", "prompt", r"prompt"),
    ("prompt wrong type", {"op": "generate", "id": "b4", "prompt": 42}, "b4", "prompt",
     r"prompt"),
    ("NaN temperature", {"op": "generate", "id": "b5", "prompt": "hi",
                         "sampling_params": {"temperature": math.nan}}, "b5",
     "sampling_params.temperature", r"NaN|nan"),
    ("top_p out of range", {"op": "generate", "id": "b6", "prompt": "hi",
                            "sampling_params": {"top_p": 1.5}}, "b6", "sampling_params.top_p",
     r"1.5"),
    ("sampling_params not a map", {"op": "generate", "id": "b7", "prompt": "hi",
                                   "sampling_params": [1]}, "b7", "sampling_params", r"map"),
    ("token id out of vocabulary", {"op": "generate", "id": "b8", "prompt": [1, 2, 999999]},
     "b8", "prompt[2]", r"999999"),
    ("negative token id", {"op": "generate", "id": "b9", "prompt": [1, -5]}, "b9", "prompt[1]",
     r"-5"),
    ("oversize token prompt", {"op": "generate", "id": "b10", "prompt": [5] * (MAX_PROMPT + 1)},
     "b10", "prompt", r"limit"),
    ("oversize text prompt", {"op": "generate", "id": "b11", "prompt": "hello " * 400},
     "b11", "prompt", r"limit"),
    ("max_new_tokens over the limit", {"op": "generate", "id": "b12", "prompt": "hi",
                                       "sampling_params": {"max_new_tokens": 100000}}, "b12",
     "sampling_params.max_new_tokens", r"limit"),
    ("min_new_tokens over the limit without a max",
     {"op": "generate", "id": "b12m", "prompt": "hi", "sampling_params": {"min_new_tokens": 401}},
     "b12m", "sampling_params.min_new_tokens", r"401 exceeds this server's limit of 400"),
    ("response_format without a type", {"op": "generate", "id": "b12r", "prompt": "hi",
                                        "response_format": {"json_schema": {}}}, "b12r",
     "response_format.type", r"missing or not a string"),
    ("stream not a bool", {"op": "generate", "id": "b13", "prompt": "hi", "stream": "yes"},
     "b13", "stream", r""),
    ("unknown model", {"op": "generate", "id": "b14", "prompt": "hi", "model_name": "gpt-9"},
     "b14", "model_name", r"gpt-9"),
    ("detokenize bad ids", {"op": "detokenize", "id": "b15", "token_ids": "abc"}, "b15",
     "token_ids", r""),
    ("tokenize without text", {"op": "tokenize", "id": "b16"}, "b16", "text", r"missing"),
    ("bad message role", {"op": "generate", "id": "b17",
                          "messages": [{"role": "robot", "content": "hi"}]}, "b17",
     "messages[0].role", r"robot"),
    ("prompt and messages", {"op": "generate", "id": "b18", "prompt": "hi",
                             "messages": [{"role": "user", "content": "hi"}]}, "b18", "prompt",
     r"exactly one"),
    ("invalid UTF-8 prompt",
     msgpack.packb({"op": "generate", "id": "b19", "prompt": "XYZ"}).replace(b"XYZ", b"\xff\xfeA"),
     "b19", "prompt", r"invalid UTF-8"),
    ("invalid UTF-8 role",
     msgpack.packb({"op": "generate", "id": "b20", "messages": [{"role": "XYZ", "content": "hi"}]})
     .replace(b"XYZ", b"\xc3\x28u"), "b20", "messages[0].role", r"invalid UTF-8"),
    ("binary prompt", {"op": "generate", "id": "b21", "prompt": b"\xff\xfehi"}, "b21", "prompt",
     r"binary"),
    ("unknown field", {"op": "generate", "id": "b22", "prompt": "hi", "frobnicate": 1}, "b22",
     "frobnicate", r"unknown field"),
    ("unknown sampling field", {"op": "generate", "id": "b23", "prompt": "hi",
                                "sampling_params": {"warmth": 1}}, "b23",
     "sampling_params.warmth", r"unknown field"),
    ("negative top_k", {"op": "generate", "id": "b24", "prompt": "hi",
                        "sampling_params": {"top_k": -5}}, "b24", "sampling_params.top_k", r"-5"),
    ("min_p above 1", {"op": "generate", "id": "b25", "prompt": "hi",
                       "sampling_params": {"min_p": 2.0}}, "b25", "sampling_params.min_p",
     r"outside \[0, 1\]"),
    ("negative temperature", {"op": "generate", "id": "b26", "prompt": "hi",
                              "sampling_params": {"temperature": -1.0}}, "b26",
     "sampling_params.temperature", r"-1 is outside"),
    ("infinite temperature", {"op": "generate", "id": "b27", "prompt": "hi",
                              "sampling_params": {"temperature": math.inf}}, "b27",
     "sampling_params.temperature", r"inf"),
    ("NaN top_p", {"op": "generate", "id": "b28", "prompt": "hi",
                   "sampling_params": {"top_p": math.nan}}, "b28", "sampling_params.top_p",
     r"NaN"),
    ("zero repetition penalty", {"op": "generate", "id": "b29", "prompt": "hi",
                                 "sampling_params": {"repetition_penalty": 0.0}}, "b29",
     "sampling_params.repetition_penalty", r"outside"),
    ("min_new_tokens above max", {"op": "generate", "id": "b30", "prompt": "hi",
                                  "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 9}},
     "b30", "sampling_params.min_new_tokens", r"exceeds"),
    ("zero max_new_tokens", {"op": "generate", "id": "b31", "prompt": "hi",
                             "sampling_params": {"max_new_tokens": 0}}, "b31",
     "sampling_params.max_new_tokens", r"invalid"),
    ("negative logprobs", {"op": "generate", "id": "b32", "prompt": "hi", "logprobs": -1}, "b32",
     "logprobs", r"outside"),
    ("stop not a string", {"op": "generate", "id": "b33", "prompt": "hi", "stop": 5}, "b33",
     "stop", r"string"),
    ("stop list with a number", {"op": "generate", "id": "b34", "prompt": "hi", "stop": ["a", 3]},
     "b34", "stop[1]", r"string"),
    ("negative stop token id", {"op": "generate", "id": "b35", "prompt": "hi",
                                "sampling_params": {"stop_token_ids": [-3]}}, "b35",
     "sampling_params.stop_token_ids[0]", r"-3"),
    ("messages not a list", {"op": "generate", "id": "b36", "messages": "hi"}, "b36", "messages",
     r"array"),
    ("message without content", {"op": "generate", "id": "b37", "messages": [{"role": "user"}]},
     "b37", "messages[0].content", r"missing"),
    ("content wrong type", {"op": "generate", "id": "b38",
                            "messages": [{"role": "user", "content": 7}]}, "b38",
     "messages[0].content", r"integer"),
    ("echo not a bool", {"op": "generate", "id": "b39", "prompt": "hi", "echo": "yes"}, "b39",
     "echo", r"boolean"),
    ("empty prompt", {"op": "generate", "id": "b40", "prompt": ""}, "b40", "prompt", r"empty"),
    ("empty messages", {"op": "generate", "id": "b41", "messages": []}, "b41", "messages",
     r"empty"),
    ("numpy prompt of complex dtype",
     {"op": "generate", "id": "b42",
      "prompt": {"__np__": True, "dtype": "complex64", "shape": [1], "data": b"\0" * 8}},
     "b42", "prompt.dtype", r"complex64"),
    ("numpy prompt data too short",
     {"op": "generate", "id": "b43",
      "prompt": {"__np__": True, "dtype": "int64", "shape": [4], "data": b"\0" * 8}},
     "b43", "prompt.data", r"do not match"),
    ("model_name not a string", {"op": "generate", "id": "b44", "prompt": "hi", "model_name": 5},
     "b44", "model_name", r"string"),
    ("deep nesting", {"op": "generate", "id": "b45", "prompt": "hi",
                      "sampling_params": {"stop": functools.reduce(lambda x, _: [x], range(200), 1)}},
     "b45", None, r"nested deeper"),
    ("id too long", {"op": "health", "id": "x" * 1000}, "", "id", r"1 to 256 bytes"),
    ("oversize frame", b"\x00" * (9 << 20), "", None, r"exceeds the limit"),
    ("oversize request", {"op": "generate", "id": "b46", "prompt": "x" * (9 << 20)}, "b46", None,
     r"exceeds the limit"),
    ("trailing bytes", msgpack.packb({"id": "b47", "op": "generate", "prompt": "hi"}) + b"\xc0",
     "b47", None, r"trailing bytes"),
    ("id after bad bytes", b"\x82\xa6prompt\xc1\xa2id\xa3b48", "", None, r"not msgpack"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_error(client, case):
    name, msg, rid, field, pattern = case
    if isinstance(msg, bytes):
        client.send_raw(msg)
    else:
        client.send_raw(msgpack.packb(msg, use_bin_type=True))
    m = client.recv()
    assert m["event"] == "error", m
    assert m["id"] == rid, m
    assert m["code"] == "invalid_request", m
    assert re.search(pattern, m["message"]), m
    if field is None:
        assert "field" not in m, m
    else:
        assert m.get("field") == field, m
    assert client.quiet(0.05)  # exactly one reply


def test_refused_frame_does_not_name_a_live_request(client, prompt_ids):
    """A frame refused whole whose id is that of a request in flight is
    answered with id "": that request still ends with its own final."""
    # 120 tokens (~2 s here): "live" is surely still running when the
    # refused frame is answered, even if the test process is descheduled.
    client.send({"op": "generate", "id": "live", "prompt": prompt_ids,
                 "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}})
    first = client.recv()
    assert first["id"] == "live" and first["event"] == "chunk", first
    client.send_raw(msgpack.packb({"op": "cancel", "id": "live"}) + b"\xc0")  # trailing byte
    frames = []
    while not any(f["id"] == "live" and f["event"] != "chunk" for f in frames):
        frames.append(client.recv(60))
    errors = [f for f in frames if f["event"] == "error"]
    assert len(errors) == 1 and errors[0]["id"] == "", errors
    assert "trailing bytes" in errors[0]["message"], errors
    final = frames[-1]  # the refused cancel cancelled nothing
    assert final["event"] == "final" and final["usage"]["completion_tokens"] == 120, final
    assert client.quiet(0.1)


def test_frame_over_4x_the_limit_drops_the_connection(zctx, server):
    """A frame over 4x --max-frame-bytes (8 MiB here) is never read whole:
    ZeroMQ closes that client's connection, with no reply, and the router
    serves on (the same socket too, once it reconnects)."""
    c = Client(zctx, server.addr)
    try:
        c.send_raw(b"\x00" * (32 << 20) + b"\x00")
        assert c.quiet(2.0)  # no reply: the connection was dropped
        deadline = time.time() + 10
        while True:  # the DEALER reconnects by itself
            c.send({"op": "health", "id": "h-after"})
            if not c.quiet(1.0):
                break
            assert time.time() < deadline, "the socket was not served again"
        m = c.recv()
        assert m["id"] == "h-after" and m["event"] == "result", m
    finally:
        c.close()
    other = Client(zctx, server.addr)
    try:
        other.send({"op": "health", "id": "h-other"})
        m = other.recv()
        assert m["id"] == "h-other" and m["status"] == "ok", m
    finally:
        other.close()


def test_serves_after_bad_inputs(client):
    for case in BAD_INPUTS:
        msg = case[1]
        client.send_raw(msg if isinstance(msg, bytes) else msgpack.packb(msg, use_bin_type=True))
    for _ in BAD_INPUTS:
        assert client.recv()["event"] == "error"
    chunks, final = client.generate("alive", prompt=[1, 2, 3],
                                    sampling_params={"max_new_tokens": 3})
    assert final["event"] == "final" and final["usage"]["completion_tokens"] == 3
    assert len([t for c in chunks for t in ids_of(c["token_ids"])]) == 3


def test_mutated_frames_each_get_one_reply(client):
    """300 frames made by flipping, inserting, deleting and truncating bytes
    of valid requests: every frame gets exactly one terminal reply (error,
    final or result), and the server still serves afterwards."""
    import random
    rng = random.Random(1234)
    bases = [
        {"op": "generate", "id": "m", "prompt": [1, 2, 3], "stop": ["x"],
         "sampling_params": {"max_new_tokens": 1, "temperature": 0.0, "top_p": 0.5}},
        {"op": "generate", "id": "m", "prompt": "hi", "stream": False,
         "sampling_params": {"max_new_tokens": 1}},
        {"op": "tokenize", "id": "m", "text": "abc"},
        {"op": "detokenize", "id": "m", "token_ids": [1, 2]},
    ]
    sent = 0
    for i in range(300):
        base = dict(rng.choice(bases), id=f"m{i}")
        b = bytearray(msgpack.packb(base, use_bin_type=True))
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(len(b))
            r = rng.random()
            if r < 0.5:
                b[k] = rng.randrange(256)
            elif r < 0.7:
                b.insert(k, rng.randrange(256))
            elif r < 0.85 and len(b) > 2:
                del b[k]
            else:
                b = b[:max(1, k)]
        client.send_raw(bytes(b))
        sent += 1
    terminal = 0
    while terminal < sent:
        m = client.recv(30)
        assert isinstance(m, dict) and m.get("event") in ("chunk", "final", "error", "result"), m
        if m["event"] != "chunk":
            terminal += 1
    assert client.quiet(0.5)
    _, f = client.generate("m-after", prompt=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    assert f["event"] == "final" and f["usage"]["completion_tokens"] == 2


def test_duplicate_id_in_flight(client, prompt_ids):
    # The first request is surely in flight when the second comes: it has
    # streamed a chunk and has 399 tokens to go, and it runs until it is
    # cancelled. (With 6 tokens it could end before the second send reached
    # the router when the test process was descheduled, and the id was then
    # free again.)
    client.send({"op": "generate", "id": "dup", "prompt": prompt_ids,
                 "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})
    frames = [client.recv()]
    assert frames[0]["event"] == "chunk", frames[0]
    client.send({"op": "generate", "id": "dup", "prompt": prompt_ids})
    while not any(f["event"] == "error" for f in frames):
        frames.append(client.recv())
        assert frames[-1]["event"] != "final", frames[-1]  # still running
    client.send({"op": "cancel", "id": "dup"})
    while frames[-1]["event"] != "final":
        frames.append(client.recv())
    errors = [f for f in frames if f["event"] == "error"]
    assert len(errors) == 1 and errors[0]["field"] == "id"
    assert sum(f["event"] == "final" for f in frames) == 1
    assert frames[-1]["status"] == "cancelled", frames[-1]
    assert client.quiet(0.5)  # one terminal frame each, nothing after


def test_overloaded_when_queue_full(client):
    n = SLOTS + MAX_QUEUE + 6
    for i in range(n):
        client.send({"op": "generate", "id": f"o{i}", "prompt": [1, 2, 3 + i],
                     "sampling_params": {"max_new_tokens": 3}})
    terminal = {}
    while len(terminal) < n:
        m = client.recv(60)
        if m["event"] != "chunk":
            assert m["id"] not in terminal
            terminal[m["id"]] = m
    over = [m for m in terminal.values() if m["event"] == "error"]
    done = [m for m in terminal.values() if m["event"] == "final"]
    assert over and all(m["code"] == "overloaded" for m in over)
    assert len(done) >= MAX_QUEUE
    assert len(over) + len(done) == n


def test_tokenize_flood_is_bounded_by_max_queue(client):
    """tokenize requests wait on the tokenizer like generate's encoding and
    count against --max-queue: a burst beyond it is answered "overloaded"
    at once, each request gets one reply, and the rest are tokenized."""
    # 180 kB of made-up words: no word repeats often enough for the
    # tokenizer's caches to make it quick, so it is busy for a while
    rng = np.random.default_rng(5)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    text = " ".join("".join(rng.choice(letters, int(k))) for k in rng.integers(3, 12, 25000))
    n = MAX_QUEUE * 5
    # packed first, then sent back to back: a burst the router reads before
    # the tokenizers finish MAX_QUEUE of them, even on a loaded machine
    frames = [msgpack.packb({"op": "tokenize", "id": f"tf{i}", "text": text}, use_bin_type=True)
              for i in range(n)]
    for f in frames:
        client.send_raw(f)
    replies = {}
    while len(replies) < n:
        m = client.recv(60)
        assert m["id"] not in replies, m
        replies[m["id"]] = m
    over = [m for m in replies.values() if m["event"] == "error"]
    done = [m for m in replies.values() if m["event"] == "result"]
    assert over and all(m["code"] == "overloaded" for m in over), over[:3]
    assert len(done) >= MAX_QUEUE and len(over) + len(done) == n
    assert all(len(ids_of(m["token_ids"])) == len(ids_of(done[0]["token_ids"])) for m in done)
    assert client.quiet(0.2)
    client.send({"op": "health", "id": "tf-health"})
    m = client.recv()
    assert m["status"] == "ok" and m["waiting"] == 0, m


def test_worker_killed_request_resumes(client, server, prompt_ids):
    """The only worker is killed mid-stream: the request waits for the
    restarted worker (within --failover-timeout) and goes on from where it
    was (docs/protocol.md, "Failover"); tests/e2e/test_failover.py checks
    the tokens against a no-fault run."""
    client.send({"op": "generate", "id": "wl", "prompt": prompt_ids,
                 "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}})
    m = client.recv()
    assert m["event"] == "chunk"
    got, notes = len(ids_of(m["token_ids"])), 0
    pids = re.findall(r"started worker 0 \(pid (\d+)\)", server.log())
    assert pids, server.log()
    os.kill(int(pids[-1]), signal.SIGKILL)
    while True:
        m = client.recv(60)
        if m["event"] != "chunk":
            break
        got += len(ids_of(m["token_ids"]))
        notes += bool(m.get("resumed"))
    assert m["event"] == "final" and m["status"] == "maximum_length", m
    assert got == m["usage"]["completion_tokens"] == 120 and notes == 1, (got, notes, m)
    # The supervisor restarts the worker; the server serves again.
    deadline = time.time() + 20
    while True:
        client.send({"op": "health", "id": "hw"})
        h = client.recv()
        if h["workers"] == 1:
            break
        assert time.time() < deadline, server.log()
        time.sleep(0.2)
    _, f = client.generate("after-restart", prompt=[1, 2, 3],
                           sampling_params={"max_new_tokens": 2})
    assert f["event"] == "final", f


def test_sampled_request_is_served(client):
    """Non-greedy sampling with penalties runs (tests/e2e/test_sampling_server.py
    checks what it gives)."""
    _, f = client.generate("samp", prompt=[1, 2, 3],
                           sampling_params={"top_k": 0, "temperature": 0.8, "seed": 3,
                                            "repetition_penalty": 1.2, "max_new_tokens": 3,
                                            "ignore_eos": True})
    assert f["event"] == "final" and f["usage"]["completion_tokens"] == 3, f


def test_router_restart_backends_reregister(client, server, zctx):
    pids = re.findall(r"started router \(pid (\d+)\)", server.log())
    assert pids, server.log()
    os.kill(int(pids[-1]), signal.SIGKILL)
    deadline = time.time() + 20
    while True:
        client.send({"op": "health", "id": "hr"})
        try:
            h = client.recv(0.5)
        except TimeoutError:
            h = {}
        if h.get("status") == "ok":
            break
        assert time.time() < deadline, server.log()
        time.sleep(0.1)
    assert h["workers"] == 1 and h["tokenizers"] == 1
    # (health probes sent while the router was down may still be answered
    # on `client`; a fresh socket sees only its own replies)
    c2 = Client(zctx, server.addr)
    try:
        _, f = c2.generate("after-router", prompt=[1, 2, 3], sampling_params={"max_new_tokens": 3})
    finally:
        c2.close()
    assert f["event"] == "final" and f["usage"]["completion_tokens"] == 3
