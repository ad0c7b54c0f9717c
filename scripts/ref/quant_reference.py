#!/usr/bin/env python3
"""llama.cpp against the float64 reference on issue 20's quantized models.

For each file that scripts/make-quant-models made, and for each of PROMPTS
(token ids from tests/fixtures/prompts.json), computes the float64 reference
logits (scripts/ref/numpy_llama.py: the `gguf` package dequantizes every
tensor type) and llama.cpp's logits on the same file at every position, and
writes tests/fixtures/quant_llamacpp_kl.json:

  per file    its sha256 and tensor-type mix; mean KL(reference || llama.cpp)
              over all positions of all prompts, max KL, the number of
              positions where the argmaxes differ and how many of those are
              near-ties (reference top-2 gap < NEAR_TIE), and the number of
              near-tie positions in all
  per prompt  mean KL, the reference's top-1 id at each position, the
              positions where llama.cpp's argmax differs, the reference's
              GEN_TOKENS-token greedy continuation (EOS ignored), and where
              llama.cpp's greedy continuation first leaves it (with the
              reference's top-2 gap there)

tests/e2e/test_quant_types.py holds zinfer to these numbers. llama.cpp runs
as in make_fixtures.py (n_ctx 2048, 2 threads, otherwise its defaults).
Needs llama-cpp-python and the files (scripts/setup --with-llamacpp).
Both sides are deterministic for a given llama-cpp-python build and machine,
so a re-run should give the same file (not re-checked). CPU heavy: 1 to 3
minutes per model file on 2 shared cores, 19 minutes for all 11.
"""

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import numpy_llama  # noqa: E402  (before numpy: one BLAS thread)
import numpy as np  # noqa: E402
import quant_models  # noqa: E402
from make_fixtures import N_CTX, N_THREADS, extra_bufts, open_llama, sha256  # noqa: E402

NEAR_TIE = 0.01
GEN_TOKENS = 64
# Ten of tests/fixtures/prompts.json's prompts, the shorter ones (14-38
# tokens), chat, prose, code, lists, JSON and non-ASCII text among them.
PROMPTS = ["chat_capital", "chat_haiku", "chat_system_spider", "chat_multiturn", "raw_fox",
           "code_fib", "list_shopping", "math_qa", "json_obj", "unicode_mixed"]
OUT = os.path.join(REPO, "tests", "fixtures", "quant_llamacpp_kl.json")


def top2_gap(z):
    """Gap between the two largest logits of each row of z [n, vocab]."""
    s = np.partition(z, -2, axis=-1)[..., -2:]
    return s[..., 1] - s[..., 0]


def llama_greedy(llm, ids, n):
    """llama.cpp's n greedy tokens after ids (EOS ignored), as make_fixtures.py."""
    llm.reset()
    llm.eval(ids)
    toks = []
    for _ in range(n):
        t = int(np.asarray(llm.scores[llm.n_tokens - 1]).argmax())
        toks.append(t)
        llm.eval([t])
    return toks


def measure(llama_cpp, qtype, path, prompts, gen_tokens, threads):
    """The fixture entry of one model file."""
    t0 = time.monotonic()
    ref_model = numpy_llama.Model(path)  # not load(): one file in memory at a time
    llm = open_llama(llama_cpp, path, n_ctx=N_CTX, n_threads=threads,
                     n_threads_batch=threads, logits_all=True, verbose=False)
    n_vocab = llm.n_vocab()
    assert n_vocab == ref_model.n_vocab, (n_vocab, ref_model.n_vocab)
    kls, entries = [], []
    n_mismatch = n_mismatch_tie = n_tie = 0
    for p in prompts:
        ids, n = p["ids"], len(p["ids"])
        llm.reset()
        llm.eval(ids)
        got = np.asarray(llm.scores[:n, :n_vocab], dtype=np.float64)
        ref = numpy_llama.logits(ref_model, ids)
        kl = numpy_llama.kl(ref, got)
        kls.append(kl)
        am_ref, am_got = ref.argmax(-1), got.argmax(-1)
        gap = top2_gap(ref)
        bad = [int(i) for i in np.nonzero(am_ref != am_got)[0]]
        n_mismatch += len(bad)
        n_mismatch_tie += sum(gap[i] < NEAR_TIE for i in bad)
        n_tie += int((gap < NEAR_TIE).sum())

        rtoks, rgaps = ref_model.greedy(ids, gen_tokens)
        ltoks = llama_greedy(llm, ids, gen_tokens)
        div = next((i for i, (x, y) in enumerate(zip(rtoks, ltoks)) if x != y), None)
        entries.append({
            "name": p["name"], "n_tokens": n, "mean_kl": float(kl.mean()),
            "ref_top1": [int(t) for t in am_ref],
            "llamacpp_argmax_mismatch_positions": bad,
            "ref_greedy": rtoks,
            "ref_greedy_min_gap": round(min(rgaps), 5),
            "llamacpp_greedy_divergence": div,
            "ref_gap_at_llamacpp_divergence": None if div is None else round(rgaps[div], 5),
        })
    allkl = np.concatenate(kls)
    mix = quant_models.type_mix(path)
    entry = {
        "type": qtype, "file": os.path.basename(path), "sha256": sha256(path),
        "type_mix": mix, "n_positions": int(allkl.size),
        "llamacpp_mean_kl": float(allkl.mean()), "llamacpp_max_kl": float(allkl.max()),
        "llamacpp_argmax_mismatches": n_mismatch,
        "llamacpp_argmax_mismatches_near_tie": int(n_mismatch_tie),
        "ref_near_ties": n_tie,
        "llamacpp_greedy_diverging_prompts": sum(
            e["llamacpp_greedy_divergence"] is not None for e in entries),
        "prompts": entries,
    }
    print(f"{qtype:<9} mean KL {allkl.mean():.3e} max {allkl.max():.3e}  argmax differs at "
          f"{n_mismatch}/{allkl.size} ({n_mismatch_tie} near-ties; {n_tie} near-ties in all)  "
          f"greedy differs on {entry['llamacpp_greedy_diverging_prompts']}/{len(entries)}  "
          f"{time.monotonic() - t0:.0f} s  [{quant_models.format_mix(mix)}]", flush=True)
    return entry


def write(path, obj):
    """JSON with one line per (file, prompt), so that diffs stay readable."""
    line = lambda o: json.dumps(o, ensure_ascii=False)  # noqa: E731
    files = []
    for f in obj["files"]:
        head = line({k: v for k, v in f.items() if k != "prompts"})[:-1]
        body = ",\n    ".join(line(p) for p in f["prompts"])
        files.append(f'{head}, "prompts": [\n    {body}\n  ]}}')
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f'{{\n "meta": {line(obj["meta"])},\n "files": [\n  '
                 + ",\n  ".join(files) + "\n ]\n}\n")
    os.replace(tmp, path)
    print(f"wrote {os.path.relpath(path, REPO)} ({os.path.getsize(path)} bytes)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quant-dir", default=quant_models.QUANT_DIR)
    ap.add_argument("--types", default=",".join(quant_models.TYPES),
                    help="comma-separated (default: every type make-quant-models makes)")
    ap.add_argument("--prompts", default=",".join(PROMPTS),
                    help="comma-separated names from tests/fixtures/prompts.json")
    ap.add_argument("--gen-tokens", type=int, default=GEN_TOKENS)
    ap.add_argument("--threads", type=int, default=N_THREADS)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)

    try:
        import llama_cpp
    except ImportError:
        sys.exit("quant_reference.py: llama-cpp-python is not installed "
                 "(run scripts/setup --with-llamacpp)")
    with open(os.path.join(REPO, "tests", "fixtures", "prompts.json"), encoding="utf-8") as f:
        known = {p["name"]: p for p in json.load(f)["prompts"]}
    names = [s.strip() for s in a.prompts.split(",") if s.strip()]
    missing = [s for s in names if s not in known]
    if missing:
        sys.exit(f"quant_reference.py: unknown prompt(s) {missing} "
                 "(see tests/fixtures/prompts.json)")
    prompts = [known[s] for s in names]
    types = [s.strip() for s in a.types.split(",") if s.strip()]
    paths = {t: quant_models.path_for(t, a.quant_dir) for t in types}
    absent = [p for p in paths.values() if not os.path.isfile(p)]
    if absent:
        sys.exit(f"quant_reference.py: missing {absent} (run scripts/make-quant-models)")

    t0 = time.monotonic()
    files = [measure(llama_cpp, t, paths[t], prompts, a.gen_tokens, a.threads) for t in types]
    meta = {
        "source_model": os.path.basename(quant_models.SOURCE_MODEL),
        "made_by": "scripts/make-quant-models (llama_model_quantize, allow_requantize)",
        "llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX, "n_threads": a.threads,
        "use_extra_bufts": extra_bufts(), "machine": platform.machine(),
        "reference": "scripts/ref/numpy_llama.py (float64)",
        "kl": "KL(ref || llama.cpp) in nats, per position, mean over all positions",
        "near_tie": f"reference top-2 logit gap < {NEAR_TIE}", "near_tie_gap": NEAR_TIE,
        "gen_tokens": a.gen_tokens, "prompts": names,
        "generator": "scripts/ref/quant_reference.py",
    }
    print(f"{len(files)} files in {time.monotonic() - t0:.0f} s")
    write(a.out, {"meta": meta, "files": files})
    return 0


if __name__ == "__main__":
    sys.exit(main())
