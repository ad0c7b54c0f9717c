#!/usr/bin/env python3
"""Streams one chat completion from a running `zinfer serve`.

    python clients/python/example.py [tcp://127.0.0.1:5555] "Your question"
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zinfer_client import Client, ZinferError  # noqa: E402

address = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
question = sys.argv[2] if len(sys.argv) > 2 else "What is the capital of France?"
with Client(address) as c:
    for ev in c.generate(messages=[{"role": "user", "content": question}],
                         sampling_params={"max_new_tokens": 128}):
        if ev["event"] == "chunk":
            print(ev.get("text", ""), end="", flush=True)
        elif ev["event"] == "error":
            raise ZinferError(ev)
        else:
            print(f"\n[{ev.get('status')}; usage {ev.get('usage')}]")
