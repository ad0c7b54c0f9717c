"""The default memory budget and the start-up errors it can lead to
(docs/engine.md, "KV cache"; model_worker/mem_plan.h; common/startup.h).

- With no memory flag, `zinfer serve` sizes each worker's KV cache for
  every slot's full context (--slots 8 x --ctx-size 4096 by default) and
  serves a request that fills the whole 4096-position context: nothing is
  cut to a smaller cache.
- A configuration whose weights and KV cache do not fit the machine's
  memory stops `zinfer serve` at once, before anything starts, with one
  line giving the numbers and the flags to change; zinfer-worker started
  by hand says the same and exits with status 78.
- A worker that cannot start with its configuration (here a memory budget
  too small for one KV block) makes `zinfer serve` stop with status 1 and
  that error as its last line, reported once: the worker is started once,
  not restarted in a loop. A model file the processes cannot load stops
  it the same way.
- The budget's share of MemAvailable is in serve's and the worker's --help.
"""

import json
import os
import re
import subprocess
import time

import pytest

from conftest import free_port_pair, serve_process, stop_process
from test_cli_errors import assert_one_line_error
from test_cli_info import kv_bytes_per_token, expected_info

from zinfer_client import Client  # conftest puts clients/python on the path

SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"
SLOTS, CTX, BLOCK = 8, 4096, 16


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no MemAvailable in /proc/meminfo")


@pytest.mark.skipif(SANITIZED, reason="a 4,096-token prefill takes minutes under the "
                    "sanitizers; the budget's sums run there in test_mem_plan, the start-up "
                    "errors below")
def test_default_budget_serves_the_whole_context(zinfer_bin, model_path, tmp_path):
    """No memory flag: the KV cache holds 8 x 4096 positions and a request
    of 4,000 prompt tokens + 96 generated ones (the whole context) ends
    with all 96 tokens."""
    with serve_process(zinfer_bin, model_path, tmp_path / "serve.log") as srv:
        log = srv.log()
        blocks = SLOTS * CTX // BLOCK
        assert (f"KV cache: {blocks} blocks x {BLOCK} tokens = {SLOTS * CTX} tokens" in log), log
        assert f"{SLOTS} slots x {CTX} positions: the default budget" in log, log
        assert "reduced to" not in log, log
        n_prompt, n_new = 4000, CTX - 4000
        prompt = [1] + [(200 + 37 * k) % 40000 + 100 for k in range(n_prompt - 1)]
        with Client(srv.addr, timeout_s=600) as c:
            assert c.call("health")["kv"]["blocks"] in (0, blocks)
            _, ids, fin = c.complete(prompt=prompt, sampling_params={
                "max_new_tokens": n_new, "ignore_eos": True, "temperature": 0})
        assert fin["status"] == "maximum_length", fin
        assert len(ids) == n_new == fin["usage"]["completion_tokens"]
        assert fin["usage"]["prompt_tokens"] == n_prompt
        assert "preempted" not in srv.log()


def test_serve_refuses_a_configuration_that_does_not_fit(run_zinfer, model_path):
    """1024 slots x the model's whole trained context: serve stops before
    starting anything, one line with the weights, the KV cache per token,
    what is needed and what is available, and the flags to change."""
    exp = expected_info(model_path)
    per_tok = kv_bytes_per_token(exp["reader"], "llama")
    ctx = exp["context_length"]
    slots = 1024
    if slots * ctx * per_tok < mem_available() * 0.9:
        pytest.skip("this machine has the memory for it")
    port, backend = free_port_pair()
    start = time.time()
    res = run_zinfer("serve", "--model", model_path, "--bind", f"tcp://127.0.0.1:{port}",
                     "--backend", f"tcp://127.0.0.1:{backend}", "--http", "off",
                     "--slots", slots, "--ctx-size", 1 << 20, timeout=60)
    assert time.time() - start < 10
    line = assert_one_line_error(
        res, re.escape(f"--model {model_path}: the model and its KV cache do not fit in memory"),
        re.escape(f"weights {exp['tensor_bytes'] / 1048576:.1f} MiB"),
        re.escape(f"KV cache {per_tok} bytes per token x {slots} slots x {ctx} positions"),
        r"needed \d+\.\d MiB, available \d+\.\d MiB \(90% of MemAvailable \d+\.\d MiB\)",
        r"--ctx-size or --slots", r"--kv-cache-tokens N or --memory-budget B")
    assert res.returncode == 1
    assert "started" not in res.stderr
    # Workers add up.
    res = run_zinfer("serve", "--model", model_path, "--bind", f"tcp://127.0.0.1:{port}",
                     "--backend", f"tcp://127.0.0.1:{backend}", "--http", "off",
                     "--slots", slots, "--workers", 64, timeout=60)
    assert_one_line_error(res, r"x 64 workers = \d+\.\d MiB", r"--workers")


def test_worker_refuses_a_configuration_that_does_not_fit(zinfer_bin, model_path):
    """zinfer-worker by hand: the same numbers, status 78 (a configuration
    error, which serve does not restart)."""
    exp = expected_info(model_path)
    per_tok = kv_bytes_per_token(exp["reader"], "llama")
    ctx = exp["context_length"]
    if 1024 * ctx * per_tok < mem_available() * 0.9:
        pytest.skip("this machine has the memory for it")
    port, backend = free_port_pair()
    res = subprocess.run([str(zinfer_bin.parent / "zinfer-worker"), "--model", str(model_path),
                          "--router", f"tcp://127.0.0.1:{backend}", "--threads", "1",
                          "--slots", "1024", "--ctx-size", str(ctx)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 78, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "the model and its KV cache do not fit in memory" in lines[0]
    assert f"KV cache {per_tok} bytes per token x 1024 slots x {ctx} positions" in lines[0]
    assert re.search(r"needed \d+\.\d MiB, available \d+\.\d MiB", lines[0]), lines[0]


def run_serve(zinfer_bin, model, log_path, *args, timeout=90):
    """Runs `zinfer serve` to its end (it must stop by itself): (exit
    status, its output)."""
    port, backend = free_port_pair()
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(
            [str(zinfer_bin), "serve", "--model", str(model), "--bind",
             f"tcp://127.0.0.1:{port}", "--backend", f"tcp://127.0.0.1:{backend}",
             "--http", "off", *[str(a) for a in args]],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process(proc)
            pytest.fail(f"zinfer serve did not stop by itself:\n{open(log_path).read()}")
    return rc, open(log_path, errors="replace").read()


def test_worker_start_error_stops_serve_once(zinfer_bin, model_path, tmp_path):
    """--memory-budget 40M cannot hold the weights, let alone a KV block:
    the worker reports it, serve stops with status 1 and the error as its
    last line, once; the worker was started once, never restarted."""
    start = time.time()
    rc, log = run_serve(zinfer_bin, model_path, tmp_path / "serve.log", "--memory-budget", "40M")
    assert rc == 1, log
    assert time.time() - start < 60, log
    lines = log.strip().splitlines()
    want = "worker 0 cannot start: a 40.0 MiB --memory-budget leaves no room for a KV block"
    assert want in lines[-1], log
    assert re.search(r"the weights take \d+\.\d MiB and the working buffers \d+\.\d MiB, the KV "
                     r"cache \d+ bytes per token; 8 slots x 4096 positions need a budget of "
                     r"\d+\.\d MiB\. Give a larger --memory-budget", lines[-1]), lines[-1]
    assert log.count("leaves no room for a KV block") == 1, log
    assert log.count("started worker 0") == 1, log
    assert "restarting in" not in log, log
    assert re.search(r"worker 0 \(pid \d+\) cannot start with this configuration \(exit status "
                     r"78\); stopping the server instead of restarting it", log), log


def test_bad_model_file_stops_serve_once(zinfer_bin, model_path, tmp_path):
    """A truncated model: the tokenizer and the worker cannot load it; serve
    stops with status 1 at their first failure, its last line naming the
    file, with no restart."""
    bad = tmp_path / "half.gguf"
    bad.write_bytes(model_path.read_bytes()[:50 * 1000 * 1000])
    rc, log = run_serve(zinfer_bin, bad, tmp_path / "serve.log")
    assert rc == 1, log
    last = log.strip().splitlines()[-1]
    assert re.search(r"(worker|tokenizer) 0 cannot start: .*half\.gguf", last), log
    assert "restarting in" not in log, log
    assert log.count("started worker 0") == 1 and log.count("started tokenizer 0") == 1, log


def test_info_is_what_the_worker_takes(run_zinfer, zinfer_bin, tmp_path):
    """On a Q4_K_M file (whose K-quant matrices the CPU backend repacks
    into a larger layout), the budget `zinfer info` computes from the
    header is the one the worker logs after loading the weights."""
    import quant_models  # scripts/ref, on the path (conftest)
    path = quant_models.path_for("Q4_K_M")
    if not os.path.isfile(path):
        pytest.skip(f"{path} absent (made by scripts/setup --with-llamacpp)")
    res = run_zinfer("info", "--model", path, "--json")
    assert res.returncode == 0, res.stderr
    mem = json.loads(res.stdout)["memory"]
    assert mem["weights_held_bytes"] > mem["weights_bytes"]
    with serve_process(zinfer_bin, path, tmp_path / "serve.log") as srv:
        log = srv.log()
    m = re.search(r"8 slots x 4096 positions: the default budget, (\d+) MiB with the weights", log)
    assert m, log
    # The header counts the norms' vectors too, which the model does not
    # count as weights: a fraction of a MiB.
    assert abs(int(m.group(1)) - mem["total_bytes"] / 1048576) < 1.0, (m.group(0), mem)


def test_help_documents_the_default_budget(run_zinfer, zinfer_bin):
    serve = run_zinfer("serve", "--help").stdout
    worker = subprocess.run([str(zinfer_bin.parent / "zinfer-worker"), "--help"],
                            capture_output=True, text=True, timeout=30).stdout
    for text in (serve, worker):
        flat = " ".join(text.split())
        assert "--memory-budget" in flat
        assert "90% of MemAvailable" in flat, text
        assert re.search(r"--slots x --ctx-size", flat), text
