#!/usr/bin/env python3
"""Independent float64 reference forward pass of the hybrid recurrent GGUF families.

Covers `lfm2` (LiquidAI LFM2), `granitehybrid` (IBM Granite 4.0-H) and
`qwen35` (Qwen3.5), as llama.cpp runs them (src/models/lfm2.cpp,
granite-hybrid.cpp, mamba-base.cpp, qwen35.cpp, delta-net-base.cpp and the
CPU ops ssm_conv, ssm_scan, gated_delta_net); used by tests only, like
numpy_llama.py (whose GGUF reading, RMS norm and KL it shares in spirit;
the code here stands alone but for gguf_meta and numpy_llama.kl).

Every layer is either an attention layer ("a") or the family's recurrent
block ("r"), read from the file: lfm2 and granitehybrid mark a recurrent
layer with attention.head_count_kv[l] == 0 (an array); qwen35 reads the
bool array attention.recurrent_layers when present (the current converter
writes it), else makes layer l full attention when (l + 1) %
full_attention_interval == 0 (default 4); its block_count includes
nextn_predict_layers multi-token-prediction blocks, not run here.

Notation: x the residual stream [n, n_embd]; rms(v, w) = v / sqrt(mean(v^2)
+ eps) * w with eps = attention.layer_norm_rms_epsilon everywhere (also the
Q/K norms, the SSM norms and the L2 norm); silu(v) = v * sigmoid(v);
softplus(v) = log(1 + e^v), v for v > 20 (ggml's); W.h a product with a
GGUF matrix (numpy rows = the GGUF's ne1). A causal depthwise conv of
kernel K over channels c keeps the last K-1 inputs as its state ("tail"):
out[t, c] = sum_j w[c, j] * in[t - (K-1) + j, c], the tail supplying the
inputs before the chunk (zeros for a new sequence); w is GGUF {K, channels}.

lfm2 (per layer; FFN everywhere):
    h = rms(x, attn_norm)
    r: B, C, xs = split3(shortconv.in_proj . h)      (each n_embd wide)
       y = out_proj . (C * conv(B * xs))     (shortconv.conv; K = shortconv.l_cache; no bias)
    a: q, k, v = Wq h, Wk h, Wv h; q = rms_head(q, attn_q_norm);
       k = rms_head(k, attn_k_norm); NEOX RoPE (all head_dim); GQA;
       scale 1/sqrt(head_dim); y = Wo . attn
    x += y;  x += down(silu(gate rms(x, ffn_norm)) * up rms(x, ffn_norm))
    logits = out_w . rms(x, token_embd_norm)          (output.weight or the tied token_embd)

granitehybrid (per layer; FFN everywhere; s_e, s_r, s_a, s_l the file's
embedding_scale, residual_scale, attention.scale, logit_scale, each
unused when 0/absent):
    x = token_embd[ids] * s_e
    h = rms(x, attn_norm)
    r: Mamba-2.  z | xBC | dt = ssm_in . h  (d_inner | d_inner + 2 G N | H)
       xBC = silu(conv(xBC) + ssm_conv1d.bias)        (K = ssm.conv_kernel)
       xs | B | C = xBC  (H heads of P = d_inner/H | G groups of N | G x N)
       dt = softplus(dt + ssm_dt.bias); A = ssm_a [H] (negative)
       per head h (group g = h // (H/G)): S_h [P, N]
           S_h = exp(dt_h A_h) S_h + dt_h xs_h (x) B_g;   y_h = S_h C_g
       y = (y + D_h xs_h) * silu(z)                   (ssm_d)
       y = per group of d_inner/G channels rms(y, ssm_norm) (grouped norm)
       y = ssm_out . y
    a: q, k, v = Wq h, Wk h, Wv h (+ biases when present); NoPE unless
       rope.scaling.finetuned is true (default true; the Granite 4.0-H
       converter writes false), then normal-mode RoPE; scale s_a or
       1/sqrt(head_dim); y = Wo . attn (+ attn_output.bias)
    x += s_r y;  x += s_r ffn(rms(x, ffn_norm))
    logits = (out_w . rms(x, output_norm)) / s_l

qwen35 (per layer; FFN everywhere):
    h = rms(x, attn_norm)
    r: gated DeltaNet.  H_k = ssm.group_count key heads, H_v =
       ssm.time_step_rank value heads, d = ssm.state_size per head (key and
       value heads alike; ssm.inner_size = H_v d).
       q | k | v = silu(conv(attn_qkv . h))           (H_k d | H_k d | H_v d; no conv bias)
       q, k = q / sqrt(sum q^2 + eps), k likewise    (per head: L2 norm)
       z = attn_gate . h;  beta = sigmoid(ssm_beta . h)
       g = softplus(ssm_alpha . h + ssm_dt.bias) * ssm_a     (log decay <= 0)
       value head h reads key head h % H_k (llama.cpp's tiling), state
       S_h [d_k, d_v]:
           S = e^g S;  u = beta (v - S^T k);  S = S + k u^T;  o = S^T q / sqrt(d)
       y = ssm_out . (rms_head(o, ssm_norm) * silu(z))
    a: gated attention. q | gate per head = attn_q . h  ([q_h (hd), gate_h (hd)]
       interleaved by head); q = rms_head(q, attn_q_norm); k = rms_head(Wk h,
       attn_k_norm); v = Wv h; interleaved M-RoPE (IMROPE) on the first
       rope.dimension_count dims of each head, NEOX pairs (i, i + n_rot/2);
       pair i's position: with s = i mod sum(sections), s%3==0 and s <
       3 sec[0]: t; s%3==1, s < 3 sec[1]: h; s%3==2, s < 3 sec[2]: w; else
       e; text tokens have t = h = w = pos, e = 0 (llama.cpp); scale
       1/sqrt(head_dim) (attention.scale when set);
       y = Wo . (attn * sigmoid(gate))
    x += y;  x += ffn(rms(x, post_attention_norm))
    logits = out_w . rms(x, output_norm)

Two ways to run the same function:

  forward(ids, state)   one pass over the chunk: convolutions over the
      chunk with the state's tail in front, the recurrences in matrix
      (chunked) form -- Mamba-2 as its quadratic "SSD" form
      y_t = e^{c_t} S0 C_t + sum_{s<=t} e^{c_t - c_s} dt_s (C_t . B_s) xs_s,
      c = cumsum(dt A); the DeltaNet through the triangular solve
      (I + A) U = beta (V - diag(e^c) K S0), A_ts = beta_t e^{c_t - c_s}
      k_t . k_s (s < t), o = diag(e^c) Q S0 + (tril(e^{c_t - c_s}) * Q K^T) U,
      S_n = e^{c_n} S0 + (e^{c_n - c} * K)^T U (c = cumsum(g)) -- the form a
      chunked prefill needs -- and causal attention over the cached keys;
  forward_stepwise(ids, state)   token by token with the recurrences as
      written above (conv tail shifted one token, S updated per token).

The state (new_state()) is what a serving engine's state cache must hold
per sequence: per recurrent layer the conv tail [K-1, channels] and the
recurrent state (Mamba-2: [H, P, N]; DeltaNet: [H_v, d_k, d_v]; LFM2: the
conv tail only), per attention layer the keys and values; plus the token
count. forward(a + b) == forward(a, st); forward(b, st) == forward_stepwise
(a + b) to float64 rounding.

Module use:  import numpy_hybrid; m = numpy_hybrid.Model(path); m.forward(ids)
CLI use:     numpy_hybrid.py --model M --ids 1,2,3 --out logits.npy
"""

import argparse
import copy
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see numpy_llama.py

import numpy as np  # noqa: E402

import refcache  # noqa: E402

ARCHS = ("lfm2", "granitehybrid", "qwen35")


from numpy_llama import _field  # noqa: E402  (GGUF metadata, as numpy_llama reads it)


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def silu(v):
    return v * sigmoid(v)


def softplus(v):
    """ggml's: log(1 + e^v), v itself above 20."""
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))


class Model:
    """Hyper-parameters plus float64 weights of a hybrid file, dequantized
    once. The attributes after the hyper-parameters are switches the tests
    turn off one at a time (ablations) to show that each feature matters.

    Model(path) gives a refcache proxy (scripts/ref/refcache.py) unless
    ZINFER_REFCACHE=0, as numpy_llama.Model does: forward, forward_stepwise
    and greedy on a new sequence are looked up in the disk cache first."""

    PURE = {"forward": ("ids", "hidden", "chunk"), "forward_stepwise": ("ids", "hidden"),
            "greedy": ("ids", "n_new")}

    def __new__(cls, *args, **kw):
        lazy = refcache.lazy_model(cls, args, kw, cls.PURE) if args or kw else None
        return lazy if lazy is not None else super().__new__(cls)

    def __init__(self, path):
        from gguf.quants import dequantize

        import gguf_meta

        self.path = path
        r = gguf_meta.read(path)
        arch = _field(r, "general.architecture")
        if arch not in ARCHS:
            raise ValueError(f"{path}: architecture {arch!r} is not a hybrid one here")
        self.arch = arch

        def hp(name, default=None):
            return _field(r, f"{arch}.{name}", default)

        # block_count includes the multi-token-prediction blocks (qwen35's
        # nextn_predict_layers), which the forward pass does not run
        self.n_layer = int(hp("block_count")) - int(hp("nextn_predict_layers", 0))
        self.n_embd = int(hp("embedding_length"))
        self.n_ff = int(hp("feed_forward_length"))
        self.n_head = int(hp("attention.head_count"))
        kv = hp("attention.head_count_kv", self.n_head)
        if isinstance(kv, list):
            kv = [int(v) for v in kv][: self.n_layer]
        else:
            kv = [int(kv)] * self.n_layer
        if len(kv) != self.n_layer:
            raise ValueError(f"attention.head_count_kv has {len(kv)} entries, "
                             f"{self.n_layer} layers")
        self.head_dim = int(hp("attention.key_length", self.n_embd // self.n_head))
        if int(hp("attention.value_length", self.head_dim)) != self.head_dim:
            raise ValueError("value_length != key_length")
        self.eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.n_ctx = int(hp("context_length"))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.rope_dim = int(hp("rope.dimension_count", self.head_dim))
        if arch == "qwen35":
            rec = r.fields.get(f"{arch}.attention.recurrent_layers")
            if rec is not None:  # preferred by llama.cpp
                rec = [bool(v) for v in rec.contents()]
                if len(rec) != int(hp("block_count")):
                    raise ValueError(f"attention.recurrent_layers has {len(rec)} entries")
                self.kinds = ["r" if v else "a" for v in rec[: self.n_layer]]
            else:
                iv = int(hp("full_attention_interval", 4))
                self.kinds = ["a" if (L + 1) % iv == 0 else "r" for L in range(self.n_layer)]
            self.n_head_kv = kv[0]
        else:
            self.kinds = ["r" if v == 0 else "a" for v in kv]
            att = [v for v in kv if v]
            if not att or len(set(att)) != 1:
                raise ValueError(f"attention.head_count_kv {kv}: one nonzero value expected")
            self.n_head_kv = att[0]
        if "tokenizer.ggml.tokens" in r.fields:
            self.n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
        else:
            emb = next(t for t in r.tensors if t.name == "token_embd.weight")
            self.n_vocab = int(emb.shape[1])

        # recurrent block sizes
        if arch == "lfm2":
            self.d_conv = int(hp("shortconv.l_cache"))
        else:
            self.d_conv = int(hp("ssm.conv_kernel"))
            self.d_inner = int(hp("ssm.inner_size"))
            self.d_state = int(hp("ssm.state_size"))
            self.n_ssm_head = int(hp("ssm.time_step_rank"))
            self.n_group = int(hp("ssm.group_count"))
        if arch == "qwen35":
            if self.d_inner != self.n_ssm_head * self.d_state:
                raise ValueError("ssm.inner_size != time_step_rank * state_size")
            if self.n_ssm_head % self.n_group:
                raise ValueError("ssm.time_step_rank not a multiple of ssm.group_count")
            sec = hp("rope.dimension_sections")
            self.rope_sections = [int(s) for s in sec] + [0] * (4 - len(sec))

        # family switches (see the module docstring); the tests' ablations
        # change these on a copy
        self.conv = True  # the causal convolution (off: the current input only)
        self.carry = True  # the recurrent state carried from token to token
        self.neox = arch != "granitehybrid"
        self.rope = True
        self.qk_norm = arch in ("lfm2", "qwen35")
        self.emb_scale = self.res_scale = self.logit_scale = 0.0
        self.attn_scale = 0.0
        if arch == "granitehybrid":
            self.emb_scale = float(hp("embedding_scale", 0.0))
            self.res_scale = float(hp("residual_scale", 0.0))
            self.logit_scale = float(hp("logit_scale", 0.0))
            self.attn_scale = float(hp("attention.scale", 0.0))
            self.rope = bool(hp("rope.scaling.finetuned", True))
        if arch == "qwen35":
            self.attn_scale = float(hp("attention.scale", 0.0))
        # lfm2
        self.b_gate = self.c_gate = True
        # granitehybrid (Mamba-2)
        self.ssm_D = self.z_gate = True
        self.norm_groups = getattr(self, "n_group", 1)
        # qwen35 (DeltaNet and gated attention)
        self.l2_norm = self.out_gate = self.attn_gate = self.beta = self.decay = True
        self.kv_heads_tiled = True  # value head h reads key head h % H_k
        self.imrope = arch == "qwen35"

        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape))
            self.w[t.name] = np.asarray(a, dtype=np.float64).reshape(shape)
        self.out_w = self.w.get("output.weight", self.w["token_embd.weight"])
        self.out_norm = "token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight"
        self.ffn_norm = "post_attention_norm" if arch == "qwen35" else "ffn_norm"
        if self.out_w.shape[0] != self.n_vocab:
            raise ValueError("output head rows != vocabulary size")

    # ---- state ------------------------------------------------------------

    def conv_channels(self):
        if self.arch == "lfm2":
            return self.n_embd
        if self.arch == "granitehybrid":
            return self.d_inner + 2 * self.n_group * self.d_state
        return 2 * self.n_group * self.d_state + self.d_inner

    def new_state(self):
        """A fresh sequence's state: {"n": tokens so far, "layers": per
        layer {"conv": tail [K-1, channels], "ssm": recurrent state} or
        {"k": [t, n_head_kv, head_dim], "v": ...}}."""
        layers = []
        for kind in self.kinds:
            if kind == "a":
                e = np.zeros((0, self.n_head_kv, self.head_dim))
                layers.append({"k": e, "v": e.copy()})
                continue
            st = {"conv": np.zeros((self.d_conv - 1, self.conv_channels()))}
            if self.arch == "granitehybrid":
                P = self.d_inner // self.n_ssm_head
                st["ssm"] = np.zeros((self.n_ssm_head, P, self.d_state))
            elif self.arch == "qwen35":
                st["ssm"] = np.zeros((self.n_ssm_head, self.d_state, self.d_state))
            layers.append(st)
        return {"n": 0, "layers": layers}

    # ---- shared pieces ------------------------------------------------------

    def rms(self, v, w=None):
        v = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + self.eps)
        return v if w is None else v * w

    def causal_conv(self, st, u, w):
        """One pass: u [n, ch] after st["conv"] (the last K-1 inputs);
        w [ch, K]. Returns [n, ch] and moves the tail on."""
        K = w.shape[1]
        full = np.concatenate([st["conv"], u])
        st["conv"] = full[len(full) - (K - 1):].copy()
        if not self.conv:
            return u * w[:, -1]  # the current input's tap only
        n = len(u)
        out = np.zeros_like(u)
        for j in range(K):
            out += full[j : j + n] * w[:, j]
        return out

    def conv_step(self, st, u, w):
        """One token: u [ch]; the tail shifts by one."""
        window = np.concatenate([st["conv"], u[None]])  # [K, ch], oldest first
        st["conv"] = window[1:].copy()
        if not self.conv:
            return u * w[:, -1]
        return (window * w.T).sum(axis=0)

    def rope_table(self, pos):
        """cos, sin [n, rope_dim/2] of the arch's RoPE at positions pos."""
        i = np.arange(self.rope_dim // 2, dtype=np.float64)
        inv = self.rope_base ** (-2.0 * i / self.rope_dim)
        p = np.repeat(pos[:, None].astype(np.float64), len(i), axis=1)
        if self.imrope:  # sections choose t/h/w (= pos for text) or e (= 0)
            s0, s1, s2, _ = self.rope_sections
            sect = (np.arange(len(i)) % sum(self.rope_sections))
            thw = (((sect % 3 == 0) & (sect < 3 * s0)) | ((sect % 3 == 1) & (sect < 3 * s1))
                   | ((sect % 3 == 2) & (sect < 3 * s2)))
            p = p * thw[None, :]
        ang = p * inv[None, :]
        return np.cos(ang), np.sin(ang)

    def apply_rope(self, v, pos):
        """v [n, heads, head_dim]: the first rope_dim dims rotate."""
        c, s = self.rope_table(pos)
        c, s = c[:, None, :], s[:, None, :]
        y = v.copy()
        d = self.rope_dim
        if self.neox:
            i0, i1 = slice(0, d // 2), slice(d // 2, d)
        else:
            i0, i1 = slice(0, d, 2), slice(1, d, 2)
        a, b = v[..., i0], v[..., i1]
        y[..., i0] = a * c - b * s
        y[..., i1] = a * s + b * c
        return y

    def ffn(self, p, h):
        g = h @ self.w[p + "ffn_gate.weight"].T
        u = h @ self.w[p + "ffn_up.weight"].T
        return (silu(g) * u) @ self.w[p + "ffn_down.weight"].T

    # ---- attention layers ---------------------------------------------------

    def attention_block(self, p, h, st, past):
        """The arch's attention layer on h [n, n_embd] (normed) after the
        cached keys/values in st (extended here)."""
        w, n = self.w, len(h)
        nh, nkv, hd = self.n_head, self.n_head_kv, self.head_dim
        q = h @ w[p + "attn_q.weight"].T
        gate = None
        if self.arch == "qwen35":  # per head: [q (hd), gate (hd)]
            q = q.reshape(n, nh, 2 * hd)
            q, gate = q[..., :hd], q[..., hd:].reshape(n, nh * hd)
        q = q.reshape(n, nh, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(n, nkv, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, nkv, hd)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if p + f"attn_{name}.bias" in w:
                t += w[p + f"attn_{name}.bias"].reshape(t.shape[1:])
        if self.qk_norm:
            q = self.rms(q, w[p + "attn_q_norm.weight"])
            k = self.rms(k, w[p + "attn_k_norm.weight"])
        if self.rope:
            pos = np.arange(past, past + n)
            q, k = self.apply_rope(q, pos), self.apply_rope(k, pos)
        st["k"] = k = np.concatenate([st["k"], k])
        st["v"] = v = np.concatenate([st["v"], v])
        g = nh // nkv
        kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        scale = self.attn_scale or 1.0 / np.sqrt(hd)
        att = np.einsum("qhd,khd->hqk", q, kr) * scale
        att = att + np.triu(np.full((n, past + n), -np.inf), k=past + 1)
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, vr).reshape(n, nh * hd)
        if gate is not None and self.attn_gate:
            o = o * sigmoid(gate)
        o = o @ w[p + "attn_output.weight"].T
        if p + "attn_output.bias" in w:
            o = o + w[p + "attn_output.bias"]
        return o

    # ---- LFM2 short convolution ----------------------------------------------

    def shortconv_block(self, p, h, st, stepwise=False):
        """B, C, x = in_proj h; out_proj (C * conv(B * x))."""
        w, d = self.w, self.n_embd
        bcx = h @ w[p + "shortconv.in_proj.weight"].T
        b, c, xs = bcx[:, :d], bcx[:, d : 2 * d], bcx[:, 2 * d :]
        bx = (b if self.b_gate else 1.0) * xs
        kern = w[p + "shortconv.conv.weight"]  # [n_embd, K]
        if stepwise:
            conv = np.stack([self.conv_step(st, u, kern) for u in bx])
        else:
            conv = self.causal_conv(st, bx, kern)
        y = (c if self.c_gate else 1.0) * conv
        return y @ w[p + "shortconv.out_proj.weight"].T

    # ---- Granite 4.0-H Mamba-2 -----------------------------------------------

    def mamba2_inputs(self, p, h, st, stepwise):
        """ssm_in, the conv (+ bias, silu) and the split: z [n, d_inner],
        xs [n, H, P], B and C [n, G, N], dt [n, H] (softplus'd)."""
        w, n = self.w, len(h)
        di, N, G, H = self.d_inner, self.d_state, self.n_group, self.n_ssm_head
        zxbcdt = h @ w[p + "ssm_in.weight"].T
        e = 2 * di + 2 * G * N  # z | xBC | dt
        z, xbc, dt = zxbcdt[:, :di], zxbcdt[:, di:e], zxbcdt[:, e:]
        kern = w[p + "ssm_conv1d.weight"]
        if stepwise:
            xbc = np.stack([self.conv_step(st, u, kern) for u in xbc])
        else:
            xbc = self.causal_conv(st, xbc, kern)
        if p + "ssm_conv1d.bias" in w:
            xbc = xbc + w[p + "ssm_conv1d.bias"]
        xbc = silu(xbc)
        xs = xbc[:, :di].reshape(n, H, di // H)
        B = xbc[:, di : di + G * N].reshape(n, G, N)
        C = xbc[:, di + G * N :].reshape(n, G, N)
        dt = softplus(dt + w[p + "ssm_dt.bias"])
        return z, xs, B, C, dt

    def mamba2_scan(self, S0, xs, B, C, dt, A):
        """One pass (SSD quadratic form): y [n, H, P] and the final state
        [H, P, N] from S0."""
        n, H, _ = xs.shape
        grp = np.arange(H) // (H // self.n_group)
        y = np.zeros_like(xs)
        S = np.zeros_like(S0)
        tri = np.tril(np.ones((n, n), dtype=bool))
        if not self.carry:
            tri = np.eye(n, dtype=bool)
        for hh in range(H):
            Bh, Ch = B[:, grp[hh]], C[:, grp[hh]]  # [n, N]
            c = np.cumsum(dt[:, hh] * A[hh])  # log decay from the chunk start
            L = np.exp(np.where(tri, c[:, None] - c[None, :], -np.inf))
            M = (Ch @ Bh.T) * L * dt[None, :, hh]
            y[:, hh] = M @ xs[:, hh]
            last = L[-1] * dt[:, hh]  # weights into the final state
            S[hh] = (xs[:, hh] * last[:, None]).T @ Bh
            if self.carry:
                y[:, hh] += np.exp(c)[:, None] * (Ch @ S0[hh].T)
                S[hh] += np.exp(c[-1]) * S0[hh]
        return y, S

    def mamba2_step(self, S, xs, B, C, dt, A):
        """One token: xs [H, P], B/C [G, N], dt [H]; S [H, P, N] updated
        in place; returns y [H, P]."""
        H = xs.shape[0]
        grp = np.arange(H) // (H // self.n_group)
        dA = np.exp(dt * A) if self.carry else np.zeros(H)
        S *= dA[:, None, None]
        S += (dt[:, None] * xs)[:, :, None] * B[grp][:, None, :]
        return np.einsum("hpn,hn->hp", S, C[grp])

    def mamba2_block(self, p, h, st, stepwise=False):
        w, n = self.w, len(h)
        z, xs, B, C, dt = self.mamba2_inputs(p, h, st, stepwise)
        A = w[p + "ssm_a"].reshape(-1)
        if stepwise:
            y = np.stack([self.mamba2_step(st["ssm"], xs[t], B[t], C[t], dt[t], A)
                          for t in range(n)])
        else:
            y, st["ssm"] = self.mamba2_scan(st["ssm"], xs, B, C, dt, A)
        if self.ssm_D:
            y = y + xs * w[p + "ssm_d"].reshape(1, -1, 1)
        y = y.reshape(n, self.d_inner)
        if self.z_gate:
            y = y * silu(z)
        G = self.norm_groups
        y = self.rms(y.reshape(n, G, self.d_inner // G)).reshape(n, self.d_inner)
        y = y * w[p + "ssm_norm.weight"].reshape(-1)
        return y @ w[p + "ssm_out.weight"].T

    # ---- Qwen3.5 gated DeltaNet -----------------------------------------------

    def deltanet_inputs(self, p, h, st, stepwise):
        """q, k [n, H_v, d] (L2-normed, read per value head), v [n, H_v, d],
        z [n, H_v, d], beta [n, H_v], g [n, H_v]."""
        w, n = self.w, len(h)
        d, Hk, Hv = self.d_state, self.n_group, self.n_ssm_head
        qkv = h @ w[p + "attn_qkv.weight"].T
        kern = w[p + "ssm_conv1d.weight"]
        if stepwise:
            qkv = np.stack([self.conv_step(st, u, kern) for u in qkv])
        else:
            qkv = self.causal_conv(st, qkv, kern)
        qkv = silu(qkv)
        q = qkv[:, : Hk * d].reshape(n, Hk, d)
        k = qkv[:, Hk * d : 2 * Hk * d].reshape(n, Hk, d)
        v = qkv[:, 2 * Hk * d :].reshape(n, Hv, d)
        if self.l2_norm:
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + self.eps)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + self.eps)
        kh = np.arange(Hv) % Hk if self.kv_heads_tiled else np.arange(Hv) // (Hv // Hk)
        q, k = q[:, kh], k[:, kh]
        z = (h @ w[p + "attn_gate.weight"].T).reshape(n, Hv, d)
        beta = sigmoid(h @ w[p + "ssm_beta.weight"].T) if self.beta else np.ones((n, Hv))
        g = softplus(h @ w[p + "ssm_alpha.weight"].T + w[p + "ssm_dt.bias"]) * w[p + "ssm_a"]
        if not self.decay:
            g = np.zeros_like(g)
        return q, k, v, z, beta, g

    def deltanet_chunk(self, S0, q, k, v, beta, g):
        """One pass (the triangular-solve form, see the module docstring):
        o [n, H_v, d] and the final state [H_v, d_k, d_v] from S0."""
        n, Hv, d = q.shape
        o = np.zeros_like(v)
        S = np.zeros_like(S0)
        strict = np.tril(np.ones((n, n), dtype=bool), -1)
        incl = np.tril(np.ones((n, n), dtype=bool))
        for hh in range(Hv):
            Q, K, V, b = q[:, hh] / np.sqrt(d), k[:, hh], v[:, hh], beta[:, hh]
            c = np.cumsum(g[:, hh])
            D = np.exp(np.where(incl, c[:, None] - c[None, :], -np.inf))
            KK = K @ K.T
            A = np.where(strict, b[:, None] * D * KK, 0.0)
            S0h = S0[hh] if self.carry else np.zeros_like(S0[hh])
            rhs = b[:, None] * (V - np.exp(c)[:, None] * (K @ S0h))
            if self.carry:
                U = np.linalg.solve(np.eye(n) + A, rhs)
            else:  # every token alone: u_t = beta_t v_t, o_t = (q_t . k_t) u_t
                U = rhs
                D = np.eye(n)
            o[:, hh] = np.exp(c)[:, None] * (Q @ S0h) + (D * (Q @ K.T)) @ U
            S[hh] = np.exp(c[-1]) * S0h + (K * np.exp(c[-1] - c)[:, None]).T @ U
            if not self.carry:
                S[hh] = np.outer(K[-1], U[-1])
        return o, S

    def deltanet_step(self, S, q, k, v, beta, g):
        """One token: q, k, v [H_v, d], beta, g [H_v]; S [H_v, d_k, d_v]
        updated in place; returns o [H_v, d]."""
        d = q.shape[-1]
        if not self.carry:
            S[:] = 0.0
        S *= np.exp(g)[:, None, None]
        kv = np.einsum("hkv,hk->hv", S, k)
        u = beta[:, None] * (v - kv)
        S += k[:, :, None] * u[:, None, :]
        return np.einsum("hkv,hk->hv", S, q) / np.sqrt(d)

    def deltanet_block(self, p, h, st, stepwise=False):
        w, n = self.w, len(h)
        q, k, v, z, beta, g = self.deltanet_inputs(p, h, st, stepwise)
        if stepwise:
            o = np.stack([self.deltanet_step(st["ssm"], q[t], k[t], v[t], beta[t], g[t])
                          for t in range(n)])
        else:
            o, st["ssm"] = self.deltanet_chunk(st["ssm"], q, k, v, beta, g)
        o = self.rms(o, w[p + "ssm_norm.weight"])
        if self.out_gate:
            o = o * silu(z)
        return o.reshape(n, self.d_inner) @ w[p + "ssm_out.weight"].T

    # ---- the model --------------------------------------------------------------

    def recurrent_block(self, p, h, st, stepwise):
        if self.arch == "lfm2":
            return self.shortconv_block(p, h, st, stepwise)
        if self.arch == "granitehybrid":
            return self.mamba2_block(p, h, st, stepwise)
        return self.deltanet_block(p, h, st, stepwise)

    def _run(self, ids, state, stepwise, hidden=False):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("token ids must be a non-empty 1-D list")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError("token id out of vocabulary range")
        if state is None:
            state = self.new_state()
        past = state["n"]
        if past + len(ids) > self.n_ctx:
            raise ValueError(f"{past + len(ids)} tokens exceed the context length {self.n_ctx}")
        x = self.w["token_embd.weight"][ids].astype(np.float64)
        if self.emb_scale:
            x = x * self.emb_scale
        rs = self.res_scale or 1.0
        for L, kind in enumerate(self.kinds):
            p, st = f"blk.{L}.", state["layers"][L]
            h = self.rms(x, self.w[p + "attn_norm.weight"])
            if kind == "a":
                y = self.attention_block(p, h, st, past)
            else:
                y = self.recurrent_block(p, h, st, stepwise)
            x = x + rs * y
            x = x + rs * self.ffn(p, self.rms(x, self.w[p + self.ffn_norm + ".weight"]))
        state["n"] = past + len(ids)
        x = self.rms(x, self.w[self.out_norm])
        if hidden:
            return x
        z = x @ self.out_w.T
        if self.logit_scale:
            z = z / self.logit_scale
        return z

    def forward(self, ids, state=None, hidden=False, chunk=None):
        """Logits [n, n_vocab] of ids after state's tokens (None: a new
        sequence), one pass over the chunk; state is moved on. chunk: pass
        at most that many tokens at a time, carrying the state (long
        prompts: the one-pass forms are quadratic in the chunk)."""
        if chunk is None or len(ids) <= chunk:
            return self._run(ids, state, stepwise=False, hidden=hidden)
        if state is None:
            state = self.new_state()
        return np.concatenate([self._run(ids[i : i + chunk], state, stepwise=False, hidden=hidden)
                               for i in range(0, len(ids), chunk)])

    def forward_stepwise(self, ids, state=None, hidden=False):
        """The same, one token at a time with the per-token recurrences."""
        if state is None:
            state = self.new_state()
        out = [self._run([t], state, stepwise=True, hidden=hidden) for t in ids]
        return np.concatenate(out)

    def drop_recurrent_state(self, state):
        """Zeroes the conv tails and recurrent states, keeping the KV (an
        engine that forgot to carry the state across chunks)."""
        for st in state["layers"]:
            for key in ("conv", "ssm"):
                if key in st:
                    st[key] = np.zeros_like(st[key])

    def greedy(self, ids, n_new):
        """Greedy continuation of ids (EOS not special): (tokens, top-2 gaps)."""
        st = self.new_state()
        z = self.forward(ids, st)[-1]
        toks, gaps = [], []
        for _ in range(n_new):
            top2 = np.partition(z, -2)[-2:]
            gaps.append(float(top2[1] - top2[0]))
            toks.append(int(z.argmax()))
            if len(toks) < n_new:
                z = self.forward([toks[-1]], st)[-1]
        return toks, gaps


def ablated(model, **changes):
    """A shallow copy of model (weights shared) with attributes changed."""
    m = copy.copy(model)
    for k, v in changes.items():
        setattr(m, k, v)
    return m


_CACHE = {}


def load(path):
    key = os.path.realpath(path)
    if key not in _CACHE:
        _CACHE[key] = Model(path)
    return _CACHE[key]


from numpy_llama import kl, log_softmax  # noqa: E402,F401  (the tests' measures)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="output .npy (float64 [n, vocab])")
    ap.add_argument("--stepwise", action="store_true", help="token by token")
    a = ap.parse_args(argv)
    ids = [int(s) for s in a.ids.split(",") if s.strip()]
    m = load(a.model)
    z = m.forward_stepwise(ids) if a.stepwise else m.forward(ids)
    np.save(a.out, z)
    print(f"wrote {a.out}: shape {z.shape}, last argmax {int(z[-1].argmax())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
