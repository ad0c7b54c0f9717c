"""Served speech: the `speech` op over msgpack and POST /v1/audio/speech, on
`zinfer serve --tts-decoder` with the two random-weight test files
(tts_llm_files.py's OuteTTS-0.2 codec LLM, speech_files.py's WavTokenizer
decoder), docs/speech.md.

  - a speech request streams chunks whose "audio" holds float32 or 16-bit
    samples at 24 kHz, then a final frame with usage; every code is one
    the decoder takes (0..4095), and the samples are n_codes x 320;
  - the samples equal the float64 numpy reference of the decoder run over
    the same block windows (tts_stream.h), so the streamed audio is the
    one function of the codes that an unstreamed decode of the same scheme
    gives; 16-bit equals the float32 request's samples rounded;
  - a seeded speech request beside text streams gives the same audio and
    codes as alone;
  - bad inputs (empty text, text too long, text or a voice not a string,
    an unknown voice, a speaker file with a codec id out of range, a format
    or key a speech request does not take, an unknown key, a temperature
    out of range) get one error frame each, and the server serves on;
  - the HTTP endpoint streams a WAV (open sizes, chunked) that Python's
    wave module reads (the same samples as the msgpack op) or raw PCM, and
    refuses what OpenAI's API shape allows but zinfer does not do with 400s
    naming it.
"""

import http.client
import io
import json
import os
import time
import wave

import msgpack
import numpy as np
import pytest
import zmq

import numpy_wavtokenizer as ref
import tts_llm_files as T
from conftest import free_port, serve_process, wait_http
from speech_files import write_wavtokenizer

HOP, RATE = 320, 24000
BLOCK, CONTEXT = 64, 24  # tts_stream.h's ZI_TTS_BLOCK_CODES, ZI_TTS_CONTEXT_CODES
TEXT = ("the quick brown fox jumps over the lazy dog while seven small cats watch from the "
        "old stone wall")
SP = {"temperature": 0.8, "seed": 7, "max_new_tokens": 200}
VOICE = {"text": "hi there", "words": [
    {"word": "hi", "duration": 0.2, "codes": [1, 2, 3, 4]},
    {"word": "there", "duration": 0.3, "codes": [4095, 17, 900]}]}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("speech")
    llm = d / "outetts-0.2-random.gguf"
    T.write_codec_llm(llm, n_layers=2, code_end_bias=4.0)
    dec, tensors, cfg = write_wavtokenizer(d / "dec.gguf")
    voices = d / "voices"
    voices.mkdir()
    (voices / "alice.json").write_text(json.dumps(VOICE))
    bad = dict(VOICE, words=[dict(VOICE["words"][0], codes=[1, 4100])])
    (voices / "bad.json").write_text(json.dumps(bad))
    # the voice the seeds' form below makes: each word's duration its codes / 75 s
    aligned = dict(VOICE, words=[dict(w, duration=len(w["codes"]) / 75) for w in VOICE["words"]])
    (voices / "aligned.json").write_text(json.dumps(aligned))
    # a FIFO nobody writes: opening it to read would block the tokenizer
    os.mkfifo(voices / "fifo.json")
    t64 = {k: v.astype(np.float64) for k, v in tensors.items()}
    hp = dict(groups=cfg["groups"], group_eps=cfg["group_eps"], norm_eps=cfg["norm_eps"],
              posnet_layers=cfg["posnet_layers"], convnext_layers=cfg["convnext_layers"])
    return dict(dir=d, llm=llm, dec=dec, voices=voices, t64=t64, hp=hp)


@pytest.fixture(scope="module")
def server(zinfer_bin, files):
    port = free_port()
    log = files["dir"] / "serve.log"
    with serve_process(zinfer_bin, files["llm"], log, "--tts-decoder", files["dec"], "--voices",
                       files["voices"], "--threads-per-worker", 2, "--slots", 6, "--ctx-size",
                       1024, "--max-new-tokens", 800, "--http", f"127.0.0.1:{port}") as srv:
        wait_http(port, srv)
        srv.port = port
        yield srv


@pytest.fixture(scope="module")
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


class Conn:
    def __init__(self, ctx, addr):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(addr)

    def send(self, msg):
        self.sock.send(msgpack.packb(msg, use_bin_type=True))

    def recv(self, timeout=60.0):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError("no reply from the server")
        return msgpack.unpackb(self.sock.recv(), raw=False, strict_map_key=False)


@pytest.fixture
def conn(server, zctx):
    c = Conn(zctx, server.addr)
    yield c
    c.sock.close()


def ids_of(v):
    if isinstance(v, dict):
        return np.frombuffer(v["data"], dtype="<i8" if v["dtype"] == "int64" else "<i4").tolist()
    return list(v)


def collect(conn, rid):
    """Frames of request rid up to its terminal one: (chunks, terminal)."""
    chunks = []
    while True:
        m = conn.recv()
        assert m["id"] == rid, m
        if m["event"] != "chunk":
            return chunks, m
        chunks.append(m)


def samples(chunks):
    """The chunks' audio, joined, and its format."""
    fmt, parts = None, []
    for c in chunks:
        a = c.get("audio")
        if a is None:
            continue
        assert a["sample_rate"] == RATE
        fmt = fmt or a["format"]
        assert a["format"] == fmt
        parts.append(np.frombuffer(a["data"], dtype="<f4" if fmt == "f32" else "<i2"))
    return (np.concatenate(parts) if parts else np.zeros(0, "<f4")), fmt


def codes_of(chunks):
    ids = [t for c in chunks for t in ids_of(c["token_ids"])]
    return [t - T.CODE0 for t in ids if T.CODE0 <= t < T.CODE0 + T.N_CODES]


def speech(conn, rid, **kw):
    conn.send({"op": "speech", "id": rid, "input": TEXT, "sampling_params": SP, **kw})
    chunks, fin = collect(conn, rid)
    assert fin["event"] == "final", fin
    return chunks, fin


@pytest.fixture(scope="module")
def s16(server, zctx):
    """The 16-bit samples of the seeded request (the HTTP test's answer)."""
    c = Conn(zctx, server.addr)
    chunks, _ = speech(c, "s16", format="s16")
    c.sock.close()
    return chunks


def block_reference(files, codes):
    """tts_stream.h's scheme over the float64 reference decoder."""
    n, out = len(codes), []
    for b0 in range(0, n, BLOCK):
        b1 = min(b0 + BLOCK, n)
        w0, w1 = max(0, b0 - CONTEXT), min(n, b1 + CONTEXT)
        wave_ = ref.istft(ref.decode(files["t64"], files["hp"], np.array(codes[w0:w1])), HOP)
        out.append(wave_[(b0 - w0) * HOP:(b1 - w0) * HOP])
    return np.concatenate(out)


def test_speech_op_streams_audio_equal_to_block_reference(conn, files, s16):
    t0 = time.time()
    conn.send({"op": "speech", "id": "s1", "input": TEXT, "sampling_params": SP})
    chunks, t_first = [], None
    while True:
        m = conn.recv()
        if m["event"] != "chunk":
            fin = m
            break
        if m.get("audio") and t_first is None:
            t_first = time.time() - t0
        chunks.append(m)
    wall = time.time() - t0
    assert fin["event"] == "final", fin
    codes = codes_of(chunks)
    assert fin["status"] in ("end_of_sequence", "maximum_length"), fin
    assert fin["usage"]["completion_tokens"] > 0 and fin["usage"]["prompt_tokens"] > 0
    assert codes and all(0 <= c < 4096 for c in codes), codes  # the decoder's codebook only
    audio, fmt = samples(chunks)
    assert fmt == "f32" and audio.dtype == np.float32
    assert audio.shape == (len(codes) * HOP,)
    # the audio came in more than one chunk when there was more than one block
    n_audio_chunks = sum(1 for c in chunks if c.get("audio"))
    assert n_audio_chunks >= (2 if len(codes) > BLOCK + CONTEXT else 1), n_audio_chunks
    want = block_reference(files, codes)
    err = float(np.linalg.norm(audio - want) / np.linalg.norm(want))
    print(f"\n{len(codes)} codes, {n_audio_chunks} audio chunks, rel L2 to the reference "
          f"{err:.2e}; first audio after {t_first:.2f} s, {audio.size / RATE:.2f} s of audio in "
          f"{wall:.2f} s (real-time factor {wall / (audio.size / RATE):.2f})")
    assert err < 1e-5
    # 16-bit: the same samples, rounded
    chunks16 = s16
    assert codes_of(chunks16) == codes
    a16, fmt16 = samples(chunks16)
    assert fmt16 == "s16" and a16.shape == audio.shape
    assert np.abs(a16.astype(np.int32) - np.round(np.clip(audio, -1, 1) * 32767)).max() <= 1


def test_speech_beside_text_streams_equals_alone(server, zctx, conn):
    alone, _ = speech(conn, "alone", voice="alice")
    others = [Conn(zctx, server.addr) for _ in range(3)]
    for k, o in enumerate(others):
        o.send({"op": "generate", "id": f"t{k}", "prompt": "hello there, how are you",
                "sampling_params": {"max_new_tokens": 60, "temperature": 0.9, "seed": k}})
    beside, _ = speech(conn, "beside", voice="alice")
    for k, o in enumerate(others):
        _, fin = collect(o, f"t{k}")
        assert fin["event"] == "final", fin
        o.sock.close()
    assert codes_of(beside) == codes_of(alone)
    a, _ = samples(alone)
    b, _ = samples(beside)
    assert a.size > 0 and np.array_equal(a, b)


# the seeds' AudioGenerationRequest speaker prompt, split into words by the counts
SEEDS_FORM = {"audio_prompt_transcription": "Hi there!",
              "audio_prompt_tokens": [1, 2, 3, 4, 4095, 17, 900],
              "audio_prompt_word_codes": [4, 3]}


def test_seeds_speaker_prompt_equals_its_voice_file(conn):
    """audio_prompt_transcription + audio_prompt_tokens (+ the per-word
    counts) make the same prompt, so the same audio, as the speaker file
    with those words, codes and durations."""
    sp = dict(SP, max_new_tokens=60)
    a, fa = speech(conn, "seeds", sampling_params=sp, **SEEDS_FORM)
    b, fb = speech(conn, "file", sampling_params=sp, voice="aligned")
    assert fa["usage"] == fb["usage"]
    assert codes_of(a) == codes_of(b) and codes_of(a)
    assert np.array_equal(samples(a)[0], samples(b)[0])


BAD = [
    ({"input": ""}, "input"),
    ({"input": "a " * 2100}, "4096"),
    ({"voice": "nobody"}, "unknown voice 'nobody'"),
    ({"voice": "../etc"}, "voice"),
    ({"voice": "bad"}, "codec id"),
    ({"voice": "fifo"}, "speaker file of 'fifo' is not a regular file"),
    ({"format": "mp3"}, "format"),
    (dict(SEEDS_FORM, audio_prompt_tokens=[1, 2, 4100, 4, 4095, 17, 900]),
     "audio_prompt_tokens[2]: codec id 4100"),
    (dict(SEEDS_FORM, audio_prompt_word_codes=[7]), "audio_prompt_transcription"),
    ({"audio_prompt_transcription": "hi there"}, "audio_prompt_tokens"),
    (dict(SEEDS_FORM, voice="alice"), "no voice"),
    ({"stream": False}, "stream"),
    ({"prompt": "hi"}, "prompt"),
    ({"input": 42}, "input"),
    ({"voice": 7}, "voice"),
    ({"sampling_params": {"temperature": -1.0}}, "temperature"),
    ({"colour": "red"}, "colour"),
    # one word past the plan's ids a word (the tokenizer names the input)
    ({"input": "a" * 4000}, "input: word 0 encodes to"),
]


@pytest.mark.parametrize("extra,needle", BAD)
def test_bad_speech_inputs(conn, extra, needle):
    msg = {"op": "speech", "id": "bad", "input": TEXT, **extra}
    conn.send(msg)
    m = conn.recv()
    assert m["event"] == "error" and m["code"] == "invalid_request", m
    assert needle in m["message"], m


def test_serves_on_after_bad_inputs(conn):
    for k, (extra, _) in enumerate(BAD):
        conn.send({"op": "speech", "id": f"b{k}", "input": TEXT, **extra})
    for _ in BAD:
        assert conn.recv()["event"] == "error"
    chunks, fin = speech(conn, "after", sampling_params=dict(SP, max_new_tokens=40))
    assert fin["event"] == "final"


def post(port, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/audio/speech", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def test_http_wav_and_pcm_equal_the_op(server, s16):
    want, _ = samples(s16)
    body = {"model": "outetts-0.2-random", "input": TEXT, "seed": SP["seed"],
            "temperature": SP["temperature"], "max_tokens": SP["max_new_tokens"]}
    st, hd, data = post(server.port, dict(body, response_format="wav"))
    assert st == 200, data[:300]
    assert hd.get("Content-Type") == "audio/wav"
    assert hd.get("Transfer-Encoding") == "chunked"  # sent as it is decoded
    assert data[4:8] == b"\xff" * 4 and data[40:44] == b"\xff" * 4  # open sizes
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        got = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    assert np.array_equal(got, want)
    st, hd, data = post(server.port, dict(body, response_format="pcm"))
    assert st == 200 and hd.get("Content-Type") == "audio/pcm"
    assert np.array_equal(np.frombuffer(data, "<i2"), want)


@pytest.mark.parametrize("extra,needle", [
    ({"response_format": "mp3"}, "response_format"),
    ({"speed": 1.5}, "speed"),
    ({"input": ""}, "input"),
    ({"voice": "nobody"}, "voice"),
    ({"stream_format": "sse"}, "stream_format"),
    ({"response_format": 3}, "response_format"),
    ({"input": ["a", "b"]}, "input"),
])
def test_http_bad_inputs_are_400(server, extra, needle):
    st, _, data = post(server.port, {"model": "outetts-0.2-random", "input": TEXT, **extra})
    assert st == 400, (st, data[:300])
    assert needle in json.loads(data)["error"]["message"]


def test_worker_killed_mid_speech_resumes_the_same_audio(server, conn):
    """Last (it restarts the module's worker): the worker is killed after
    the first audio chunk; the request resumes on the restarted worker
    (the context carries the plan's inputs and the codes so far) and the
    client gets the same codes and samples as a run without the fault,
    each sample once."""
    import os
    import re
    import signal
    greedy = {"temperature": 0.0, "max_new_tokens": 200}
    want, _ = speech(conn, "nofault", sampling_params=greedy)
    conn.send({"op": "speech", "id": "fault", "input": TEXT, "sampling_params": greedy})
    chunks = []
    while True:
        m = conn.recv()
        assert m["event"] == "chunk", m
        chunks.append(m)
        if m.get("audio"):
            break
    pids = re.findall(r"started worker 0 \(pid (\d+)\)", server.log())
    assert pids, server.log()
    os.kill(int(pids[-1]), signal.SIGKILL)
    rest, fin = collect(conn, "fault")
    assert fin["event"] == "final", fin
    assert sum(bool(c.get("resumed")) for c in rest) == 1
    got = chunks + rest
    assert codes_of(got) == codes_of(want)
    a, _ = samples(got)
    b, _ = samples(want)
    assert a.size == b.size > 0 and np.array_equal(a, b)
