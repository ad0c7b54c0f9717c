"""zinfer's greedy generation against llama.cpp and the float64 reference.

tests/fixtures/greedy.json holds, per prompt, 64 greedy tokens (EOS ignored)
from llama.cpp and from the float64 numpy reference, with each step's gap
between the two largest logits. Greedy decoding legitimately flips where the
two best logits are nearly equal, and llama.cpp itself is not exact: it
quantizes activations to 8 bits, which costs it a mean KL of 2.5e-3..8e-3 to
the float64 reference and makes its greedy text differ from the reference's
on 10 of the 14 prompts (always at a near-tie, gap <= 0.18). So:
  - against the float64 reference: at most one prompt may differ, and there
    the divergence must start at a near-tie (reference gap < NEAR_TIE);
  - against llama.cpp: any divergence must start at a near-tie of llama.cpp
    (its gap < NEAR_TIE); how many differ is reported, not limited.
Also checks that `generate --prompt TEXT` tokenizes like llama.cpp.
"""

import os

import pytest
from conftest import ids_arg, last_json, load_fixture, report

GREEDY = load_fixture("greedy.json")
MAX_TOKENS = GREEDY["meta"]["max_tokens"]
NEAR_TIE = 0.5
MAX_DIFFERING_FROM_REF = 1
# Under the sanitizers (ZINFER_SANITIZED=1) every other prompt: the same
# generate path, 64 tokens a prompt at several times the cost; the bound
# of one prompt differing from the reference stays.
CASES = GREEDY["prompts"][::2] if os.environ.get("ZINFER_SANITIZED") == "1" \
    else GREEDY["prompts"]


def generate(run_zinfer, model_path, *args):
    res = run_zinfer("generate", "--model", model_path, *args)
    assert res.returncode == 0, f"zinfer generate failed: {res.stderr.strip()}"
    return last_json(res.stdout)


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.fixture(scope="module")
def zinfer_greedy(run_zinfer, model_path):
    """name -> zinfer's 64 greedy token ids for each greedy.json prompt."""
    out = {}
    for case in CASES:
        res = generate(run_zinfer, model_path, "--prompt-ids", ids_arg(case["prompt_ids"]),
                       "--max-tokens", MAX_TOKENS, "--temperature", "0", "--ignore-eos",
                       "--json")
        assert res["prompt_token_ids"] == case["prompt_ids"], case["name"]
        assert isinstance(res["text"], str)
        got = res["token_ids"]
        assert len(got) == MAX_TOKENS, f"{case['name']}: {len(got)} tokens, want {MAX_TOKENS}"
        out[case["name"]] = got
    return out


def compare(zinfer_greedy, tokens_key, gap_key, section):
    """[(name, step, gap, zinfer_tok, want_tok)] for the prompts that differ."""
    differing, per_prompt = [], {}
    for case in CASES:
        got, want = zinfer_greedy[case["name"]], case[tokens_key]
        step = first_divergence(got, want)
        per_prompt[case["name"]] = {"first_divergence": step,
                                    "gap_there": None if step is None else case[gap_key][step]}
        if step is not None:
            differing.append((case["name"], step, case[gap_key][step], got[step], want[step]))
    report(section, "per_prompt", per_prompt)
    report(section, "n_identical", len(CASES) - len(differing))
    report(section, "n_prompts", len(CASES))
    for name, step, gap, g, w in differing:
        print(f"\n[{section}] {name}: diverges at step {step} (zinfer {g}, expected {w}), "
              f"top-2 gap there {gap:.4f}")
    return differing


def test_greedy_matches_float64_reference(zinfer_greedy):
    differing = compare(zinfer_greedy, "ref_token_ids", "ref_top2_gap", "greedy_vs_reference")
    assert len(differing) <= MAX_DIFFERING_FROM_REF, (
        f"{len(differing)} of {len(CASES)} prompts differ from the float64 "
        f"reference: {[(n, s, round(gap, 4)) for n, s, gap, _, _ in differing]}")
    for name, step, gap, g, w in differing:
        assert gap < NEAR_TIE, (f"{name}: diverges at step {step} (zinfer {g}, reference {w}) "
                                f"where the reference's top-2 gap {gap:.4f} is not a near-tie")


def test_greedy_diverges_from_llamacpp_only_at_near_ties(zinfer_greedy):
    differing = compare(zinfer_greedy, "token_ids", "top2_gap", "greedy_vs_llamacpp")
    by_name = {c["name"]: c for c in GREEDY["prompts"]}
    for name, step, gap, g, w in differing:
        assert gap < NEAR_TIE, (f"{name}: diverges at step {step} (zinfer {g}, llama.cpp {w}) "
                                f"where llama.cpp's top-2 gap {gap:.4f} is not a near-tie")
        # Where zinfer leaves llama.cpp before the reference does, the step
        # must be one where llama.cpp itself leaves the float64 reference:
        # the divergence is llama.cpp's rounding, not zinfer's.
        ref_step = by_name[name]["ref_first_divergence"]
        zi_ref_step = first_divergence(zinfer_greedy[name], by_name[name]["ref_token_ids"])
        if zi_ref_step is None or zi_ref_step > step:
            assert ref_step == step, (f"{name}: zinfer leaves llama.cpp at step {step}, but "
                                      f"llama.cpp leaves the reference at step {ref_step}")


@pytest.mark.parametrize("name", ["chat_capital", "chat_multiturn", "unicode_mixed",
                                  "whitespace"])
def test_prompt_text_tokenizes_like_llamacpp(name, prompts, run_zinfer, model_path):
    p = prompts[name]
    out = generate(run_zinfer, model_path, "--prompt", p["text"], "--max-tokens", "1",
                   "--temperature", "0", "--json")
    assert out["prompt_token_ids"] == p["ids"]
    assert len(out["token_ids"]) == 1
