"""The speech codec decoder (GGUF architecture wavtokenizer-dec, OuteTTS's
WavTokenizer) run by `zinfer decode-speech` against the float64 reference
(scripts/ref/numpy_wavtokenizer.py) and llama.cpp (llama-cpp-python's
embeddings of the same file, the network's output before the inverse STFT).

The file is speech_files.write_wavtokenizer's: the real widths, random
weights, two ConvNeXt blocks. On 10 code sequences of 1 to 40 codes the
spectrogram and the waveform must be within 1e-5 relative L2 of the
reference, and closer to it than llama.cpp's (whose convolutions run on
float16 im2col columns: ~5e-4); llama.cpp's waveform is its spectrogram
through the reference's inverse STFT. A 16-bit WAV is read back with
Python's wave module; a code out of range and a file whose shapes disagree
are refused with messages that name them, and so is a file of another
architecture.
"""

import json
import os
import subprocess
import wave

import numpy as np
import pytest
import numpy_wavtokenizer as ref
from speech_files import write_wavtokenizer

LENGTHS = (1, 2, 3, 5, 8, 12, 17, 24, 32, 40)
HOP, N_OUT = 320, 1282


def zinfer():
    return os.environ.get("ZINFER_BIN", "build/zinfer")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    d = tmp_path_factory.mktemp("wavtok")
    path, tensors, cfg = write_wavtokenizer(d / "dec.gguf")
    t64 = {k: v.astype(np.float64) for k, v in tensors.items()}
    hp = dict(groups=cfg["groups"], group_eps=cfg["group_eps"], norm_eps=cfg["norm_eps"],
              posnet_layers=cfg["posnet_layers"], convnext_layers=cfg["convnext_layers"])
    rng = np.random.default_rng(47)
    seqs = [rng.integers(0, cfg["n_vocab"], n) for n in LENGTHS]
    refs = [ref.decode(t64, hp, s) for s in seqs]
    return dict(dir=d, path=path, cfg=cfg, seqs=seqs, refs=refs,
                audio=[ref.istft(r, HOP) for r in refs])


def run(args, check=True):
    p = subprocess.run([zinfer(), "decode-speech", *map(str, args)], capture_output=True,
                       text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def read_f32_wav(path):
    """The samples of a mono float32 WAV (format 3), read chunk by chunk."""
    b = open(path, "rb").read()
    assert b[:4] == b"RIFF" and b[8:12] == b"WAVE"
    assert int.from_bytes(b[4:8], "little") == len(b) - 8
    i, fmt, data = 12, None, None
    while i < len(b):
        tag, size = b[i:i + 4], int.from_bytes(b[i + 4:i + 8], "little")
        if tag == b"fmt ":
            fmt = b[i + 8:i + 8 + size]
        elif tag == b"data":
            data = b[i + 8:i + 8 + size]
        i += 8 + size + (size & 1)
    assert fmt is not None and data is not None
    tagv, ch, rate = (int.from_bytes(fmt[0:2], "little"), int.from_bytes(fmt[2:4], "little"),
                      int.from_bytes(fmt[4:8], "little"))
    assert (tagv, ch, rate, int.from_bytes(fmt[14:16], "little")) == (3, 1, 24000, 32)
    return np.frombuffer(data, "<f4")


def llama_spec(path, seqs):
    """llama.cpp's per-code embeddings (the decoder's output) of each
    sequence, one context for all (the decoder keeps no state)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(),
                                                  llama_cpp.llama_model_default_params())
    assert model
    cp = llama_cpp.llama_context_default_params()
    m = max(64, max(len(s) for s in seqs))
    cp.n_ctx = cp.n_batch = cp.n_ubatch = m
    cp.embeddings = True
    cp.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
    cp.n_threads = cp.n_threads_batch = 2
    ctx = llama_cpp.llama_init_from_model(model, cp)
    assert ctx
    out = []
    try:
        for s in seqs:
            b = llama_cpp.llama_batch_init(len(s), 0, 1)
            for i, c in enumerate(s):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(c), i, 1, True
                b.seq_id[i][0] = 0
            b.n_tokens = len(s)
            assert llama_cpp.llama_decode(ctx, b) == 0
            out.append(np.array([np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(ctx, i),
                                                       shape=(N_OUT,)) for i in range(len(s))],
                                np.float64))
            llama_cpp.llama_batch_free(b)
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return out


def test_matches_reference_closer_than_llama(decoder):
    d = decoder
    ours = []
    for k, s in enumerate(d["seqs"]):
        wav, spec = d["dir"] / f"o{k}.wav", d["dir"] / f"o{k}.spec"
        p = run(["--model", d["path"], "--codes", ",".join(map(str, s)), "--out", wav,
                 "--format", "f32", "--spec", spec, "--threads", 2])
        info = json.loads(p.stdout)
        assert info["n_codes"] == len(s) and info["n_samples"] == len(s) * HOP
        assert (info["sample_rate"], info["n_fft"], info["hop"]) == (24000, 1280, 320)
        sp = np.fromfile(spec, "<f4").reshape(len(s), N_OUT)
        au = read_f32_wav(wav)
        assert au.shape == (len(s) * HOP,)
        ours.append((sp, au))
    lspec = llama_spec(d["path"], d["seqs"])
    rows = []
    for (sp, au), r, ra, ls in zip(ours, d["refs"], d["audio"], lspec):
        e_spec, e_wave = ref.rel_l2(sp, r), ref.rel_l2(au, ra)
        l_spec, l_wave = ref.rel_l2(ls, r), ref.rel_l2(ref.istft(ls, HOP), ra)
        rows.append((len(r), e_spec, e_wave, l_spec, l_wave))
    print("\n codes  ours spec  ours wave  llama spec  llama wave")
    for row in rows:
        print(" %5d  %.2e   %.2e   %.2e    %.2e" % row)
    for n, e_spec, e_wave, l_spec, l_wave in rows:
        assert e_spec < 1e-5 and e_wave < 1e-5, (n, e_spec, e_wave)
        assert e_spec < l_spec and e_wave < l_wave, (n, e_spec, l_spec, e_wave, l_wave)


def test_wav16_read_by_wave_module(decoder):
    d = decoder
    s, ra = d["seqs"][4], d["audio"][4]
    out = d["dir"] / "s16.wav"
    run(["--model", d["path"], "--codes", ",".join(map(str, s)), "--out", out])
    with wave.open(str(out), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == len(s) * HOP
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
    want = np.round(np.clip(ra, -1, 1) * 32767)
    assert np.abs(pcm - want).max() <= 1


def test_code_out_of_range_refused(decoder):
    d = decoder
    p = run(["--model", d["path"], "--codes", "5,4096,7", "--out", d["dir"] / "x.wav"],
            check=False)
    assert p.returncode == 1
    assert "code 4096 at position 1 is out of range" in p.stderr and "0..4095" in p.stderr
    assert not (d["dir"] / "x.wav").exists()


SMALL = dict(n_vocab=64, n_features=32, n_embd=64, n_ff=96, groups=8)


@pytest.mark.parametrize("variant, needle", [
    (dict(drop=("convnext.1.gamma.weight",)), "missing tensor 'convnext.1.gamma.weight'"),
    (dict(replace={"posnet.3.conv2.weight": np.zeros((64, 64, 5), np.float32)}),
     "tensor 'posnet.3.conv2.weight' has shape [5, 64, 64], expected [3, 64, 64]"),
    (dict(extra={"attention.group_norm_groups": 7}),
     "wavtokenizer-dec.attention.group_norm_groups (7) does not divide the width 64"),
    (dict(extra={"convnext.embedding_length": 32}),
     "wavtokenizer-dec.convnext.embedding_length is 32, expected the posnet's 64"),
    # the sizes that would reach the inverse STFT's asserts (odd, tiny or
    # over its 4096 table) and a NaN epsilon stop at the load
    (dict(extra={"embedding_length": 259}), "embedding_length is 259: n_fft + 2 must be even"),
    (dict(extra={"embedding_length": 4}), "embedding_length is 4, expected 6..8194"),
    (dict(extra={"embedding_length": 4100}), "embedding_length is 4100: n_fft 4098 is over 4096"),
    (dict(extra={"attention.group_norm_epsilon": float("nan")}),
     "group_norm_epsilon is nan, expected a small positive number"),
])
def test_bad_files_refused(tmp_path, variant, needle):
    path, _, _ = write_wavtokenizer(tmp_path / "bad.gguf", **SMALL, **variant)
    p = run(["--model", path, "--codes", "1,2", "--out", tmp_path / "x.wav"], check=False)
    assert p.returncode == 1 and needle in p.stderr, p.stderr
    assert str(path) in p.stderr


def test_small_file_decodes(tmp_path):
    """Other widths than OuteTTS's come from the file (and an odd frame
    count): the small decoder also matches the reference."""
    path, tensors, cfg = write_wavtokenizer(tmp_path / "small.gguf", **SMALL, n_out=258)
    hp = dict(groups=8, group_eps=cfg["group_eps"], norm_eps=cfg["norm_eps"], posnet_layers=6,
              convnext_layers=2)
    codes = [3, 63, 0, 17, 17, 5, 41]
    spec = tmp_path / "s.spec"
    p = run(["--model", path, "--codes", ",".join(map(str, codes)), "--out", tmp_path / "s.wav",
             "--format", "f32", "--spec", spec])
    assert '"n_fft":256' in p.stdout and '"hop":64' in p.stdout
    r = ref.decode(tensors, hp, codes)
    sp = np.fromfile(spec, "<f4").reshape(len(codes), 258)
    assert ref.rel_l2(sp, r) < 1e-5
    assert ref.rel_l2(read_f32_wav(tmp_path / "s.wav"), ref.istft(r, 64)) < 1e-5


def test_other_architecture_refused(tmp_path):
    from gguf_files import write_gguf
    path = write_gguf(tmp_path / "llama.gguf", "llama", hparams={"block_count": 1})
    p = run(["--model", path, "--codes", "1", "--out", tmp_path / "x.wav"], check=False)
    assert p.returncode == 1
    assert "general.architecture is 'llama': not a speech codec decoder" in p.stderr, p.stderr
    p = run(["--model", path, "--codes", "1", "--out", tmp_path / "x.wav", "--format", "u8"],
            check=False)
    assert p.returncode == 2 and "--format: expected s16 or f32" in p.stderr


def test_codes_file_and_stdin(tmp_path):
    """--codes-file takes the codes separated by commas and / or white space
    (zinfer generate --tts prints them space-separated), '-' from stdin."""
    path, _, _ = write_wavtokenizer(tmp_path / "small.gguf", **SMALL)
    codes = "3,63,0,17,17,5,41"
    run(["--model", path, "--codes", codes, "--out", tmp_path / "a.wav"])
    (tmp_path / "codes.txt").write_text("3 63 0\n17, 17\t5 41\n")
    run(["--model", path, "--codes-file", tmp_path / "codes.txt", "--out", tmp_path / "b.wav"])
    p = subprocess.run([zinfer(), "decode-speech", "--model", str(path), "--codes-file", "-",
                        "--out", str(tmp_path / "c.wav")], input="3 63 0 17 17 5 41",
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    a = (tmp_path / "a.wav").read_bytes()
    assert a == (tmp_path / "b.wav").read_bytes() == (tmp_path / "c.wav").read_bytes()
    p = subprocess.run([zinfer(), "decode-speech", "--model", str(path), "--codes-file", "-",
                        "--out", str(tmp_path / "d.wav")], input="1 2x", capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and "stdin: item 1 is not a code" in p.stderr, p.stderr
