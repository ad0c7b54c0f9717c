#!/usr/bin/env python3
"""Writes tests/fixtures/chat_templates/expected.json: jinja2's renderings of
the chat templates in tests/fixtures/chat_templates/*.jinja for a set of
message lists, plus short template snippets, for tests/unit/test_chat_template.c
to compare the C engine against byte for byte.

The environment is the one Hugging Face transformers' apply_chat_template
builds: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
with the loopcontrols extension and a {% generation %} tag, a tojson filter
that is json.dumps(ensure_ascii=False, ...), and the raise_exception and
strftime_now globals. Templates get `messages`, `add_generation_prompt`,
`bos_token` and `eos_token`, which is what zinfer's renderer passes.

The "var_cases" add a request's extra variables, as
apply_chat_template(messages, tools=tools, **chat_template_options) passes
them: `tools` (only when the list is not empty: zinfer leaves it undefined
otherwise, as tools=None does) and one variable per option. The C test feeds
each case to the renderer twice: as a zi_chat_value tree built from the JSON,
and as msgpack through chat_template/chat_vars.h.

smollm2.jinja is the default model's own template, read from its GGUF
metadata (tokenizer.chat_template) when the model file is present; the other
.jinja files are the published formats of common model families written out
by hand, plus two synthetic ones (features, whitespace_crlf) that exercise
the engine's features.

Usage: /root/.cache/zinfer/venv/bin/python scripts/ref/make_chat_template_fixtures.py
       [--model PATH] [--out PATH]
"""
import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE_DIR = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
DEFAULT_MODEL = "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# (file stem, bos_token, eos_token). smollm2's come from the GGUF when present.
TEMPLATES = [
    ("smollm2", "<|im_start|>", "<|im_end|>"),
    ("chatml", "<s>", "</s>"),
    ("qwen2", "<|endoftext|>", "<|im_end|>"),
    ("qwen2_5", "<|endoftext|>", "<|im_end|>"),
    ("llama2", "<s>", "</s>"),
    ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    ("llama3_1", "<|begin_of_text|>", "<|eot_id|>"),
    ("mistral_v0_1", "<s>", "</s>"),
    ("mistral_v0_3", "<s>", "</s>"),
    ("gemma", "<bos>", "<eos>"),
    ("phi3", "<s>", "<|endoftext|>"),
    ("zephyr", "<s>", "</s>"),
    ("vicuna", "<s>", "</s>"),
    ("deepseek_v2", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("deepseek_coder", "<｜begin▁of▁sentence｜>", "<|EOT|>"),
    ("deepseek_r1", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("features", "<BOS>", "<EOS>"),
    ("whitespace_crlf", "<s>", "</s>"),
]


def msg(role, content):
    return {"role": role, "content": content}


def conversation(n):
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(msg("user", f"Question number {i // 2 + 1}: what is {i} + {i}?"))
        else:
            out.append(msg("assistant", f"<think>{i - 1} plus {i - 1}</think>It is {2 * (i - 1)}."))
    return out


MESSAGE_SETS = [
    ("single_user", [msg("user", "Hello!")]),
    ("system_user", [msg("system", "You are a concise assistant."), msg("user", "What is 2+2?")]),
    ("multi_turn", [msg("system", "You are helpful."), msg("user", "Hi there"),
                    msg("assistant", "Hello! How can I help?"), msg("user", "Tell me a joke.")]),
    ("no_system", [msg("user", "Hi"), msg("assistant", "Hello."), msg("user", "Bye"),
                   msg("assistant", "Goodbye!")]),
    ("empty_content", [msg("user", ""), msg("assistant", ""), msg("user", "")]),
    ("system_empty", [msg("system", ""), msg("user", "ok")]),
    ("unicode", [msg("user", "Привет, 世界! 🚀 café naïve — “quotes” and\u00a0nbsp"),
                 msg("assistant", "  Ответ: 42\t\n"), msg("user", "ελληνικά ✓ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢")]),
    ("jinja_lookalike", [msg("user", "{{ x }} {% if true %}yes{% endif %} {# c #} {%- raw %} {{ messages }}"),
                         msg("assistant", "<|im_end|> </s> [INST] {{ raise_exception('no') }}"),
                         msg("user", "'single' \"double\" \\backslash %} }} #}")]),
    ("whitespace", [msg("system", "  padded system  \n"), msg("user", "\n\nleading newlines"),
                    msg("assistant", "trailing spaces   "), msg("user", " \t mixed \r\n line endings \r\n")]),
    ("long_conversation", conversation(12)),
    ("assistant_first", [msg("assistant", "I start."), msg("user", "ok")]),
    ("bad_alternation", [msg("user", "a"), msg("user", "b")]),
    ("tool_role", [msg("user", "Weather in Paris?"), msg("tool", '{"temp_c": 21}'), msg("user", "thanks")]),
]

# Short templates checking one behaviour each; rendered with SNIPPET_CONTEXT.
SNIPPET_MESSAGES = [msg("system", "Be brief."), msg("user", "Hello, world"),
                    msg("assistant", "Hi! 👋"), msg("user", "  spaced  ")]
SNIPPETS = [
    # whitespace control
    "a\n{% if true %}\nb\n{% endif %}\nc",
    "  {% if true %}x{% endif %}  \n  {% if true -%}\n   y\n  {%- endif %}",
    "{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n",
    "x  {{- ' y ' -}}  z",
    "line\n    {#- comment #}\nnext",
    "  {#+ c #}kept\n{# c +#}\nx",
    "keep\n\n\n",
    "\r\nwin\r\nlines\r\n{% if true %}\r\nz\r\n{% endif %}\r\n",
    "{% raw %}{{ x }}{% endraw %}|{%- raw -%}  y  {%- endraw -%}|",
    "a {%+ if true %}b{% endif %}",
    "\u3000 {% if true %}ideographic space{% endif %}",
    # scoping
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in range(3) %}{% if i == 1 %}{% set y = 'a' %}{% endif %}[{{ y }}]{% endfor %}",
    "{% if true %}{% set z = 3 %}{% endif %}{{ z }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }} {{ ns }}",
    "{% macro m(a, b=a ~ '!') %}<{{ a }}{{ b }}{{ g }}>{% endmacro %}{% set g = 'G' %}{{ m(1) }}{{ m('x', b='y') }}{% for i in [1] %}{% set g = 'L' %}{{ m(i) }}{% endfor %}",
    "{% macro m(x) %}{% if x > 0 %}{{ x }},{{ m(x - 1) }}{% endif %}{% endmacro %}{{ m(5) }}",
    "{% set messages = messages[1:] %}{{ messages | length }}{{ messages[0].role }}",
    # expressions and values
    "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 17 % 5 }} {{ -17 // 5 }} {{ 17.0 // 5 }}",
    "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123 }} {{ 1/3 }} {{ 2.0 }} {{ -0.0 }} {{ 1e-5 }} {{ 0.0001 }} {{ 3.14e100 }}",
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == [1] }} {{ [1] == (1,) }} {{ {'a': 1} == {'a': 1} }} {{ none == false }} {{ 'a' < 'b' < 'c' }} {{ 3 > 2 > 2 }}",
    "{{ 'abc' ~ 1 ~ none ~ [1] ~ {'a': 'b'} }} {{ 'x' * 3 }} {{ [0] * 3 }} {{ 3 * 'ab' }} {{ [1] + [2] }} {{ (1,) + (2,) }}",
    "{{ not 0 }} {{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' or none }} {{ none and 1 }} {{ not not 'a' }}",
    "{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' if 0 else 'maybe' }} [{{ 'x' if false }}]",
    "{{ 'abcdef'[1:] }} {{ 'abcdef'[:-2] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-100:100] }} {{ 'abcdef'[4:1:-1] }} {{ [1, 2, 3][1:] }} {{ [1, 2, 3][::-2] }} {{ 'héllo'[1] }} {{ 'héllo'[-1] }}",
    "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].content }} {{ messages.0.role }} [{{ messages[99] }}] [{{ messages[0].nope }}] [{{ 'abc'[10] }}]",
    "{{ messages }}",
    "{{ 'a\tb\\n\x00\x7f\u00a0é\u200b🙂' }} {{ ['a\tb', '\x00\x7f\u00a0é\u200b🙂', \"'\", '\"', '\\'\"'] }}",
    "{{ (1, 'a') }} {{ () }} {{ (1,) }} {{ [none, true, false, 1.5, -3] }} {{ {1: 'int key', 'k': (1, 2)} }}",
    "{{ 'Hello' in 'Hello world' }} {{ 'z' not in 'abc' }} {{ 2 in [1, 2] }} {{ 'role' in messages[0] }} {{ 'x' in undefined_var }}",
    # filters
    "{{ '  Mixed Case  ' | trim | lower }}|{{ 'hello world-wide (web)' | title }}|{{ \"it's a test\" | title }}|{{ 'hELLO' | capitalize }}|{{ 'abc' | upper }}",
    "{{ messages | length }} {{ 'héllo' | length }} {{ {'a': 1} | length }} {{ undefined_var | length }} {{ 'héllo' | count }}",
    "{{ messages | map(attribute='role') | join(', ') }} {{ messages | selectattr('role', 'eq', 'user') | map(attribute='content') | list }} {{ messages | rejectattr('content') | list }}",
    "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ messages | sort(attribute='role') | map(attribute='content') | join('/') }}",
    "{{ [1, 2, 3] | sum }} {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ [] | first }}| {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }}",
    "{{ undefined_var | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }} {{ 0 | d('zero', boolean=true) }}",
    "{{ '12' | int }} {{ ' 7 ' | int }} {{ '1_000' | int }} {{ '3.9' | int }} {{ 'x' | int(-1) }} {{ 3.9 | int }} {{ '0x1A' | int(0, 16) }} {{ '2.5' | float }} {{ 'nan?' | float(1.5) }} {{ true | int }}",
    "{{ 'aXbXc' | replace('X', '-') }} {{ 'aXbXc' | replace('X', '-', 1) }} {{ 'abc' | replace('', '.') }} {{ 'a.b.c'.split('.') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }}",
    "{{ {'a': 1, 'b': [1, 2]} | tojson }} {{ 'é\"\\n\u2028' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }} {{ '🙂' | tojson(ensure_ascii=true) }} {{ [1, {'x': none}] | tojson(indent=2) }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ {} | tojson(indent=2) }} {{ [] | tojson }}",
    "{{ 1.5 | tojson }} {{ 10 | tojson }} {{ true | tojson }} {{ none | tojson }} {{ (1, 2) | tojson }} {{ {1: 2, none: 3, true: 4} | tojson }}",
    "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, first=true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}",
    "{{ '<a href=\"x\">&</a>' | escape }} {{ 'x' | safe }} {{ 42 | string }} {{ [1, 'a'] | string }} {{ -5 | abs }} {{ -2.5 | abs }}",
    "{{ {'b': 1, 'a': 2} | items | list }} {% for k, v in {'x': 1}.items() %}{{ k }}{{ v }}{% endfor %} {{ {'a': 1}.keys() | list }}",
    "{{ [1, 2, 3, 4, 5] | select('odd') | list }} {{ [1, 2, 3, 4, 5] | reject('divisibleby', 2) | list }} {{ [0, 1, '', 'a'] | select | list }} {{ ['a', 'B'] | map('lower') | list }} {{ [1, 2] | map('string') | join('+') }}",
    # string methods
    "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ 'hello world'.title() }}|{{ 'HELLO'.lower() }}|{{ 'abc'.upper() }}|{{ 'hELLO wORLD'.capitalize() }}",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ 'aaa'.replace('a', 'b', 2) }}",
    # tests
    "{{ 'x' is string }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is boolean }} {{ none is none }} {{ x is defined }} {{ x is undefined }} {{ messages is iterable }} {{ messages[0] is mapping }} {{ 'a' is sequence }}",
    "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is lower }} {{ 'A' is upper }} {{ 1 is eq 1 }} {{ 2 is gt(1) }} {{ 2 is in [1, 2] }} {{ none is sameas none }} {{ raise_exception is callable }} {{ true is true }} {{ 1 is true }}",
    # loops
    "{% for x in [] %}{{ x }}{% else %}empty{% endfor %} {% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% endfor %}",
    "{% for c in 'héllo' %}{{ c }}.{% endfor %} {% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %} {% for x in undefined_var %}never{% endfor %}",
    "{% for i in range(5) %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %} {% for i in range(10, 0, -3) %}{{ i }},{% endfor %} {% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{{ loop.first }}{% endfor %}|{{ loop.last }} {% endfor %}",
    "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ m.role }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }} {% endfor %}",
    "{% for x in [(1, 'a'), (2, 'b')] %}{% set n, s = x %}{{ n }}{{ s }}{% endfor %} {% for (a, b) in [[1, 2]] %}{{ a + b }}{% endfor %}",
    # blocks
    "{% set b %}  body {{ 1 + 1 }}  {% endset %}[{{ b }}]{% set c | trim | upper %}  x  {% endset %}[{{ c }}]",
    "{% filter replace('a', 'o') %}banana {{ 'cat' }}{% endfilter %}",
    "{% generation %}{% set inner = 1 %}gen{{ inner }}{% endgeneration %}[{{ inner }}]",
    "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ tools is defined }}",
    # concatenation results are extended in place; older values must not change
    "{% set a = 'x' + 'y' %}{% set b = a + '1' %}{% set c = a + '2' %}{{ a }} {{ b }} {{ c }} {{ b + c }} {{ a ~ 3 ~ a }} {{ a }}",
    "{% set a = [1] + [2] %}{% set b = a + [3] %}{% set c = a + [4] %}{{ a }} {{ b }} {{ c }} {{ b + c }} {{ a }}",
    "{% set ns = namespace(s='', l=[]) %}{% for m in messages %}{% set ns.s = ns.s + m.role[0] %}{% set ns.l = ns.l + [loop.index] %}{% endfor %}{{ ns.s }} {{ ns.l }} {{ ns.s ~ '!' }}",
    # generators, ranges and views
    "{% if [] | select %}a generator is truthy{% endif %} {{ [1, 2] | map('string') | join }} {% set g = [1, 2] | select %}{{ g | list }}{{ g | list }}",
    "{{ range(3) }} {{ range(1, 10, 3)[1:] }} {{ range(5)[::-1] }} {{ range(3) | list }} {{ range(3) | length }} {{ range(3)[-1] }}",
    "{{ 2.5 is even }} {{ 0.1 is odd }} {{ 4.0 is even }} {{ false | map('upper') | list }} {{ none | select | list }} {{ 0 | reject('x') | list }}",
    "{{ [1, 2] | reverse | join }} {{ {'a': 1} | items | list }} {{ {'a': 1}.items() }} {{ {'a': 1}.keys() }} {{ {'a': 1}.values() }} {{ 'ab' | reverse }}",
    "{{ [1] | map('string') | length }}",
    "{{ [1, 2] | select | last }}",
    "{{ undefined_var | int }}",
    "{% set x = 5 %}{{ x[1:] }}",
    "{{ messages[0][1:] }}",
    "{{ {'a': 1} in {'b': 2} }}",
    # dictsort, min, max, str.format, Markup (safe / escape) with +
    "{% for k, v in {'b': 1, 'A': 2, 'c': 0, 'a': 3} | dictsort %}{{ k }}={{ v }};{% endfor %}|"
    "{{ {'b': 1, 'A': 2, 'a': 3} | dictsort(true) }}|{{ {'x': 2, 'y': 1, 'z': 2} | dictsort(by='value') }}|"
    "{{ {'x': 2, 'y': 1} | dictsort(reverse=true) }}|{{ {} | dictsort }}",
    "{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A', 'a'] | min }} {{ ['b', 'A', 'a'] | max }} "
    "{{ ['b', 'A', 'a'] | min(case_sensitive=true) }} {{ messages | max(attribute='content') }} "
    "{{ messages | min(attribute='role') }} [{{ [] | min }}] {{ [1, 1.0] | max }} {{ [2, 1] | min is number }}",
    "{{ '<a{}b{}>'.format(1, 'x') }}|{{ '{1}{0}{1}'.format('a', 'b') }}|{{ '{x}-{y}'.format(x=1, y=[2]) }}|"
    "{{ '{{}}{}'.format(none) }}|{{ 'é{}ü'.format('中') }}",
    "{{ '{}{0}'.format(1) }}",
    "{{ '{'.format(1) }}",
    "{{ '{} {}'.format(1) }}",
    "{{ \"a'\" | safe + \"<b>&'\" + 'c\"' }}|{{ 'x<' + '&y' | safe }}|{{ 'p' | e + '<' }}|"
    "{{ ('<' | e) + ('<' | e) }}|{{ '<' | safe ~ '<' }}|{{ ('a' | safe + 'b') | length }}|"
    "{{ ('\\'' | safe + {'k': \"v'\"} | tojson) }}",
    # errors (the test checks that the engine fails too; raise_exception also its message)
    "{{ raise_exception('Custom failure: ' ~ messages | length) }}",
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
    "{{ undefined_var + 1 }}",
    "{{ undefined_var.attr }}",
    "{{ messages[9].role }}",
    "{{ 'a' + 1 }}",
    "{{ 1 // 0 }}",
    "{{ 'a' < 1 }}",
    "{{ 1 in 'abc' }}",
    "{% set x = 1 %}{% set x.y = 2 %}",
    "{% for a, b in [1, 2] %}{% endfor %}",
    "{{ none | tojson }}{{ undefined_var | tojson }}",
    "{{ range(200000) | length }}",
    "{% for %}",
    "{% if true %}unclosed",
    "{{ 1 + }}",
    "{{ (1 }}",
    "{% endfor %}",
    "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
]

# Tools as a client sends them (the seed's TokenGeneratorRequestTool): JSON
# schema parameters with nested objects, arrays, numbers, booleans and null.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Answers in \"units\" it is told.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 1},
                "min_temp": {"type": "number", "minimum": -273.15, "multipleOf": 0.5},
                "precision": {"type": "number", "default": 1e-07},
                "hourly": {"type": "boolean", "default": False},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    }},
    {"type": "function", "function": {
        "name": "search_web",
        "description": "Search the web — returns ranked results ✓",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": ["integer", "null"], "default": None, "maximum": 12345678901234},
                "threshold": {"type": "number", "default": 0.75, "exclusiveMaximum": 1.5e300},
                "safe": {"type": "boolean", "default": True},
                "filters": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"field": {"type": "string"}, "values": {"type": "array", "items": {}}},
                }, "maxItems": 5, "default": []},
                "empty": {},
            },
            "required": ["query", "filters"],
        },
    }},
]
MINIMAL_TOOL = [{"type": "function", "function": {"name": "noop"}}]

# An option value exercising every kind, for the dict-behaviour snippets.
CFG = {
    "name": "zinfer",
    "quote": "it's \"quoted\"\tand\nnewline é 🙂",
    "n": 3,
    "neg": -42,
    "f": 2.5,
    "small": 1e-05,
    "big": 1e+22,
    "yes": True,
    "no": False,
    "nothing": None,
    "nested": {"list": [1, "two", 3.0, None, [True], {}], "z": {"a": []}},
}

VAR_SNIPPET_MESSAGES = [msg("system", "Be brief."), msg("user", "Hello, world")]

# (name, template file or None, inline template or None, messages, tools, options, agp)
VAR_CASES = [
    ("llama3_1_tools_user", "llama3_1", None, [msg("user", "What's the weather in Paris?")],
     TOOLS, {}, True),
    ("llama3_1_tools_system_date", "llama3_1", None,
     [msg("system", "You are a tool user."), msg("user", "Find news about cats.")],
     TOOLS, {"date_string": "03 Mar 2025"}, True),
    ("llama3_1_tools_in_system", "llama3_1", None,
     [msg("system", "You are a tool user."), msg("user", "Weather?"), msg("assistant", "Where?"),
      msg("user", "Oslo")],
     TOOLS, {"tools_in_user_message": False}, False),
    ("llama3_1_date_only", "llama3_1", None, [msg("user", "What day is it?")],
     [], {"date_string": "1 Jan 2030"}, True),
    ("llama3_1_builtin_tools", "llama3_1", None, [msg("user", "Look it up.")],
     [], {"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]}, True),
    ("llama3_1_custom_tools", "llama3_1", None, [msg("user", "Hi")],
     [], {"custom_tools": MINIMAL_TOOL + TOOLS[:1], "date_string": "26 Jul 2024"}, True),
    ("llama3_1_tools_no_user", "llama3_1", None, [msg("system", "Only a system message.")],
     TOOLS, {}, True),
    ("llama3_1_empty_tools", "llama3_1", None, [msg("user", "Hello!")], [], {}, True),
    ("qwen2_5_tools_user", "qwen2_5", None, [msg("user", "What's the weather in Paris?")],
     TOOLS, {}, True),
    ("qwen2_5_tools_system", "qwen2_5", None,
     [msg("system", "You are a tool user."), msg("user", "Weather?"), msg("assistant", "Where?"),
      msg("user", "Oslo")],
     TOOLS, {}, False),
    ("qwen2_5_minimal_tool", "qwen2_5", None, [msg("user", "Do nothing.")], MINIMAL_TOOL, {}, True),
    ("qwen2_5_unused_option", "qwen2_5", None, [msg("user", "Hello!")], [],
     {"enable_thinking": False}, True),
    ("mistral_v0_3_tools", "mistral_v0_3", None, [msg("user", "Weather in Rome?")], TOOLS, {}, True),
    ("thinking_on", None,
     "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
     "{{ enable_thinking }}|{{ enable_thinking is boolean }}|{{ enable_thinking is defined }}",
     VAR_SNIPPET_MESSAGES, [], {"enable_thinking": True}, True),
    ("thinking_off", None,
     "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
     "{{ enable_thinking }}|{{ enable_thinking is boolean }}|{{ enable_thinking is defined }}",
     VAR_SNIPPET_MESSAGES, [], {"enable_thinking": False}, True),
    ("thinking_absent", None,
     "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
     "{{ enable_thinking }}|{{ enable_thinking is boolean }}|{{ enable_thinking is defined }}",
     VAR_SNIPPET_MESSAGES, [], {}, True),
    ("tools_access", None,
     "{% for t in tools %}{{ loop.index }}:{{ t.function.name }}|{{ t['function']['description'] }}|"
     "{{ t.type }}|{{ t is mapping }}{{ t.type is string }}{{ t.function.parameters.properties is mapping }}|"
     "{% for k, v in t.function.parameters.properties | items %}{{ k }}={{ v.type }}"
     "{% if v.default is defined %}({{ v.default }}){% endif %};{% endfor %}|"
     "{{ t.function.parameters.required }}|{{ t.function.keys() | list }}|{{ t.function.get('nope', 'dflt') }}\n"
     "{% endfor %}{{ tools | length }} {{ tools is defined }} {{ tools | map(attribute='function.name') | join(',') }}",
     VAR_SNIPPET_MESSAGES, TOOLS, {}, True),
    ("tools_print", None, "{{ tools }}", VAR_SNIPPET_MESSAGES, TOOLS, {}, True),
    ("tools_tojson", None,
     "{{ tools | tojson }}\n{{ tools[0] | tojson(indent=2) }}\n{{ tools[1].function.parameters | tojson(sort_keys=true) }}\n"
     "{{ tools[0].function.description | tojson(ensure_ascii=true) }}",
     VAR_SNIPPET_MESSAGES, TOOLS, {}, True),
    ("tools_absent", None,
     "[{{ tools }}] {{ tools is defined }} {% if tools %}yes{% else %}no{% endif %} {{ tools | length }}",
     VAR_SNIPPET_MESSAGES, [], {}, True),
    ("cfg_print", None, "{{ cfg }}\n{{ cfg | tojson }}\n{{ cfg | tojson(indent=1) }}\n{{ cfg.quote }}",
     VAR_SNIPPET_MESSAGES, [], {"cfg": CFG}, True),
    ("cfg_dict", None,
     "{% for k, v in cfg.items() %}{{ k }}={{ v }};{% endfor %}\n{{ cfg.keys() | list }}\n{{ cfg.values() | list }}\n"
     "{{ cfg | length }} {{ 'nested' in cfg }} {{ 'zz' in cfg }} {{ cfg.missing is defined }} {{ cfg['nested']['list'][1] }} "
     "{{ cfg.nested.list | length }} {{ cfg.nested is mapping }} {{ cfg.name is string }} {{ cfg.nested.list is sequence }} "
     "{{ cfg.nothing is none }} {{ cfg.yes is true }} {{ cfg.n is integer }} {{ cfg.f is float }} {{ cfg | items | list | length }}\n"
     "{% for k in cfg %}{{ k }},{% endfor %} {{ cfg.nested.z.a is iterable }} {{ cfg.nested.list[-1] is mapping }}",
     VAR_SNIPPET_MESSAGES, [], {"cfg": CFG}, True),
    ("cfg_numbers", None,
     "{{ cfg.n + 1 }} {{ cfg.f * 2 }} {{ cfg.neg // 5 }} {{ cfg.small }} {{ cfg.big }} {{ cfg.n / 2 }} "
     "{{ [cfg.n, cfg.f, cfg.neg] | sum }} {{ cfg.nested.list | select | list }} {{ cfg.yes + 1 }} "
     "{{ cfg.nested.list[2] == 3 }} {{ cfg.n > cfg.f }}",
     VAR_SNIPPET_MESSAGES, [], {"cfg": CFG}, True),
    ("many_options", None,
     "{{ a }}|{{ b }}|{{ c }}|{{ d }}|{{ e }}|{{ f }}|{{ g | tojson }}|{{ messages | length }}|{{ bos_token }}",
     VAR_SNIPPET_MESSAGES, [],
     {"a": "x", "b": 1, "c": -0.5, "d": None, "e": [], "f": {}, "g": ["é", {"k": [1, 2]}],
      "loop_free": 0}, True),
    ("option_error", None, "{{ cfg.name + cfg.n }}", VAR_SNIPPET_MESSAGES, [], {"cfg": CFG}, True),
    ("option_raise", None,
     "{% if not strict is defined or strict %}{{ raise_exception('strict mode: ' ~ cfg.name) }}{% endif %}",
     VAR_SNIPPET_MESSAGES, [], {"cfg": CFG, "strict": True}, True),
]


class GenerationTag(jinja2.ext.Extension):
    """The {% generation %} tag of Hugging Face's AssistantTracker, minus the
    index tracking: its body renders in place."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_render")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class RaisedException(jinja2.exceptions.TemplateError):
    pass


def make_env():
    def raise_exception(message):
        raise RaisedException(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, messages, agp, bos, eos, extra=None):
    """{"expected": text} or {"error": kind, "message": text}. extra: more
    template variables (tools, chat_template_options)."""
    try:
        tmpl = env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        return {"error": "syntax", "message": str(e)}
    except jinja2.TemplateError as e:  # e.g. an unknown filter at compile time
        return {"error": "compile", "message": str(e)}
    try:
        return {"expected": tmpl.render(messages=messages, add_generation_prompt=agp,
                                        bos_token=bos, eos_token=eos, **(extra or {}))}
    except RaisedException as e:
        return {"error": "raise_exception", "message": e.message}
    except Exception as e:  # noqa: BLE001 - any failure is a recorded outcome
        return {"error": type(e).__name__, "message": str(e)}


def smollm2_from_gguf(path):
    """The template and BOS/EOS token texts from the model's metadata."""
    from gguf import GGUFReader

    r = GGUFReader(path)

    def field_str(key):
        f = r.fields[key]
        return bytes(f.parts[f.data[0]]).decode("utf-8")

    def field_int(key):
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])

    tokens = r.fields["tokenizer.ggml.tokens"]

    def token(i):
        return bytes(tokens.parts[tokens.data[i]]).decode("utf-8")

    return (field_str("tokenizer.chat_template"), token(field_int("tokenizer.ggml.bos_token_id")),
            token(field_int("tokenizer.ggml.eos_token_id")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("ZINFER_MODEL", DEFAULT_MODEL))
    ap.add_argument("--out", default=os.path.join(TEMPLATE_DIR, "expected.json"))
    args = ap.parse_args()

    templates = list(TEMPLATES)
    if os.path.exists(args.model):
        src, bos, eos = smollm2_from_gguf(args.model)
        with open(os.path.join(TEMPLATE_DIR, "smollm2.jinja"), "wb") as f:
            f.write(src.encode("utf-8"))
        templates[0] = ("smollm2", bos, eos)
    else:
        print(f"note: {args.model} not found; using the committed smollm2.jinja", file=sys.stderr)

    env = make_env()
    out = {
        "generator": "scripts/ref/make_chat_template_fixtures.py",
        "jinja2_version": jinja2.__version__,
        "message_sets": dict(MESSAGE_SETS),
        "templates": [],
        "snippets": [],
    }
    totals = {"expected": 0, "error": 0}
    for name, bos, eos in templates:
        path = os.path.join(TEMPLATE_DIR, name + ".jinja")
        with open(path, "rb") as f:
            source = f.read().decode("utf-8")
        entry = {"name": name, "file": name + ".jinja", "bos_token": bos, "eos_token": eos,
                 "cases": []}
        for set_name, messages in MESSAGE_SETS:
            for agp in (True, False):
                case = {"set": set_name, "add_generation_prompt": agp}
                case.update(render(env, source, messages, agp, bos, eos))
                totals["expected" if "expected" in case else "error"] += 1
                entry["cases"].append(case)
        out["templates"].append(entry)
    out["snippet_messages"] = SNIPPET_MESSAGES
    for s in SNIPPETS:
        case = {"template": s}
        case.update(render(env, s, SNIPPET_MESSAGES, True, "<s>", "</s>"))
        totals["expected" if "expected" in case else "error"] += 1
        out["snippets"].append(case)
    tokens = {name: (bos, eos) for name, bos, eos in templates}
    out["var_cases"] = []
    for name, file_stem, inline, messages, tools, options, agp in VAR_CASES:
        if file_stem:
            with open(os.path.join(TEMPLATE_DIR, file_stem + ".jinja"), "rb") as f:
                source = f.read().decode("utf-8")
            bos, eos = tokens[file_stem]
        else:
            source, bos, eos = inline, "<s>", "</s>"
        extra = {}
        if tools:
            extra["tools"] = tools
        extra.update(options)
        case = {"name": name, "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos,
                "messages": messages, "tools": tools, "options": options}
        if file_stem:
            case["file"] = file_stem + ".jinja"
        else:
            case["template"] = inline
        case.update(render(env, source, messages, agp, bos, eos, extra))
        totals["expected" if "expected" in case else "error"] += 1
        out["var_cases"].append(case)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(templates)} templates x {len(MESSAGE_SETS) * 2} cases, "
          f"{len(SNIPPETS)} snippets, {len(VAR_CASES)} cases with tools and options; "
          f"{totals['expected']} renderings, {totals['error']} errors")


if __name__ == "__main__":
    main()
