"""Writing small GGUF files for the end-to-end tests.

The family tests (test_families.py, test_families_rope.py), Gemma 3's
tiny-model tests and the CLI error tests all write GGUF files with the
`gguf` package: metadata rows copied from a real file (a vocabulary, a
model), hyper-parameters under the architecture's prefix, and tensors
either as arrays gguf stores as they are or as raw quantized blocks.

cached_write keeps the random-weight files the writers make (moe_files,
hybrid_files, vision_files, ...) in refcache's test-file cache
($ZINFER_HOME/testfiles), so a file is drawn and written once, not once
per run and again in the sanitizer pass.
"""

import enum
import os
import struct
from collections.abc import Mapping, Sequence

import gguf
import gguf_meta  # scripts/ref (conftest puts it on the path)
import numpy as np
import refcache

_ROWS = {}


def _canonical(v):
    """v with paths replaced by their files' sha256 (an input file's
    contents, not its name, make the output), enums by their values, for
    refcache's key; anything else refcache cannot key raises TypeError."""
    if isinstance(v, os.PathLike):
        return "file:" + refcache.file_sha256(v)
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return "dtype:" + np.dtype(v).str
    if isinstance(v, Mapping):
        return {str(k): _canonical(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)) and not (
            isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) for x in v)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return [_canonical(x) for x in items]
    return v


def cached_write(path, what, args, write, sources=()):
    """write(path) through refcache.cached_file: what names the writer,
    args are everything its file depends on besides the code (input files
    as paths), sources the writer's own modules' files (this one is
    added). Returns path."""
    try:
        parts = (what, _canonical(args))
    except OSError:  # an input file that is not there: let the writer say so
        write(str(path))
        return path
    refcache.cached_file(path, parts, write, sources=(__file__, *sources))
    return path


class LazyTensors(Mapping):
    """A writer's tensors dict, drawn on first use: a file that came from
    the cache needs none, and the callers that ignore them (most) never pay
    for drawing them."""

    def __init__(self, make):
        self._make, self._t = make, None

    def _get(self):
        if self._t is None:
            self._t = self._make()
        return self._t

    def __getitem__(self, k):
        return self._get()[k]

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self._get())


class _Writer(gguf.GGUFWriter):
    """GGUFWriter, the same bytes, with long typed arrays packed at once:
    gguf packs a vocabulary's ~150,000 strings (and merges, types) one call
    chain per item, 3 s a file, and the tests write hundreds of files."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        T = gguf.GGUFValueType
        if (vtype != T.ARRAY or sub_type is None or not isinstance(val, Sequence)
                or isinstance(val, (str, bytes)) or len(val) < 64):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        e = "<" if self.endianess == gguf.GGUFEndian.LITTLE else ">"
        head = (struct.pack(e + "I", vtype) if add_vtype else b"") + struct.pack(
            e + "IQ", sub_type, len(val))
        if sub_type == T.STRING:
            enc = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
            q = struct.Struct(e + "Q").pack
            return head + b"".join([b for v in enc for b in (q(len(v)), v)])
        fmt = self._simple_value_packing.get(sub_type)
        if fmt is None:  # arrays of arrays: gguf's own way
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        return head + struct.pack(f"{e}{len(val)}{fmt}", *val)


def metadata_rows(path, prefix=None, skip=("GGUF.", "general.architecture")):
    """The metadata of the GGUF at path as (key, value, type, sub_type)
    rows, GGUFWriter.add_key_value's arguments: the keys starting with
    prefix (all when None) but not with any of skip. Read once per session
    per (path, prefix) with gguf_meta (GGUFReader takes seconds on a
    large vocabulary)."""
    cache_key = (str(path), prefix, skip)
    if cache_key not in _ROWS:
        fields = gguf_meta.read(str(path), tensors=False).fields
        rows = [(k, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
                for k, f in fields.items()
                if not k.startswith(tuple(skip)) and (not prefix or k.startswith(prefix))]
        tokens = fields.get("tokenizer.ggml.tokens")
        _ROWS[cache_key] = (rows, len(tokens.data) if tokens is not None else 0)
    return _ROWS[cache_key]


def tokenizer_rows(path):
    """The tokenizer.* keys of the GGUF at path, and its vocabulary size."""
    return metadata_rows(path, prefix="tokenizer.")


def write_gguf(path, arch, rows=(), hparams=None, tensors=(), drop=()):
    """Writes a GGUF of architecture arch: the metadata rows, then hparams
    (name -> value, written as '<arch>.<name>': str, bool, float32,
    uint32, or a list as an int32 array),
    then tensors ((name, data, raw_dtype) triples, or a dict name ->
    (data, raw_dtype); raw_dtype None stores data as the array it is),
    leaving out the names in drop. Returns path."""
    w = _Writer(str(path), arch)
    for key, value, vtype, sub in rows:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for k, v in (hparams or {}).items():
        if isinstance(v, str):
            w.add_string(f"{arch}.{k}", v)
        elif isinstance(v, bool):  # before int: bool is an int
            w.add_bool(f"{arch}.{k}", v)
        elif isinstance(v, (list, tuple)):  # per-layer arrays (int32, as converters write)
            w.add_array(f"{arch}.{k}", list(v))
        elif isinstance(v, float):
            w.add_float32(f"{arch}.{k}", v)
        else:
            w.add_uint32(f"{arch}.{k}", v)
    items = tensors.items() if isinstance(tensors, Mapping) else ((n, (d, r)) for n, d, r in tensors)
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
    probe = gguf_meta.dequantize(draw(1.0 / 1024), qtype)  # gguf-py's values, faster
    rng.bit_generator.state = state  # the same codes, rescaled
    d = sigma / (float(np.std(probe)) * 1024)
    return draw(d).reshape(rows, -1)



def encoder_tensors(rng, arch, n_vocab, n_embd, n_ff, n_layer, n_ctx, n_types=2):
    """Random float32 tensors of a llama.cpp encoder, `bert` or `nomic-bert`
    (name -> array, numpy shape [rows, cols] = GGUF [cols, rows]):
    matrices of scale 1/sqrt(cols) so that activations stay O(1),
    LayerNorm weights near 1, small biases. bert: separate Q/K/V, learned
    positions, biases, an ungated feed-forward; nomic-bert: fused QKV, no
    positions (RoPE), no biases, gate and up."""
    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vec(n, centre=0.0, sigma=0.1):
        return (centre + sigma * rng.standard_normal(n)).astype(np.float32)

    bert = arch == "bert"
    t = {"token_embd.weight": (0.5 * rng.standard_normal((n_vocab, n_embd))).astype(np.float32),
         "token_types.weight": (0.5 * rng.standard_normal((n_types, n_embd))).astype(np.float32),
         "token_embd_norm.weight": vec(n_embd, 1.0), "token_embd_norm.bias": vec(n_embd)}
    if bert:
        t["position_embd.weight"] = (0.5 * rng.standard_normal((n_ctx, n_embd))).astype(np.float32)
    for i in range(n_layer):
        b = f"blk.{i}."
        if bert:
            for w in ("attn_q", "attn_k", "attn_v"):
                t[b + w + ".weight"], t[b + w + ".bias"] = mat(n_embd, n_embd), vec(n_embd)
            t[b + "attn_output.bias"] = vec(n_embd)
            t[b + "ffn_up.bias"], t[b + "ffn_down.bias"] = vec(n_ff), vec(n_embd)
        else:
            t[b + "attn_qkv.weight"] = mat(3 * n_embd, n_embd)
            t[b + "ffn_gate.weight"] = mat(n_ff, n_embd)
        t[b + "attn_output.weight"] = mat(n_embd, n_embd)
        t[b + "ffn_up.weight"], t[b + "ffn_down.weight"] = mat(n_ff, n_embd), mat(n_embd, n_ff)
        for n in ("attn_output_norm", "layer_output_norm"):
            t[b + n + ".weight"], t[b + n + ".bias"] = vec(n_embd, 1.0), vec(n_embd)
    return t


def write_encoder(path, vocab_path, arch="bert", n_embd=128, n_ff=256, n_layer=3, n_head=4,
                  n_ctx=512, pooling=2, eps=1e-12, rope_base=1000.0, seed=0):
    """A random-weight encoder GGUF (`bert` or `nomic-bert`) with the
    tokenizer of vocab_path (e.g. llama.cpp's ggml-vocab-bert-bge.gguf);
    pooling is {arch}.pooling_type (llama.cpp's values: 1 mean, 2 cls).
    Returns (path, tensors)."""
    rows, n_vocab = tokenizer_rows(vocab_path)
    tensors = encoder_tensors(np.random.default_rng(seed), arch, n_vocab, n_embd, n_ff, n_layer,
                              n_ctx)
    hp = {"context_length": n_ctx, "embedding_length": n_embd, "feed_forward_length": n_ff,
          "block_count": n_layer, "attention.head_count": n_head,
          "attention.layer_norm_epsilon": float(eps), "pooling_type": pooling}
    if arch != "bert":
        hp["rope.freq_base"] = float(rope_base)
    w_rows = list(rows) + [(f"{arch}.attention.causal", False, gguf.GGUFValueType.BOOL, None)]
    if not any(r[0] == "tokenizer.ggml.token_type_count" for r in rows):
        w_rows.append(("tokenizer.ggml.token_type_count", 2, gguf.GGUFValueType.UINT32, None))
    write_gguf(path, arch, w_rows, hp, {k: (v, None) for k, v in tensors.items()})
    return path, tensors


def stored(w, qtype):
    """(array, raw_dtype) for GGUFWriter.add_tensor: float32 w as qtype
    (F32 and F16 as arrays, the rest quantized by gguf.quants)."""
    Q = gguf.GGMLQuantizationType
    if qtype == Q.F32:
        return w, None
    if qtype == Q.F16:
        return w.astype(np.float16), None
    return gguf.quants.quantize(w, qtype), qtype


def write_random_llama(path, rows, n_vocab, seed=7, drop=None):
    """A 2-layer llama of width 64 (4 heads, 2 KV heads, feed-forward 128,
    context 512) with random Q8_0 weights drawn from seed, whose vocabulary
    of n_vocab tokens is described by the tokenizer.* rows; without the
    tensor `drop` when one is named (a file a worker refuses). The model
    tests' way of writing one for a given vocabulary."""
    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)
    D, FF, NH, NKV, L = 64, 128, 4, 2, 2
    hd = D // NH

    def mat(r, c, sigma=None):
        return stored((rng.standard_normal((r, c)) * (sigma or 1.0 / np.sqrt(c)))
                      .astype(np.float32), Q.Q8_0)

    def norm():
        return (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32), None

    t = {"token_embd.weight": mat(n_vocab, D, 0.3), "output_norm.weight": norm()}
    for i in range(L):
        t.update({f"blk.{i}.attn_norm.weight": norm(), f"blk.{i}.ffn_norm.weight": norm(),
                  f"blk.{i}.attn_q.weight": mat(D, D), f"blk.{i}.attn_k.weight": mat(NKV * hd, D),
                  f"blk.{i}.attn_v.weight": mat(NKV * hd, D),
                  f"blk.{i}.attn_output.weight": mat(D, D),
                  f"blk.{i}.ffn_gate.weight": mat(FF, D), f"blk.{i}.ffn_up.weight": mat(FF, D),
                  f"blk.{i}.ffn_down.weight": mat(D, FF)})
    t.pop(drop, None)
    hp = {"block_count": L, "context_length": 512, "embedding_length": D,
          "feed_forward_length": FF, "attention.head_count": NH, "attention.head_count_kv": NKV,
          "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-5}
    return write_gguf(path, "llama", rows, hp, t)
