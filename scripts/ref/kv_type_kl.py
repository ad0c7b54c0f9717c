#!/usr/bin/env python3
"""Mean KL from the float64 reference for each --kv-type, zinfer's and llama.cpp's.

For every prompt of tests/fixtures/logits_kl.json: `zinfer logits --kv-type T`
for T in default, f16, q8_0, q4_0, and llama.cpp (llama-cpp-python, in the
venv: scripts/setup --with-llamacpp) with the same cache type for K and V
(type_k = type_v = GGML_TYPE_F16, Q8_0 or Q4_0; flash attention on, which
llama.cpp needs for a quantized V), n_ctx 2048, 2 threads, on the same file.
KL(ref || got) per position (scripts/ref/numpy_llama.py), averaged over a
prompt's positions; prints one line per prompt and the mean over prompts of
each column. docs/engine.md ("KV cache") quotes the output.

    ~/.cache/zinfer/venv/bin/python scripts/ref/kv_type_kl.py [--zinfer build/zinfer]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import numpy_llama  # noqa: E402

TYPES = ["default", "f16", "q8_0", "q4_0"]
GGML_TYPE = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type values


def zinfer_logits(zinfer, model, ids, kv_type, tmp):
    out = os.path.join(tmp, "logits.f32")
    subprocess.run([zinfer, "logits", "--model", model, "--prompt-ids",
                    ",".join(str(i) for i in ids), "--out", out, "--kv-type", kv_type],
                   check=True, capture_output=True)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=numpy_llama.DEFAULT_MODEL)
    ap.add_argument("--zinfer", default=os.path.join(REPO, "build", "zinfer"))
    ap.add_argument("--no-llamacpp", action="store_true")
    a = ap.parse_args(argv)
    with open(os.path.join(REPO, "tests", "fixtures", "logits_kl.json")) as f:
        names = [e["name"] for e in json.load(f)["prompts"]]
    with open(os.path.join(REPO, "tests", "fixtures", "prompts.json")) as f:
        ids_of = {p["name"]: p["ids"] for p in json.load(f)["prompts"]}
    ref_model = numpy_llama.load(a.model)
    llms = {}
    if not a.no_llamacpp:
        import llama_cpp
        for t, g in GGML_TYPE.items():
            llms[t] = llama_cpp.Llama(model_path=a.model, n_ctx=2048, n_threads=2,
                                      n_threads_batch=2, logits_all=True, verbose=False,
                                      type_k=g, type_v=g, flash_attn=True)
    cols = [f"zinfer {t}" for t in TYPES] + [f"llama.cpp {t}" for t in llms]
    rows = []
    print(f"{'prompt':<22} {'n':>4} " + " ".join(f"{c:>15}" for c in cols))
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            ids = ids_of[name]
            ref = numpy_llama.logits(ref_model, ids)
            row = [float(numpy_llama.kl(ref, zinfer_logits(a.zinfer, a.model, ids, t, tmp)).mean())
                   for t in TYPES]
            for t, llm in llms.items():
                llm.reset()
                llm.eval(ids)
                got = np.asarray(llm.scores[:len(ids), :ref.shape[1]], dtype=np.float64)
                row.append(float(numpy_llama.kl(ref, got).mean()))
            rows.append(row)
            print(f"{name:<22} {len(ids):>4} " + " ".join(f"{v:>15.3e}" for v in row))
    mean = np.mean(np.array(rows), axis=0)
    print(f"{'mean':<22} {'':>4} " + " ".join(f"{v:>15.3e}" for v in mean))


if __name__ == "__main__":
    main()
