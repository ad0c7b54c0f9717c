#!/usr/bin/env python3
"""scripts/run_tests.py BUILDDIR... - run the unit and end-to-end tests of
each build directory and print, last, "N passed, N failed".

Unit tests are the executables meson registered (cmocka: each binary holds
many cases; its summary lines are counted). A test that exits 77 after
printing "SKIP: why" (meson's skip code: tests/gpu on a machine without a
GPU) is reported as skipped, not failed; those meson marks is_parallel:
false run alone, the others ZINFER_UNIT_JOBS at a time (default 2: most use
one core, and CI has two). End-to-end tests are pytest files
under tests/e2e, run against BUILDDIR/zinfer; under a sanitizer build only
the tests marked fast-enough (ZINFER_SANITIZED=1 tells them) are run.
"""
import json
import os
import re
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unit_tests(build):
    out = subprocess.run(["meson", "introspect", "--tests", build], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def run_cmocka(t, env):
    start = time.time()
    env = dict(env)
    env.update(t.get("env") or {})  # the test's own (meson test(..., env : [...]))
    p = subprocess.run(t["cmd"], cwd=t.get("workdir") or ROOT, env=env,
                       capture_output=True, text=True, timeout=t.get("timeout") or 600)
    text = p.stdout + p.stderr
    passed = sum(int(n) for n in re.findall(r"\[  PASSED  \] (\d+) test", text))
    failed = sum(int(n) for n in re.findall(r"\[  FAILED  \] (\d+) test", text))
    sanitizer = ("ERROR: AddressSanitizer" in text or "ERROR: LeakSanitizer" in text
                 or "runtime error:" in text)
    if p.returncode == 77 and passed == 0 and failed == 0 and not sanitizer:
        return 0, 0, True, text, time.time() - start  # skipped (meson's code): e.g. no GPU here
    if p.returncode != 0 and failed == 0:
        failed = 1  # crashed or exited non-zero without a cmocka summary
    if p.returncode == 0 and passed == 0 and failed == 0 and not sanitizer:
        passed = 1  # a test program without cases (the fuzz replays): one test
    if sanitizer and failed == 0:
        failed = 1
    return passed, failed, False, text, time.time() - start


def unit_results(tests, env):
    """(test, run_cmocka's result) of each test: those meson marks
    is_parallel: false (the ones over the real model, on two threads) one
    after another with nothing beside them, then the rest ZINFER_UNIT_JOBS
    at a time (default 2: they use one core each, and one after another
    took the sanitizer build's pass 193 s), in meson's order."""
    for t in tests:
        if not t.get("is_parallel", True):
            yield t, run_cmocka(t, env)
    jobs = max(1, int(os.environ.get("ZINFER_UNIT_JOBS", "2")))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rest = [(t, pool.submit(run_cmocka, t, env)) for t in tests
                if t.get("is_parallel", True)]
        for t, r in rest:
            yield t, r.result()


def main():
    builds = sys.argv[1:] or ["build"]
    total_pass = total_fail = 0
    failures = []
    for build in builds:
        sanitized = "asan" in build
        env = dict(os.environ)
        env["ZINFER_BIN"] = os.path.join(ROOT, build, "zinfer")
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
        env["ASAN_OPTIONS"] = "detect_leaks=1"
        if sanitized:
            env["ZINFER_SANITIZED"] = "1"
            # The router core's seeded random runs: 1000 there (the release
            # build runs 4000), the same seven sizes; ~15 s less under ASan.
            env.setdefault("ZI_ROUTER_CORE_RUNS", "1000")
        for t, (p, f, skipped, text, secs) in unit_results(unit_tests(build), env):
            if skipped:
                why = text.splitlines()[0][6:] if text.startswith("SKIP") else "exit code 77"
                print(f"[{build}] {t['name']}: skipped ({why})", flush=True)
                continue
            print(f"[{build}] {t['name']}: {p} passed, {f} failed ({secs:.1f} s)", flush=True)
            total_pass += p
            total_fail += f
            if f:
                failures.append(f"[{build}] {t['name']}\n{text[-4000:]}")
        # End-to-end tests (pytest), against this build's binary. Under
        # AddressSanitizer on the VNNI kernels, not AMX tiles: ASan checks
        # each tile load's whole strided region, which made batched steps
        # ~1.7x slower there; AMX gives the same bits (cpu_kernels.h), the
        # release build runs it end to end and the cmocka tests above run
        # the AMX kernels under the sanitizers.
        e2e_env = dict(env)
        if sanitized:
            e2e_env.setdefault("ZINFER_CPU_AMX", "0")
        junit = os.path.join(ROOT, build, "e2e-junit.xml")
        progress = os.path.join(ROOT, build, "e2e-progress.log")
        with open(progress, "w"):
            pass  # tests/e2e/conftest.py appends a line as each test starts or fails
        e2e_env["ZINFER_E2E_PROGRESS"] = progress
        start = time.time()
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                            f"--junitxml={junit}", "tests/e2e"], cwd=ROOT, env=e2e_env,
                           capture_output=True, text=True)
        text = p.stdout + p.stderr
        m_pass = re.search(r"(\d+) passed", text)
        m_fail = re.search(r"(\d+) failed", text)
        m_err = re.search(r"(\d+) errors?", text)
        ep = int(m_pass.group(1)) if m_pass else 0
        ef = (int(m_fail.group(1)) if m_fail else 0) + (int(m_err.group(1)) if m_err else 0)
        with open(progress, encoding="utf-8") as f:
            lines = f.read().splitlines()
        failed_ids = [ln[len("FAILED "):] for ln in lines if ln.startswith("FAILED ")]
        died = p.returncode not in (0, 1, 5) or (p.returncode == 1
                                                   and not (m_pass or m_fail or m_err))
        if died:
            # pytest itself died (a signal, the OOM killer): no summary, so
            # count what the progress file saw and name the test it was in.
            started = [ln[len("start "):] for ln in lines if ln.startswith("start ")]
            # (each start line ends with the time into the run and pytest's memory)
            why = (f"killed by signal {-p.returncode}" if p.returncode < 0
                   else f"exit code {p.returncode}")
            text += (f"\n[run_tests] pytest died ({why}) during "
                     f"{started[-1] if started else 'collection'}, after {len(started)} tests")
            ef = max(ef, len(failed_ids)) + 1
        if failed_ids:
            text += "\n[run_tests] failed: " + ", ".join(failed_ids)
        # The largest resident set of any process waited for so far (pytest,
        # or a zinfer it ran): memory is the first suspect when pytest dies.
        peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        print(f"[{build}] e2e (pytest): {ep} passed, {ef} failed ({time.time() - start:.1f} s, "
              f"largest process {peak_gb:.1f} GB)", flush=True)
        total_pass += ep
        total_fail += ef
        if ef:
            failures.append(f"[{build}] e2e\n{text[-6000:]}")
    for f in failures:
        print("\n---- FAILED:", f)
    if failures:  # the names once more, next to the total, where a cut log keeps them
        print("---- failed:", "; ".join(f.splitlines()[0] for f in failures))
        for f in failures:
            for line in f.splitlines():
                if line.startswith("[run_tests]"):
                    print(line)
    print(f"{total_pass} passed, {total_fail} failed")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
