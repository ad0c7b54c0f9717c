"""llama.cpp's image embeddings through llama-cpp-python's mtmd binding
(llama_cpp.mtmd_cpp), for comparing with scripts/ref/numpy_vision.py and
with zinfer.

  with MtmdRef(mmproj_path, text_model_path) as ref:
      r = ref.embed(rgb)           # rgb: uint8 [H][W][3]
      r.embd                       # float32 [n_soft_tokens][lm_dim], all image chunks in order
      r.chunks                     # [("text", [ids]) | ("image", n_tokens)] as mtmd tokenized
      r.encode_s                   # seconds in mtmd_encode_chunk, all image chunks
                                   # (a context's first encode also allocates: slower)

The text model is loaded whole on the CPU (mtmd needs its vocabulary for
the marker tokens and checks that its input embedding length equals the
projector's output width; a vocab-only load reports length 0 and skips
that check). The prompt is the default media
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

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd

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


class MtmdRef:
    def __init__(self, mmproj, text_model, n_threads=2, flash_attn="disabled", verbose=False):
        if not verbose:
            llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
            mtmd.mtmd_log_set(_quiet, ctypes.c_void_p(0))
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
