"""End-to-end tests of OpenAI's Responses API on zinfer-http (POST
/v1/responses, GET and DELETE /v1/responses/{id}; docs/http.md,
"Responses").

One `zinfer serve --http` runs for the module on the real default model,
with an API key and a store of at most STORE_MAX responses. The official
`openai` SDK's `client.responses` drives it: text whole and streamed
(greedy, so the streamed deltas join to exactly the whole output_text),
the SDK's stream and parse helpers, instructions, max_output_tokens cut
short, json_schema and json_object text formats, a full tool round trip (a
forced call, its output sent back, a final message), streamed call
arguments, a deadline passing mid-stream (error event, response.failed),
store and previous_response_id, eviction at the entry bound, GET and
DELETE; a second server shows the byte bound. Then a table of bad
requests, each answered with its status and an error naming the field,
after which the server still answers.

A thinking model: a random-weight qwen3 file with Qwen 3's template, whose
completions a grammar forces to `<think>...</think>answer`, gives reasoning
items (whole, streamed, with a summary), reasoning.effort switching the
template's thinking, and a tool round trip after reasoning through
previous_response_id.
"""

import contextlib
import http.client as httpc
import json
import os
import time
from pathlib import Path

import jsonschema
import openai
import pytest

from conftest import free_port, serve_process, wait_http

KEY = "sk-test-responses"
STORE_MAX = 4

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}



def raw(port, method, path, body=None, key=KEY):
    """(status, parsed JSON body) of one raw HTTP request."""
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    if not isinstance(body, (str, type(None))):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("responses") / "serve.log"
    hport = free_port()
    with serve_process(zinfer_bin, model_path, log, "--threads-per-worker", 2, "--slots", 4,
                       "--http", f"127.0.0.1:{hport}", "--api-key", KEY,
                       "--responses-store-max", STORE_MAX) as srv:
        wait_http(hport, srv)
        srv.port = hport
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY,
                         max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def deltas(events, kind):
    return "".join(e.delta for e in events if e.type == kind)


def test_text_whole_and_streamed(client, model):
    kw = dict(model=model, input="Name three colors.", temperature=0, max_output_tokens=40)
    whole = client.responses.create(**kw)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.model == model
    assert whole.output_text
    msg = [o for o in whole.output if o.type == "message"]
    assert len(msg) == 1 and msg[0].id.startswith("msg_") and msg[0].role == "assistant"
    assert msg[0].content[0].type == "output_text" and msg[0].content[0].annotations == []
    u = whole.usage
    assert u.output_tokens > 0 and u.input_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert whole.temperature == 0 and whole.max_output_tokens == 40 and whole.store is False

    events = list(client.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert deltas(events, "response.output_text.delta") == whole.output_text
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert done.text == whole.output_text
    final = events[-1].response
    assert final.status == whole.status and final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id


def test_stream_helper(client, model):
    kw = dict(model=model, input="What is 2+2? Answer with one number.", temperature=0,
              max_output_tokens=200)
    whole = client.responses.create(**kw)
    assert whole.status == "completed" and whole.incomplete_details is None
    with client.responses.stream(**kw) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert text == whole.output_text == final.output_text
    assert final.status == "completed"


def test_instructions(client, model):
    kw = dict(model=model, input="Hello", temperature=0, max_output_tokens=8)
    plain = client.responses.create(**kw)
    told = client.responses.create(**kw, instructions="You are a pirate. Always talk like one.")
    assert told.instructions == "You are a pirate. Always talk like one."
    assert plain.instructions is None
    # a system turn of the instructions' text instead of the template's default one
    assert told.usage.input_tokens != plain.usage.input_tokens
    same = client.responses.create(
        model=model, temperature=0, max_output_tokens=8,
        input=[{"role": "system", "content": "You are a pirate. Always talk like one."},
               {"role": "user", "content": "Hello"}])
    assert same.usage.input_tokens == told.usage.input_tokens
    assert same.output_text == told.output_text


def test_max_output_tokens_incomplete(client, model):
    r = client.responses.create(model=model, input="Write a long story about a dragon.",
                                temperature=0, max_output_tokens=5)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5
    assert r.output[-1].status == "incomplete"
    events = list(client.responses.create(model=model, input="Write a long story about a dragon.",
                                          temperature=0, max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert deltas(events, "response.output_text.delta") == r.output_text


def test_json_schema(client, model):
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.responses.create(
        model=model, input="Describe a person as JSON.", temperature=0, max_output_tokens=100,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema,
                         "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    o = client.responses.create(model=model, input="Give a JSON object.", temperature=0,
                                max_output_tokens=100, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(o.output_text), dict)


def test_parse_helper(client, model):
    """The SDK's responses.parse: a pydantic model as text.format, the
    answer parsed back into it."""
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        country: str

    r = client.responses.parse(model=model, input="Name a city in France.", text_format=City,
                               temperature=0, max_output_tokens=100)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, City) and r.output_parsed.name
    assert r.text.format.type == "json_schema" and r.text.format.name == "City"


def test_tool_round_trip(client, model):
    q = "What is the weather in Paris?"
    first = client.responses.create(model=model, input=q, tools=[WEATHER],
                                    tool_choice="required", temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1, first.output
    fc = calls[0]
    assert fc.name == "get_weather" and fc.id.startswith("fc_") and fc.call_id
    assert fc.status == "completed"
    assert isinstance(json.loads(fc.arguments)["city"], str)
    assert first.tools[0].name == "get_weather" and first.tool_choice == "required"
    # the call and its result sent back: a final message
    items = [{"role": "user", "content": q}, fc.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": fc.call_id, "output": "Sunny, 21 C"}]
    final = client.responses.create(model=model, input=items, tools=[WEATHER],
                                    tool_choice="none", temperature=0, max_output_tokens=60)
    assert [o.type for o in final.output] == ["message"]
    assert final.output_text
    # the result is in the prompt: more input tokens than the question alone
    assert final.usage.input_tokens > first.usage.input_tokens
    # a named function forces the same call
    named = client.responses.create(model=model, input=q, tools=[WEATHER], temperature=0,
                                    tool_choice={"type": "function", "name": "get_weather"})
    assert [o.type for o in named.output] == ["function_call"]
    assert named.output[0].arguments == fc.arguments


def test_streamed_arguments(client, model):
    kw = dict(model=model, input="What is the weather in Berlin?", tools=[WEATHER],
              tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    added = [e for e in events if e.type == "response.output_item.added"][0]
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    joined = deltas(events, "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"][0]
    assert joined == done.arguments == whole.output[0].arguments
    assert json.loads(joined)["city"]
    assert types[-1] == "response.completed"
    assert events[-1].response.output[0].arguments == joined
    with client.responses.stream(**kw) as s:
        for _ in s:
            pass
        f = s.get_final_response()
    assert f.output[0].arguments == joined


def test_store_and_previous_response_id(client, model):
    kw = dict(model=model, temperature=0, max_output_tokens=16)
    r1 = client.responses.create(input="My name is Ada.", store=True, **kw)
    assert r1.store is True
    r2 = client.responses.create(input="What is my name?", previous_response_id=r1.id,
                                 store=True, **kw)
    assert r2.previous_response_id == r1.id
    alone = client.responses.create(input="What is my name?", **kw)
    # the second turn's prompt holds the first turn's input and output
    assert r2.usage.input_tokens > alone.usage.input_tokens + r1.usage.output_tokens
    # ... as the same conversation sent whole would
    explicit = client.responses.create(
        input=[{"role": "user", "content": "My name is Ada."},
               r1.output[0].model_dump(exclude_none=True),
               {"role": "user", "content": "What is my name?"}], **kw)
    assert explicit.usage.input_tokens == r2.usage.input_tokens
    assert explicit.output_text == r2.output_text
    # a third turn continues the chain
    r3 = client.responses.create(input="And again?", previous_response_id=r2.id, **kw)
    assert r3.usage.input_tokens > r2.usage.input_tokens + r2.usage.output_tokens
    # stateless by default: not kept
    with pytest.raises(openai.NotFoundError) as ei:
        client.responses.retrieve(alone.id)
    assert ei.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as ei:
        client.responses.create(input="Hi", previous_response_id=alone.id, **kw)
    assert ei.value.body["param"] == "previous_response_id"


def test_streamed_store(client, model):
    events = list(client.responses.create(model=model, input="Hi there", temperature=0,
                                          max_output_tokens=8, store=True, stream=True))
    final = events[-1].response
    got = client.responses.retrieve(final.id)
    assert got.output_text == final.output_text and got.status == final.status


def test_deadline_mid_stream(client, model):
    """timeout_ms (zinfer's extension) passing mid-stream: the text so far,
    an `error` event naming it, then response.failed; whole, a 504."""
    kw = dict(model=model, input="Count to a million.", temperature=0, max_output_tokens=4000)
    events = list(client.responses.create(**kw, stream=True,
                                          extra_body={"ignore_eos": True, "timeout_ms": 1500}))
    types = [e.type for e in events]
    assert types.count("response.output_text.delta") > 2, types
    err = [e for e in events if e.type == "error"]
    assert len(err) == 1 and err[0].code == "deadline_exceeded", err
    assert err[0].param == "timeout_ms" and "1500 ms" in err[0].message
    assert types[-1] == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.message == err[0].message
    assert failed.output[0].status == "incomplete"
    assert failed.output[0].content[0].text == deltas(events, "response.output_text.delta")
    with pytest.raises(openai.APIStatusError) as ei:
        client.responses.create(**kw, extra_body={"ignore_eos": True, "timeout_ms": 300})
    assert ei.value.status_code == 504 and ei.value.body["param"] == "timeout_ms"


def test_keep_alive_passed_on(client, model):
    """keep_alive (Ollama's, as on chat completions) reaches the same
    parser: a duration is taken, a bad one is a 400 naming it."""
    r = client.responses.create(model=model, input="Hi", max_output_tokens=4,
                                extra_body={"keep_alive": 30})
    assert r.usage.output_tokens == 4, r  # answered (cut at max_output_tokens)
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model=model, input="Hi", max_output_tokens=4,
                                extra_body={"keep_alive": "soon"})
    assert ei.value.body["param"] == "keep_alive", ei.value.body


def test_retrieve_and_delete(server, client, model):
    r = client.responses.create(model=model, input="Hi", temperature=0, max_output_tokens=8,
                                store=True)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    assert got.usage.total_tokens == r.usage.total_tokens
    status, body = raw(server.port, "DELETE", f"/v1/responses/{r.id}")
    assert status == 200 and body == {"id": r.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    status, body = raw(server.port, "PUT", f"/v1/responses/{r.id}", {})
    assert status == 405


def test_eviction_at_the_bound(client, model):
    ids = [client.responses.create(model=model, input=f"Count to {i}.", temperature=0,
                                   max_output_tokens=4, store=True).id
           for i in range(STORE_MAX + 2)]
    for gone in ids[:2]:
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
    for kept in ids[2:]:
        assert client.responses.retrieve(kept).id == kept
    # reading one makes it the most recently used: the next store evicts another
    client.responses.retrieve(ids[2])
    extra = client.responses.create(model=model, input="One more.", temperature=0,
                                    max_output_tokens=4, store=True).id
    assert client.responses.retrieve(ids[2]).id == ids[2]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[3])
    assert client.responses.retrieve(extra).id == extra


def test_byte_bound(zinfer_bin, model_path, tmp_path):
    """--responses-store-bytes: the least recently used responses go once
    the kept bytes pass the bound; one larger than the bound alone is
    answered but not kept, and evicts nothing."""
    hport = free_port()
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log", "--threads-per-worker", 2,
                       "--http", f"127.0.0.1:{hport}", "--api-key", KEY,
                       "--responses-store-bytes", 6000) as srv:
        deadline = time.time() + 30
        while raw(hport, "GET", "/health")[0] != 200:
            assert time.time() < deadline, srv.log()
            time.sleep(0.05)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{hport}/v1", api_key=KEY, max_retries=0)
        ids = [c.responses.create(input=f"Say {i}.", temperature=0, max_output_tokens=3,
                                  store=True).id for i in range(8)]
        kept = [i for i in ids if raw(hport, "GET", f"/v1/responses/{i}")[0] == 200]
        # each is about 1.5 KB of JSON: a few fit, the newest ones
        assert 2 <= len(kept) < len(ids) and kept == ids[len(ids) - len(kept):], kept
        # metadata (echoed in the response) makes it large without a long prompt
        big = c.responses.create(input="Hi", temperature=0, max_output_tokens=3, store=True,
                                 metadata={f"k{j}": "v" * 500 for j in range(14)})
        assert big.store is True and big.output_text is not None
        assert raw(hport, "GET", f"/v1/responses/{big.id}")[0] == 404
        assert [i for i in ids if raw(hport, "GET", f"/v1/responses/{i}")[0] == 200] == kept


T = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
BAD = [
    # (body, status, param)
    ("{not json", 400, None),
    ([1, 2], 400, None),
    ({"input": "hi", "model": 5}, 400, "model"),
    ({"input": "hi", "model": "no-such-model"}, 404, "model"),
    ({}, 400, "input"),
    ({"input": 5}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": [5]}, 400, "input[0]"),
    ({"input": [{"type": "telepathy"}]}, 400, "input[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
    ({"input": [{"type": 7, "role": "user", "content": "x"}]}, 400, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role"),
    ({"input": [{"content": "x"}]}, 400, "input[0].role"),
    ({"input": [{"role": "user"}]}, 400, "input[0].content"),
    ({"input": [{"role": "user", "content": 3}]}, 400, "input[0].content"),
    ({"input": [{"role": "user", "content": [7]}]}, 400, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input[0].content[0].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]}, 400,
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]}, 400,
     "input[0].content[0].text"),
    ({"input": [{"role": "user", "content": [{"type": "mystery", "text": "x"}]}]}, 400,
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400,
     "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": 3, "arguments": "{}"}]}, 400,
     "input[0].name"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, 400,
     "input[0].arguments"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]}, 400,
     "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, 400,
     "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c"}]}, 400, "input[1].output"),
    ({"input": [{"type": "function_call_output", "call_id": 4, "output": "x"}]}, 400,
     "input[0].call_id"),
    ({"input": [{"type": "reasoning", "summary": []}]}, 400, "input"),
    ({"input": "hi", "instructions": 5}, 400, "instructions"),
    ({"input": "hi", "tools": {}}, 400, "tools"),
    ({"input": "hi", "tools": [3]}, 400, "tools[0]"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": []}]}, 400,
     "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "code_interpreter"}]}, 400, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "mcp", "server_label": "x"}]}, 400, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "spaceship"}]}, 400, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "function"}]}, 400, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "x" * 129}]}, 400, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": []}]}, 400,
     "tools[0].parameters"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "description": 1}]}, 400,
     "tools[0].description"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "strict": "yes"}]}, 400,
     "tools[0].strict"),
    ({"input": "hi", "tools": T, "tool_choice": "sometimes"}, 400, "tool_choice"),
    ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "hi", "tools": T, "tool_choice": 3}, 400, "tool_choice"),
    ({"input": "hi", "tools": T, "tool_choice": {"type": "function"}}, 400, "tool_choice.name"),
    ({"input": "hi", "tools": T, "tool_choice": {"type": "function", "name": "g"}}, 400,
     "tool_choice.name"),
    ({"input": "hi", "tools": T, "tool_choice": {"type": "file_search"}}, 400, "tool_choice.type"),
    ({"input": "hi", "text": "json"}, 400, "text"),
    ({"input": "hi", "text": {"format": "json"}}, 400, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, 400, "text.format.type"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, 400,
     "text.format.name"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "bad name!",
                                         "schema": {}}}}, 400, "text.format.name"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "n"}}}, 400,
     "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "n", "schema": {},
                                         "strict": "yes"}}}, 400, "text.format.strict"),
    ({"input": "hi", "text": {"verbosity": "loud"}}, 400, "text.verbosity"),
    ({"input": "hi", "reasoning": "high"}, 400, "reasoning"),
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, 400, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"summary": "verbose"}}, 400, "reasoning.summary"),
    ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": "ten"}, 400, "max_output_tokens"),
    ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"input": "hi", "temperature": 7}, 400, "temperature"),
    ({"input": "hi", "top_p": 2}, 400, "top_p"),
    ({"input": "hi", "stream": "yes"}, 400, "stream"),
    ({"input": "hi", "store": "yes"}, 400, "store"),
    ({"input": "hi", "previous_response_id": 5}, 400, "previous_response_id"),
    ({"input": "hi", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({"input": "hi", "truncation": "auto"}, 400, "truncation"),
    ({"input": "hi", "background": True}, 400, "background"),
    ({"input": "hi", "include": ["reasoning.encrypted_content"]}, 400, "include[0]"),
    ({"input": "hi", "include": "all"}, 400, "include"),
    ({"input": "hi", "metadata": []}, 400, "metadata"),
    ({"input": "hi", "metadata": {"k": 1}}, 400, "metadata.k"),
    ({"input": "hi", "parallel_tool_calls": "no"}, 400, "parallel_tool_calls"),
    ({"input": "hi", "user": 5}, 400, "user"),
    ({"input": "hi", "conversation": "conv_1"}, 400, "conversation"),
    ({"input": "hi", "prompt": {"id": "pmpt_1"}}, 400, "prompt"),
    ({"input": "hi", "top_logprobs": 3}, 400, "top_logprobs"),
    ({"input": "hi", "max_tool_calls": 2}, 400, "max_tool_calls"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_requests(server, body, status, param):
    got, err = raw(server.port, "POST", "/v1/responses", body)
    assert got == status, err
    e = err["error"]
    assert e["param"] == param, e
    assert e["message"]
    if param:
        # the message names the field, as the client spelt it
        assert param.split("[")[0].split(".")[0] in e["message"], e


def test_serves_after_bad_requests(server, client, model):
    assert len(BAD) >= 40
    for body, status, _ in BAD[:10]:
        assert raw(server.port, "POST", "/v1/responses", body)[0] == status
    r = client.responses.create(model=model, input="Hi", temperature=0, max_output_tokens=4)
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens > 0
    status, body = raw(server.port, "GET", "/v1/responses/resp_unknown")
    assert status == 404 and body["error"]["param"] == "response_id"
    status, body = raw(server.port, "POST", "/v1/responses", {"input": "hi"}, key="wrong")
    assert status == 401


# ---- a thinking model: a random-weight qwen3 file with Qwen 3's template ----

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
VENDOR = HOME / "llama.cpp-vendor" / "models"
VOCAB = VENDOR / "ggml-vocab-qwen2.gguf"
QWEN3 = VENDOR / "templates" / "Qwen-Qwen3-0.6B.jinja"
QWEN35 = VENDOR / "templates" / "Qwen3.5-4B.jinja"
# The grammars force the whole completion, so its reasoning and answer are
# known exactly (the random weights would write noise).
THINK = r'root ::= "<think>\nTwo and two make four.\n</think>\n\nThe answer is 4."'
CALL = (r'root ::= "<think>\nI need the weather.\n</think>\n\n<tool_call>\n'
        r'{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"')
ANSWER = r'root ::= "<think>\nThe tool said sunny.\n</think>\n\nIt is sunny in Paris."'


def write_qwen3(path):
    """A small random qwen3 file (3 layers, width 64) with Qwen 2's
    vocabulary and Qwen 3's chat template, which lets the model open
    `<think>` itself."""
    import gguf
    import numpy as np
    from gguf_files import tokenizer_rows, write_gguf

    rows, n_vocab = tokenizer_rows(VOCAB)
    rows = [r for r in rows if r[0] != "tokenizer.chat_template"]
    rows.append(("tokenizer.chat_template", QWEN3.read_text(encoding="utf-8"),
                 gguf.GGUFValueType.STRING, None))
    rng = np.random.default_rng(11)
    d, nh, nkv, hd, ff = 64, 4, 2, 16, 128

    def mat(r, c, sigma=None):
        return (rng.standard_normal((r, c)) * (sigma or 1 / np.sqrt(c))).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    q8 = gguf.GGMLQuantizationType.Q8_0
    t = {"token_embd.weight": (gguf.quants.quantize(mat(n_vocab, d, 0.3), q8), q8),
         "output_norm.weight": (norm(d), None)}
    for L in range(3):
        p = f"blk.{L}."
        for name, w in {"attn_norm.weight": norm(d), "ffn_norm.weight": norm(d),
                        "attn_q.weight": mat(nh * hd, d), "attn_k.weight": mat(nkv * hd, d),
                        "attn_v.weight": mat(nkv * hd, d), "attn_output.weight": mat(d, nh * hd),
                        "attn_q_norm.weight": norm(hd), "attn_k_norm.weight": norm(hd),
                        "ffn_gate.weight": mat(ff, d), "ffn_up.weight": mat(ff, d),
                        "ffn_down.weight": mat(d, ff)}.items():
            t[p + name] = (w, None)
    hp = {"block_count": 3, "context_length": 1024, "embedding_length": d,
          "feed_forward_length": ff, "attention.head_count": nh, "attention.head_count_kv": nkv,
          "attention.key_length": hd, "attention.value_length": hd,
          "rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6}
    return write_gguf(path, "qwen3", rows, hp, t)


@pytest.fixture(scope="module")
def qwen3_file(tmp_path_factory):
    if not (VOCAB.is_file() and QWEN3.is_file() and QWEN35.is_file()):
        pytest.skip("the vendored llama.cpp vocabulary and templates are absent")
    return write_qwen3(tmp_path_factory.mktemp("qwen3") / "qwen3-think.gguf")


@contextlib.contextmanager
def serve_sdk(zinfer_bin, path, log, *args):
    """serve_process with HTTP on a free port: yields an openai client."""
    hport = free_port()
    with serve_process(zinfer_bin, path, log, "--threads-per-worker", 2,
                       "--http", f"127.0.0.1:{hport}", "--api-key", KEY, *args) as srv:
        deadline = time.time() + 30
        while raw(hport, "GET", "/health")[0] != 200:
            assert time.time() < deadline, srv.log()
            time.sleep(0.05)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{hport}/v1", api_key=KEY, max_retries=0,
                            timeout=120)


@pytest.fixture(scope="module")
def thinker(zinfer_bin, qwen3_file, tmp_path_factory):
    """The file's own template (Qwen 3: the model opens <think>)."""
    with serve_sdk(zinfer_bin, qwen3_file,
                   tmp_path_factory.mktemp("thinker") / "serve.log") as sdk:
        yield sdk


def test_reasoning_item(thinker):
    kw = dict(model="qwen3-think", input="What is 2+2?", temperature=0, max_output_tokens=200,
              extra_body={"grammar": THINK})
    whole = thinker.responses.create(**kw)
    assert whole.status == "completed"
    assert [o.type for o in whole.output] == ["reasoning", "message"]
    rs = whole.output[0]
    assert rs.id.startswith("rs_") and rs.summary == []
    assert [(c.type, c.text) for c in rs.content] == [("reasoning_text", "Two and two make four.")]
    assert whole.output_text == "The answer is 4."
    events = list(thinker.responses.create(**kw, stream=True))
    assert deltas(events, "response.reasoning_text.delta") == "Two and two make four."
    assert deltas(events, "response.output_text.delta") == "The answer is 4."
    done = [e.text for e in events if e.type == "response.reasoning_text.done"]
    assert done == ["Two and two make four."]
    final = events[-1].response
    assert final.output[0].content[0].text == rs.content[0].text
    assert final.output_text == whole.output_text
    # a summary asked for: the reasoning itself, whole and streamed
    summ = thinker.responses.create(**kw, reasoning={"summary": "auto"})
    assert [s.text for s in summ.output[0].summary] == ["Two and two make four."]
    assert summ.reasoning.summary == "auto"
    events = list(thinker.responses.create(**kw, reasoning={"summary": "detailed"}, stream=True))
    assert deltas(events, "response.reasoning_summary_text.delta") == "Two and two make four."
    # effort none: the template's thinking switched off (Qwen 3 closes an
    # empty section in the prompt), so the answer comes without reasoning
    off = thinker.responses.create(
        model="qwen3-think", input="What is 2+2?", temperature=0, max_output_tokens=50,
        reasoning={"effort": "none"}, extra_body={"grammar": 'root ::= "The answer is 4."'})
    assert [o.type for o in off.output] == ["message"]
    assert off.output_text == "The answer is 4."
    assert off.usage.input_tokens > whole.usage.input_tokens
    # the other efforts leave Qwen 3's prompt as it is
    for effort in ("minimal", "medium", "xhigh"):
        r = thinker.responses.create(**kw, reasoning={"effort": effort})
        assert r.usage.input_tokens == whole.usage.input_tokens
        assert r.reasoning.effort == effort and r.output_text == "The answer is 4."


def test_reasoning_tool_round_trip(thinker):
    kw = dict(model="qwen3-think", tools=[WEATHER], temperature=0, max_output_tokens=200)
    q = "What is the weather in Paris?"
    first = thinker.responses.create(input=q, store=True, extra_body={"grammar": CALL}, **kw)
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    assert first.output[0].content[0].text == "I need the weather."
    fc = first.output[1]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
    events = list(thinker.responses.create(input=q, extra_body={"grammar": CALL}, stream=True,
                                           **kw))
    assert deltas(events, "response.reasoning_text.delta") == "I need the weather."
    assert deltas(events, "response.function_call_arguments.delta") == fc.arguments
    # the result back, continuing from the stored response
    out = {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}
    second = thinker.responses.create(input=[out], previous_response_id=first.id,
                                      extra_body={"grammar": ANSWER}, **kw)
    assert [o.type for o in second.output] == ["reasoning", "message"]
    assert second.output_text == "It is sunny in Paris."
    # the same turn sent whole (the reasoning item dropped from the prompt)
    items = [{"role": "user", "content": q}] + [o.model_dump(exclude_none=True)
                                                for o in first.output] + [out]
    again = thinker.responses.create(input=items, extra_body={"grammar": ANSWER}, **kw)
    assert again.usage.input_tokens == second.usage.input_tokens
    assert second.usage.input_tokens > first.usage.input_tokens


def test_reasoning_prompt_opened(zinfer_bin, qwen3_file, tmp_path):
    """Qwen 3.5's template opens <think> in the prompt, so the model writes
    only the closing marker; and a server whose --reasoning-format is none
    (chat completions leave the reasoning in the content) still gives
    Responses its reasoning item."""
    with serve_sdk(zinfer_bin, qwen3_file, tmp_path / "serve.log", "--chat-template", QWEN35,
                   "--reasoning-format", "none") as sdk:
        kw = dict(model="qwen3-think", input="What is 2+2?", temperature=0,
                  max_output_tokens=200,
                  extra_body={"grammar": r'root ::= "Two and two make four.\n</think>\n\n'
                                         r'The answer is 4."'})
        whole = sdk.responses.create(**kw)
        assert [o.type for o in whole.output] == ["reasoning", "message"], whole.output
        assert whole.output[0].content[0].text == "Two and two make four."
        assert whole.output_text == "The answer is 4."
        events = list(sdk.responses.create(**kw, stream=True))
        assert deltas(events, "response.reasoning_text.delta") == "Two and two make four."
        assert deltas(events, "response.output_text.delta") == "The answer is 4."
        chat = sdk.chat.completions.create(model="qwen3-think", temperature=0, max_tokens=200,
                                           messages=[{"role": "user", "content": "What is 2+2?"}],
                                           extra_body=kw["extra_body"])
        assert "</think>" in chat.choices[0].message.content
