"""zinfer's command line on bad input: every failure exits non-zero (not by a
signal) with exactly one line on stderr that names the problem; --help works.

The bad model files are made here: truncated copies of the real model, a text
file, and tiny GGUF files written with the `gguf` package's GGUFWriter that
carry the real model's metadata but an unknown architecture or a tensor type
zinfer does not implement.
"""

import re

import gguf
import gguf_meta
from gguf_files import write_gguf
import numpy as np
import pytest
from conftest import free_port_pair, ids_arg

MODEL_CMDS = {
    "generate": lambda m, out: ["generate", "--model", m, "--prompt-ids", "1,2,3",
                                "--max-tokens", "1", "--temperature", "0"],
    "logits": lambda m, out: ["logits", "--model", m, "--prompt-ids", "1,2,3", "--out", out],
}


def assert_one_line_error(res, *patterns):
    """Non-zero exit, not a crash, one stderr line matching every pattern."""
    err = res.stderr.strip()
    assert res.returncode > 0, f"exit status {res.returncode} (want > 0); stderr: {err!r}"
    assert res.returncode < 128, f"exit status {res.returncode} looks like a crash: {err!r}"
    lines = err.splitlines()
    assert len(lines) == 1, f"want exactly one stderr line, got {len(lines)}: {err!r}"
    for p in patterns:
        assert re.search(p, lines[0], re.IGNORECASE), f"{p!r} not in {lines[0]!r}"
    return lines[0]


def metadata_of(reader, rename_arch=None):
    """Every metadata key of reader as write_gguf rows (bar the header keys
    and general.architecture, which GGUFWriter writes itself); with
    rename_arch, 'llama.*' keys become '<rename_arch>.*'."""
    rows = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        if rename_arch and key.startswith("llama."):
            key = rename_arch + key[len("llama"):]
        rows.append((key, field.contents(), vtype, sub))
    return rows


def write_model(path, arch, reader, tensors, rename_arch=None):
    """A GGUF of arch with reader's metadata and tensors ((name, data,
    raw_dtype) triples)."""
    return write_gguf(path, arch, metadata_of(reader, rename_arch), tensors=tensors)


@pytest.fixture(scope="session")
def bad_models(model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_models")
    data = model_path.read_bytes()
    out = {}
    out["trunc_1k"] = d / "trunc_1k.gguf"
    out["trunc_1k"].write_bytes(data[:1000])
    out["trunc_50m"] = d / "trunc_50m.gguf"
    out["trunc_50m"].write_bytes(data[:50 * 1000 * 1000])
    out["text"] = d / "notes.gguf"
    out["text"].write_text("This is a text file, not a model.\n" * 20)
    reader = gguf_meta.read(str(model_path), tensors=False)  # metadata only, fast
    tiny = np.zeros((4, 8), dtype=np.float32)
    out["gpt9"] = write_model(d / "gpt9.gguf", "gpt9", reader,
                             [("token_embd.weight", tiny, None)], rename_arch="gpt9")
    # IQ2_XXS: 256 elements in a 66-byte block; shape given in bytes.
    iq2 = np.zeros((1, 66), dtype=np.uint8)
    out["iq2_xxs"] = write_model(d / "iq2_xxs.gguf", "llama", reader,
                                [("token_embd.weight", iq2, gguf.GGMLQuantizationType.IQ2_XXS)])
    i8 = np.zeros((2, 32), dtype=np.int8)
    out["i8"] = write_model(d / "i8.gguf", "llama", reader,
                           [("token_embd.weight", i8, gguf.GGMLQuantizationType.I8)])
    return out


@pytest.mark.parametrize("cmd", MODEL_CMDS)
def test_missing_model_file(cmd, run_zinfer, tmp_path):
    missing = tmp_path / "no_such_model.gguf"
    res = run_zinfer(*MODEL_CMDS[cmd](missing, tmp_path / "out.f32"))
    assert_one_line_error(res, re.escape(str(missing)))


@pytest.mark.parametrize("cmd", MODEL_CMDS)
@pytest.mark.parametrize("which", ["trunc_1k", "trunc_50m"])
def test_truncated_model_file(cmd, which, bad_models, run_zinfer, tmp_path):
    path = bad_models[which]
    res = run_zinfer(*MODEL_CMDS[cmd](path, tmp_path / "out.f32"))
    assert_one_line_error(res, re.escape(path.name),
                          r"truncat|offset|beyond|past|short|size|end of file|exceed")


@pytest.mark.parametrize("cmd", MODEL_CMDS)
def test_not_a_gguf_file(cmd, bad_models, run_zinfer, tmp_path):
    path = bad_models["text"]
    res = run_zinfer(*MODEL_CMDS[cmd](path, tmp_path / "out.f32"))
    assert_one_line_error(res, re.escape(path.name), r"gguf|magic")


def test_unsupported_architecture(bad_models, run_zinfer, tmp_path):
    res = run_zinfer(*MODEL_CMDS["generate"](bad_models["gpt9"], tmp_path / "o"))
    assert_one_line_error(res, "gpt9", "architecture")


@pytest.mark.parametrize("which,type_re", [("iq2_xxs", r"IQ2_XXS|\b16\b"), ("i8", r"\bI8\b|\b24\b")])
def test_unsupported_tensor_type(which, type_re, bad_models, run_zinfer, tmp_path):
    res = run_zinfer(*MODEL_CMDS["generate"](bad_models[which], tmp_path / "o"))
    assert_one_line_error(res, "token_embd.weight", type_re)


@pytest.mark.parametrize("cmd", MODEL_CMDS)
def test_prompt_longer_than_context(cmd, model_path, run_zinfer, tmp_path):
    args = MODEL_CMDS[cmd](model_path, tmp_path / "out.f32")
    i = args.index("--prompt-ids")
    args[i + 1] = ids_arg([100 + k for k in range(100)])
    res = run_zinfer(*args, "--ctx-size", "64")
    assert_one_line_error(res, "context")


@pytest.mark.parametrize("flags,pattern", [
    (["--max-tokens", "-1"], "max-tokens"),
    (["--temperature", "abc"], "temperature"),
    (["--bogus-flag"], "--bogus-flag"),
    (["--prompt-ids", "1,x,3"], "prompt-ids"),
])
def test_bad_flag_values(flags, pattern, model_path, run_zinfer):
    args = ["generate", "--model", model_path, "--max-tokens", "4"]
    if "--prompt-ids" not in flags:
        args += ["--prompt-ids", "1,2,3"]
    if "--max-tokens" in flags:
        args = args[:3] + args[5:]
    args += flags
    res = run_zinfer(*args)
    assert_one_line_error(res, re.escape(pattern))


@pytest.mark.parametrize("flags,pattern", [
    (["--block-size", "5000"], r"--block-size: '5000' is not an integer in 1\.\.4096"),
    (["--batch-size", "70000"], r"--batch-size: '70000' is not an integer in 1\.\.65536"),
    (["--kv-cache-tokens", "100", "--kv-cache-bytes", "1M"], "not both"),
])
def test_serve_refuses_what_a_worker_would(flags, pattern, model_path, run_zinfer):
    """`zinfer serve` checks the worker options with the worker's own ranges
    before starting anything (a value it let through would make every worker
    exit at start). On free ports and with a short timeout, so that were
    the check to go, the server would not hang on a port in use."""
    port, backend = free_port_pair()
    res = run_zinfer("serve", "--model", model_path, "--bind", f"tcp://127.0.0.1:{port}",
                     "--backend", f"tcp://127.0.0.1:{backend}", *flags, timeout=15)
    assert_one_line_error(res, pattern)


def test_unknown_subcommand(run_zinfer):
    assert_one_line_error(run_zinfer("frobnicate"), "frobnicate")


@pytest.mark.parametrize("sub", [None, "generate", "logits", "bench"])
def test_help_exits_zero(sub, run_zinfer):
    res = run_zinfer(*([sub] if sub else []), "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip(), "--help printed nothing on stdout"
    if sub:
        assert sub in res.stdout
