"""The "gpt-4o" pre-tokenizer (o200k: GPT-4o, gpt-oss) against llama.cpp.

No o200k vocabulary is vendored, so the pre-tokenizer is tried on copies
of vendored byte-level BPE vocabularies (ggml-vocab-llama-bpe.gguf and
ggml-vocab-qwen2.gguf) whose tokenizer.ggml.pre is rewritten to "gpt-4o",
every other key and array copied as it is (written with gguf's
GGUFWriter). The ids then depend on the other file's merges, but the
pieces the text is split into are the gpt-4o pattern's, in llama.cpp and
in zinfer alike, so equal ids on a varied corpus mean equal splits: case
changes inside words, contractions in either case, digit runs of 1 to 7,
punctuation runs with "/" and newlines, whitespace mixes (NBSP, U+3000,
U+0085, \\r\\n), CJK, emoji, accented and other non-ASCII letters, plus
seeded random strings of those and the project's tokenizer corpus.

A further copy renames seven of Llama 3's reserved special tokens to
gpt-oss's markers (<|start|>, <|channel|>, <|message|>, <|end|>,
<|return|>, <|call|>, <|constrain|>): llama.cpp makes some of them
user-defined by their text, which changes both encoding (they match
without special-token parsing) and decoding (they show without
--special).

Needs llama-cpp-python (the reference, run in this process) and the
vendored vocabularies; skipped without either.

Run from the repo root: ~/.cache/zinfer/venv/bin/python -m pytest tests/e2e
"""

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, report, run_zinfer_lines

import refcache

ZINFER_HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VOCAB_DIR = ZINFER_HOME / "llama.cpp-vendor" / "models"
BASES = ["llama-bpe", "qwen2"]
N_RANDOM = 2500

# Strings picked for the pattern's alternatives and llama.cpp's way of
# running it (tokenizer_pretok.c, the comment above gpt4o_case).
HAND = [
    # case changes in letter runs
    "camelCase", "HELLOworld", "helloWORLD", "XMLHttpRequest", "iPhone", "getHTTPResponseCode",
    "ALLCAPS", "lower", "Title Case Words", "aBcDeF", "AbCdEf", "x", "X",
    # contractions after letters, in either case, and quotes elsewhere
    "don't", "I'M", "I'm", "DON'T stop", "we'LL", "they'Re", "you'VE", "she'd", "SHE'D", "it'S",
    "McDonald's", "O'Neil", "'s", "'S start", " 's", "x'", "''", "'", "x'y", "rock'n'roll",
    # digit runs of 1 to 7, and numbers among letters
    "1", "12", "123", "1234", "12345", "123456", "1234567", "a1234567b", " 1234567", "v1.2.3",
    "3.14159", "1,000,000", "$100.00", "2024-01-15", "0x1F", "٣٤٥٦", "४५६", "１２３４", "½x", "²³",
    # punctuation runs, "/" and newlines after them
    "!!!", "...", "?!?! ok", "a/b//c", "path/to/file.txt\n", "!\n/x", "x!\n/y", "}\n\n/", "//\n//",
    "#include <stdio.h>\nint main() { return 0; }", "def f(x):\n    return x**2\n",
    "<|im_start|>user", "a.b.c", "(foo) [bar] {baz}", "-->", "://", "@user #tag",
    # whitespace
    "", " ", "  ", "\n", "\t", "x  \n\n  y", "  leading", "trailing  ", "\n\n\n", "\r\n\r\n",
    "\t\tindent", "a\u00a0b", "\u3000\u3000x", "a\u0085b", "a\u2028b", " \n \n x", "\v\fx",
    # scripts, marks, emoji
    "中文字符", "日本語のテキスト", "한국어 텍스트", "ひらがなカタカナ", "مرحبا بالعالم", "שלום",
    "नमस्ते दुनिया", "😀😀 emoji 👍🏽", "👨‍👩‍👧 family", "🇫🇷🇩🇪", "\ufffd", "€£¥", "→∑∞",
    "Éric ÉCOLE école", "ÉAB", "aÉB", "ÀÉÎõü", "Ñandú SEÑOR", "Straße STRASSE", "Σίσυφος ΣΊΣΥΦΟΣ",
    "Жизнь ЖИЗНЬ", "e\u0301x", "E\u0301X", "naïve café", "ǅungla", "ʰello", "ﬁne", "Ⅻ", "İstanbul",
    "hello world", " hello", "Hello, World! 123", "The QUICK brown Fox's jumps.",
    # runs long enough to matter, short enough for llama.cpp's std::regex
    "aB" * 500, "Éé" * 300, "中" * 800, " " * 500 + "x", "!/" * 300 + "\n" * 100, "12" * 400,
]

ATOMS = (list("ABCXYZ") + list("abcxyz") + list("0123456789") +
         list("!?.,;:-_()[]{}<>/\\|@#$%^&*+=~`\"'") +
         [" ", " ", "  ", "\t", "\n", "\r\n", "\r", "\v", "\f", "\u00a0", "\u3000", "\u0085",
          "\u2028", "\u202f"] +
         ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'d",
          "'D", "'x"] +
         ["É", "é", "À", "ñ", "Ñ", "ß", "ø", "Ø", "ǅ", "ʰ", "Σ", "σ", "ς", "Ж", "ж", "ﬁ", "İ", "ı"] +
         ["中", "文", "日本語", "한국어", "ひらがな", "カタカナ", "ا", "ب", "ש", "अ", "ि", "\u0301",
          "\u0308", "\u200d", "\u200b"] +
         ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "\ufffd", "€", "£", "©", "™", "→", "∑", "½", "²", "٣", "४",
          "１", "Ⅻ"] +
         ["camelCase", "HELLOworld", "helloWORLD", "XMLHttpRequest", "iPhone", "McDonald's", "don't",
          "I'M", "WE'LL"])

MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>",
           "<|call|>"]
MARKER_TEXTS = [
    "<|start|>assistant<|channel|>analysis<|message|>Let me think.<|end|>",
    "<|start|>assistant<|channel|>final<|message|>Hi!<|return|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
    "<|message|>{\"city\": \"Paris\"}<|call|>",
    "text<|channel|>x <|message|> y<|end|>z", "<|end|><|end|>", "<|start|>", "<|call|>",
    "<|begin_of_text|>x<|end_of_text|>", "plain <|endoftext|> text",
]


def random_corpus(seed, n):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.choice([1, 2, 3, 5, 8, 13, 21, 40])
        out.append("".join(rng.choice(ATOMS) for _ in range(k)))
    return out


def corpus():
    texts = list(HAND) + random_corpus(4242, N_RANDOM)
    for path in (FIXTURES / "tokenizer_corpus.jsonl", FIXTURES / "tokenizer_corpus_pretok.jsonl"):
        with open(path, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def write_copy(src, dst, pre, renames=None):
    """src's metadata with tokenizer.ggml.pre = pre and the tokens of
    renames (id -> text) renamed, written to dst."""
    import gguf_files
    import gguf_meta
    rows, _ = gguf_files.metadata_rows(src)
    arch = gguf_meta.read(str(src), tensors=False).fields["general.architecture"].contents()
    out = []
    for key, value, vtype, sub in rows:
        if key == "tokenizer.ggml.pre":
            value = pre
        elif key == "tokenizer.ggml.tokens" and renames:
            value = list(value)
            for i, text in renames.items():
                value[i] = text
        out.append((key, value, vtype, sub))
    return gguf_files.write_gguf(dst, arch, out)


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt4o")
    out = {}
    for name in BASES:
        src = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
        if not src.is_file():
            pytest.skip(f"{src} not found (run scripts/fetch-llamacpp-vendor)")
        out[name] = write_copy(src, d / f"{name}-gpt4o.gguf", "gpt-4o")
    # llama-bpe's <|reserved_special_token_0..6|> (128002.., CONTROL) as
    # gpt-oss's markers
    out["markers"] = write_copy(VOCAB_DIR / "ggml-vocab-llama-bpe.gguf", d / "markers.gguf",
                                "gpt-4o", {128002 + i: m for i, m in enumerate(MARKERS)})
    return out


def reference(llama_cpp, path, texts, special):
    """llama.cpp's ids of texts, kept in refcache (scripts/ref/refcache.py):
    its std::regex pre-tokenizer is most of this file's time, the same in
    every build of zinfer."""
    def compute():
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        ids = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=special) for t in texts]
        return (np.array([i for x in ids for i in x], np.int64),
                np.array([len(x) for x in ids], np.int64))

    flat, lens = refcache.cached("llama.cpp tokenize", (
        llama_cpp.__version__, refcache.file_sha256(path), list(texts), special), compute)
    ends = np.cumsum(lens)
    return [flat[e - n:e].tolist() for e, n in zip(ends.tolist(), lens.tolist())]


def compare(zinfer_bin, path, texts, want, special):
    args = ["tokenize", "--no-add-special"] + (["--parse-special"] if special else [])
    got = run_zinfer_lines(zinfer_bin, path, args, [json.dumps(t) for t in texts])
    return [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("base", BASES)
def test_gpt4o_ids_match_llamacpp(zinfer_bin, llama_cpp, copies, base, special):
    texts = corpus()
    want = reference(llama_cpp, copies[base], texts, special)
    bad = compare(zinfer_bin, copies[base], texts, want, special)
    mode = "special" if special else "plain"
    report("pretok_gpt4o", f"{base}_{mode}", f"{len(texts) - len(bad)}/{len(texts)}")
    assert len(texts) > 5000
    assert not bad, f"{base} as gpt-4o, {mode}: {len(bad)} of {len(texts)} differ, e.g. " + \
        "; ".join(f"{t!r}: want {w} got {g}" for t, w, g in bad[:3])
    if not special:  # byte-level BPE: the ids decode back to the text
        got = run_zinfer_lines(zinfer_bin, copies[base], ["detokenize"],
                               [json.dumps(w) for w in want])
        assert got == texts


def test_gpt4o_splits_differ_from_base(zinfer_bin, llama_cpp, copies):
    """The copy is really read as gpt-4o (by both): texts whose split
    differs from Llama 3's give other ids than the original file does."""
    texts = ["x!\n/y", "1234567", "Éé" * 3 + "AB"]
    orig = VOCAB_DIR / "ggml-vocab-llama-bpe.gguf"
    base = reference(llama_cpp, orig, texts, False)
    g4o = reference(llama_cpp, copies["llama-bpe"], texts, False)
    assert base[0] != g4o[0]  # "!\n/" is one piece only in gpt-4o
    got = run_zinfer_lines(zinfer_bin, copies["llama-bpe"], ["tokenize", "--no-add-special"],
                           [json.dumps(t) for t in texts])
    assert got == g4o


def test_gpt_oss_markers_match_llamacpp(zinfer_bin, llama_cpp, copies):
    """gpt-oss's markers: ids with and without special-token parsing, and
    the decodes with and without --special, all llama.cpp's."""
    path = copies["markers"]
    texts = MARKER_TEXTS + [a + b for a in MARKERS for b in ("x", " y\n")]
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    n = 0
    for special in (False, True):
        want = reference(llama_cpp, path, texts, special)
        bad = compare(zinfer_bin, path, texts, want, special)
        assert not bad, f"special={special}: " + "; ".join(
            f"{t!r}: want {w} got {g}" for t, w, g in bad[:3])
        for shown in (False, True):
            dec = [llm.detokenize(w, special=shown).decode("utf-8") for w in want]
            got = run_zinfer_lines(zinfer_bin, path, ["detokenize"] + (["--special"] if shown else []),
                                   [json.dumps(w) for w in want])
            assert got == dec, f"parse_special={special}, decode special={shown}"
        n += len(texts)
    # the markers must really be matched without parse_special
    plain = run_zinfer_lines(zinfer_bin, path, ["tokenize", "--no-add-special"],
                             [json.dumps("<|channel|><|end|><|return|>")])[0]
    assert plain[:2] == [128003, 128006] and len(plain) > 3
    report("pretok_gpt4o", "gpt_oss_markers", f"{n}/{n}")
