"""Prefix affinity survives a router restart (docs/architecture.md,
"Prefix affinity"; docs/protocol.md, register's "prefix_keys").

Two workers each take one of two prompts (sent together: the least loaded
worker takes each), so each holds one prefix in memory. The router is
killed with SIGKILL and restarted by serve's supervisor; the workers
register again with the prefix keys of the requests they took. The two
prompts, sent again one at a time, each go to the worker that holds it:
every eligible block is a memory hit. Without the keys the new router's
table is empty, both go to the same (least loaded, first) worker, and one
of them is computed again.
"""

import os
import signal
import time

from conftest import kv_when, serve_process
from test_server_load import children

from zinfer_client import Client

BS = 16
# ~100 ids each, different from their first token on
PROMPTS = [[1] + [(900 + 53 * k) % 30000 + 300 for k in range(99)],
           [1] + [(700 + 37 * k) % 30000 + 300 for k in range(99)]]
ELIGIBLE = (len(PROMPTS[0]) - 1) // BS
SP = {"max_new_tokens": 4, "temperature": 0}


def test_warm_workers_preferred_after_router_restart(zinfer_bin, model_path, tmp_path):
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log", "--threads-per-worker", 1,
                       "--slots", 2, "--ctx-size", 256, "--heartbeat-timeout", 2000,
                       workers=2) as srv:
        with Client(srv.addr, timeout_s=60) as c:
            rids = [c.send({"op": "generate", "prompt": p, "sampling_params": SP})
                    for p in PROMPTS]
            ref = []
            for rid in rids:
                ids = []
                for ev in c.events(rid):
                    assert ev["event"] in ("chunk", "final"), ev
                    ids.extend(ev.get("token_ids", []))
                ref.append(ids)
            k = kv_when(c, lambda k: k["prefix_query_tokens"] > 0)
            assert k["mem_hit_blocks"] == 0, k
        routers = children(srv).get("router", [])
        assert len(routers) == 1, children(srv)
        os.kill(routers[0], signal.SIGKILL)
        deadline = time.time() + 60
        while True:
            now = children(srv).get("router", [])
            if now and now != routers:
                try:
                    with Client(srv.addr, timeout_s=2) as c:
                        if c.call("health").get("workers") == 2:
                            break
                except Exception:  # the new router is not listening yet
                    pass
            assert time.time() < deadline, srv.log()
            time.sleep(0.2)
        with Client(srv.addr, timeout_s=60) as c:
            for p, want in zip(PROMPTS, ref):  # one at a time: both workers idle
                assert c.complete(prompt=p, sampling_params=SP)[1] == want
            k = kv_when(c, lambda k: k["mem_hit_blocks"] >= 2 * ELIGIBLE)
        log = srv.log()
    # both prefixes found in memory: each went to the worker holding it
    assert k["mem_hit_blocks"] == 2 * ELIGIBLE, (k, log[-3000:])
    assert log.count("prefixes taken lately") >= 2, log[-3000:]
