"""LoRA adapters (docs/lora.md) in llama.cpp's GGUF adapter format.

Random-weight adapters for the default model (scripts/ref/make_lora.py:
rank 8 on attn_q/k/v/output and ffn_gate/up/down, as llama.cpp's
converter writes them) and:

- `zinfer logits --lora` against the float64 reference with the same
  adapter (numpy_llama.forward(lora=...)): mean KL below 1e-4, and below
  llama.cpp's with the same adapter (llama-cpp-python, when installed);
- a served batch of 16 streams over 4 adapters and none, each stream's
  greedy tokens equal to the same request alone (per-row adapters are
  batch invariant), the adapters by id and by name, and a prefix computed
  under one adapter never reused under another;
- broken adapter files refused at load with one line naming the problem.
"""

import subprocess

import numpy as np
import pytest
from conftest import ids_arg, kv_when, llamacpp_logits, report, serve_process

import make_lora
import numpy_llama
from zinfer_client import Client, ZinferError

MAX_MEAN_KL = 1e-4
B_STD = 0.06  # adapters that change the greedy tokens of most prompts
IDS = [1, 504, 3458, 282, 4114, 314, 253, 1345, 30, 378, 3458, 282, 4114, 314, 253, 1345, 27,
       476, 1086, 9, 216, 1780, 314, 253, 3726, 28]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, model_path):
    d = tmp_path_factory.mktemp("lora")
    paths = []
    for i in range(4):
        p = d / f"ad{i}.gguf"
        make_lora.write(str(p), str(model_path), rank=8, alpha=16, seed=10 + i, b_std=B_STD,
                        dtype=np.float16 if i == 3 else np.float32)
        paths.append(p)
    return paths


def zinfer_logits(run_zinfer, model_path, tmp_path, ids, *lora):
    out = tmp_path / "logits.bin"
    args = ["logits", "--model", str(model_path), "--prompt-ids", ids_arg(ids), "--out",
            str(out), "--log-level", "warn"]
    for spec in lora:
        args += ["--lora", spec]
    r = run_zinfer(*args)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, np.float32).reshape(len(ids), -1).astype(np.float64)


@pytest.fixture(scope="module")
def measured(adapters, model_path, tmp_path_factory, zinfer_bin):
    """The float64 reference and zinfer's logits, one adapter at 0.75."""
    model = numpy_llama.load(str(model_path))
    ad = numpy_llama.Adapter(str(adapters[0]))
    ref = model.forward(IDS, lora=[(ad, 0.75)])

    def run(*args):
        return subprocess.run([str(zinfer_bin), *args], capture_output=True, text=True,
                              timeout=120)

    got = zinfer_logits(run, model_path, tmp_path_factory.mktemp("m"), IDS,
                        f"x={adapters[0]}:0.75")
    return {"model": model, "ad": ad, "ref": ref, "kl": float(numpy_llama.kl(ref, got).mean())}


def test_logits_match_float64_reference(measured, adapters, run_zinfer, model_path, tmp_path):
    model, ad, ref, kl = measured["model"], measured["ad"], measured["ref"], measured["kl"]
    effect = float(numpy_llama.kl(ref, model.forward(IDS)).mean())
    # two adapters at once (the float16 one among them)
    ad3 = numpy_llama.Adapter(str(adapters[3]))
    ref2 = model.forward(IDS, lora=[(ad, 1.0), (ad3, -0.5)])
    got2 = zinfer_logits(run_zinfer, model_path, tmp_path, IDS, f"x={adapters[0]}",
                         f"y={adapters[3]}:-0.5")
    kl2 = float(numpy_llama.kl(ref2, got2).mean())
    print(f"\nLoRA mean KL vs float64: zinfer {kl:.3e} (two adapters {kl2:.3e}); "
          f"the adapter's own effect {effect:.3e}")
    report("lora", "logits", {"zinfer_mean_kl": kl, "zinfer_two_adapters_mean_kl": kl2,
                              "adapter_effect_kl": effect})
    assert effect > 100 * MAX_MEAN_KL, "the adapter changes too little to test anything"
    assert kl < MAX_MEAN_KL and kl2 < MAX_MEAN_KL, (kl, kl2)


def test_llamacpp_further_from_reference(measured, adapters, model_path):
    """llama.cpp with the same adapter and scale (its 8-bit activations)."""
    lc, = llamacpp_logits(model_path, [IDS], lora_path=str(adapters[0]), lora_scale=0.75,
                          n_ctx=128, n_threads=2)
    llama_kl = float(numpy_llama.kl(measured["ref"], lc).mean())
    print(f"\nLoRA mean KL vs float64: zinfer {measured['kl']:.3e}, llama.cpp {llama_kl:.3e}")
    report("lora", "llamacpp", {"zinfer_mean_kl": measured["kl"], "llamacpp_mean_kl": llama_kl})
    assert measured["kl"] < llama_kl, (measured["kl"], llama_kl)


PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "My favourite food is",
           "Explain gravity to a child:"]


def test_served_batch_per_row_adapters(adapters, zinfer_bin, model_path, tmp_path):
    lora_args = []
    for i, p in enumerate(adapters):
        lora_args += ["--lora", f"ad{i}={p}"]
    sp = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    # 16 streams: 4 prompts x (none, ad0 by id, ad1 by name at 0.5, ad2 + ad3)
    choices = [None, [{"id": 0, "scale": 1.0}], [{"name": "ad1", "scale": 0.5}],
               [{"id": 2, "scale": 1.0}, {"name": "ad3", "scale": 0.8}]]
    reqs = [(p, ch) for p in PROMPTS for ch in choices]

    def req(p, ch):
        r = {"op": "generate", "prompt": p, "sampling_params": sp}
        if ch:
            r["lora"] = ch
        return r

    def collect(c, rid):
        ids = []
        for ev in c.events(rid):
            if ev["event"] == "error":
                raise ZinferError(ev)
            ids.extend(int(t) for t in ev.get("token_ids", []))
        return ids

    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log", "--slots", "16",
                       *lora_args) as srv, Client(srv.addr, timeout_s=60) as c:
        alone = [collect(c, c.send(req(p, ch))) for p, ch in reqs]
        rids = [c.send(req(p, ch)) for p, ch in reqs]
        together = [collect(c, rid) for rid in rids]
        # an unknown adapter is this request's error alone
        with pytest.raises(ZinferError) as e:
            collect(c, c.send(req(PROMPTS[0], [{"name": "nope"}])))
        assert "lora[0].name" in str(e.value), str(e.value)
        with pytest.raises(ZinferError) as e:
            collect(c, c.send(req(PROMPTS[0], [{"id": 9}])))
        assert "lora[0].id" in str(e.value), str(e.value)
    assert together == alone
    # the adapters are applied: most of the 16 streams differ
    distinct = len({tuple(ids) for ids in alone})
    print(f"\n{distinct} distinct completions of 16")
    assert distinct >= 12, alone


def test_prefix_cache_keyed_by_adapter(adapters, zinfer_bin, model_path, tmp_path):
    """A long prompt run under no adapter, then ad0: the second run must not
    reuse the first one's blocks (its tokens equal ad0's from a server that
    never saw the prompt), and a repeat under ad0 does hit the cache."""
    prompt = " ".join(f"word{i}" for i in range(80))
    sp = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
    ad = [{"id": 0, "scale": 1.0}]

    def gen(c, lora):
        r = {"op": "generate", "prompt": prompt, "sampling_params": sp}
        if lora:
            r["lora"] = lora
        ids = []
        for ev in c.events(c.send(r)):
            assert ev["event"] != "error", ev
            ids.extend(int(t) for t in ev.get("token_ids", []))
        return ids

    args = ["--lora", f"ad0={adapters[0]}"]
    with serve_process(zinfer_bin, model_path, tmp_path / "a.log", *args) as srv, \
            Client(srv.addr, timeout_s=60) as c:
        fresh = gen(c, ad)
    with serve_process(zinfer_bin, model_path, tmp_path / "b.log", *args) as srv, \
            Client(srv.addr, timeout_s=60) as c:
        # the counters ride the heartbeats: read each once it counts the request
        gen(c, None)
        kv0 = kv_when(c, lambda kv: kv["prefix_query_tokens"] > 0)
        after = gen(c, ad)
        kv1 = kv_when(c, lambda kv: kv["prefix_query_tokens"] > kv0["prefix_query_tokens"])
        again = gen(c, ad)
        kv2 = kv_when(c, lambda kv: kv["prefix_query_tokens"] > kv1["prefix_query_tokens"])
        h0, h1, h2 = (k["prefix_hit_tokens"] for k in (kv0, kv1, kv2))
    assert after == fresh and again == fresh
    assert h1 == h0, "a prefix computed without the adapter was reused under it"
    assert h2 > h1, "the same adapter's prefix was not reused"


BAD = {
    "arch": "general.architecture is 'phi3', the model's is 'llama'",
    "missing": "'blk.0.attn_q.weight.lora_b' is missing",
    "shape": "'blk.0.attn_q.weight.lora_a' has shape [577, 8]",
    "rank": "has rank 9",
    "not_adapter": "not an adapter (general.type is 'model')",
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_adapter_refused(bad, run_zinfer, model_path, tmp_path, zinfer_bin):
    p = tmp_path / f"{bad}.gguf"
    make_lora.write(str(p), str(model_path), layers=[0, 1], bad=bad)
    r = run_zinfer("logits", "--model", str(model_path), "--prompt-ids", "1,2", "--out",
                   str(tmp_path / "o.bin"), "--lora", f"b={p}", "--log-level", "warn")
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and BAD[bad] in lines[0] and str(p) in lines[0], r.stderr
    if bad == "rank":  # the worker refuses it the same way, at start
        w = subprocess.run([str(zinfer_bin) + "-worker", "--model", str(model_path), "--lora",
                            f"b={p}", "--router", "tcp://127.0.0.1:1"],
                           capture_output=True, text=True, timeout=60)
        assert w.returncode != 0 and BAD[bad] in w.stderr, w.stderr


def test_lora_option_syntax(run_zinfer, model_path):
    for bad, msg in [("noequals", "expected NAME=FILE[:SCALE]"), ("=f.gguf", "expected NAME"),
                     ("a=", "no FILE")]:
        r = run_zinfer("logits", "--model", str(model_path), "--prompt-ids", "1", "--out",
                       "/dev/null", "--lora", bad)
        assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_http_passes_lora_on(adapters, zinfer_bin, model_path, tmp_path):
    """zinfer-http takes llama-server's "lora" list on /v1/completions and
    passes it on: the same greedy tokens as the msgpack request; an adapter
    the worker lacks is a 400 naming lora[0]. An adapter named in the
    model as "MODEL:ADAPTER" (vLLM's way), over HTTP and msgpack, runs as
    the lora list does; an unknown one is a 400 too."""
    import http.client
    import json

    from conftest import free_port, wait_http
    port = free_port()
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}

    def post(extra):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/completions", json.dumps({**body, **extra}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        out = (r.status, json.loads(r.read()))
        c.close()
        return out

    with serve_process(zinfer_bin, model_path, tmp_path / "h.log", "--http",
                       f"127.0.0.1:{port}", "--lora", f"ad0={adapters[0]}") as srv, \
            Client(srv.addr, timeout_s=60) as c:
        wait_http(port, srv)
        st, plain = post({})
        st2, adapted = post({"lora": [{"id": 0, "scale": 1.0}]})
        text, _, _ = c.complete(prompt=body["prompt"], sampling_params={
            "temperature": 0.0, "max_new_tokens": 8}, lora=[{"name": "ad0", "scale": 1.0}])
        st3, bad = post({"lora": [{"name": "nope"}]})
        base = model_path.name.removesuffix(".gguf")
        st4, named = post({"model": f"{base}:ad0"})
        text2, _, _ = c.complete(prompt=body["prompt"], model_name=f"{base}:ad0",
                                 sampling_params={"temperature": 0.0, "max_new_tokens": 8})
        st5, bad2 = post({"model": f"{base}:nope"})
        st6, bad3 = post({"model": "no-such-model:ad0"})
    assert st == 200 and st2 == 200, (plain, adapted)
    assert adapted["choices"][0]["text"] == text != plain["choices"][0]["text"]
    assert st3 == 400 and "lora[0].name" in json.dumps(bad), bad
    assert st4 == 200 and named["choices"][0]["text"] == text == text2, named
    assert named["model"] == f"{base}:ad0", named
    assert st5 == 400 and "nope" in json.dumps(bad2), bad2
    assert st6 == 404 and bad3["error"]["code"] == "model_not_found", bad3


def test_bench_lora_runs(zinfer_bin, model_path):
    """scripts/bench-lora end to end at a tiny size (its numbers are for a
    quiet machine: docs/lora.md)."""
    import json
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench-lora"
    r = subprocess.run([sys.executable, str(script), "--zinfer", str(zinfer_bin), "--model",
                        str(model_path), "--streams", "4", "--adapters", "2", "--rounds", "1",
                        "--prompt-tokens", "8", "--gen-tokens", "4"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["streams"] == 4 and j["adapters"] == 2 and j["decode_ratio"] > 0, j


def test_adapters_counted_in_the_memory_budget(adapters, zinfer_bin, model_path, tmp_path):
    """Under --memory-budget the adapters' A and B come out of what the KV
    cache gets, as the weights do: with one float32 rank-8 adapter the
    cache has about its size fewer blocks than without."""
    import re

    def kv_blocks(*extra):
        log = tmp_path / f"budget{len(extra)}.log"
        with serve_process(zinfer_bin, model_path, log, "--memory-budget", "200M", *extra) as srv:
            text = srv.log()
        blocks = int(re.search(r"KV cache: (\d+) blocks x (\d+) tokens = \d+ tokens, ([\d.]+) MiB",
                               text).group(1))
        mib = re.search(r"adapter 0 'ad0': .*, ([\d.]+) MiB", text)
        return blocks, float(mib.group(1)) if mib else 0.0, text

    plain, _, _ = kv_blocks()
    adapted, ad_mib, text = kv_blocks("--lora", f"ad0={adapters[0]}")
    assert ad_mib > 1.0, text  # rank 8 on 7 weights of 30 layers, float32
    m = re.search(r"KV cache: \d+ blocks x (\d+) tokens = \d+ tokens, ([\d.]+) MiB", text)
    per_block_mib = float(m.group(2)) / adapted
    want = ad_mib / per_block_mib
    assert abs((plain - adapted) - want) <= 2, (plain, adapted, want)
