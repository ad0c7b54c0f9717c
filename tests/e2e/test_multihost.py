"""Workers on other hosts (docs/deploy.md): three network namespaces stand
in for three machines, joined by veth links, and every backend joins the
router over TCP with CURVE keys made by `zinfer keygen`.

- Namespace A ("the router host"): zinfer-router (backend socket on
  tcp://0.0.0.0:5556, CURVE, --backend-keys listing the three backends)
  and one zinfer-tokenizer (over A's loopback). B and C ("worker hosts"):
  one zinfer-worker each, `ip netns exec B zinfer-worker --router
  tcp://10.213.N.1:5556 --curve-secret ... --router-key router.pub`. A
  reaches B over one veth link (10.213.N.0/24) and C over another
  (10.213.N+1.0/24).
- The test process talks to the router's client socket over ipc:// (a
  file path, which every namespace sees), so nothing is added to the
  host's own network and no address outside the test's namespaces is
  ever contacted.
- 8 streams of 48 tokens (greedy and seeded sampling, ignore_eos) on both
  workers give the reference ids; the same 8 again, and once every stream
  has a token B is cut off: the router declares B dead after
  --heartbeat-timeout and B's streams resume on C, each with the
  reference ids, no duplicate and no gap. Then B's network comes back: B
  registers again (health counts 2 workers) within a bound, once (not
  once per message it had queued), and serves a third round of the same
  streams, again with the reference ids.
- Two ways to cut B off: its link down (`ip link set eth0 down` in B;
  --heartbeat-timeout 1500 declares it dead), and silently (A stops
  answering B for 14 s, as behind a dead switch; --heartbeat-timeout
  30000, so the router's ZMTP heartbeats must close B's connection after
  5 s). Without ZMTP heartbeats on the backends' connections the silent
  cut left B waiting on TCP's retransmission backoff after the network
  came back, and the router waiting for --heartbeat-timeout
  (protocol/wire.h).

Release builds only (three runs of 8 streams, and a bound on time).
Skipped where namespaces cannot be made (not root, no `ip`, EPERM). The
namespaces (and with them the veth links) are deleted at the end, failed
or not; their names are unique to the run.
"""

import os
import secrets
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import stop_process
from zinfer_client import Client, ZinferError, decode_array

SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"

MAX_NEW = 48
N = 8
PORT = 5556  # each run has fresh namespaces: no other listener there


def prompt(i):
    """~96 token ids, different for each request."""
    return [1] + [(1000 + 37 * i + 13 * k) % 40000 + 200 for k in range(95)]


def sampling(i):
    """Greedy, or seeded sampling (the same ids on any worker)."""
    sp = {"max_new_tokens": MAX_NEW, "ignore_eos": True, "temperature": 0.0}
    if i % 2:
        sp.update(temperature=0.9, top_k=40, top_p=0.95, seed=500 + i)
    return sp


def ip(*args, check=True):
    r = subprocess.run(["ip", *map(str, args)], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(map(str, args))}: {r.stderr.strip()}")
    return r


class Hosts:
    """Namespaces A, B, C; veth A<->B and A<->C. names[h] is h's namespace;
    addr[h] is h's address; router_ip[h] the router's address as h sees
    it. The peer device is eth0 in B and C."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.names = {h: f"zmh{tag}{h.lower()}" for h in "ABC"}
        self.made = []
        n = 16 + secrets.randbelow(100) * 2  # 10.213.n.0/24 and 10.213.n+1.0/24
        self.router_ip = {"B": f"10.213.{n}.1", "C": f"10.213.{n + 1}.1"}
        self.addr = {"B": f"10.213.{n}.2", "C": f"10.213.{n + 1}.2"}

    def up(self):
        for h in "ABC":
            ip("netns", "add", self.names[h])
            self.made.append(self.names[h])
            ip("-n", self.names[h], "link", "set", "lo", "up")
        a = self.names["A"]
        for h in "BC":
            # Made inside A, the peer moved straight into h: no device ever
            # exists in the host's own namespace.
            dev = f"v{h.lower()}"
            ip("-n", a, "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns",
               self.names[h])
            ip("-n", a, "addr", "add", f"{self.router_ip[h]}/24", "dev", dev)
            ip("-n", a, "link", "set", dev, "up")
            ip("-n", self.names[h], "addr", "add", f"{self.addr[h]}/24", "dev", "eth0")
            ip("-n", self.names[h], "link", "set", "eth0", "up")

    def link(self, h, state):
        ip("-n", self.names[h], "link", "set", "eth0", state)

    def exec(self, h):
        return ["ip", "netns", "exec", self.names[h]]

    def down(self):
        # Deleting a namespace deletes its veth ends, and with them their
        # peers.
        for name in reversed(self.made):
            ip("netns", "del", name, check=False)


@pytest.fixture
def hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip"):
        pytest.skip("no `ip` (iproute2) to make network namespaces")
    h = Hosts()
    try:
        try:
            h.up()
        except RuntimeError as e:
            pytest.skip(f"cannot make network namespaces and veth links: {e}")
        yield h
    finally:
        h.down()


def keygen(zinfer_bin, out):
    r = subprocess.run([str(zinfer_bin), "keygen", str(out)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr


class Cluster:
    """The router and tokenizer in A, a worker in B and in C, all with
    their own CURVE keys; the client socket on ipc:// in a short temporary
    directory (a socket path is at most ~107 bytes)."""

    def __init__(self, hosts, zinfer_bin, model_path):
        self.hosts, self.bin, self.model = hosts, zinfer_bin.parent, model_path
        self.dir = tempfile.mkdtemp(prefix="zmh")
        self.keys = os.path.join(self.dir, "keys")
        os.mkdir(self.keys, 0o700)
        for name in ("router", "tok", "wb", "wc"):
            keygen(zinfer_bin, os.path.join(self.keys, name))
        with open(os.path.join(self.keys, "backend-keys"), "w") as f:
            for name in ("tok", "wb", "wc"):
                f.write(open(os.path.join(self.keys, name + ".pub")).read())
        self.addr = f"ipc://{self.dir}/client.ipc"
        self.procs = {}
        self.logs = {}

    def key(self, name):
        return os.path.join(self.keys, name)

    def spawn(self, name, host, role, args):
        self.logs[name] = os.path.join(self.dir, name + ".log")
        self.procs[name] = subprocess.Popen(
            [*self.hosts.exec(host), str(self.bin / f"zinfer-{role}"), *map(str, args)],
            stdout=open(self.logs[name], "w"), stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, hb_timeout_ms):
        back = f"tcp://127.0.0.1:{PORT}"  # the tokenizer shares the router's host
        self.spawn("router", "A", "router",
                   ["--bind", self.addr, "--backend", f"tcp://0.0.0.0:{PORT}",
                    "--curve-secret", self.key("router.key"),
                    "--backend-keys", self.key("backend-keys"),
                    "--heartbeat-timeout", hb_timeout_ms, "--failover-timeout", 20000])
        self.spawn("tokenizer", "A", "tokenizer",
                   ["--router", back, "--model", self.model, "--curve-secret",
                    self.key("tok.key"), "--router-key", self.key("router.pub")])
        for h in "BC":
            self.spawn(f"worker{h}", h, "worker",
                       ["--router", f"tcp://{self.hosts.router_ip[h]}:{PORT}",
                        "--model", self.model, "--threads", 1, "--slots", N,
                        "--ctx-size", 256, "--log-level", "debug",
                        "--curve-secret", self.key(f"w{h.lower()}.key"),
                        "--router-key", self.key("router.pub")])

    def log(self, name):
        try:
            return open(self.logs[name], errors="replace").read()
        except OSError:
            return ""

    def wait_health(self, workers, timeout):
        deadline = time.time() + timeout
        h = None
        with Client(self.addr, timeout_s=2) as c:
            while time.time() < deadline:
                for name, p in self.procs.items():
                    assert p.poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
                try:
                    h = c.call("health")
                    if h["workers"] == workers and h["tokenizers"] == 1:
                        return h
                except (TimeoutError, ZinferError):
                    pass
                time.sleep(0.1)
        pytest.fail(f"health never showed {workers} workers (last {h}); router log:\n"
                    f"{self.log('router')[-3000:]}")

    def close(self):
        for p in reversed(list(self.procs.values())):
            stop_process(p)
        shutil.rmtree(self.dir, ignore_errors=True)


def run_streams(addr, on_streaming=None, timeout=60):
    """The N streams at once; on_streaming() once every one has streamed a
    token. Returns [(ids, resumed notes, terminal frame)] in order."""
    with Client(addr, timeout_s=timeout) as c:
        rids = [c.send({"op": "generate", "prompt": prompt(i), "sampling_params": sampling(i)})
                for i in range(N)]
        ids = {r: [] for r in rids}
        notes = {r: 0 for r in rids}
        term = {}
        fired = on_streaming is None
        deadline = time.time() + timeout
        while len(term) < N:
            assert time.time() < deadline, f"{N - len(term)} streams never ended"
            m = c._recv_one()
            rid = m["id"]
            assert rid in ids and rid not in term, f"frame after the end: {m}"
            if m["event"] == "chunk":
                ids[rid].extend(int(t) for t in decode_array(m["token_ids"]))
                notes[rid] += bool(m.get("resumed"))
            else:
                term[rid] = m
            if not fired and all(ids.values()):
                fired = True
                on_streaming()
        assert c.sock.poll(300) == 0  # exactly one terminal frame each
    return [(ids[r], notes[r], term[r]) for r in rids]


def check_same(got, ref, what):
    for i, ((ids, notes, fin), want) in enumerate(zip(got, ref)):
        assert fin["event"] == "final" and fin["status"] == "maximum_length", (what, i, fin)
        # no duplicate, no gap: what streamed is what was generated
        assert len(ids) == fin["usage"]["completion_tokens"] == MAX_NEW, (what, i, fin)
        assert ids == want, f"{what}: request {i} ({sampling(i)}) differs from the reference"
        assert notes <= 1, (what, i, notes)


# How B goes away. "link": B's own link goes down (`ip link set eth0
# down` in B): B's sends fail at once; the router's --heartbeat-timeout
# (1.5 s) declares B dead. "silent": A stops answering B (the router's
# address on A's side is removed), as behind a dead switch: B's packets
# vanish without an error and TCP backs off its retransmissions. That
# outage lasts SILENT_S from the cut, after which a backend without ZMTP
# heartbeats waited ~11 s more for TCP's next retry (protocol/wire.h);
# and with a --heartbeat-timeout of 30 s, the router's ZMTP heartbeats
# close B's silent connection after 5 s, which declares it dead.
SILENT_S = 14
HB_TIMEOUT_MS = {"link": 1500, "silent": 30000}
DEAD_BY = {"link": "missed heartbeats for 1500 ms: declared dead",
           "silent": "its connection closed: declared dead"}
BACK_WITHIN_S = 8


@pytest.mark.skipif(SANITIZED, reason="slow under the sanitizers, and it bounds a time")
@pytest.mark.parametrize("cut", ["link", "silent"])
def test_workers_on_other_hosts_fail_over_and_return(hosts, zinfer_bin, model_path, cut):
    cl = Cluster(hosts, zinfer_bin, model_path)
    a, rip_b = hosts.names["A"], hosts.router_ip["B"]
    try:
        cl.start(HB_TIMEOUT_MS[cut])
        cl.wait_health(2, 60)
        router_log = cl.log("router")
        assert f"backends on tcp://0.0.0.0:{PORT} (CURVE, listed keys only)" in router_log
        assert router_log.count("registered") == 3, router_log

        clean = run_streams(cl.addr)
        ref = [ids for ids, _, _ in clean]
        check_same(clean, ref, "the reference run")
        assert all("prompt tokens, max length" in cl.log(w) for w in ("workerB", "workerC"))

        t_cut = []

        def cut_b():
            if cut == "link":
                hosts.link("B", "down")
            else:
                ip("-n", a, "addr", "del", f"{rip_b}/24", "dev", "vb")
            t_cut.append(time.time())
        faulted = run_streams(cl.addr, on_streaming=cut_b)
        check_same(faulted, ref, f"with B cut off ({cut})")
        assert sum(n for _, n, _ in faulted) > 0, "no stream was on B"
        log = cl.log("router")
        assert DEAD_BY[cut] in log and "resuming" in log, log[-3000:]
        if cut == "silent":  # by the router's ZMTP heartbeats, not at 30 s
            assert time.time() - t_cut[0] < 20
        with Client(cl.addr, timeout_s=5) as c:
            assert c.call("health")["workers"] == 1

        if cut == "silent":
            time.sleep(max(0.0, t_cut[0] + SILENT_S - time.time()))
        b_log_len = len(cl.log("workerB"))
        n_reg = cl.log("router").count("registered")
        if cut == "link":
            hosts.link("B", "up")
        else:
            ip("-n", a, "addr", "add", f"{rip_b}/24", "dev", "vb")
        t_back = time.time()
        cl.wait_health(2, 60)
        back_s = time.time() - t_back
        assert back_s < BACK_WITHIN_S, \
            f"B registered again {back_s:.1f} s after the network came back"
        again = run_streams(cl.addr)
        check_same(again, ref, "after B came back")
        b_log = cl.log("workerB")[b_log_len:]
        started = b_log.count("prompt tokens, max length")
        assert started > 0, "B registered again but served nothing:\n" + b_log[-3000:]
        # Asked to register once, not once per message it had queued.
        assert b_log.count("router asks to register again") <= 2, b_log[-3000:]
        assert cl.log("router").count("registered") - n_reg <= 2
        print(f"{cut}: B out {t_back - t_cut[0]:.1f} s, registered again {back_s:.1f} s after "
              f"the network came back, then ran {started} of {N} streams")
    finally:
        cl.close()
