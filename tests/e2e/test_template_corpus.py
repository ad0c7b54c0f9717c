"""llama.cpp's vendored chat templates rendered by zinfer against jinja2.

$ZINFER_HOME/llama.cpp-vendor/models/templates/*.jinja holds 70 real chat
templates (Llama 3.x, Qwen, Mistral, Gemma, DeepSeek, Hermes, Functionary,
Granite, gpt-oss, ...). tests/fixtures/chat_template_corpus.json.gz holds
jinja2's renderings of each on the conversations of
tests/fixtures/chat_template_conversations.json (made by
scripts/ref/make_template_corpus_fixture.py, in Hugging Face's
apply_chat_template environment). Each template goes through
`zinfer chat-template --template FILE --jsonl` with every case, and must
either

- render equal: every rendering byte for byte jinja2's, and every case
  where jinja2 fails fails in zinfer too (with raise_exception's exact
  message where the template raised, and not for want of a feature unless
  jinja2 also lacked a filter or test), or
- be refused at load (exit 3) with one line naming the construct and its
  line and column.

A rendering that differs, a render that fails where jinja2 rendered, or a
render that succeeds where jinja2 failed is a mismatch, and any mismatch
fails the test (a wrong prompt is worse than a refusal), as does fewer
than MIN_EQUAL templates rendering equal. Skipped when the vendored
templates are absent.

Run from the repo root: ~/.cache/zinfer/venv/bin/python -m pytest tests/e2e
"""

import calendar
import gzip
import hashlib
import json
import os
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from conftest import FIXTURES, ZINFER_BIN, report

ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
TEMPLATE_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models" / "templates"
CORPUS = FIXTURES / "chat_template_corpus.json.gz"
CONVERSATIONS = FIXTURES / "chat_template_conversations.json"
MIN_EQUAL = 60


def requests():
    """(key, request) pairs: the same cases, in the same order, as
    make_template_corpus_fixture.case_requests, plus the fixed `now`."""
    conv = json.loads(CONVERSATIONS.read_text(encoding="utf-8"))
    now = calendar.timegm(datetime.fromisoformat(conv["now"]).timetuple())
    out = []
    for case in conv["cases"]:
        for agp in (False, True):
            req = {"messages": case["messages"], "add_generation_prompt": agp,
                   "bos_token": conv["bos_token"], "eos_token": conv["eos_token"],
                   "variables": case.get("variables", {}), "now": now}
            if "tools" in case:  # "TOOLS" -> conv["tools"], "RICH_TOOLS" -> conv["rich_tools"]
                req["tools"] = conv[case["tools"].lower()]
            out.append((f"{case['name']}/agp{int(agp)}", req))
    return out


def check_template(path, fixture, reqs):
    """("equal", None) | ("refused", message) | ("mismatch", what)."""
    data = path.read_bytes()
    if fixture is None:
        return "mismatch", "not in the fixture (rerun make_template_corpus_fixture.py)"
    if hashlib.sha256(data).hexdigest() != fixture["sha256"]:
        return "mismatch", "sha256 differs from the fixture's (rerun make_template_corpus_fixture.py)"
    stdin = "".join(json.dumps(r, ensure_ascii=False) + "\n" for _, r in reqs)
    p = subprocess.run([str(ZINFER_BIN), "chat-template", "--template", str(path), "--jsonl"],
                       input=stdin.encode(), capture_output=True, timeout=60)
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode == 3:
        lines = err.strip().split("\n")
        assert len(lines) == 1, f"{path.name}: refusal is not one line: {err!r}"
        assert re.search(r"chat template line \d+ col \d+: ", lines[0]), \
            f"{path.name}: refusal does not say where: {lines[0]}"
        return "refused", lines[0].split(": ", 2)[-1]
    assert p.returncode == 0, f"{path.name}: exit {p.returncode}: {err}"
    outs = [json.loads(line) for line in p.stdout.decode("utf-8").splitlines()]
    assert len(outs) == len(reqs), f"{path.name}: {len(outs)} results for {len(reqs)} requests"
    for (key, _), got in zip(reqs, outs):
        exp = fixture["cases"][key]
        if "expected" in exp:
            if "prompt" not in got:
                return "mismatch", f"{key}: jinja2 rendered, zinfer: {got['message']}"
            if got["prompt"] != exp["expected"]:
                a, b = got["prompt"], exp["expected"]
                i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
                return "mismatch", (f"{key}: differs at char {i}: zinfer {a[max(0, i - 40):i + 40]!r} "
                                    f"jinja2 {b[max(0, i - 40):i + 40]!r}")
        else:
            if "prompt" in got:
                return "mismatch", f"{key}: jinja2 failed ({exp['error']}: {exp['message']}), zinfer rendered"
            if exp["error"] == "raise_exception" and got["message"] != exp["message"]:
                return "mismatch", f"{key}: raise_exception {exp['message']!r}, zinfer {got['message']!r}"
            # zinfer failing for want of a feature where jinja2 failed for
            # another reason would hide that feature's absence
            if got["error"] == "unsupported" and "No filter named" not in exp["message"] \
                    and "No test named" not in exp["message"]:
                return "mismatch", (f"{key}: jinja2 failed ({exp['error']}: {exp['message']}), "
                                    f"zinfer lacks a feature: {got['message']}")
    return "equal", None


def test_template_corpus():
    if not TEMPLATE_DIR.is_dir():
        pytest.skip(f"{TEMPLATE_DIR} not found (run scripts/fetch-llamacpp-vendor)")
    corpus = json.loads(gzip.decompress(CORPUS.read_bytes()))
    reqs = requests()
    results = {}
    for path in sorted(TEMPLATE_DIR.glob("*.jinja")):
        results[path.name] = check_template(path, corpus["templates"].get(path.name), reqs)
    equal = sorted(n for n, (k, _) in results.items() if k == "equal")
    refused = {n: m for n, (k, m) in results.items() if k == "refused"}
    mismatch = {n: m for n, (k, m) in results.items() if k == "mismatch"}
    summary = {"templates": len(results), "cases_each": len(reqs), "equal": len(equal),
               "refused": refused, "mismatch": mismatch}
    report("template_corpus", "summary", summary)
    print(json.dumps(summary, indent=1, ensure_ascii=False))
    assert not mismatch, f"{len(mismatch)} templates render differently from jinja2: " + \
        json.dumps(mismatch, indent=1, ensure_ascii=False)
    assert len(equal) >= MIN_EQUAL, f"only {len(equal)} of {len(results)} templates render equal"


def run_cli(tmp_path, template, request, *flags):
    path = tmp_path / "t.jinja"
    path.write_text(template, encoding="utf-8")
    stdin = request if isinstance(request, str) else json.dumps(request)
    return subprocess.run([str(ZINFER_BIN), "chat-template", "--template", str(path), *flags],
                          input=stdin.encode(), capture_output=True, timeout=30)


def test_cli_renders_and_refuses(tmp_path):
    """`zinfer chat-template` without the vendored files: a rendering with
    tool calls, a refusal at load (exit 3, one located line), a render
    failure (exit 1), and --jsonl's per-line results."""
    tmpl = ("{% for m in messages %}{{ m.role }}:{{ m.content if m.content is not none else '-' }}"
            "{% for c in m.tool_calls or [] %}[{{ c.function.name }}({{ c.function.arguments | tojson }})]"
            "{% endfor %}{% if m.tool_call_id %}<{{ m.tool_call_id }}>{% endif %}\n{% endfor %}"
            "{{ tools | map(attribute='function.name') | join(',') if tools is defined else 'no tools' }}"
            "|{{ strftime_now('%Y-%m-%d') }}|{{ x }}{% if add_generation_prompt %}>{% endif %}")
    req = {"messages": [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "c1", "type": "function",
                             "function": {"name": "f", "arguments": {"b": 1, "a": [True, None]}}}]},
                        {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
           "tools": [{"type": "function", "function": {"name": "f"}}],
           "add_generation_prompt": True, "variables": {"x": 1.5}, "now": 86400 * 365}
    p = run_cli(tmp_path, tmpl, req)
    assert p.returncode == 0, p.stderr
    # (what jinja2 renders: trim_blocks eats the newline after each endif)
    assert p.stdout.decode() == ('user:Hiassistant:-[f({"b": 1, "a": [true, null]})]'
                                 'tool:ok<c1>f|1971-01-01|1.5>')

    p = run_cli(tmp_path, "a\n{{ x | frobnicate }}", {"messages": []})
    assert p.returncode == 3
    assert p.stderr.decode().strip().endswith(
        "chat template line 2 col 8: filter 'frobnicate' is not supported")
    assert len(p.stderr.decode().strip().split("\n")) == 1

    p = run_cli(tmp_path, "{{ raise_exception('no ' ~ messages | length) }}", {"messages": []})
    assert p.returncode == 1
    assert p.stderr.decode() == "zinfer: chat-template: no 0\n"

    lines = "\n".join([json.dumps({"messages": [{"role": "user", "content": "a"}]}), "[1]",
                       json.dumps({"messages": [{"content": "no role"}]}), "{bad json"]) + "\n"
    p = run_cli(tmp_path, "{{ messages[0].content }}", lines, "--jsonl")
    assert p.returncode == 0, p.stderr
    out = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert out[0] == {"prompt": "a"}
    assert out[1]["error"] == "error" and "not a JSON object" in out[1]["message"]
    assert out[2]["message"] == "chat template: messages[0]: not a dict with a string role"
    assert out[3]["error"] == "error" and out[3]["message"].startswith("bad JSON")


# The tool-call families' templates (http/tool_formats.c) and what their
# rendering of family_two_calls (or, where arguments must be a string, of
# family_two_calls_string_args) holds: both calls in the family's format.
# tests/unit/test_tool_formats.c parses exactly these renderings back.
FAMILIES = {
    "Qwen3-Coder.jinja": ("family_two_calls", ["<function=get_weather>\n<parameter=location>\nSão Paulo\n</parameter>",
                                               "<function=search>\n<parameter=query>\na \"quoted\" \\ path\n</parameter>"]),
    "Qwen-Qwen3-0.6B.jinja": ("family_two_calls", ['<tool_call>\n{"name": "get_weather"', '<tool_call>\n{"name": "search"']),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": (
        "family_two_calls", ['<tool_call>\n{"name": "get_weather"', '<tool_call>\n{"name": "search"']),
    # gpt-oss's template renders an assistant message's first call only
    "openai-gpt-oss-120b.jinja": ("family_two_calls", ["<|start|>assistant to=functions.get_weather<|channel|>"
                                                       "commentary json<|message|>{"]),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("family_two_calls", ["<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{",
                                                             "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{"]),
    "deepseek-ai-DeepSeek-V3.2.jinja": (
        "family_two_calls", ['<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                             '<｜DSML｜parameter name="location" string="true">São Paulo</｜DSML｜parameter>',
                             '<｜DSML｜parameter name="filters" string="false">{"year": 2024, "limit": 3}'
                             '</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>']),
    "deepseek-ai-DeepSeek-V4.jinja": (
        "family_two_calls", ['<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n',
                             '<｜DSML｜invoke name="search">\n<｜DSML｜parameter name="query" '
                             'string="true">a "quoted" \\ path</｜DSML｜parameter>']),
    "GLM-4.6.jinja": ("family_two_calls", ["<tool_call>get_weather\n<arg_key>location</arg_key>\n"
                                           "<arg_value>São Paulo</arg_value>",
                                           "<tool_call>search\n<arg_key>query</arg_key>"]),
    "GLM-4.7-Flash.jinja": ("family_two_calls", ["<tool_call>get_weather<arg_key>location</arg_key>"
                                                 "<arg_value>São Paulo</arg_value>",
                                                 "<tool_call>search<arg_key>query</arg_key>"]),
    "ibm-granite-granite-4.0.jinja": (
        "family_two_calls", ['<tool_call>\n{"name": "get_weather"', '<tool_call>\n{"name": "search"']),
    # Kimi-K2-Instruct's and Kimi-K2-Thinking's templates call list.append,
    # which jinja2's sandbox refuses: no jinja2 rendering to compare with
    # (they write moonshotai-Kimi-K2's markup; test_tool_formats.c checks
    # their detection).
    "moonshotai-Kimi-K2.jinja": ("family_two_calls", ["<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{",
                                                      "<|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{"]),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": (
        "family_two_calls", ['<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather"',
                             '"tool_name": "search"']),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": (
        "family_two_calls", ['Action:\n```json\n[\n    {\n        "tool_name": "get_weather"', '"tool_name": "search"']),
    "meetkai-functionary-medium-v3.2.jinja": ("family_two_calls_string_args", [">>>get_weather\n{", ">>>search\n{"]),
    "meetkai-functionary-medium-v3.1.jinja": ("family_two_calls", ["<function=get_weather>{", "<function=search>{"]),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_tool_round_trip(name):
    """Each tool-call family's template renders a round trip (two calls,
    their results, an answer) exactly as jinja2 does, with and without the
    generation prompt, the calls in the family's format; the template is
    not refused."""
    path = TEMPLATE_DIR / name
    if not path.is_file():
        pytest.skip(f"{path} not found (run scripts/fetch-llamacpp-vendor)")
    case, markers = FAMILIES[name]
    fixture = json.loads(gzip.decompress(CORPUS.read_bytes()))["templates"][name]
    reqs = [(k, r) for k, r in requests() if k.split("/")[0] == case]
    assert len(reqs) == 2
    for key, _ in reqs:
        text = fixture["cases"][key].get("expected")
        assert text is not None, f"{key}: jinja2 failed: {fixture['cases'][key]}"
        for m in markers:
            assert m in text, f"{key}: {m!r} not in jinja2's rendering"
    kind, what = check_template(path, fixture, reqs)
    assert kind == "equal", what
