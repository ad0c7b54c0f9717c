"""Gemma 3 270M (general.architecture "gemma3") against the float64 reference.

The prompts of tests/fixtures/gemma3.json (scripts/ref/make_gemma3_fixture.py:
seven short ones and a paragraph repeated to ~700 tokens, so that the local
layers' 512-position sliding window matters) are run through `zinfer
logits`; at the fixture's positions (every one of a short prompt; of the
long one, the first 8 and the last 96) the logits are compared with
scripts/ref/numpy_llama.py's float64 forward pass, computed live:
  - argmax equal to the reference's except at near-ties (top-2 gap < 0.01),
  - mean KL(ref || zinfer) < 1e-4 on each prompt, and no larger than
    llama.cpp's on the same positions (the fixture's numbers; recomputed
    live for two prompts when llama_cpp is importable, to check them).
Greedy: 64 tokens (EOS ignored) from zinfer equal the reference's (the
fixture's, made once: a minute of float64 work) except where a divergence
starts at a near-tie.
Also: a gemma3 file with a tensor missing or mis-shaped names that tensor.

Skipped when the model file is absent ($ZINFER_HOME/models/, `scripts/fetch-model
gemma3-270m`). 2.5 minutes on a shared 2-core machine at load average 7,
most of it the reference (20 s to dequantize the file, then the
262144-row output head) and reading the file's metadata for the tiny
files (the reference's greedy tokens are the fixture's, made once).
"""

import json
import os
import re
from pathlib import Path

import gguf
import gguf_meta
import numpy as np
import pytest
from gguf_files import write_gguf
from conftest import (ids_arg, last_json, load_fixture, report, run_all, run_each,
                      run_zinfer_lines, serve_process)
from zinfer_client import Client, ZinferError

import numpy_llama

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
GEMMA3 = Path(os.environ.get("ZINFER_GEMMA3", HOME / "models" / "gemma-3-270m-q4_k_m.gguf"))
FIX = load_fixture("gemma3.json")
NEAR_TIE = 0.01
MAX_MEAN_KL = 1e-4

pytestmark = pytest.mark.skipif(not GEMMA3.is_file(),
                                reason=f"{GEMMA3} absent (scripts/fetch-model gemma3-270m)")


@pytest.fixture(scope="module")
def ref_model():
    return numpy_llama.load(str(GEMMA3))


@pytest.fixture(scope="module")
def ref_logits(ref_model):
    """name -> the reference's float64 logits at the fixture's rows (cached)."""
    cache = {}

    def get(entry):
        if entry["name"] not in cache:
            cache[entry["name"]] = ref_model.forward(entry["ids"], rows=entry["rows"])
        return cache[entry["name"]]

    return get


def run_logits(run_zinfer, ids, out, last=0):
    """`zinfer logits` of ids: the rows of every position, or of the last
    `last` (--last) as a (rows, n_vocab) array."""
    res = run_zinfer("logits", "--model", GEMMA3, "--prompt-ids", ids_arg(ids), "--out", out,
                     "--ctx-size", "1024", *(["--last", last] if last else []), timeout=300)
    assert res.returncode == 0, f"zinfer logits failed: {res.stderr.strip()}"
    info = last_json(res.stdout)
    assert info["n_tokens"] == len(ids)
    rows = last or len(ids)
    assert info["rows_written"] == rows
    raw = np.fromfile(out, dtype="<f4")
    assert raw.size == rows * info["n_vocab"]
    return raw.reshape(rows, -1)


def zinfer_logits(run_zinfer, entry, tmp_path):
    ids, rows = entry["ids"], entry["rows"]
    out = tmp_path / f"{entry['name']}.f32"
    # The long prompt's rows are its first positions and its last ones:
    # those of a prefix run (causal: the same rows) and those of --last,
    # not 262144-wide rows of all ~700 positions (a 736 MB file).
    head = next((i for i, r in enumerate(rows) if r != i), len(rows))
    tail = rows[head:]
    if not tail:
        return run_logits(run_zinfer, ids, out)[rows].astype(np.float64)
    assert tail == list(range(len(ids) - len(tail), len(ids))), "rows: a head and a tail"
    got = run_logits(run_zinfer, ids, out, last=len(tail))
    if head:
        got = np.concatenate([run_logits(run_zinfer, ids[:head], out), got])
    return got.astype(np.float64)


@pytest.mark.no_zinfer
def test_fixture_covers_the_window():
    assert len(FIX["prompts"]) >= 8
    longest = max(len(e["ids"]) for e in FIX["prompts"])
    assert longest > 512 + 96, "no prompt reaches past the 512-position sliding window"


@pytest.mark.parametrize("entry", FIX["prompts"], ids=lambda e: e["name"])
def test_logits_match_reference(entry, ref_logits, run_zinfer, tmp_path):
    if os.environ.get("ZINFER_SANITIZED") == "1" and entry["name"] == "long_repeat":
        pytest.skip("release build only: under the sanitizers the window path is "
                    "checked by test_greedy_matches_reference[long_repeat]")
    got = zinfer_logits(run_zinfer, entry, tmp_path)
    assert np.isfinite(got).all(), "non-finite logits"
    ref = ref_logits(entry)
    kl = numpy_llama.kl(ref, got)
    mean_kl, max_kl = float(kl.mean()), float(kl.max())
    top2 = np.partition(ref, -2, axis=-1)[:, -2:]  # the two largest, in order
    gap = top2[:, 1] - top2[:, 0]
    flips = np.nonzero(ref.argmax(-1) != got.argmax(-1))[0]
    bad = [int(entry["rows"][i]) for i in flips if gap[i] >= NEAR_TIE]
    report("gemma3_logits", entry["name"], {
        "n_tokens": len(entry["ids"]), "rows": len(entry["rows"]), "zinfer_mean_kl": mean_kl,
        "zinfer_max_kl": max_kl, "llamacpp_mean_kl": entry["llamacpp_mean_kl"],
        "argmax_flips": [int(entry["rows"][i]) for i in flips]})
    print(f"\n{entry['name']}: {len(entry['ids'])} tokens, mean KL zinfer {mean_kl:.3e} "
          f"llama.cpp {entry['llamacpp_mean_kl']:.3e}; max KL zinfer {max_kl:.3e}")
    assert not bad, f"argmax differs from the reference at positions {bad} (not near-ties)"
    assert mean_kl < MAX_MEAN_KL, f"mean KL {mean_kl:.3e} >= {MAX_MEAN_KL}"
    assert mean_kl < entry["llamacpp_mean_kl"], "worse than llama.cpp"


@pytest.mark.no_zinfer
@pytest.mark.parametrize("entry", FIX["prompts"][:2], ids=lambda e: e["name"])
def test_llamacpp_fixture_is_current(entry, ref_logits):
    """llama.cpp's KL recomputed live agrees with the committed number."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(GEMMA3), logits_all=True, n_ctx=256, n_batch=256,
                          n_threads=2, verbose=False)
    assert llm.tokenize(entry["text"].encode(), add_bos=True, special=True) == entry["ids"]
    llm.eval(entry["ids"])
    got = np.array(llm.scores[: len(entry["ids"])], dtype=np.float64)[entry["rows"]]
    live = float(numpy_llama.kl(ref_logits(entry), got).mean())
    assert entry["llamacpp_mean_kl"] / 1.5 < live < entry["llamacpp_mean_kl"] * 1.5, live


@pytest.mark.parametrize("entry", [e for e in FIX["prompts"] if "ref_greedy" in e],
                         ids=lambda e: e["name"])
def test_greedy_matches_reference(entry, run_zinfer):
    n = FIX["meta"]["max_tokens"]
    res = run_zinfer("generate", "--model", GEMMA3, "--prompt-ids", ids_arg(entry["ids"]),
                     "--max-tokens", n, "--temperature", "0", "--ignore-eos", "--json",
                     "--ctx-size", "1024", timeout=300)
    assert res.returncode == 0, f"zinfer generate failed: {res.stderr.strip()}"
    got, want = last_json(res.stdout)["token_ids"], entry["ref_greedy"]
    assert len(got) == n
    step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    report("gemma3_greedy", entry["name"], {"first_divergence": step})
    if step is not None:
        gap = entry["ref_greedy_gap"][step]
        assert gap < NEAR_TIE, (f"diverges at step {step} (zinfer {got[step]}, reference "
                                f"{want[step]}) where the top-2 gap {gap:.4f} is no near-tie")


# ---- errors: a tiny gemma3 file (the real file's metadata, small shapes) ----

DIM, HEAD, NH, NKV, FF, LAYERS = 32, 16, 2, 1, 64, 2


def tiny_meta():
    """The real file's metadata as (key, value, type, sub_type) rows, read
    once, with small shapes."""
    reader = gguf_meta.read(str(GEMMA3), tensors=False)
    small = {"gemma3.embedding_length": DIM, "gemma3.block_count": LAYERS,
             "gemma3.feed_forward_length": FF, "gemma3.attention.head_count": NH,
             "gemma3.attention.head_count_kv": NKV, "gemma3.attention.key_length": HEAD,
             "gemma3.attention.value_length": HEAD, "gemma3.attention.sliding_window": 4}
    rows = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        rows.append((key, small.get(key, field.contents()), vtype, sub))
    # layer 0 local, layer 1 global
    rows.append(("gemma3.attention.sliding_window_pattern", 2, gguf.GGUFValueType.UINT32, None))
    return rows, len(reader.fields["tokenizer.ggml.tokens"].data)


def tiny_tensors(n_vocab):
    rng = np.random.default_rng(3)
    t = {"token_embd.weight": rng.standard_normal((n_vocab, DIM)).astype(np.float16),
         "output_norm.weight": np.ones(DIM, np.float32)}
    shapes = {"attn_norm": (DIM,), "ffn_norm": (DIM,), "post_attention_norm": (DIM,),
              "post_ffw_norm": (DIM,), "attn_q_norm": (HEAD,), "attn_k_norm": (HEAD,),
              "attn_q": (NH * HEAD, DIM), "attn_k": (NKV * HEAD, DIM),
              "attn_v": (NKV * HEAD, DIM), "attn_output": (DIM, NH * HEAD),
              "ffn_gate": (FF, DIM), "ffn_up": (FF, DIM), "ffn_down": (DIM, FF)}
    for L in range(LAYERS):
        for name, shape in shapes.items():
            t[f"blk.{L}.{name}.weight"] = (rng.standard_normal(shape) * 0.2).astype(np.float32)
    return t


def write_tiny(path, meta, tensors):
    return write_gguf(path, "gemma3", meta, tensors={n: (d, None) for n, d in tensors.items()})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    meta, n_vocab = tiny_meta()
    return tmp_path_factory.mktemp("gemma3_tiny"), meta, tiny_tensors(n_vocab)


def test_tiny_gemma3_matches_reference(tiny, run_zinfer, tmp_path):
    """The tiny file runs, with a 4-position window on layer 0 (1 is
    global), and agrees with the reference (random weights: a sharp check
    of the window, the norms and GeGLU without the real model's scale)."""
    d, meta, t = tiny
    path = write_tiny(d / "ok.gguf", meta, t)
    ids = [2, 100, 2000, 30, 4, 5000, 77, 9, 123, 456, 789, 10, 11, 12]
    entry = {"name": "tiny", "ids": ids, "rows": list(range(len(ids)))}
    out = tmp_path / "tiny.f32"
    res = run_zinfer("logits", "--model", path, "--prompt-ids", ids_arg(ids), "--out", out)
    assert res.returncode == 0, res.stderr
    got = np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
    m = numpy_llama.Model(str(path))
    assert m.local == [True, False] and m.window == 4
    ref = m.forward(ids)
    kl = numpy_llama.kl(ref, got)
    assert kl.mean() < 1e-4, kl
    # the window matters here: without it the reference differs
    m.window = 0
    m.local = [False, False]
    assert numpy_llama.kl(m.forward(ids), got).mean() > 100 * kl.mean()


@pytest.mark.parametrize("tensor,shape", [("blk.1.attn_q_norm.weight", None),
                                          ("blk.0.post_ffw_norm.weight", (DIM + 1,)),
                                          ("blk.1.attn_k.weight", (NKV * HEAD, DIM + 32))])
def test_missing_or_misshaped_tensor_named(tensor, shape, tiny, run_zinfer, tmp_path):
    d, meta, t = tiny
    t = dict(t)
    if shape is None:
        del t[tensor]
    else:
        t[tensor] = np.zeros(shape, np.float32)
    path = write_tiny(d / f"bad_{tensor}.gguf", meta, t)
    res = run_zinfer("logits", "--model", path, "--prompt-ids", "2,3", "--out", tmp_path / "o")
    err = res.stderr.strip()
    assert 0 < res.returncode < 128, err
    assert len(err.splitlines()) == 1, err
    assert re.search(re.escape(tensor), err), err
    assert ("missing" in err) == (shape is None), err


# ---- served: 32 concurrent streams ------------------------

@pytest.mark.skipif(os.environ.get("ZINFER_SANITIZED") == "1",
                    reason="32 zinfer generate runs of the 270M model: release build only "
                           "(the served batching path runs under the sanitizers elsewhere)")
def test_served_32_streams_equal_generate(zinfer_bin, run_zinfer, tmp_path):
    """Gemma 3 through `zinfer serve`: 32 streaming requests sent at once,
    among them the 702-token prompt that crosses the sliding window; nine
    of them (every fourth and the long one) give the tokens `zinfer
    generate` gives for that prompt alone."""
    texts = [f"Question {i}: name a colour, a city and the number {i * 7}." for i in range(31)]
    ids = run_zinfer_lines(zinfer_bin, GEMMA3, ["tokenize"], [json.dumps(t) for t in texts])
    long_ids = next(e["ids"] for e in FIX["prompts"] if e["name"] == "long_repeat")
    prompts = ids + [long_ids]
    n = 16
    sp = {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}
    with serve_process(zinfer_bin, GEMMA3, tmp_path / "serve.log", "--threads-per-worker", 2,
                       "--slots", 32, "--ctx-size", 1024) as srv:
        with Client(srv.addr, timeout_s=600) as c:
            together = run_all(c, prompts, sp)
            # The PyPI file carries no chat template: messages are refused
            # by name (--chat-template supplies one: test_chat_template_option.py).
            with pytest.raises(ZinferError, match="the model has no chat template"):
                c.complete(messages=[{"role": "user", "content": "Hi"}])
    # Every fourth short prompt and the long one alone through the CLI (each
    # run loads the 262,144-token vocabulary, so two runs at a time, on the
    # default threads as served): the batch is the same.
    chosen = [(p, got) for k, (p, got) in enumerate(zip(prompts, together))
              if k % 4 == 0 or p is long_ids]
    runs = run_each(lambda *a: run_zinfer(*a, timeout=300),
                    [("generate", "--model", GEMMA3, "--prompt-ids", ids_arg(p), "--max-tokens", n,
                      "--temperature", "0", "--ignore-eos", "--json", "--ctx-size", "1024")
                     for p, _ in chosen], one_thread=False)
    for (p, got), res in zip(chosen, runs):
        assert res.returncode == 0, res.stderr
        assert got == last_json(res.stdout)["token_ids"], (len(p), got)
    report("gemma3_served", "streams_equal_generate", len(prompts))
