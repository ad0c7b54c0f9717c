"""End-to-end tests of Anthropic's Messages API in zinfer-http (docs/http.md,
"Anthropic Messages"), driven by the official `anthropic` SDK and raw HTTP.

One `zinfer serve --http` with an API key runs the default model for the
module: text replies whole and streamed (greedy, so the stream's text joins
to the whole reply's), the exact order of the stream's events, stop
sequences, max_tokens, a full tool round trip (tool_choice holding the
call through the grammar engine, the tool_use input checked against its
schema, the tool_result turn, a final text answer), a streamed tool_use
whose input_json_delta fragments join to the whole input, count_tokens
against usage.input_tokens, the key as x-api-key, and a table of bad
inputs, each with its status, Anthropic's error shape and the field named,
after which the server still serves. A random-weight qwen3 file whose
chat template thinks (test_reasoning.py's) gives the thinking blocks, its
output forced by a grammar.
"""

import http.client as httpc
import json

import jsonschema
import pytest

from conftest import free_port, serve_process, wait_http

anthropic = pytest.importorskip("anthropic")

KEY = "sk-ant-test-zinfer"
NAME = "claude-sonnet-4-5"  # any model name is served (the served model answers)
COLORS = [{"role": "user", "content": "Name three colors."}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}



def post(port, path, body, headers=None, method="POST", key=KEY):
    """Raw HTTP: (status, parsed JSON, or the text of an event stream)."""
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    if key:
        h["x-api-key"] = key
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def events(text):
    """An event stream's (name, data) pairs."""
    out = []
    for part in text.split("\n\n"):
        if not part.strip():
            continue
        lines = dict(line.split(": ", 1) for line in part.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def start(zinfer_bin, path, log, *args):
    port = free_port()
    cm = serve_process(zinfer_bin, path, log, "--threads-per-worker", 1, "--slots", 4,
                       "--http", f"127.0.0.1:{port}", *args)
    srv = cm.__enter__()
    wait_http(port, srv)
    srv.port = port
    return cm, srv


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    cm, srv = start(zinfer_bin, model_path, tmp_path_factory.mktemp("messages") / "serve.log",
                    "--api-key", KEY)
    srv.sdk = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key=KEY,
                                  max_retries=0, timeout=120)
    try:
        yield srv
    finally:
        cm.__exit__(None, None, None)


def ask(srv, **kw):
    """A greedy request. temperature goes in extra_body: the SDK's newest
    versions dropped the sampling parameters from create()'s signature
    (the API still takes them)."""
    kw.setdefault("model", NAME)
    kw.setdefault("max_tokens", 24)
    kw.setdefault("messages", COLORS)
    kw["extra_body"] = {"temperature": 0, **kw.get("extra_body", {})}
    return kw


def raw(kw):
    """A request of ask()'s as the JSON body sent."""
    kw = dict(kw)
    kw.update(kw.pop("extra_body", {}))
    return kw


def streamed(srv, **kw):
    """The SDK's raw event stream: the event types, the text, thinking and
    tool inputs joined per block, and the final message_delta."""
    kinds, blocks, delta = [], {}, None
    for ev in srv.sdk.messages.create(stream=True, **ask(srv, **kw)):
        kinds.append(ev.type)
        if ev.type == "content_block_start":
            blocks[ev.index] = {"type": ev.content_block.type, "text": "", "thinking": "",
                                "json": "", "name": getattr(ev.content_block, "name", None)}
        elif ev.type == "content_block_delta":
            d, b = ev.delta, blocks[ev.index]
            if d.type == "text_delta":
                b["text"] += d.text
            elif d.type == "thinking_delta":
                b["thinking"] += d.thinking
            elif d.type == "input_json_delta":
                b["json"] += d.partial_json
                b.setdefault("fragments", []).append(d.partial_json)
        elif ev.type == "message_delta":
            delta = ev
    return kinds, [blocks[i] for i in sorted(blocks)], delta


def test_text_whole_and_streamed(server):
    m = server.sdk.messages.create(**ask(server))
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == "SmolLM2-135M-Instruct.Q4_1"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text.strip()
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.input_tokens > 5 and 0 < m.usage.output_tokens <= 24
    # the SDK's streaming helper: the same text, message and usage
    with server.sdk.messages.stream(**ask(server)) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text
    assert final.content[0].text == m.content[0].text and final.stop_reason == m.stop_reason
    assert final.usage.input_tokens == m.usage.input_tokens
    assert final.usage.output_tokens == m.usage.output_tokens


def test_event_order(server):
    st, body = post(server.port, "/v1/messages", raw(ask(server, stream=True)))
    assert st == 200, body
    ev = events(body)
    names = [n for n, _ in ev]
    assert all(d["type"] == n for n, d in ev), ev
    assert names[:3] == ["message_start", "ping", "content_block_start"], names
    n_delta = len(names) - 6
    assert n_delta >= 1 and names[3:3 + n_delta] == ["content_block_delta"] * n_delta, names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert start["id"].startswith("msg_")
    assert ev[2][1] == {"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for _, d in ev[3:-3])
    assert ev[-3][1] == {"type": "content_block_stop", "index": 0}
    md = ev[-2][1]
    whole = server.sdk.messages.create(**ask(server))
    assert md["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert md["usage"] == {"input_tokens": whole.usage.input_tokens,
                           "output_tokens": whole.usage.output_tokens}
    assert start["usage"] == {"input_tokens": whole.usage.input_tokens, "output_tokens": 0}
    assert "".join(d["delta"]["text"] for _, d in ev[3:-3]) == whole.content[0].text


def test_stop_sequences_and_max_tokens(server):
    full = server.sdk.messages.create(**ask(server)).content[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    cut = full[:full.index(stop)]
    m = server.sdk.messages.create(**ask(server, stop_sequences=[stop]))
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content) == cut
    kinds, blocks, delta = streamed(server, stop_sequences=[stop])
    assert "".join(b["text"] for b in blocks) == cut
    assert delta.delta.stop_reason == "stop_sequence" and delta.delta.stop_sequence == stop
    # several: the one that matched (the earliest in the text)
    m = server.sdk.messages.create(**ask(server, stop_sequences=["@@@", stop, words[-1]]))
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content) == cut
    kinds, blocks, delta = streamed(server, stop_sequences=["@@@", stop, words[-1]])
    assert delta.delta.stop_sequence == stop
    m = server.sdk.messages.create(**ask(server, max_tokens=3))
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_tool_round_trip(server):
    """The call forced by tool_choice (the grammar engine), its input valid
    for the schema; then the result and a final answer in text."""
    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
        m = server.sdk.messages.create(**ask(server, messages=q, max_tokens=60, tools=[WEATHER],
                                             tool_choice=choice))
        assert m.stop_reason == "tool_use", m
        uses = [b for b in m.content if b.type == "tool_use"]
        assert len(uses) == 1 and uses[0].name == "get_weather"
        jsonschema.validate(uses[0].input, WEATHER["input_schema"])
        assert len(uses[0].id) == 9 and uses[0].id.isalnum()
    call = uses[0]
    turn = q + [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                  for b in m.content]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call.id,
                     "content": [{"type": "text", "text": '{"temp_c": 21, "sky": "clear"}'}]}]}]
    final = server.sdk.messages.create(**ask(server, messages=turn, max_tokens=30,
                                             tools=[WEATHER]))
    assert final.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in final.content if b.type == "text")
    assert text.strip(), final
    # the result reached the prompt: the turn counts more tokens than the question
    n = server.sdk.messages.count_tokens(model=NAME, messages=turn, tools=[WEATHER])
    assert n.input_tokens == final.usage.input_tokens > m.usage.input_tokens
    # an is_error result is told to the model too (a longer prompt)
    turn[2]["content"][0]["is_error"] = True
    assert server.sdk.messages.count_tokens(model=NAME, messages=turn,
                                            tools=[WEATHER]).input_tokens > n.input_tokens


def test_tool_use_streamed(server):
    q = [{"role": "user", "content": "What is the weather in Rome?"}]
    kw = dict(messages=q, max_tokens=60, tools=[WEATHER],
              tool_choice={"type": "tool", "name": "get_weather"})
    whole = server.sdk.messages.create(**ask(server, **kw))
    kinds, blocks, delta = streamed(server, **kw)
    assert [b["type"] for b in blocks] == ["tool_use"] and blocks[0]["name"] == "get_weather"
    assert len(blocks[0]["fragments"]) > 1  # arguments stream as they are generated
    assert json.loads(blocks[0]["json"]) == whole.content[0].input
    assert delta.delta.stop_reason == "tool_use"
    assert delta.usage.output_tokens == whole.usage.output_tokens
    # the SDK's helper accumulates the same input
    with server.sdk.messages.stream(**ask(server, **kw)) as s:
        final = s.get_final_message()
    assert final.content[0].input == whole.content[0].input and final.stop_reason == "tool_use"


CITY = {"type": "object", "properties": {"city": {"type": "string"},
                                        "population": {"type": "integer"}},
        "required": ["city", "population"], "additionalProperties": False}


def test_structured_output(server):
    """output_config.format (and the beta's output_format): the text is a
    JSON value of the schema, through the grammar engine; streamed the same."""
    q = [{"role": "user", "content": "Give a city and its population as JSON."}]
    kw = dict(messages=q, max_tokens=60,
              extra_body={"temperature": 0, "output_config": {
                  "format": {"type": "json_schema", "schema": CITY}, "effort": "high"}})
    m = server.sdk.messages.create(**ask(server, **kw))
    assert [b.type for b in m.content] == ["text"] and m.stop_reason == "end_turn", m
    jsonschema.validate(json.loads(m.content[0].text), CITY)
    kinds, blocks, delta = streamed(server, **kw)
    assert [b["text"] for b in blocks] == [m.content[0].text]
    beta = server.sdk.messages.create(**ask(server, messages=q, max_tokens=60, extra_body={
        "temperature": 0, "output_format": {"type": "json_schema", "schema": CITY}}))
    assert beta.content[0].text == m.content[0].text
    # the prompt is the same: count_tokens takes it too
    n = server.sdk.messages.count_tokens(model=NAME, messages=q, extra_body={
        "output_config": {"format": {"type": "json_schema", "schema": CITY}}})
    assert n.input_tokens == m.usage.input_tokens


def test_count_tokens_equals_usage(server):
    cases = [dict(), dict(system="You are terse."),
             dict(system=[{"type": "text", "text": "You are terse."},
                          {"type": "text", "text": "Answer in English.",
                           "cache_control": {"type": "ephemeral"}}]),
             dict(tools=[WEATHER]),
             dict(messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                         {"type": "text", "text": "there"}]}])]
    seen = set()
    for kw in cases:
        m = server.sdk.messages.create(**ask(server, max_tokens=2, **kw))
        kw.setdefault("messages", COLORS)
        n = server.sdk.messages.count_tokens(model=NAME, **kw)
        assert n.input_tokens == m.usage.input_tokens, kw
        seen.add(n.input_tokens)
    assert len(seen) >= 4  # system, tools and content reach the prompt
    # the same body as /v1/messages is taken (max_tokens and all)
    st, body = post(server.port, "/v1/messages/count_tokens", raw(ask(server)))
    assert st == 200 and body == {"input_tokens": server.sdk.messages.create(
        **ask(server, max_tokens=1)).usage.input_tokens}


def test_api_key_headers(server):
    st, body = post(server.port, "/v1/messages", raw(ask(server, max_tokens=2)))
    assert st == 200 and body["type"] == "message"
    st, body = post(server.port, "/v1/messages", raw(ask(server, max_tokens=2)), key=None,
                    headers={"Authorization": f"Bearer {KEY}"})
    assert st == 200 and body["type"] == "message"
    for hd in ({"x-api-key": "wrong"}, {}):
        st, body = post(server.port, "/v1/messages", raw(ask(server)), key=None, headers=hd)
        assert st == 401 and body == {"type": "error", "error": {
            "type": "authentication_error", "message": body["error"]["message"]}}
        assert "x-api-key" in body["error"]["message"]
    bad = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="nope",
                              max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(**ask(server))


def body(**kw):
    b = {"model": NAME, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for k, v in kw.items():
        if v is None:
            b.pop(k)
        else:
            b[k] = v
    return b


def msgs(*m):
    return body(messages=list(m))


U = {"role": "user", "content": "hi"}
USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                         "input": {"city": "Oslo"}}]}


def result(**kw):
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", **kw}]}


def block(**kw):
    return msgs({"role": "user", "content": [kw]})


def tool(**kw):
    return body(tools=[{**WEATHER, **kw}])


MSG, COUNT = "/v1/messages", "/v1/messages/count_tokens"
BAD = [
    (MSG, '{"model": ', 400, "JSON"),
    (MSG, "[]", 400, "JSON object"),
    (MSG, body(model=None), 400, "model"),
    (MSG, body(model=5), 400, "model"),
    (MSG, body(max_tokens=None), 400, "max_tokens"),
    (MSG, body(max_tokens=0), 400, "max_tokens"),
    (MSG, body(max_tokens="8"), 400, "max_tokens"),
    (MSG, body(messages=None), 400, "messages"),
    (MSG, body(messages="hi"), 400, "messages"),
    (MSG, body(messages=[]), 400, "messages"),
    (MSG, msgs(5), 400, "messages.0"),
    (MSG, msgs({"content": "hi"}), 400, "messages.0.role"),
    (MSG, msgs({"role": "system", "content": "hi"}), 400, "messages.0.role"),
    (MSG, msgs({"role": "tool", "content": "hi"}), 400, "messages.0.role"),
    (MSG, msgs({"role": "user"}), 400, "messages.0.content"),
    (MSG, msgs({"role": "user", "content": 5}), 400, "messages.0.content"),
    (MSG, msgs({"role": "user", "content": []}), 400, "messages.0.content"),
    (MSG, msgs({"role": "user", "content": "hi", "name": "bob"}), 400, "messages.0.name"),
    (MSG, msgs({"role": "user", "content": ["hi"]}), 400, "messages.0.content.0"),
    (MSG, block(text="hi"), 400, "messages.0.content.0.type"),
    (MSG, block(type="video"), 400, "messages.0.content.0.type"),
    # an image reaches the tokenizer process, which has no image projector
    (MSG, block(type="image", source={"type": "base64", "media_type": "image/png", "data": "AA=="}),
     400, "--mmproj"),
    (MSG, block(type="document", source={"type": "text", "media_type": "text/plain",
                                         "data": "x"}), 400, "messages.0.content.0"),
    (MSG, block(type="text", text=3), 400, "messages.0.content.0.text"),
    (MSG, block(type="text"), 400, "messages.0.content.0.text"),
    (MSG, block(type="text", text="a", foo=1), 400, "messages.0.content.0.foo"),
    (MSG, block(type="tool_use", id="t1", name="get_weather", input={}), 400,
     "messages.0.content.0.type"),
    (MSG, msgs(U, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t1"}]}, U), 400, "messages.1.content.0.type"),
    (MSG, msgs(result(content="sunny")), 400, "messages.0.content.0.tool_use_id"),
    (MSG, msgs(U, USE, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}), 400,
     "messages.2.content.0.tool_use_id"),
    (MSG, msgs(U, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather"}]}, U), 400,
     "messages.1.content.0.input"),
    (MSG, msgs(U, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": "{}"}]}, U), 400,
     "messages.1.content.0.input"),
    (MSG, msgs(U, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "", "name": "get_weather", "input": {}}]}, U), 400,
     "messages.1.content.0.id"),
    (MSG, msgs(U, USE, result(content="x", is_error="yes")), 400,
     "messages.2.content.0.is_error"),
    (MSG, msgs(U, USE, result(content=[{"type": "image", "source": {}}])), 400,
     "messages.2.content.0.content.0"),
    (MSG, msgs(U, USE, {"role": "user", "content": [
        {"type": "text", "text": "here"}, {"type": "tool_result", "tool_use_id": "t1"}]}), 400,
     "messages.2.content.1"),
    (MSG, msgs(U, {"role": "assistant", "content": "Sure"}), 400, "messages.1"),
    (MSG, body(system=5), 400, "system"),
    (MSG, body(system=[{"type": "image", "source": {}}]), 400, "system.0.type"),
    (MSG, body(temperature=2), 400, "temperature"),
    (MSG, body(temperature="hot"), 400, "temperature"),
    (MSG, body(top_p=1.5), 400, "top_p"),
    (MSG, body(top_k=-1), 400, "top_k"),
    (MSG, body(top_k=1.5), 400, "top_k"),
    (MSG, body(stop_sequences="x"), 400, "stop_sequences"),
    (MSG, body(stop_sequences=[""]), 400, "stop_sequences.0"),
    (MSG, body(stop_sequences=[1]), 400, "stop_sequences.0"),
    (MSG, body(stop_sequences=["s"] * 17), 400, "stop_sequences"),
    (MSG, body(stream="yes"), 400, "stream"),
    (MSG, body(tools={}), 400, "tools"),
    (MSG, body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400,
     "tools.0.type"),
    (MSG, body(tools=[{"type": "bash_20250124", "name": "bash"}]), 400, "tools.0.type"),
    (MSG, body(tools=[{"name": "f"}]), 400, "tools.0.input_schema"),
    (MSG, tool(name="get weather"), 400, "tools.0.name"),
    (MSG, body(tools=[WEATHER, WEATHER]), 400, "tools.1.name"),
    (MSG, tool(input_schema={"type": "array"}), 400, "tools.0.input_schema"),
    (MSG, tool(parameters={}), 400, "tools.0.parameters"),
    (MSG, body(tools=[WEATHER], tool_choice="auto"), 400, "tool_choice"),
    (MSG, body(tools=[WEATHER], tool_choice={"type": "required"}), 400, "tool_choice.type"),
    (MSG, body(tools=[WEATHER], tool_choice={"type": "tool"}), 400, "tool_choice.name"),
    (MSG, body(tools=[WEATHER], tool_choice={"type": "tool", "name": "f"}), 400,
     "tool_choice.name"),
    (MSG, body(tool_choice={"type": "any"}), 400, "tool_choice"),
    (MSG, body(tools=[WEATHER], tool_choice={"type": "none", "name": "get_weather"}), 400,
     "tool_choice.name"),
    (MSG, body(tools=[{**WEATHER, "input_schema": {
        "type": "object", "properties": {"city": {"not": {"type": "string"}}}}}],
        tool_choice={"type": "any"}), 400, "tools.input_schema"),
    (MSG, body(thinking="yes"), 400, "thinking"),
    (MSG, body(thinking={"type": "on"}), 400, "thinking.type"),
    (MSG, body(thinking={"type": "enabled"}), 400, "thinking.budget_tokens"),
    (MSG, body(thinking={"type": "enabled", "budget_tokens": 8}), 400, "thinking.budget_tokens"),
    (MSG, body(thinking={"type": "disabled", "budget_tokens": 4}), 400, "thinking.budget_tokens"),
    (MSG, body(thinking={"type": "enabled", "budget_tokens": 4}, tools=[WEATHER],
               tool_choice={"type": "any"}), 400, "thinking.budget_tokens"),
    (MSG, body(metadata="x"), 400, "metadata"),
    (MSG, body(metadata={"foo": 1}), 400, "metadata.foo"),
    (MSG, body(frequency_penalty=0.5), 400, "frequency_penalty"),
    (MSG, body(container="c1"), 400, "container"),
    (MSG, body(context_management={"edits": []}), 400, "context_management"),
    (MSG, body(output_config="high"), 400, "output_config"),
    (MSG, body(output_config={"effort": "extreme"}), 400, "output_config.effort"),
    (MSG, body(output_config={"verbosity": 1}), 400, "output_config.verbosity"),
    (MSG, body(output_config={"format": {"type": "json_object"}}), 400,
     "output_config.format.type"),
    (MSG, body(output_config={"format": {"type": "json_schema"}}), 400,
     "output_config.format.schema"),
    (MSG, body(output_config={"format": {"type": "json_schema", "schema": CITY}},
               output_format={"type": "json_schema", "schema": CITY}), 400, "output_format"),
    (MSG, body(output_format={"type": "json_schema", "schema": CITY}, grammar='root ::= "x"'),
     400, "output_format"),
    (MSG, body(output_config={"format": {"type": "json_schema", "schema": CITY}},
               tools=[WEATHER], tool_choice={"type": "any"}), 400, "output_config.format"),
    (MSG, body(output_config={"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}), 400,
     "output_config.format.schema"),
    (MSG, body(mcp_servers=[{"type": "url", "url": "http://x", "name": "x"}]), 400,
     "mcp_servers"),
    (MSG, body(timeout_ms=0), 400, "timeout_ms"),
    (MSG, body(grammar=5), 400, "grammar"),
    (COUNT, body(model=None), 400, "model"),
    (COUNT, body(messages=None), 400, "messages"),
    (COUNT, body(stream=True), 400, "stream"),
    (COUNT, block(type="image", source={}), 400, "messages.0.content.0"),
]


def bad_id(case):
    path, b, status, field = case
    return f"{'count' if path == COUNT else 'msg'}-{field}"


@pytest.mark.parametrize("case", BAD, ids=[f"{i}-{bad_id(c)}" for i, c in enumerate(BAD)])
def test_bad_input(server, case):
    """Each bad input: its status, Anthropic's error shape, the field named."""
    path, b, status, field = case
    st, out = post(server.port, path, b)
    assert st == status, (st, out)
    assert isinstance(out, dict) and set(out) == {"type", "error"}, out
    assert out["type"] == "error" and set(out["error"]) == {"type", "message"}, out
    assert out["error"]["type"] == "invalid_request_error", out
    assert field in out["error"]["message"], out


def test_bad_paths_then_serves_on(server):
    """After every bad input above: paths and methods in Anthropic's shape,
    the SDK's exception, and the server still serves."""
    assert len(BAD) >= 45
    # paths and methods, in Anthropic's shape too
    st, out = post(server.port, MSG, None, method="GET")
    assert st == 405 and out["error"]["type"] == "invalid_request_error", out
    st, out = post(server.port, "/v1/messages/batches", body())
    assert st == 404 and out["error"]["type"] == "not_found_error", out
    # the SDK raises them as BadRequestError
    with pytest.raises(anthropic.BadRequestError) as ex:
        server.sdk.messages.create(model=NAME, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert "--mmproj" in str(ex.value)
    # the server serves on
    m = server.sdk.messages.create(**ask(server, max_tokens=4))
    assert m.content[0].text


def test_keep_alive_passed_on(server):
    """keep_alive (Ollama's, as on chat completions) reaches the same
    parser: a duration is taken, a bad one is a 400 naming it."""
    st, out = post(server.port, MSG, body(keep_alive="5m"))
    assert st == 200 and out["type"] == "message", out
    st, out = post(server.port, MSG, body(keep_alive="soon"))
    assert st == 400 and out["error"]["type"] == "invalid_request_error", out
    assert "keep_alive" in out["error"]["message"], out


def test_deadline_error_shape(server):
    """A passed deadline (zinfer's timeout_ms) is a 504 timeout_error in
    Anthropic's shape, which the SDK raises without retrying."""
    st, out = post(server.port, MSG, body(max_tokens=400, timeout_ms=1))
    assert st == 504 and out["type"] == "error", out
    assert out["error"]["type"] == "timeout_error" and "timeout_ms" in out["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as ex:
        server.sdk.messages.create(**ask(server, max_tokens=400,
                                         extra_body={"temperature": 0, "timeout_ms": 1}))
    assert ex.value.status_code == 504
    # streamed: the text so far, then an error event, and no message_stop
    long = 'a ::= "ab "\nb ::= a a a a a a a a a a\nc ::= b b b b b b b b b b\n' \
           'root ::= c c c c c c c c c c'  # 1000 times "ab ": longer than the deadline
    st, text = post(server.port, MSG, body(max_tokens=4000, timeout_ms=1500, stream=True,
                                           grammar=long))
    assert st == 200, text
    ev = events(text)
    names = [n for n, _ in ev]
    assert names[:3] == ["message_start", "ping", "content_block_start"], names
    assert names[-1] == "error" and "message_stop" not in names, names
    assert names.count("content_block_delta") > 2, names
    err = ev[-1][1]
    assert err["type"] == "error" and err["error"]["type"] == "timeout_error", err
    assert "timeout_ms" in err["error"]["message"], err


# ---- thinking ---------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """test_reasoning.py's random-weight qwen3 file (Qwen 2's vocabulary,
    Qwen 3's template) and that module."""
    tr = pytest.importorskip("test_reasoning")
    if not (tr.VOCAB.is_file() and tr.QWEN3.is_file() and tr.QWEN35.is_file()):
        pytest.skip("the vendored llama.cpp vocabulary and templates are absent")
    return tr, tr.write_qwen3(tmp_path_factory.mktemp("qwen3") / "qwen3-think.gguf")


@pytest.fixture(scope="module")
def thinker(zinfer_bin, qwen3, tmp_path_factory):
    """Qwen 3's template, which lets the model open <think> itself."""
    tr, path = qwen3
    cm, srv = start(zinfer_bin, path, tmp_path_factory.mktemp("thinker") / "serve.log")
    srv.sdk = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key="x",
                                  max_retries=0, timeout=120)
    try:
        yield srv
    finally:
        cm.__exit__(None, None, None)


THOUGHT = "<think>\nTwo and two make four.\n</think>\n\nThe answer is 4."
CALL = ('<think>\nI should look it up.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call>')
ASK = [{"role": "user", "content": "What is 2+2?"}]


def forced(text, **kw):
    """A request whose output the grammar fixes to text."""
    return dict(model="qwen3-think", max_tokens=80, messages=ASK,
                extra_body={"temperature": 0, "grammar": "root ::= " + json.dumps(text)}, **kw)


def test_thinking_blocks(thinker):
    m = thinker.sdk.messages.create(**forced(THOUGHT, thinking={"type": "adaptive"}))
    assert [b.type for b in m.content] == ["thinking", "text"], m
    assert m.content[0].thinking == "Two and two make four." and m.content[0].signature == ""
    assert m.content[1].text == "The answer is 4." and m.stop_reason == "end_turn"
    kinds, blocks, delta = streamed(thinker, **forced(THOUGHT))
    assert [(b["type"], b["thinking"], b["text"]) for b in blocks] == [
        ("thinking", "Two and two make four.", ""), ("text", "", "The answer is 4.")]
    assert kinds[:2] == ["message_start", "content_block_start"]  # the SDK drops pings
    # the thinking block ends with its (empty) signature, then the text block
    st, text = post(thinker.port, MSG, raw(forced(THOUGHT, stream=True)), key=None)
    assert st == 200, text
    ev = events(text)
    first_stop = next(i for i, (n, _) in enumerate(ev) if n == "content_block_stop")
    assert ev[first_stop - 1][1]["delta"] == {"type": "signature_delta", "signature": ""}
    assert ev[first_stop][1]["index"] == 0
    assert ev[first_stop + 1][1]["content_block"] == {"type": "text", "text": ""}
    # SDK helper: the thinking and text accumulate to the whole reply's
    with thinker.sdk.messages.stream(**forced(THOUGHT)) as s:
        final = s.get_final_message()
    assert [b.model_dump(exclude_none=True) for b in final.content] == \
           [b.model_dump(exclude_none=True) for b in m.content]


def test_thinking_then_tool_use(thinker):
    tools = [WEATHER]
    m = thinker.sdk.messages.create(**forced(CALL, tools=tools))
    assert [b.type for b in m.content] == ["thinking", "tool_use"], m
    assert m.content[0].thinking == "I should look it up."
    assert m.content[1].name == "get_weather" and m.content[1].input == {"city": "Paris"}
    assert m.stop_reason == "tool_use"
    # the round trip: the thinking and the call sent back, the result, an answer
    turn = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                    for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": m.content[1].id,
                                                "content": "sunny, 21 C"}]}]
    final = thinker.sdk.messages.create(**{**forced(THOUGHT, tools=tools), "messages": turn})
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == "The answer is 4." and final.stop_reason == "end_turn"
    assert final.usage.input_tokens > m.usage.input_tokens
    kinds, blocks, delta = streamed(thinker, **forced(CALL, tools=tools))
    assert [b["type"] for b in blocks] == ["thinking", "tool_use"]
    assert blocks[0]["thinking"] == "I should look it up."
    assert json.loads(blocks[1]["json"]) == {"city": "Paris"}
    assert delta.delta.stop_reason == "tool_use"


def test_thinking_option_reaches_the_template(thinker):
    """thinking disabled: Qwen 3's template closes an empty section in the
    prompt (more tokens); display omitted keeps the block, empty."""
    on = thinker.sdk.messages.count_tokens(model="m", messages=ASK,
                                           thinking={"type": "enabled", "budget_tokens": 10})
    off = thinker.sdk.messages.count_tokens(model="m", messages=ASK,
                                            thinking={"type": "disabled"})
    assert off.input_tokens > on.input_tokens
    m = thinker.sdk.messages.create(**forced(THOUGHT, thinking={"type": "disabled"}))
    assert m.usage.input_tokens == off.input_tokens
    m = thinker.sdk.messages.create(**forced(THOUGHT, thinking={
        "type": "adaptive", "display": "omitted"}))
    assert [(b.type, getattr(b, "thinking", None)) for b in m.content] == [
        ("thinking", ""), ("text", None)]
    # a budget cannot hold under a grammar (its forced end would break it)
    with pytest.raises(anthropic.BadRequestError) as ex:
        thinker.sdk.messages.create(**forced(THOUGHT, thinking={
            "type": "enabled", "budget_tokens": 40}))
    assert "thinking.budget_tokens" in str(ex.value)


def test_earlier_thinking_reaches_the_template(thinker):
    """An assistant's thinking block goes to the template as the message's
    reasoning_content, which Qwen 3's shows within a tool loop."""
    use = {"type": "tool_use", "id": "abcdefghi", "name": "get_weather",
           "input": {"city": "Paris"}}

    def count(blocks):
        return thinker.sdk.messages.count_tokens(model="m", tools=[WEATHER], messages=ASK + [
            {"role": "assistant", "content": blocks},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "abcdefghi",
                                          "content": "sunny"}]}]).input_tokens

    plain = count([use])
    thought = count([{"type": "thinking", "thinking": "I should look it up.", "signature": ""},
                     use])
    assert thought > plain
    assert count([{"type": "redacted_thinking", "data": "xyz"}, use]) == plain


@pytest.fixture(scope="module")
def opener(zinfer_bin, qwen3, tmp_path_factory):
    """Qwen 3.5's template, which opens the section in the prompt."""
    tr, path = qwen3
    cm, srv = start(zinfer_bin, path, tmp_path_factory.mktemp("opener") / "serve.log",
                    "--chat-template", tr.QWEN35)
    srv.sdk = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key="x",
                                  max_retries=0, timeout=120)
    try:
        yield srv
    finally:
        cm.__exit__(None, None, None)


def test_thinking_budget(opener):
    """budget_tokens is the chat API's max_thinking_tokens: the section ends
    there and the answer follows, as chat completions give them."""
    kw = dict(model="m", max_tokens=24, messages=ASK, extra_body={"temperature": 0},
              thinking={"type": "enabled", "budget_tokens": 5})
    m = opener.sdk.messages.create(**kw)
    st, oai = post(opener.port, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 24, "temperature": 0, "max_thinking_tokens": 5,
        "chat_template_kwargs": {"enable_thinking": True}}, key=None)
    assert st == 200, oai
    want = oai["choices"][0]["message"]
    assert want["reasoning_content"] and want["content"], want
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in m.content] == [("thinking", want["reasoning_content"]),
                                    ("text", want["content"])]
    assert m.usage.output_tokens == oai["usage"]["completion_tokens"]
    assert m.usage.input_tokens == oai["usage"]["prompt_tokens"]
    kinds, blocks, delta = streamed(opener, **kw)
    assert [(b["type"], b["thinking"] or b["text"]) for b in blocks] == [
        ("thinking", want["reasoning_content"]), ("text", want["content"])]
