"""The prefix cache's disk tier (--kv-disk; docs/engine.md, "The disk tier"),
through `zinfer serve` with the real model.

- Warm restart: a prompt served (its full blocks written in the
  background), the worker killed with SIGKILL and restarted by serve's
  supervisor; the same prompt is then served from disk (every eligible
  block a disk hit, none from memory) with the same tokens as the cold run.
- Failover: two workers on one directory both killed while a request
  streams; it resumes on a restarted worker from disk, with the no-fault
  stream. The router logs that the two share the tier (their registers'
  sharing id, from the directory's id file).
- Faults: the files bit-flipped and truncated: the next serve's requests
  get the cold run's tokens, the bad files are counted as rejected and each
  kind of problem is logged once; a directory that cannot be written gives
  the same tokens too, with the problem logged once.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import kv_when, serve_process
from test_server_load import children

from zinfer_client import Client

BS = 16
# ~200 ids: 12 full blocks a lookup may take (the last token is always fed)
PROMPT = [1] + [(900 + 53 * k) % 30000 + 300 for k in range(199)]
ELIGIBLE = (len(PROMPT) - 1) // BS
SP = {"max_new_tokens": 8, "temperature": 0}


def args(kv_dir, *more):
    return ["--threads-per-worker", 2, "--slots", 2, "--ctx-size", 512, "--kv-disk", kv_dir,
            *more]


def run(addr):
    with Client(addr, timeout_s=60) as c:
        ids = []
        for ev in c.generate(prompt=PROMPT, sampling_params=SP):
            assert ev["event"] in ("chunk", "final"), ev
            ids.extend(ev.get("token_ids", []))
        return ids


def kv(addr, pred=lambda k: True):
    with Client(addr, timeout_s=10) as c:
        return kv_when(c, pred)


def block_files(d):
    return sorted(p for p in os.listdir(d) if p.startswith("zkv-") and p.endswith(".blk"))


@pytest.fixture(scope="module")
def cold(zinfer_bin, model_path, tmp_path_factory):
    """A first serve on an empty directory: the cold run's tokens, and the
    directory its blocks were written to."""
    tmp = tmp_path_factory.mktemp("kvdisk")
    d = tmp / "kv"
    with serve_process(zinfer_bin, model_path, tmp / "cold.log", *args(d)) as srv:
        ids = run(srv.addr)
        k = kv(srv.addr, lambda k: k["disk_written"] >= ELIGIBLE)
        assert k["disk_written"] >= ELIGIBLE, k
        assert k["disk_hit_blocks"] == 0 and k["disk_miss_blocks"] == 1, k
        assert k["disk_bytes"] > 0 and k["disk_write_us"] > 0, k
        assert "KV disk tier:" in srv.log()
        # the worker told the router which tier it reads (prefix affinity)
        assert f", disk tier {d} (" in srv.log(), srv.log()
    assert len(ids) == 8
    # the directory's id, which tells the router who shares it
    assert re.fullmatch(r"[0-9a-f]{16}\n", (d / "zinfer-kv-dir.id").read_text())
    assert len(block_files(d)) >= ELIGIBLE
    # zinfer info says what a block file takes (test_cli_info checks its formula)
    info = subprocess.run([str(zinfer_bin), "info", "--model", str(model_path), "--json"],
                          capture_output=True, text=True, timeout=60)
    file_bytes = json.loads(info.stdout)["memory"]["kv_disk"]["block_file_bytes"]
    assert {(d / f).stat().st_size for f in block_files(d)} == {file_bytes}
    shutil.copytree(d, tmp / "kv-clean")  # as written, for tests after the ones that spoil d
    return ids, d, tmp


def test_warm_restart_after_sigkill(zinfer_bin, model_path, cold):
    ids, d, tmp = cold
    with serve_process(zinfer_bin, model_path, tmp / "warm.log", *args(d)) as srv:
        # the new serve's worker finds the blocks: all from disk
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["disk_hit_blocks"] >= ELIGIBLE)
        assert k["disk_hit_blocks"] == ELIGIBLE and k["mem_hit_blocks"] == 0, k
        assert k["prefix_hit_tokens"] == ELIGIBLE * BS, k
        # again: now from memory
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["mem_hit_blocks"] >= ELIGIBLE)
        assert k["mem_hit_blocks"] == ELIGIBLE and k["disk_hit_blocks"] == ELIGIBLE, k
        # kill -9 the worker; serve's supervisor starts another
        old = children(srv).get("worker", [])
        assert len(old) == 1, children(srv)
        os.kill(old[0], signal.SIGKILL)
        deadline = time.time() + 60
        while True:
            now = children(srv).get("worker", [])
            if now and now != old:
                with Client(srv.addr, timeout_s=5) as c:
                    if c.call("health").get("workers") == 1:
                        break
            assert time.time() < deadline, srv.log()
            time.sleep(0.2)
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["disk_hit_blocks"] >= ELIGIBLE)
        # the restarted worker's own counters: every eligible block from disk
        assert k["disk_hit_blocks"] == ELIGIBLE and k["mem_hit_blocks"] == 0, k
        assert k["disk_rejected"] == 0 and k["disk_read_us"] > 0, k


def test_failover_resumes_from_disk(zinfer_bin, model_path, cold, tmp_path):
    """Two workers on one directory, both killed with SIGKILL while a
    request streams: the router resumes it on a restarted worker, whose
    prefix (the prompt's blocks, written by the killed one) comes from
    disk, and the stream is the no-fault one."""
    ids, _, _ = cold
    d = tmp_path / "kv"
    sp = {"max_new_tokens": 96, "temperature": 0, "ignore_eos": True}
    with serve_process(zinfer_bin, model_path, tmp_path / "failover.log",
                       *args(d, "--heartbeat-timeout", 1500, "--failover-timeout", 30000),
                       workers=2) as srv:
        got, notes = [], 0
        with Client(srv.addr, timeout_s=120) as c:
            killed = False
            for ev in c.generate(prompt=PROMPT, sampling_params=sp):
                assert ev["event"] in ("chunk", "final"), ev
                got.extend(ev.get("token_ids", []))
                notes += bool(ev.get("resumed"))
                if not killed and len(got) >= 4:
                    time.sleep(0.3)  # the prompt's blocks reach the disk
                    for pid in children(srv).get("worker", []):
                        os.kill(pid, signal.SIGKILL)
                    killed = True
        k = kv(srv.addr, lambda k: k["disk_hit_blocks"] >= ELIGIBLE)
        assert notes == 1, srv.log()
        assert k["disk_hit_blocks"] >= ELIGIBLE and k["disk_rejected"] == 0, k
        with Client(srv.addr, timeout_s=120) as c:  # the no-fault run, now from memory
            again = []
            for ev in c.generate(prompt=PROMPT, sampling_params=sp):
                again.extend(ev.get("token_ids", []))
        # the router saw the two workers share the tier
        assert "shared with 1 live workers" in srv.log(), srv.log()
    assert len(got) == 96 and got == again
    assert got[:8] == ids


def test_bad_files_are_ignored(zinfer_bin, model_path, cold):
    ids, d, tmp = cold
    files = block_files(d)
    assert len(files) >= 6
    for name in files[0::3]:  # a payload bit flipped
        p = d / name
        b = bytearray(p.read_bytes())
        b[-100] ^= 0x04
        p.write_bytes(bytes(b))
    for name in files[1::3]:  # truncated
        p = d / name
        os.truncate(p, p.stat().st_size // 2)
    with serve_process(zinfer_bin, model_path, tmp / "faults.log", *args(d)) as srv:
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["disk_rejected"] >= 1)
        assert k["disk_rejected"] >= 1, k
        # the prefix up to the first bad file came from disk at most
        assert k["disk_hit_blocks"] < ELIGIBLE, k
        # computed again, the bad blocks are rewritten: the next worker reads all
        assert run(srv.addr) == ids
        log = srv.log()
    for kind in ("corrupt", "truncated"):
        n = log.count(f"ignored {kind} file")
        assert n <= 1, log
    assert log.count("ignored corrupt file") + log.count("ignored truncated file") >= 1, log


def test_unwritable_directory(zinfer_bin, model_path, cold, tmp_path):
    ids, _, _ = cold
    (tmp_path / "file").write_text("not a directory")
    bad = tmp_path / "file" / "kv"  # can never be created, even by root
    with serve_process(zinfer_bin, model_path, tmp_path / "ro.log", *args(bad)) as srv:
        assert run(srv.addr) == ids
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["disk_dropped"] >= 1)
        assert k["disk_written"] == 0 and k["disk_dropped"] >= 1, k
        log = srv.log()
    assert log.count("cannot create the directory") == 1, log
    assert log.count("blocks are not kept on disk") == 1, log
    if os.geteuid() != 0:  # a read-only directory (root writes anyway)
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        with serve_process(zinfer_bin, model_path, tmp_path / "ro2.log", *args(ro)) as srv:
            assert run(srv.addr) == ids
            log = srv.log()
        assert log.count("blocks are not kept on disk") == 1, log


# ---- the directory full or read-only: a tmpfs in a private mount namespace ----

# 200 ids: the first 6 blocks PROMPT's, the rest new (blocks the tier must write)
PROMPT2 = PROMPT[:100] + [(700 + 37 * k) % 30000 + 300 for k in range(100)]


def mount_wrapper(tmp_path, zinfer_bin, setup):
    """A script that runs zinfer in a private mount namespace (unshare -m)
    after the shell commands `setup` (mounting a tmpfs on tmp_path/mnt):
    only that process tree sees the mount, and it goes with the process.
    Skips when this machine does not let a process mount (not root, no
    unshare, a container without CAP_SYS_ADMIN)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size=64k zinfer-probe {mnt}"],
        capture_output=True, text=True, timeout=30) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot mount a tmpfs in a private mount namespace: "
                    + (probe.stderr.strip() if probe else "no unshare"))
    script = tmp_path / "zinfer-in-ns"
    script.write_text(
        "#!/bin/sh\n"
        f"exec unshare -m --propagation private sh -c '{setup} && exec \"$0\" \"$@\"' "
        f"{zinfer_bin} \"$@\"\n")
    script.chmod(0o755)
    return script, mnt


@pytest.fixture(scope="module")
def cold2(zinfer_bin, model_path, tmp_path_factory):
    """PROMPT2's tokens without a disk tier."""
    tmp = tmp_path_factory.mktemp("kvdisk2")
    with serve_process(zinfer_bin, model_path, tmp / "cold2.log", "--threads-per-worker", 2,
                       "--ctx-size", 512) as srv:
        with Client(srv.addr, timeout_s=60) as c:
            _, ids, _ = c.complete(prompt=PROMPT2, sampling_params=SP)
    assert len(ids) == 8
    return ids


def run2(addr):
    with Client(addr, timeout_s=60) as c:
        return c.complete(prompt=PROMPT2, sampling_params=SP)[1]


def test_full_directory(zinfer_bin, model_path, cold, cold2, tmp_path):
    """A tier on a 1 MiB tmpfs: two block files (374,608 bytes each) fit,
    the third write fails with ENOSPC, and so does every one after it.
    Every request gets the cold run's tokens; the problem is logged once."""
    ids, _, _ = cold
    wrapper, mnt = mount_wrapper(tmp_path, zinfer_bin,
                                 f"mount -t tmpfs -o size=1m zinfer-kv {tmp_path / 'mnt'}")
    with serve_process(wrapper, model_path, tmp_path / "full.log", *args(mnt / "kv")) as srv:
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["disk_written"] + k["disk_dropped"] >= ELIGIBLE)
        assert k["disk_written"] == 2 and k["disk_dropped"] >= ELIGIBLE - 2, k
        assert run2(srv.addr) == cold2  # its new blocks cannot be written either
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["disk_dropped"] >= ELIGIBLE + 4)
        assert k["disk_written"] == 2 and k["disk_dropped"] >= ELIGIBLE + 4, k
        log = srv.log()
    assert log.count("No space left on device") == 1, log
    assert log.count("blocks are not kept on disk") == 1, log
    assert log.count("kv disk tier:") == 1, log  # nothing else went wrong


def test_read_only_directory(zinfer_bin, model_path, cold, cold2, tmp_path):
    """A tier holding the cold run's files, remounted read-only: PROMPT's
    blocks are read from it, PROMPT2's new ones cannot be written (logged
    once), and both get the tokens computed without a tier."""
    ids, _, tmp = cold
    d = tmp / "kv-clean"
    m = tmp_path / "mnt"
    wrapper, mnt = mount_wrapper(
        tmp_path, zinfer_bin,
        f"mount -t tmpfs -o size=16m zinfer-kv {m} && mkdir {m}/kv && cp -p {d}/* {m}/kv/ && "
        f"mount -o remount,ro {m}")
    with serve_process(wrapper, model_path, tmp_path / "ro.log", *args(mnt / "kv")) as srv:
        assert run(srv.addr) == ids
        k = kv(srv.addr, lambda k: k["disk_hit_blocks"] >= ELIGIBLE)
        assert k["disk_hit_blocks"] == ELIGIBLE and k["disk_rejected"] == 0, k
        assert run2(srv.addr) == cold2
        assert run2(srv.addr) == cold2  # now from memory
        k = kv(srv.addr, lambda k: k["disk_dropped"] >= ELIGIBLE - 6)
        assert k["disk_written"] == 0 and k["disk_dropped"] >= ELIGIBLE - 6, k
        log = srv.log()
    assert log.count("Read-only file system") == 1, log
    assert log.count("blocks are not kept on disk") == 1, log
    assert log.count("kv disk tier:") == 1, log
