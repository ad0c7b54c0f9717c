"""End-to-end tests of GBNF grammars (the msgpack request's `grammar` key,
docs/structured_output.md): one `zinfer serve` with the default model for
the module; each completion is checked against its grammar in Python (a
regular expression for these regular grammars), greedy and sampled; a bad
grammar is a request error naming line:column, and `grammar` with
`response_format` is refused by name. Also JSON schemas of the shapes
pydantic exports (response_format json_schema: optional fields, $ref,
enums, bounds, patterns, formats), validated with the `jsonschema`
package, and the `regex` key, checked with re.fullmatch. The matcher
itself is tested in detail by tests/unit/test_grammar.c, the schema and
regex translation by tests/unit/test_schema_grammar.c."""

import json
import re

import jsonschema
import pytest

from conftest import Client, ZinferError, serve_process

PROMPT = ("<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")

YES_NO = 'root ::= "yes" | "no"\n'
DATE = 'root ::= [0-9]{4} "-" [0-9]{2} "-" [0-9]{2}\n'
LIST = ('# a JSON-style list of one to four short words\n'
        'root ::= "[" item (", " item){0,3} "]"\n'
        'item ::= "\\"" [a-z]{1,10} "\\""\n')
LIST_RE = r'\["[a-z]{1,10}"(, "[a-z]{1,10}"){0,3}\]'


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("grammar") / "serve.log"
    with serve_process(zinfer_bin, model_path, log, "--threads-per-worker", 2, "--slots", 4,
                       "--ctx-size", 512, "--max-new-tokens", 128) as srv:
        with Client(srv.addr, timeout_s=60) as c:
            yield c


def complete(c, question, grammar, **sp):
    text, _, final = c.complete(prompt=PROMPT.format(question), grammar=grammar,
                                sampling_params={"max_new_tokens": 64, **sp})
    return text, final


def test_grammars_hold_the_output(server):
    """Greedy and sampled completions match their grammars and end with the
    end-of-sequence token once the grammar is complete."""
    cases = [("Is the sky blue? Answer yes or no.", YES_NO, r"yes|no"),
             ("When did the first person walk on the Moon?", DATE, r"\d{4}-\d{2}-\d{2}"),
             ("List a few colors.", LIST, LIST_RE)]
    for question, grammar, pattern in cases:
        text, final = complete(server, question, grammar)
        assert final["status"] == "end_of_sequence", (grammar, text, final)
        assert re.fullmatch(pattern, text), (grammar, text)
        for seed in range(2):
            text, final = complete(server, question, grammar, temperature=1.0, top_k=0, seed=seed)
            assert final["status"] == "end_of_sequence", (grammar, text, final)
            assert re.fullmatch(pattern, text), (grammar, seed, text)


def test_bad_grammar_is_a_request_error(server):
    with pytest.raises(ZinferError) as e:
        complete(server, "Hi", 'root ::= item\nitem ::= "a" | undefined-rule\n')
    assert e.value.code == "invalid_request" and e.value.field == "grammar", e.value.reply
    assert "line 2:16" in str(e.value) and "undefined rule 'undefined-rule'" in str(e.value)
    with pytest.raises(ZinferError) as e:
        complete(server, "Hi", 'root ::= ("a" | "b"\n')
    assert e.value.field == "grammar" and "line 1:10" in str(e.value), e.value.reply
    assert "unbalanced parentheses" in str(e.value)
    with pytest.raises(ZinferError) as e:
        server.complete(prompt=PROMPT.format("Hi"), grammar=YES_NO,
                        response_format={"type": "json_object"})
    assert e.value.code == "invalid_request" and e.value.field == "grammar", e.value.reply
    assert "response_format" in str(e.value)
    with pytest.raises(ZinferError) as e:
        complete(server, "Hi", YES_NO, ignore_eos=True)
    assert e.value.code == "invalid_request" and e.value.field == "grammar", e.value.reply
    assert "ignore_eos" in str(e.value)
    # the server still serves
    text, final = complete(server, "Is water wet? Answer yes or no.", YES_NO)
    assert text in ("yes", "no") and final["status"] == "end_of_sequence"


# Schemas as pydantic writes them (model_json_schema()), by hand.
SCHEMAS = {
    "user": ("Describe a user as JSON.", {
        "title": "User", "type": "object",
        "properties": {
            "name": {"title": "Name", "type": "string", "maxLength": 20},
            "age": {"title": "Age", "type": "integer", "minimum": 0, "maximum": 120},
            "email": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}],
                      "default": None, "title": "Email"}},
        "required": ["name", "age"]}),
    "order": ("Write one order as JSON.", {
        "$defs": {
            "Status": {"enum": ["new", "paid", "shipped"], "title": "Status", "type": "string"},
            "Line": {"title": "Line", "type": "object",
                     "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                    "qty": {"type": "integer", "exclusiveMinimum": 0,
                                            "maximum": 9}},
                     "required": ["sku", "qty"]}},
        "title": "Order", "type": "object",
        "properties": {"status": {"$ref": "#/$defs/Status"},
                       "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"},
                                 "minItems": 1, "maxItems": 2},
                       "date": {"type": "string", "format": "date"}},
        "required": ["status", "lines", "date"]}),
    "point": ("Give a point on a map as JSON.", {
        "title": "Point", "type": "object",
        "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                       "lon": {"type": "number", "minimum": -180, "maximum": 180},
                       "label": {"type": ["string", "null"], "maxLength": 12}},
        "required": ["lat", "lon", "label"], "additionalProperties": False}),
}


def test_schemas_validate(server):
    """Greedy and sampled completions under each schema are JSON that the
    jsonschema package validates (formats included) and end with EOS."""
    checker = jsonschema.FormatChecker()
    for name, (question, schema) in SCHEMAS.items():
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        for sp in ({}, {"temperature": 1.0, "top_k": 0, "seed": 1},
                   {"temperature": 0.8, "seed": 7}):
            text, _, final = server.complete(prompt=PROMPT.format(question), response_format=rf,
                                             sampling_params={"max_new_tokens": 128, **sp})
            assert final["status"] == "end_of_sequence", (name, sp, text, final)
            jsonschema.validate(json.loads(text), schema, format_checker=checker)


def test_regex_key(server):
    """The `regex` key: the whole completion matches (re.fullmatch), greedy
    and sampled; a bad or unsupported pattern is refused naming `regex`."""
    cases = [("What is a phone number? Make one up.", r"\d{3}-\d{4}"),
             ("Name a color and a vehicle.", r"(red|green|blue) (car|bike|boat)"),
             ("What is an email address? Make one up.", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)")]
    for question, pattern in cases:
        for sp in ({}, {"temperature": 1.0, "top_k": 0, "seed": 3}):
            text, _, final = server.complete(prompt=PROMPT.format(question), regex=pattern,
                                             sampling_params={"max_new_tokens": 32, **sp})
            assert final["status"] == "end_of_sequence", (pattern, text, final)
            assert re.fullmatch(pattern, text), (pattern, text)
    with pytest.raises(ZinferError) as e:
        server.complete(prompt=PROMPT.format("Hi"), regex="a(?=b)")
    assert e.value.code == "unsupported" and e.value.field == "regex", e.value.reply
    assert "lookaround" in str(e.value)
    with pytest.raises(ZinferError) as e:
        server.complete(prompt=PROMPT.format("Hi"), regex="(ab")
    assert e.value.code == "invalid_request" and e.value.field == "regex", e.value.reply
    with pytest.raises(ZinferError) as e:
        server.complete(prompt=PROMPT.format("Hi"), regex="a", grammar=YES_NO)
    assert e.value.code == "invalid_request" and e.value.field == "regex", e.value.reply
