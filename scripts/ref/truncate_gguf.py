#!/usr/bin/env python3
"""Writes a copy of a GGUF model with only its first N layers.

The GPU bundle (scripts/gpu-bundle) carries the default model to a machine
that can receive only a few tens of MiB: this keeps every tensor of layers
0..N-1 and every tensor outside the layers (embedding, output norm, output
head) byte for byte, in the file's own types, and every metadata key, with
`<arch>.block_count` set to N. The result is a real model of the same
family, shapes and tensor types, only shallower.

--vocab N also keeps only the first N tokens: the first N rows of the
token embedding (and of an untied output head), the first N entries of the
tokenizer's per-token arrays (tokens, scores, types), and `<arch>.vocab_size`
when the file has it. For a file whose embedding alone is too big to carry
(Gemma 3 270M: 262,144 rows, 178 MB in its Q4_K_M file): the rows kept are
still the real ones, in their type; token ids from N on are out of range.

  truncate_gguf.py --layers 4 [--vocab N] IN.gguf OUT.gguf
"""

import argparse
import re
import sys

import gguf


# The tokenizer's arrays with one entry per token.
VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, required=True, help="layers to keep (from 0)")
    ap.add_argument("--vocab", type=int, default=0, help="tokens to keep (from 0; default all)")
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    n_layers = r.fields[f"{arch}.block_count"].contents()
    if not 1 <= a.layers <= n_layers:
        sys.exit(f"truncate_gguf: --layers must be 1..{n_layers}")
    if a.vocab < 0:
        sys.exit("truncate_gguf: --vocab must not be negative (0: every token)")
    w = gguf.GGUFWriter(a.dst, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == f"{arch}.block_count":
            value = a.layers
        elif a.vocab and key == f"{arch}.vocab_size":
            value = min(value, a.vocab)
        elif a.vocab and key in VOCAB_ARRAYS:
            value = value[: a.vocab]
        elif vtype == gguf.GGUFValueType.ARRAY and isinstance(value, list) and \
                len(value) == n_layers and key.startswith(arch + "."):
            value = value[: a.layers]  # per-layer arrays (e.g. a sliding-window pattern)
        w.add_key_value(key, value, vtype, sub_type=sub)
    layer = re.compile(r"^blk\.(\d+)\.")
    kept = 0
    for t in r.tensors:
        m = layer.match(t.name)
        if m and int(m.group(1)) >= a.layers:
            continue
        # the raw blocks in the file's type (the reader gives quantized
        # tensors as rows of bytes, from which the writer recovers the shape)
        data = t.data
        if a.vocab and t.name in ("token_embd.weight", "output.weight"):
            data = data[: a.vocab]  # rows are tokens (the first axis as the reader gives it)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        kept += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    vocab = f", the first {a.vocab} tokens" if a.vocab else ""
    print(f"truncate_gguf: {a.dst}: {a.layers} of {n_layers} layers{vocab}, {kept} tensors")


if __name__ == "__main__":
    main()
