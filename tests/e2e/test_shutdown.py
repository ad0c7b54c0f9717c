"""A clean shutdown: SIGINT or SIGTERM to `zinfer serve` while a request
streams. Each request in flight still gets exactly one terminal frame (an "error"
with code "unavailable": the server is going away), serve stops its three
children and exits 0, and no process of the group is left."""

import os
import re
import signal

import msgpack
import pytest
import zmq

from conftest import serve_process


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_serve_cleanly(zinfer_bin, model_path, tmp_path, sig):
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log",
                       "--threads-per-worker", 1) as srv:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(srv.addr)
        try:
            for rid, stream in (("long", True), ("whole", False)):
                sock.send(msgpack.packb({"op": "generate", "id": rid, "prompt": "Count to 1000.",
                                         "stream": stream,
                                         "sampling_params": {"max_new_tokens": 400,
                                                             "ignore_eos": True}}))
            assert sock.poll(30000), "no reply"
            first = msgpack.unpackb(sock.recv(), strict_map_key=False)
            assert first["id"] == "long" and first["event"] == "chunk", first
            srv.proc.send_signal(sig)
            terminal = {}
            while len(terminal) < 2 and sock.poll(15000):
                m = msgpack.unpackb(sock.recv(), strict_map_key=False)
                assert m["id"] not in terminal, ("a frame after the terminal one", m)
                if m["event"] != "chunk":
                    terminal[m["id"]] = m
            assert sorted(terminal) == ["long", "whole"], terminal
            for m in terminal.values():
                assert m["event"] in ("error", "final"), m
                if m["event"] == "error":
                    assert m["code"] == "unavailable", m
            assert not sock.poll(1000), "a frame after the terminal ones"
            assert srv.proc.wait(timeout=20) == 0, srv.log()[-3000:]
        finally:
            sock.close()
            ctx.term()
        with pytest.raises(ProcessLookupError):
            os.killpg(srv.proc.pid, 0)  # the whole group is gone
        log = srv.log()
        assert "did not stop" not in log, log[-3000:]
        stopped = re.findall(r"(router|tokenizer 0|worker 0) \(pid \d+\) stopped", log)
        assert sorted(stopped) == ["router", "tokenizer 0", "worker 0"], log[-3000:]
