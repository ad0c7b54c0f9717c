"""zinfer's tokenizer against llama.cpp, through the real binary.

tests/fixtures/tokenizer_corpus.jsonl holds a few thousand varied strings
with the ids llama.cpp gives them for the default model, with and without
special-token parsing (made by scripts/ref/make_tokenizer_fixture.py). Every
string goes through `zinfer tokenize` (and `--parse-special`) in one process
per mode; every id must match. The ids then go back through `zinfer
detokenize` (`--special` for the parsed mode) and must give the text back.

Run from the repo root: ~/.cache/zinfer/venv/bin/python -m pytest tests/e2e
"""

import json

import pytest
from conftest import run_zinfer_lines, FIXTURES, report

CORPUS = FIXTURES / "tokenizer_corpus.jsonl"


@pytest.fixture(scope="module")
def corpus():
    with open(CORPUS, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    assert len(recs) >= 2000, f"{CORPUS} has only {len(recs)} strings"
    return recs




def first_mismatches(corpus, key, got, limit=5):
    bad = [(r["text"], r[key], g) for r, g in zip(corpus, got) if r[key] != g]
    return len(bad), bad[:limit]


@pytest.mark.parametrize("mode", ["plain", "special"])
def test_ids_match_llamacpp(zinfer_bin, model_path, corpus, mode):
    args = ["tokenize"] + (["--parse-special"] if mode == "special" else [])
    got = run_zinfer_lines(zinfer_bin, model_path, args, [json.dumps(r["text"]) for r in corpus])
    n_bad, examples = first_mismatches(corpus, mode, got)
    report("tokenizer", f"{mode}_strings", len(corpus))
    report("tokenizer", f"{mode}_mismatches", n_bad)
    assert n_bad == 0, f"{n_bad} of {len(corpus)} strings differ from llama.cpp, e.g. " + \
        "; ".join(f"{t!r}: want {w} got {g}" for t, w, g in examples)


@pytest.mark.parametrize("mode", ["plain", "special"])
def test_decode_round_trip(zinfer_bin, model_path, corpus, mode):
    args = ["detokenize"] + (["--special"] if mode == "special" else [])
    got = run_zinfer_lines(zinfer_bin, model_path, args, [json.dumps(r[mode]) for r in corpus])
    bad = [(r["text"], g) for r, g in zip(corpus, got) if r["text"] != g]
    report("tokenizer", f"{mode}_roundtrip_failures", len(bad))
    assert not bad, f"{len(bad)} of {len(corpus)} strings do not decode back, e.g. " + \
        "; ".join(f"{t!r} -> {g!r}" for t, g in bad[:5])


@pytest.mark.no_zinfer
def test_special_text_differs_by_mode(corpus):
    """The corpus really exercises special-token parsing: some strings must
    tokenize differently in the two modes (guards against a fixture made
    with the same flag twice)."""
    differ = sum(1 for r in corpus if r["plain"] != r["special"])
    assert differ >= 100, f"only {differ} strings differ between modes"
    chat = next(r for r in corpus if r["text"] == "<|im_start|>user\nhi<|im_end|>")
    assert chat["special"] == [1, 4093, 198, 6004, 2]
