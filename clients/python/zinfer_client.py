"""zinfer_client - a small Python client for zinfer's protocol version 1.

One DEALER socket to the router (default tcp://127.0.0.1:5555); every request
is one msgpack map, every reply a msgpack map with the request's "id" and an
"event" ("chunk", "final" or "error"). Many requests may be in flight on one
socket; replies are routed to the right request by id.

    from zinfer_client import Client
    with Client("tcp://127.0.0.1:5555") as c:
        for ev in c.generate(prompt="The capital of France is",
                             sampling_params={"max_new_tokens": 16}):
            if ev["event"] == "chunk":
                print(ev["text"], end="", flush=True)

With CURVE keys (docs/security.md): Client(address, curve_secret="me.key",
router_key="router.pub"), key files as `zinfer keygen` writes them.

Router restarts (docs/protocol.md, "Router restart"): the socket has a
routing id of its own, so a restarted router knows it; when the connection
to the router closes and opens again, the client sends "resume" for each
request still open, with the number of token ids it holds, and the stream
goes on where it stopped (each token once). A router that does not come
back within router_timeout_s ends every open request with one "error"
frame of code "router_lost" (made here: there is no router to send it).

Needs pyzmq and msgpack. Arrays may arrive numpy-style
({"__np__": True, "dtype", "shape", "data"}); decode_array() turns them into
Python lists (or numpy arrays, when numpy is installed and asked for).
"""

import itertools
import os
import struct
import time

import msgpack
import zmq
import zmq.utils.monitor

_DTYPES = {"int64": "q", "int32": "i", "float32": "f", "float64": "d", "uint8": "B"}


def decode_array(obj, as_numpy=False):
    """A numpy-style array map (or a plain list) as a list / numpy array."""
    if isinstance(obj, dict) and obj.get("__np__"):
        fmt = _DTYPES.get(obj["dtype"])
        if fmt is None:
            raise ValueError(f"unsupported dtype {obj['dtype']!r}")
        if as_numpy:
            import numpy as np
            return np.frombuffer(obj["data"], dtype="<" + np.dtype(obj["dtype"]).str[1:]) \
                .reshape(obj["shape"])
        n = len(obj["data"]) // struct.calcsize(fmt)
        return list(struct.unpack("<%d%s" % (n, fmt), obj["data"]))
    return list(obj) if obj is not None else []


def decode_logprobs(obj):
    """A LogProbabilities map as {"token_log_probabilities": [float],
    "top_log_probabilities": [{token_id: log_prob}]}."""
    if obj is None:
        return None
    return {"token_log_probabilities": decode_array(obj["token_log_probabilities"]),
            "top_log_probabilities": [dict(m) for m in obj["top_log_probabilities"]]}


_Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def read_key(path, secret=False):
    """The one Z85 key (bytes) of a key file: '#' comment lines and blank
    lines skipped (a line that is exactly one key may start with '#').
    secret: the file must not be accessible by group or others."""
    if secret:
        mode = os.stat(path).st_mode & 0o777
        if mode & 0o077:
            raise ValueError(f"{path}: a secret key readable by others (mode {mode:03o}): "
                             f"run chmod 600 {path}")
    keys = []
    with open(path, encoding="ascii") as f:
        for n, line in enumerate(f, 1):
            line = line.strip(" \t\r\n")
            is_key = len(line) == 40 and set(line) <= _Z85
            if not line or (line.startswith("#") and not is_key):
                continue
            if not is_key:
                raise ValueError(f"{path}:{n}: not a key: a Z85 key has 40 characters")
            keys.append(line.encode())
    if len(keys) != 1:
        raise ValueError(f"{path}: {len(keys)} keys in the file, expected one")
    return keys[0]


class ZinferError(Exception):
    """An "error" reply: .code ("invalid_request", "overloaded", ...), .field."""

    def __init__(self, reply):
        super().__init__(f"{reply.get('code')}: {reply.get('message')}")
        self.code = reply.get("code")
        self.field = reply.get("field")
        self.reply = reply


class Client:
    def __init__(self, address="tcp://127.0.0.1:5555", timeout_s=120.0,
                 curve_secret=None, router_key=None, router_timeout_s=30.0):
        """curve_secret: this client's secret key file (its public key is
        derived); router_key: the router's public key file. Both or
        neither; with them the connection is CURVE (docs/security.md).
        router_timeout_s: how long open requests wait for a router that
        went away to come back before each ends with "router_lost"
        (None: as long as timeout_s allows)."""
        if (curve_secret is None) != (router_key is None):
            raise ValueError("curve_secret and router_key go together")
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # A routing id of its own (ZeroMQ's are random per connection): a
        # restarted router matches "resume" to the requests workers hand
        # back by it. ZMTP heartbeats notice a router whose host vanished.
        self.sock.setsockopt(zmq.IDENTITY, b"zc-" + os.urandom(12).hex().encode())
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        self._mon = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.router_timeout_ms = None if router_timeout_s is None else int(router_timeout_s * 1000)
        self._open = {}  # generate id -> token ids received (what a resume says it holds)
        self._inbox = []  # frames read from the socket, not yet returned by _recv_one
        # Resumed requests, and those that ended after a resume: a request
        # the old router never got may be answered twice (its generate
        # refused by the new router, then its resume), the second dropped.
        self._resumed, self._ended = set(), set()
        self._lost_at = None  # time.monotonic() when the router's connection closed
        self._was_connected = False
        if curve_secret is not None:
            secret = read_key(curve_secret, secret=True)
            self.sock.curve_secretkey = secret
            self.sock.curve_publickey = zmq.curve_public(secret)
            self.sock.curve_serverkey = read_key(router_key)
        self.sock.connect(address)
        self.timeout_ms = int(timeout_s * 1000)
        self._ids = itertools.count()
        self._prefix = "py%d-" % os.getpid()
        self._pending = {}  # id -> list of replies received for it

    def close(self):
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._mon.close(0)
        self.sock.close(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def new_id(self):
        return self._prefix + str(next(self._ids))

    def send(self, msg):
        """Sends one request map; returns its id (assigned if missing)."""
        msg = dict(msg)
        msg.setdefault("id", self.new_id())
        self.sock.send(msgpack.packb(msg, use_bin_type=True))
        self._pending.setdefault(msg["id"], [])
        if msg.get("op") == "generate":
            self._open[msg["id"]] = 0
            self._ended.discard(msg["id"])
        return msg["id"]

    def _on_monitor(self):
        """A connection event: a reconnect after a loss sends the resumes."""
        ev = zmq.utils.monitor.recv_monitor_message(self._mon)
        if ev["event"] == zmq.EVENT_DISCONNECTED:
            if self._lost_at is None:
                self._lost_at = time.monotonic()
        elif ev["event"] == zmq.EVENT_CONNECTED:
            if self._was_connected:
                # What the old connection delivered first: the counts must
                # include it, or those tokens would come twice.
                while True:
                    try:
                        m = self._take(self.sock.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if m is not None:
                        self._inbox.append(m)
                for rid, held in self._open.items():
                    self._resumed.add(rid)
                    self.sock.send(msgpack.packb({"op": "resume", "id": rid, "tokens": held},
                                                 use_bin_type=True))
            self._was_connected = True
            self._lost_at = None

    def _router_lost(self):
        """Every open request ends with one router_lost error."""
        for rid in list(self._open):
            self._pending.setdefault(rid, []).append(
                {"id": rid, "event": "error", "code": "router_lost",
                 "message": "the router went away and did not come back within "
                            "router_timeout_s"})
        self._open.clear()
        self._lost_at = None

    def _recv_one(self):
        if self._inbox:
            return self._inbox.pop(0)
        deadline = time.monotonic() + self.timeout_ms / 1000
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._mon, zmq.POLLIN)
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError("no reply from the router within the timeout")
            wait = deadline - now
            if self._lost_at is not None and self.router_timeout_ms is not None:
                left = self._lost_at + self.router_timeout_ms / 1000 - now
                if left <= 0 and self._open:
                    self._router_lost()
                    return None
                wait = min(wait, max(left, 0.01))
            ready = dict(poller.poll(int(wait * 1000) + 1))
            if self._mon in ready:
                self._on_monitor()
            if self._inbox:
                return self._inbox.pop(0)
            if self.sock in ready:
                try:  # (a monitor event may have drained it)
                    m = self._take(self.sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    continue
                if m is not None:
                    return m

    def _take(self, data):
        """A frame read from the socket, counted for a resume (None: one
        to drop, after the end of a resumed request)."""
        m = msgpack.unpackb(data, raw=False, strict_map_key=False)
        rid = m.get("id", "")
        if rid in self._open:
            if m.get("event") == "chunk":
                self._open[rid] += len(decode_array(m.get("token_ids")))
            elif m.get("event") in ("final", "error"):
                del self._open[rid]
                if rid in self._resumed:
                    self._resumed.discard(rid)
                    self._ended.add(rid)
        elif rid in self._ended:
            return None
        return m

    def next_reply(self, rid):
        """The next reply for request rid (buffering others' replies)."""
        while True:
            q = self._pending.get(rid)
            if q:
                return q.pop(0)
            reply = self._recv_one()
            if reply is not None:  # None: router_lost errors were queued
                self._pending.setdefault(reply.get("id", ""), []).append(reply)

    def events(self, rid):
        """Yields rid's replies until its final or error frame (inclusive)."""
        while True:
            ev = self.next_reply(rid)
            for key in ("token_ids", "prompt_token_ids"):
                if key in ev:
                    ev[key] = decode_array(ev[key])
            for key in ("logprobs", "prompt_logprobs"):
                if key in ev:
                    ev[key] = decode_logprobs(ev[key])
            yield ev
            if ev.get("event") in ("final", "error"):
                self._pending.pop(rid, None)
                return

    def generate(self, prompt=None, messages=None, sampling_params=None, stream=True, **extra):
        """Yields the chunk frames and then the final (or error) frame."""
        msg = {"op": "generate", "stream": stream}
        if prompt is not None:
            msg["prompt"] = prompt
        if messages is not None:
            msg["messages"] = messages
        if sampling_params:
            msg["sampling_params"] = sampling_params
        msg.update(extra)
        return self.events(self.send(msg))

    def complete(self, prompt=None, messages=None, sampling_params=None, **extra):
        """Runs one request to the end: (text, token_ids, final frame).
        With logprobs (and echo) asked for, the final frame also gets the
        whole completion's "logprobs" (and "prompt_token_ids", "prompt_text",
        "prompt_logprobs"), gathered from the chunks. Raises ZinferError on
        an error frame."""
        text, ids, final = [], [], None
        lps = {"token_log_probabilities": [], "top_log_probabilities": []}
        seen_lp, echoed = False, {}
        for ev in self.generate(prompt, messages, sampling_params, **extra):
            if ev["event"] == "chunk":
                text.append(ev.get("text", ""))
                ids.extend(ev.get("token_ids", []))
                if ev.get("logprobs"):
                    seen_lp = True
                    for k in lps:
                        lps[k].extend(ev["logprobs"][k])
                for k in ("prompt_token_ids", "prompt_text", "prompt_logprobs"):
                    if k in ev:
                        echoed[k] = ev[k]
            elif ev["event"] == "error":
                raise ZinferError(ev)
            else:
                final = ev
                if ev.get("text"):
                    text.append(ev["text"])
        if seen_lp:
            final["logprobs"] = lps
        final.update(echoed)
        return "".join(text), ids, final

    def cancel(self, rid):
        self.sock.send(msgpack.packb({"op": "cancel", "id": rid}, use_bin_type=True))

    def recv(self):
        """The next frame of any request (None when router_lost errors
        were just queued for the open requests: next_reply returns them)."""
        return self._recv_one()

    def embed(self, input, **fields):
        """Embeddings of input (a string, token ids, or a list of them;
        fields: pooling, normalize, truncate): (a numpy float32 array of
        [rows, dim], the result frame). Needs numpy."""
        r = self.call("embed", input=input, **fields)
        return decode_array(r["embeddings"], as_numpy=True), r

    def call(self, op, **fields):
        """A one-reply request (health, models, tokenize, detokenize, embed)."""
        rid = self.send(dict(op=op, **fields))
        ev = self.next_reply(rid)
        self._pending.pop(rid, None)
        if ev.get("event") == "error":
            raise ZinferError(ev)
        return ev
