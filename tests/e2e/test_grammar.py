"""End-to-end tests of GBNF grammars (the msgpack request's `grammar` key,
docs/structured_output.md): one `zinfer serve` with the default model for
the module; each completion is checked against its grammar in Python (a
regular expression for these regular grammars), greedy and sampled; a bad
grammar is a request error naming line:column, and `grammar` with
`response_format` is refused by name. The matcher itself is tested in
detail by tests/unit/test_grammar.c."""

import re

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
