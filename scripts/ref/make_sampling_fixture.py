#!/usr/bin/env python3
"""Write tests/fixtures/llamacpp_top5.json: llama.cpp's five largest logits
after a few prompts, for the through-the-server sampling test
(tests/e2e/test_sampling_server.py), which draws 1,000 single tokens with
top_k=5, temperature 1 and compares their frequencies with the softmax of
these five logits.

Needs llama-cpp-python in the venv (scripts/setup --with-llamacpp). llama.cpp
evaluates the prompt in one batch (n_ctx=2048, n_threads=2, otherwise its
defaults), as the other fixtures do. Deterministic.
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The test draws from chat_fruit: there llama.cpp's five largest logits are
# the float64 reference's five too, with a 0.56 gap to the sixth. Not every
# prompt is like that: after story_start llama.cpp ranks 2727 fifth, which
# the reference ranks seventh (docs/references.md).
PROMPTS = [
    ("chat_fruit", "<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n"),
    ("favorite_color", "My favorite color is"),
    ("story_start", "Once upon a time, there was a"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures",
                                                  "llamacpp_top5.json"))
    args = ap.parse_args()
    import llama_cpp
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=2048, n_threads=2, logits_all=True,
                          verbose=False)
    out = {"model": os.path.basename(args.model),
           "llama_cpp_python": llama_cpp.__version__, "prompts": []}
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
        top = sorted(range(len(logits)), key=lambda i: (-logits[i], i))[:5]
        out["prompts"].append({"name": name, "text": text, "ids": ids,
                               "top5_ids": top,
                               "top5_logits": [float(logits[i]) for i in top]})
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
