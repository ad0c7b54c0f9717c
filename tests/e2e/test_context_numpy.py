"""The TextContext a `zinfer-tokenizer` process produces, read with msgpack
and numpy alone (docs/protocol.md "Internal protocol", docs/types.md
"TextContext").

The test plays the router: it binds a ROUTER socket on a free port, starts
one zinfer-tokenizer pointed at it, waits for its `register`, and sends it
`encode` messages shaped as the router sends them (op_generate in
router/router_client.c: `rid`, `max_length`, and the validated request
with `max_new_tokens` filled in). The `encoded`
reply's context must decode without any zinfer code: the token array is
numpy-style int64 (`np.frombuffer`), equal to `zinfer tokenize
--parse-special` for the same text, and the indices have the initial
values docs/types.md gives for `init` (start 0, active = end = prompt_len
= n, max_length = min(limit, n + max_new_tokens)). The tokenizer process is
always stopped in teardown.
"""

import json
import socket
import subprocess
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from conftest import REPO, stop_process

TEXT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
MAX_NEW = 16
MAX_LENGTH = 512


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def np_array(v, dtype):
    """A numpy-style array map -> ndarray, checking the map's own claims."""
    assert isinstance(v, dict), v
    assert v["__np__"] is True
    assert v["dtype"] == dtype, v["dtype"]
    a = np.frombuffer(v["data"], dtype="<" + np.dtype(dtype).str[1:])
    assert list(a.shape) == list(v["shape"]), (a.shape, v["shape"])
    return a


class FakeRouter:
    """The router's backend ROUTER socket, driven by hand."""

    def __init__(self, ctx, addr):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(addr)
        self.ident = None

    def recv(self, timeout=20.0):
        """The next non-heartbeat message from the backend."""
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise TimeoutError("no message from the tokenizer")
            frames = self.sock.recv_multipart()
            assert len(frames) == 2, frames  # [identity, payload]: no envelope
            self.ident = frames[0]
            m = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)
            if m.get("type") != "heartbeat":
                return m

    def send(self, msg):
        self.sock.send_multipart([self.ident, msgpack.packb(msg, use_bin_type=True)])

    def encode(self, rid, prompt, max_new=MAX_NEW, max_length=MAX_LENGTH, **sampling):
        """An encode exactly as the router packs it (zi_im_encode_pack)."""
        sp = {"max_new_tokens": max_new, **sampling}
        self.send({"type": "encode", "rid": rid, "max_length": max_length,
                   "request": {"id": f"client-{rid}", "index": 0, "model_name": "",
                               "prompt": prompt, "timestamp_ns": 0, "request_path": "/",
                               "logprobs": 0, "echo": False, "sampling_params": sp,
                               "stream": True}})
        m = self.recv()
        assert m.get("rid") == rid, m
        return m


@pytest.fixture(scope="module")
def tokenizer_proc(zinfer_bin, model_path):
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    router = FakeRouter(ctx, addr)
    exe = zinfer_bin.parent / "zinfer-tokenizer"
    assert exe.is_file(), f"{exe} not built"
    proc = subprocess.Popen([str(exe), "--router", addr, "--model", str(model_path),
                             "--log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        reg = router.recv(30)
        yield router, reg
    finally:
        stop_process(proc)
        router.sock.close()
        ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def cli_tokens(zinfer_bin, model_path):
    r = subprocess.run([str(zinfer_bin), "tokenize", "--parse-special", "--model",
                        str(model_path)], input=json.dumps(TEXT) + "\n", capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(ids) > 5
    return ids


def test_register_handshake(tokenizer_proc, model_path):
    _, reg = tokenizer_proc
    # the model's name is its file's, without .gguf (--model-name overrides)
    assert reg == {"type": "register", "role": "tokenizer", "vocab": 49152,
                   "model": Path(model_path).name.removesuffix(".gguf")}


def check_initial_indices(ctx, n):
    assert ctx["_start_idx"] == 0
    assert ctx["_committed_idx"] == 0
    assert ctx["_active_idx"] == n
    assert ctx["_end_idx"] == n
    assert ctx["_prompt_len"] == n
    assert ctx["_completion_start_idx"] == n
    assert ctx["_completion_end_idx"] == n
    assert ctx["_size"] == n  # only [0, _end_idx) travels
    assert ctx["_status"] == "active"
    assert ctx["_cache_seq_id"] is None
    assert ctx["_is_initial_prompt"] is True
    assert ctx["_draft_offset"] == 0
    assert ctx["_matcher"] is None
    assert ctx["_log_probabilities_data"] == {}


def test_text_context_decodes_with_numpy(tokenizer_proc, cli_tokens):
    router, _ = tokenizer_proc
    m = router.encode(7, TEXT)
    assert m["type"] == "encoded", m
    n = len(cli_tokens)
    assert m["prompt_tokens"] == n
    ctx = m["context"]
    toks = np_array(ctx["tokens"], "int64")
    assert toks.shape == (n,)
    assert toks.tolist() == cli_tokens
    check_initial_indices(ctx, n)
    assert ctx["max_length"] == min(MAX_LENGTH, n + MAX_NEW)
    assert ctx["request_id"] == "7"  # the router's rid, as a string
    assert ctx["ignore_eos"] is False
    assert ctx["sampling_params"]["max_new_tokens"] == MAX_NEW
    # The model's end-of-generation ids: <|endoftext|> (0) and <|im_end|> (2)
    # are among them; every id is inside the vocabulary.
    eos = ctx["eos_token_ids"]
    eos = np_array(eos, eos["dtype"]).tolist() if isinstance(eos, dict) else list(eos)
    assert {0, 2} <= set(eos) and all(0 <= t < 49152 for t in eos), eos


def test_token_prompt_and_limits(tokenizer_proc, cli_tokens):
    router, _ = tokenizer_proc
    # Token ids in (a plain msgpack array, as clients may send): the same
    # array comes back; a small context caps max_length.
    ids = [5, 17, 4093, 198]
    m = router.encode(8, ids, max_new=100, max_length=40, ignore_eos=True)
    assert m["type"] == "encoded", m
    ctx = m["context"]
    assert np_array(ctx["tokens"], "int64").tolist() == ids
    check_initial_indices(ctx, len(ids))
    assert ctx["max_length"] == 40
    assert ctx["sampling_params"]["ignore_eos"] is True
    # A prompt that leaves no room in the context is refused, naming it.
    m = router.encode(9, TEXT, max_length=len(cli_tokens))
    assert m["type"] == "error" and m["code"] == "invalid_request", m
    assert m.get("field") == "prompt", m
    # An id outside the vocabulary: refused with the index at fault.
    m = router.encode(10, [1, 2, 60000])
    assert m["type"] == "error" and m.get("field") == "prompt[2]", m
    assert "60000" in m["message"]
    # The process still answers afterwards.
    m = router.encode(11, TEXT)
    assert m["type"] == "encoded"
    assert np_array(m["context"]["tokens"], "int64").tolist() == cli_tokens
