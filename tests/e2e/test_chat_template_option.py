"""`--chat-template FILE|NAME`: the built-in templates and template files.

- Each built-in template renders what the published template of its family
  renders, for plain system/user/assistant conversations (with and without
  a generation prompt): the vendored llama.cpp templates where they carry
  that format (Qwen3-Coder for ChatML, Gemma 2 and Phi-3.5), the repository's
  published-template fixtures (tests/fixtures/chat_templates), and
  llama.cpp's own built-in formats (llama_chat_apply_template: chatml,
  gemma with its system folding, llama3, phi3).
- `zinfer serve --model gemma3-270m --chat-template gemma` answers a
  `messages` request; its prompt tokens are the `zinfer chat-template`
  rendering, tokenized.
- A template file works the same way; a missing file, a directory, an
  unknown name and a template that does not compile are refused, naming
  the file (and the built-in names).
"""
import ctypes
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, ZINFER_MODEL, run_zinfer_lines, serve_process
from zinfer_client import Client, ZinferError

HOME = Path(os.environ.get("ZINFER_HOME", Path.home() / ".cache" / "zinfer"))
VENDOR = HOME / "llama.cpp-vendor" / "models" / "templates"
GEMMA3 = Path(os.environ.get("ZINFER_GEMMA3", HOME / "models" / "gemma-3-270m-q4_k_m.gguf"))
NAMES = ["chatml", "gemma", "llama3", "mistral", "phi3"]

S = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "What is the capital of France?"}
A1 = {"role": "assistant", "content": "Paris."}
U2 = {"role": "user", "content": "And of Spain?"}
W = {"role": "user", "content": "  spaced out \n"}
CONVS = {"u": [U1], "su": [S, U1], "uau": [U1, A1, U2], "suau": [S, U1, A1, U2],
         "sua": [S, U1, A1], "ua": [U1, A1], "w": [W]}
WITH_SYSTEM = {"su", "suau", "sua"}


def render(zinfer_bin, template, msgs, agp, bos="<BOS>", eos="<EOS>"):
    """(returncode, stdout, stderr) of `zinfer chat-template --chat-template template`."""
    req = {"messages": msgs, "add_generation_prompt": agp, "now": 1768473000}
    if bos is not None:
        req["bos_token"] = bos
    if eos is not None:
        req["eos_token"] = eos
    r = subprocess.run([str(zinfer_bin), "chat-template", "--chat-template", str(template)],
                       input=json.dumps(req), capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def cases(skip=()):
    return [(c, agp) for c in CONVS if c not in skip for agp in (False, True)]


# (built-in, reference file, conversations it is compared on): the published
# Gemma templates refuse a system message, so those are compared below with
# llama.cpp's gemma format, which folds it into the first user turn.
REFERENCES = [
    ("chatml", VENDOR / "Qwen3-Coder.jinja", ()),
    ("chatml", FIXTURES / "chat_templates" / "chatml.jinja", ()),
    ("gemma", VENDOR / "google-gemma-2-2b-it.jinja", WITH_SYSTEM),
    ("gemma", FIXTURES / "chat_templates" / "gemma.jinja", WITH_SYSTEM),
    ("llama3", FIXTURES / "chat_templates" / "llama3.jinja", ()),
    ("mistral", FIXTURES / "chat_templates" / "mistral_v0_3.jinja", ()),
    ("phi3", VENDOR / "microsoft-Phi-3.5-mini-instruct.jinja", ()),
    ("phi3", FIXTURES / "chat_templates" / "phi3.jinja", ()),
]


@pytest.mark.parametrize("name,ref,skip", REFERENCES,
                         ids=[f"{n}-{r.stem}" for n, r, _ in REFERENCES])
def test_builtin_equals_published_template(zinfer_bin, name, ref, skip):
    if not ref.is_file():
        pytest.skip(f"{ref} absent (scripts/fetch-llamacpp-vendor)")
    n = 0
    for conv, agp in cases(skip):
        got = render(zinfer_bin, name, CONVS[conv], agp)
        want = render(zinfer_bin, ref, CONVS[conv], agp)
        assert got[0] == 0 and want[0] == 0, (conv, agp, got[2], want[2])
        assert got[1] == want[1], (conv, agp)
        n += 1
    assert n == 2 * (len(CONVS) - len(skip))
    if skip:  # the published template refuses these; ours renders them
        for conv, agp in cases(set(CONVS) - set(skip)):
            assert render(zinfer_bin, ref, CONVS[conv], agp)[0] == 1
            assert render(zinfer_bin, name, CONVS[conv], agp)[0] == 0


def llamacpp_format(name, msgs, agp):
    """llama.cpp's built-in chat format `name` (llama_chat_apply_template)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    arr = (llama_cpp.llama_chat_message * len(msgs))()
    keep = []
    for i, m in enumerate(msgs):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(msgs), agp, buf, 1 << 16)
    assert 0 <= n < 1 << 16, (name, n)
    return buf.raw[:n].decode()


@pytest.mark.parametrize("name", ["chatml", "gemma", "llama3", "phi3"])
def test_builtin_equals_llamacpp_format(zinfer_bin, name):
    """llama.cpp's formats add no BOS (its tokenizer does) and phi3's no EOS
    after a finished conversation: compared with bos_token undefined, and
    phi3 with a generation prompt only."""
    n = 0
    for conv, agp in cases():
        if name == "phi3" and not agp:
            continue
        rc, got, err = render(zinfer_bin, name, CONVS[conv], agp, bos=None)
        assert rc == 0, err
        assert got == llamacpp_format(name, CONVS[conv], agp), (conv, agp)
        n += 1
    assert n == (len(CONVS) if name == "phi3" else 2 * len(CONVS))


def test_gemma_rendering(zinfer_bin):
    """The exact Gemma 3 prompt: BOS, the system text opening the first user
    turn, the assistant as `model`, the generation prompt."""
    rc, out, err = render(zinfer_bin, "gemma", CONVS["suau"], True, bos="<bos>", eos="<eos>")
    assert rc == 0, err
    assert out == ("<bos><start_of_turn>user\nYou are a terse assistant.\n\n"
                   "What is the capital of France?<end_of_turn>\n"
                   "<start_of_turn>model\nParis.<end_of_turn>\n"
                   "<start_of_turn>user\nAnd of Spain?<end_of_turn>\n"
                   "<start_of_turn>model\n")
    # a system message alone still reaches the model, as a user turn
    rc, out, err = render(zinfer_bin, "gemma", [S], True, bos="<bos>")
    assert out == ("<bos><start_of_turn>user\nYou are a terse assistant.<end_of_turn>\n"
                   "<start_of_turn>model\n")
    # null content (an assistant's tool call) renders as empty, not an error
    rc, out, err = render(zinfer_bin, "gemma", [U1, {"role": "assistant", "content": None}],
                          False, bos="")
    assert rc == 0 and out.endswith("<start_of_turn>model\n<end_of_turn>\n"), (rc, out, err)


def test_print_template_and_file(zinfer_bin, tmp_path):
    """--print-template writes the built-in source; that source, as a FILE,
    renders the same as the name (--template is the older spelling)."""
    src = subprocess.run([str(zinfer_bin), "chat-template", "--chat-template", "gemma",
                          "--print-template"], capture_output=True, text=True, timeout=60)
    assert src.returncode == 0 and "<start_of_turn>" in src.stdout, src.stderr
    f = tmp_path / "my-gemma.jinja"
    f.write_text(src.stdout)
    for conv, agp in cases():
        assert render(zinfer_bin, f, CONVS[conv], agp) == render(zinfer_bin, "gemma",
                                                                 CONVS[conv], agp)
    r = subprocess.run([str(zinfer_bin), "chat-template", "--template", "chatml"],
                       input=json.dumps({"messages": [U1]}), capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "<|im_start|>user\n" + U1["content"] + "<|im_end|>\n"


def test_chat_template_errors(zinfer_bin, tmp_path):
    names = ", ".join(NAMES)
    rc, out, err = render(zinfer_bin, "gemmma", [U1], True)
    assert rc == 1 and err.strip() == (f"zinfer: chat-template: --chat-template gemmma: not a "
                                       f"built-in template ({names}) and no such file"), err
    missing = tmp_path / "none.jinja"
    rc, out, err = render(zinfer_bin, missing, [U1], True)
    assert rc == 1 and err.strip() == (f"zinfer: chat-template: --chat-template {missing}: "
                                       "cannot open: No such file or directory"), err
    rc, out, err = render(zinfer_bin, tmp_path, [U1], True)
    assert rc == 1 and err.strip().endswith(f"--chat-template {tmp_path}: not a regular file")
    empty = tmp_path / "empty.jinja"
    empty.write_text("")
    rc, out, err = render(zinfer_bin, empty, [U1], True)
    assert rc == 1 and err.strip().endswith("the file is empty"), err
    big = tmp_path / "big.jinja"
    big.write_bytes(b"x" * ((4 << 20) + 1))
    rc, out, err = render(zinfer_bin, big, [U1], True)
    assert rc == 1 and "4194305 bytes, more than a chat template's limit of 4194304" in err, err
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}")
    rc, out, err = render(zinfer_bin, bad, [U1], True)
    assert rc == 3 and str(bad) in err and "chat template line 1 col" in err, err


def test_serve_refuses_bad_template(zinfer_bin, tmp_path):
    """zinfer serve checks the template before starting anything."""
    if not ZINFER_MODEL.is_file():
        pytest.skip(f"{ZINFER_MODEL} absent")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ x + }}")
    for arg, want in [("gemmma", "not a built-in template (" + ", ".join(NAMES) + ")"),
                      (str(tmp_path / "none.jinja"), "cannot open: No such file or directory"),
                      (str(bad), f"--chat-template {bad}: chat template line 1 col")]:
        r = subprocess.run([str(zinfer_bin), "serve", "--model", str(ZINFER_MODEL), "--http",
                            "off", "--chat-template", arg], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and want in r.stderr, r.stderr
        assert "started" not in r.stderr


gemma = pytest.mark.skipif(not GEMMA3.is_file(),
                           reason=f"{GEMMA3} absent (scripts/fetch-model gemma3-270m)")


def served_prompt_ids(zinfer_bin, tmp_path, template, msgs):
    """Serves Gemma 3 270M with --chat-template template; returns the prompt
    token ids, the text and the token ids of a 4-token greedy `messages`
    request's reply."""
    with serve_process(zinfer_bin, GEMMA3, tmp_path / "serve.log", "--threads-per-worker", 2,
                       "--slots", 2, "--ctx-size", 256, "--chat-template", template) as srv:
        with Client(srv.addr, timeout_s=120) as c:
            text, ids, final = c.complete(messages=msgs, echo=True,
                                          sampling_params={"max_new_tokens": 4,
                                                           "temperature": 0})
    return final["prompt_token_ids"], text, ids


@gemma
@pytest.mark.parametrize("kind", ["name", "file"])
def test_serve_gemma3_with_chat_template(zinfer_bin, tmp_path, kind):
    msgs = [S, U1]
    template = "gemma"
    if kind == "file":
        template = tmp_path / "g.jinja"
        template.write_text(subprocess.run(
            [str(zinfer_bin), "chat-template", "--chat-template", "gemma", "--print-template"],
            capture_output=True, text=True, check=True).stdout)
    prompt_ids, text, ids = served_prompt_ids(zinfer_bin, tmp_path, template, msgs)
    rc, rendered, err = render(zinfer_bin, "gemma", msgs, True, bos="<bos>", eos="<eos>")
    assert rc == 0, err
    want = run_zinfer_lines(zinfer_bin, GEMMA3, ["tokenize", "--parse-special",
                                                 "--no-add-special"], [json.dumps(rendered)])[0]
    assert prompt_ids == want
    assert prompt_ids[0] == 2  # <bos>, written by the template
    assert 1 <= len(ids) <= 4 and text.strip(), (text, ids)


@gemma
def test_serve_gemma3_without_template_names_the_option(zinfer_bin, tmp_path):
    with serve_process(zinfer_bin, GEMMA3, tmp_path / "serve.log", "--threads-per-worker", 2,
                       "--slots", 2, "--ctx-size", 256) as srv:
        with Client(srv.addr, timeout_s=120) as c:
            with pytest.raises(ZinferError) as e:
                c.complete(messages=[U1])
    assert e.value.code == "unsupported", e.value.reply
    msg = e.value.reply["message"]
    assert "the model has no chat template" in msg and "--chat-template FILE|NAME" in msg, msg
    assert ", ".join(NAMES) in msg, msg
