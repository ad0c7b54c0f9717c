"""llama.cpp's own tokenizer tests on its vendored vocabulary files.

llama.cpp ships vocabulary-only GGUF files, `ggml-vocab-NAME.gguf`, with
test strings (`.gguf.inp`, each string followed by a line
`__ggml_vocab_test__`) and the ids the family's reference tokenizer gives
them without special tokens (`.gguf.out`, one line of space-separated ids
per string). `scripts/fetch-llamacpp-vendor` (run by `scripts/setup`)
unpacks them from the llama-cpp-python source distribution into
$ZINFER_HOME/llama.cpp-vendor/models. Every string of every file in
FAMILIES goes through `zinfer tokenize` on that file; every id must match,
and the ids must decode back to the string wherever the file's tokenizer
round-trips (DETOK_EXACT). Skipped when the vendored files are absent.

Run from the repo root: ~/.cache/zinfer/venv/bin/python -m pytest tests/e2e
"""

import json
import os
from pathlib import Path

import pytest
from conftest import run_zinfer_lines, report

ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VOCAB_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models"
SEP = "\n__ggml_vocab_test__\n"

# The vocabulary files zinfer tokenizes: each must pass every string.
# (gpt-neox and aquila, llama.cpp's default pre-tokenizer, come without
# test strings: tests/e2e/test_vocab_corpus_bpe.py covers them.)
FAMILIES = ["gpt-2", "starcoder", "refact", "command-r", "llama-bpe", "qwen2", "qwen35",
            "deepseek-llm", "deepseek-coder", "falcon", "mpt", "llama-spm", "phi-3", "bert-bge"]
# Those whose decode(encode(s)) gives s back for every test string (not
# bert-bge: WordPiece lowercases, strips accents and spaces words out).
DETOK_EXACT = ["gpt-2", "starcoder", "refact", "command-r", "llama-bpe", "qwen2", "qwen35",
               "deepseek-llm", "deepseek-coder", "falcon", "mpt", "llama-spm", "phi-3"]


def load_cases(name):
    base = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if not base.is_file():
        pytest.skip(f"{base} not found (run scripts/fetch-llamacpp-vendor)")
    text = Path(str(base) + ".inp").read_text(encoding="utf-8")
    strings = text.split(SEP)
    assert strings[-1] == "", f"{base}.inp does not end with the separator"
    strings = strings[:-1]
    out = Path(str(base) + ".out").read_text(encoding="utf-8").split("\n")
    ids = [[int(x) for x in line.split()] for line in out[: len(strings)]]
    assert len(ids) == len(strings), f"{base}: {len(strings)} strings, {len(ids)} id lines"
    return base, strings, ids




@pytest.mark.parametrize("name", FAMILIES)
def test_vocab_file_ids(zinfer_bin, name):
    model, strings, want = load_cases(name)
    got = run_zinfer_lines(zinfer_bin, model, ["tokenize", "--no-add-special"],
                   [json.dumps(s) for s in strings])
    bad = [(s, w, g) for s, w, g in zip(strings, want, got) if w != g]
    report("vocab_files", name, f"{len(strings) - len(bad)}/{len(strings)}")
    assert not bad, f"{name}: {len(bad)} of {len(strings)} strings differ, e.g. " + \
        "; ".join(f"{s!r}: want {w} got {g}" for s, w, g in bad[:3])


@pytest.mark.parametrize("name", DETOK_EXACT)
def test_vocab_file_round_trip(zinfer_bin, name):
    model, strings, want = load_cases(name)
    got = run_zinfer_lines(zinfer_bin, model, ["detokenize"], [json.dumps(w) for w in want])
    bad = [(s, g) for s, g in zip(strings, got) if s != g]
    assert not bad, f"{name}: {len(bad)} of {len(strings)} strings do not round-trip, e.g. " + \
        "; ".join(f"{s!r} -> {g!r}" for s, g in bad[:3])
