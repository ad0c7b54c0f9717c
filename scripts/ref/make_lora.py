"""make_lora - random-weight LoRA adapters in llama.cpp's GGUF adapter format.

Writes what llama.cpp's convert_lora_to_gguf.py writes for a PEFT adapter:
general.architecture the base model's, general.type "adapter",
adapter.type "lora", adapter.lora.alpha, and for each adapted weight W
(numpy [out, in]) "<W>.lora_a" (numpy [rank, in]: GGUF ne [in, rank]) and
"<W>.lora_b" (numpy [out, rank]: ne [rank, out]), float32 or float16.
The values are random (seeded): A ~ N(0, 1/in), B ~ N(0, b_std^2), so that
scale * B A x is a visible but moderate change of W x.

    make_lora.write(path, base_model_path, rank=8, alpha=16, seed=1)

`bad` makes the broken files the loader must refuse: "arch" (another
architecture), "missing" (a lora_b left out), "shape" (a lora_a one input
too wide), "rank" (one weight of another rank), "not_adapter"
(general.type "model").
"""

import argparse
import sys

import gguf
import numpy as np

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def base_shapes(model_path):
    """{weight name: (out, in)} of the base model's layer weights."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import gguf_meta

    r = gguf_meta.read(model_path, tensors=True)
    arch = r.fields["general.architecture"].contents()
    shapes = {t.name: (int(t.shape[1]), int(t.shape[0])) for t in r.tensors
              if len(t.shape) == 2}
    return arch, shapes


def write(path, model_path, rank=8, alpha=16.0, seed=1, targets=TARGETS, layers=None,
          dtype=np.float32, b_std=0.02, bad=None):
    arch, shapes = base_shapes(model_path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "phi3" if bad == "arch" and arch != "phi3" else arch)
    w.add_type("model" if bad == "not_adapter" else gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    names = [n for n in shapes
             if n.startswith("blk.") and n.split(".")[2] in targets and n.endswith(".weight")
             and (layers is None or int(n.split(".")[1]) in layers)]
    names.sort(key=lambda n: (int(n.split(".")[1]), TARGETS.index(n.split(".")[2])))
    for i, n in enumerate(names):
        out, inp = shapes[n]
        r = rank + 1 if bad == "rank" and i == len(names) - 1 else rank
        a = rng.standard_normal((r, inp)) / np.sqrt(inp)
        b = rng.standard_normal((out, r)) * b_std
        if bad == "shape" and i == 0:
            a = np.concatenate([a, a[:, :1]], axis=1)
        w.add_tensor(n + ".lora_a", a.astype(dtype))
        if not (bad == "missing" and i == 0):
            w.add_tensor(n + ".lora_b", b.astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the base model's GGUF")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--f16", action="store_true", help="float16 tensors (default float32)")
    ap.add_argument("--bad", choices=["arch", "missing", "shape", "rank", "not_adapter"])
    a = ap.parse_args(argv)
    names = write(a.out, a.model, a.rank, a.alpha, a.seed,
                  dtype=np.float16 if a.f16 else np.float32, bad=a.bad)
    print(f"wrote {a.out}: {len(names)} adapted weights, rank {a.rank}, alpha {a.alpha}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
