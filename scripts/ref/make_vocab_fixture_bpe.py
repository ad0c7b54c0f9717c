#!/usr/bin/env python3
"""make_vocab_fixture_bpe.py - llama.cpp's ids for the project's tokenizer
corpus on one of llama.cpp's vendored BPE vocabulary files, the reference
tests/e2e/test_vocab_corpus_bpe.py holds zinfer to.

For vocabulary NAME ($ZINFER_HOME/llama.cpp-vendor/models/ggml-vocab-NAME.gguf)
and every string of the corpus files (tests/fixtures/tokenizer_corpus.jsonl,
its "text" field, then tests/fixtures/tokenizer_corpus_pretok.jsonl), it
records what llama-cpp-python gives:

    Llama(model_path=F, vocab_only=True).tokenize(text.encode(), add_bos=False,
                                                  special=False / True)

and whether llama.cpp's own detokenize gives the text back from the plain
ids. Written to tests/fixtures/vocab/NAME.jsonl.gz, gzip'd JSON lines:

    {"text": ..., "plain": [...], "special": [...], "rt": true}

"special" is left out where it equals "plain" (most strings), to keep each
fixture small (under ~200 KB). Usage, with the venv that has llama_cpp:

    ~/.cache/zinfer/venv/bin/python scripts/ref/make_vocab_fixture_bpe.py NAME...

tokenizer_corpus_pretok.jsonl (400 strings, written by --write-extra from a
fixed seed) aims at the pre-tokenizers' edges: short random mixes of the
character classes their regexes tell apart (letters of many scripts and
those deepseek-llm lists, combining marks, digits of several scripts,
ASCII and fullwidth punctuation, every kind of whitespace, contractions in
both cases, CJK, Hangul, emoji, unassigned and private-use codepoints).
"""
import argparse
import gzip
import io
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VOCAB_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models"
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.jsonl"
EXTRA = ROOT / "tests" / "fixtures" / "tokenizer_corpus_pretok.jsonl"
OUT_DIR = ROOT / "tests" / "fixtures" / "vocab"

# The BPE vocabularies zinfer tokenizes (tokenizer.ggml.model "gpt2").
BPE_FAMILIES = ["gpt-2", "starcoder", "refact", "command-r", "llama-bpe", "qwen2", "qwen35",
                "deepseek-llm", "deepseek-coder", "falcon", "mpt", "gpt-neox", "aquila"]


POOLS = [
  "abcXYZ", "0123456789", " ", "  ", "\n", "\r\n", "\t", "\x0b\x0c", "'sS'tT'Re're'VE'll'LL'd'M",
  "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~", "\u3000", "\u00a0", "\u0085", "\u2028\u2029", "\u200b",
  "éèñüßøæœ", "\u0301\u0308\u0327", "абвгдЖЩ", "αβγΩΣϗ", "中文字漢語", "ひらがなカタカナ", "한국어ㄱㄴ",
  "ﾃｽﾄ", "！＂＃（）：；～，。、", "‘’“”—…", "٠١٢٣", "०१२३", "²³½⅓Ⅻ", "مرحبا", "नमस्ते", "ภาษาไทย",
  "😀👍🏽🦙", "\u200d", "\ue000\U000f0000", "\u0378\u05ff", "ǅǈǋ", "ᾈᾉ", "Ꙁꙁ", "𐐀𐐨", "\U0001e900",
  "ℂℇℊ", "µÀÖØö", "ᏸᏹ", "Ⰰⰰ", "ﬀﬁ", "ǃǀ", "ʼʹ", "ⅰⅱ", "\ufeff", "\x7f\x01\x1f",
]


def pretok_corpus(count, seed):
    rnd = random.Random(seed)
    out = []
    for _ in range(count):
        s = ""
        for _ in range(rnd.randint(1, 12)):
            p = rnd.choice(POOLS)
            k = rnd.randint(1, 4)
            s += "".join(rnd.choice(p) for _ in range(k)) if rnd.random() < 0.7 else p
        out.append(s)
    return out


def load_corpus(paths):
    texts = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"vocabularies (default: all of {BPE_FAMILIES})")
    ap.add_argument("--write-extra", action="store_true",
                    help=f"first rewrite {EXTRA.name} (400 strings, seed 21)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N strings")
    args = ap.parse_args()
    import llama_cpp

    if args.write_extra:
        with open(EXTRA, "w", encoding="utf-8") as f:
            for t in pretok_corpus(400, 21):
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    texts = load_corpus([CORPUS, EXTRA])
    if args.limit:
        texts = texts[: args.limit]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in args.names or BPE_FAMILIES:
        path = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        out = OUT_DIR / f"{name}.jsonl.gz"
        n_rt = 0
        # mtime 0: the same ids give the same bytes, so a rerun changes no file
        with open(out, "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz, \
                io.TextIOWrapper(gz, encoding="utf-8") as f:
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
