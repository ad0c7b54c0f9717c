/*
 * wavtokenizer.h - the speech codec decoder of OuteTTS (WavTokenizer, GGUF
 * architecture "wavtokenizer-dec" as llama.cpp's converter writes it and
 * src/models/wavtokenizer-dec.cpp runs it): audio codec codes in, the
 * magnitude / phase spectrogram and the 24 kHz waveform out.
 *
 * The network, over frames (one per code; x is [n][channels]):
 *   embedding lookup (token_embd, features_length wide);
 *   conv1d (K 7) to the posnet width;
 *   posnet: resnet blocks (group norm, swish, conv K 3, group norm, swish,
 *     conv K 3, residual) at 0, 1, 3, 4, one attention block at 2 (group
 *     norm; Q/K/V/O as K 1 convolutions with biases; one head over all
 *     frames, no mask, scale 1/sqrt(width); residual), a group norm at 5;
 *   LayerNorm (token_embd_norm);
 *   ConvNeXt blocks: depthwise conv K 7, LayerNorm, pw1, GELU (tanh form,
 *     as ggml_gelu), pw2, times gamma, residual;
 *   LayerNorm (output_norm), the output product to n_fft + 2 values a frame.
 * The head and inverse STFT (zi_backend_ops.istft): log-magnitudes and
 * phases to a complex spectrum (magnitudes clamped at 100), irfft, Hann
 * window, overlap-add with hop n_fft / 4, "same" padding: n * hop samples.
 *
 * Every step is a backend op (kernels/backend.h: conv1d, conv1d_dw,
 * group_norm, istft, layernorm, gelu, silu, span_attention, add,
 * get_rows); a backend without one of them is refused at load, naming it.
 * The convolution weights are read as float32 (F32, F16 or any type the
 * reader dequantizes) and laid taps first on the host; gamma is folded into
 * pw2 and its bias.
 *
 * The whole sequence is decoded at once: the attention block sees every
 * frame, so a block of codes decoded alone differs from the same codes
 * inside a longer sequence (llama.cpp decodes all of them in one batch).
 */
#ifndef ZI_WAVTOKENIZER_H
#define ZI_WAVTOKENIZER_H

#include <stdint.h>

#include "backend.h"
#include "zi_error.h"

typedef struct zi_wavtok_config {
    int n_vocab;    /* codes (token_embd rows; wavtokenizer-dec.vocab_size) */
    int n_features; /* features_length: the embedding width */
    int n_embd;     /* posnet / convnext width */
    int n_ff;       /* feed_forward_length: the ConvNeXt blocks' inner width */
    int n_out;      /* embedding_length: n_fft + 2 */
    int posnet_layers, convnext_layers;
    int groups; /* attention.group_norm_groups */
    float group_eps, norm_eps;
    int n_fft;       /* n_out - 2 */
    int hop;         /* n_fft / 4: 320 for OuteTTS's 1280 */
    int sample_rate; /* 24000 (not in the file: OuteTTS's decoder's rate) */
} zi_wavtok_config;

typedef struct zi_wavtok zi_wavtok;

/* Opens the decoder file at path and loads it onto be. Refuses, naming the
 * key or tensor, a file of another architecture or whose hyper-parameters
 * or shapes disagree, and a backend that lacks one of the ops above. */
int zi_wavtok_load(const char *path, zi_backend *be, zi_wavtok **out, zi_error *err);

const zi_wavtok_config *zi_wavtok_get_config(const zi_wavtok *w);

/* Decodes n >= 1 codes (host memory; each below n_vocab, else ZI_EINVAL
 * naming the first one out of range and its position). spec (host memory,
 * n * n_out floats, or NULL) receives the network's output (llama.cpp's
 * embeddings); audio (host, n * hop floats, or NULL) the waveform. */
int zi_wavtok_decode(zi_wavtok *w, const int32_t *codes, int n, float *spec, float *audio,
                     zi_error *err);

void zi_wavtok_free(zi_wavtok *w);

#endif
