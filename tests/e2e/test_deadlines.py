"""Deadlines and disconnects (docs/protocol.md "Deadlines and
disconnects"), on one `zinfer serve` with two 1-slot workers, a
--request-timeout of 1.5 s and a --heartbeat-timeout far above what the
tests wait:

- a request's timeout_ms ends a running generation with final
  "deadline_exceeded" near the deadline, and its worker slot is free after;
- a request waiting in the queue (both slots busy) ends the same way;
- without timeout_ms the server's --request-timeout applies;
- a DEALER that sends a non-streamed request and closes its socket: the
  router cancels the request (health "running" drops, metrics count it
  "cancelled") within about a second;
- a worker killed with SIGKILL is noticed by its connection closing (well
  before --heartbeat-timeout) and its request resumes on the other worker.
"""

import os
import signal
import time

import msgpack
import pytest
import zmq

from conftest import serve_process
from test_server_load import children

from zinfer_client import Client  # conftest puts clients/python on the path

SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"
DEFAULT_MS = 1500
HB_MS = 20000


@pytest.fixture(scope="module")
def srv(zinfer_bin, model_path, tmp_path_factory):
    with serve_process(zinfer_bin, model_path, tmp_path_factory.mktemp("deadlines") / "serve.log",
                       "--threads-per-worker", 1, "--slots", 1, "--ctx-size", 512,
                       "--request-timeout", DEFAULT_MS, "--heartbeat-timeout", HB_MS,
                       workers=2) as s:
        yield s


def long_req(**extra):
    return {"op": "generate", "prompt": "Once upon a time",
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}, **extra}


def until_final(c, rid, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        m = c._recv_one()
        if m["id"] == rid and m["event"] in ("final", "error"):
            return m
    raise AssertionError("no final frame")


def finals(c, rids, timeout=30):
    """The terminal frame of each of rids, whatever order they come in
    (until_final drops the other requests' frames)."""
    end, got = time.time() + timeout, {}
    while time.time() < end and len(got) < len(rids):
        m = c._recv_one()
        if m["id"] in rids and m["event"] in ("final", "error"):
            got[m["id"]] = m
    assert len(got) == len(rids), ("no final frame", set(rids) - set(got))
    return [got[r] for r in rids]


def wait_health(c, pred, timeout):
    end = time.time() + timeout
    while True:
        h = c.call("health")
        if pred(h) or time.time() > end:
            return h
        time.sleep(0.05)


def test_timeout_ms_ends_a_running_request(srv):
    with Client(srv.addr, timeout_s=30) as c:
        t0 = time.time()
        rid = c.send(long_req(timeout_ms=700))
        fin = until_final(c, rid)
        took = time.time() - t0
        assert fin["event"] == "final" and fin["status"] == "deadline_exceeded", fin
        assert 0 < fin["usage"]["completion_tokens"] < 400, fin
        assert 0.6 < took < 0.7 + 0.6, took
        h = wait_health(c, lambda h: h["running"] == 0 and h["waiting"] == 0, 2)
        assert h["running"] == 0 and h["waiting"] == 0, h


def test_queued_request_and_server_default(srv):
    with Client(srv.addr, timeout_s=30) as c:
        t0 = time.time()
        busy = [c.send(long_req()) for _ in range(2)]  # both slots, the default deadline
        wait_health(c, lambda h: h["running"] == 2, 5)
        rid = c.send(long_req(timeout_ms=300, stream=False))
        fins = finals(c, [rid] + busy)
        fin = fins[0]
        assert fin["status"] == "deadline_exceeded" and fin["text"] == "", fin
        assert fin["usage"]["completion_tokens"] == 0, fin  # it never left the queue
        for fin in fins[1:]:  # no timeout_ms: --request-timeout ends them
            assert fin["status"] == "deadline_exceeded", fin
        took = time.time() - t0
        assert DEFAULT_MS / 1000 <= took < DEFAULT_MS / 1000 + 0.8, took
        assert c.call("health")["running"] == 0


def test_timeout_ms_validated(srv):
    with Client(srv.addr, timeout_s=10) as c:
        for bad in (0, -5, 86400001, "1000"):
            rid = c.send(long_req(timeout_ms=bad))
            m = until_final(c, rid)
            assert m["event"] == "error" and m["code"] == "invalid_request", m
            assert m["field"] == "timeout_ms", m


def test_disconnected_client_is_cancelled(srv):
    with Client(srv.addr, timeout_s=10) as c:
        before = c.call("metrics")["finished"]["cancelled"]
        ctx = zmq.Context.instance()
        d = ctx.socket(zmq.DEALER)
        d.connect(srv.addr)
        d.send(msgpack.packb(long_req(id="gone", stream=False, timeout_ms=60000)))
        h = wait_health(c, lambda h: h["running"] == 1, 5)
        assert h["running"] == 1, h
        d.close(linger=0)
        t0 = time.time()
        h = wait_health(c, lambda h: h["running"] == 0, 5)
        assert h["running"] == 0 and time.time() - t0 < 1.5, (h, time.time() - t0)
        assert c.call("metrics")["finished"]["cancelled"] == before + 1


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers")
def test_killed_worker_noticed_by_its_connection(srv):
    """Last: it leaves one worker."""
    workers = children(srv).get("worker", [])
    assert len(workers) == 2, children(srv)
    with Client(srv.addr, timeout_s=30) as c:
        sp = {"max_new_tokens": 120, "ignore_eos": True}
        rids = [c.send({"op": "generate", "prompt": "Once upon a time", "timeout_ms": 60000,
                        "sampling_params": sp}) for _ in range(2)]
        wait_health(c, lambda h: h["running"] == 2, 5)
        os.kill(workers[0], signal.SIGKILL)
        t0 = time.time()
        h = wait_health(c, lambda h: h["workers"] == 1, 5)
        noticed = time.time() - t0
        assert h["workers"] == 1 and noticed < 1.0, (h, noticed)  # not HB_MS
        resumed, fins = 0, {}
        while len(fins) < 2:
            m = c._recv_one()
            assert m["id"] in rids and m["id"] not in fins, m
            if m["event"] == "chunk":
                resumed += bool(m.get("resumed"))
            else:
                fins[m["id"]] = m
        for m in fins.values():
            assert m["event"] == "final" and m["status"] == "maximum_length", m
            assert m["usage"]["completion_tokens"] == 120, m
        assert resumed == 1
    assert "connection closed" in srv.log()
