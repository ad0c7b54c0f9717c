"""LoRA adapters loaded and unloaded while serving, and adapters bound to
one of several models (docs/lora.md).

- load_lora_adapter (msgpack) and POST /v1/load_lora_adapter (HTTP, vLLM's
  shape): a request with the loaded adapter gives the tokens of the same
  file given at start with --lora; it is listed (lora_adapters, GET
  /lora-adapters, GET /v1/models as MODEL:ADAPTER); unloaded, a request
  naming it is refused naming the adapter; unloading it again is a
  not_found (404);
- an unload while a request runs the adapter is refused ("in_use", 409)
  and succeeds once the request ended;
- under --memory-budget an adapter that does not fit in what the budget
  leaves is refused with the sizes (507);
- `--lora MODEL:NAME=FILE` with several --model: only that model's
  workers load it; an unknown MODEL stops serve with the served names.
"""

import http.client
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import free_port, serve_process, wait_http
from test_models_routing import models_serve
from test_server_load import children

import make_lora
from zinfer_client import Client, ZinferError

SP = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, model_path):
    p = tmp_path_factory.mktemp("lora_rt") / "ad.gguf"
    make_lora.write(str(p), str(model_path), rank=8, alpha=16, seed=21, b_std=0.2,
                    dtype=np.float16)
    return p


def ids_of(c, lora=None, model_name=None, text=False):
    extra = {}
    if lora:
        extra["lora"] = lora
    if model_name:
        extra["model_name"] = model_name
    t, ids, _ = c.complete(prompt=PROMPT, sampling_params=SP, **extra)
    return t if text else ids


def http_call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw


def test_load_use_unload(adapter, zinfer_bin, model_path, tmp_path):
    port = free_port()
    base = model_path.name.removesuffix(".gguf")
    with serve_process(zinfer_bin, model_path, tmp_path / "rt.log", "--slots", "4", "--http",
                       f"127.0.0.1:{port}", "--lora", f"st={adapter}") as srv, \
            Client(srv.addr, timeout_s=60) as c:
        wait_http(port, srv)
        plain = ids_of(c)
        start_time = ids_of(c, [{"name": "st"}])
        assert start_time != plain
        # msgpack: load, run, list
        r = c.call("load_lora_adapter", lora_name="rt", lora_path=str(adapter))
        assert r["status"] == "loaded" and r["lora_name"] == "rt" and r["lora_id"] == 1, r
        assert ids_of(c, [{"name": "rt"}]) == start_time
        assert ids_of(c, [{"id": 1, "scale": 1.0}]) == start_time
        assert ids_of(c, model_name=f"{base}:rt") == start_time
        ads = c.call("lora_adapters")["adapters"]
        assert sorted((a["name"], a["loaded"]) for a in ads) == [("rt", "runtime"),
                                                                 ("st", "start")], ads
        assert [a.get("path") for a in ads if a["name"] == "rt"] == [str(adapter)], ads
        with pytest.raises(ZinferError) as e:  # a name is loaded once
            c.call("load_lora_adapter", lora_name="rt", lora_path=str(adapter))
        assert "already loaded" in str(e.value), str(e.value)
        # a worker restarted after a failure gets the adapter back before any request
        old = children(srv)["worker"]
        os.kill(old[0], signal.SIGKILL)
        deadline = time.time() + 60
        while children(srv).get("worker", old) == old or c.call("health")["workers"] != 1:
            assert time.time() < deadline, srv.log()
            time.sleep(0.2)
        assert ids_of(c, [{"name": "rt"}]) == start_time
        assert "loading adapter 'rt'" in srv.log(), srv.log()
        with pytest.raises(ZinferError) as e:  # a file that is not there
            c.call("load_lora_adapter", lora_name="x", lora_path=str(tmp_path / "none.gguf"))
        assert e.value.code == "invalid_request" and "none.gguf" in str(e.value), str(e.value)

        # an unload while a request runs the adapter is refused
        rid = c.send({"op": "generate", "prompt": PROMPT, "stream": True, "lora": [{"name": "rt"}],
                      "sampling_params": {**SP, "max_new_tokens": 400}})
        first = c.next_reply(rid)
        assert first["event"] == "chunk", first
        with pytest.raises(ZinferError) as e:
            c.call("unload_lora_adapter", lora_name="rt")
        assert e.value.code == "in_use" and "in use by 1 request" in str(e.value), str(e.value)
        st, body = http_call(port, "POST", "/v1/unload_lora_adapter", {"lora_name": "rt"})
        assert st == 409 and body["error"]["code"] == "in_use", body
        c.cancel(rid)
        for ev in c.events(rid):
            pass
        r = c.call("unload_lora_adapter", lora_name="rt")
        assert r["status"] == "unloaded", r
        with pytest.raises(ZinferError) as e:
            ids_of(c, [{"name": "rt"}])
        assert "lora[0].name: this worker has no adapter 'rt'" in str(e.value), str(e.value)
        with pytest.raises(ZinferError) as e:
            c.call("unload_lora_adapter", lora_name="rt")
        assert e.value.code == "not_found", str(e.value)
        assert ids_of(c, [{"name": "st"}]) == start_time  # the start-time one is untouched

        # HTTP: vLLM's endpoints, the lists
        st, body = http_call(port, "POST", "/v1/load_lora_adapter",
                             {"lora_name": "h", "lora_path": str(adapter)})
        assert st == 200 and body == "Success: LoRA adapter 'h' added successfully.", body
        st, body = http_call(port, "POST", "/v1/completions",
                             {"prompt": PROMPT, "max_tokens": SP["max_new_tokens"], "temperature": 0,
                              "model": f"{base}:h", "ignore_eos": True})
        assert st == 200 and body["choices"][0]["text"] == ids_of(c, [{"name": "st"}],
                                                                  text=True), body
        st, models = http_call(port, "GET", "/v1/models")
        assert models["object"] == "list", models
        ids = [m["id"] for m in models["data"]]
        assert ids == [base, f"{base}:st", f"{base}:h"], models
        h = models["data"][2]
        assert h["parent"] == base and h["root"] == str(adapter), h
        st, one = http_call(port, "GET", f"/v1/models/{base}:h")
        assert st == 200 and one == h, one
        st, la = http_call(port, "GET", "/lora-adapters")
        assert st == 200 and sorted((a["id"], a["name"], a["scale"]) for a in la) == [
            (0, "st", 0.0), (1, "h", 0.0)], la
        # llama-server's global scales: requests without adapters run them
        plain_text = ids_of(c, text=True)
        adapted_text = ids_of(c, [{"name": "st"}], text=True)
        completion = {"prompt": PROMPT, "max_tokens": SP["max_new_tokens"], "temperature": 0,
                      "ignore_eos": True}
        st, body = http_call(port, "POST", "/lora-adapters", [{"id": 1, "scale": 1.0}])
        assert st == 200 and body == {"success": True}, body
        st, la = http_call(port, "GET", "/lora-adapters")
        assert sorted((a["id"], a["scale"]) for a in la) == [(0, 0.0), (1, 1.0)], la
        st, body = http_call(port, "POST", "/v1/completions", completion)
        assert body["choices"][0]["text"] == adapted_text != plain_text, body
        assert ids_of(c, text=True) == adapted_text  # msgpack requests too
        st, body = http_call(port, "POST", "/lora-adapters", [{"id": 9, "scale": 1.0}])
        assert st == 400 and "no such adapter" in body["error"]["message"], body
        st, body = http_call(port, "POST", "/lora-adapters", [])
        assert st == 200, body
        st, body = http_call(port, "POST", "/v1/completions", completion)
        assert body["choices"][0]["text"] == plain_text, body
        st, body = http_call(port, "POST", "/v1/unload_lora_adapter", {"lora_name": "h"})
        assert st == 200 and "removed" in body, body
        st, body = http_call(port, "POST", "/v1/unload_lora_adapter", {"lora_name": "h"})
        assert st == 404 and body["error"]["param"] == "lora_name", body
        st, body = http_call(port, "POST", "/v1/load_lora_adapter", {"lora_name": "h"})
        assert st == 400 and body["error"]["param"] == "lora_path", body


def test_load_refused_over_the_memory_budget(adapter, zinfer_bin, model_path, tmp_path):
    """Under --memory-budget the KV cache takes what the weights leave: an
    adapter loaded later does not fit, and the error says so with sizes."""
    with serve_process(zinfer_bin, model_path, tmp_path / "b.log", "--memory-budget",
                       "200M") as srv, Client(srv.addr, timeout_s=60) as c:
        with pytest.raises(ZinferError) as e:
            c.call("load_lora_adapter", lora_name="big", lora_path=str(adapter))
    msg = str(e.value)
    assert e.value.code == "insufficient_memory", msg
    assert "--memory-budget" in msg and "MiB" in msg and "'big'" in msg, msg


def test_lora_bound_to_one_model(adapter, zinfer_bin, model_path, tmp_path):
    """--lora MODEL:NAME=FILE loads the adapter into MODEL's workers only."""
    with models_serve(zinfer_bin, ["--model", f"a={model_path}", "--model", f"b={model_path}",
                                   "--lora", f"b:ad={adapter}"], tmp_path / "m.log",
                      lambda c: c.call("health")["workers"] == 2) as srv, \
            Client(srv.addr, timeout_s=60) as c:
        plain = ids_of(c, model_name="b")
        adapted = ids_of(c, model_name="b:ad")
        assert adapted != plain
        with pytest.raises(ZinferError) as e:
            ids_of(c, model_name="a:ad")
        assert "no adapter 'ad'" in str(e.value), str(e.value)
        ads = c.call("lora_adapters")["adapters"]
        assert [(a["model"], a["name"]) for a in ads] == [("b", "ad")], ads
    r = subprocess.run(
        [str(zinfer_bin), "serve", "--model", f"a={model_path}", "--lora", f"zz:ad={adapter}",
         "--http", "off"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no model named 'zz'" in r.stderr and "'a'" in r.stderr, r.stderr
