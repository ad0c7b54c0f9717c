#!/usr/bin/env python3
"""Writes tests/fixtures/gemma3.json for tests/e2e/test_gemma3.py.

For each prompt below, on Gemma 3 270M (the packaged gemma3-270m file):
  - its token ids (llama.cpp's tokenizer, BOS added, special tokens parsed),
  - the positions the test compares ("rows": every position of a short
    prompt; of the long one, the first 8 and the last 96, past the
    512-position sliding window),
  - llama.cpp's KL from the float64 reference (scripts/ref/numpy_llama.py)
    over those rows (llama-cpp-python, logits_all=True), so that the test
    compares zinfer against it without llama_cpp installed,
and for the GREEDY prompts, the reference's 64 greedy tokens (EOS not
special) with each step's top-2 logit gap: the reference's greedy run is
a minute of float64 work, done once here.

Usage: make_gemma3_fixture.py [--model PATH] [--out tests/fixtures/gemma3.json]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_llama  # noqa: E402  (sets OPENBLAS_NUM_THREADS before numpy)

import numpy as np  # noqa: E402

HOME = os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer"))
DEFAULT_MODEL = os.path.join(HOME, "models", "gemma-3-270m-q4_k_m.gguf")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting each of "
    "the one hundred and twelve steps, checking the brass lamp, trimming the wick and wiping "
    "the salt from the great lens so that the ships beyond the reef would see the light. "
)
PROMPTS = [
    ("capitals", "The capital of France is Paris, and the capital of Germany is"),
    ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("translate", "Translate to French: The weather is nice today. ->"),
    ("numbers", "1, 1, 2, 3, 5, 8, 13, 21,"),
    ("chat", "<start_of_turn>user\nWhat is the boiling point of water at sea level?"
             "<end_of_turn>\n<start_of_turn>model\n"),
    ("science", "Photosynthesis is the process by which green plants use sunlight to"),
    ("long_repeat", PARAGRAPH * 14),
]
GREEDY = ["story", "long_repeat"]
MAX_TOKENS = 64


def rows_for(n):
    return list(range(n)) if n <= 128 else list(range(8)) + list(range(n - 96, n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "gemma3.json"))
    a = ap.parse_args()
    import llama_cpp

    llm = llama_cpp.Llama(model_path=a.model, logits_all=True, n_ctx=1024, n_batch=1024,
                          n_threads=2, verbose=False)
    t0 = time.time()
    ref = numpy_llama.load(a.model)
    print(f"reference loaded in {time.time() - t0:.0f} s", file=sys.stderr)
    out = {"meta": {"model": os.path.basename(a.model), "max_tokens": MAX_TOKENS,
                    "llama_cpp_python": llama_cpp.__version__}, "prompts": []}
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        rows = rows_for(len(ids))
        llm.reset()
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float64)[rows]
        z = ref.forward(ids, rows=rows)
        kl = numpy_llama.kl(z, got)
        top2 = np.sort(z, axis=-1)[:, -2:]
        entry = {"name": name, "text": text, "ids": [int(t) for t in ids], "rows": rows,
                 "llamacpp_mean_kl": float(kl.mean()), "llamacpp_max_kl": float(kl.max()),
                 "llamacpp_argmax_flips": int((z.argmax(-1) != got.argmax(-1)).sum()),
                 "ref_min_top2_gap": float((top2[:, 1] - top2[:, 0]).min())}
        if name in GREEDY:
            toks, gaps = ref.greedy(ids, MAX_TOKENS)
            entry["ref_greedy"] = toks
            entry["ref_greedy_gap"] = gaps
        out["prompts"].append(entry)
        print(f"{name}: {len(ids)} tokens, llama.cpp mean KL {kl.mean():.3e} "
              f"({time.time() - t0:.0f} s)", file=sys.stderr)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
