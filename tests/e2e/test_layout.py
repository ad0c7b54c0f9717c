"""The tree's layering (docs/architecture.md, "Layers"), checked by
scripts/check-includes: no library includes a header of a process folder
or of a layer above it, and the built worker links neither PCRE2 nor the
chat-template engine."""
import subprocess
import sys
from pathlib import Path

from conftest import REPO, ZINFER_BIN


def run_check(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "check-includes"), *args],
                          capture_output=True, text=True, timeout=120)


def test_includes_follow_the_layers():
    r = run_check("--build", str(Path(ZINFER_BIN).parent))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("0 breaches")


def test_a_breach_is_caught(tmp_path):
    # The check must fail on a breach: a copy of the tree's C sources with
    # one library file that includes the worker's process header and one
    # that reaches up a layer.
    for d in ("common", "protocol", "structured", "model_worker", "tokenizer_proc"):
        for p in (REPO / d).iterdir():
            if p.suffix in (".c", ".h"):
                (tmp_path / d).mkdir(exist_ok=True)
                (tmp_path / d / p.name).write_bytes(p.read_bytes())
    (tmp_path / "structured" / "zz_probe.h").write_text('#include "worker_embed.h"\n')
    (tmp_path / "common" / "zz_probe2.h").write_text('#include "types.h"\n')
    r = run_check("--root", str(tmp_path))
    assert r.returncode == 1
    assert ("structured/zz_probe.h:1: a library file includes model_worker/worker_embed.h"
            in r.stdout)
    assert "common/zz_probe2.h:1: common/ may not include protocol/types.h" in r.stdout
    assert r.stdout.strip().endswith("2 breaches")
