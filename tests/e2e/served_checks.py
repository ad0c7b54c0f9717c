"""Checks a family's served test runs on a live `zinfer serve` (two
workers): the same prompts twice (the second time from the prefix cache),
a regex-constrained request, and the prompts again with a worker killed
mid-stream. Shared by test_families_moe.py and test_hybrids.py."""

import os
import re
import signal

from test_failover import collect
from test_server_load import children


def run_all(c, ps, sp):
    """Every prompt at once: (token ids, terminal frames), in order."""
    rids = [c.send({"op": "generate", "prompt": p, "sampling_params": sp}) for p in ps]
    got = collect(c, rids)
    return [got[r][0] for r in rids], [got[r][2] for r in rids]


def check_regex(c, prompt):
    """A regex-constrained request's whole completion matches it."""
    rid = c.send({"op": "generate", "prompt": prompt, "regex": r"[0-9]{3}-[0-9]{2}",
                  "sampling_params": {"max_new_tokens": 16}})
    text, fin = "", None
    for ev in c.events(rid):
        text += ev.get("text", "")
        fin = ev
    assert re.fullmatch(r"[0-9]{3}-[0-9]{2}", text), (text, fin)


def run_killing_a_worker(c, srv, ps, sp):
    """The prompts at once, one of the two workers killed once every request
    has streamed a token: (token ids, terminal frames), in order."""
    workers = children(srv).get("worker", [])
    assert len(workers) == 2, children(srv)
    rids = [c.send({"op": "generate", "prompt": p, "sampling_params": sp}) for p in ps]
    got = collect(c, rids, on_streaming=lambda: os.kill(workers[0], signal.SIGKILL),
                  min_tokens=1)
    return [got[r][0] for r in rids], [got[r][2] for r in rids]
