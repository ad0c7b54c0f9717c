"""Model routing: several models behind one `zinfer serve` (docs/architecture.md,
"Several models"). Each model has its own tokenizers and workers, which
register with its name; the router sends a request to the tokenizer and the
worker of the model it names (msgpack `model_name`, HTTP `model`), the first
--model when it names none.

One server serves SmolLM2 (two workers), Gemma 3 270M and a small
random-weight llama file written here (SmolLM2's vocabulary, 64 wide):

- 32 concurrent greedy requests spread over the three (and over "no model":
  the default) each give exactly what `zinfer generate` gives for that file
  and those prompt ids: a request that ran on another model's tokenizer or
  worker would differ;
- an unknown model is refused with the known names (msgpack and HTTP);
- the models op and GET /v1/models list the three with their state;
- a SmolLM2 worker killed while SmolLM2 requests stream: they resume on the
  other SmolLM2 worker (their ids equal the reference, "resumed" once),
  never on a worker of another model.

The concurrent requests and the kill run in the release build only (docs/testing.md).
"""

import contextlib
import json
import os
import signal
import subprocess
import time
import http.client
from pathlib import Path

import pytest

from conftest import (free_port, free_port_pair, ids_arg, last_json, stop_process,
                      ServeProcess, wait_http)
from gguf_files import tokenizer_rows, write_gguf, write_random_llama
from test_failover import collect
from zinfer_client import Client, ZinferError


HOME = Path(os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")))
SMOL = HOME / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = Path(os.environ.get("ZINFER_GEMMA3", HOME / "models" / "gemma-3-270m-q4_k_m.gguf"))
MAX_NEW = 24
N = 32

SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"
release_only = pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")

pytestmark = pytest.mark.skipif(not (SMOL.is_file() and GEMMA.is_file()),
                                reason="SmolLM2 or Gemma 3 270M absent (scripts/fetch-model)")


@contextlib.contextmanager
def models_serve(zinfer_bin, args, log_path, ready, http=False, timeout_s=90):
    """`zinfer serve` with args (its models and flags) on free ports, its
    HTTP server too when http; yields it (srv.http_port) once ready(client)
    holds, then stops it. test_models_load.py serves with it too."""
    port, bport = free_port_pair()
    hport = free_port() if http else None
    addr = f"tcp://127.0.0.1:{port}"
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(
            [str(zinfer_bin), "serve", *map(str, args), "--bind", addr,
             "--backend", f"tcp://127.0.0.1:{bport}",
             "--http", f"127.0.0.1:{hport}" if http else "off"],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        srv = ServeProcess(proc, addr, log_path)
        srv.http_port = hport
        try:
            with Client(addr, timeout_s=5) as c:
                deadline = time.time() + timeout_s
                while True:
                    try:
                        if ready(c):
                            break
                    except (TimeoutError, ZinferError):
                        pass
                    assert proc.poll() is None and time.time() < deadline, srv.log()
                    time.sleep(0.1)
            if http:
                wait_http(hport, srv)
            yield srv
        finally:
            stop_process(proc)


def children(srv):
    """{pid: (program, model name)} of serve's children now."""
    out = {}
    for task in Path(f"/proc/{srv.proc.pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in kids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            name = argv[argv.index(b"--model-name") + 1].decode() if b"--model-name" in argv else ""
            out[int(pid)] = (os.path.basename(argv[0].decode()), name)
    return out


def write_tiny_llama(path, seed=7, drop=None):
    """A 2-layer llama of width 64 with random weights and SmolLM2's
    vocabulary (the family tests' way of writing one); without the tensor
    `drop` when one is named (a file a worker refuses)."""
    rows, n_vocab = tokenizer_rows(SMOL)
    return write_random_llama(path, rows, n_vocab, seed, drop)


def prompt(i):
    """Token ids every vocabulary here has (under SmolLM2's 49152): four
    prompts per model, shared by the requests."""
    k = i % 4
    return [1] + [(300 + 97 * k + 13 * j) % 20000 + 100 for j in range(20 + 5 * k)]


# request i: (model_name sent, the file it must run on)
def route(i, files):
    names = ["smol", "gemma", "tiny", None]
    name = names[i % 4]
    return name, files[name or "smol"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {"smol": SMOL, "gemma": GEMMA, "tiny": write_tiny_llama(d / "tiny-llama.gguf")}


@pytest.fixture(scope="module")
def reference(zinfer_bin, files):
    """(file, prompt index) -> the greedy ids of `zinfer generate`."""
    out = {}
    for name, path in files.items():
        for k in range(4):
            r = subprocess.run([str(zinfer_bin), "generate", "--model", str(path), "--prompt-ids",
                                ids_arg(prompt(k)), "--max-tokens", str(MAX_NEW), "--ignore-eos",
                                "--threads", "1", "--json"],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            out[(str(path), k)] = last_json(r.stdout)["token_ids"]
    return out


def worker_pids(srv, name):
    """The pids of the zinfer-worker children serving model name."""
    return [p for p, (prog, m) in children(srv).items() if prog == "zinfer-worker" and m == name]


@pytest.fixture(scope="module")
def server(zinfer_bin, files, tmp_path_factory):
    seen = set()

    def ready(c):
        ms = c.call("models")["models"]
        seen.update(m["state"] for m in ms)
        if len(ms) != 3 or any(m["state"] != "loaded" for m in ms):
            return False
        h = c.call("health")
        return h["workers"] == 4 and h["tokenizers"] == 3

    with models_serve(zinfer_bin, ["--model", f"smol={files['smol']},workers=2",
                                   "--model", f"gemma={files['gemma']}",
                                   "--model", f"tiny={files['tiny']}", "--workers", 1,
                                   "--tokenizers", 1, "--threads-per-worker", 1, "--slots", 16,
                                   "--ctx-size", 256, "--heartbeat-timeout", 1500],
                      tmp_path_factory.mktemp("serve") / "serve.log", ready, http=True) as srv:
        srv.seen_states = seen
        yield srv


def send(c, i, files):
    name, _ = route(i, files)
    msg = {"op": "generate", "prompt": prompt(i),
           "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True}}
    if name:
        msg["model_name"] = name
    return c.send(msg)


@release_only
def test_requests_run_on_their_model(server, files, reference):
    with Client(server.addr, timeout_s=120) as c:
        rids = [send(c, i, files) for i in range(N)]
        got = collect(c, rids)
    for i, rid in enumerate(rids):
        ids, _, fin = got[rid]
        assert fin["event"] == "final" and fin["status"] == "maximum_length", (i, fin)
        name, path = route(i, files)
        assert ids == reference[(str(path), i % 4)], f"request {i} ({name}) ran elsewhere"


def test_unknown_model_names_the_known(server):
    with Client(server.addr, timeout_s=30) as c:
        with pytest.raises(ZinferError) as ei:
            c.complete(prompt=[1, 2, 3], model_name="nope",
                       sampling_params={"max_new_tokens": 2})
    err = ei.value.reply
    assert err["code"] == "invalid_request" and err["field"] == "model_name", err
    for name in ("'smol'", "'gemma'", "'tiny'", "'nope'"):
        assert name in err["message"], err
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"model": "nope", "prompt": "hi"}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 404, body
    assert body["error"]["code"] == "model_not_found", body
    assert all(n in body["error"]["message"] for n in ("'smol'", "'gemma'", "'tiny'")), body


def test_models_listed_with_state(server):
    with Client(server.addr, timeout_s=30) as c:
        ms = c.call("models")["models"]
    assert [m["name"] for m in ms] == ["smol", "gemma", "tiny"], ms
    assert all(m["state"] == "loaded" and m["max_length"] > 0 for m in ms), ms
    # the first reply (before every worker had registered) listed all three too
    assert server.seen_states <= {"loaded", "loading"}, server.seen_states
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    data = json.loads(r.read())["data"]
    assert r.status == 200
    assert [(m["id"], m["state"]) for m in data] == [("smol", "loaded"), ("gemma", "loaded"),
                                                     ("tiny", "loaded")], data
    by = {m["id"]: m["max_model_len"] for m in data}
    assert by == {m["name"]: m["max_length"] for m in ms}


def test_http_routes_by_model(server):
    """HTTP passes `model` through, and the log probabilities' token texts
    are the model's own."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    for name in ("gemma", "tiny"):
        conn.request("POST", "/v1/completions",
                     json.dumps({"model": name, "prompt": prompt(1), "max_tokens": MAX_NEW,
                                 "temperature": 0, "ignore_eos": True, "logprobs": 1}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        assert body["model"] == name
        assert body["usage"]["completion_tokens"] == MAX_NEW, body
        # the tokens' texts come from the model's own vocabulary
        toks = body["choices"][0]["logprobs"]["tokens"]
        assert "".join(toks) == body["choices"][0]["text"], body


@release_only
def test_killed_worker_resumes_on_its_model(server, files, reference):
    smol = worker_pids(server, "smol")
    assert len(smol) == 2, smol
    with Client(server.addr, timeout_s=120) as c:
        rids = [send(c, i, files) for i in range(N)]
        smol_rids = [r for i, r in enumerate(rids) if route(i, files)[1] == SMOL]
        # killed once every SmolLM2 request streams: the dead worker holds some
        got = collect(c, rids, on_streaming=lambda: os.kill(smol[0], signal.SIGKILL),
                      min_tokens=1, watch=smol_rids)
    resumed = 0
    for i, rid in enumerate(rids):
        ids, chunks, fin = got[rid]
        assert fin["event"] == "final" and fin["status"] == "maximum_length", (i, fin)
        assert len(ids) == fin["usage"]["completion_tokens"] == MAX_NEW, (i, fin)
        name, path = route(i, files)
        assert ids == reference[(str(path), i % 4)], f"request {i} ({name}) differs"
        notes = sum(1 for ch in chunks if ch.get("resumed"))
        assert notes <= 1 and (notes == 0 or rid in smol_rids), (i, chunks)
        resumed += notes
    assert resumed > 0, "no request was on the killed worker"


# ---- --models-max: load on demand, unload the idle one -----------------------

@pytest.fixture(scope="module")
def two_tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("ondemand")
    return {"a": write_tiny_llama(d / "a.gguf", seed=7), "b": write_tiny_llama(d / "b.gguf", seed=8)}


def generate_ids(zinfer_bin, path, k):
    r = subprocess.run([str(zinfer_bin), "generate", "--model", str(path), "--prompt-ids",
                        ids_arg(prompt(k)), "--max-tokens", str(MAX_NEW), "--ignore-eos",
                        "--threads", "1", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return last_json(r.stdout)["token_ids"]


def states(c):
    return {m["name"]: m["state"] for m in c.call("models")["models"]}


def test_models_max_loads_on_demand(zinfer_bin, two_tiny, tmp_path):
    """--models-max 1 with two models: the second loads when a request names
    it, in place of the idle first, and the first comes back the same way;
    each request gives its own file's ids."""
    ref = {n: generate_ids(zinfer_bin, p, 2) for n, p in two_tiny.items()}
    assert ref["a"] != ref["b"]
    with models_serve(zinfer_bin, ["--model", f"a={two_tiny['a']}", "--model",
                                   f"b={two_tiny['b']}", "--models-max", 1,
                                   "--threads-per-worker", 1, "--slots", 4, "--ctx-size", 256],
                      tmp_path / "serve.log",
                      lambda c: states(c) == {"a": "loaded", "b": "unloaded"}) as srv:
        with Client(srv.addr, timeout_s=60) as c:
            sp = {"max_new_tokens": MAX_NEW, "ignore_eos": True}
            _, ids, fin = c.complete(prompt=prompt(2), model_name="b", sampling_params=sp)
            assert fin["status"] == "maximum_length" and ids == ref["b"], (fin, srv.log())
            assert states(c) == {"a": "unloaded", "b": "loaded"}, srv.log()
            _, ids, fin = c.complete(prompt=prompt(2), sampling_params=sp)  # the default, a
            assert ids == ref["a"], srv.log()
            assert states(c) == {"a": "loaded", "b": "unloaded"}, srv.log()
        log = srv.log()
    assert "unloading model a" in log and "loading model b" in log, log
    assert "unloading model b" in log and "loading model a" in log, log


def test_model_that_cannot_load_stays_unloaded(zinfer_bin, two_tiny, tmp_path):
    """--models-max 1: a model whose worker cannot start when a request
    loads it stays unloaded, its request ends "unavailable", and the server
    goes on serving the other model (it used to stop the whole server)."""
    bad = write_tiny_llama(tmp_path / "bad.gguf", drop="blk.1.ffn_down.weight")
    ref = generate_ids(zinfer_bin, two_tiny["a"], 2)
    with models_serve(zinfer_bin, ["--model", f"a={two_tiny['a']}", "--model", f"bad={bad}",
                                   "--models-max", 1, "--failover-timeout", 3000,
                                   "--threads-per-worker", 1, "--slots", 4, "--ctx-size", 256],
                      tmp_path / "serve.log", lambda c: states(c).get("a") == "loaded") as srv:
        with Client(srv.addr, timeout_s=60) as c:
            sp = {"max_new_tokens": MAX_NEW, "ignore_eos": True}
            rid = c.send({"op": "generate", "prompt": prompt(2), "model_name": "bad",
                          "sampling_params": sp})
            evs = list(c.events(rid))
            assert evs[-1]["event"] == "error" and evs[-1]["code"] == "unavailable", evs
            assert srv.proc.poll() is None, srv.log()
            _, ids, fin = c.complete(prompt=prompt(2), sampling_params=sp)  # a, loaded again
            assert ids == ref, (fin, srv.log())
        assert "stays unloaded" in srv.log(), srv.log()


# ---- --models-dir and the names ----------------------------------------------

def test_models_dir_serves_each_model_file(zinfer_bin, two_tiny, tmp_path):
    """--models-dir: every .gguf by its name, first --model first; image
    projectors, vocabulary-only files and non-models skipped with a line."""
    d = tmp_path / "dir"
    d.mkdir()
    os.symlink(two_tiny["b"], d / "zeta.gguf")
    os.symlink(two_tiny["a"], d / "alpha.gguf")
    (d / "mmproj-alpha.gguf").write_bytes(b"not read")
    (d / "notes.txt").write_text("not a model")
    rows, _ = tokenizer_rows(SMOL)
    write_gguf(d / "vocab-only.gguf", "llama", rows)
    with models_serve(zinfer_bin, ["--model", f"first={two_tiny['a']}", "--models-dir", d,
                                   "--threads-per-worker", 1, "--slots", 2, "--ctx-size", 128],
                      tmp_path / "serve.log",
                      lambda c: all(m["state"] == "loaded" for m in c.call("models")["models"])
                      ) as srv:
        with Client(srv.addr, timeout_s=60) as c:
            ms = c.call("models")["models"]
            assert [m["name"] for m in ms] == ["first", "alpha", "zeta"], ms
        log = srv.log()
    assert "skipping mmproj-alpha.gguf (an image projector)" in log, log
    assert "skipping vocab-only.gguf (vocabulary only)" in log, log


@pytest.mark.parametrize("args,message", [
    (["--model", "x={a}", "--model", "x={b}"], "two models are named 'x'"),
    (["--model", "a,b={a}"], "is not a model name"),
    (["--model", "={a}"], "the name before '=' is empty"),
    (["--model", "{a},workers=0"], "workers: '0' is not an integer in 1..64"),
    (["--model", "x={a}", "--model", "y={b}", "--mmproj", "{a}"], "belong to one model"),
])
def test_model_names_checked(zinfer_bin, two_tiny, args, message):
    argv = [a.format(a=two_tiny["a"], b=two_tiny["b"]) for a in args]
    r = subprocess.run([str(zinfer_bin), "serve", *argv, "--check-args"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
