#!/usr/bin/env python3
"""Independent float64 reference of the WavTokenizer decoder (GGUF
architecture "wavtokenizer-dec", OuteTTS's codec decoder) as llama.cpp
builds it (src/models/wavtokenizer-dec.cpp), and of the inverse STFT that
turns its output into a waveform (WavTokenizer / Vocos ISTFT, padding
"same").

Used only by tests (never linked into zinfer).

Activations are x[t][c]: one row per frame (code), channels along the row.
conv(x, W, b) with W [out][in][K] (the file's ne {K, in, out}) is a
cross-correlation with zero padding K//2 each side, y[t][o] = b[o] +
sum_i sum_j W[o][i][j] x[t + j - K//2][i] (ggml_conv_1d_ph).
group_norm(x) splits the channels into G groups of C/G and normalizes each
group over all its frames and channels (mean, biased variance, eps inside
the square root), then times w[c] plus b[c]. layer_norm normalizes each
frame over its channels. gelu is the tanh approximation (ggml_gelu).

  x = embd[codes]                                   [T][features]
  x = conv(x, conv1d, K=7)                          [T][C]
  posnet 0, 1, 3, 4 (resnet): h = swish(gn1(x)); h = conv(h, conv1, K=3);
        h = swish(gn2(h)); h = conv(h, conv2, K=3); x = x + h
  posnet 2 (attention): h = gn(x); q, k, v = h Wq^T + bq, ...;
        a = softmax(q k^T / sqrt(C)) v over all frames (no mask);
        x = x + a Wo^T + bo
  posnet 5: x = gn(x)
  x = layer_norm(x, token_embd_norm)
  convnext i: h = dwconv(x, dw, K=7) (channel c uses only channel c);
        h = layer_norm(h); h = gelu(h pw1^T + b1) pw2^T + b2;
        x = x + gamma * h
  spec = layer_norm(x, output_norm) output^T + output_b  [T][n_fft + 2]

The head (istft): with H = n_fft/2 + 1, mag = min(exp(spec[:, :H]), 100),
phase p = spec[:, H:]; S = mag (cos p + i sin p); each frame
irfft(S[t], n_fft) (the imaginary parts of bins 0 and n_fft/2 are
ignored) times the periodic Hann window, overlap-added at t * hop into
(T-1) hop + n_fft samples, divided by the overlap-added squared window, and
(n_fft - hop)/2 samples cut from each end: T * hop samples.

Module use:
  tensors, hp = load("dec.gguf")
  spec = decode(tensors, hp, codes)     # float64 [T][n_fft + 2]
  audio = istft(spec, hop=320)          # float64 [T * hop]
"""

import numpy as np


def load(path):
    """(tensors name -> float64 array in numpy order, hp dict) of a file."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = "wavtokenizer-dec"

    def val(key):
        f = r.fields[f"{arch}.{key}"]
        return f.contents()

    hp = dict(groups=int(val("attention.group_norm_groups")),
              group_eps=float(val("attention.group_norm_epsilon")),
              norm_eps=float(val("attention.layer_norm_epsilon")),
              posnet_layers=int(val("posnet.block_count")),
              convnext_layers=int(val("convnext.block_count")))
    tensors = {}
    for t in r.tensors:
        a = np.array(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F16:
            a = a.astype(np.float32)
        tensors[t.name] = a.astype(np.float64).reshape([int(n) for n in reversed(t.shape)])
    return tensors, hp


def _conv(x, w, b):
    w = np.asarray(w, np.float64)
    o, i, k = w.shape
    p = k // 2
    t = x.shape[0]
    xp = np.zeros((t + 2 * p, i))
    xp[p:p + t] = x
    y = np.zeros((t, o))
    for j in range(k):
        y += xp[j:j + t] @ w[:, :, j].T
    return y + np.asarray(b, np.float64).reshape(-1)


def _dwconv(x, w, b):
    w = np.asarray(w, np.float64).reshape(x.shape[1], -1)  # [C][K]
    k = w.shape[1]
    p = k // 2
    t = x.shape[0]
    xp = np.zeros((t + 2 * p, x.shape[1]))
    xp[p:p + t] = x
    y = np.zeros_like(x)
    for j in range(k):
        y += xp[j:j + t] * w[:, j]
    return y + np.asarray(b, np.float64).reshape(-1)


def _group_norm(x, w, b, groups, eps):
    t, c = x.shape
    g = x.reshape(t, groups, c // groups)
    mean = g.mean(axis=(0, 2), keepdims=True)
    var = ((g - mean) ** 2).mean(axis=(0, 2), keepdims=True)
    y = ((g - mean) / np.sqrt(var + eps)).reshape(t, c)
    return y * np.asarray(w, np.float64).reshape(-1) + np.asarray(b, np.float64).reshape(-1)


def _layer_norm(x, w, b, eps):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * np.asarray(w, np.float64) + np.asarray(b, np.float64)


def _swish(x):
    return x / (1.0 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def decode(tensors, hp, codes):
    """The decoder's output (llama.cpp's embeddings), float64 [T][n_out]."""
    T = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    G, geps, eps = hp["groups"], hp["group_eps"], hp["norm_eps"]
    x = T["token_embd.weight"][np.asarray(codes)]
    x = _conv(x, T["conv1d.weight"], T["conv1d.bias"])
    for i in range(hp["posnet_layers"]):
        p = f"posnet.{i}."
        if i in (0, 1, 3, 4):
            h = _swish(_group_norm(x, T[p + "norm1.weight"], T[p + "norm1.bias"], G, geps))
            h = _conv(h, T[p + "conv1.weight"], T[p + "conv1.bias"])
            h = _swish(_group_norm(h, T[p + "norm2.weight"], T[p + "norm2.bias"], G, geps))
            h = _conv(h, T[p + "conv2.weight"], T[p + "conv2.bias"])
            x = x + h
        elif i == 2:
            h = _group_norm(x, T[p + "attn_norm.weight"], T[p + "attn_norm.bias"], G, geps)
            q = _conv(h, T[p + "attn_q.weight"], T[p + "attn_q.bias"])
            k = _conv(h, T[p + "attn_k.weight"], T[p + "attn_k.bias"])
            v = _conv(h, T[p + "attn_v.weight"], T[p + "attn_v.bias"])
            s = q @ k.T / np.sqrt(x.shape[1])
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            x = x + _conv(s @ v, T[p + "attn_output.weight"], T[p + "attn_output.bias"])
        else:
            x = _group_norm(x, T[p + "attn_norm.weight"], T[p + "attn_norm.bias"], G, geps)
    x = _layer_norm(x, T["token_embd_norm.weight"], T["token_embd_norm.bias"], eps)
    for i in range(hp["convnext_layers"]):
        p = f"convnext.{i}."
        h = _dwconv(x, T[p + "dw.weight"], T[p + "dw.bias"])
        h = _layer_norm(h, T[p + "norm.weight"], T[p + "norm.bias"], eps)
        h = _gelu(h @ T[p + "pw1.weight"].T + T[p + "pw1.bias"])
        h = h @ T[p + "pw2.weight"].T + T[p + "pw2.bias"]
        x = x + h * T[p + "gamma.weight"]
    x = _layer_norm(x, T["output_norm.weight"], T["output_norm.bias"], eps)
    return x @ T["output.weight"].T + T["output.bias"]


def hann(n):
    """The periodic Hann window (torch.hann_window's default)."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


def istft(spec, hop=320):
    """The waveform of a decoder output [T][n_fft + 2], float64 [T * hop]."""
    spec = np.asarray(spec, np.float64)
    t, n2 = spec.shape
    n_fft = n2 - 2
    hb = n_fft // 2 + 1
    mag = np.minimum(np.exp(spec[:, :hb]), 100.0)
    ph = spec[:, hb:]
    s = mag * (np.cos(ph) + 1j * np.sin(ph))
    frames = np.fft.irfft(s, n=n_fft, axis=1) * hann(n_fft)
    n_out = (t - 1) * hop + n_fft
    y = np.zeros(n_out)
    env = np.zeros(n_out)
    w2 = hann(n_fft) ** 2
    for i in range(t):
        y[i * hop:i * hop + n_fft] += frames[i]
        env[i * hop:i * hop + n_fft] += w2
    pad = (n_fft - hop) // 2
    return y[pad:n_out - pad] / env[pad:n_out - pad]


def rel_l2(a, b):
    """|a - b| / |b| over all values."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))
