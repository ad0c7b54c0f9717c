"""Shared fixtures for zinfer's end-to-end tests.

These tests drive the real zinfer binary on the real model and compare it
with committed llama.cpp fixtures (tests/fixtures/, made by
scripts/ref/make_fixtures.py) and with the float64 numpy reference
(scripts/ref/numpy_llama.py), computed live and cached for the session.

Run from the repo root with the venv python:
    ~/.cache/zinfer/venv/bin/python -m pytest tests/e2e
Environment: ZINFER_BIN (default build/zinfer), ZINFER_MODEL (default
$ZINFER_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf), ZINFER_E2E_REPORT
(default build/e2e-report.json: the numbers the tests measured).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
sys.path.insert(0, str(REPO / "scripts" / "ref"))
sys.path.insert(0, str(REPO / "clients" / "python"))
import numpy as np  # noqa: E402
import numpy_llama  # noqa: E402
import refcache  # noqa: E402

# The float64 references allocate and free arrays of hundreds of MB in turn.
# glibc raises its mmap threshold to the size of each large block freed, so
# later ones come from the heap and stay resident after they are freed (this
# process grew past 4 GB of dead references in one run). A fixed threshold
# keeps large arrays mapped, returned to the system when freed. This
# process only: the zinfer processes the tests start keep glibc's default.
try:
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
except (OSError, AttributeError):
    pass
from zinfer_client import Client, ZinferError  # noqa: E402

ZINFER_BIN = Path(os.environ.get("ZINFER_BIN", REPO / "build" / "zinfer"))
ZINFER_MODEL = Path(os.environ.get("ZINFER_MODEL", numpy_llama.DEFAULT_MODEL))
REPORT = Path(os.environ.get("ZINFER_E2E_REPORT", REPO / "build" / "e2e-report.json"))

# Numbers the tests measured, written to REPORT when the session ends.
_report = {}


def report(section, key, value):
    """Records a measured number (or dict) under report[section][key]."""
    _report.setdefault(section, {})[key] = value


# ZINFER_E2E_PROGRESS names a file that gets one line as each test starts
# ("start NODEID") and one for each failure ("FAILED NODEID"), written and
# flushed at once: if the pytest process itself dies (the OOM killer, a
# signal), scripts/run_tests.py still names the test that was running and
# the ones that had failed, which pytest's own summary would have said.
_PROGRESS = os.environ.get("ZINFER_E2E_PROGRESS")


def _progress(line):
    if _PROGRESS:
        with open(_PROGRESS, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _rss_gb():
    """This process's resident memory in GB (Linux), or 0."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError):
        return 0.0


_T0 = time.time()


def pytest_runtest_logstart(nodeid, location):
    _progress(f"start {nodeid} (at {time.time() - _T0:.1f} s, pytest rss {_rss_gb():.2f} GB)")


def pytest_runtest_logreport(report):
    if report.failed:
        _progress(f"FAILED {report.nodeid} ({report.when})")


def pytest_configure(config):
    config.addinivalue_line("markers", "no_zinfer: runs no zinfer binary (references, llama.cpp, "
                            "the repository's files); skipped under ZINFER_SANITIZED=1")


def pytest_collection_modifyitems(config, items):
    """Under the sanitizers a test that runs no zinfer binary would repeat
    the release pass exactly: it skips."""
    if os.environ.get("ZINFER_SANITIZED") != "1":
        return
    skip = pytest.mark.skip(reason="runs no zinfer binary: the same in the release pass")
    for item in items:
        if item.get_closest_marker("no_zinfer"):
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _free_module_caches(request):
    """After a test module, empties its module-level caches (dicts named
    like _BUILT, _REF, _SEEN: built files' float64 reference models and
    logits, kept between that module's tests). Left alone they live as
    long as the process, and one run held 7 GB of them by half-way."""
    yield
    for name, value in vars(request.module).items():
        if name.startswith("_") and name[1:].isupper() and isinstance(value, dict):
            value.clear()


def pytest_sessionfinish(session, exitstatus):
    if not _report:
        return
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    old = {}
    if REPORT.exists():
        try:
            old = json.loads(REPORT.read_text())
        except ValueError:
            old = {}
    old.update(_report)  # sections not run this time keep their last numbers
    REPORT.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")


def run_zinfer_lines(zinfer_bin, model, args, lines, timeout=300):
    """Runs `zinfer ARGS --model MODEL` with LINES on stdin (one per line) and
    returns its stdout lines parsed as JSON: one per input line (tokenize,
    detokenize)."""
    res = subprocess.run([str(zinfer_bin)] + list(args) + ["--model", str(model)],
                         input="".join(line + "\n" for line in lines).encode("utf-8"),
                         capture_output=True, timeout=timeout)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, f"zinfer {' '.join(args)} exited {res.returncode}: {err}"
    out = res.stdout.decode("utf-8").splitlines()
    assert len(out) == len(lines), f"{len(lines)} lines in, {len(out)} out; stderr: {err}"
    return [json.loads(o) for o in out]


@pytest.fixture(scope="session")
def repo_root():
    return REPO


@pytest.fixture(scope="session")
def zinfer_bin():
    if not (ZINFER_BIN.is_file() and os.access(ZINFER_BIN, os.X_OK)):
        pytest.fail(f"zinfer binary not found at {ZINFER_BIN} (build it, or set ZINFER_BIN)")
    return ZINFER_BIN


@pytest.fixture(scope="session")
def model_path():
    if not ZINFER_MODEL.is_file():
        pytest.fail(f"model not found at {ZINFER_MODEL} (run scripts/setup, or set ZINFER_MODEL)")
    return ZINFER_MODEL


def _run(binary, args, timeout=120):
    return subprocess.run([str(binary)] + [str(a) for a in args], capture_output=True,
                          text=True, errors="replace", timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def run_zinfer(zinfer_bin):
    """run_zinfer(*args, timeout=120) -> CompletedProcess (text stdout/stderr)."""

    def run(*args, timeout=120):
        return _run(zinfer_bin, args, timeout)

    return run


def run_each(run, arg_lists, one_thread=True):
    """run(*args) of each argument list, two processes at a time (CI has
    two cores), with --threads 1 unless one_thread is False: the default
    model's step gains little from a second thread, so independent CLI runs
    (a prompt each) finish in about half the time side by side. Returns
    the CompletedProcesses in order."""
    from concurrent.futures import ThreadPoolExecutor
    extra = ("--threads", "1") if one_thread else ()
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda a: run(*a, *extra), arg_lists))


def logits_each(run_zinfer, path, ps, outs, *extra, timeout=300):
    """`zinfer logits --model path` of each prompt (token ids) of ps, into
    the files outs, two runs at a time (run_each): each one's float32
    logits as a (rows, n_vocab) array, in order."""
    runs = run_each(lambda *a: run_zinfer(*a, timeout=timeout),
                    [("logits", "--model", path, "--prompt-ids", ids_arg(ids), "--out", out,
                      *extra) for ids, out in zip(ps, outs)])
    got = []
    for ids, out, res in zip(ps, outs, runs):
        assert res.returncode == 0, f"zinfer logits failed: {res.stderr.strip()}"
        info = last_json(res.stdout)
        assert info["n_tokens"] == len(ids)
        assert "--last" in extra or info["rows_written"] == len(ids)
        raw = np.fromfile(out, dtype="<f4")
        assert raw.size == info["rows_written"] * info["n_vocab"]
        got.append(raw.reshape(info["rows_written"], -1))
    return got


def free_port_pair():
    """Two consecutive free TCP ports on 127.0.0.1 (client, backend)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p >= 65534:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", p + 1))
            return p, p + 1
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def stop_process(proc):
    """SIGTERM, then after 10 s SIGKILL of proc's whole process group (the
    processes here are started with start_new_session=True)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:  # a supervisor that died: take its children with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ServeProcess:
    """A `zinfer serve` started by serve_process(): .addr, .log()."""

    def __init__(self, proc, addr, log_path):
        self.proc, self.addr, self.log_path = proc, addr, log_path

    def log(self):
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""


def free_port():
    """A free TCP port on 127.0.0.1 (for zinfer-http's --http)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port, srv, timeout_s=30):
    """Waits until zinfer-http on port answers GET /health with 200 (no API
    key needed); fails with srv's log when it does not in time."""
    import http.client
    deadline = time.time() + timeout_s
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return
        except OSError:
            pass
        assert time.time() < deadline, srv.log()
        time.sleep(0.05)  # a pass starts servers by the hundred: each waits ~0.1 s less


@contextlib.contextmanager
def serve_process(zinfer_bin, model_path, log_path, *args, workers=1):
    """Starts `zinfer serve` on a free port pair with the extra args, waits
    until `health` reports every worker, yields a ServeProcess, and always
    stops it (SIGTERM, then SIGKILL of its process group)."""
    port, bport = free_port_pair()
    addr = f"tcp://127.0.0.1:{port}"
    logf = open(log_path, "w")
    proc = subprocess.Popen(
        [str(zinfer_bin), "serve", "--model", str(model_path), "--bind", addr,
         "--backend", f"tcp://127.0.0.1:{bport}", "--workers", str(workers), "--tokenizers", "1",
         # no HTTP front end unless asked: servers of parallel tests would share port 8080
         *([] if "--http" in args else ["--http", "off"]),
         *[str(a) for a in args]],
        stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    srv = ServeProcess(proc, addr, log_path)
    try:
        with Client(addr, timeout_s=5) as c:
            deadline = time.time() + 60
            while True:
                try:
                    h = c.call("health")
                    if h.get("status") == "ok" and h.get("workers") == workers:
                        break
                except (TimeoutError, ZinferError):
                    pass
                assert proc.poll() is None and time.time() < deadline, srv.log()
                time.sleep(0.05)  # as wait_http: every test server starts here
        yield srv
    finally:
        stop_process(proc)
        logf.close()


def run_all(client, prompts, sp):
    """Sends every prompt at once on one socket; returns each one's token
    ids, in order (every event a chunk or the final)."""
    rids = [client.send({"op": "generate", "prompt": p, "sampling_params": sp}) for p in prompts]
    out = []
    for rid in rids:
        ids = []
        for ev in client.events(rid):
            assert ev["event"] in ("chunk", "final"), ev
            ids.extend(ev.get("token_ids", []))
        out.append(ids)
    return out


def kv_when(client, pred, timeout_s=15):
    """The health reply's KV counters once pred(kv) holds, or as they stand
    after timeout_s. The counters ride the workers' heartbeats, which a busy
    worker sends late: a fixed sleep made the tests that read them flaky on
    a loaded machine."""
    end = time.time() + timeout_s
    while True:
        kv = client.call("health")["kv"]
        if pred(kv) or time.time() > end:
            return kv
        time.sleep(0.1)


def last_json(stdout):
    """The JSON object on the last non-empty line of stdout."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert lines, "no output on stdout"
    return json.loads(lines[-1])


def ids_arg(ids):
    return ",".join(str(int(t)) for t in ids)


def llamacpp_logits(path, prompts, **kw):
    """llama.cpp's logits of each prompt (token ids) on the model file at
    path, as float64 arrays [len(ids), n_vocab]: llama-cpp-python's
    Llama(path, logits_all=True, verbose=False, **kw), reset and eval per
    prompt. Kept in refcache (scripts/ref/refcache.py) by llama_cpp's
    version, the files' sha256 (path's and any *_path option's, a LoRA
    adapter), the other options and the ids: they give the same numbers
    every run, so the tests comparing zinfer with llama.cpp compute them
    once. Skips the test where llama_cpp is not installed."""
    llama_cpp = pytest.importorskip("llama_cpp")
    prompts = [[int(t) for t in ids] for ids in prompts]

    def compute():
        llm = llama_cpp.Llama(model_path=str(path), logits_all=True, verbose=False, **kw)
        out = []
        for ids in prompts:
            llm.reset()
            llm.eval(ids)
            out.append(np.array(llm.scores[: len(ids)], dtype=np.float32))  # its own type
        return tuple(out)

    opts = {k: "file:" + refcache.file_sha256(v) if k.endswith("_path") else v
            for k, v in kw.items()}
    got = refcache.cached("llama.cpp logits", (llama_cpp.__version__, refcache.file_sha256(path),
                                               opts, prompts), compute)
    return [np.asarray(a, dtype=np.float64) for a in got]


def load_fixture(name):
    with open(FIXTURES / name, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def prompts():
    """name -> {"name", "text", "ids"} from tests/fixtures/prompts.json."""
    return {p["name"]: p for p in load_fixture("prompts.json")["prompts"]}


@pytest.fixture(scope="session")
def reference(model_path):
    """ref(ids) -> float64 logits [n, vocab] from the numpy reference, cached."""
    model = numpy_llama.load(str(model_path))
    cache = {}

    def ref(ids):
        key = tuple(int(t) for t in ids)
        if key not in cache:
            cache[key] = numpy_llama.logits(model, list(key))
        return cache[key]

    ref.n_vocab = model.n_vocab
    return ref
