"""llama.cpp's image embeddings through llama-cpp-python's mtmd binding
(llama_cpp.mtmd_cpp), for comparing with scripts/ref/numpy_vision.py and
with zinfer.

  with MtmdRef(mmproj_path, text_model_path) as ref:
      r = ref.embed(rgb)           # rgb: uint8 [H][W][3]
      r.embd                       # float32 [n_soft_tokens][lm_dim], all image chunks in order
      r.chunks                     # [("text", [ids]) | ("image", n_tokens)] as mtmd tokenized
      r.encode_s                   # seconds in mtmd_encode_chunk, all image chunks
                                   # (a context's first encode also allocates: slower)

      p = ref.prompt_logits(prompt, [rgb, ...])  # prompt with one "<__media__>" per image
      p.chunks                     # as above, for the whole prompt
      p.text_ids                   # int [n_text]: the text chunks' ids, in order
      p.text_pos                   # int [n_text]: their positions in the whole prompt
      p.logits                     # float32 [n_text][n_vocab]: llama.cpp's logits there
      p.n_image                    # image positions (soft tokens) in all

prompt_logits is llama.cpp's whole multimodal pipeline, as mtmd-cli runs it
(mtmd_tokenize with add_special: a BOS when the vocabulary adds one; each
image chunk through mtmd_helper_eval_chunk_single: encode, then decode its
embeddings, non-causally where mtmd says so, i.e. Gemma 3), except that
each text chunk is decoded here with llama_decode asking logits for every
token (mtmd's helper asks only for the last). Image positions have no
logits in llama.cpp. The text context (n_ctx 512 by default, one
sequence, a batch large enough that an image decodes in one ubatch) is
made per call, so calls are independent.

The text model is loaded whole on the CPU (mtmd needs its vocabulary for
the marker tokens and checks that its input embedding length equals the
projector's output width; a vocab-only load reports length 0 and skips
that check). embed's prompt is the default media
marker alone ("<__media__>", parse_special, no BOS), so the chunks are
exactly the layout mtmd puts around the image (numpy_vision.token_layout).
CPU only; n_threads (default 2); flash_attn "disabled" (default: plain
f32 attention, the closest to the float64 reference), "enabled" or
"auto" (llama.cpp's default: enabled on CPU, K and V cast to F16).
"""

import ctypes
import time
from dataclasses import dataclass

import numpy as np

import pytest

# llama-cpp-python is optional (requirements-bench.txt, scripts/setup
# --with-llamacpp): a test importing this module skips without it.
llama_cpp = pytest.importorskip("llama_cpp")
mtmd = pytest.importorskip("llama_cpp.mtmd_cpp")

FLASH = {"auto": -1, "disabled": 0, "enabled": 1}


@llama_cpp.llama_log_callback
def _quiet(level, text, user_data):  # only errors reach stderr
    if level == 3:
        import sys
        sys.stderr.write(text.decode("utf-8", "replace"))


@dataclass
class Result:
    embd: np.ndarray
    chunks: list
    encode_s: float


@dataclass
class PromptResult:
    chunks: list
    text_ids: np.ndarray
    text_pos: np.ndarray
    logits: np.ndarray
    n_image: int


class MtmdRef:
    def __init__(self, mmproj, text_model, n_threads=2, flash_attn="disabled", verbose=False):
        self.n_threads, self.flash_attn = n_threads, flash_attn
        if not verbose:
            llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
            mtmd.mtmd_log_set(_quiet, ctypes.c_void_p(0))
            mtmd.mtmd_helper_log_set(_quiet, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = llama_cpp.llama_model_load_from_file(str(text_model).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {text_model}")
        cp = mtmd.mtmd_context_params_default()
        cp.use_gpu = False
        cp.print_timings = False
        cp.n_threads = n_threads
        cp.flash_attn_type = FLASH[flash_attn]
        cp.warmup = True
        self.ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), self.model, cp)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise RuntimeError(f"mtmd could not load {mmproj} with {text_model}")
        self.n_embd = llama_cpp.llama_model_n_embd_inp(self.model)

    def close(self):
        if getattr(self, "ctx", None):
            mtmd.mtmd_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            llama_cpp.llama_model_free(self.model)
            self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def embed(self, rgb):
        """llama.cpp's embeddings of an RGB uint8 image [H][W][3]."""
        rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
        h, w = rgb.shape[:2]
        buf = (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes())
        bmp = mtmd.mtmd_bitmap_init(w, h, buf)
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            prompt = mtmd.mtmd_default_marker()
            text = mtmd.mtmd_input_text(prompt, len(prompt), False, True)
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bmp)
            rc = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise RuntimeError(f"mtmd_tokenize returned {rc}")
            out, layout, secs = [], [], 0.0
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                c = mtmd.mtmd_input_chunks_get(chunks, i)
                n = mtmd.mtmd_input_chunk_get_n_tokens(c)
                if mtmd.mtmd_input_chunk_get_type(c) == 0:  # MTMD_INPUT_CHUNK_TYPE_TEXT
                    nt = ctypes.c_size_t(0)
                    p = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(nt))
                    layout.append(("text", [p[j] for j in range(nt.value)]))
                    continue
                t0 = time.perf_counter()
                rc = mtmd.mtmd_encode_chunk(self.ctx, c)
                secs += time.perf_counter() - t0
                if rc != 0:
                    raise RuntimeError(f"mtmd_encode_chunk returned {rc}")
                e = mtmd.mtmd_get_output_embd(self.ctx)
                out.append(np.ctypeslib.as_array(e, shape=(n * self.n_embd,)).copy()
                           .reshape(n, self.n_embd))
                layout.append(("image", n))
            return Result(np.concatenate(out, axis=0), layout, secs)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bmp)

    def _tokenize(self, prompt, rgbs, add_special):
        """mtmd_tokenize of prompt (str, markers parsed) with the images;
        returns (chunks handle, bitmaps) for the caller to free."""
        bmps = []
        for rgb in rgbs:
            rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
            h, w = rgb.shape[:2]
            buf = (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes())
            bmps.append(mtmd.mtmd_bitmap_init(w, h, buf))
        chunks = mtmd.mtmd_input_chunks_init()
        raw = prompt.encode("utf-8")
        text = mtmd.mtmd_input_text(raw, len(raw), add_special, True)
        arr = (mtmd.mtmd_bitmap_p_ctypes * max(len(bmps), 1))(*bmps)
        rc = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), arr, len(bmps))
        if rc != 0:
            mtmd.mtmd_input_chunks_free(chunks)
            for b in bmps:
                mtmd.mtmd_bitmap_free(b)
            raise RuntimeError(f"mtmd_tokenize returned {rc} (markers vs images?)")
        return chunks, bmps

    def prompt_logits(self, prompt, rgbs, add_special=True, n_ctx=512):
        """llama.cpp's logits at every text position of prompt (a str with
        one mtmd_default_marker() per image of rgbs, RGB uint8 [H][W][3])."""
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = n_ctx  # an image's tokens in one ubatch
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = FLASH[self.flash_attn]
        cp.no_perf = True
        lctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not lctx:
            raise RuntimeError("llama.cpp could not make a context")
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        chunks, bmps = self._tokenize(prompt, rgbs, add_special)
        batch = None
        try:
            layout, ids, pos, logits, n_past, n_image = [], [], [], [], 0, 0
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                c = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(c) != 0:  # an image chunk
                    n = mtmd.mtmd_input_chunk_get_n_tokens(c)
                    new_past = llama_cpp.llama_pos(n_past)
                    rc = mtmd.mtmd_helper_eval_chunk_single(self.ctx, lctx, c, n_past, 0,
                                                            cp.n_batch, False,
                                                            ctypes.byref(new_past))
                    if rc != 0:
                        raise RuntimeError(f"mtmd_helper_eval_chunk_single returned {rc}")
                    layout.append(("image", n))
                    n_image += n
                    n_past = new_past.value
                    continue
                nt = ctypes.c_size_t(0)
                p = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(nt))
                toks = [p[j] for j in range(nt.value)]
                layout.append(("text", toks))
                if not toks:
                    continue
                if any(t < 0 or t >= n_vocab for t in toks):
                    raise RuntimeError(f"text chunk {i} holds ids outside the vocabulary: {toks}")
                batch = llama_cpp.llama_batch_init(len(toks), 0, 1)
                batch.n_tokens = len(toks)
                for j, t in enumerate(toks):
                    batch.token[j] = t
                    batch.pos[j] = n_past + j
                    batch.n_seq_id[j] = 1
                    batch.seq_id[j][0] = 0
                    batch.logits[j] = True
                rc = llama_cpp.llama_decode(lctx, batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode returned {rc}")
                for j in range(len(toks)):
                    row = llama_cpp.llama_get_logits_ith(lctx, j)
                    logits.append(np.ctypeslib.as_array(row, shape=(n_vocab,)).copy())
                llama_cpp.llama_batch_free(batch)
                batch = None
                ids += toks
                pos += range(n_past, n_past + len(toks))
                n_past += len(toks)
            return PromptResult(layout, np.array(ids, np.int64), np.array(pos, np.int64),
                                np.stack(logits).astype(np.float32), n_image)
        finally:
            if batch is not None:
                llama_cpp.llama_batch_free(batch)
            mtmd.mtmd_input_chunks_free(chunks)
            for b in bmps:
                mtmd.mtmd_bitmap_free(b)
            llama_cpp.llama_free(lctx)
