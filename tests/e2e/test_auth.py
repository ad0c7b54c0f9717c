"""CURVE authentication (docs/security.md), end to end.

One `zinfer serve --keys DIR` per module, with client keys on: the router,
a tokenizer and a worker holding listed keys. Against it:
- listed keys are served (the Python client and zinfer-client, the C one);
- a client with an unlisted key, or none, gets nothing (a timeout);
- a worker with an unlisted key registers nothing (health still counts one
  worker; the router logs the refusal with the key's first characters, the
  worker logs that it was refused), and a worker given the wrong router key
  never completes its handshake (it says so); requests are still served by
  the listed worker;
and, without a model: `zinfer keygen` (modes, no overwrite), a key given
on the command line or a secret readable by others refused, and a
non-loopback backend refused without keys and working with --insecure.
"""

import os
import socket
import stat
import subprocess
import time

import pytest

from conftest import REPO, free_port_pair, stop_process
from zinfer_client import Client, ZinferError

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def keygen(zinfer_bin, out, *extra):
    return subprocess.run([str(zinfer_bin), "keygen", str(out), *extra], capture_output=True,
                          text=True, timeout=30)


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def read(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def health(addr, keys, timeout_s=5):
    with Client(addr, timeout_s=timeout_s, curve_secret=keys / "client.key",
                router_key=keys / "router.pub") as c:
        return c.call("health")


@pytest.fixture(scope="module")
def keys(zinfer_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for name in ("router", "worker", "client", "stranger"):
        r = keygen(zinfer_bin, d / name)
        assert r.returncode == 0, r.stderr
    (d / "client-keys").write_text("# the clients let in\n" + (d / "client.pub").read_text())
    return d


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, keys, tmp_path_factory):
    port, bport = free_port_pair()
    addr, back = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{bport}"
    log = tmp_path_factory.mktemp("auth") / "serve.log"
    logf = open(log, "w")
    proc = subprocess.Popen(
        [str(zinfer_bin), "serve", "--model", str(model_path), "--bind", addr, "--backend", back,
         "--keys", str(keys), "--http", "off", "--slots", "2", "--threads-per-worker", "1"],
        stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def up():
            assert proc.poll() is None, read(log)
            try:
                h = health(addr, keys, timeout_s=1)
                return h.get("workers") == 1 and h.get("tokenizers") == 1
            except (TimeoutError, ZinferError):
                return False
        wait_for(up, 60, "the keyed server")
        yield {"addr": addr, "backend": back, "log": log}
    finally:
        stop_process(proc)
        logf.close()


def generate(client):
    out = client.generate(prompt=PROMPT, sampling_params={"max_new_tokens": 8},
                          stream=False)
    return next(ev for ev in out if ev["event"] in ("final", "error"))


def test_listed_keys_are_served(server, keys, zinfer_bin):
    with Client(server["addr"], timeout_s=30, curve_secret=keys / "client.key",
                router_key=keys / "router.pub") as c:
        fin = generate(c)
    assert fin["event"] == "final" and "Paris" in fin["text"], fin
    # The C client (zinfer-client) with the same keys.
    exe = zinfer_bin.parent / "clients" / "c" / "zinfer-client"
    if not exe.exists():
        exe = zinfer_bin.parent / "zinfer-client"
    r = subprocess.run([str(exe), "--router", server["addr"], "--max-tokens", "8", "--no-stream",
                        "--curve-secret", str(keys / "client.key"), "--router-key",
                        str(keys / "router.pub"), PROMPT],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == fin["text"].strip(), r.stderr


def test_unlisted_or_plain_client_gets_nothing(server, keys):
    with Client(server["addr"], timeout_s=1.5, curve_secret=keys / "stranger.key",
                router_key=keys / "router.pub") as c:
        with pytest.raises(TimeoutError):
            c.call("health")
    with Client(server["addr"], timeout_s=1.5) as c:
        with pytest.raises(TimeoutError):
            c.call("health")
    stranger = (keys / "stranger.pub").read_text().split("\n")[-2]
    wait_for(lambda: f"refused a client connection from 127.0.0.1: key {stranger[:8]}"
             in read(server["log"]), 10, "the client refusal in the router's log")


def test_unlisted_worker_and_wrong_router_key(server, keys, zinfer_bin, model_path, tmp_path):
    """Two workers started by hand: one with an unlisted key, one given the
    stranger's key as the router's. Neither ever registers."""
    worker = zinfer_bin.parent / "zinfer-worker"
    procs = []
    logs = {"unlisted": tmp_path / "unlisted.log", "wrong_router": tmp_path / "wrong.log"}
    args = {"unlisted": ("stranger.key", "router.pub"), "wrong_router": ("worker.key", "stranger.pub")}
    try:
        for name, (sec, rk) in args.items():
            procs.append(subprocess.Popen(
                [str(worker), "--router", server["backend"], "--model", str(model_path),
                 "--threads", "1", "--slots", "1", "--ctx-size", "256",
                 "--curve-secret", str(keys / sec), "--router-key", str(keys / rk)],
                stdout=open(logs[name], "w"), stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(lambda: "refused this process's key" in read(logs["unlisted"]), 60,
                 "the unlisted worker's refusal")
        wait_for(lambda: "CURVE handshake with the router failed" in read(logs["wrong_router"]),
                 60, "the wrong-router-key worker's handshake failure")
        stranger = (keys / "stranger.pub").read_text().split("\n")[-2]
        assert f"refused a backend connection from 127.0.0.1: key {stranger[:8]}" in \
            read(server["log"])
        # Logged once per key, however often the worker retries.
        time.sleep(1)
        assert read(server["log"]).count(f"backend connection from 127.0.0.1: key "
                                         f"{stranger[:8]}") == 1
        assert all(p.poll() is None for p in procs)
        assert health(server["addr"], keys)["workers"] == 1
        with Client(server["addr"], timeout_s=30, curve_secret=keys / "client.key",
                    router_key=keys / "router.pub") as c:
            fin = generate(c)
        assert fin["event"] == "final" and "Paris" in fin["text"], fin
        assert "registered" not in read(logs["unlisted"]) + read(logs["wrong_router"])
    finally:
        for p in procs:
            stop_process(p)


def test_keygen_and_key_files(zinfer_bin, tmp_path):
    r = keygen(zinfer_bin, tmp_path / "k")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "k.key").st_mode) == 0o600
    pub = (tmp_path / "k.pub").read_text().split("\n")[-2]
    assert len(pub) == 40 and pub in r.stdout
    r = keygen(zinfer_bin, tmp_path / "k")
    assert r.returncode == 1 and "exists (--force replaces it)" in r.stderr
    assert keygen(zinfer_bin, tmp_path / "k", "--force").returncode == 0
    assert (tmp_path / "k.pub").read_text().split("\n")[-2] != pub
    r = subprocess.run([str(zinfer_bin), "keygen", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "OUT.key" in r.stdout
    router = zinfer_bin.parent / "zinfer-router"
    secret = (tmp_path / "k.key").read_text().split("\n")[-2]
    r = subprocess.run([str(router), "--curve-secret", secret, "--backend-keys",
                        str(tmp_path / "k.pub")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "takes a key file's name, not a key" in r.stderr
    os.chmod(tmp_path / "k.key", 0o640)
    r = subprocess.run([str(router), "--curve-secret", str(tmp_path / "k.key"), "--backend-keys",
                        str(tmp_path / "k.pub")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "readable by others (mode 640)" in r.stderr
    (tmp_path / "bad").write_text("# ok\n" + pub[:-1] + "\n")
    os.chmod(tmp_path / "k.key", 0o600)
    r = subprocess.run([str(router), "--curve-secret", str(tmp_path / "k.key"), "--backend-keys",
                        str(tmp_path / "bad")], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and f"{tmp_path / 'bad'}:2: not a key: 39 characters" in r.stderr


def non_loopback_ip():
    """An address of a non-loopback interface, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_non_loopback_backend(zinfer_bin, model_path, tmp_path):
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 interface to bind")
    port, bport = free_port_pair()
    back = f"tcp://{ip}:{bport}"
    router = zinfer_bin.parent / "zinfer-router"
    base = [str(router), "--bind", f"tcp://127.0.0.1:{port}", "--backend", back]
    r = subprocess.run(base, capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and back in r.stderr and "--curve-secret" in r.stderr \
        and "--insecure" in r.stderr, r.stderr
    r = subprocess.run([str(zinfer_bin), "serve", "--model", str(model_path), "--backend", back],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and back in r.stderr and "--keys" in r.stderr, r.stderr
    log = tmp_path / "router.log"
    rp = subprocess.Popen(base + ["--insecure"], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                          start_new_session=True)
    tp = subprocess.Popen([str(zinfer_bin.parent / "zinfer-tokenizer"), "--router", back,
                           "--model", str(model_path)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def registered():
            assert rp.poll() is None, read(log)
            try:
                with Client(f"tcp://127.0.0.1:{port}", timeout_s=1) as c:
                    return c.call("health").get("tokenizers") == 1
            except TimeoutError:
                return False
        wait_for(registered, 30, "a tokenizer registered over " + back)
        assert "--insecure" in read(log)
    finally:
        stop_process(tp)
        stop_process(rp)
