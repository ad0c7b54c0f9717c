"""Writing small GGUF files for the end-to-end tests.

The family tests (test_families.py, test_families_rope.py), Gemma 3's
tiny-model tests and the CLI error tests all write GGUF files with the
`gguf` package: metadata rows copied from a real file (a vocabulary, a
model), hyper-parameters under the architecture's prefix, and tensors
either as arrays gguf stores as they are or as raw quantized blocks.
"""

import gguf
import numpy as np

_ROWS = {}


def metadata_rows(path, prefix=None, skip=("GGUF.", "general.architecture")):
    """The metadata of the GGUF at path as (key, value, type, sub_type)
    rows, GGUFWriter.add_key_value's arguments: the keys starting with
    prefix (all when None) but not with any of skip. Read once per session
    per (path, prefix) (a 262144-token vocabulary takes seconds)."""
    cache_key = (str(path), prefix, skip)
    if cache_key not in _ROWS:
        r = gguf.GGUFReader(str(path))
        rows = []
        for key, field in r.fields.items():
            if key.startswith(tuple(skip)) or (prefix and not key.startswith(prefix)):
                continue
            vtype = field.types[0]
            sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
            rows.append((key, field.contents(), vtype, sub))
        tokens = r.fields.get("tokenizer.ggml.tokens")
        _ROWS[cache_key] = (rows, len(tokens.data) if tokens is not None else 0)
    return _ROWS[cache_key]


def tokenizer_rows(path):
    """The tokenizer.* keys of the GGUF at path, and its vocabulary size."""
    return metadata_rows(path, prefix="tokenizer.")


def write_gguf(path, arch, rows=(), hparams=None, tensors=(), drop=()):
    """Writes a GGUF of architecture arch: the metadata rows, then hparams
    (name -> value, written as '<arch>.<name>': str, float32 or uint32),
    then tensors ((name, data, raw_dtype) triples, or a dict name ->
    (data, raw_dtype); raw_dtype None stores data as the array it is),
    leaving out the names in drop. Returns path."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value, vtype, sub in rows:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for k, v in (hparams or {}).items():
        if isinstance(v, str):
            w.add_string(f"{arch}.{k}", v)
        elif isinstance(v, float):
            w.add_float32(f"{arch}.{k}", v)
        else:
            w.add_uint32(f"{arch}.{k}", v)
    items = tensors.items() if isinstance(tensors, dict) else ((n, (d, r)) for n, d, r in tensors)
    for name, (data, raw) in items:
        if name in drop:
            continue
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def kquant_bytes(rng, qtype, rows, cols, sigma):
    """rows x cols of Q4_K / Q6_K drawn as block bytes (gguf cannot quantize
    K types): random codes and sub-block scales, the super-block scale d
    chosen so that the weights' standard deviation is ~sigma."""
    nb = rows * cols // 256

    def draw(d):
        dd = np.full((nb, 1), d, np.float16).view(np.uint8)
        if qtype == gguf.GGMLQuantizationType.Q6_K:  # ql[128], qh[64], int8 scales[16], f16 d
            ql = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
            qh = rng.integers(0, 256, (nb, 64), dtype=np.uint8)
            sc = rng.integers(1, 32, (nb, 16), dtype=np.int8).view(np.uint8)
            return np.concatenate([ql, qh, sc, dd], axis=1)
        # Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, qs[128]
        dmin = np.full((nb, 1), 7.5 * d, np.float16).view(np.uint8)
        sc = rng.integers(0, 256, (nb, 12), dtype=np.uint8)
        qs = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
        return np.concatenate([dd, dmin, sc, qs], axis=1)

    state = rng.bit_generator.state
    probe = gguf.quants.dequantize(draw(1.0 / 1024), qtype)
    rng.bit_generator.state = state  # the same codes, rescaled
    d = sigma / (float(np.std(probe)) * 1024)
    return draw(d).reshape(rows, -1)
