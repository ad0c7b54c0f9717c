"""End-to-end tests of reasoning content in zinfer-http (docs/http.md,
"Reasoning").

A random-weight qwen3 file (3 layers, n_embd 64, Qwen 2's real vocabulary)
is written with Qwen 3's chat template, which lets the model open
`<think>` itself, and served three times: as it is; with Qwen 3.5's
template (--chat-template), which opens the section in the prompt,
--reasoning-format none and --max-thinking-tokens 6; and with a template
that writes its variables into the prompt (reasoning_effort,
chat_template_kwargs), where gpt-oss's harmony channels are also split. A
grammar forces most completions' text, so the reasoning, content and calls
are known exactly: the whole reply's `reasoning_content` and `content`,
the streamed deltas joined to the same, a tool call after the reasoning,
`reasoning_format` none giving the raw text, a thinking budget ending the
section after exactly its tokens, `enable_thinking` / `chat_template_kwargs` changing the rendered
prompt as jinja2 renders it, an assistant's `reasoning_content` reaching
the template, and a table of bad inputs, each a 400 naming its field,
after which the server still serves.
"""

import contextlib
import http.client as httpc
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import free_port, serve_process, wait_http
from gguf_files import tokenizer_rows, write_gguf

openai = pytest.importorskip("openai")

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
VENDOR = HOME / "llama.cpp-vendor" / "models"
VOCAB = VENDOR / "ggml-vocab-qwen2.gguf"
QWEN3 = VENDOR / "templates" / "Qwen-Qwen3-0.6B.jinja"
QWEN35 = VENDOR / "templates" / "Qwen3.5-4B.jinja"

pytestmark = pytest.mark.skipif(
    not (VOCAB.is_file() and QWEN3.is_file() and QWEN35.is_file()),
    reason="the vendored llama.cpp vocabulary and templates are absent")

Q = gguf.GGMLQuantizationType
MODEL = "qwen3-think"  # the file's name, which the server answers to
D, NH, NKV, HD, FF, LAYERS = 64, 4, 2, 16, 128, 3


def write_qwen3(path):
    """A small random qwen3 file with Qwen 2's vocabulary and Qwen 3's
    chat template."""
    rows, n_vocab = tokenizer_rows(VOCAB)
    rows = [r for r in rows if r[0] != "tokenizer.chat_template"]
    rows.append(("tokenizer.chat_template", QWEN3.read_text(encoding="utf-8"),
                 gguf.GGUFValueType.STRING, None))
    rng = np.random.default_rng(7)

    def mat(r, c, sigma=None):
        return (rng.standard_normal((r, c)) * (sigma or 1 / np.sqrt(c))).astype(np.float32), None

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32), None

    t = {"token_embd.weight": (gguf.quants.quantize(mat(n_vocab, D, 0.3)[0], Q.Q8_0), Q.Q8_0),
         "output_norm.weight": norm(D)}
    for L in range(LAYERS):
        p = f"blk.{L}."
        t.update({p + "attn_norm.weight": norm(D), p + "ffn_norm.weight": norm(D),
                  p + "attn_q.weight": mat(NH * HD, D), p + "attn_k.weight": mat(NKV * HD, D),
                  p + "attn_v.weight": mat(NKV * HD, D), p + "attn_output.weight": mat(D, NH * HD),
                  p + "attn_q_norm.weight": norm(HD), p + "attn_k_norm.weight": norm(HD),
                  p + "ffn_gate.weight": mat(FF, D), p + "ffn_up.weight": mat(FF, D),
                  p + "ffn_down.weight": mat(D, FF)})
    hp = {"block_count": LAYERS, "context_length": 1024, "embedding_length": D,
          "feed_forward_length": FF, "attention.head_count": NH, "attention.head_count_kv": NKV,
          "attention.key_length": HD, "attention.value_length": HD,
          "rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6}
    return write_gguf(path, "qwen3", rows, hp, t)



@pytest.fixture(scope="module")
def qwen3_file(tmp_path_factory):
    return write_qwen3(tmp_path_factory.mktemp("reasoning") / "qwen3-think.gguf")


@contextlib.contextmanager
def serving(zinfer_bin, path, log, *args):
    """serve_process with an HTTP front end on a free port, up; yields the
    ServeProcess with .sdk (an openai client) and .port."""
    port = free_port()
    with serve_process(zinfer_bin, path, log, "--threads-per-worker", 1, "--slots", 4,
                       "--http", f"127.0.0.1:{port}", *args) as srv:
        wait_http(port, srv)
        srv.sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                                max_retries=0, timeout=120)
        srv.port = port
        yield srv


@pytest.fixture(scope="module")
def think(zinfer_bin, qwen3_file, tmp_path_factory):
    """The file's own template (Qwen 3: the model opens <think>)."""
    with serving(zinfer_bin, qwen3_file, tmp_path_factory.mktemp("think") / "serve.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def opened(zinfer_bin, qwen3_file, tmp_path_factory):
    """Qwen 3.5's template (the prompt opens <think>), reasoning format none,
    a default thinking budget of 6 tokens."""
    with serving(zinfer_bin, qwen3_file, tmp_path_factory.mktemp("opened") / "serve.log",
                 "--chat-template", QWEN35, "--reasoning-format", "none",
                 "--max-thinking-tokens", 6) as srv:
        yield srv


# Writes the variables it is given, so the prompt's length tells them.
ECHO_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "effort={{ reasoning_effort | default('unset') }} x={{ x | default('unset') }}"
    "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def echo(zinfer_bin, qwen3_file, tmp_path_factory):
    d = tmp_path_factory.mktemp("echo")
    (d / "echo.jinja").write_text(ECHO_TEMPLATE, encoding="utf-8")
    with serving(zinfer_bin, qwen3_file, d / "serve.log", "--chat-template",
                 d / "echo.jinja") as srv:
        yield srv


def req(port, path, body):
    """Raw POST: (status, parsed JSON)."""
    c = httpc.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


def gbnf(text):
    """A grammar whose only sentence is text."""
    return "root ::= " + json.dumps(text)


ASK = [{"role": "user", "content": "What is 2+2?"}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def extra(x, key):
    """A field the SDK's model does not declare (reasoning_content)."""
    return (x.model_extra or {}).get(key)


def whole(sdk, text, **kw):
    kw.setdefault("messages", ASK)
    extra_body = {"grammar": gbnf(text), **kw.pop("extra_body", {})}
    kw.setdefault("max_tokens", 200)
    r = sdk.chat.completions.create(model=MODEL, temperature=0, extra_body=extra_body, **kw)
    return r.choices[0]


def streamed(sdk, text, **kw):
    """The stream's joined reasoning, content, calls and finish_reason, and
    the order of the kinds of deltas (r, c, t)."""
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 200)
    extra_body = {**({"grammar": gbnf(text)} if text else {}), **kw.pop("extra_body", {})}
    reasoning, content, calls, order, finish = "", "", {}, [], None
    for ch in sdk.chat.completions.create(model=MODEL, temperature=0, stream=True,
                                          extra_body=extra_body, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        if extra(d, "reasoning_content"):
            reasoning += extra(d, "reasoning_content")
            order.append("r")
        if d.content:
            content += d.content
            order.append("c")
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function.name:
                c["name"] += tc.function.name
            c["arguments"] += tc.function.arguments or ""
            order.append("t")
        finish = ch.choices[0].finish_reason or finish
    return reasoning, content, calls, order, finish


THOUGHT = "<think>\nTwo and two make four.\n</think>\n\nThe answer is 4."


def test_reasoning_apart(think):
    """The section the model writes is reasoning_content; the stream's
    reasoning deltas come first and join to the whole reply's."""
    c = whole(think.sdk, THOUGHT)
    assert extra(c.message, "reasoning_content") == "Two and two make four."
    assert c.message.content == "The answer is 4." and c.finish_reason == "stop"
    r, t, calls, order, finish = streamed(think.sdk, THOUGHT)
    assert (r, t, calls, finish) == ("Two and two make four.", "The answer is 4.", {}, "stop")
    assert order == sorted(order, key="rc".index) and "r" in order and "c" in order
    # no section: all content, no reasoning_content
    c = whole(think.sdk, "Just 4.")
    assert c.message.content == "Just 4." and extra(c.message, "reasoning_content") is None
    # a section never closed: all reasoning
    c = whole(think.sdk, "<think>\nStill thinking about it")
    assert extra(c.message, "reasoning_content") == "Still thinking about it"
    assert c.message.content == ""


def test_reasoning_format_none_per_request(think):
    c = whole(think.sdk, THOUGHT, extra_body={"reasoning_format": "none"})
    assert c.message.content == THOUGHT and extra(c.message, "reasoning_content") is None
    r, t, calls, _, _ = streamed(think.sdk, THOUGHT, extra_body={"reasoning_format": "none"})
    assert (r, t, calls) == ("", THOUGHT, {})


CALL = ('<think>\nI need the weather in Paris.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call>')


def test_tool_call_after_reasoning(think):
    c = whole(think.sdk, CALL, tools=WEATHER)
    assert extra(c.message, "reasoning_content") == "I need the weather in Paris."
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (tc,) = c.message.tool_calls
    assert tc.function.name == "get_weather"
    assert tc.function.arguments == '{"city": "Paris"}'
    r, t, calls, order, finish = streamed(think.sdk, CALL, tools=WEATHER)
    assert r == "I need the weather in Paris." and t == "" and finish == "tool_calls"
    assert calls == {0: {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert order[0] == "r" and "c" not in order


def hf_render(template, messages, **variables):
    """jinja2 as Hugging Face's apply_chat_template renders."""
    jinja2 = pytest.importorskip("jinja2.sandbox")
    env = jinja2.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=None, eos_token="<|endoftext|>",
                                            **variables)


def n_tokens(port, text):
    st, tok = req(port, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert st == 200, tok
    return tok["count"]


def test_enable_thinking_reaches_the_template(think):
    """enable_thinking false renders Qwen 3's empty section in the prompt
    (as jinja2 does), the same as chat_template_kwargs; the model's text
    then has no section."""
    tmpl = QWEN3.read_text(encoding="utf-8")
    plain = whole(think.sdk, "4.")
    assert plain.message.content == "4."
    base = think.sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1).usage
    off = think.sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1,
                                            extra_body={"enable_thinking": False}).usage
    kw = think.sdk.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}).usage
    assert base.prompt_tokens == n_tokens(think.port, hf_render(tmpl, ASK))
    want = n_tokens(think.port, hf_render(tmpl, ASK, enable_thinking=False))
    assert off.prompt_tokens == kw.prompt_tokens == want > base.prompt_tokens
    # the top-level field wins over the same key in chat_template_kwargs
    both = think.sdk.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": True},
                    "enable_thinking": False}).usage
    assert both.prompt_tokens == want
    c = whole(think.sdk, "Four.", extra_body={"enable_thinking": False})
    assert c.message.content == "Four." and extra(c.message, "reasoning_content") is None


def test_assistant_reasoning_reaches_the_template(think):
    """An assistant turn's reasoning_content (or reasoning) is the
    template's message.reasoning_content: Qwen 3's shows it."""
    tmpl = QWEN3.read_text(encoding="utf-8")
    turn = {"role": "assistant", "content": "Four.", "reasoning_content": "I add."}
    for key in ("reasoning_content", "reasoning"):
        t = {"role": "assistant", "content": "Four.", key: "I add."}
        u = think.sdk.chat.completions.create(model=MODEL, messages=ASK + [t], max_tokens=1).usage
        assert u.prompt_tokens == n_tokens(think.port, hf_render(tmpl, ASK + [turn]))
    bare = [{"role": "assistant", "content": "Four."}]
    u = think.sdk.chat.completions.create(model=MODEL, messages=ASK + bare, max_tokens=1).usage
    assert u.prompt_tokens == n_tokens(think.port, hf_render(tmpl, ASK + bare))
    assert hf_render(tmpl, ASK + bare) != hf_render(tmpl, ASK + [turn])


def test_prompt_opened_section(opened):
    """Qwen 3.5's prompt ends with "<think>\\n": the model writes only the
    closing marker. The server's format is none (the raw text); a request's
    reasoning_format separate splits it."""
    text = "Two and two.\n</think>\n\nFour."
    c = whole(opened.sdk, text)
    assert c.message.content == text and extra(c.message, "reasoning_content") is None
    sep = {"reasoning_format": "separate"}
    c = whole(opened.sdk, text, extra_body=sep)
    assert extra(c.message, "reasoning_content") == "Two and two."
    assert c.message.content == "Four."
    r, t, _, order, _ = streamed(opened.sdk, text, extra_body=sep)
    assert (r, t) == ("Two and two.", "Four.") and order[0] == "r"
    # thinking off: the prompt closes the section; all content
    c = whole(opened.sdk, "Four.", extra_body={**sep, "enable_thinking": False})
    assert c.message.content == "Four." and extra(c.message, "reasoning_content") is None
    # the tool call after the reasoning, the section opened by the prompt
    call = CALL[len("<think>\n"):]
    c = whole(opened.sdk, call, tools=WEATHER, extra_body=sep)
    assert extra(c.message, "reasoning_content") == "I need the weather in Paris."
    assert c.message.tool_calls[0].function.arguments == '{"city": "Paris"}'


def test_template_variables(echo):
    """reasoning_effort and chat_template_kwargs are the template's
    variables: the prompt is the one rendered with them."""
    def prompt_tokens(**body):
        u = echo.sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1,
                                             extra_body=body).usage
        return u.prompt_tokens

    def want(effort, x):
        # (jinja drops the template's last newline)
        text = f"<|im_start|>user\n{ASK[0]['content']}<|im_end|>\neffort={effort} x={x}" \
               "<|im_start|>assistant"
        return n_tokens(echo.port, text)

    assert prompt_tokens() == want("unset", "unset")
    assert prompt_tokens(reasoning_effort="high") == want("high", "unset")
    assert prompt_tokens(chat_template_kwargs={"x": "a b c d e f"}) == want("unset", "a b c d e f")
    assert prompt_tokens(chat_template_kwargs={"reasoning_effort": "some other words", "x": 7},
                         reasoning_effort="low") == want("low", "7")
    assert want("unset", "unset") != want("unset", "a b c d e f")


HARMONY = ("<|channel|>analysis<|message|>The user asks for 2+2. Simple.<|end|><|start|>assistant"
           "<|channel|>final<|message|>It is 4.")
HARMONY_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                '{"city": "Paris"}')


def test_harmony_channels(echo):
    """gpt-oss's harmony messages: analysis is the reasoning, final the
    content, a commentary message to functions.NAME a call."""
    c = whole(echo.sdk, HARMONY)
    assert extra(c.message, "reasoning_content") == "The user asks for 2+2. Simple."
    assert c.message.content == "It is 4."
    r, t, calls, order, _ = streamed(echo.sdk, HARMONY)
    assert (r, t, calls) == ("The user asks for 2+2. Simple.", "It is 4.", {})
    assert order == sorted(order, key="rc".index)
    c = whole(echo.sdk, HARMONY_CALL, tools=WEATHER)
    assert extra(c.message, "reasoning_content") == "Need the weather."
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert c.message.tool_calls[0].function.name == "get_weather"
    assert c.message.tool_calls[0].function.arguments == '{"city": "Paris"}'
    r, t, calls, _, finish = streamed(echo.sdk, HARMONY_CALL, tools=WEATHER)
    assert (r, t, finish) == ("Need the weather.", "", "tool_calls")
    assert calls == {0: {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    c = whole(echo.sdk, HARMONY, extra_body={"reasoning_format": "none"})
    assert c.message.content == HARMONY


END = "\n</think>\n\n"  # what the budget forces


def test_thinking_budget(opened, think):
    """max_thinking_tokens: after that many tokens of reasoning the section
    is ended ("\n</think>\n\n" forced), and the answer follows."""
    body = dict(model=MODEL, messages=ASK, max_tokens=24, temperature=0, logprobs=True,
                extra_body={"max_thinking_tokens": 5, "ignore_eos": True})
    r = opened.sdk.chat.completions.create(**body)
    raw = r.choices[0].message.content  # the server's format is none
    toks = [t.token for t in r.choices[0].logprobs.content]
    k = n_tokens(opened.port, END)
    assert len(toks) == 24 and "".join(toks[5:5 + k]) == END, toks
    at = raw.index(END)
    assert "</think>" not in raw[:at]
    body["extra_body"] = {**body["extra_body"], "reasoning_format": "separate"}
    m = opened.sdk.chat.completions.create(**body).choices[0].message
    assert extra(m, "reasoning_content") == raw[:at].strip()
    assert m.content == raw[at + len(END):].lstrip()
    # streamed: the same
    r, t, _, _, _ = streamed(opened.sdk, None, max_tokens=24, extra_body={
        "max_thinking_tokens": 5, "ignore_eos": True, "reasoning_format": "separate"})
    assert (r, t) == (raw[:at].strip(), m.content)
    # the server's default budget (--max-thinking-tokens 6)
    body["extra_body"] = {"ignore_eos": True}
    r = opened.sdk.chat.completions.create(**body)
    toks = [t.token for t in r.choices[0].logprobs.content]
    assert "".join(toks[6:6 + k]) == END, toks
    # a larger budget than the text: nothing forced
    body["extra_body"] = {"max_thinking_tokens": 100, "ignore_eos": True}
    assert END not in opened.sdk.chat.completions.create(**body).choices[0].message.content
    # no section (the model did not open one): no budget
    body["extra_body"] = {"max_thinking_tokens": 1, "ignore_eos": True,
                          "reasoning_format": "none"}
    assert "</think>" not in think.sdk.chat.completions.create(**body).choices[0].message.content
    # a forced end would break a grammar: refused
    body["extra_body"] = {"max_thinking_tokens": 3, "grammar": gbnf("x")}
    st, err = req(opened.port, "/v1/chat/completions", {**body, **body.pop("extra_body")})
    assert st == 400 and err["error"]["param"] == "max_thinking_tokens", err


# A harmony template whose generation prompt opens the analysis channel
# (gpt-oss's own ends with <|start|>assistant and the model opens it).
HARMONY_OPEN_TEMPLATE = (
    "{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
    "{% endfor -%}<|start|>assistant<|channel|>analysis<|message|>")
HEND = "<|end|><|start|>assistant<|channel|>final<|message|>"  # what the budget forces


@pytest.fixture(scope="module")
def harmony_open(zinfer_bin, qwen3_file, tmp_path_factory):
    d = tmp_path_factory.mktemp("harmony")
    (d / "harmony.jinja").write_text(HARMONY_OPEN_TEMPLATE, encoding="utf-8")
    with serving(zinfer_bin, qwen3_file, d / "serve.log", "--chat-template",
                 d / "harmony.jinja") as srv:
        yield srv


def test_thinking_budget_harmony(harmony_open):
    """max_thinking_tokens on gpt-oss's harmony: the analysis channel (here
    opened by the prompt) is ended after that many tokens by the forced
    `<|end|><|start|>assistant<|channel|>final<|message|>`; the reasoning is
    the analysis body, the content the final one, streamed or not."""
    srv = harmony_open
    body = dict(model=MODEL, messages=ASK, max_tokens=30, temperature=0, logprobs=True,
                extra_body={"max_thinking_tokens": 5, "ignore_eos": True,
                            "reasoning_format": "none"})
    r = srv.sdk.chat.completions.create(**body)
    raw = r.choices[0].message.content
    toks = [t.token for t in r.choices[0].logprobs.content]
    k = n_tokens(srv.port, HEND)
    assert len(toks) == 30 and "".join(toks[5:5 + k]) == HEND, toks
    at = raw.index(HEND)
    body["extra_body"] = {**body["extra_body"], "reasoning_format": "separate"}
    m = srv.sdk.chat.completions.create(**body).choices[0].message
    assert extra(m, "reasoning_content") == raw[:at]
    assert m.content == raw[at + len(HEND):]
    rs, t, _, _, _ = streamed(srv.sdk, None, max_tokens=30, extra_body={
        "max_thinking_tokens": 5, "ignore_eos": True, "reasoning_format": "separate"})
    assert (rs, t) == (raw[:at], m.content)
    # without a budget the analysis runs on: no forced end
    body["extra_body"] = {"ignore_eos": True, "reasoning_format": "none"}
    assert HEND not in srv.sdk.chat.completions.create(**body).choices[0].message.content


BAD = [
    ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ({"chat_template_kwargs": 5}, "chat_template_kwargs"),
    ({"chat_template_kwargs": True}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"": 1}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ({"enable_thinking": "yes"}, "enable_thinking"),
    ({"enable_thinking": 1}, "enable_thinking"),
    ({"enable_thinking": {}}, "enable_thinking"),
    ({"reasoning_effort": 3}, "reasoning_effort"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning_effort": True}, "reasoning_effort"),
    ({"reasoning_format": 1}, "reasoning_format"),
    ({"reasoning_format": "raw"}, "reasoning_format"),
    ({"reasoning_format": ["none"]}, "reasoning_format"),
    ({"max_thinking_tokens": "10"}, "max_thinking_tokens"),
    ({"max_thinking_tokens": 0}, "max_thinking_tokens"),
    ({"max_thinking_tokens": -5}, "max_thinking_tokens"),
    ({"max_thinking_tokens": 1.5}, "max_thinking_tokens"),
    ({"max_thinking_tokens": 1000001}, "max_thinking_tokens"),
    ({"messages": ASK + [{"role": "assistant", "content": "4", "reasoning_content": 5}]},
     "messages[1].reasoning_content"),
    ({"messages": ASK + [{"role": "assistant", "content": "4", "reasoning": []}]},
     "messages[1].reasoning"),
    ({"messages": [{"role": "user", "content": "hi", "reasoning_content": "x"}]},
     "messages[0].reasoning_content"),
]


def test_bad_inputs(think):
    for extra_fields, field in BAD:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 2, **extra_fields}
        st, r = req(think.port, "/v1/chat/completions", body)
        assert st == 400, (extra_fields, r)
        assert r["error"]["param"] == field, (extra_fields, r)
        assert r["error"]["message"].startswith(field), (extra_fields, r)
    # and it serves on
    assert whole(think.sdk, THOUGHT).message.content == "The answer is 4."
