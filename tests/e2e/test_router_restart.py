"""Router restart: no stream is lost when the router dies
(docs/protocol.md, "Router restart"; docs/reliability.md).

- `zinfer serve` with one worker and one tokenizer, 6 concurrent streams
  (greedy, seeded sampling with penalties, unseeded sampling; one with
  stop strings) recorded without a fault; then the same 6 again and the
  router SIGKILLed once every stream has a few tokens. The supervisor
  restarts it on the same addresses, the worker hands back its sequences,
  the client library (clients/python) sends "resume" with the ids it
  holds, and every stream ends with exactly the ids and text of the
  fault-free run: no duplicate, no gap, one final each, nothing after it.
- The same with the C library (`zinfer-client`, streaming to stdout): the
  text printed equals the fault-free run's; and over HTTP (zinfer-http,
  the `openai` SDK streaming a completion): the streamed text equals the
  fault-free run's.
- Against a bare ZeroMQ ROUTER that dies and is bound again: each client
  library sends "resume" with the token ids it holds, from the same
  routing id, and a second terminal frame for a resumed request is
  dropped.
- The router killed while requests wait queued (one slot, four streams)
  and while a tokenizer is encoding a long prompt (the tokenizer stopped
  with SIGSTOP, so the kill surely comes mid-encode): the running stream
  completes, each of the others ends with exactly one retryable
  "unavailable" error, nothing after it, and sent again it completes
  (docs/reliability.md).
- The router killed and not restarted (the supervisor stopped with
  SIGSTOP): the worker drops the sequence after --orphan-timeout (its log
  line, then health's "orphans_dropped"), a new request fits in the one
  slot, and the orphaned request's resume is answered "unavailable".
- A client whose router goes away and does not come back gets one
  "router_lost" error per open request after router_timeout_s (a bare
  ZeroMQ ROUTER stands in for a router that takes requests and dies), in
  Python and in C (`zinfer-client --router-timeout`).
"""

import os
import signal
import subprocess
import threading
import time

import msgpack
import pytest
import zmq

from conftest import free_port, serve_process
from test_failover import collect
from test_server_load import children

from zinfer_client import Client  # conftest puts clients/python on the path

SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"

MAX_NEW = 200
N = 6


def prompt(i):
    """~64 token ids, different for each request."""
    return [1] + [(1000 + 37 * i + 13 * k) % 30000 + 200 for k in range(63)]


def sampling(i):
    sp = {"max_new_tokens": MAX_NEW, "ignore_eos": True}
    if i % 3 == 1:
        sp.update(temperature=0.9, top_k=0, top_p=0.95, seed=1000 + i, presence_penalty=0.4,
                  frequency_penalty=0.3, repetition_penalty=1.1)
    elif i % 3 == 2:
        sp.update(temperature=1.0, top_k=40)
    if i == 3:
        sp["stop"] = [" the", "ing", ".\n"]
    return sp


def send_all(c):
    return [c.send({"op": "generate", "prompt": prompt(i), "sampling_params": sampling(i)})
            for i in range(N)]


def text_of(chunks):
    return "".join(ch["text"] for ch in chunks)


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_router_killed_mid_stream(zinfer_bin, model_path, tmp_path):
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1, "--slots", N, "--ctx-size", 320,
                       "--heartbeat-timeout", 2000) as srv:
        with Client(srv.addr, timeout_s=60.0, router_timeout_s=30.0) as c:
            clean = collect(c, send_all(c))
            ref = list(clean.values())
            routers = children(srv).get("router", [])
            assert len(routers) == 1, children(srv)
            rids = send_all(c)
            t0 = []

            def kill():
                t0.append(time.time())
                os.kill(routers[0], signal.SIGKILL)

            got = collect(c, rids, on_streaming=kill, min_tokens=3, or_ended=True)
            took = time.time() - t0[0]
        new = children(srv).get("router", [])
        assert new and new != routers, "the supervisor did not restart the router"
        log = srv.log()
    resumed = 0
    for i, rid in enumerate(rids):
        ids, chunks, fin = got[rid]
        rids_, rchunks, rfin = ref[i]
        assert fin["event"] == "final", (i, fin, log[-3000:])
        assert fin["status"] == rfin["status"], (i, fin, rfin)
        assert ids == rids_, f"request {i} ({sampling(i)}): ids differ after the restart"
        assert text_of(chunks) == text_of(rchunks), f"request {i}: text differs"
        if fin["status"] == "maximum_length":
            assert len(ids) == fin["usage"]["completion_tokens"] == MAX_NEW, (i, fin)
        notes = sum(1 for ch in chunks if ch.get("resumed"))
        assert notes <= 1, chunks
        resumed += notes
    assert resumed > 0, "no stream noticed the restart"
    assert "taken over" in log and "resumed at" in log, log[-3000:]
    print(f"router killed and back: {resumed} streams resumed, {took:.1f} s to the last final")


def stop_worker_midway(srv):
    """Stops the worker (SIGSTOP) while a stream has begun: its children
    when a request is still in flight, else (the model ran it to its end
    first) None, the worker going on."""
    kids = children(srv)
    os.kill(kids["worker"][0], signal.SIGSTOP)
    try:
        with Client(srv.addr, timeout_s=5) as c:
            if c.call("health")["running"] > 0:
                return kids
    except Exception:
        os.kill(kids["worker"][0], signal.SIGCONT)
        raise
    os.kill(kids["worker"][0], signal.SIGCONT)
    return None


def restart_router(kids):
    """Kills the router (SIGKILL) while the worker is stopped, and lets the
    worker go on a second later: the rest of the stream then comes through
    the restarted router, however fast the model."""
    try:
        os.kill(kids["router"][0], signal.SIGKILL)
        time.sleep(1.0)
    finally:
        os.kill(kids["worker"][0], signal.SIGCONT)


ATTEMPTS = 5  # streams started until one is caught in flight


def client_bin(zinfer_bin):
    return zinfer_bin.parent / "clients" / "c" / "zinfer-client"


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_router_killed_c_client(zinfer_bin, model_path, tmp_path):
    args = ["--max-tokens", str(MAX_NEW), "--ignore-eos", "--timeout", "60000",
            "--router-timeout", "30000", "Once upon a time"]
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1, "--slots", 2, "--ctx-size", 320,
                       "--heartbeat-timeout", 2000) as srv:
        cmd = [str(client_bin(zinfer_bin)), "--router", srv.addr, *args]
        clean = subprocess.run(cmd, capture_output=True, timeout=120)
        assert clean.returncode == 0, clean.stderr
        for _ in range(ATTEMPTS):
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # streaming: the first chunk is out (unbuffered: communicate()
            # below reads the descriptor, not a file object's buffer)
            first = os.read(p.stdout.fileno(), 1)
            kids = stop_worker_midway(srv)
            if kids:
                restart_router(kids)
            rest, errs = p.communicate(timeout=120)
            if kids:
                break
        else:
            pytest.skip("the model ended every stream before the router could be killed")
        log = srv.log()
    assert p.returncode == 0, (errs, log[-3000:])
    assert first + rest == clean.stdout, "the C client's text differs after the restart"
    assert "resumed at" in log, log[-3000:]


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_router_killed_http_stream(zinfer_bin, model_path, tmp_path):
    openai = pytest.importorskip("openai")
    port = free_port()
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1, "--slots", 2, "--ctx-size", 320,
                       "--heartbeat-timeout", 2000, "--http", f"127.0.0.1:{port}") as srv:
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                            max_retries=0, timeout=60)
        deadline = time.time() + 30
        while True:
            try:
                model = sdk.models.list().data[0].id
                break
            except openai.OpenAIError:
                assert time.time() < deadline, srv.log()
                time.sleep(0.2)
        kw = dict(model=model, prompt="Once upon a time", max_tokens=MAX_NEW, temperature=0,
                  stream=True, extra_body={"ignore_eos": True})
        clean = "".join(ch.choices[0].text for ch in sdk.completions.create(**kw) if ch.choices)
        for _ in range(ATTEMPTS):
            got, finish, kids = [], None, None
            for ch in sdk.completions.create(**kw):
                if not ch.choices:
                    continue
                if not got and (kids := stop_worker_midway(srv)):
                    restart_router(kids)
                got.append(ch.choices[0].text)
                finish = ch.choices[0].finish_reason or finish
            if kids:
                break
        else:
            pytest.skip("the model ended every stream before the router could be killed")
        log = srv.log()
    assert "".join(got) == clean, "the HTTP stream's text differs after the restart"
    assert finish == "length"
    assert "resumed at" in log, log[-3000:]


def fake_router(addr=None):
    """A bare ROUTER on a free port (or addr): (socket, address)."""
    addr = addr or f"tcp://127.0.0.1:{free_port()}"
    fake = zmq.Context.instance().socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    for attempt in range(100):  # a socket closed on it lets go of it asynchronously
        try:
            fake.bind(addr)
            break
        except zmq.ZMQError:
            if attempt == 99:
                raise
            time.sleep(0.05)
    return fake, addr


def chunk(rid, ids):
    return msgpack.packb({"id": rid, "event": "chunk", "text": "x" * len(ids), "token_ids": ids})


def test_resume_sent_on_reconnect():
    fake, addr = fake_router()
    with Client(addr, timeout_s=5.0, router_timeout_s=10.0) as c:
        rid = c.send({"op": "generate", "prompt": "hi"})
        assert fake.poll(5000)
        ident, _ = fake.recv_multipart()
        fake.send_multipart([ident, chunk(rid, [5, 6, 7])])
        assert c.recv()["token_ids"] == [5, 6, 7]
        fake.close(0)  # the router dies; another comes up on its address
        fake, _ = fake_router(addr)
        got = []
        t = threading.Thread(target=lambda: got.append(c.recv()))
        t.start()
        assert fake.poll(5000), "no resume"
        ident2, body = fake.recv_multipart()
        assert ident2 == ident  # the same routing id
        assert msgpack.unpackb(body) == {"op": "resume", "id": rid, "tokens": 3}
        err = msgpack.packb({"id": rid, "event": "error", "code": "unavailable", "message": "-"})
        fake.send_multipart([ident, err])
        fake.send_multipart([ident, err])  # a second answer: dropped
        t.join(10)
        assert [m["code"] for m in got] == ["unavailable"]
        c.timeout_ms = 500
        with pytest.raises(TimeoutError):
            c.recv()
    fake.close(0)


def test_resume_sent_on_reconnect_c(zinfer_bin):
    fake, addr = fake_router()
    p = subprocess.Popen([str(client_bin(zinfer_bin)), "--router", addr, "--timeout", "10000",
                          "--json", "hi"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert fake.poll(5000)
        ident, body = fake.recv_multipart()
        rid = msgpack.unpackb(body)["id"]
        fake.send_multipart([ident, chunk(rid, [5, 6])])
        time.sleep(0.3)  # the client has it
        fake.close(0)
        fake, _ = fake_router(addr)
        assert fake.poll(5000), "no resume"
        ident2, body = fake.recv_multipart()
        assert ident2 == ident and msgpack.unpackb(body) == {"op": "resume", "id": rid,
                                                             "tokens": 2}
        fake.send_multipart([ident, chunk(rid, [8])])
        fake.send_multipart([ident, msgpack.packb(
            {"id": rid, "event": "final", "status": "maximum_length",
             "usage": {"prompt_tokens": 1, "completion_tokens": 3}})])
        out, errs = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
        fake.close(0)
    assert p.returncode == 0, errs
    assert '"token_ids":[5,6,8]' in out.replace(" ", ""), out


def test_router_lost_c_client(zinfer_bin):
    fake, addr = fake_router()
    p = subprocess.Popen([str(client_bin(zinfer_bin)), "--router", addr, "--timeout", "20000",
                          "--router-timeout", "1000", "hi"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert fake.poll(5000)
    fake.recv_multipart()
    fake.close(0)
    t = time.time()
    out, errs = p.communicate(timeout=20)
    assert p.returncode == 1 and "router_lost" in errs, (p.returncode, errs)
    assert 0.9 < time.time() - t < 5


def test_router_lost(tmp_path):
    """No router within router_timeout_s: one router_lost per open request,
    nothing else, within the timeout."""
    fake, addr = fake_router()
    with Client(addr, timeout_s=20.0, router_timeout_s=1.0) as c:
        rids = [c.send({"op": "generate", "prompt": "hi"}) for _ in range(3)]
        for _ in rids:
            assert fake.poll(5000)
            ident, body = fake.recv_multipart()
            assert msgpack.unpackb(body)["op"] == "generate"
        fake.close(0)  # the router dies with the requests
        t = time.time()
        ends = {}
        for rid in rids:
            for ev in c.events(rid):
                ends.setdefault(rid, []).append(ev)
        waited = time.time() - t
    for rid in rids:
        assert [e["event"] for e in ends[rid]] == ["error"], ends[rid]
        assert ends[rid][0]["code"] == "router_lost"
    assert 0.9 < waited < 5, waited


def terminal_frames(c, rids, timeout=60):
    """Every request's frames to its terminal one, asserting exactly one
    terminal frame each and nothing after: {rid: (ids, terminal)}."""
    got = collect(c, rids, timeout=timeout)
    return {r: (ids, term) for r, (ids, _, term) in got.items()}


def wait_health(addr, pred, timeout_s=30):
    """The health reply once pred(reply) holds (a restarted router answers
    when its backends have registered again)."""
    end = time.time() + timeout_s
    h = None
    with Client(addr, timeout_s=2) as hc:
        while time.time() < end:
            try:
                h = hc.call("health")
                if pred(h):
                    return h
            except (TimeoutError, Exception):  # the router may still be starting
                pass
            time.sleep(0.2)
    raise AssertionError(f"health never held: {h}")


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_router_killed_with_requests_queued(zinfer_bin, model_path, tmp_path):
    """One slot, four streams: the first runs, three wait queued when the
    router dies. Queued requests lived only in the router: their resume is
    answered unavailable, once; the running one completes."""
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1, "--slots", 1, "--ctx-size", 320,
                       "--heartbeat-timeout", 2000) as srv:
        with Client(srv.addr, timeout_s=60.0, router_timeout_s=30.0) as c:
            sp = {"max_new_tokens": MAX_NEW, "ignore_eos": True}
            rids = [c.send({"op": "generate", "prompt": prompt(i), "sampling_params": sp})
                    for i in range(4)]
            routers = children(srv)["router"]

            def kill():
                with Client(srv.addr, timeout_s=5) as hc:  # c's frames stay with collect
                    assert hc.call("health")["waiting"] == 3
                os.kill(routers[0], signal.SIGKILL)

            got = collect(c, rids, on_streaming=kill, min_tokens=3, watch=rids[:1])
            # a queued request's error is retryable: sent again, it completes
            again = c.send({"op": "generate", "prompt": prompt(1),
                            "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
            redo = collect(c, [again])
        log = srv.log()
    ids0, _, fin0 = got[rids[0]]
    assert fin0["event"] == "final" and fin0["status"] == "maximum_length", (fin0, log[-3000:])
    assert len(ids0) == MAX_NEW
    for rid in rids[1:]:
        ids, _, term = got[rid]
        assert term["event"] == "error" and term["code"] == "unavailable", (term, log[-3000:])
        assert ids == []
    assert redo[again][2]["event"] == "final" and len(redo[again][0]) == 8


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_router_killed_mid_encode(zinfer_bin, model_path, tmp_path):
    """A long prompt whose tokenizer is stopped (SIGSTOP) while it holds
    the encode: the router dies with the request being encoded, the
    resume is answered unavailable once, and the request sent again (the
    tokenizer going on) completes."""
    long_text = " ".join(f"word{k} and the story of number {k}" for k in range(40))
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1, "--slots", 1, "--ctx-size", 1024,
                       "--heartbeat-timeout", 2000) as srv:
        kids = children(srv)
        with Client(srv.addr, timeout_s=60.0, router_timeout_s=30.0) as c:
            req = {"op": "generate", "prompt": long_text,
                   "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
            os.kill(kids["tokenizer"][0], signal.SIGSTOP)
            try:
                rid = c.send(req)
                time.sleep(0.5)  # the router has sent the encode
                os.kill(kids["router"][0], signal.SIGKILL)
                time.sleep(0.5)
            finally:
                os.kill(kids["tokenizer"][0], signal.SIGCONT)
            got = collect(c, [rid])
            wait_health(srv.addr, lambda h: h.get("tokenizers") == 1 and h.get("workers") == 1)
            again = c.send(req)
            redo = collect(c, [again])
        log = srv.log()
    ids, _, term = got[rid]
    assert term["event"] == "error" and term["code"] == "unavailable", (term, log[-3000:])
    assert ids == []
    ids2, _, fin = redo[again]
    assert fin["event"] == "final" and len(ids2) == 8, fin
    assert fin["usage"]["prompt_tokens"] > 400, fin


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_router_not_back_worker_drops_orphans(zinfer_bin, model_path, tmp_path):
    """The router killed while the supervisor is stopped (so nothing
    restarts it): after --orphan-timeout the worker drops the sequence and
    frees its KV blocks; once a router is back the one slot takes a new
    request, and the orphaned request's resume is answered unavailable."""
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1, "--slots", 1, "--ctx-size", 320,
                       "--heartbeat-timeout", 2000, "--orphan-timeout", 1000) as srv:
        kids = children(srv)
        with Client(srv.addr, timeout_s=60.0, router_timeout_s=30.0) as c:
            rid = c.send({"op": "generate", "prompt": prompt(0),
                          "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True}})
            first = c.recv()
            assert first["event"] == "chunk", first
            os.kill(srv.proc.pid, signal.SIGSTOP)
            try:
                os.kill(kids["router"][0], signal.SIGKILL)
                deadline = time.time() + 15
                while "orphaned sequences" not in srv.log():
                    assert time.time() < deadline, srv.log()[-3000:]
                    time.sleep(0.1)
                t_drop = time.time()
            finally:
                os.kill(srv.proc.pid, signal.SIGCONT)
            rest = collect(c, [rid])
            h = wait_health(srv.addr, lambda h: h.get("workers") == 1 and
                            h["kv"].get("orphans_dropped") == 1 and h["kv"]["used"] == 0)
            # the one slot is free: a new request runs to its end
            new = c.send({"op": "generate", "prompt": prompt(1),
                          "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}})
            done = collect(c, [new])
        log = srv.log()
    line = next(ln for ln in log.splitlines() if "orphaned sequences" in ln)
    assert "dropped 1 orphaned sequences" in line, line
    assert "the router's connection closed" in log
    ids, _, term = rest[rid]
    assert term["event"] == "error" and term["code"] == "unavailable", (term, log[-3000:])
    assert h["running"] == 0
    assert done[new][2]["event"] == "final" and len(done[new][0]) == 16
    print(f"orphan dropped; a router back {time.time() - t_drop:.1f} s later")


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_router_back_no_resume_frees_sequence(zinfer_bin, model_path, tmp_path):
    """The router killed and restarted, but the client is gone and never
    resumes: the new router takes the sequence over from the worker, waits
    --resume-grace, then cancels it, so the worker frees its slot."""
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1, "--slots", 1, "--ctx-size", 320,
                       "--resume-grace", 1000) as srv:
        kids = children(srv)
        c = Client(srv.addr, timeout_s=60.0, router_timeout_s=30.0)
        c.send({"op": "generate", "prompt": prompt(0),
                "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True}})
        assert c.recv()["event"] == "chunk"
        os.kill(kids["router"][0], signal.SIGKILL)
        c.close()  # after the kill: the old router never saw the client leave
        deadline = time.time() + 20
        while "did not resume within 1000 ms" not in srv.log():
            assert time.time() < deadline, srv.log()[-3000:]
            time.sleep(0.1)
        h = wait_health(srv.addr, lambda h: h.get("workers") == 1 and h["running"] == 0
                        and h["kv"]["used"] == 0)
        with Client(srv.addr, timeout_s=60.0) as c2:  # the one slot is free
            new = c2.send({"op": "generate", "prompt": prompt(1),
                           "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
            done = collect(c2, [new])
    assert h["running"] == 0
    assert done[new][2]["event"] == "final" and len(done[new][0]) == 8, done[new][2]
