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

Needs pyzmq and msgpack. Arrays may arrive numpy-style
({"__np__": True, "dtype", "shape", "data"}); decode_array() turns them into
Python lists (or numpy arrays, when numpy is installed and asked for).
"""

import itertools
import os
import struct

import msgpack
import zmq

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
                 curve_secret=None, router_key=None):
        """curve_secret: this client's secret key file (its public key is
        derived); router_key: the router's public key file. Both or
        neither; with them the connection is CURVE (docs/security.md)."""
        if (curve_secret is None) != (router_key is None):
            raise ValueError("curve_secret and router_key go together")
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
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
        return msg["id"]

    def _recv_one(self):
        if not self.sock.poll(self.timeout_ms):
            raise TimeoutError("no reply from the router within the timeout")
        return msgpack.unpackb(self.sock.recv(), raw=False, strict_map_key=False)

    def next_reply(self, rid):
        """The next reply for request rid (buffering others' replies)."""
        while True:
            q = self._pending.get(rid)
            if q:
                return q.pop(0)
            reply = self._recv_one()
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
