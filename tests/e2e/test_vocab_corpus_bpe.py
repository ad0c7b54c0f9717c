"""zinfer against llama.cpp on the project's tokenizer corpus, for each of
llama.cpp's vendored BPE vocabulary files.

tests/fixtures/vocab/NAME.jsonl.gz (scripts/ref/make_vocab_fixture_bpe.py)
holds, for every string of tests/fixtures/tokenizer_corpus.jsonl (2,500)
and tests/fixtures/tokenizer_corpus_pretok.jsonl (400 short mixes of the
character classes the pre-tokenizers tell apart), the ids
llama-cpp-python gives on ggml-vocab-NAME.gguf without and with special-token
parsing, and whether llama.cpp's detokenize gives the string back. zinfer
must give the same ids both ways, and decode the plain ids back to the
string wherever llama.cpp does. Skipped when the vendored files are absent.

Run from the repo root: ~/.cache/zinfer/venv/bin/python -m pytest tests/e2e
"""

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import report

ROOT = Path(__file__).resolve().parents[2]
ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VOCAB_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models"
FIXTURES = ROOT / "tests" / "fixtures" / "vocab"

FAMILIES = ["gpt-2", "starcoder", "refact", "command-r", "llama-bpe", "qwen2", "qwen35",
            "deepseek-llm", "deepseek-coder", "falcon", "mpt", "gpt-neox", "aquila"]


def load(name):
    model = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if not model.is_file():
        pytest.skip(f"{model} not found (run scripts/fetch-llamacpp-vendor)")
    with gzip.open(FIXTURES / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) >= 2000, f"{name}: only {len(rows)} strings in the fixture"
    return model, rows


def run_lines(zinfer_bin, model, args, lines):
    res = subprocess.run([str(zinfer_bin)] + args + ["--model", str(model)],
                         input="".join(line + "\n" for line in lines).encode("utf-8"),
                         capture_output=True, timeout=300)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, f"zinfer {' '.join(args)} exited {res.returncode}: {err}"
    out = res.stdout.decode("utf-8").splitlines()
    assert len(out) == len(lines), f"{len(lines)} lines in, {len(out)} out; stderr: {err}"
    return [json.loads(o) for o in out]


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("name", FAMILIES)
def test_corpus_ids(zinfer_bin, name, special):
    model, rows = load(name)
    args = ["tokenize", "--no-add-special"] + (["--parse-special"] if special else [])
    got = run_lines(zinfer_bin, model, args, [json.dumps(r["text"]) for r in rows])
    key = "special" if special else "plain"
    want = [r.get(key, r["plain"]) for r in rows]
    bad = [(r["text"], w, g) for r, w, g in zip(rows, want, got) if w != g]
    report("vocab_corpus_bpe", f"{name} {key}", f"{len(rows) - len(bad)}/{len(rows)}")
    assert not bad, f"{name} ({key}): {len(bad)} of {len(rows)} strings differ, e.g. " + \
        "; ".join(f"{s!r}: want {w} got {g}" for s, w, g in bad[:3])


@pytest.mark.parametrize("name", FAMILIES)
def test_corpus_round_trip(zinfer_bin, name):
    model, rows = load(name)
    rows = [r for r in rows if r["rt"]]
    got = run_lines(zinfer_bin, model, ["detokenize"], [json.dumps(r["plain"]) for r in rows])
    bad = [(r["text"], g) for r, g in zip(rows, got) if r["text"] != g]
    assert not bad, f"{name}: {len(bad)} of {len(rows)} strings do not round-trip, e.g. " + \
        "; ".join(f"{s!r} -> {g!r}" for s, g in bad[:3])
