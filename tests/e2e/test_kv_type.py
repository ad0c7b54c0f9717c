"""--kv-type: the KV cache's formats (docs/engine.md, "KV cache").

- The default (int16 K rows with a float scale, float16 V) is unchanged:
  `--kv-type default` writes the same logits bytes as no option.
- f16, q8_0 and q4_0 keep the logits near the float64 reference
  (scripts/ref/numpy_llama.py) on the prompts of tests/fixtures/logits_kl.json:
  a mean KL under each format's bound, and q8_0's no larger than llama.cpp's
  own with its default float16 cache on the same file (the committed
  number; llama.cpp's with a q8_0 cache is larger still: docs/engine.md).
- A worker with --kv-type q8_0 sizes its cache by the smaller rows (the
  same --kv-cache-bytes hold more positions), logs the type, and serves the
  tokens `zinfer generate --kv-type q8_0` gives.
- The disk tier keeps q8_0 blocks apart: a second serve on the directory
  reads them back (the same tokens, every eligible block a disk hit), a
  default-type serve on it finds none of them.
- Bad values and a CUDA device with a non-default type are refused.
"""

import re
import subprocess

import numpy as np
import pytest
from conftest import ids_arg, kv_when, last_json, load_fixture, report, serve_process
from test_cli_info import expected_info, field

import numpy_llama
from zinfer_client import Client  # conftest puts clients/python on the path

KL_FIXTURE = load_fixture("logits_kl.json")
ENTRIES = KL_FIXTURE["prompts"][:4]
# Mean KL bounds (nats) per format, a few times the largest each measured
# on these prompts (docs/engine.md): f16 2.0e-6, q8_0 4.6e-4, q4_0 0.12.
BOUND = {"f16": 1e-5, "q8_0": 2e-3, "q4_0": 0.3}


def logits(run_zinfer, model_path, ids, out, *extra):
    res = run_zinfer("logits", "--model", model_path, "--prompt-ids", ids_arg(ids), "--out",
                     out, *extra)
    assert res.returncode == 0, f"zinfer logits failed: {res.stderr.strip()}"
    assert last_json(res.stdout)["n_tokens"] == len(ids)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def test_default_is_unchanged(prompts, run_zinfer, model_path, tmp_path):
    ids = prompts[ENTRIES[0]["name"]]["ids"]
    a = logits(run_zinfer, model_path, ids, tmp_path / "none.f32")
    b = logits(run_zinfer, model_path, ids, tmp_path / "default.f32", "--kv-type", "default")
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_kl_from_reference(entry, kv_type, prompts, reference, run_zinfer, model_path,
                           tmp_path):
    ids = prompts[entry["name"]]["ids"]
    got = logits(run_zinfer, model_path, ids, tmp_path / "l.f32", "--kv-type", kv_type)
    got = got.astype(np.float64)
    assert np.isfinite(got).all()
    mean_kl = float(numpy_llama.kl(reference(ids), got).mean())
    report("kv_type_kl", f"{entry['name']}/{kv_type}",
           {"mean_kl": mean_kl, "llamacpp_f16_mean_kl": entry["mean_kl"]})
    print(f"\n{entry['name']} --kv-type {kv_type}: mean KL {mean_kl:.3e} "
          f"(llama.cpp, float16 cache: {entry['mean_kl']:.3e})")
    assert mean_kl < BOUND[kv_type], mean_kl
    if kv_type != "q4_0":
        assert mean_kl <= entry["mean_kl"], "worse than llama.cpp with a float16 cache"


def per_token(model_path, row_bytes):
    """K and V bytes a position takes in every layer, rows of row_bytes(hd)."""
    r = expected_info(model_path)["reader"]
    heads = field(r, "llama.attention.head_count")
    kv_heads = field(r, "llama.attention.head_count_kv") or heads
    hd = field(r, "llama.embedding_length") // heads
    return field(r, "llama.block_count") * kv_heads * 2 * row_bytes(hd)


def test_worker_sizes_and_serves_q8_0(zinfer_bin, run_zinfer, model_path, tmp_path):
    budget = 4 << 20
    per_tok = per_token(model_path, lambda hd: hd // 32 * 34)
    blocks = budget // (per_tok * 16)
    # the default rows take ~1.9x the bytes: fewer blocks in the same budget
    assert blocks > budget // (per_token(model_path, lambda hd: hd * 2 + 2) * 16) * 1.8
    prompt = "The capital of France is"
    res = run_zinfer("generate", "--model", model_path, "--prompt", prompt, "--max-tokens", "12",
                     "--temperature", "0", "--ignore-eos", "--json", "--kv-type", "q8_0")
    assert res.returncode == 0, res.stderr
    want = last_json(res.stdout)
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log", "--kv-type", "q8_0",
                       "--kv-cache-bytes", budget, "--slots", "2") as srv:
        log = srv.log()
        assert f"KV cache: {blocks} blocks x 16 tokens = {blocks * 16} tokens" in log, log
        assert f"--kv-type q8_0, {per_tok} bytes per token" in log, log
        with Client(srv.addr, timeout_s=60) as c:
            _, ids, fin = c.complete(prompt=want["prompt_token_ids"], sampling_params={
                "max_new_tokens": 12, "ignore_eos": True, "temperature": 0})
    assert ids == want["token_ids"], (ids, want["token_ids"])


def test_bad_values_refused(run_zinfer, zinfer_bin, model_path):
    res = run_zinfer("logits", "--model", model_path, "--prompt", "hi", "--out", "/dev/null",
                     "--kv-type", "q5_0")
    assert res.returncode == 2
    assert "--kv-type: 'q5_0' is not default, f16, q8_0 or q4_0" in res.stderr
    worker = zinfer_bin.parent / "zinfer-worker"
    for cmd in ([str(worker)], [str(zinfer_bin), "serve", "--model", str(model_path)]):
        res = subprocess.run(cmd + ["--check-args", "--device", "cuda:0", "--kv-type", "q8_0"],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 2, res
        assert re.search(r"--kv-type q8_0 is a CPU option: the CUDA backend keeps float32",
                         res.stderr), res.stderr



def test_disk_tier_keeps_types_apart(zinfer_bin, model_path, tmp_path):
    prompt = [1] + [(900 + 53 * k) % 30000 + 300 for k in range(99)]
    eligible = (len(prompt) - 1) // 16
    sp = {"max_new_tokens": 6, "temperature": 0}
    d = tmp_path / "kv"

    def serve(name, kv_type):
        with serve_process(zinfer_bin, model_path, tmp_path / f"{name}.log", "--kv-type",
                           kv_type, "--slots", "2", "--ctx-size", "256", "--kv-disk", d) as srv:
            with Client(srv.addr, timeout_s=60) as c:
                _, ids, _ = c.complete(prompt=prompt, sampling_params=sp)
                k = kv_when(c, lambda k: k["disk_written"] >= eligible or k["disk_hit_blocks"])
            return ids, k

    cold, k = serve("cold", "q8_0")
    assert k["disk_written"] >= eligible and k["disk_hit_blocks"] == 0, k
    warm, k = serve("warm", "q8_0")
    assert warm == cold
    assert k["disk_hit_blocks"] == eligible, k
    _, k = serve("default", "default")
    assert k["disk_hit_blocks"] == 0, k
