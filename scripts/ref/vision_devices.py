#!/usr/bin/env python3
"""An image tower on the CPU and on a device, compared (scripts/gpu-check).

Writes a random-weight projector of --kind at the real towers' widths
(tests/e2e/vision_files.py: gemma3's 896 px SigLIP, 4096 patches of 1152,
or idefics3's 512 px one; two layers) and one tile of random normalized
pixels, runs `zinfer encode-image` on --device cpu and on --device DEVICE,
and prints one JSON line:

  {"kind", "device", "patches", "tokens", "lm_dim", "worst_cos_dist",
   "rel_err", "cpu_ms", "device_ms"}

rel_err is max |device - cpu| / max |cpu|; the cosine distance is per soft
token. Exit 0 when the worst cosine distance is below --max-cos (1e-8) and
rel_err below --max-rel (1e-4), 1 otherwise, 2 when a run failed.

  vision_devices.py --zinfer BIN --kind gemma3|idefics3 --device cuda
                    --work DIR [--lm-dim N] [--seed S]
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
import vision_files  # noqa: E402


def encode(zinfer, mmproj, pixels, out, device):
    r = subprocess.run([zinfer, "encode-image", "--mmproj", mmproj, "--pixels", pixels,
                        "--out", out, "--device", device],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.stderr.write(f"encode-image --device {device}: rc {r.returncode}: {r.stderr}")
        sys.exit(2)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zinfer", required=True)
    ap.add_argument("--kind", choices=sorted(vision_files.KINDS), required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", required=True)
    ap.add_argument("--lm-dim", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-cos", type=float, default=1e-8)
    ap.add_argument("--max-rel", type=float, default=1e-4)
    a = ap.parse_args()

    os.makedirs(a.work, exist_ok=True)
    mmproj = os.path.join(a.work, f"mmproj-{a.kind}.gguf")
    pixels = os.path.join(a.work, f"pixels-{a.kind}.f32")
    vision_files.write_mmproj(mmproj, a.kind, a.lm_dim, seed=a.seed)
    size = vision_files.KINDS[a.kind]["image_size"]
    rng = np.random.default_rng(a.seed + 1)
    rng.uniform(-1.0, 1.0, size * size * 3).astype(np.float32).tofile(pixels)

    outs, runs = {}, {}
    for dev in ("cpu", a.device):
        path = os.path.join(a.work, f"tokens-{a.kind}-{dev.replace(':', '_')}.f32")
        runs[dev] = encode(a.zinfer, mmproj, pixels, path, dev)
        outs[dev] = np.fromfile(path, dtype=np.float32).astype(np.float64)
    lm = runs["cpu"]["lm_dim"]
    c = outs["cpu"].reshape(-1, lm)
    d = outs[a.device].reshape(-1, lm)
    cos = 1.0 - (c * d).sum(1) / np.sqrt((c * c).sum(1) * (d * d).sum(1))
    rel = float(np.abs(d - c).max() / max(np.abs(c).max(), 1e-30))
    side = size // vision_files.KINDS[a.kind]["patch_size"]
    res = {"kind": a.kind, "device": a.device, "patches": side * side,
           "tokens": int(c.shape[0]), "lm_dim": lm, "worst_cos_dist": float(cos.max()),
           "rel_err": rel, "cpu_ms": runs["cpu"]["encode_ms"],
           "device_ms": runs[a.device]["encode_ms"]}
    print(json.dumps(res))
    return 0 if res["worst_cos_dist"] < a.max_cos and rel < a.max_rel else 1


if __name__ == "__main__":
    sys.exit(main())
