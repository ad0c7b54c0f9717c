#!/usr/bin/env python3
"""make_seeds.py - writes the hand-made seeds of the decoder and grammar
fuzz targets (corpus_frame/, corpus_imsg/, corpus_gbnf/, corpus_schema/,
corpus_regex/; docs/reliability.md). Run from tests/fuzz/ with the venv's
Python (it needs msgpack). The corpora also hold what fuzzing runs kept;
this only (re)writes the seed_* files."""
import json
import os
import struct

import msgpack


def np_ids(ids, dtype="<i8"):
    fmt = "<%d%s" % (len(ids), "q" if dtype == "<i8" else "i")
    return {"__np__": True, "dtype": dtype, "shape": [len(ids)],
            "data": struct.pack(fmt, *ids)}


def write(d, name, data):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


SCHEMA = ('{"type":"object","properties":{"name":{"type":"string","maxLength":8},'
          '"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name"]}')
REQUESTS = {
    "prompt": {"op": "generate", "id": "r1", "prompt": "Hello",
               "sampling_params": {"max_new_tokens": 8, "temperature": 0.7, "top_k": 40,
                                   "top_p": 0.9, "seed": 7, "stop": ["\n"]}},
    "messages": {"op": "generate", "id": "r2", "stream": False, "logprobs": 3, "echo": True,
                 "messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Hi"}]},
    "tokens": {"op": "generate", "id": "r3", "prompt": np_ids([1, 2, 3]),
               "sampling_params": {"stop_token_ids": [2], "logit_bias": {"5": -1.5}}},
    "schema": {"op": "generate", "id": "r4", "prompt": "x",
               "response_format": {"type": "json_schema",
                                   "json_schema": {"name": "p", "schema": json.loads(SCHEMA)}}},
    "json_object": {"op": "generate", "id": "r5", "prompt": "x",
                    "response_format": {"type": "json_object"}},
    "grammar": {"op": "generate", "id": "r6", "prompt": "x",
                "grammar": 'root ::= "yes" | "no"'},
    "regex": {"op": "generate", "id": "r7", "prompt": "x", "regex": "[0-9]{3}-[a-z]+"},
    "tools": {"op": "generate", "id": "r8",
              "messages": [{"role": "user", "content": "Weather?"}],
              "tools": [{"type": "function",
                         "function": {"name": "w", "description": "d",
                                      "parameters": {"type": "object"}}}]},
    "cancel": {"op": "cancel", "id": "r1"},
    "resume": {"op": "resume", "id": "r1", "tokens": 3},
    "health": {"op": "health", "id": "h"},
    "tokenize": {"op": "tokenize", "id": "t", "text": "Hello", "add_special": False},
    "detokenize": {"op": "detokenize", "id": "d", "token_ids": [1, 2, 3]},
    "detok_np": {"op": "detokenize", "id": "d", "token_ids": np_ids([4, 5], "<i4")},
}
for k, v in REQUESTS.items():
    write("corpus_frame", k, msgpack.packb(v, use_bin_type=True))

CTX = {"tokens": np_ids([1, 2, 3, 4]), "max_length": 64,
       "sampling_params": {"max_new_tokens": 4}}
LPS = {"token_logprobs": [-0.5], "top_logprobs": [[[3, -0.5], [4, -1.0]]]}
IMSG = {
    "register": {"type": "register", "role": "worker", "slots": 4, "max_length": 2048,
                 "vocab": 49152, "model": "m"},
    "heartbeat": {"type": "heartbeat", "load": 2, "kv": {"blocks_total": 10, "blocks_used": 3}},
    "error": {"type": "error", "rid": 5, "code": "invalid_request", "message": "prompt: bad",
              "field": "prompt"},
    "encode": {"type": "encode", "rid": 1, "max_length": 2048,
               "request": REQUESTS["prompt"]},
    "encoded": {"type": "encoded", "rid": 1, "prompt_tokens": 4, "context": CTX},
    "start": {"type": "start", "rid": 1, "context": CTX},
    "start_note": {"type": "start", "rid": 1, "context": CTX,
                   "note": {"epoch": 7, "client": b"zc-1", "id": "r1", "stream": True,
                            "model": "m", "index": 0, "prompt_tokens": 4, "deadline_ns": 0,
                            "encode": b"\x80"}},
    "register_live": {"type": "register", "role": "worker", "slots": 4, "max_length": 2048,
                      "vocab": 49152, "model": "m",
                      "live": [{"rid": 1, "start": msgpack.packb(
                                    {"type": "start", "rid": 1, "context": CTX}),
                                "token_ids": np_ids([7, 8]), "status": "active"},
                               {"rid": 2, "start": b"\x80", "token_ids": [9],
                                "status": "maximum_length"}]},
    "tokens": {"type": "tokens", "rid": 1, "token_ids": np_ids([7]), "status": "running",
               "logprobs": LPS, "prompt_token_ids": np_ids([1, 2])},
    "decode": {"type": "decode", "rid": 1, "token_ids": [7, 8], "status": "end_of_sequence"},
    "decoded": {"type": "decoded", "rid": 1, "text": "hi", "token_ids": [7],
                "status": "running", "logprobs": LPS, "prompt_text": "ab"},
    "tokenize": {"type": "tokenize", "rid": 2, "text": "abc", "add_special": True},
    "detokenize": {"type": "detokenize", "rid": 3, "token_ids": [1, 2]},
    "tokenized": {"type": "tokenized", "rid": 2, "token_ids": [1, 2]},
    "detokenized": {"type": "detokenized", "rid": 3, "text": "ab"},
    "cancel": {"type": "cancel", "rid": 1},
    "chunk": {"event": "chunk", "id": "r1", "text": "he", "token_ids": [1], "resumed": True},
    "final": {"event": "final", "id": "r1", "status": "stop", "index": 0, "text": "hello",
              "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    "client_error": {"event": "error", "id": "r1", "code": "overloaded", "message": "busy"},
    "health": {"event": "result", "id": "h", "status": "ok", "workers": 2, "tokenizers": 1,
               "waiting": 0, "running": 1},
    "models": {"event": "result", "id": "m",
               "models": [{"name": "m", "max_length": 2048, "vocab": 49152}]},
}
for k, v in IMSG.items():
    write("corpus_imsg", k, msgpack.packb(v, use_bin_type=True))

GBNF = {
    "yesno": 'root ::= "yes" | "no"\n',
    "json": r'''root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
''',
    "list": 'root ::= item+ # comment\nitem ::= "- " [^\\n]+ "\\n"\n',
    "rep": 'root ::= ("a" | [b-d]){2,5} x? . [\\u00e9\\U0001F600]\nx ::= "x"*\n',
}
for k, v in GBNF.items():
    write("corpus_gbnf", k, v)

SCHEMAS = {
    "object": SCHEMA,
    "array": '{"type":"array","items":{"type":"number","minimum":-1.5},"minItems":1,"maxItems":3}',
    "enum": '{"enum":["a",1,null,{"k":[true]}]}',
    "ref": ('{"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},'
            '"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}'),
    "anyof": '{"anyOf":[{"type":"string","format":"date-time"},{"type":"boolean"},{"const":3}]}',
    "pattern": '{"type":"string","pattern":"^[A-Z]{2}-\\\\d{3}$"}',
    "allof": ('{"allOf":[{"type":"object","properties":{"a":{"type":"string","format":"uuid"}}},'
              '{"properties":{"b":{"type":["integer","null"],"exclusiveMaximum":10}}}],'
              '"additionalProperties":{"type":"string"}}'),
    "prefix": '{"type":"array","prefixItems":[{"type":"string","format":"email"},{"format":"ipv4"}]}',
    "empty": '{}',
}
for k, v in SCHEMAS.items():
    write("corpus_schema", k, v)

REGEXES = {
    "phone": r"^\d{3}-\d{4}$",
    "email": r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
    "groups": r"(?P<y>\d{4})-(?:0[1-9]|1[0-2])(-\d\d)?",
    "classes": r"[^\s\\\]]+\w*\W?\x41\u00e9.",
    "alt": r"(cat|dog)s?|bird{1,3}?",
}
for k, v in REGEXES.items():
    write("corpus_regex", k, v)
