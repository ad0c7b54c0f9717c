"""Several models behind one `zinfer serve`, on files written here (no
downloaded model needed: a 2-layer llama of width 64 with random weights
and a byte-level vocabulary of 259 tokens):

- each model's tool calls are read in the format of its own chat template
  (zinfer-http's --model-tool-call-format, which serve passes), not the
  default model's: a GLM-4.5 model's calls come back as tool_calls next
  to a generic one's;
- a model whose worker cannot start (a tensor missing) fails the requests
  waiting for it at once with the worker's error (the router's
  model_failed op, which serve sends), not after --failover-timeout; later
  ones are refused with it, the models op lists it "failed", and the
  other model is served on;
- one model's waiting requests take at most --max-queue-per-model of the
  shared queue (half of --max-queue with several models by default);
- a request that arrives while its model loads is checked against the
  context its worker serves (--ctx-size), not the file's.

Each test starts one server: a few seconds each.
"""

import http.client
import json
import time

import pytest

import gguf
from gguf_files import write_random_llama
from test_models_routing import models_serve, states
from zinfer_client import Client, ZinferError

V = gguf.GGUFValueType

# A ChatML template; a GLM-4.5 model's adds the markers that make serve
# detect its tool-call format (never rendered).
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GLM_MARKERS = "{%- if false %}<tool_call><arg_key><arg_value>{% endif %}"


def byte_units():
    """GPT-2's byte -> character map (byte-level BPE's token strings)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:  # the others go past 255, in order
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_model(path, seed, template=CHATML, drop=None):
    """A tiny llama: 256 byte tokens, <|endoftext|> (BOS), <|im_start|>,
    <|im_end|> (EOS); without the tensor `drop` when named (a file a worker
    refuses)."""
    u = byte_units()
    toks = [u[b] for b in range(256)] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    rows = [("tokenizer.ggml.model", "gpt2", V.STRING, None),
            ("tokenizer.ggml.pre", "default", V.STRING, None),
            ("tokenizer.ggml.tokens", toks, V.ARRAY, V.STRING),
            ("tokenizer.ggml.token_type", [1] * 256 + [3] * 3, V.ARRAY, V.INT32),
            ("tokenizer.ggml.merges", [u[ord("a")] + " " + u[ord("b")]], V.ARRAY, V.STRING),
            ("tokenizer.ggml.bos_token_id", 256, V.UINT32, None),
            ("tokenizer.ggml.eos_token_id", 258, V.UINT32, None),
            ("tokenizer.chat_template", template, V.STRING, None)]
    return write_random_llama(path, rows, len(toks), seed, drop)


SERVE = ["--threads-per-worker", 1, "--slots", 2, "--ctx-size", 256]

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
# per format, a grammar holding the output to one call of get_weather
CALL_GRAMMAR = {
    "generic": 'root ::= "<tool_call>{\\"name\\": \\"get_weather\\", \\"arguments\\": '
               '{\\"city\\": \\"Paris\\"}}</tool_call>"',
    "glm-4.5": 'root ::= "Checking.\\n<tool_call>get_weather\\n<arg_key>city</arg_key>\\n'
               '<arg_value>Paris</arg_value>\\n</tool_call>"',
}


def test_tool_calls_in_each_models_format(zinfer_bin, tmp_path):
    """The default model's template writes generic calls, the other's
    GLM-4.5 ones: each request's output is read in its own model's format
    (it used to be read in the default's: the GLM call came back as
    content), so both are tool_calls."""
    plain = write_model(tmp_path / "plain.gguf", 7)
    glm = write_model(tmp_path / "glm.gguf", 8, template=CHATML + GLM_MARKERS)
    with models_serve(zinfer_bin, ["--model", f"plain={plain}", "--model", f"glm={glm}", *SERVE],
                      tmp_path / "serve.log", lambda c: set(states(c).values()) == {"loaded"},
                      http=True) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
        for model, fmt, content in (("glm", "glm-4.5", "Checking."), ("plain", "generic", None)):
            conn.request("POST", "/v1/chat/completions", json.dumps({
                "model": model, "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": WEATHER, "max_tokens": 200, "temperature": 0,
                "grammar": CALL_GRAMMAR[fmt]}), {"Content-Type": "application/json"})
            r = conn.getresponse()
            body = json.loads(r.read())
            assert r.status == 200, body
            choice = body["choices"][0]
            assert choice["finish_reason"] == "tool_calls", (model, body)
            (call,) = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather", body
            assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}, body
            assert (choice["message"]["content"] or None) == content, body
        assert "tool-call format of model glm: glm-4.5" in srv.log(), srv.log()


def test_model_that_cannot_load_fails_its_requests_at_once(zinfer_bin, tmp_path):
    """--models-max 1, --max-queue 4: requests for a model whose worker
    cannot start take at most 2 places (the per-model default, half), the
    third is refused "overloaded"; the two end "unavailable" with the
    worker's own error as soon as its start fails, well before the 60 s
    --failover-timeout they used to wait; a later one is refused with it at
    once; the models op says "failed"; the other model serves on."""
    good = write_model(tmp_path / "good.gguf", 7)
    bad = write_model(tmp_path / "bad.gguf", 9, drop="blk.1.ffn_down.weight")
    with models_serve(zinfer_bin, ["--model", f"good={good}", "--model", f"bad={bad}",
                                   "--models-max", 1, "--max-queue", 4,
                                   "--failover-timeout", 60000, *SERVE],
                      tmp_path / "serve.log", lambda c: states(c).get("good") == "loaded") as srv:
        with Client(srv.addr, timeout_s=90) as c:
            sp = {"max_new_tokens": 8, "ignore_eos": True}
            msg = {"op": "generate", "prompt": "hello", "model_name": "bad", "sampling_params": sp}
            t0 = time.time()
            rids = [c.send(msg) for _ in range(3)]
            ends = [list(c.events(rid))[-1] for rid in rids]
            assert [e["code"] for e in ends] == ["unavailable", "unavailable", "overloaded"], ends
            assert "--max-queue-per-model 2" in ends[2]["message"], ends
            for e in ends[:2]:
                assert "model 'bad' could not be loaded" in e["message"], e
                assert "ffn_down" in e["message"], e  # the worker's own words
            assert time.time() - t0 < 30, srv.log()  # the failed start, not the timeout
            assert states(c)["bad"] == "failed", srv.log()
            t0 = time.time()
            with pytest.raises(ZinferError) as e:
                c.complete(prompt="hello", model_name="bad", sampling_params=sp)
            assert e.value.code == "unavailable" and "ffn_down" in str(e.value), e.value
            assert time.time() - t0 < 5
            _, ids, fin = c.complete(prompt="hello", sampling_params=sp)  # good, loaded again
            assert fin["status"] == "maximum_length" and len(ids) == 8, (fin, srv.log())
        assert srv.proc.poll() is None, srv.log()


def test_loading_model_checked_against_its_workers_context(zinfer_bin, tmp_path):
    """--models-max 1, --ctx-size 64 (the files' own context is 512): a
    request that arrives while its model loads is checked against the 64
    its worker serves, as it is once the model is loaded: 40 prompt tokens
    and min_new_tokens 40 do not fit, refused the same both times (it used
    to be checked against 512 while loading, then ran and stopped at the
    64 with fewer than the 40 tokens it had to have)."""
    a = write_model(tmp_path / "a.gguf", 7)
    b = write_model(tmp_path / "b.gguf", 8)
    with models_serve(zinfer_bin, ["--model", f"a={a}", "--model", f"b={b}", "--models-max", 1,
                                   "--threads-per-worker", 1, "--slots", 2, "--ctx-size", 64],
                      tmp_path / "serve.log", lambda c: states(c).get("a") == "loaded") as srv:
        with Client(srv.addr, timeout_s=60) as c:
            sp = {"max_new_tokens": 40, "min_new_tokens": 40}
            errors = []
            for _ in range(2):  # b loading, then b loaded
                with pytest.raises(ZinferError) as e:
                    c.complete(prompt=[65] * 40, model_name="b", sampling_params=sp)
                errors.append(e.value.reply)
                assert states(c)["b"] == "loaded", srv.log()
            assert [x["code"] for x in errors] == ["invalid_request"] * 2, errors
            assert errors[0]["message"] == errors[1]["message"], errors
            assert "64" in errors[0]["message"], errors
            # what fits runs
            _, ids, fin = c.complete(prompt=[65] * 40, model_name="b",
                                     sampling_params={"max_new_tokens": 100, "ignore_eos": True})
            assert fin["status"] == "maximum_length" and len(ids) == 64 - 40, (fin, ids)
