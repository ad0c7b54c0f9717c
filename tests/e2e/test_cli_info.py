"""`zinfer info`: what a GGUF file holds and the memory serving it takes.

The expected values are computed here from the file itself with the `gguf`
package (GGUFReader): parameter count, tensors and bytes per type, context
length, vocabulary, chat template. Files zinfer cannot run are written with
the package's GGUFWriter: tensor types zinfer has no kernel for (given as
raw bytes of the right size) and an unknown architecture; info must still
describe them and say why they cannot be loaded. Bad files (missing,
truncated) give the one-line error and exit 1.
"""

import json
import os
import re
import subprocess
from collections import defaultdict

import gguf
import gguf_meta
import numpy as np
import pytest
from conftest import run_each
from test_cli_errors import assert_one_line_error, write_model

# zinfer serve's and zinfer-worker's defaults; test_defaults_match_serve
# checks them against their --help.
SLOTS, CTX, BATCH, BLOCK = 8, 4096, 256, 16
# The share of MemAvailable the default memory budget may take
# (model_worker/mem_plan.h).
SHARE_PCT = 90

# The CPU backend's KV cache (kernels/cpu/cpu_backend.c): int16 K values
# with a float scale per row, float16 V values.
K_BYTES, V_BYTES, K_ROW_EXTRA = 2, 2, 4


# The default model's head size; the disk tier's default bound
# (--kv-disk-bytes) and a block file's header (model_worker/kv_disk.c).
HEAD_DIM = 64
DISK_BYTES = 4 << 30
DISK_HEADER = 144


def disk_expected(per_tok, max_bytes):
    """info's kv_disk: one block's file (header, its 16 token ids, the K/V
    of its 16 positions) and the blocks --kv-disk-bytes holds."""
    file_bytes = DISK_HEADER + BLOCK * 4 + BLOCK * per_tok
    return {"block_file_bytes": file_bytes, "max_bytes": max_bytes,
            "blocks": max_bytes // file_bytes, "tokens": max_bytes // file_bytes * BLOCK}


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def expected_info(path):
    """The values info must report, from the gguf package's reading."""
    r = gguf.GGUFReader(str(path))
    types = defaultdict(lambda: {"tensors": 0, "elements": 0, "bytes": 0})
    for t in r.tensors:
        s = types[t.tensor_type.name]
        s["tensors"] += 1
        s["elements"] += int(t.n_elements)
        s["bytes"] += int(t.n_bytes)
    arch = field(r, "general.architecture")
    tokens = field(r, "tokenizer.ggml.tokens")
    bos, eos = field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id")
    return {
        "reader": r,
        "arch": arch,
        "parameters": sum(int(t.n_elements) for t in r.tensors),
        "tensors": len(r.tensors),
        "tensor_bytes": sum(int(t.n_bytes) for t in r.tensors),
        "types": dict(types),
        "context_length": field(r, f"{arch}.context_length"),
        "chat_template": field(r, "tokenizer.chat_template"),
        "tokenizer": {
            "model": field(r, "tokenizer.ggml.model"),
            "vocab_size": len(tokens),
            "pre": field(r, "tokenizer.ggml.pre"),
            "bos_token_id": bos,
            "bos_token": tokens[bos],
            "eos_token_id": eos,
            "eos_token": tokens[eos],
        },
    }


def kv_bytes_per_token(r, arch):
    layers = field(r, f"{arch}.block_count")
    heads = field(r, f"{arch}.attention.head_count")
    kv_heads = field(r, f"{arch}.attention.head_count_kv") or heads
    head_dim = field(r, f"{arch}.attention.key_length") or field(
        r, f"{arch}.embedding_length") // heads
    return layers * kv_heads * (head_dim * (K_BYTES + V_BYTES) + K_ROW_EXTRA)


def work_bytes(r, arch):
    """The working buffers the default budget counts (model.c,
    zi_model_config_work_bytes): the activations of a --batch-size pass
    and --slots rows of logits, twice."""
    dim = field(r, f"{arch}.embedding_length")
    heads = field(r, f"{arch}.attention.head_count")
    kv_heads = field(r, f"{arch}.attention.head_count_kv") or heads
    head_dim = field(r, f"{arch}.attention.key_length") or dim // heads
    ffn = field(r, f"{arch}.feed_forward_length")
    vocab = next(int(t.shape[1]) for t in r.tensors if t.name == "token_embd.weight")
    act = BATCH * 4 * (4 * dim + 2 * heads * head_dim + 2 * kv_heads * head_dim + 2 * ffn)
    return act + 2 * SLOTS * 4 * vocab


def usable(avail):
    return avail // 100 * SHARE_PCT + avail % 100 * SHARE_PCT // 100


def info_json(run_zinfer, path):
    res = run_zinfer("info", "--model", path, "--json")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    lines = res.stdout.splitlines()
    assert len(lines) == 1, res.stdout
    return json.loads(lines[0])


@pytest.fixture(scope="session")
def expected(model_path):
    return expected_info(model_path)


def test_json_default_model(run_zinfer, model_path, expected):
    j = info_json(run_zinfer, model_path)
    r = expected["reader"]
    assert j["file"] == str(model_path)
    assert j["file_bytes"] == model_path.stat().st_size
    assert j["gguf_version"] == field(r, "GGUF.version")
    assert j["architecture"] == "llama"
    assert j["name"] == field(r, "general.name")
    assert j["hyperparameters"] == {
        "layers": field(r, "llama.block_count"),
        "embedding": field(r, "llama.embedding_length"),
        "feed_forward": field(r, "llama.feed_forward_length"),
        "heads": field(r, "llama.attention.head_count"),
        "kv_heads": field(r, "llama.attention.head_count_kv"),
        "head_dim": field(r, "llama.embedding_length") // field(r, "llama.attention.head_count"),
    }
    assert j["parameters"] == expected["parameters"]
    assert j["tensors"] == expected["tensors"]
    assert j["tensor_bytes"] == expected["tensor_bytes"]
    want_types = {k: dict(v, runnable=True) for k, v in expected["types"].items()}
    assert j["tensor_types"] == want_types
    assert j["unsupported_types"] == []
    assert j["context_length"] == expected["context_length"]
    assert j["chat_template"] is True
    assert j["chat_template_bytes"] == len(expected["chat_template"].encode())
    assert j["tokenizer"] == expected["tokenizer"]
    per_tok = kv_bytes_per_token(r, "llama")
    ctx = min(CTX, expected["context_length"])
    mem = dict(j["memory"])
    avail = mem.pop("available_bytes")
    assert isinstance(avail, int) and avail > 0
    assert mem.pop("usable_bytes") == usable(avail)
    work = work_bytes(r, "llama")
    total = expected["tensor_bytes"] + per_tok * ctx * SLOTS + work
    assert mem.pop("fits") is (total <= usable(avail))
    assert mem == {
        "backend": "cpu",
        "slots": SLOTS,
        "ctx_size": ctx,
        "block_size": BLOCK,
        "kv_bytes_per_token": per_tok,
        "kv_bytes_per_token_from": "metadata",
        "kv_type": "default",
        "kv_layout": {"k_row_bytes": HEAD_DIM * K_BYTES + K_ROW_EXTRA,
                      "v_row_bytes": HEAD_DIM * V_BYTES, "k_value_bytes": K_BYTES,
                      "k_row_scale_bytes": K_ROW_EXTRA, "v_value_bytes": V_BYTES},
        "kv_disk": disk_expected(per_tok, DISK_BYTES),
        "kv_bytes": per_tok * ctx * SLOTS,
        "weights_bytes": expected["tensor_bytes"],
        # Q4_1 and Q8_0 repack at the file's size (a Q4_K_M file's a little more)
        "weights_held_bytes": expected["tensor_bytes"],
        "work_bytes": work,
        "total_bytes": total,
    }
    assert j["runnable"] is True
    assert j["load_error"] is None


def test_default_model_is_the_other_commands(zinfer_bin, model_path):
    """Without --model, info reads $ZINFER_MODEL, as generate and serve do."""
    env = dict(os.environ, ZINFER_MODEL=str(model_path))
    res = subprocess.run([str(zinfer_bin), "info", "--json"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["file"] == str(model_path)


@pytest.mark.parametrize("cmd", [["info", "--json"], ["generate", "--prompt", "hi"],
                                 ["serve"]])
def test_packaged_model_names(zinfer_bin, model_path, tmp_path, cmd):
    """--model NAME is a packaged model's file under $ZINFER_HOME/models
    (scripts/fetch-model NAME); a name not fetched yet is one line naming
    the command that fetches it, from every command."""
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    os.symlink(model_path, home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    env = dict(os.environ, ZINFER_HOME=str(home))
    env.pop("ZINFER_MODEL", None)
    if cmd[0] == "info":
        res = subprocess.run([str(zinfer_bin)] + cmd + ["--model", "smollm2-135m"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["file"] == str(home / "models" /
                                                     "SmolLM2-135M-Instruct.Q4_1.gguf")
    res = subprocess.run([str(zinfer_bin)] + cmd + ["--model", "gemma3-270m"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode != 0
    assert_one_line_error(res, re.escape(f"--model gemma3-270m: {home}/models/"
                                         "gemma-3-270m-q4_k_m.gguf is not there (fetch it "
                                         "with scripts/fetch-model gemma3-270m)"))


def mib(b):
    return f"{b / 1048576:.1f} MiB"


def test_text_default_model(run_zinfer, model_path, expected):
    res = run_zinfer("info", "--model", model_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"^architecture\s+llama: 30 layers", out, re.M), out
    assert re.search(rf"^parameters\s+{expected['parameters']} \(134\.5 M\)", out, re.M), out
    assert re.search(rf"^tensors\s+{expected['tensors']}, {mib(expected['tensor_bytes'])} "
                     rf"\({expected['tensor_bytes']} bytes\)", out, re.M), out
    for name, s in expected["types"].items():
        plural = "" if s["tensors"] == 1 else "s"
        line = f"{name} +{s['tensors']} tensor{plural}, {mib(s['bytes'])} \\({s['bytes']} bytes\\)$"
        assert re.search(r"^  " + line, out, re.M), (line, out)
    tok = expected["tokenizer"]
    assert (f"gpt2, {tok['vocab_size']} tokens, pre-tokenizer {tok['pre']}, "
            f"BOS {tok['bos_token_id']} '{tok['bos_token']}', "
            f"EOS {tok['eos_token_id']} '{tok['eos_token']}'") in out
    assert re.search(rf"^chat template\s+present \({len(expected['chat_template'].encode())} "
                     r"bytes\)", out, re.M), out
    assert re.search(rf"^context length\s+{expected['context_length']} \(trained\)", out, re.M)
    per_tok = kv_bytes_per_token(expected["reader"], "llama")
    kv = per_tok * CTX * SLOTS
    work = work_bytes(expected["reader"], "llama")
    total = expected["tensor_bytes"] + kv + work
    # What the file needs: the weights, the KV cache per token in the CPU
    # cache's layout, the default budget at the defaults, and whether it
    # fits this machine.
    weights = expected["tensor_bytes"]
    assert re.search(rf"^weights\s+{re.escape(mib(weights))} \({weights} bytes\)$", out, re.M), out
    assert re.search(rf"^KV cache\s+{per_tok} bytes per token \({per_tok / 1024:.1f} KiB\): 30 "
                     r"layers x 3 KV heads x \(64 K values\n\s+as int16 \+ a float scale, 64 V "
                     r"values as float16\) on the CPU backend$", out, re.M), out
    assert (f"{SLOTS} slots x {CTX} positions x {per_tok} bytes per token = {mib(kv)}") in out
    assert re.search(rf"^worker memory\s+{re.escape(mib(total))} \({total} bytes\): "
                     rf"{re.escape(mib(weights))} weights \+ {re.escape(mib(kv))} KV cache\n"
                     rf"\s+\+ {re.escape(mib(work))} working buffers \(the default memory "
                     r"budget, at the defaults\)$", out, re.M), out
    assert re.search(rf"^this machine\s+fits: {re.escape(mib(total))} of \d+\.\d MiB usable "
                     rf"\({SHARE_PCT}% of MemAvailable \d+\.\d MiB\)$", out, re.M), out
    assert re.search(r"^zinfer runs it\s+yes", out, re.M), out
    assert "cannot run" not in out


@pytest.fixture(scope="session")
def odd_models(model_path, tmp_path_factory):
    """GGUF files with the real model's metadata that zinfer cannot run:
    tensor types it has no kernel for, and an unknown architecture."""
    d = tmp_path_factory.mktemp("info_models")
    reader = gguf_meta.read(str(model_path), tensors=False)  # metadata only, fast
    Q = gguf.GGMLQuantizationType
    norm = np.ones(576, dtype=np.float32)
    # Raw blocks, shape given in bytes: 2 rows of 512 elements of IQ2_XXS
    # (66-byte blocks of 256), 3 rows of 256 of IQ3_S (110 bytes a block).
    iq2 = np.zeros((2, 2 * 66), dtype=np.uint8)
    iq3 = np.full((3, 110), 7, dtype=np.uint8)
    out = {"iq": write_model(d / "iq.gguf", "llama", reader, [
        ("token_embd.weight", iq2, Q.IQ2_XXS),
        ("output_norm.weight", norm, None),
        ("blk.0.attn_q.weight", iq3, Q.IQ3_S),
    ])}
    # The same tensors under a one-key header, for the byte-by-byte test.
    w = gguf.GGUFWriter(str(d / "iq_small.gguf"), "llama")
    for name, a, t in [("token_embd.weight", iq2, Q.IQ2_XXS), ("output_norm.weight", norm, None),
                       ("blk.0.attn_q.weight", iq3, Q.IQ3_S)]:
        w.add_tensor(name, a, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out["iq_small"] = d / "iq_small.gguf"
    data = out["iq"].read_bytes()
    out["iq_trunc"] = d / "iq_trunc.gguf"
    out["iq_trunc"].write_bytes(data[:-40])  # cuts into the last tensor's data
    out["gpt9"] = write_model(d / "gpt9.gguf", "gpt9", reader,
                             [("token_embd.weight", np.zeros((4, 8), dtype=np.float32), None)],
                             rename_arch="gpt9")
    return out


def test_unsupported_types_are_described(run_zinfer, odd_models):
    path = odd_models["iq"]
    exp = expected_info(path)
    j = info_json(run_zinfer, path)
    assert j["tensor_types"] == {
        "F32": {"tensors": 1, "elements": 576, "bytes": 576 * 4, "runnable": True},
        "IQ2_XXS": {"tensors": 1, "elements": 1024, "bytes": 4 * 66, "runnable": False},
        "IQ3_S": {"tensors": 1, "elements": 768, "bytes": 330, "runnable": False},
    }
    # The same numbers as the gguf package reads from the file.
    assert j["tensor_types"] == {k: dict(v, runnable=(k == "F32"))
                                 for k, v in exp["types"].items()}
    assert j["parameters"] == exp["parameters"] == 576 + 1024 + 768
    assert j["tensors"] == 3
    assert j["tensor_bytes"] == exp["tensor_bytes"]
    assert j["unsupported_types"] == ["IQ2_XXS", "IQ3_S"]
    assert j["runnable"] is False
    assert re.search(r"token_embd\.weight.*IQ2_XXS", j["load_error"]), j["load_error"]
    assert path.name in j["load_error"]
    # What the metadata says is still there.
    assert j["architecture"] == "llama"
    assert j["context_length"] == exp["context_length"]
    assert j["tokenizer"] == exp["tokenizer"]
    assert j["chat_template"] is True
    assert j["memory"]["kv_bytes_per_token"] == kv_bytes_per_token(exp["reader"], "llama")
    assert j["memory"]["weights_bytes"] == exp["tensor_bytes"]

    res = run_zinfer("info", "--model", path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"^  IQ2_XXS +1 tensor, 0\.0 MiB \(264 bytes\); zinfer cannot run this "
                     r"type yet$", out, re.M), out
    assert re.search(r"^  IQ3_S +1 tensor, .*cannot run", out, re.M), out
    assert re.search(r"^zinfer runs it\s+no: .*token_embd\.weight.*IQ2_XXS", out, re.M), out


def test_unknown_type_number(run_zinfer, odd_models, tmp_path):
    """A type number ggml does not define is named by its number; its bytes,
    and so the weights' total, are unknown (null), the rest still counted."""
    src = odd_models["iq_small"]
    r = gguf.GGUFReader(str(src))
    t = r.tensors[2]  # blk.0.attn_q.weight, IQ3_S
    type_at = t.field.offset + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape)
    data = bytearray(src.read_bytes())
    assert int.from_bytes(data[type_at:type_at + 4], "little") == gguf.GGMLQuantizationType.IQ3_S
    data[type_at:type_at + 4] = (200).to_bytes(4, "little")
    path = tmp_path / "type200.gguf"
    path.write_bytes(data)
    j = info_json(run_zinfer, path)
    assert j["tensor_types"]["type 200"] == {"tensors": 1, "elements": 768, "bytes": None,
                                             "runnable": False}
    assert j["unsupported_types"] == ["IQ2_XXS", "type 200"]
    assert j["parameters"] == 576 + 1024 + 768
    assert j["tensor_bytes"] is None and j["memory"]["weights_bytes"] is None
    assert "IQ2_XXS" in j["load_error"]  # the reader stops at the first
    out = run_zinfer("info", "--model", path).stdout
    assert re.search(r"^  type 200 +1 tensor; zinfer cannot run this type yet$", out, re.M), out


def test_unsupported_types_truncated(run_zinfer, odd_models):
    """The tensor table of a file the reader refuses is checked as the reader
    checks it: data past the end of the file is an error."""
    res = run_zinfer("info", "--model", odd_models["iq_trunc"])
    assert res.returncode == 1
    assert_one_line_error(res, re.escape(odd_models["iq_trunc"].name), "past end of file")


def test_corrupt_tensor_table_of_a_refused_file(run_zinfer, odd_models, tmp_path):
    """info walks the tensor table of a file the reader refuses by itself:
    every byte of that table set to 0x00, 0x7f or 0xff gives a description
    (exit 0, one JSON object) or the one-line error (exit 1), never a crash
    or a hang."""
    src = odd_models["iq_small"]
    r = gguf.GGUFReader(str(src))
    start, end = r.tensors[0].field.offset, r.data_offset
    data = bytearray(src.read_bytes())
    outcomes = defaultdict(int)
    mutants = []
    for pos in range(start, end):
        for value in (0x00, 0x7F, 0xFF):
            if data[pos] == value:
                continue
            mutant = bytearray(data)
            mutant[pos] = value
            path = tmp_path / f"mutant-{pos}-{value:02x}.gguf"
            path.write_bytes(mutant)
            mutants.append((pos, value, path))
    # hundreds of short runs: two at a time (the one-line error names each file)
    runs = run_each(lambda *a: run_zinfer(*a, timeout=20),
                    [("info", "--model", path, "--json") for _, _, path in mutants],
                    one_thread=False)
    for (pos, value, path), res in zip(mutants, runs):
        where = f"byte {pos} = {value:#x}"
        if res.returncode == 0:
            assert isinstance(json.loads(res.stdout)["parameters"], int), where
        else:
            assert res.returncode == 1 and res.stdout == "", (where, res.stderr)
            assert_one_line_error(res, re.escape(path.name))
        outcomes[res.returncode] += 1
    assert outcomes[0] > 0 and outcomes[1] > 0, dict(outcomes)


def test_unknown_architecture_is_described(run_zinfer, odd_models):
    j = info_json(run_zinfer, odd_models["gpt9"])
    assert j["architecture"] == "gpt9"
    assert j["context_length"] == 8192
    assert j["parameters"] == 32
    assert j["runnable"] is False
    assert re.search(r"gpt9.*architecture|architecture.*gpt9", j["load_error"]), j["load_error"]
    assert j["hyperparameters"] is None
    assert j["memory"]["kv_bytes"] is None and j["memory"]["weights_bytes"] == 128
    out = run_zinfer("info", "--model", odd_models["gpt9"]).stdout
    assert re.search(r"^worker memory\s+0\.0 MiB \(128 bytes\) of weights; the KV cache's size "
                     r"is unknown", out, re.M), out
    assert re.search(r"^zinfer runs it\s+no: .*unsupported architecture 'gpt9'", out, re.M), out


def test_missing_file(run_zinfer, tmp_path):
    missing = tmp_path / "no_such_model.gguf"
    for extra in ([], ["--json"]):
        res = run_zinfer("info", "--model", missing, *extra)
        assert res.returncode == 1
        assert res.stdout == ""
        assert_one_line_error(res, re.escape(str(missing)))


@pytest.mark.parametrize("size", [1000, 50 * 1000 * 1000])
def test_truncated_file(run_zinfer, model_path, tmp_path, size):
    path = tmp_path / f"trunc_{size}.gguf"
    path.write_bytes(model_path.read_bytes()[:size])
    res = run_zinfer("info", "--model", path, "--json")
    assert res.returncode == 1
    assert res.stdout == ""
    assert_one_line_error(res, re.escape(path.name), r"truncat|past end of file")


@pytest.mark.parametrize("args,pattern", [
    (["--bogus"], "--bogus"),
    (["--model"], "--model needs a path"),
])
def test_bad_usage(run_zinfer, args, pattern):
    res = run_zinfer("info", *args)
    assert res.returncode == 2
    assert_one_line_error(res, re.escape(pattern))


def test_help(run_zinfer):
    res = run_zinfer("info", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: zinfer info")
    # Every JSON key is documented.
    for key in ["file_bytes", "gguf_version", "architecture", "hyperparameters", "parameters",
                "tensor_bytes", "tensor_types", "runnable", "unsupported_types",
                "context_length", "chat_template_bytes", "vocab_size", "bos_token_id",
                "kv_bytes_per_token_from", "total_bytes", "load_error", "kv_layout",
                "k_value_bytes", "k_row_scale_bytes", "v_value_bytes", "work_bytes",
                "available_bytes", "usable_bytes", "fits", "block_size",
                "weights_held_bytes", "kv_type", "k_row_bytes", "v_row_bytes", "kv_disk",
                "block_file_bytes", "max_bytes", "--kv-type", "--kv-disk-bytes"]:
        assert key in res.stdout, key
    main = run_zinfer("--help")
    assert re.search(r"^  info\s+describe a GGUF file", main.stdout, re.M), main.stdout


def test_defaults_match_serve(run_zinfer, zinfer_bin):
    """The slots and context info sizes the KV cache for are serve's and the
    worker's defaults."""
    serve = run_zinfer("serve", "--help").stdout
    worker = subprocess.run([str(zinfer_bin.parent / "zinfer-worker"), "--help"],
                            capture_output=True, text=True, timeout=30).stdout
    for text in (serve, worker):
        assert re.search(rf"--slots N .*\(default {SLOTS}\)", text), text
        assert re.search(rf"--ctx-size N .*\(default {CTX}", text), text


@pytest.mark.parametrize("kv_type,row", [("f16", lambda hd: hd * 2),
                                         ("q8_0", lambda hd: hd // 32 * 34),
                                         ("q4_0", lambda hd: hd // 32 * 18)])
def test_kv_type_and_disk_tier(run_zinfer, model_path, expected, kv_type, row):
    """--kv-type sizes the KV cache as the worker does (test_kv_type checks
    the worker's log with the same formula), and the budget with it;
    --kv-disk-bytes says how many blocks the disk tier holds (the block
    file's size is checked against a real one in test_kv_disk)."""
    res = run_zinfer("info", "--model", model_path, "--json", "--kv-type", kv_type,
                     "--kv-disk-bytes", "1G")
    assert res.returncode == 0, res.stderr
    mem = json.loads(res.stdout)["memory"]
    r = expected["reader"]
    layers, kv_heads = field(r, "llama.block_count"), field(r, "llama.attention.head_count_kv")
    per_tok = layers * kv_heads * 2 * row(HEAD_DIM)
    ctx = min(CTX, expected["context_length"])
    assert mem["kv_type"] == kv_type
    assert mem["kv_bytes_per_token"] == per_tok
    assert mem["kv_layout"] == {"k_row_bytes": row(HEAD_DIM), "v_row_bytes": row(HEAD_DIM),
                                "k_value_bytes": None, "k_row_scale_bytes": None,
                                "v_value_bytes": None}
    assert mem["kv_bytes"] == per_tok * ctx * SLOTS
    assert mem["total_bytes"] == (expected["tensor_bytes"] + per_tok * ctx * SLOTS
                                  + work_bytes(r, "llama"))
    assert mem["kv_disk"] == disk_expected(per_tok, 1 << 30)
    out = run_zinfer("info", "--model", model_path, "--kv-type", kv_type).stdout
    assert re.search(rf"^KV cache\s+{per_tok} bytes per token .*\n.*--kv-type {kv_type}\)", out,
                     re.M), out
    d = disk_expected(per_tok, DISK_BYTES)
    assert re.search(rf"^disk tier\s+a block of 16 positions in a {d['block_file_bytes']}-byte "
                     rf"file \(--kv-disk\); --kv-disk-bytes\n\s+4096\.0 MiB holds "
                     rf"{d['blocks']} blocks \({d['tokens']} positions\)$", out, re.M), out
    bad = run_zinfer("info", "--model", model_path, "--kv-type", "q5_0")
    assert bad.returncode == 2
    assert_one_line_error(bad, re.escape("--kv-type: 'q5_0' is not default, f16, q8_0 or q4_0"))


def test_memory_that_does_not_fit(run_zinfer, model_path, tmp_path):
    """A file whose KV cache alone exceeds any machine (the default
    model's metadata with 16,000,000 layers, one small tensor): info says
    it does not fit, with the numbers and the flags to change."""
    from gguf_files import write_gguf
    from test_cli_errors import metadata_of
    reader = gguf_meta.read(str(model_path), tensors=False)
    rows = [(k, 16_000_000 if k == "llama.block_count" else v, t, s)
            for k, v, t, s in metadata_of(reader)]
    path = write_gguf(tmp_path / "deep.gguf", "llama", rows, tensors=[
        ("token_embd.weight", np.zeros((4, 576), dtype=np.float32), None)])
    j = info_json(run_zinfer, path)
    per_tok = 16_000_000 * 3 * (64 * (K_BYTES + V_BYTES) + K_ROW_EXTRA)
    assert j["memory"]["kv_bytes_per_token"] == per_tok
    assert j["memory"]["total_bytes"] > j["memory"]["usable_bytes"]
    assert j["memory"]["fits"] is False
    out = run_zinfer("info", "--model", path).stdout
    assert re.search(rf"^this machine\s+does not fit: needs {re.escape(mib(j['memory']['total_bytes']))}"
                     rf", \d+\.\d MiB usable \({SHARE_PCT}% of MemAvailable\n\s+\d+\.\d MiB\); "
                     r"serve it with a smaller --ctx-size or --slots$", out, re.M), out
