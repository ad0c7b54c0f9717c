"""The structured-output corpus (tests/fixtures/structured/): schemas in
the shapes pydantic, zod and OpenAI's structured-output guide produce, and
GBNF grammars, run through one `zinfer serve` with the default model.

  * Admission: every entry is sent once (max_new_tokens 1): accepted, or
    refused with a code and a message naming the keyword. The refusals are
    pinned in EXPECTED_REFUSED (so a change shows here), and the coverage
    is reported beside what llama.cpp's JSON-schema-to-grammar converter
    (llama-cpp-python's llama_grammar.json_schema_to_gbnf) accepts.
  * Outputs: for a subset sized for CI (CI_SCHEMAS, CI_GRAMMARS; every
    accepted entry with ZINFER_STRUCTURED_ALL=1, for releases), one greedy
    and one sampled completion each; every completion that ended by
    end-of-sequence must validate (schemas: the `jsonschema` package with
    its format checker; grammars: gbnf_check.py, a GBNF matcher written
    apart from zinfer's). Completions cut off by max_new_tokens are
    counted, not validated (a cut text is only a prefix).

  * Hostile inputs: huge enums, exponential regexes, deep nesting, left
    recursion, huge bounds and $ref cycles sent together with an ordinary
    request are refused at admission or run bounded, and the ordinary one
    is served (the detail of each case: tests/unit/test_grammar_hostile.c)."""

import copy
import datetime
import json
import os
import re
import time
from pathlib import Path

import jsonschema
import pytest

import gbnf_check
from conftest import Client, report, serve_process

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "structured"
SCHEMAS = {p.stem: json.loads(p.read_text()) for p in sorted((CORPUS / "schemas").glob("*.json"))}
GRAMMARS = {p.stem: p.read_text() for p in sorted((CORPUS / "grammars").glob("*.gbnf"))}
ALL = os.environ.get("ZINFER_STRUCTURED_ALL") == "1"
PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"

# The entries zinfer refuses, with a word of the reason it must give.
EXPECTED_REFUSED = {
    "contains_keyword": "contains",
    "not_keyword": "'not'",
    "pyd_conditional": "'if'",
    "pyd_decimal": "pattern",
    "pyd_multiple_of": "multipleOf",
    "pyd_pattern_props": "patternProperties",
    "pyd_unique_tags": "uniqueItems",
    "pyd_url": "maxLength",
    "zod_min_props": "minProperties",
    "zod_tuple": "items",
    "zod_url": "format",
}

# (the recursive schemas are left to the release run: the small model
# often nests until max_new_tokens, which leaves nothing to validate)
CI_SCHEMAS = ["pyd_user", "pyd_order", "pyd_event", "pyd_literal", "pyd_discriminated",
              "pyd_tuple", "zod_todo", "zod_union", "zod_nullable", "openai_moderation",
              "openai_query", "top_enum"]
CI_GRAMMARS = ["arithmetic", "iso_datetime", "sexpr", "phone_book"]


def grammar_prompt(text):
    first = text.splitlines()[0]
    assert first.startswith("# prompt: "), first
    return first[len("# prompt: "):]


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("structured") / "serve.log"
    with serve_process(zinfer_bin, model_path, log, "--threads-per-worker", 2, "--slots", 8,
                       "--ctx-size", 768, "--max-new-tokens", 384) as srv:
        with Client(srv.addr, timeout_s=300) as c:
            yield c


def request(name, kind, sp):
    """The generate request of a corpus entry."""
    if kind == "schema":
        e = SCHEMAS[name]
        return {"op": "generate", "prompt": PROMPT.format(e["prompt"]), "sampling_params": sp,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "schema": e["schema"]}}}
    g = GRAMMARS[name]
    return {"op": "generate", "prompt": PROMPT.format(grammar_prompt(g)), "sampling_params": sp,
            "grammar": g}


def run_many(client, msgs, width=8):
    """Runs the requests, width at a time; [(text, final or error frame)]."""
    out = []
    for k in range(0, len(msgs), width):
        rids = [client.send(m) for m in msgs[k:k + width]]
        for rid in rids:
            text, last = [], None
            for ev in client.events(rid):
                if ev["event"] == "chunk":
                    text.append(ev.get("text", ""))
                else:
                    last = ev
                    text.append(ev.get("text", "") if ev["event"] == "final" else "")
            out.append(("".join(text), last))
    return out


_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"


def _rfc3339_time(s):
    return not isinstance(s, str) or re.fullmatch(_TIME, s) is not None


def _rfc3339_date_time(s):
    if not isinstance(s, str):
        return True
    m = re.fullmatch(r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt](.*)", s)
    try:
        return bool(m) and bool(datetime.date.fromisoformat(m[1])) and _rfc3339_time(m[2])
    except ValueError:
        return False


def validate(instance, schema):
    """jsonschema's validator of the schema's draft (2020-12 unless it says),
    with that draft's format checker, plus RFC 3339 "time" and "date-time"
    (jsonschema checks them only with rfc3339-validator installed, and the
    generic FormatChecker() mixes in draft 3's "time")."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    fc = copy.deepcopy(cls.FORMAT_CHECKER)
    fc.checks("time")(_rfc3339_time)
    fc.checks("date-time")(_rfc3339_date_time)
    cls(schema, format_checker=fc).validate(instance)


def llama_cpp_accepts(json_schema_to_gbnf, schema):
    """(True, "") or (False, why) for llama.cpp's converter."""
    try:
        json_schema_to_gbnf(json.dumps(schema))
        return True, ""
    except Exception as e:  # its refusals are assertions, KeyErrors, ValueErrors
        return False, f"{type(e).__name__}: {e}"[:120]


@pytest.mark.no_zinfer
def test_corpus_size():
    assert len(SCHEMAS) >= 60 and len(GRAMMARS) >= 10, (len(SCHEMAS), len(GRAMMARS))
    sources = {e["source"] for e in SCHEMAS.values()}
    assert {"pydantic", "zod", "openai"} <= sources, sources


def test_corpus_admission(server):
    """Each entry is accepted, or refused by name as EXPECTED_REFUSED says."""
    names = list(SCHEMAS)
    res = run_many(server, [request(n, "schema", {"max_new_tokens": 1}) for n in names])
    table, refused = {}, {}
    for name, (_, last) in zip(names, res):
        ours = "accepted"
        if last["event"] == "error":
            refused[name] = f"{last.get('code')}: {last.get('message')}"
            ours = "refused: " + refused[name]
        table[name] = {"zinfer": ours}
    report("structured_corpus", "schemas", table)
    report("structured_corpus", "schema_coverage",
           {"entries": len(names), "zinfer_accepted": len(names) - len(refused)})
    assert set(refused) == set(EXPECTED_REFUSED), sorted(set(refused) ^ set(EXPECTED_REFUSED))
    for name, why in refused.items():
        assert why.split(":")[0] in ("unsupported", "invalid_request"), (name, why)
        assert EXPECTED_REFUSED[name] in why, (name, why)
    gnames = list(GRAMMARS)
    gres = run_many(server, [request(n, "grammar", {"max_new_tokens": 1}) for n in gnames])
    for name, (_, last) in zip(gnames, gres):
        assert last["event"] == "final", (name, last)
    report("structured_corpus", "grammars_accepted", len(gnames))


# Recursive and open-ended entries with a small budget, in CI too: the
# mask closes them within max_new_tokens (grammar.h's budget) instead of
# letting the length limit cut them.
CI_TIGHT = [("schema", "openai_ui", 80), ("schema", "openai_linked_list", 40),
            ("grammar", "sexpr", 24)]


@pytest.mark.skipif(os.environ.get("ZINFER_SANITIZED") == "1",
                    reason="release build only (under the sanitizers test_grammar.py generates constrained outputs)")
def test_corpus_outputs_validate(server):
    """Greedy and sampled completions of the CI subset (everything with
    ZINFER_STRUCTURED_ALL=1), and a few with tight budgets: every one
    validates, and every one ends by end-of-sequence (none cut off)."""
    schemas = [n for n in SCHEMAS if n not in EXPECTED_REFUSED] if ALL else CI_SCHEMAS
    grammars = list(GRAMMARS) if ALL else CI_GRAMMARS
    jobs = []
    for kind, names in (("schema", schemas), ("grammar", grammars)):
        for name in names:
            for label, sp in (("greedy", {}), ("sampled", {"temperature": 0.8, "seed": 11})):
                jobs.append((kind, name, label, {"max_new_tokens": 384, **sp}))
    for kind, name, budget in CI_TIGHT:
        for label, sp in (("greedy", {}), ("sampled", {"temperature": 0.8, "seed": 11})):
            jobs.append((kind, name, f"{label}-{budget}", {"max_new_tokens": budget, **sp}))
    res = run_many(server, [request(n, k, sp) for k, n, _, sp in jobs])
    finished, cut, bad = 0, [], []
    for (kind, name, label, _), (text, last) in zip(jobs, res):
        assert last["event"] == "final", (name, last)
        if last["status"] == "end_of_sequence":
            finished += 1
        else:
            cut.append(f"{name}/{label}: {last['status']}")
        if kind == "schema":
            try:
                validate(json.loads(text), SCHEMAS[name]["schema"])
            except (ValueError, jsonschema.ValidationError) as e:
                bad.append(f"{name}/{label}: {str(e)[:200]}: {text!r}")
        elif not gbnf_check.match(GRAMMARS[name], text):
            bad.append(f"{name}/{label}: no match: {text!r}")
    report("structured_corpus", "outputs",
           {"mode": "all" if ALL else "ci", "completions": len(jobs), "finished": finished,
            "cut_off": cut, "invalid": bad})
    assert not bad, bad
    assert not cut, cut



@pytest.mark.no_zinfer
def test_corpus_beside_llama_cpp():
    """llama.cpp's own schema converter over the same corpus, for the
    report: how many entries each engine takes. Needs llama-cpp-python
    (scripts/setup --with-llamacpp); skipped without."""
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    table = {}
    for name, entry in SCHEMAS.items():
        ok, why = llama_cpp_accepts(grammar.json_schema_to_gbnf, entry["schema"])
        table[name] = "accepted" if ok else "refused: " + why
    n_ll = sum(1 for v in table.values() if v == "accepted")
    report("structured_corpus", "schemas_llama_cpp", table)
    report("structured_corpus", "schema_coverage_llama_cpp",
           {"entries": len(table), "llama_cpp_accepted": n_ll})
    assert 0 < n_ll < len(table), n_ll  # it converts the plain ones, not the corpus's edges

def test_hostile_inputs_keep_the_worker_serving(server):
    """Hostile constraints beside an ordinary request: each is refused
    within 2 s or generates to its max_new_tokens, and the ordinary
    request still ends normally."""
    enum5000 = {"enum": list(range(5000))}
    deep = "root ::= " + "(" * 100000 + '"a"' + ")" * 100000 + "\n"
    sp = {"max_new_tokens": 24}
    cases = [  # (name, extra request keys, refused?)
        ("enum of 5000", {"response_format": {"type": "json_schema",
                                              "json_schema": {"schema": enum5000}}}, True),
        ("$ref to itself", {"response_format": {"type": "json_schema", "json_schema": {
            "schema": {"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}}}}, True),
        ("maxLength 10^9", {"response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "string", "maxLength": 1000000000}}}}, True),
        ("100k parentheses", {"grammar": deep}, True),
        ("left recursion", {"grammar": 'root ::= root "a" | "b"\n'}, True),
        ("(a|a)*b", {"regex": "(a|a)*b"}, False),
        ("((a+)+)+b", {"regex": "((a+)+)+b"}, False),
        ("10^9 a's", {"grammar": 'root ::= (("a"{1000}){1000}){1000}\n'}, False),
        ("doubling ambiguity", {"grammar": 'root ::= (a | b)*\na ::= "x" | "xx"\nb ::= "x"+\n'},
         False),
    ]
    ordinary = {"op": "generate", "prompt": PROMPT.format("Is the sky blue? Answer yes or no."),
                "grammar": 'root ::= "yes" | "no"\n', "sampling_params": {"max_new_tokens": 8}}
    t0 = time.monotonic()
    rids = [server.send({"op": "generate", "prompt": PROMPT.format("Write something."),
                         "sampling_params": sp, **extra}) for _, extra, _ in cases]
    rid_ok = server.send(ordinary)
    took = {}
    for (name, _, refused), rid in zip(cases, rids):
        last = None
        for ev in server.events(rid):
            last = ev
        took[name] = round(time.monotonic() - t0, 3)
        if refused:
            assert last["event"] == "error", (name, last)
            assert last["code"] in ("invalid_request", "unsupported"), (name, last)
            assert took[name] < 2.0, (name, took[name])
        else:
            assert last["event"] == "final", (name, last)
            assert last["status"] in ("maximum_length", "end_of_sequence"), (name, last)
    text = ""
    for ev in server.events(rid_ok):
        text += ev.get("text", "")
        last = ev
    assert last["event"] == "final" and last["status"] == "end_of_sequence", last
    assert text in ("yes", "no"), text
    took["ordinary"] = round(time.monotonic() - t0, 3)
    report("structured_corpus", "hostile_seconds", took)
    assert took["ordinary"] < 60, took
