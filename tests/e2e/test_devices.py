"""`zinfer devices`: one line per backend built in (cpu always; cuda either
"compiled in" with the devices found, or "not compiled in"), exit 0; a bad
option is a usage error. Holds on machines with and without a GPU and for
builds with and without CUDA (kernels/backend_select.h)."""

import re
import subprocess

from conftest import ZINFER_BIN


def run(*args):
    return subprocess.run([str(ZINFER_BIN), *args], capture_output=True, text=True, timeout=60)


def test_devices_lists_backends():
    res = run("devices")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert re.match(r"cpu: compiled in, kernels (scalar|avx2|avx512), \d+ CPUs?$", lines[0])
    cuda = [ln for ln in lines if ln.startswith("cuda: ")]
    assert len(cuda) == 1, res.stdout
    assert re.match(r"cuda: (not compiled in \(.+\)|compiled in, \d+ devices? found.*)$", cuda[0])
    if re.match(r"cuda: compiled in, 0 devices found", cuda[0]):
        assert re.search(r"\(cudaGetDeviceCount: .+\)$", cuda[0]), cuda[0]  # says why
    n = re.match(r"cuda: compiled in, (\d+) devices? found$", cuda[0])
    if n:  # a GPU machine: one line per device
        devs = [ln for ln in lines if ln.startswith("  cuda:")]
        assert len(devs) == int(n.group(1)), res.stdout
    assert any(ln.startswith("nccl: ") for ln in lines)


def test_devices_help_and_bad_option():
    res = run("devices", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: zinfer devices")
    res = run("devices", "--bogus")
    assert res.returncode == 2
    assert "unknown option '--bogus'" in res.stderr
    assert "devices" in run("--help").stdout
