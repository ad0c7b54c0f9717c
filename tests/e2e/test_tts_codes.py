"""The text half of speech: `zinfer generate --tts` on a random-weight
OuteTTS-0.2 codec LLM (tts_llm_files.py: Qwen2.5-0.5B's shapes, 2 layers,
OuteTTS's vocabulary).

  - the rendered prompt is OuteTTS's / llama.cpp's example's format
    (rendered again here from the text), and its token ids are those
    llama-cpp-python's tokenizer gives for that text on the same file;
  - greedy codec tokens equal a float64 numpy reference's greedy tokens
    under the same mask (the audio section's state machine, written again
    here), except after a near-tie; a speaker prompt's words, durations
    and codes land in the prompt and the model continues after them;
  - a seeded sampled request repeats itself and stays inside the mask;
  - bad inputs (empty text, text past 4096 characters, a speaker file
    with a codec id out of range, a model without codec tokens) are
    refused with errors naming the field.
"""

import json
import re

import numpy as np
import pytest

import numpy_llama
import tts_llm_files as T
from conftest import last_json

NEAR_TIE = 0.01
TEXT = "Hello world, 12 cats!"
WORDS = ["hello", "world", "twelve", "cats"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("tts") / "outetts-0.2-random.gguf"
    T.write_codec_llm(path, n_layers=2, code_end_bias=CODE_END_BIAS)
    return path


# makes the random model close a word after a few codes now and then
CODE_END_BIAS = 5.0


@pytest.fixture(scope="module")
def ref(llm):
    return numpy_llama.Model(str(llm))


def render(words, speaker=None):
    """The OuteTTS 0.2 prompt, as llama.cpp's example builds it."""
    spk = speaker or []
    s = "<|im_start|>\n<|text_start|>" + "".join(w["word"] + "<|text_sep|>" for w in spk)
    s += "<|text_sep|>".join(words) + "<|text_end|>\n<|audio_start|>\n"
    for w in spk:
        s += (w["word"] + f"<|t_{w['duration']:.2f}|><|code_start|>"
              + "".join(f"<|{c}|>" for c in w["codes"]) + "<|code_end|>\n")
    return s


def allowed(word_ids, gen):
    """The ids the audio section allows after gen (a set, or a range)."""
    w, k, st = 0, 0, "word"
    for t in gen:
        if st == "word":
            assert t == word_ids[w][k]
            k += 1
            st = "time" if k == len(word_ids[w]) else "word"
        elif st == "time":
            assert T.TIME0 <= t < T.TIME0 + T.N_TIMES
            st = "cstart"
        elif st == "cstart":
            assert t == T.CODE_START
            st = "code1"
        elif st in ("code1", "code"):
            if T.CODE0 <= t < T.CODE0 + T.N_CODES:
                st = "code"
            else:
                assert st == "code" and t == T.CODE_END
                st = "nl"
        elif st == "nl":
            assert t == 198
            w, k = w + 1, 0
            st = "end" if w == len(word_ids) else "word"
        else:
            raise AssertionError(f"token {t} after the end")
    if st == "word":
        return [word_ids[w][k]]
    if st == "time":
        return list(range(T.TIME0, T.TIME0 + T.N_TIMES))
    if st == "cstart":
        return [T.CODE_START]
    codes = list(range(T.CODE0, T.CODE0 + T.N_CODES))
    if st == "code1":
        return codes
    if st == "code":
        return codes + [T.CODE_END]
    return [198] if st == "nl" else [T.AUDIO_END]


def ref_greedy(model, prompt_ids, word_ids, n):
    """Greedy tokens under the mask, and the top-2 gap of each choice."""
    cache = model.new_cache()
    # the head over the allowed rows only (the whole 157696-row head per
    # token would be most of the reference's time)
    h = model.forward(prompt_ids, cache, last_only=True, hidden=True)[-1]
    toks, gaps = [], []
    for _ in range(n):
        ok = np.array(allowed(word_ids, toks))
        zz = model.out_w[ok].astype(np.float64) @ h
        if model.out_b is not None:
            zz = zz + model.out_b[ok]
        order = np.argsort(-zz, kind="stable")
        gaps.append(float(zz[order[0]] - zz[order[1]]) if len(ok) > 1 else np.inf)
        toks.append(int(ok[order[0]]))
        if toks[-1] == T.AUDIO_END:
            break
        h = model.forward([toks[-1]], cache, last_only=True, hidden=True)[-1]
    return toks, gaps


def tts(run_zinfer, llm, text, *extra, check=True):
    r = run_zinfer("generate", "--model", str(llm), "--tts", text, "--json", "--threads", "2",
                   *extra)
    if check:
        assert r.returncode == 0, r.stderr
        return last_json(r.stdout)
    return r


def word_ids_of(llm_tok, words):
    return [llm_tok.tokenize(w.encode(), add_bos=False, special=False) for w in words]


@pytest.fixture(scope="module")
def llama_tok(llm):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(llm), vocab_only=True, verbose=False)


def test_prompt_matches_llamacpp_tokenizer(run_zinfer, llm, llama_tok, tmp_path):
    spk = [{"word": "the", "duration": 0.08, "codes": [257, 740, 636]},
           {"word": "remarkable", "duration": 0.68, "codes": [230, 1048, 4099, 0]}]
    f = tmp_path / "speaker.json"
    f.write_text(json.dumps({"text": "the remarkable", "words": spk}))
    for args, speaker in (((), None), (("--tts-speaker", str(f)), spk)):
        out = tts(run_zinfer, llm, TEXT, "--max-tokens", "0", *args)
        assert out["tts_prompt"] == render(WORDS, speaker)
        want = llama_tok.tokenize(out["tts_prompt"].encode(), add_bos=False, special=True)
        assert out["prompt_token_ids"] == want
    # the speaker's markers are single tokens at OuteTTS's ids
    ids = out["prompt_token_ids"]
    assert ids[:3] == [T.IM_START, 198, T.TEXT_START]
    assert T.TIME0 + 8 in ids and T.TIME0 + 68 in ids and T.CODE0 + 4099 in ids
    assert ids[-1] == 198 and ids[-2] == T.CODE_END


def test_greedy_codes_match_reference(run_zinfer, llm, ref, llama_tok):
    n = 48
    out = tts(run_zinfer, llm, TEXT, "--max-tokens", str(n))
    word_ids = word_ids_of(llama_tok, WORDS)
    want, gaps = ref_greedy(ref, out["prompt_token_ids"], word_ids, n)
    got = out["token_ids"]
    if out["finish_reason"] == "end_of_sequence":
        got = got + [T.AUDIO_END]  # (the ending token is not returned)
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            assert gaps[i] < NEAR_TIE, f"token {i}: zinfer {a}, reference {b}, gap {gaps[i]}"
            pytest.skip(f"near-tie at token {i} (gap {gaps[i]:.2e}); equal before it")
    assert len(got) == len(want)
    allowed(word_ids, got)  # every token inside the mask
    codes = [t - T.CODE0 for t in got if T.CODE0 <= t < T.CODE0 + T.N_CODES]
    assert out["codes"] == codes and len(codes) > 4
    # the words come out in order, each with a duration and its codes
    text = llama_tok.detokenize(got, special=True).decode()
    spoken = re.findall(r"(?:^|\n)([a-z]+)<\|t_\d\.\d\d\|><\|code_start\|>", text)
    assert spoken == WORDS[:len(spoken)] and len(spoken) >= 2, text


def test_seeded_sampling_repeats(run_zinfer, llm, llama_tok):
    args = ("--max-tokens", "24", "--temperature", "1.0", "--top-p", "0.9", "--seed", "7")
    a = tts(run_zinfer, llm, "One two three", *args)
    b = tts(run_zinfer, llm, "One two three", *args)
    assert a["token_ids"] == b["token_ids"]
    allowed(word_ids_of(llama_tok, ["one", "two", "three"]), a["token_ids"])
    c = tts(run_zinfer, llm, "One two three", *args[:-1], "8")
    assert c["token_ids"] != a["token_ids"]


def test_plain_output_is_codes(run_zinfer, llm):
    r = run_zinfer("generate", "--model", str(llm), "--tts", "Hi", "--max-tokens", "12",
                   "--threads", "2")
    assert r.returncode == 0, r.stderr
    codes = [int(x) for x in r.stdout.split()]
    assert codes and all(0 <= c < T.N_CODES for c in codes)


@pytest.mark.parametrize("text,speaker,msg", [
    ("", None, "input: the text is empty"),
    ("?!", None, "input: no word to speak"),
    ("a" * 4097, None, "input: 4097 characters, more than the 4096 allowed"),
    ("Hi", {"words": [{"word": "a", "duration": 0.1, "codes": [1, 4100]}]},
     "words[0].codes[1]: a codec id must be an integer in [0, 4099]"),
    ("Hi", {"words": [{"word": "<|im_end|>", "duration": 0.1, "codes": [1]}]},
     "words[0].word"),
    ("Hi", {"words": [{"word": "a", "duration": 12.5, "codes": [1]}]},
     "words[0].duration"),
])
def test_bad_inputs(run_zinfer, llm, tmp_path, text, speaker, msg):
    extra = ()
    if speaker is not None:
        f = tmp_path / "spk.json"
        f.write_text(json.dumps(speaker))
        extra = ("--tts-speaker", str(f))
    r = tts(run_zinfer, llm, text, "--max-tokens", "4", *extra, check=False)
    assert r.returncode == 1 and msg in r.stderr, r.stderr
    if speaker is not None:
        assert f"--tts-speaker {f}" in r.stderr


def test_not_a_codec_model(run_zinfer, model_path):
    r = run_zinfer("generate", "--model", str(model_path), "--tts", "Hi", "--max-tokens", "4")
    assert r.returncode == 1 and "not an OuteTTS 0.2 codec model" in r.stderr, r.stderr


def test_usage_errors(run_zinfer, llm):
    r = run_zinfer("generate", "--model", str(llm), "--tts", "Hi", "--prompt", "x")
    assert r.returncode == 2 and "--tts renders the prompt" in r.stderr
    r = run_zinfer("generate", "--model", str(llm), "--tts-speaker", "f.json", "--prompt", "x")
    assert r.returncode == 2 and "--tts-speaker needs --tts" in r.stderr
