#!/usr/bin/env python3
"""PyTorch eager reference for zinfer's GPU benchmark (scripts/gpu-check).

The same GGUF file, dequantized with the PyPI `gguf` package (through
numpy_llama.Model, the float64 reference's loader), runs as a plain eager
PyTorch Llama forward on the GPU: fp16 (or --dtype) weights and
activations, RMSNorm in float32, adjacent-pair RoPE (GGUF's layout) with
angles computed in float64, grouped-query attention against a
preallocated KV cache, greedy decoding. It measures what tests/gpu/
bench_cuda measures, with the same token counts:

  prefill    one sequence of --prompt-tokens tokens in one forward pass
  decode_b1  --gen-tokens greedy steps of that sequence
  decode_bS  --streams sequences (each prefilled with --stream-prompt
             tokens) decoding together; aggregate tokens per second

and prints one JSON line last (keys as bench_cuda's). With --check-ids it
also prints the float32 logits' KL divergence from the float64 numpy
reference for those ids (a check of this script, not of zinfer).

This is a reference point for speed (what an unoptimised eager framework
gets from the same weights), not part of zinfer. Needs torch with CUDA,
numpy and gguf; nothing is downloaded.
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: numpy_llama's default)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--stream-prompt", type=int, default=64)
    ap.add_argument("--check-ids", default=None, help="comma-separated ids: KL vs float64 numpy")
    a = ap.parse_args()

    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"torch_bench: {e.name} is not installed", file=sys.stderr)
        return 3
    import numpy_llama

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("torch_bench: torch sees no CUDA device", file=sys.stderr)
        return 3
    torch.set_grad_enabled(False)  # inference only: no autograd bookkeeping
    path = a.model or numpy_llama.DEFAULT_MODEL
    ref = numpy_llama.Model(path)
    dev = torch.device(a.device)
    dt = getattr(torch, a.dtype)
    W = {k: torch.from_numpy(v).to(dev, dt) for k, v in ref.w.items()}
    out_w = W.get("output.weight", W["token_embd.weight"])
    L, nh, nkv, hd = ref.n_layer, ref.n_head, ref.n_head_kv, ref.head_dim
    group, rd, eps = nh // nkv, ref.rope_dim, ref.eps
    inv_freq = torch.from_numpy(ref.inv_freq).to(dev, torch.float64)

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dt) * w

    def rope(x, pos):  # x [B, T, H, hd], pos [B, T] (int64)
        ang = pos.to(torch.float64)[..., None] * inv_freq  # [B, T, rd/2]
        c = torch.cos(ang).to(dt)[:, :, None, :]
        s = torch.sin(ang).to(dt)[:, :, None, :]
        x0, x1 = x[..., 0:rd:2], x[..., 1:rd:2]
        y = x.clone()
        y[..., 0:rd:2] = x0 * c - x1 * s
        y[..., 1:rd:2] = x0 * s + x1 * c
        return y

    def new_cache(B, ctx):
        return [(torch.zeros(B, ctx, nkv, hd, device=dev, dtype=dt),
                 torch.zeros(B, ctx, nkv, hd, device=dev, dtype=dt)) for _ in range(L)]

    def forward(ids, start, cache, last_only=True):
        """ids [B, T] at positions start..start+T-1 of every sequence."""
        B, T = ids.shape
        pos = torch.arange(start, start + T, device=dev)[None, :].expand(B, T)
        x = W["token_embd.weight"][ids]
        n = start + T
        mask = None
        if T > 1:  # query i (position start+i) sees keys 0..start+i
            q_pos = torch.arange(start, start + T, device=dev)[:, None]
            mask = torch.arange(n, device=dev)[None, :] > q_pos  # [T, n]
        for layer in range(L):
            p = f"blk.{layer}."
            h = rms(x, W[p + "attn_norm.weight"])
            q = (h @ W[p + "attn_q.weight"].T).view(B, T, nh, hd)
            k = (h @ W[p + "attn_k.weight"].T).view(B, T, nkv, hd)
            v = (h @ W[p + "attn_v.weight"].T).view(B, T, nkv, hd)
            q, k = rope(q, pos), rope(k, pos)
            kc, vc = cache[layer]
            kc[:, start:n], vc[:, start:n] = k, v
            kk = kc[:, :n].repeat_interleave(group, dim=2)  # [B, n, nh, hd]
            vv = vc[:, :n].repeat_interleave(group, dim=2)
            att = torch.einsum("bthd,bkhd->bhtk", q.float(), kk.float()) / math.sqrt(hd)
            if mask is not None:
                att = att.masked_fill(mask, float("-inf"))
            att = torch.softmax(att, dim=-1)
            o = torch.einsum("bhtk,bkhd->bthd", att, vv.float()).to(dt).reshape(B, T, nh * hd)
            x = x + o @ W[p + "attn_output.weight"].T
            h = rms(x, W[p + "ffn_norm.weight"])
            g = h @ W[p + "ffn_gate.weight"].T
            u = h @ W[p + "ffn_up.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ W[p + "ffn_down.weight"].T
        if last_only:
            x = x[:, -1:]
        return (rms(x, W["output_norm.weight"]) @ out_w.T).float()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    if a.check_ids:
        ids = [int(t) for t in a.check_ids.split(",")]
        cache = new_cache(1, len(ids))
        got = forward(torch.tensor([ids], device=dev), 0, cache, last_only=False)[0]
        want = ref.forward(ids)
        lp = torch.log_softmax(torch.from_numpy(want), -1)
        lq = torch.log_softmax(got.double().cpu(), -1)
        kl = (lp.exp() * (lp - lq)).sum(-1)
        print(f"KL(float64 numpy || torch {a.dtype}): mean {kl.mean():.3g}, max {kl.max():.3g}")

    V = ref.n_vocab
    gen = np.random.default_rng(12345)
    P, G, S, SP = a.prompt_tokens, a.gen_tokens, a.streams, a.stream_prompt
    prompt = torch.tensor(gen.integers(0, V, size=(1, P)), device=dev)

    cache = new_cache(1, P + G + 8)
    forward(prompt, 0, cache)  # warm-up
    sync()
    t0 = time.perf_counter()
    z = forward(prompt, 0, cache)
    sync()
    t_prefill = time.perf_counter() - t0
    tok = z[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for g in range(G):
        z = forward(tok, P + g, cache)
        tok = z[:, -1].argmax(-1, keepdim=True)
    sync()
    t_b1 = time.perf_counter() - t0
    del cache

    cache = new_cache(S, SP + G + 8)
    prompts = torch.tensor(gen.integers(0, V, size=(S, SP)), device=dev)
    z = forward(prompts, 0, cache)
    tok = z[:, -1].argmax(-1, keepdim=True)
    sync()
    t0 = time.perf_counter()
    for g in range(G):
        z = forward(tok, SP + g, cache)
        tok = z[:, -1].argmax(-1, keepdim=True)
    sync()
    t_bs = time.perf_counter() - t0

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(json.dumps({
        "impl": "torch-eager", "device": name, "dtype": a.dtype, "torch": torch.__version__,
        "prompt_tokens": P, "prefill_tok_s": round(P / t_prefill, 1), "gen_tokens": G,
        "decode_b1_tok_s": round(G / t_b1, 1), "decode_batch": S,
        "decode_batch_tok_s": round(S * G / t_bs, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
