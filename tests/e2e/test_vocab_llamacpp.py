"""zinfer against llama.cpp on the vendored vocabulary files, over the
project's tokenizer corpus.

Each tests/fixtures/vocab/NAME.jsonl.gz (made by
scripts/ref/make_vocab_fixture.py NAME with llama-cpp-python) holds the ids
llama.cpp gives every text of tests/fixtures/tokenizer_corpus.jsonl and
tokenizer_corpus_pretok.jsonl (their first `count` texts), plus some
special-token strings, for ggml-vocab-NAME.gguf (or a packaged model's
file): without special tokens ("plain"), with special-token parsing
("special"), with BOS/EOS added as llama.cpp adds them ("bos"), and what
llama.cpp decodes the plain and special ids to (llama_detokenize for
SentencePiece files; for BPE ones the token pieces, as llama-server
streams them, without the Hugging Face space clean-up llama_detokenize
adds: scripts/ref/make_vocab_fixture.py says why). Every text
goes through `zinfer tokenize` in each mode, and the ids back through
`zinfer detokenize` (`--special` for the parsed ones); all must equal
llama.cpp's. Any fixture present is tested: adding a vocabulary is adding
its fixture file. Skipped when the vendored vocabulary file is absent.

Run from the repo root: ~/.cache/zinfer/venv/bin/python -m pytest tests/e2e
"""

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import run_zinfer_lines, FIXTURES, report

ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VOCAB_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models"
CORPUS = FIXTURES / "tokenizer_corpus.jsonl"
# Whole model files checked too, by their scripts/fetch-model name.
PACKAGED = {"gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
NAMES = sorted(p.name[: -len(".jsonl.gz")] for p in (FIXTURES / "vocab").glob("*.jsonl.gz"))


def load(name):
    """(vocab file, texts, records) for one fixture; the header's hash must
    match the corpus it was made from."""
    if name in PACKAGED:
        model = ZINFER_HOME / "models" / PACKAGED[name]
    else:
        model = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if not model.is_file():
        pytest.skip(f"{model} not found (run scripts/fetch-llamacpp-vendor or "
                    "scripts/fetch-model)")
    with gzip.open(FIXTURES / "vocab" / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    head, recs = lines[0], lines[1:]
    texts = []
    for path in (CORPUS, FIXTURES / "tokenizer_corpus_pretok.jsonl"):
        with open(path, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    texts = texts[: head["count"]]
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    assert h.hexdigest() == head["corpus_sha256"], \
        f"{name}: the corpus changed since the fixture was made; rerun " \
        f"scripts/ref/make_vocab_fixture.py {name}"
    texts += [r["text"] for r in recs[len(texts):]]
    assert len(texts) == len(recs)
    assert len(texts) >= 2000, f"{name}: only {len(texts)} texts"
    return model, texts, recs, head




MODES = {  # mode: (zinfer tokenize flags, record key)
    "plain": ["--no-add-special"],
    "special": ["--no-add-special", "--parse-special"],
    "bos": [],
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", NAMES)
def test_ids_match_llamacpp(zinfer_bin, name, mode):
    model, texts, recs, head = load(name)
    if mode == "plain":
        want = [r["plain"] for r in recs]
    elif mode == "special":
        want = [r.get("special", r["plain"]) for r in recs]
    else:
        bos, eos = head["add"]  # as llama.cpp adds them, from the fixture
        want = [r.get("bos", ([bos] if bos is not None else []) + r["plain"] +
                      ([eos] if eos is not None else [])) for r in recs]
    got = run_zinfer_lines(zinfer_bin, model, ["tokenize"] + MODES[mode], [json.dumps(t) for t in texts])
    bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
    report("vocab_llamacpp", f"{name}_{mode}", f"{len(texts) - len(bad)}/{len(texts)}")
    assert not bad, f"{name} {mode}: {len(bad)} of {len(texts)} texts differ from llama.cpp, " \
        "e.g. " + "; ".join(f"{t!r}: want {w} got {g}" for t, w, g in bad[:3])


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("name", NAMES)
def test_detokenize_matches_llamacpp(zinfer_bin, name, special):
    model, texts, recs, _ = load(name)
    key = "special" if special else "plain"
    dkey = "detok_special" if special else "detok"
    ids = [r.get(key, r["plain"]) for r in recs]
    want = [r.get(dkey, t) for r, t in zip(recs, texts)]
    got = run_zinfer_lines(zinfer_bin, model, ["detokenize"] + (["--special"] if special else []),
                    [json.dumps(i) for i in ids])
    bad = [(i, w, g) for i, w, g in zip(ids, want, got) if w != g]
    exact = sum(1 for w, t in zip(want, texts) if w == t)
    report("vocab_llamacpp", f"{name}_detok_{key}",
           f"{len(texts) - len(bad)}/{len(texts)} ({exact} round-trip)")
    assert not bad, f"{name}: {len(bad)} of {len(texts)} decodes differ from llama.cpp, e.g. " + \
        "; ".join(f"{i}: want {w!r} got {g!r}" for i, w, g in bad[:3])
