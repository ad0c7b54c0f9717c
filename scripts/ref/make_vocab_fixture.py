#!/usr/bin/env python3
"""make_vocab_fixture.py - llama.cpp's ids for one vendored vocabulary file
over the project's tokenizer corpus, the reference test_vocab_llamacpp.py
checks zinfer against.

For NAME it loads $ZINFER_HOME/llama.cpp-vendor/models/ggml-vocab-NAME.gguf
with llama-cpp-python (`Llama(model_path, vocab_only=True)`) and runs every
"text" of tests/fixtures/tokenizer_corpus.jsonl and tokenizer_corpus_pretok.jsonl
(the pre-tokenizers' edge cases; the first --count of them all,
when given) through it in three modes:

    "plain"   tokenize(text.encode(), add_bos=False, special=False)
    "special" tokenize(text.encode(), add_bos=False, special=True)
    "bos"     tokenize(text.encode(), add_bos=True,  special=False)
              (add_bos is llama.cpp's add_special: BOS/EOS as the file says)

and decodes the plain and special ids back as llama.cpp does: for
SentencePiece vocabularies with its own llama_detokenize (remove_special
False; unparse_special False / True); for BPE ones as the concatenation of
llama_token_to_piece, which is what llama-server streams, because
llama_detokenize also applies Hugging Face's clean_up_tokenization_spaces
to most BPE vocabularies ("word !" -> "word!", " 's" -> "'s"), a lossy
clean-up zinfer does not make.

Then the same for the EXTRA strings below (special-token spellings of many
families, which the corpus lacks). It writes tests/fixtures/vocab/NAME.jsonl.gz:
a header line
    {"vocab": NAME, "count": N, "corpus_sha256": ..., "llama_cpp_python": ...,
     "add": [BOS id or null, EOS id or null]}  (what llama.cpp adds with add_special)
(N corpus texts, which the hash covers, so a changed corpus shows as a stale
fixture), then one line per text, the N corpus texts in order and then the
EXTRA ones (these carry their "text"), with the ids of each mode. To stay
small, "special" is left out when it equals "plain", "bos" when it equals
the plain ids with the file's BOS/EOS around them (the usual case), and
"detok" / "detok_special" (the decoded text, invalid UTF-8 replaced by
U+FFFD as Python's "replace" does) when they equal the text.

Any vocabulary name works (SPM and BPE families alike):

    ~/.cache/zinfer/venv/bin/python scripts/ref/make_vocab_fixture.py llama-spm
"""
import argparse
import ctypes
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.jsonl"
OUT_DIR = ROOT / "tests" / "fixtures" / "vocab"
ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VOCAB_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models"


# Appended to the corpus for every vocabulary: the special-token spellings
# and chat markup of the families llama.cpp's vocab files cover (BERT's
# [CLS] [SEP] [UNK] [MASK] and the WordPiece normaliser's cases among them) (the corpus
# itself spells SmolLM's), with whitespace around them (Phi-3 strips it
# after its special tokens), and SentencePiece's own escape character.
EXTRA = [
    "<s>", "</s>", "<unk>", "<pad>", "<s>Hello", "Hello</s>", " <s> hi </s> ", "<s><s>",
    "<s> </s>", "</s>\n\nnext", "a<unk>b", " <unk> ",
    "<|user|>\nhi<|end|>\n<|assistant|>\n", "<|user|> \n hi <|end|>  \n<|assistant|>",
    "<|system|>You are helpful.<|end|>\n<|user|>\t2+2?<|end|>\n<|assistant|>4<|end|>",
    "<|endoftext|> x", "x <|endoftext|>\n y", "<|placeholder1|>\t\tz", "<|end|>",
    "[INST] hi [/INST]", "<s>[INST] What is 2+2? [/INST] 4</s>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos><eos>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>User: hi",
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>hi<|END_OF_TURN_TOKEN|>",
    "<0x0A>", "<0x41>B", "\u2581Hello", "\u2581", "Hello\u2581world", "a \u2581 b",
    "  leading", "trailing  ", "\n\n", " \n ", "\t<s>\t",
    "[CLS] hi [SEP]", "[MASK]", "a [UNK] b", "Caf\u00e9 na\u00efve \u00c5NGSTR\u00d6M", "e\u0301t\u00e9",
    "\ud55c\uad6d\uc5b4 \u4e2d\u6587\u5b57 \u65e5\u672c\u8a9e", "\u0130stanbul \u01d6 \uff21 \ufb01",
    "x\u200by\u00adz\x00w\ufffdv", "don't he's we're I'll ' x ' , . ! ?", "a$b^c`d~e|f",
    "supercalifragilisticexpialidocious" * 4, "\u00bfQu\u00e9?\u00a1S\u00ed!", "HeLLo\u00a0W\u00f6rld",
]


# The texts: the project's tokenizer corpus, then the pre-tokenizers' edge
# cases (short mixes of scripts, categories and whitespace).
CORPORA = [CORPUS, CORPUS.parent / "tokenizer_corpus_pretok.jsonl"]


def corpus_texts(count=None):
    texts = []
    for path in CORPORA:
        with open(path, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts[:count] if count else texts


def corpus_hash(texts):
    """sha256 over the texts, each UTF-8 encoded and NUL-terminated (the
    test computes the same)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


def with_specials(vocab, ids):
    """The plain ids with BOS/EOS added as the file says (llama.cpp's usual
    add_special result)."""
    import llama_cpp
    bos, eos = added(vocab)
    return ([bos] if bos is not None else []) + list(ids) + ([eos] if eos is not None else [])


def added(vocab):
    """[BOS or None, EOS or None]: what llama.cpp puts around the ids with
    add_special. WordPiece ("bert") files get BOS ([CLS]) and SEP ([SEP])
    whatever add_bos/add_eos say; SEP is recorded in the EOS place."""
    import llama_cpp
    if llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_WPM:
        return [llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_sep(vocab)]
    return [llama_cpp.llama_vocab_bos(vocab) if llama_cpp.llama_vocab_get_add_bos(vocab) else None,
            llama_cpp.llama_vocab_eos(vocab) if llama_cpp.llama_vocab_get_add_eos(vocab) else None]


def detokenize(vocab, ids, special):
    """llama.cpp's decoding of ids (module docstring), as text."""
    import llama_cpp
    if llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_BPE:
        out = b""
        for i in ids:
            buf = ctypes.create_string_buffer(256)
            n = llama_cpp.llama_token_to_piece(vocab, i, buf, 256, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(vocab, i, buf, -n, 0, special)
            out += buf.raw[:n]
        return out.decode("utf-8", "replace")
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 16 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, special)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", "replace")
        cap = -n + 1


# Whole model files whose vocabulary is checked too, by their
# scripts/fetch-model name.
PACKAGED = {"gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}


def vocab_file(name):
    """The GGUF file of vocabulary NAME: a packaged model (PACKAGED), or
    llama.cpp's ggml-vocab-NAME.gguf."""
    if name in PACKAGED:
        return ZINFER_HOME / "models" / PACKAGED[name]
    return VOCAB_DIR / f"ggml-vocab-{name}.gguf"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="vocabulary name: ggml-vocab-NAME.gguf, or a packaged "
                    "model's (" + ", ".join(PACKAGED) + ")")
    ap.add_argument("--count", type=int, default=None, help="only the first N corpus texts")
    ap.add_argument("--out", type=Path, default=None, help="default tests/fixtures/vocab/NAME.jsonl.gz")
    args = ap.parse_args()

    import llama_cpp
    path = vocab_file(args.name)
    if not path.is_file():
        sys.exit(f"{path} not found (run scripts/fetch-llamacpp-vendor, or "
                 f"scripts/fetch-model for a packaged model)")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    texts = corpus_texts(args.count)
    n_corpus_texts = len(texts)
    texts += EXTRA
    out = args.out or OUT_DIR / f"{args.name}.jsonl.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"vocab": args.name, "count": n_corpus_texts,
                         "corpus_sha256": corpus_hash(texts[:n_corpus_texts]),
                         "llama_cpp_python": llama_cpp.__version__,
                         # what llama.cpp adds with add_special (with_specials)
                         "add": added(vocab)})]
    n_corpus = len(texts) - len(EXTRA)
    for i, t in enumerate(texts):
        b = t.encode("utf-8")
        plain = llm.tokenize(b, add_bos=False, special=False)
        special = llm.tokenize(b, add_bos=False, special=True)
        bos = llm.tokenize(b, add_bos=True, special=False)
        rec = {"plain": plain}
        if i >= n_corpus:  # the EXTRA strings carry their text
            rec = {"text": t, "plain": plain}
        if special != plain:
            rec["special"] = special
        if bos != with_specials(vocab, plain):
            rec["bos"] = bos
        d = detokenize(vocab, plain, False)
        if d != t:
            rec["detok"] = d
        ds = detokenize(vocab, special, True)
        if ds != t:
            rec["detok_special"] = ds
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    data = ("\n".join(lines) + "\n").encode("utf-8")
    # mtime=0: the same ids give the same bytes.
    with open(out, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"{out}: {len(texts)} texts, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
