"""Failover: a worker that dies does not end the requests it ran
(docs/protocol.md, "Failover"). The router keeps the ids each request has
generated and resumes it on another worker from exactly there, so the
client sees every token once and the same tokens as without the fault.

- Two workers, 16 streaming requests (greedy, seeded with penalties,
  unseeded sampling), kill -9 of one worker while they stream: every
  request's streamed ids equal the no-fault run's, token for token, with
  no duplicate or gap (ids streamed = completion_tokens = max_new_tokens),
  and the resumed ones say "resumed" once. Release builds only (16
  sampled streams twice is slow under the sanitizers).
- The same with the only tokenizer killed (some requests with stop
  strings): ids and text equal the no-fault run's (release only).
- One worker started by hand: killed mid-stream and replaced within
  --failover-timeout, the request completes with the no-fault ids
  (release only); killed with no replacement, a request cancelled while
  it waits ends "cancelled" and the other with exactly one "worker_lost"
  after --failover-timeout (kept under the sanitizers).
"""

import os
import signal
import subprocess
import time

import pytest

from conftest import free_port_pair, serve_process, stop_process
from test_server_load import children

from zinfer_client import Client, decode_array  # conftest puts clients/python on the path

SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"
release_only = pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")

MAX_NEW = 64
N = 16


def prompt(i):
    """~128 token ids, different for each request."""
    return [1] + [(1000 + 37 * i + 13 * k) % 40000 + 200 for k in range(127)]


def sampling(i, stops=False):
    """Greedy, seeded with penalties, or sampled without a seed (seed 0);
    with stops, every fourth has stop strings (held-back text)."""
    sp = {"max_new_tokens": MAX_NEW, "ignore_eos": True}
    if stops and i % 4 == 0:
        sp["stop"] = [" the", "ing", ".\n"]
    if i % 3 == 1:
        sp.update(temperature=0.9, top_k=0, top_p=0.95, seed=1000 + i, presence_penalty=0.4,
                  frequency_penalty=0.3, repetition_penalty=1.1)
    elif i % 3 == 2:
        sp.update(temperature=1.0, top_k=40)
    return sp


def collect(c, rids, on_streaming=None, min_tokens=0, timeout=120, watch=None, or_ended=False):
    """Reads every request's frames to its terminal one. on_streaming() is
    called once, when every request of watch (default: all) has streamed
    min_tokens ids (or, with or_ended, ended: a stop string can end one
    sooner). Returns {rid: (ids, chunks, terminal)}."""
    watch = rids if watch is None else watch
    ids = {r: [] for r in rids}
    chunks = {r: [] for r in rids}
    term = {}
    fired = on_streaming is None
    deadline = time.time() + timeout
    while len(term) < len(rids):
        assert time.time() < deadline, f"{len(rids) - len(term)} requests never ended"
        m = c.recv()
        assert m is not None, "router_lost: the router did not come back"
        rid = m["id"]
        assert rid in ids and rid not in term, f"frame after the end: {m}"
        if m["event"] == "chunk":
            chunks[rid].append(m)
            ids[rid].extend(int(t) for t in decode_array(m["token_ids"]))
        else:
            term[rid] = m
        if not fired and all(len(ids[r]) >= min_tokens or (or_ended and r in term)
                             for r in watch):
            fired = True
            on_streaming()
    assert c.sock.poll(300) == 0  # exactly one terminal frame each, nothing after
    return {r: (ids[r], chunks[r], term[r]) for r in rids}


def send_all(c, stops=False):
    return [c.send({"op": "generate", "prompt": prompt(i),
                    "sampling_params": sampling(i, stops)}) for i in range(N)]


def text_of(chunks):
    return "".join(ch["text"] for ch in chunks)


@pytest.fixture(scope="module")
def two_workers(zinfer_bin, model_path, tmp_path_factory):
    with serve_process(zinfer_bin, model_path, tmp_path_factory.mktemp("failover") / "serve.log",
                       "--threads-per-worker", 1, "--slots", N, "--ctx-size", 256,
                       "--heartbeat-timeout", 1500, "--failover-timeout", 30000,
                       workers=2) as srv:
        yield srv


@release_only
def test_kill_worker_mid_stream_resumes(two_workers):
    srv = two_workers
    with Client(srv.addr, timeout_s=120.0) as c:
        clean_rids = send_all(c)
        clean = collect(c, clean_rids)
        ref = [clean[r][0] for r in clean_rids]
        for ids, _, fin in clean.values():
            assert fin["event"] == "final" and len(ids) == MAX_NEW, fin
        workers = children(srv).get("worker", [])
        assert len(workers) == 2, children(srv)
        rids = send_all(c)
        # Killed as soon as every request streams, before any has ended,
        # so that the dead worker holds some unfinished ones.
        got = collect(c, rids, on_streaming=lambda: os.kill(workers[0], signal.SIGKILL),
                      min_tokens=1)
    resumed = 0
    for i, rid in enumerate(rids):
        ids, chunks, fin = got[rid]
        assert fin["event"] == "final", fin
        assert fin["status"] == "maximum_length", fin
        # No duplicate, no gap: what streamed is what was generated.
        assert len(ids) == fin["usage"]["completion_tokens"] == MAX_NEW, (i, fin)
        assert ids == ref[i], f"request {i} ({sampling(i)}) differs after the failover"
        notes = sum(1 for ch in chunks if ch.get("resumed"))
        assert notes <= 1, chunks
        resumed += notes
    assert resumed > 0, "no request was on the killed worker"
    log = srv.log()
    assert "resuming" in log, log[-2000:]


@release_only
def test_kill_tokenizer_mid_stream_resumes(two_workers):
    """The only tokenizer dies while 16 requests stream (some with stop
    strings, whose held-back text lives in it): the supervisor restarts it,
    the router replays each request's decode state into the new one, and
    every stream's ids and text equal the no-fault run's."""
    srv = two_workers
    with Client(srv.addr, timeout_s=120.0) as c:
        clean_rids = send_all(c, stops=True)
        clean = collect(c, clean_rids)
        ref = [clean[r] for r in clean_rids]
        assert any(r[2]["status"] == "stop" for r in ref)  # a stop string matters
        toks = children(srv).get("tokenizer", [])
        assert len(toks) == 1, children(srv)
        rids = send_all(c, stops=True)
        got = collect(c, rids, on_streaming=lambda: os.kill(toks[0], signal.SIGKILL),
                      min_tokens=1)
    notes = 0
    for i, rid in enumerate(rids):
        ids, chunks, fin = got[rid]
        rids_, rchunks, rfin = ref[i]
        assert fin["event"] == "final" and fin["status"] == rfin["status"], (fin, rfin)
        assert ids == rids_, f"request {i} ({sampling(i, True)}): ids differ"
        assert text_of(chunks) == text_of(rchunks), f"request {i}: text differs"
        if fin["status"] == "maximum_length":
            assert len(ids) == fin["usage"]["completion_tokens"] == MAX_NEW
        notes += sum(1 for ch in chunks if ch.get("resumed"))
    assert notes > 0, "no request noticed the tokenizer's failover"
    assert "decode state replayed" in srv.log()


# ---- one worker, started by hand --------------------------------------------


class Backend:
    """A router, a tokenizer and a worker as separate processes, so that
    the worker can be killed without a supervisor restarting it."""

    def __init__(self, zinfer_bin, model_path, tmp, failover_ms):
        port, bport = free_port_pair()
        self.addr, self.back = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{bport}"
        self.bin, self.model, self.tmp = zinfer_bin.parent, model_path, tmp
        self.router_log = tmp / "router.log"
        self.procs = []
        self.router = self.spawn("router", ["--bind", self.addr, "--backend", self.back,
                                            "--heartbeat-timeout", "2000",
                                            "--failover-timeout", str(failover_ms)],
                                 self.router_log)
        self.spawn("tokenizer", ["--router", self.back, "--model", str(model_path)],
                   tmp / "tokenizer.log")
        self.n_workers = 0

    def spawn(self, role, args, log):
        p = subprocess.Popen([str(self.bin / f"zinfer-{role}"), *args], stdout=open(log, "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def worker(self):
        self.n_workers += 1
        return self.spawn("worker", ["--router", self.back, "--model", str(self.model),
                                     "--threads", "1", "--slots", "2", "--ctx-size", "256"],
                          self.tmp / f"worker{self.n_workers}.log")

    def wait_workers(self, n, timeout=60):
        deadline = time.time() + timeout
        with Client(self.addr, timeout_s=2) as c:
            while True:
                try:
                    h = c.call("health")
                    if h["workers"] == n and h["tokenizers"] == 1:
                        return
                except TimeoutError:
                    pass
                assert self.router.poll() is None and time.time() < deadline, \
                    self.router_log.read_text()
                time.sleep(0.1)

    def close(self):
        for p in reversed(self.procs):
            stop_process(p)


@pytest.fixture
def backend(zinfer_bin, model_path, tmp_path, request):
    b = Backend(zinfer_bin, model_path, tmp_path, request.param)
    yield b
    b.close()


def one_stream(c, i):
    return c.send({"op": "generate", "prompt": prompt(i), "sampling_params": sampling(i)})


@release_only
@pytest.mark.parametrize("backend", [20000], indirect=True)
def test_only_worker_replaced_within_failover_timeout(backend):
    w = backend.worker()
    backend.wait_workers(1)
    with Client(backend.addr, timeout_s=60.0) as c:
        ref = {}
        for i in (1, 2):
            rid = one_stream(c, i)
            ref[i] = collect(c, [rid])[rid][0]
        rids = [one_stream(c, i) for i in (1, 2)]

        def kill_and_replace():
            os.kill(w.pid, signal.SIGKILL)
            backend.worker()
        got = collect(c, rids, on_streaming=kill_and_replace, min_tokens=3)
    for i, rid in zip((1, 2), rids):
        ids, chunks, fin = got[rid]
        assert fin["event"] == "final" and fin["status"] == "maximum_length", fin
        assert len(ids) == fin["usage"]["completion_tokens"] == MAX_NEW
        assert ids == ref[i], f"request {i} differs after the failover"
        assert sum(1 for ch in chunks if ch.get("resumed")) == 1


@pytest.mark.parametrize("backend", [1500], indirect=True)
def test_no_worker_back_gives_one_worker_lost(backend):
    """Two requests on the only worker, which dies: one is cancelled while
    it waits for a worker (final "cancelled"), the other ends with one
    "worker_lost" after --failover-timeout."""
    w = backend.worker()
    backend.wait_workers(1)
    with Client(backend.addr, timeout_s=60.0) as c:
        rids = [c.send({"op": "generate", "prompt": prompt(i),
                        "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}})
                for i in range(2)]
        t_kill = []

        def kill():
            os.kill(w.pid, signal.SIGKILL)
            t_kill.append(time.time())
            # Once the router has declared the worker dead, the requests
            # wait queued: cancel one there.
            deadline = time.time() + 10
            while "resuming" not in backend.router_log.read_text():
                assert time.time() < deadline, backend.router_log.read_text()
                time.sleep(0.05)
            c.cancel(rids[1])
        got = collect(c, rids, on_streaming=kill, min_tokens=1, timeout=60)
        waited = time.time() - t_kill[0]
        ids, _, term = got[rids[0]]
        assert term["event"] == "error" and term["code"] == "worker_lost", term
        assert "--failover-timeout" in term["message"], term
        assert 0 < len(ids) < 120
        # the worker is dead once its connection closes (the router's socket
        # monitor; missed heartbeats are only the fallback), then the
        # failover timeout (1.5 s), checked every 0.1 s
        assert 1.4 < waited < 12, waited
        fin = got[rids[1]][2]
        assert fin["event"] == "final" and fin["status"] == "cancelled", fin
        h = c.call("health")
        assert h["workers"] == 0 and h["waiting"] == 0 and h["running"] == 0, h
    log = backend.router_log.read_text()
    assert log.count("resuming") == 2 and "worker_lost" in log, log


@release_only
@pytest.mark.parametrize("backend", [20000], indirect=True)
def test_embed_on_a_dead_worker_runs_again(backend):
    """An embed request keeps no state on its worker: when that worker dies
    the router sends the same embed message to the next one, and the
    result equals the one computed before the kill."""
    import numpy as np
    from zinfer_client import decode_array
    texts = [f"Note {i}: the weather in town {i % 7} was mild, with rain after noon."
             for i in range(192)]
    w = backend.worker()
    backend.wait_workers(1)
    with Client(backend.addr, timeout_s=60.0) as c:
        want, _ = c.embed(texts, pooling="mean")
        rid = c.send({"op": "embed", "input": texts, "pooling": "mean"})
        with Client(backend.addr, timeout_s=5.0) as h:  # until it runs on w
            deadline = time.time() + 10
            while h.call("health")["running"] == 0:
                assert time.time() < deadline, "the embed request never ran"
                time.sleep(0.02)
        os.kill(w.pid, signal.SIGKILL)
        backend.worker()
        ev = c.next_reply(rid)
    assert ev.get("event") == "result", ev
    got = decode_array(ev["embeddings"], as_numpy=True)
    assert got.shape == want.shape
    assert np.array_equal(got, want)
    assert "resuming" in backend.router_log.read_text()
