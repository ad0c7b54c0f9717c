"""gguf_meta - a GGUF file's metadata and tensors, read quickly.

What the PyPI `gguf` package's GGUFReader gives (fields whose contents()
are Python values, tensors with name, shape, tensor_type and a numpy view
of their bytes), for the references and tests. GGUFReader builds numpy
views for every element of every array: a 128k-token vocabulary with its
merges takes it ~10 s here and Gemma 3's 262k tokens ~15 s, for each file
a test opens; reading the same bytes with struct takes a fraction of a
second. The tensors are views into one np.memmap of the file, laid out as
GGUFReader lays them out (float and integer types typed, the others as
rows of raw bytes), so gguf.quants.dequantize takes them as they are.

    r = gguf_meta.read(path)
    r.fields["general.architecture"].contents()   # 'llama'
    len(r.fields["tokenizer.ggml.tokens"].data)    # the vocabulary's size
    for t in r.tensors: t.name, t.shape, t.tensor_type, t.data
"""

import mmap
import struct

import gguf
import numpy as np

# Fixed-size GGUF value types (gguf.GGUFValueType) as struct codes.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
_STRING, _ARRAY = 8, 9
# Tensor types GGUFReader gives typed (the others: rows of bytes).
_TYPED = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
          gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
          gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
          gguf.GGMLQuantizationType.I64: np.int64}


class Field:
    """One metadata key: contents() is its value (a list for an array),
    types its GGUFValueType and, for an array, the element's; data is the
    value too (for len() of an array, as GGUFReader's field.data)."""

    __slots__ = ("name", "value", "types")

    def __init__(self, name, value, types):
        self.name, self.value, self.types = name, value, types

    def contents(self):
        return self.value

    @property
    def data(self):
        return self.value


class Tensor:
    __slots__ = ("name", "shape", "tensor_type", "data")

    def __init__(self, name, shape, tensor_type, data):
        self.name, self.shape, self.tensor_type, self.data = name, shape, tensor_type, data


class Reader:
    """fields: {key: Field} in file order; tensors: [Tensor] in file order."""

    def __init__(self, fields, tensors):
        self.fields, self.tensors = fields, tensors


def read(path, tensors=True):
    """The GGUF at path (version 2 or 3). tensors=False reads the metadata only."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    off = 24

    def string(o):
        n = struct.unpack_from("<Q", buf, o)[0]
        return buf[o + 8:o + 8 + n].decode("utf-8"), o + 8 + n

    fields = {}
    for _ in range(n_kv):
        key, off = string(off)
        t = struct.unpack_from("<I", buf, off)[0]
        off += 4
        if t == _ARRAY:
            sub, n = struct.unpack_from("<IQ", buf, off)
            off += 12
            if sub == _STRING:
                value = []
                for _ in range(n):
                    s, off = string(off)
                    value.append(s)
            else:
                code = _SCALAR[sub]
                value = list(struct.unpack_from(f"<{n}{code}", buf, off))
                off += n * struct.calcsize(code)
            types = [gguf.GGUFValueType(t), gguf.GGUFValueType(sub)]
        elif t == _STRING:
            value, off = string(off)
            types = [gguf.GGUFValueType(t)]
        else:
            code = _SCALAR[t]
            value = struct.unpack_from("<" + code, buf, off)[0]
            off += struct.calcsize(code)
            types = [gguf.GGUFValueType(t)]
        fields[key] = Field(key, value, types)
    if not tensors:
        return Reader(fields, [])

    infos = []
    for _ in range(n_tensors):
        name, off = string(off)
        n_dims = struct.unpack_from("<I", buf, off)[0]
        dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
        ttype, t_off = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
        off += 4 + 8 * n_dims + 12
        infos.append((name, dims, gguf.GGMLQuantizationType(ttype), t_off))
    align = fields["general.alignment"].value if "general.alignment" in fields else 32
    start = (off + align - 1) // align * align
    mm = np.frombuffer(buf, dtype=np.uint8)
    out = []
    for name, dims, ttype, t_off in infos:
        np_dims = tuple(reversed(dims))  # rows first
        n = int(np.prod(dims))
        if ttype in _TYPED:
            dt = np.dtype(_TYPED[ttype])
            data = mm[start + t_off:start + t_off + n * dt.itemsize].view(dt).reshape(np_dims)
        else:
            block, size = gguf.GGML_QUANT_SIZES[ttype]
            row = dims[0] // block * size
            data = mm[start + t_off:start + t_off + n // block * size].reshape(
                (*np_dims[:-1], row))
        out.append(Tensor(name, np.array(dims, dtype=np.uint64), ttype, data))
    return Reader(fields, out)


def dequantize(data, qtype):
    """gguf.quants.dequantize(data, qtype), the same float32 values in the
    same shape, faster: gguf-py dequantizes 16 rows per Python call, and a
    row of a narrow tensor (a 256-wide embedding: one block) makes that
    thousands of calls. The blocks are dequantized each on its own, so
    regrouping them into longer rows changes no value."""
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim == 0:
        return gguf.quants.dequantize(data, qtype)  # float types: a view or a cast
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    flat = data.reshape(-1)
    nb = flat.size // size
    if nb * size != flat.size or data.shape[-1] % size:
        return gguf.quants.dequantize(data, qtype)
    group = next(g for g in (4096, 1024, 256, 64, 16, 4, 1) if nb % g == 0)
    out = gguf.quants.dequantize(flat.reshape(nb // group, group * size), qtype)
    return out.reshape(*data.shape[:-1], data.shape[-1] // size * block)
