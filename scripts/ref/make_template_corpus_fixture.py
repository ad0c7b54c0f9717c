#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template_corpus.json.gz: jinja2's renderings of
llama.cpp's vendored chat templates ($ZINFER_HOME/llama.cpp-vendor/models/
templates/*.jinja, 70 real templates) on the conversations of
tests/fixtures/chat_template_conversations.json, for
tests/e2e/test_template_corpus.py to compare `zinfer chat-template` against.

The environment is Hugging Face transformers' apply_chat_template one (the
same as scripts/ref/make_chat_template_fixtures.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension and the {% generation %} tag, tojson as json.dumps
(ensure_ascii=False by default), raise_exception and strftime_now, here
fixed to the conversation file's "now" so that renderings are deterministic.
Variables are those llama.cpp (minja) and HF pass: messages,
add_generation_prompt, bos_token, eos_token, tools only when the case has
tools, and the case's own variables (enable_thinking, ...).

Each case is rendered with add_generation_prompt false and true; the case
key is "<name>/agp0" or "<name>/agp1". The result is {"expected": text} or
{"error": kind, "message": text} (raise_exception, or any jinja2 error,
such as the sandbox refusing list.append).

Output: {"conversations_sha256": ..., "templates": {file name: {"sha256":
sha256 of the template bytes, "cases": {key: result}}}}.

Usage: ~/.cache/zinfer/venv/bin/python scripts/ref/make_template_corpus_fixture.py
       [--templates DIR] [--out PATH]
"""
import argparse
import gzip
import hashlib
import importlib.util
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONVERSATIONS = os.path.join(ROOT, "tests", "fixtures", "chat_template_conversations.json")
OUT = os.path.join(ROOT, "tests", "fixtures", "chat_template_corpus.json.gz")
ZINFER_HOME = os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer"))
TEMPLATES = os.path.join(ZINFER_HOME, "llama.cpp-vendor", "models", "templates")


def _sibling():
    """make_chat_template_fixtures.py: its {% generation %} tag and exception."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_chat_template_fixtures.py")
    spec = importlib.util.spec_from_file_location("mctf", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SIB = _sibling()


def make_env(now):
    def raise_exception(message):
        raise SIB.RaisedException(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[SIB.GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def case_requests(conv):
    """(key, request) for every case: the request is what the test sends to
    `zinfer chat-template` on stdin."""
    out = []
    for case in conv["cases"]:
        for agp in (False, True):
            req = {"messages": case["messages"], "add_generation_prompt": agp,
                   "bos_token": conv["bos_token"], "eos_token": conv["eos_token"],
                   "variables": case.get("variables", {})}
            if "tools" in case:  # "TOOLS" -> conv["tools"], "RICH_TOOLS" -> conv["rich_tools"]
                req["tools"] = conv[case["tools"].lower()]
            out.append((f"{case['name']}/agp{int(agp)}", req))
    return out


def render(env, source, req):
    try:
        tmpl = env.from_string(source)
    except jinja2.TemplateError as e:
        return {"error": type(e).__name__, "message": str(e)}
    kw = dict(req["variables"])
    if "tools" in req:
        kw["tools"] = req["tools"]
    try:
        return {"expected": tmpl.render(messages=req["messages"],
                                        add_generation_prompt=req["add_generation_prompt"],
                                        bos_token=req["bos_token"], eos_token=req["eos_token"],
                                        **kw)}
    except SIB.RaisedException as e:
        return {"error": "raise_exception", "message": e.message}
    except Exception as e:  # noqa: BLE001 - any failure is a recorded outcome
        return {"error": type(e).__name__, "message": str(e)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", default=TEMPLATES)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    raw = open(CONVERSATIONS, "rb").read()
    conv = json.loads(raw)
    env = make_env(datetime.fromisoformat(conv["now"]))
    reqs = case_requests(conv)
    result = {"conversations_sha256": hashlib.sha256(raw).hexdigest(), "templates": {}}
    for name in sorted(os.listdir(args.templates)):
        if not name.endswith(".jinja"):
            continue
        data = open(os.path.join(args.templates, name), "rb").read()
        source = data.decode("utf-8")
        cases = {key: render(env, source, req) for key, req in reqs}
        result["templates"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "cases": cases}
    blob = json.dumps(result, ensure_ascii=False, sort_keys=True, indent=0).encode("utf-8")
    with open(args.out, "wb") as f:
        # mtime=0: the same input gives the same bytes.
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, compresslevel=9) as g:
            g.write(blob)
    n_err = sum(1 for t in result["templates"].values() for r in t["cases"].values() if "error" in r)
    n_all = sum(len(t["cases"]) for t in result["templates"].values())
    print(f"{len(result['templates'])} templates, {n_all} renderings ({n_err} errors), "
          f"{len(blob)} bytes -> {os.path.getsize(args.out)} gzipped: {args.out}")


if __name__ == "__main__":
    main()
