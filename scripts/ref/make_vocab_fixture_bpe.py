#!/usr/bin/env python3
"""make_vocab_fixture_bpe.py - llama.cpp's ids for the project's tokenizer
corpus on one of llama.cpp's vendored BPE vocabulary files, the reference
tests/e2e/test_vocab_corpus_bpe.py holds zinfer to.

For vocabulary NAME ($ZINFER_HOME/llama.cpp-vendor/models/ggml-vocab-NAME.gguf)
and every string of the corpus files (tests/fixtures/tokenizer_corpus.jsonl,
its "text" field, plus any --extra corpus), it records what llama-cpp-python
gives:

    Llama(model_path=F, vocab_only=True).tokenize(text.encode(), add_bos=False,
                                                  special=False / True)

and whether llama.cpp's own detokenize gives the text back from the plain
ids. Written to tests/fixtures/vocab/NAME.jsonl.gz, gzip'd JSON lines:

    {"text": ..., "plain": [...], "special": [...], "rt": true}

"special" is left out where it equals "plain" (most strings), to keep each
fixture small (under ~200 KB). Usage, with the venv that has llama_cpp:

    ~/.cache/zinfer/venv/bin/python scripts/ref/make_vocab_fixture_bpe.py NAME...
"""
import argparse
import gzip
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VOCAB_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models"
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.jsonl"
OUT_DIR = ROOT / "tests" / "fixtures" / "vocab"

# The BPE vocabularies zinfer tokenizes (tokenizer.ggml.model "gpt2").
BPE_FAMILIES = ["gpt-2", "starcoder", "refact", "command-r", "llama-bpe", "qwen2", "qwen35",
                "deepseek-llm", "deepseek-coder", "falcon", "mpt", "gpt-neox", "aquila"]


def load_corpus(paths):
    texts = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"vocabularies (default: all of {BPE_FAMILIES})")
    ap.add_argument("--extra", action="append", default=[], help="another corpus .jsonl")
    ap.add_argument("--limit", type=int, default=0, help="only the first N strings")
    args = ap.parse_args()
    import llama_cpp

    texts = load_corpus([CORPUS] + args.extra)
    if args.limit:
        texts = texts[: args.limit]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in args.names or BPE_FAMILIES:
        path = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        out = OUT_DIR / f"{name}.jsonl.gz"
        n_rt = 0
        with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as f:
            for text in texts:
                b = text.encode("utf-8")
                plain = llm.tokenize(b, add_bos=False, special=False) if b else []
                special = llm.tokenize(b, add_bos=False, special=True) if b else []
                rt = llm.detokenize(plain) == b
                n_rt += rt
                row = {"text": text, "plain": plain, "rt": rt}
                if special != plain:
                    row["special"] = special
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{out}: {len(texts)} strings, {n_rt} round-trip, "
              f"{out.stat().st_size} bytes", file=sys.stderr)
        del llm


if __name__ == "__main__":
    main()
