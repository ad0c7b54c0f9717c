#!/usr/bin/env python3
"""Independent float64 reference forward pass of a GGUF Llama, Qwen 2/3, Gemma 2/3 or Phi-3 model.

Used only by tests and fixture generation (never linked into zinfer): it reads
the GGUF (gguf_meta.py: what the PyPI `gguf` package's GGUFReader gives,
read faster), dequantizes every tensor to float64 with `gguf.quants` and
runs the Llama architecture as GGUF stores it:

  x = token_embd[ids]
  per layer:  h = x + Wo . attn(RoPE(Wq . rms(x)), RoPE(Wk . rms(x)), Wv . rms(x))
              x = h + Wdown . (silu(Wgate . rms(h)) * (Wup . rms(h)))
  logits = (output or token_embd) . rms(x)

RoPE is llama.cpp's "normal" mode, which GGUF llama files use (the converter
permutes Q/K so that adjacent pairs rotate): pair (x[2i], x[2i+1]) turns by
pos * base^(-2i/rope_dim).  Attention is grouped-query with a causal mask and
1/sqrt(head_dim) scale.  Every hyper-parameter comes from the metadata.

Gemma 3 (general.architecture "gemma3"), as llama.cpp runs it
(src/models/gemma3.cpp):

  x = token_embd[ids] * sqrt(n_embd)
  per layer:  q, k, v = Wq, Wk, Wv . rms(x)     (attn_norm)
              q, k = rms_head(q), rms_head(k)     (attn_q_norm, attn_k_norm)
              q, k = RoPE_neox(q), RoPE_neox(k)   (base: freq_base_swa on local
                                                   layers, default 10000)
              h = x + rms(Wo . attn(q, k, v))     (post_attention_norm)
              x = h + rms(Wdown . (gelu_tanh(Wgate . rms(h)) * Wup . rms(h)))
                                                  (ffn_norm, post_ffw_norm)
  logits = cap * tanh((token_embd . rms(x)) / cap)  (only when the file has
                                                   final_logit_softcapping)

Qwen 2 ("qwen2", src/models/qwen2.cpp): the llama block with NEOX RoPE and
the biases the file has added to Q, K, V (blk.N.attn_q.bias, ...) right
after their products, and output.bias to the logits when present.

Qwen 3 ("qwen3", src/models/qwen3.cpp): NEOX RoPE, and RMSNorm of each
head's Q and K (attn_q_norm, attn_k_norm) before RoPE; biases as qwen2's
(llama.cpp's create_tensor_qkv loads them when present).

Gemma 2 ("gemma2", src/models/gemma2.cpp): Gemma 3's block without the Q/K
norms; attention scores capped, softmax(c * tanh(q.k * scale / c)) with
c = attn_logit_softcapping (default 50); the logits capped at
final_logit_softcapping (default 30, always); attention.sliding_window
defaults to 4096 and layer l is local when l % p < p - 1 with p =
attention.sliding_window_pattern, default 2 (the even layers); local
layers' RoPE base rope.freq_base_swa, default rope.freq_base; the
46-layer 27B's scale 1/sqrt(n_embd/n_head); the output head is always
token_embd (llama.cpp never reads output.weight for gemma2).

NEOX RoPE rotates the pairs (x[i], x[i + rope_dim/2]).  A layer is local
(sliding window) when l % p < p - 1 for attention.sliding_window_pattern p
(default 6); a local layer's query at position i sees keys i-w+1..i for
w = attention.sliding_window.  Attention scale 1/sqrt(key_length), or
1/sqrt(n_embd/n_head) for the 62-layer 27B (llama.cpp's rule).  The norm
weights are used as stored (the converter already added Gemma's +1).

RoPE scaling (llama.cpp's llama-model.cpp load_hparams, llama-context.cpp
and ggml's rope with freq_factors), for every family: rope.scaling.type
defaults to "linear"; its factor (rope.scaling.factor, else
rope.scale_linear; 0 or absent: 1) divides every angle unless the type is
"none"; "yarn" is below; unknown types are refused.  Pair i's angle is
  pos * (1/factor) * base^(-2i/rope_dim) / ff[i]
with ff the per-pair frequency factors: the file's rope_freqs (Llama 3),
or for phi3 (and a "longrope" llama file) rope_factors_long when the
sequence context (n_ctx_seq) exceeds rope.scaling.original_context_length
(default context_length), else rope_factors_short; absent: all 1.  cos
and sin are multiplied by rope.scaling.attn_factor (default 1).  Local
(sliding-window) layers use no linear scale.

Phi-3 (general.architecture "phi3", src/models/phi3.cpp): the llama block
with NEOX RoPE; Q, K, V are rows [0, q), [q, q+kv), [q+kv, q+2kv) of the
fused blk.N.attn_qkv.weight when present; the feed-forward's
blk.N.ffn_up.weight holds 2*n_ff rows, gate first (silu(gate) * up, as
ggml_swiglu splits it); attention.sliding_window is ignored (llama.cpp
disables Phi SWA).

Mixture-of-experts families (llama.cpp's build_moe_ffn, src/llama-graph.cpp).
The feed-forward of every layer is routed: router logits z = Wr . h (+ the
router bias blk.N.ffn_gate_inp.bias when present), then per token

  SOFTMAX gating:         p = softmax(z) over all experts, the k largest p
                          chosen, their p the weights;
  SOFTMAX_WEIGHT gating:  the k largest z chosen, the weights softmax of
                          the chosen z;

with k = <arch>.expert_used_count; when norm_w, weights /= max(sum,
6.103515625e-5).  Each chosen expert e adds weight * down_e(act(gate_e h,
up_e h)) (blk.N.ffn_{gate,up,down}_exps: GGUF [n_embd, n_ff_exp, n_expert]
and [n_ff_exp, n_embd, n_expert], numpy [e][out][in]; biases
ffn_*_exps.bias when present), act(g, u) = silu(g) * u.  Ties in the top-k
go to the lower expert index.  llama.cpp scales the weights by
<arch>.expert_weights_scale only for the families whose loader reads that
key (deepseek, glm4-moe, ...): none of these four, so it is not read here
either (w_scale stays 1; a file carrying the key gets the same logits from
both).

  qwen3moe (src/models/qwen3moe.cpp): qwen3's attention (per-head Q/K
    RMSNorm, NEOX RoPE); SOFTMAX gating, norm_w true; n_ff_exp =
    expert_feed_forward_length, else feed_forward_length / expert_used_count.
  qwen2moe (src/models/qwen2moe.cpp): qwen2's attention (Q/K/V biases,
    NEOX); SOFTMAX gating, norm_w false; plus a shared expert added to the
    routed sum: sigmoid(ffn_gate_inp_shexp . h) * down_sh(silu(gate_sh h) *
    up_sh h) (ffn_gate_inp_shexp: [n_embd], one logit per token; width
    expert_shared_feed_forward_length, else feed_forward_length).
  llama with llama.expert_count > 0 (Mixtral; src/models/llama.cpp): the
    llama block (normal RoPE) with ffn_gate_inp + ffn_*_exps instead of the
    dense feed-forward; SOFTMAX gating, norm_w true; the experts' width is
    feed_forward_length (llama.cpp's llama loader ignores
    expert_feed_forward_length).
  gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE, src/models/openai-moe.cpp):
    NEOX RoPE; Q/K/V biases when present, attn_output.bias; scale
    1/sqrt(head_dim); attention sinks: blk.N.attn_sinks.weight [n_head],
    one logit per head that joins the softmax's denominator only
    (ggml_soft_max_add_sinks: p_j = exp(s_j - m) / (sum_j exp(s_j - m) +
    exp(sink - m)), m = max(max_j s_j, sink)); attention.sliding_window
    (required) with attention.sliding_window_pattern defaulting to 2: layer
    l local when l % 2 < 1 (the even layers, layer 0 first), local layers'
    RoPE base rope.freq_base_swa (default rope.freq_base) and the same
    frequency scaling as the global layers; the feed-forward's norm is
    blk.N.post_attention_norm.weight (there is no ffn_norm); router with
    bias, SOFTMAX_WEIGHT gating, norm_w false; experts with biases and
    ggml_swiglu_oai (ggml-cpu/ops.cpp) as act: x = min(g, 7), y =
    clamp(u, -7, 7), x * sigmoid(1.702 x) * (y + 1); an untied output.weight.

YaRN (rope.scaling.type "yarn", for every family, as llama.cpp;
llama-context.cpp, ggml-cpu/ops.cpp rope_yarn, ggml.c
ggml_rope_yarn_corr_dims): factor f = rope.scaling.factor, freq_scale s =
1/f, ext_factor 1, beta_fast 32, beta_slow 1, n_ctx_orig =
rope.scaling.original_context_length (default context_length).  Pair i
(of n = rope_dim/2) has theta_extrap = pos * base^(-2i/rope_dim) and
  theta = s * theta_extrap * (1 - r_i) + theta_extrap * r_i,
  r_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1),
  lo = max(0, floor(c(beta_fast))), hi = min(rope_dim - 1, ceil(c(beta_slow))),
  c(b) = rope_dim * ln(n_ctx_orig / (2 pi b)) / (2 ln base);
cos and sin are multiplied by mscale = a * (1 + 0.1 ln f), where llama.cpp
sets a = g(f) / (1 + 0.1 ln f) * rope.scaling.attn_factor (default 1),
g(f) = 1 + 0.1 ln f for f > 1, else 1: so mscale = 1 + 0.1 ln f for f > 1.

Module use:   import numpy_llama; numpy_llama.logits(path, [1, 2, 3])
CLI use:      numpy_llama.py --model M --ids 1,2,3 --out logits.npy
"""

import argparse
import os
import sys

# One BLAS thread unless told otherwise: the reference is mostly matrix-vector
# work, and OpenBLAS's spinning threads slow it several-fold on a busy 2-core
# machine. (Only effective when this module is imported before numpy.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import refcache  # noqa: E402

DEFAULT_MODEL = os.path.join(
    os.environ.get("ZINFER_HOME", os.path.expanduser("~/.cache/zinfer")),
    "models",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
)


# Mixture-of-experts architectures (besides "llama" files with experts).
MOE_ARCHS = ("qwen3moe", "qwen2moe", "gpt-oss")

# llama.cpp's floor for the sum of the chosen experts' weights (the smallest
# normal float16) before it divides by it.
MOE_WSUM_MIN = 6.103515625e-5


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise KeyError(f"GGUF metadata key missing: {key}")
    return f.contents()


class Model:
    """Hyper-parameters plus float64 weights, dequantized once.

    Model(path) gives a refcache proxy (scripts/ref/refcache.py) unless
    ZINFER_REFCACHE=0: it dequantizes the file only when a result is not in
    the disk cache (forward and greedy without a KV cache or routing
    argument are looked up there)."""

    # the methods and arguments whose results refcache keeps
    PURE = {"forward": ("ids", "last_only", "rows", "hidden", "embd", "reach", "lora"),
            "greedy": ("ids", "n_new")}

    def __new__(cls, *args, **kw):
        lazy = refcache.lazy_model(cls, args, kw, cls.PURE) if args or kw else None
        return lazy if lazy is not None else super().__new__(cls)

    def __init__(self, path, n_ctx_seq=None):
        import gguf_meta  # GGUFReader's fields and tensors, read in a fraction of its time

        self.path = path
        r = gguf_meta.read(path)
        arch = _field(r, "general.architecture")
        if arch not in ("llama", "gemma3", "phi3", "qwen2", "qwen3", "gemma2") + MOE_ARCHS:
            raise ValueError(f"{path}: architecture {arch!r} is not supported here")
        self.arch = arch
        gemma = arch in ("gemma3", "gemma2")

        def hp(name, default=None):
            return _field(r, f"{arch}.{name}", default)

        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_expert = int(hp("expert_count", 0))
        self.moe = arch in MOE_ARCHS or (arch == "llama" and self.n_expert > 0)
        # MoE files need no dense width (gpt-oss's may lack the key)
        self.n_ff = int(hp("feed_forward_length", 0 if self.moe else None))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = int(hp("attention.key_length", self.n_embd // self.n_head))
        if int(hp("attention.value_length", self.head_dim)) != self.head_dim:
            raise ValueError("value_length != key_length")
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.rope_dim = int(hp("rope.dimension_count", self.head_dim))
        self.eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.n_ctx = int(hp("context_length"))
        if "tokenizer.ggml.tokens" in r.fields:
            self.n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
        else:  # a file without a tokenizer (scripts/ref/random_gguf.py): the embedding's rows
            emb = next(t for t in r.tensors if t.name == "token_embd.weight")
            self.n_vocab = int(emb.shape[1])
        # Family switches (the C side's model_worker/family.c, derived here
        # independently from llama.cpp's model code).
        g2 = arch == "gemma2"
        self.neox = arch != "llama"
        self.qk_norm = arch in ("gemma3", "qwen3", "qwen3moe")
        self.post_norms = self.geglu = gemma
        self.embd_scale = np.sqrt(self.n_embd) if gemma else 1.0
        self.softcap = float(hp("final_logit_softcapping", 30.0 if g2 else 0.0)) if gemma else 0.0
        self.attn_softcap = float(hp("attn_logit_softcapping", 50.0)) if g2 else 0.0
        self.scale = 1.0 / np.sqrt(self.head_dim)
        if gemma and self.n_layer == (46 if g2 else 62):
            self.scale = 1.0 / np.sqrt(self.n_embd // self.n_head)
        self.window = int(hp("attention.sliding_window", 4096 if g2 else 0)) if gemma else 0  # phi3: ignored
        oss = arch == "gpt-oss"
        if oss:  # required by llama.cpp's loader
            self.window = int(hp("attention.sliding_window"))
        self.local = [False] * self.n_layer
        self.rope_base_swa = self.rope_base
        if self.window:
            # get_arr / get_key with _field's default: 0 is a real value
            f = r.fields.get(f"{arch}.attention.sliding_window_pattern")
            pat = f.contents() if f is not None else (2 if g2 or oss else 6)
            if isinstance(pat, list):
                self.local = [bool(b) for b in pat]
            else:
                pat = int(pat)
                self.local = [pat == 0 or L % pat < pat - 1 for L in range(self.n_layer)]
            f = r.fields.get(f"{arch}.rope.freq_base_swa")
            self.rope_base_swa = float(f.contents()) if f is not None else (
                self.rope_base if g2 or oss else 10000.0)
        self._moe_hparams(hp)

        self.w = {}
        for t in r.tensors:
            a = gguf_meta.dequantize(t.data, t.tensor_type)  # gguf.quants' values, faster
            # GGUF shape lists ne0 (the contiguous dim) first; numpy wants
            # rows first, so [in, out] in GGUF becomes [out, in] here.
            shape = tuple(int(d) for d in reversed(t.shape))
            # Huge tables (Gemma's 262144-row embedding) stay float32: their
            # dequantized values are float32 already (exact), and products
            # with them are computed in float64 in chunks (_head).
            big = a.size > 50_000_000
            self.w[t.name] = np.asarray(a, dtype=np.float32 if big else np.float64).reshape(shape)
        if arch == "phi3":  # split the fused tensors (see the module docstring)
            qd, kvd = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
            for L in range(self.n_layer):
                p = f"blk.{L}."
                if p + "attn_qkv.weight" in self.w:
                    qkv = self.w.pop(p + "attn_qkv.weight")
                    if qkv.shape[0] != qd + 2 * kvd:
                        raise ValueError(f"{p}attn_qkv.weight has {qkv.shape[0]} rows")
                    self.w[p + "attn_q.weight"] = qkv[:qd]
                    self.w[p + "attn_k.weight"] = qkv[qd : qd + kvd]
                    self.w[p + "attn_v.weight"] = qkv[qd + kvd :]
                up = self.w[p + "ffn_up.weight"]
                if up.shape[0] != 2 * self.n_ff:
                    raise ValueError(f"{p}ffn_up.weight has {up.shape[0]} rows")
                self.w[p + "ffn_gate.weight"] = up[: self.n_ff]
                self.w[p + "ffn_up.weight"] = up[self.n_ff :]

        # RoPE scaling (see the module docstring).
        stype = str(hp("rope.scaling.type", "linear"))
        if stype not in ("none", "linear", "longrope", "yarn"):
            raise ValueError(f"rope.scaling.type {stype!r} is not supported")
        factor = float(hp("rope.scaling.factor", hp("rope.scale_linear", 0.0)))
        self.freq_scale = 1.0 if stype == "none" or factor == 0.0 else 1.0 / factor
        self.attn_factor = float(hp("rope.scaling.attn_factor", 1.0))
        self.n_ctx_orig = int(hp("rope.scaling.original_context_length", self.n_ctx))
        self.n_ctx_seq = self.n_ctx if n_ctx_seq is None else int(n_ctx_seq)
        ff = None
        if arch == "phi3" or stype == "longrope":
            name = "long" if self.n_ctx_seq > self.n_ctx_orig else "short"
            ff = self.w.get(f"rope_factors_{name}.weight")
        elif arch == "llama":
            ff = self.w.get("rope_freqs.weight")
        self.rope_ff = np.ones(self.rope_dim // 2) if ff is None else np.asarray(ff, np.float64)
        if self.rope_ff.shape != (self.rope_dim // 2,):
            raise ValueError(f"rope factors of shape {self.rope_ff.shape}")

        self.out_w = self.w["token_embd.weight"] if g2 else self.w.get(
            "output.weight", self.w["token_embd.weight"])
        self.out_b = self.w.get("output.bias")
        if self.out_w.shape[0] != self.n_vocab:
            raise ValueError("output head rows != vocabulary size")

        # RoPE inverse frequencies for the rotated part of each head.
        i = np.arange(0, self.rope_dim, 2, dtype=np.float64)
        self.inv_freq = self.freq_scale * self.rope_base ** (-i / self.rope_dim) / self.rope_ff
        self.inv_freq_swa = self.rope_base_swa ** (-i / self.rope_dim) / self.rope_ff
        # YaRN (see the module docstring): ext_factor 1, and cos/sin scaled
        self.yarn = stype == "yarn" and self.freq_scale != 1.0
        self.yarn_ext_factor = 1.0 if self.yarn else 0.0
        self.yarn_beta_fast, self.yarn_beta_slow = 32.0, 1.0
        self.rope_mscale = 1.0
        if self.yarn:
            f = 1.0 / self.freq_scale
            g = 1.0 + 0.1 * np.log(f) if f > 1.0 else 1.0
            self.attn_factor *= g / (1.0 + 0.1 * np.log(f))  # llama-context.cpp
            self.yarn_tables()
        elif oss:  # gpt-oss scales its local layers as its global ones
            self.inv_freq_swa = self.freq_scale * self.inv_freq_swa

    def yarn_tables(self):
        """Sets inv_freq, inv_freq_swa and rope_mscale from the YaRN
        attributes (yarn_ext_factor, yarn_beta_fast/slow, freq_scale,
        attn_factor): theta is linear in pos, so each pair's mix of
        interpolated and extrapolated angle is one inverse frequency.
        Called again after a change to those attributes (the tests'
        ablations)."""
        d, fs = self.rope_dim, self.freq_scale
        i = np.arange(d // 2, dtype=np.float64)

        def inv(base):
            def corr(beta):
                return d * np.log(self.n_ctx_orig / (beta * 2 * np.pi)) / (2 * np.log(base))

            lo = max(0.0, float(np.floor(corr(self.yarn_beta_fast))))
            hi = min(d - 1.0, float(np.ceil(corr(self.yarn_beta_slow))))
            ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
            mix = ramp * self.yarn_ext_factor
            return base ** (-2.0 * i / d) / self.rope_ff * (fs * (1.0 - mix) + mix)

        self.inv_freq, self.inv_freq_swa = inv(self.rope_base), inv(self.rope_base_swa)
        self.rope_mscale = 1.0
        if self.yarn_ext_factor != 0.0:  # ggml's rope_yarn
            self.rope_mscale = 1.0 + 0.1 * np.log(1.0 / fs)

    def _moe_hparams(self, hp):
        """The mixture-of-experts switches (see the module docstring)."""
        self.n_expert_used = int(hp("expert_used_count", 0)) if self.moe else 0
        self.gating = "softmax_weight" if self.arch == "gpt-oss" else "softmax"
        self.norm_w = self.arch in ("qwen3moe", "llama")
        self.w_scale = 1.0
        self.shexp = self.shexp_gate = self.arch == "qwen2moe"
        self.swiglu_oai = self.arch == "gpt-oss"
        self.swiglu_alpha, self.swiglu_limit = 1.702, 7.0
        self.sinks = self.arch == "gpt-oss"
        self.ffn_norm = "post_attention_norm" if self.arch == "gpt-oss" else "ffn_norm"
        self.n_ff_exp = self.n_ff_shexp = 0
        if not self.moe:
            return
        if self.n_expert <= 0 or not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError(f"expert_count {self.n_expert}, expert_used_count "
                             f"{self.n_expert_used}")
        if self.arch == "llama":
            self.n_ff_exp = self.n_ff
        elif self.arch == "gpt-oss":  # required there
            self.n_ff_exp = int(hp("expert_feed_forward_length"))
        else:
            self.n_ff_exp = int(hp("expert_feed_forward_length", 0)) or (
                self.n_ff // self.n_expert_used)
        if self.arch == "qwen2moe":
            self.n_ff_shexp = int(hp("expert_shared_feed_forward_length", 0)) or self.n_ff

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, local=False):
        """x: [n, heads, head_dim]; rotates adjacent pairs of the first
        rope_dim (NEOX: pairs i, i + rope_dim/2)."""
        inv = self.inv_freq_swa if local else self.inv_freq
        ang = pos[:, None] * inv[None, :]  # [n, rope_dim/2]
        mscale = self.attn_factor * self.rope_mscale
        c = np.cos(ang)[:, None, :] * mscale
        s = np.sin(ang)[:, None, :] * mscale
        y = x.copy()
        if self.neox:
            h = self.rope_dim // 2
            i0, i1 = slice(0, h), slice(h, self.rope_dim)
        else:
            i0, i1 = slice(0, self.rope_dim, 2), slice(1, self.rope_dim, 2)
        x0, x1 = x[..., i0], x[..., i1]
        y[..., i0] = x0 * c - x1 * s
        y[..., i1] = x0 * s + x1 * c
        return y

    def _head(self, x):
        """x . out_w^T in float64, in chunks of the vocabulary (out_w may be a
        float32 table too large to copy whole)."""
        out = np.empty((x.shape[0], self.n_vocab))
        for r0 in range(0, self.n_vocab, 16384):
            out[:, r0 : r0 + 16384] = x @ self.out_w[r0 : r0 + 16384].astype(np.float64).T
        return out

    def moe_ffn(self, p, h, routing=None):
        """The routed feed-forward of layer prefix p (e.g. "blk.0.") on
        h [n, n_embd] (already normed); routing: a list that gets
        (chosen experts [n, k], their weights [n, k], router logits
        [n, n_expert]) appended."""
        w = self.w
        z = h @ w[p + "ffn_gate_inp.weight"].T  # [n, n_expert]
        if p + "ffn_gate_inp.bias" in w:
            z = z + w[p + "ffn_gate_inp.bias"]
        k = self.n_expert_used
        if self.gating == "softmax":
            probs = np.exp(z - z.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
        else:  # softmax_weight: chosen by logit, weighted by softmax of the chosen
            probs = z
        sel = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        wts = np.take_along_axis(probs, sel, axis=-1)
        if self.gating == "softmax_weight":
            wts = np.exp(wts - wts.max(axis=-1, keepdims=True))
            wts /= wts.sum(axis=-1, keepdims=True)
        if self.norm_w:
            wts = wts / np.maximum(wts.sum(axis=-1, keepdims=True), MOE_WSUM_MIN)
        if self.w_scale not in (0.0, 1.0):
            wts = wts * self.w_scale
        if routing is not None:
            routing.append((sel, wts, z))
        gate, up, down = (w[p + f"ffn_{m}_exps.weight"] for m in ("gate", "up", "down"))
        bias = {m: w.get(p + f"ffn_{m}_exps.bias") for m in ("gate", "up", "down")}
        out = np.zeros_like(h)
        for e in np.unique(sel):
            tok, slot = np.nonzero(sel == e)
            x = h[tok]
            g = x @ gate[e].T
            u = x @ up[e].T
            if bias["gate"] is not None:
                g = g + bias["gate"][e]
            if bias["up"] is not None:
                u = u + bias["up"][e]
            if self.swiglu_oai:
                g = np.minimum(g, self.swiglu_limit)
                u = np.clip(u, -self.swiglu_limit, self.swiglu_limit)
                a = g / (1.0 + np.exp(-self.swiglu_alpha * g)) * (u + 1.0)
            else:
                a = g / (1.0 + np.exp(-g)) * u
            d = a @ down[e].T
            if bias["down"] is not None:
                d = d + bias["down"][e]
            out[tok] += wts[tok, slot][:, None] * d
        if self.shexp:  # qwen2moe's shared expert
            g = h @ w[p + "ffn_gate_shexp.weight"].T
            u = h @ w[p + "ffn_up_shexp.weight"].T
            f = (g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down_shexp.weight"].T
            if self.shexp_gate:
                f = f / (1.0 + np.exp(-(h @ w[p + "ffn_gate_inp_shexp.weight"])))[:, None]
            out += f
        return out

    def _mm(self, h, name, lora):
        """h @ W^T for weight `name`, plus each LoRA adapter's term
        scale * (h @ A^T) @ B^T (lora: [(Adapter, user scale)])."""
        y = h @ self.w[name].T
        for ad, user_scale in lora or ():
            ab = ad.terms.get(name)
            if ab is not None:
                y = y + ad.scale(user_scale) * ((h @ ab[0].T) @ ab[1].T)
        return y

    def forward(self, ids, cache=None, last_only=False, rows=None, hidden=False,
                routing=None, embd=None, reach=None, lora=None):
        """Logits [n, n_vocab] for ids appended after the cache's tokens.

        hidden: return the final hidden state instead [n, dim] (after the
        output norm, before the output head: what llama.cpp's embedding
        mode pools for decoder models).

        cache: None for a fresh sequence, or a dict from new_cache() that
        holds the keys/values of the earlier tokens and is extended here.
        last_only: compute the output head for the last position only.
        rows: compute it for these positions (indices into ids) only; the
        head is most of the work with a 262144-token vocabulary.
        routing: a list; MoE models append each layer's (chosen experts
        [n, k], weights [n, k], router logits [n, n_expert]) to it, layer
        by layer (the router logits include the router bias).
        embd: input embeddings [n, dim] with NaN rows where the token's own
        embedding is used (an image's soft tokens, unscaled: llama.cpp
        scales token rows only); those positions' ids are not looked up.
        reach: absolute positions [n]: query i also sees keys past itself
        up to reach[i] (gemma3's image tokens see their whole image, as
        llama.cpp decodes an image non-causally); None: causal.
        lora: LoRA adapters on every token, [(Adapter, user scale)]
        (load_lora); each adapted product W h becomes W h + s B (A h),
        s = user scale * alpha / rank, in float64.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("token ids must be a non-empty 1-D list")
        given = None
        if embd is not None:
            embd = np.asarray(embd, dtype=np.float64)
            given = ~np.isnan(embd[:, 0])
            ids = np.where(given, 0, ids)
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError("token id out of vocabulary range")
        if cache is None:
            cache = self.new_cache()
        n, past = len(ids), cache["n"]
        if past + n > self.n_ctx:
            raise ValueError(f"{past + n} tokens exceed the context length {self.n_ctx}")
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        group = nh // nkv
        pos = np.arange(past, past + n, dtype=np.float64)
        # Query i (absolute position past+i) sees keys 0..past+i.
        mask = np.triu(np.full((n, past + n), -np.inf), k=past + 1)
        if reach is not None:
            kpos_all = np.arange(past + n)[None, :]
            mask = np.where(kpos_all > np.asarray(reach)[:, None], -np.inf, 0.0)
        if self.window:  # local layers: key j hidden when i - j >= window
            qpos = np.arange(past, past + n)[:, None]
            kpos = np.arange(past + n)[None, :]
            mask_local = np.where(qpos - kpos >= self.window, -np.inf, mask)
        scale = self.scale

        x = self.w["token_embd.weight"][ids].astype(np.float64) * self.embd_scale
        if given is not None:
            x[given] = embd[given]
        for L in range(self.n_layer):
            p = f"blk.{L}."
            h = self.rms(x, self.w[p + "attn_norm.weight"])
            q = self._mm(h, p + "attn_q.weight", lora).reshape(n, nh, hd)
            k = self._mm(h, p + "attn_k.weight", lora).reshape(n, nkv, hd)
            v = self._mm(h, p + "attn_v.weight", lora).reshape(n, nkv, hd)
            # biases (qwen2): added right after the products, before norms
            if p + "attn_q.bias" in self.w:
                q = q + self.w[p + "attn_q.bias"].reshape(nh, hd)
            if p + "attn_k.bias" in self.w:
                k = k + self.w[p + "attn_k.bias"].reshape(nkv, hd)
            if p + "attn_v.bias" in self.w:
                v = v + self.w[p + "attn_v.bias"].reshape(nkv, hd)
            if self.qk_norm:
                q = self.rms(q, self.w[p + "attn_q_norm.weight"])
                k = self.rms(k, self.w[p + "attn_k_norm.weight"])
            q = self.rope(q, pos, self.local[L])
            k = self.rope(k, pos, self.local[L])
            k = np.concatenate([cache["k"][L], k]) if past else k
            v = np.concatenate([cache["v"][L], v]) if past else v
            cache["k"][L], cache["v"][L] = k, v
            # Query head j uses kv head j // group (llama.cpp's GQA mapping).
            kr = np.repeat(k, group, axis=1)
            vr = np.repeat(v, group, axis=1)
            att = np.einsum("qhd,khd->hqk", q, kr) * scale
            if self.attn_softcap:  # gemma2: before the mask and softmax
                att = self.attn_softcap * np.tanh(att / self.attn_softcap)
            att = att + (mask_local if self.local[L] else mask)
            if self.sinks:  # gpt-oss: a per-head logit in the denominator only
                sink = self.w[p + "attn_sinks.weight"][:, None, None]
                m = np.maximum(att.max(axis=-1, keepdims=True), sink)
                att = np.exp(att - m)
                att /= att.sum(axis=-1, keepdims=True) + np.exp(sink - m)
            else:
                att -= att.max(axis=-1, keepdims=True)
                att = np.exp(att)
                att /= att.sum(axis=-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", att, vr).reshape(n, nh * hd)
            o = self._mm(o, p + "attn_output.weight", lora)
            if self.moe and p + "attn_output.bias" in self.w:  # gpt-oss
                o = o + self.w[p + "attn_output.bias"]
            if self.post_norms:
                o = self.rms(o, self.w[p + "post_attention_norm.weight"])
            x = x + o

            h = self.rms(x, self.w[p + self.ffn_norm + ".weight"])
            if self.moe:
                x = x + self.moe_ffn(p, h, routing)
                continue
            g = self._mm(h, p + "ffn_gate.weight", lora)
            u = self._mm(h, p + "ffn_up.weight", lora)
            if self.geglu:  # GELU, tanh approximation
                a = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3)))
            else:
                a = g / (1.0 + np.exp(-g))
            f = self._mm(a * u, p + "ffn_down.weight", lora)
            if self.post_norms:
                f = self.rms(f, self.w[p + "post_ffw_norm.weight"])
            x = x + f
        cache["n"] = past + n

        if last_only:
            x = x[-1:]
        elif rows is not None:
            x = x[np.asarray(rows, dtype=np.int64)]
        x = self.rms(x, self.w["output_norm.weight"])
        if hidden:
            return x
        z = self._head(x)  # [n or 1, n_vocab]
        if self.out_b is not None:
            z = z + self.out_b
        if self.softcap:
            z = self.softcap * np.tanh(z / self.softcap)
        return z

    def new_cache(self):
        return {"n": 0, "k": [None] * self.n_layer, "v": [None] * self.n_layer}

    def greedy(self, ids, n_new):
        """Greedy continuation of ids (EOS not special): (tokens, top-2 gaps)."""
        cache = self.new_cache()
        z = self.forward(ids, cache, last_only=True)[-1]
        toks, gaps = [], []
        for _ in range(n_new):
            top2 = np.partition(z, -2)[-2:]
            gaps.append(float(top2[1] - top2[0]))
            toks.append(int(z.argmax()))
            if len(toks) < n_new:
                z = self.forward([toks[-1]], cache, last_only=True)[-1]
        return toks, gaps


class Adapter:
    """A LoRA adapter in llama.cpp's GGUF adapter format, float64: terms
    maps a base weight's name to (A [rank, in], B [out, rank])."""

    def __init__(self, path):
        import gguf

        r = gguf.GGUFReader(path)

        def field(key, default=None):
            f = r.fields.get(key)
            if f is None:
                return default
            v = f.parts[f.data[0]]
            return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0]

        if field("general.type") != "adapter" or field("adapter.type") != "lora":
            raise ValueError(f"{path}: not a LoRA adapter")
        self.path = path
        self.arch = field("general.architecture")
        self.alpha = float(field("adapter.lora.alpha", 0.0))
        t = {x.name: np.asarray(x.data, dtype=np.float64) for x in r.tensors}
        self.terms = {}
        for name, a in t.items():
            if name.endswith(".lora_a"):
                base = name[:-len(".lora_a")]
                self.terms[base] = (a, t[base + ".lora_b"])
        self.rank = next(iter(self.terms.values()))[0].shape[0]

    def scale(self, user_scale):
        return user_scale * self.alpha / self.rank if self.alpha else user_scale

    def refcache_key(self):
        """What a cached forward(lora=...) is keyed by: the adapter file."""
        return ("lora adapter", refcache.file_sha256(self.path))


# The models load() has dequantized, most recently used last. Bounded: a
# model is 8 bytes a weight here (Gemma 3 270M ~2 GB), and one pytest
# process loads many in turn.
_CACHE = {}
_CACHE_MAX = 2


def load(path=DEFAULT_MODEL):
    """The model at path, dequantized once while it stays among the last
    _CACHE_MAX models loaded."""
    key = os.path.realpath(path)
    model = _CACHE.pop(key, None) or Model(path)
    _CACHE[key] = model
    while len(_CACHE) > _CACHE_MAX:
        del _CACHE[next(iter(_CACHE))]
    return model


def logits(model, token_ids):
    """float64 logits [len(token_ids), n_vocab]; model is a Model or a path."""
    if not isinstance(model, Model):
        model = load(model)
    return model.forward(token_ids)


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl(ref_logits, other_logits):
    """Per-position KL(ref || other) in nats, from logits [n, vocab]."""
    lp = log_softmax(ref_logits)
    lq = log_softmax(other_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="output .npy (float64 [n, vocab])")
    a = ap.parse_args(argv)
    ids = [int(s) for s in a.ids.split(",") if s.strip()]
    z = logits(a.model, ids)
    np.save(a.out, z)
    print(f"wrote {a.out}: shape {z.shape}, last argmax {int(z[-1].argmax())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
