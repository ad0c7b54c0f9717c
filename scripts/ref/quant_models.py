"""The quantized test models of issue 20: which files, where, and how made.

Shared by scripts/make-quant-models (makes them), scripts/ref/quant_reference.py
(measures llama.cpp on them against the float64 reference) and
tests/e2e/test_quant_types.py (measures zinfer the same way).

Each file is the default model (SmolLM2-135M-Instruct, Q4_1 with a Q8_0
token embedding) requantized by llama.cpp's own quantizer,
llama_cpp.llama_model_quantize with allow_requantize, to one llama.cpp file
type. The file types are mixes: llama.cpp picks a type per tensor, and a
K-quant or IQ4_XS type (256-element super-blocks) falls back to another type
for every tensor whose row length is not a multiple of 256 (this model's rows
are 576 or 1536 long), so the mix is read back and printed, not assumed.
"""

import collections
import os

ZINFER_HOME = os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer"))
SOURCE_MODEL = os.path.join(ZINFER_HOME, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
QUANT_DIR = os.environ.get("ZINFER_QUANT_DIR", os.path.join(ZINFER_HOME, "models", "quant"))
STEM = "SmolLM2-135M-Instruct"

# File type name (the file's suffix) -> llama_cpp.LLAMA_FTYPE_MOSTLY_* constant.
TYPES = {
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "Q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "Q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "Q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    # Not one of llama.cpp's presets: none of the ten above holds a single
    # Q2_K tensor (the Q2_K preset gives this model Q3_K and Q4_0 only, and
    # Q2_K_S needs an importance matrix), so this one quantizes with
    # params.pure (every tensor the file type's type, Q4_0 where a row length
    # rules Q2_K out), which makes the ffn_down tensors Q2_K.
    "Q2_K_pure": "LLAMA_FTYPE_MOSTLY_Q2_K",
}
# Made with llama_model_quantize_params.pure = True.
PURE = {"Q2_K_pure"}
# The ten files issue 20 names (the acceptance covers each of them).
REQUIRED = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "Q5_0", "Q5_1", "Q8_0",
            "IQ4_NL", "IQ4_XS"]


assert set(REQUIRED) <= set(TYPES) and PURE <= set(TYPES)


def path_for(qtype, quant_dir=None):
    """$ZINFER_HOME/models/quant/SmolLM2-135M-Instruct.<qtype>.gguf"""
    return os.path.join(quant_dir or QUANT_DIR, f"{STEM}.{qtype}.gguf")


def type_mix(path):
    """{tensor type name: tensor count} of a GGUF file, read with gguf.GGUFReader.

    Raises (ValueError, OSError, ...) when the file does not parse, so it
    doubles as the check that a file reads back."""
    import gguf

    r = gguf.GGUFReader(path)
    if not r.tensors:
        raise ValueError(f"{path}: no tensors")
    mix = collections.Counter(t.tensor_type.name for t in r.tensors)
    return dict(sorted(mix.items(), key=lambda kv: (-kv[1], kv[0])))


def format_mix(mix):
    return ", ".join(f"{k}: {v}" for k, v in mix.items())

