"""scripts/ref/gguf_meta.py gives what gguf.GGUFReader gives.

The float64 reference and the GGUF-writing tests read files with gguf_meta
(GGUFReader takes seconds on a large vocabulary). Checked here against
GGUFReader itself: every field's contents() and types, every tensor's
name, shape, type and bytes, on the default model and on a small file
holding every metadata value type and the typed tensor kinds.
"""

import gguf
import gguf_meta
import numpy as np
import pytest

# Python only: skipped under the sanitizers (conftest.py).
pytestmark = pytest.mark.no_zinfer


def same_as_gguf_reader(path):
    r, m = gguf.GGUFReader(str(path)), gguf_meta.read(str(path))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(m.fields)
    for k, f in fields.items():
        g = m.fields[k]
        assert f.contents() == g.contents(), k
        assert list(f.types) == list(g.types), k
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            assert len(f.data) == len(g.data), k
    assert [t.name for t in r.tensors] == [t.name for t in m.tensors]
    for a, b in zip(r.tensors, m.tensors):
        assert list(a.shape) == list(b.shape) and a.tensor_type == b.tensor_type, a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name
    assert list(m.fields) == list(gguf_meta.read(str(path), tensors=False).fields)
    return m


def test_default_model(model_path):
    m = same_as_gguf_reader(model_path)
    assert len(m.fields["tokenizer.ggml.tokens"].data) == 49152
    assert len(m.tensors) == 272


def test_every_value_type(tmp_path):
    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1 / 3)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo\nwörld")
    w.add_array("t.arr_str", ["a", "", "ß", "<0x0A>"])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, -1.25])
    w.add_array("t.arr_empty", [])
    rng = np.random.default_rng(1)
    w.add_tensor("f32", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("i32", np.arange(10, dtype=np.int32))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                             gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = same_as_gguf_reader(path)
    assert m.fields["t.str"].contents() == "héllo\nwörld"
    assert m.fields["t.u64"].contents() == 2**63 + 5
    assert m.fields["t.arr_str"].contents() == ["a", "", "ß", "<0x0A>"]
