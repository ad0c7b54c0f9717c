"""zinfer on every common GGUF tensor type against float64 and llama.cpp.

scripts/make-quant-models (run by `scripts/setup --with-llamacpp`) requantizes
the default model with llama.cpp's own quantizer into Q4_K_M, Q5_K_M, Q6_K,
Q3_K_M, Q2_K, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS and Q2_K_pure files under
$ZINFER_HOME/models/quant. tests/fixtures/quant_llamacpp_kl.json (made by
scripts/ref/quant_reference.py) holds, per file, llama.cpp's mean KL from the
float64 reference on its prompts, the reference's top-1 id at every position
and its 64-token greedy continuations. For each file present, this checks
zinfer against the float64 reference computed live (numpy_llama reads every
type through the `gguf` package), as test_logits.py does for the default
model, with these acceptance criteria:
  - argmax equal to the reference's at every position except near-ties
    (reference top-2 gap < NEAR_TIE),
  - mean KL < MAX_MEAN_KL and below llama.cpp's on the same file,
  - 64-token greedy output equal to the reference's, except where the first
    divergence is at a near-tie of the reference.
A file is skipped only when absent (CI has no llama.cpp); zinfer reads
every type these files hold, so any failure to run one fails the test. The
fixture's own consistency is checked always. Under the sanitizers (ZINFER_SANITIZED=1) only the logits
test runs, on SANITIZED_FILES and every other prompt. The logits test
takes all ten prompts on CI_FILES and every other prompt on the other
files (ZINFER_QUANT_ALL=1: all ten everywhere).

Time: until the new types have fast kernels they run on the CPU's
dequantizing path (docs/engine.md), and the greedy tests of all eleven
files take ~8 minutes in the release build. So by default the greedy test
runs on CI_FILES (the three files BENCHMARKS.md measures) and, under the
sanitizers, so does the logits test; ZINFER_QUANT_ALL=1 runs every test on
every file.
"""

import math
import os
import re

import numpy as np
import pytest
from conftest import ids_arg, last_json, load_fixture, report, run_each

import numpy_llama
import quant_models
from refcache import file_sha256 as sha256  # memoized: 11 files of ~100 MB

CI_FILES = ("Q4_K_M", "Q6_K", "IQ4_XS")
# Under the sanitizers two of them: a K-quant and the IQ4 code book cover the
# repacked kernels' decode paths (test_repack_x checks each type under ASan).
SANITIZED_FILES = ("Q4_K_M", "IQ4_XS")
ALL = os.environ.get("ZINFER_QUANT_ALL") == "1"
SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"


def only_ci_files(t, what):
    """Skips `what` for a file outside CI_FILES unless ZINFER_QUANT_ALL=1."""
    if t not in CI_FILES and not ALL:
        pytest.skip(f"{what} on {t}: ZINFER_QUANT_ALL=1 runs it (slow until the new types "
                    f"have fast kernels; by default it runs on {', '.join(CI_FILES)})")


FIXTURE = load_fixture("quant_llamacpp_kl.json")
FILES = {f["type"]: f for f in FIXTURE["files"]}
NEAR_TIE = FIXTURE["meta"]["near_tie_gap"]
GEN_TOKENS = FIXTURE["meta"]["gen_tokens"]
MAX_MEAN_KL = 1e-4


@pytest.mark.no_zinfer
def test_fixture_consistent(prompts):
    """Runs without llama.cpp: the committed numbers are complete and sane."""
    meta = FIXTURE["meta"]
    assert set(quant_models.REQUIRED) <= set(FILES), "a required file type is missing"
    assert len(FILES) == len(FIXTURE["files"]), "a file type appears twice"
    assert len(meta["prompts"]) >= 8
    assert meta["near_tie_gap"] == 0.01 and meta["gen_tokens"] == 64
    for t, f in FILES.items():
        assert f["file"] == f"{quant_models.STEM}.{t}.gguf"
        assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"]), t
        assert sum(f["type_mix"].values()) == 272, (t, f["type_mix"])  # 30 layers x 9 + 2
        assert [p["name"] for p in f["prompts"]] == meta["prompts"], t
        n = 0
        for p in f["prompts"]:
            assert p["n_tokens"] == len(prompts[p["name"]]["ids"]), (t, p["name"])
            assert len(p["ref_top1"]) == p["n_tokens"], (t, p["name"])
            assert len(p["ref_greedy"]) == GEN_TOKENS, (t, p["name"])
            assert math.isfinite(p["mean_kl"]) and p["mean_kl"] > 0, (t, p["name"])
            n += p["n_tokens"]
        assert f["n_positions"] == n, t
        for k in ("llamacpp_mean_kl", "llamacpp_max_kl"):
            assert math.isfinite(f[k]) and f[k] > 0, (t, k)
        assert f["llamacpp_mean_kl"] <= f["llamacpp_max_kl"], t
        # The file mean is the position-weighted mean of the prompt means.
        pooled = sum(p["mean_kl"] * p["n_tokens"] for p in f["prompts"]) / n
        assert pooled == pytest.approx(f["llamacpp_mean_kl"], rel=1e-9), t
        assert 0 <= f["llamacpp_argmax_mismatches_near_tie"] <= f["llamacpp_argmax_mismatches"]
        assert f["llamacpp_argmax_mismatches"] == sum(
            len(p["llamacpp_argmax_mismatch_positions"]) for p in f["prompts"]), t
    # llama.cpp is not exact on any of them: the bar zinfer must clear is real.
    assert min(f["llamacpp_mean_kl"] for f in FILES.values()) > MAX_MEAN_KL


@pytest.fixture(scope="module", params=list(FILES), ids=str)
def qfile(request):
    """One model file with its fixture entry and ref(), its float64 reference
    model, loaded on first use.
    Module-scoped and parametrized, so that pytest runs each file's tests
    together: one file's ~1 GB of float64 weights in memory at a time."""
    t = request.param
    path = quant_models.path_for(t)
    if not os.path.isfile(path):
        pytest.skip(f"{path} absent (made by scripts/setup --with-llamacpp)")
    entry = FILES[t]
    got_sha = sha256(path)
    assert got_sha == entry["sha256"], (
        f"{path} is not the file the fixture measured (sha256 {got_sha}, fixture "
        f"{entry['sha256']}): remake it (scripts/make-quant-models --force) or re-run "
        "scripts/ref/quant_reference.py")
    cache = []

    def ref():
        if not cache:
            cache.append(numpy_llama.Model(path))
        return cache[0]

    return {"type": t, "path": path, "entry": entry, "ref": ref}


def run_ok(run_zinfer, *args):
    """run_zinfer(*args), which must succeed."""
    res = run_zinfer(*args)
    assert res.returncode == 0, f"zinfer {args[0]} failed: {res.stderr.strip()}"
    return res


def run_ok_each(run_zinfer, arg_lists):
    """run_ok of each argument list, two at a time on a thread each
    (conftest.run_each): the results in order."""
    return run_each(lambda *a: run_ok(run_zinfer, *a), arg_lists)


def test_logits_match_reference(qfile, prompts, run_zinfer, tmp_path):
    t, entry = qfile["type"], qfile["entry"]
    if SANITIZED and t not in SANITIZED_FILES and not ALL:
        pytest.skip(f"the logits test under the sanitizers runs on {', '.join(SANITIZED_FILES)}")
    kls, flips, bad = [], {}, {}
    # CI_FILES on all ten prompts, the others on every other one (the
    # float64 reference is most of the time); ZINFER_QUANT_ALL=1: all ten;
    # under the sanitizers every other prompt of SANITIZED_FILES.
    chosen = entry["prompts"] if (t in CI_FILES and not SANITIZED) or ALL \
        else entry["prompts"][::2]
    runs = run_ok_each(run_zinfer, [("logits", "--model", qfile["path"], "--prompt-ids",
                                     ids_arg(prompts[p["name"]]["ids"]), "--out",
                                     tmp_path / f"{p['name']}.f32") for p in chosen])
    for p, res in zip(chosen, runs):
        ids = prompts[p["name"]]["ids"]
        out = tmp_path / f"{p['name']}.f32"
        assert last_json(res.stdout)["n_tokens"] == len(ids)
        ref_model = qfile["ref"]()
        raw = np.fromfile(out, dtype="<f4")
        assert raw.size == len(ids) * ref_model.n_vocab, f"{out}: {raw.size} floats"
        got = raw.reshape(len(ids), ref_model.n_vocab).astype(np.float64)
        assert np.isfinite(got).all(), f"{p['name']}: non-finite logits"

        ref = numpy_llama.logits(ref_model, ids)
        srt = np.partition(ref, -2, axis=-1)  # the two largest last
        gap = srt[:, -1] - srt[:, -2]
        am_ref = ref.argmax(-1)
        # The live reference is the one the fixture was made with.
        moved = [i for i in range(len(ids)) if am_ref[i] != p["ref_top1"][i]
                 and gap[i] >= NEAR_TIE]
        assert not moved, f"{p['name']}: the reference's argmax moved at {moved}"
        kls.append(numpy_llama.kl(ref, got))
        diff = np.nonzero(am_ref != got.argmax(-1))[0]
        if diff.size:
            flips[p["name"]] = diff.tolist()
            hard = [(int(i), round(float(gap[i]), 4)) for i in diff if gap[i] >= NEAR_TIE]
            if hard:
                bad[p["name"]] = hard

    kl = np.concatenate(kls)
    mean_kl, llama_kl = float(kl.mean()), entry["llamacpp_mean_kl"]
    report("quant_types", t, {"zinfer_mean_kl": mean_kl, "zinfer_max_kl": float(kl.max()),
                              "llamacpp_mean_kl": llama_kl, "n_positions": int(kl.size),
                              "argmax_mismatch_positions": flips})
    print(f"\n{t}: mean KL zinfer {mean_kl:.3e} llama.cpp {llama_kl:.3e}; max KL zinfer "
          f"{kl.max():.3e}; argmax differs {sum(map(len, flips.values()))}/{kl.size}")
    assert not bad, f"argmax differs from the reference away from near-ties: (pos, gap) {bad}"
    assert mean_kl < MAX_MEAN_KL, f"mean KL {mean_kl:.3e} >= {MAX_MEAN_KL}"
    assert mean_kl < llama_kl, f"mean KL {mean_kl:.3e} not below llama.cpp's {llama_kl:.3e}"


@pytest.mark.skipif(SANITIZED,
                    reason="10 prompts x 64 tokens a file: too slow under the sanitizers; "
                    "the logits test covers the same kernels there")
def test_greedy_matches_reference(qfile, prompts, run_zinfer):
    t, entry = qfile["type"], qfile["entry"]
    only_ci_files(t, "the greedy test")
    diverged = {}
    runs = run_ok_each(run_zinfer, [("generate", "--model", qfile["path"], "--prompt-ids",
                                     ids_arg(prompts[p["name"]]["ids"]), "--max-tokens",
                                     GEN_TOKENS, "--temperature", "0", "--ignore-eos", "--json")
                                    for p in entry["prompts"]])
    for p, res in zip(entry["prompts"], runs):
        ids = prompts[p["name"]]["ids"]
        got = last_json(res.stdout)["token_ids"]
        assert len(got) == GEN_TOKENS, f"{p['name']}: {len(got)} tokens"
        want = p["ref_greedy"]
        step = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
        if step is None:
            continue
        # Same tokens before `step`, so the reference's logits there are those
        # of prompt + the common prefix.
        z = qfile["ref"]().forward(ids + want[:step], last_only=True)[-1]
        top2 = np.sort(z)[-2:]
        diverged[p["name"]] = (step, round(float(top2[1] - top2[0]), 5))
    report("quant_types", f"{t}_greedy", {"diverged": diverged})
    hard = {k: v for k, v in diverged.items() if v[1] >= NEAR_TIE}
    assert not hard, f"greedy output leaves the reference's away from a near-tie: {hard}"
