"""Explicit model load and unload, and keep_alive (docs/architecture.md,
"Loading on demand"; docs/protocol.md, load_model / unload_model;
docs/http.md, POST /models/load).

One server serves SmolLM2 ("smol", the default) and a small random-weight
llama file written here ("tiny"), with no --models-max (every model loaded
at start) and an API key:

- unload_model then load_model, by msgpack and HTTP: the states the
  models op and GET /v1/models show, the unloaded model's worker process
  gone (its resident memory before, from /proc, is reported), a request
  after the unload still answered (the model loads back); an unknown model
  is refused with the known names; /models/load needs the API key;
- an unload while a long stream of that model runs: the stream ends with
  all its tokens, then the model unloads;
- keep_alive 0 unloads the model right after the request; a bad keep_alive
  is refused naming the field;

and one with --models-max 1: a request for the unloaded model frees the
other's worker memory (serve's children's total RSS, measured, reported).
"""

import http.client
import json
import os
import time
from pathlib import Path

import pytest

from conftest import report
from test_models_routing import children, models_serve, write_tiny_llama
from zinfer_client import Client, ZinferError

HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
SMOL = HOME / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
KEY = "sk-load-test"

pytestmark = pytest.mark.skipif(not SMOL.is_file(), reason="SmolLM2 absent (scripts/fetch-model)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("load") / "tiny.gguf")


def rss_kb(pid):
    """VmRSS of pid in kB (0: gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def model_pids(srv, name, program="zinfer-worker"):
    return [p for p, (prog, m) in children(srv).items() if prog == program and m == name]


def entries(c):
    return {m["name"]: m for m in c.call("models")["models"]}


def wait_state(c, srv, name, state, timeout_s=60):
    deadline = time.time() + timeout_s
    while True:
        m = entries(c)[name]
        if m["state"] == state:
            return m
        assert srv.proc.poll() is None and time.time() < deadline, (m, srv.log()[-3000:])
        time.sleep(0.1)


def http_call(srv, method, path, body=None, key=KEY):
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    conn.request(method, path, json.dumps(body) if body is not None else None, h)
    r = conn.getresponse()
    out = json.loads(r.read())
    conn.close()
    return r.status, out


def http_states(srv):
    status, body = http_call(srv, "GET", "/v1/models")
    assert status == 200, body
    return {m["id"]: m["state"] for m in body["data"]}


@pytest.fixture(scope="module")
def server(zinfer_bin, tiny, tmp_path_factory):
    def ready(c):
        return all(m["state"] == "loaded" for m in entries(c).values()) and \
            c.call("health")["workers"] == 2

    with models_serve(zinfer_bin, ["--model", f"smol={SMOL}", "--model", f"tiny={tiny}",
                                   "--api-key", KEY, "--threads-per-worker", 1, "--slots", 4,
                                   "--ctx-size", 256],
                      tmp_path_factory.mktemp("serve") / "serve.log", ready, http=True) as srv:
        yield srv


SP = {"max_new_tokens": 8, "ignore_eos": True}


def test_unload_then_load(server):
    with Client(server.addr, timeout_s=60) as c:
        # every model loaded at start: nothing asked of them
        ms = entries(c)
        assert {n: (m["state"], m["want"]) for n, m in ms.items()} == \
            {"smol": ("loaded", "none"), "tiny": ("loaded", "none")}, ms
        assert ms["tiny"]["keep_alive_ms"] == -1  # forever without --keep-alive
        # /models/load and /models/unload need the API key
        status, body = http_call(server, "POST", "/models/unload", {"model": "tiny"}, key=None)
        assert status == 401, body
        pids = model_pids(server, "tiny") + model_pids(server, "tiny", "zinfer-tokenizer")
        assert len(pids) == 2, children(server)
        rss = {p: rss_kb(p) for p in pids}
        assert all(v > 0 for v in rss.values()), rss
        status, body = http_call(server, "POST", "/models/unload", {"model": "tiny"})
        assert status == 200 and body == {"success": True, "model": "tiny",
                                          "status": "unloading"}, body
        wait_state(c, server, "tiny", "unloaded")
        assert http_states(server) == {"smol": "loaded", "tiny": "unloaded"}
        deadline = time.time() + 10
        while set(pids) & set(children(server)):  # exited and reaped
            assert time.time() < deadline, children(server)
            time.sleep(0.1)
        assert all(rss_kb(p) == 0 for p in pids), rss
        report("models_load", "unloaded_tiny_rss_kb", {"before": sum(rss.values()), "after": 0,
                                                       "processes": len(pids)})
        # unloading it again: already unloaded
        assert c.call("unload_model", model_name="tiny")["status"] == "unloaded"
        # load_model brings it back
        r = c.call("load_model", model_name="tiny")
        assert (r["model"], r["status"]) == ("tiny", "loading"), r
        assert entries(c)["tiny"]["want"] == "load"
        wait_state(c, server, "tiny", "loaded")
        assert http_states(server) == {"smol": "loaded", "tiny": "loaded"}
        assert c.call("load_model", model_name="tiny")["status"] == "loaded"
        # unloaded again, a request for it still runs: it loads back
        assert c.call("unload_model", model_name="tiny")["status"] == "unloading"
        wait_state(c, server, "tiny", "unloaded")
        _, ids, fin = c.complete(prompt=[1, 500, 600, 700], model_name="tiny", sampling_params=SP)
        assert fin["status"] == "maximum_length" and len(ids) == 8, fin
        assert entries(c)["tiny"]["state"] == "loaded"
        # an unknown model: the known names
        with pytest.raises(ZinferError) as e:
            c.call("load_model", model_name="zz")
        assert "'smol', 'tiny'" in str(e.value), e.value
    status, body = http_call(server, "POST", "/models/load", {"model": "zz"})
    assert status == 404 and "'smol', 'tiny'" in body["error"]["message"], body
    status, body = http_call(server, "POST", "/models/load", {})
    assert status == 400 and body["error"]["param"] == "model", body
    status, body = http_call(server, "POST", "/models/load", {"model": "tiny"})
    assert status == 200 and body["status"] == "loaded", body


def test_unload_waits_for_a_stream(server):
    """Unloading a model a long stream runs on: the stream ends with all its
    tokens, then the model unloads (and loads back for the next test)."""
    n = 96
    with Client(server.addr, timeout_s=120) as c, Client(server.addr, timeout_s=30) as c2:
        ids, fin, unload = [], None, None
        for ev in c.generate(prompt=[1, 500, 600, 700], model_name="smol",
                             sampling_params={"max_new_tokens": n, "ignore_eos": True}):
            if ev["event"] == "chunk":
                ids.extend(ev["token_ids"])
                if unload is None:
                    unload = c2.call("unload_model", model_name="smol")
                    m = entries(c2)["smol"]
                    assert (m["state"], m["want"], m["active"]) == ("loaded", "unload", 1), m
            else:
                fin = ev
        assert unload["status"] == "unloading", unload
        assert fin["event"] == "final" and fin["status"] == "maximum_length", fin
        assert len(ids) == n, len(ids)
        wait_state(c2, server, "smol", "unloaded")
        assert "unloading model smol (asked" in server.log()
        assert c2.call("load_model", model_name="smol")["status"] == "loading"
        wait_state(c2, server, "smol", "loaded")


def test_keep_alive_zero_unloads_after_the_request(server):
    with Client(server.addr, timeout_s=60) as c:
        wait_state(c, server, "tiny", "loaded")
        _, ids, fin = c.complete(prompt=[1, 500, 600], model_name="tiny", sampling_params=SP,
                                 keep_alive=0)
        assert fin["status"] == "maximum_length", fin
        t0 = time.time()
        m = wait_state(c, server, "tiny", "unloaded", timeout_s=20)
        report("models_load", "keep_alive_0_unloaded_after_s", round(time.time() - t0, 2))
        assert m["keep_alive_ms"] == 0, m
        # HTTP: keep_alive "5m" keeps it; a bad one names the field
        status, body = http_call(server, "POST", "/v1/completions",
                                 {"model": "tiny", "prompt": "hi", "max_tokens": 4,
                                  "keep_alive": "5m"})
        assert status == 200, body
        assert entries(c)["tiny"]["keep_alive_ms"] == 300000
        status, body = http_call(server, "POST", "/v1/chat/completions",
                                 {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                  "keep_alive": "5 parsecs"})
        assert status == 400 and body["error"]["param"] == "keep_alive", body
        with pytest.raises(ZinferError) as e:
            c.complete(prompt=[1, 5], model_name="tiny", sampling_params=SP, keep_alive=[1])
        assert "keep_alive" in str(e.value)


def test_models_max_frees_the_unloaded_workers_memory(zinfer_bin, tiny, tmp_path):
    """--models-max 1: a request for tiny unloads the idle smol; its worker's
    resident memory, read from /proc before, is gone after (serve's
    children's total RSS drops by about as much)."""
    with models_serve(zinfer_bin, ["--model", f"smol={SMOL}", "--model", f"tiny={tiny}",
                                   "--models-max", 1, "--threads-per-worker", 1, "--slots", 4,
                                   "--ctx-size", 256], tmp_path / "serve.log",
                      lambda c: {n: m["state"] for n, m in entries(c).items()} ==
                      {"smol": "loaded", "tiny": "unloaded"}) as srv:
        with Client(srv.addr, timeout_s=60) as c:
            c.complete(prompt=[1, 500, 600], sampling_params=SP)  # smol's weights touched
            smol = model_pids(srv, "smol")
            assert len(smol) == 1, children(srv)
            worker_kb = rss_kb(smol[0])
            total_before = sum(rss_kb(p) for p in children(srv))
            _, ids, fin = c.complete(prompt=[1, 500, 600], model_name="tiny", sampling_params=SP)
            assert fin["status"] == "maximum_length", fin
            assert {n: m["state"] for n, m in entries(c).items()} == \
                {"smol": "unloaded", "tiny": "loaded"}
            assert rss_kb(smol[0]) == 0 and model_pids(srv, "smol") == []
            total_after = sum(rss_kb(p) for p in children(srv))
    report("models_load", "models_max_1_swap_rss_kb",
           {"smol_worker_before": worker_kb, "children_total_before": total_before,
            "children_total_after": total_after})
    # SmolLM2's Q4_1 weights alone are about 90 MB
    assert worker_kb > 50_000, worker_kb
    assert total_before - total_after > worker_kb // 2, (total_before, total_after)


def test_serve_keep_alive_default(zinfer_bin, tmp_path):
    """A one-model serve with --keep-alive 2s: its model unloads once idle
    that long, and the next request loads it back; load_model works there
    too (serve manages one model when --keep-alive is given)."""
    from conftest import serve_process
    with serve_process(zinfer_bin, SMOL, tmp_path / "serve.log", "--keep-alive", "2s",
                       "--threads-per-worker", "1", "--ctx-size", "256") as srv:
        with Client(srv.addr, timeout_s=60) as c:
            name = next(iter(entries(c)))
            c.complete(prompt=[1, 500, 600], sampling_params=SP)
            m = entries(c)[name]
            assert (m["state"], m["keep_alive_ms"]) == ("loaded", 2000), m
            t0 = time.time()
            wait_state(c, srv, name, "unloaded", timeout_s=30)
            assert time.time() - t0 > 1.0
            _, ids, fin = c.complete(prompt=[1, 500, 600], sampling_params=SP)
            assert fin["status"] == "maximum_length" and len(ids) == 8, fin
            assert c.call("load_model", model_name=name)["status"] in ("loaded", "loading")
