"""BENCHMARKS.md's summary table is what scripts/bench-summary writes from
the log below it: the check fails when an entry was appended (a benchmark
script's --write) without rerunning the script, or the table was edited by
hand. The parsing is checked on a log of two entries, the later winning."""
import subprocess
import sys

import pytest
from conftest import REPO

# Python only: skipped under the sanitizers (conftest.py).
pytestmark = pytest.mark.no_zinfer

SCRIPT = REPO / "scripts" / "bench-summary"


def test_summary_table_is_current():
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr


ENTRY = """
## {when} UTC: zinfer vs llama.cpp

- command: `scripts/bench-vs-llamacpp -r 3 --write` (zinfer abc1234)
- CPU: Test CPU (2 logical CPUs visible)
- Medians of 3 interleaved rounds, 2 threads, model SmolLM2-135M-Instruct.Q4_1.gguf.

| engine | prefill tok/s (P=512) | decode tok/s (G=128) |
| --- | ---: | ---: |
| zinfer | {p} | 100.0 |
| llama.cpp (llama-cpp-python 0.3.36) | 100.0 | 50.0 |
| ratio zinfer / llama.cpp | {r} | 2.00 |
"""


def test_latest_entry_wins(tmp_path):
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n\nIntro.\n"
                  + ENTRY.format(when="2026-01-02 10:00", p=300.0, r="3.00")
                  + ENTRY.format(when="2026-01-01 10:00", p=200.0, r="2.00"))
    run = [sys.executable, str(SCRIPT), "--file", str(md)]
    assert subprocess.run(run + ["--check"], capture_output=True).returncode == 1
    assert subprocess.run(run, capture_output=True).returncode == 0
    text = md.read_text()
    assert subprocess.run(run + ["--check"], capture_output=True).returncode == 0
    row = next(line for line in text.splitlines() if "prefill **" in line)
    assert "prefill **3.00x**" in row and "2026-01-02 10:00 UTC" in row, row
    assert "Test CPU" in row and "`scripts/bench-vs-llamacpp -r 3 --write`" in row, row
    assert text.index("<!-- bench-summary: end -->") < text.index("## 2026-01-02")
