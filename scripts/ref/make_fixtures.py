#!/usr/bin/env python3
"""Write zinfer's golden fixtures (tests/fixtures/*.json) from llama.cpp.

Needs llama-cpp-python in the venv (scripts/setup --with-llamacpp). Writes:

  prompts.json    the prompts and their token ids from llama.cpp's tokenizer
                  (special tokens parsed, the model's own add-BOS setting)
  greedy.json     llama.cpp's 64-token greedy continuation of each prompt,
                  EOS ignored, and per step the gap between the two largest
                  logits (so a divergence can be shown to fall on a near-tie);
                  the same from the float64 numpy reference ("ref_*" keys)
  logits_kl.json  for the shorter prompts, KL(float64 numpy reference ||
                  llama.cpp) per position, summarized (mean, max, argmax
                  agreement); the logits themselves are not committed

Greedy decoding uses the low-level path (eval token by token, argmax of the
last logits row), which is exactly greedy and never stops at EOS. llama.cpp
runs with n_ctx=2048, n_threads=2, otherwise its defaults (see
docs/references.md). Deterministic: re-running gives identical files.
"""

import argparse
import hashlib
import json
import os
import platform
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import numpy_llama  # noqa: E402

N_CTX = 2048
N_THREADS = 2
GEN_TOKENS = 64
LOGITS_MAX_TOKENS = 160  # prompts up to this long get a logits/KL entry


def chatml(*turns, assistant=True):
    """ChatML as SmolLM2's template renders it: (role, content) pairs."""
    s = "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns)
    return s + ("<|im_start|>assistant\n" if assistant else "")


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

PROMPTS = [
    ("chat_capital", chatml(("user", "What is the capital of France?"))),
    ("chat_haiku", chatml(("user", "Write a haiku about the ocean."))),
    ("chat_system_spider",
     chatml(("system", SYSTEM), ("user", "How many legs does a spider have?"))),
    ("chat_photosynthesis",
     chatml(("user", "Explain photosynthesis in one sentence."))),
    ("chat_multiturn",
     chatml(("user", "Hi! My name is Sam."),
            ("assistant", "Hello Sam! How can I help you today?"),
            ("user", "What is my name?"))),
    ("raw_fox", "The quick brown fox jumps over the lazy dog. The quick brown fox"),
    ("code_fib",
     'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("list_shopping", "Shopping list:\n1. Milk\n2. Eggs\n3."),
    ("story", "Once upon a time, in a small village at the edge of a dark "
              "forest, there lived"),
    ("math_qa", "Question: What is 12 times 7?\nAnswer:"),
    ("json_obj", '{"name": "Alice", "age": 30, "city": '),
    ("unicode_mixed",
     "Le café est très bon. Das Wetter ist schön. 日本語のテキスト。 Emoji: 🙂"),
    ("whitespace", "  Two leading spaces,\n\n\ttab-indented line\n    and four spaces:"),
    ("raw_paragraph",
     "The history of the printing press begins in the fifteenth century, when "
     "Johannes Gutenberg combined movable metal type, oil-based ink and a "
     "wooden screw press into a system that could produce books far faster "
     "than scribes. Within fifty years, presses were operating in more than "
     "two hundred cities across Europe, and millions of volumes had been "
     "printed. The spread of cheap books changed education, science and "
     "religion: ideas could now travel quickly, be copied exactly, and be "
     "argued over by readers who had never met. Historians still debate"),
]


def extra_bufts():
    """Whether llama.cpp may use its extra (weight-repacking) buffer types,
    its default. ZINFER_LLAMACPP_EXTRA_BUFTS=0 turns them off, for a build
    whose AMX buffer type crashes (a -march=native build on the project's
    virtualized Sapphire Rapids machines; scripts/setup builds without AMX)."""
    return os.environ.get("ZINFER_LLAMACPP_EXTRA_BUFTS", "1") != "0"


def open_llama(llama_cpp, model, **kw):
    """llama_cpp.Llama(model, **kw), honouring extra_bufts(). The Python
    wrapper does not expose the flag, so the default params are patched."""
    if extra_bufts():
        return llama_cpp.Llama(model_path=model, **kw)
    import llama_cpp.llama_cpp as low

    orig = low.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=model, **kw)
    finally:
        low.llama_model_default_params = orig


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def dump(path, obj):
    """{"meta": ..., "prompts": [...]} with one line per prompt (diffable)."""
    line = lambda o: json.dumps(o, ensure_ascii=False)  # noqa: E731
    body = ",\n  ".join(line(p) for p in obj["prompts"])
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'{{\n "meta": {line(obj["meta"])},\n "prompts": [\n  {body}\n ]\n}}\n')
    print(f"wrote {os.path.relpath(path, REPO)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=numpy_llama.DEFAULT_MODEL)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures"))
    a = ap.parse_args(argv)

    import llama_cpp

    os.makedirs(a.out, exist_ok=True)
    llm = open_llama(llama_cpp, a.model, n_ctx=N_CTX, n_threads=N_THREADS,
                     n_threads_batch=N_THREADS, logits_all=True, verbose=False)
    n_vocab = llm.n_vocab()
    meta = {
        "model_file": os.path.basename(a.model),
        "model_sha256": sha256(a.model),
        "llama_cpp_python": llama_cpp.__version__,
        "n_ctx": N_CTX,
        "n_threads": N_THREADS,
        "use_extra_bufts": extra_bufts(),
        "generator": "scripts/ref/make_fixtures.py",
    }

    # --- prompts.json: token ids from llama.cpp's tokenizer -----------------
    prompts = []
    for name, text in PROMPTS:
        # add_bos=True means "add the model's special prefix if its metadata
        # asks for one" (llama_tokenize add_special); SmolLM2 asks for none.
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        prompts.append({"name": name, "text": text, "ids": [int(t) for t in ids]})
    dump(os.path.join(a.out, "prompts.json"), {"meta": meta, "prompts": prompts})

    # --- greedy.json ---------------------------------------------------------
    ref_model = numpy_llama.load(a.model)
    greedy = []
    for p in prompts:
        llm.reset()
        llm.eval(p["ids"])
        toks, gaps = [], []
        for _ in range(GEN_TOKENS):
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top2 = np.partition(row, -2)[-2:]
            t = int(row.argmax())
            toks.append(t)
            gaps.append(round(float(top2[1] - top2[0]), 5))
            llm.eval([t])
        text = llm.detokenize(toks, special=True).decode("utf-8", errors="replace")
        rtoks, rgaps = ref_model.greedy(p["ids"], GEN_TOKENS)
        div = next((i for i, (x, y) in enumerate(zip(toks, rtoks)) if x != y), None)
        greedy.append({"name": p["name"], "prompt_ids": p["ids"], "token_ids": toks,
                       "text": text, "top2_gap": gaps, "ref_token_ids": rtoks,
                       "ref_top2_gap": [round(g, 5) for g in rgaps],
                       "ref_first_divergence": div})
        where = "same" if div is None else f"ref differs at step {div} (gap {gaps[div]:.4f})"
        print(f"greedy {p['name']:<22} min gap {min(gaps):.4f} {where}  {text[:40]!r}")
    dump(os.path.join(a.out, "greedy.json"),
         {"meta": dict(meta, max_tokens=GEN_TOKENS, temperature=0.0,
                       ignore_eos=True), "prompts": greedy})

    # --- logits_kl.json -------------------------------------------------------
    entries = []
    for p in prompts:
        n = len(p["ids"])
        if n > LOGITS_MAX_TOKENS:
            continue
        llm.reset()
        llm.eval(p["ids"])
        got = np.asarray(llm.scores[:n, :n_vocab], dtype=np.float64)
        ref = numpy_llama.logits(ref_model, p["ids"])
        kl = numpy_llama.kl(ref, got)
        am_ref, am_got = ref.argmax(-1), got.argmax(-1)
        srt = np.sort(ref, axis=-1)
        ref_gap = srt[:, -1] - srt[:, -2]
        bad = [int(i) for i in np.nonzero(am_ref != am_got)[0]]
        entries.append({
            "name": p["name"], "n_tokens": n,
            "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "argmax_agree": float((am_ref == am_got).mean()),
            "argmax_mismatch_positions": bad,
            "ref_top2_gap_at_mismatch": [round(float(ref_gap[i]), 5) for i in bad],
        })
        print(f"kl     {p['name']:<22} n={n:3d} mean {kl.mean():.3e} max {kl.max():.3e}"
              f" argmax agree {(am_ref == am_got).mean():.3f}")
    dump(os.path.join(a.out, "logits_kl.json"),
         {"meta": dict(meta, reference="scripts/ref/numpy_llama.py (float64)",
                       kl="KL(ref || llama.cpp) in nats, per position",
                       machine=platform.machine()),
          "prompts": entries})
    return 0


if __name__ == "__main__":
    sys.exit(main())
