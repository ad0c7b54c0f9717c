#!/usr/bin/env python3
"""Write tests/fixtures/dequant.bin: GGUF blocks of every tensor type zinfer
reads and their float32 values as gguf-py dequantizes them
(gguf.quants.dequantize), for tests/unit/test_dequant.c, which requires
zinfer's dequantization (kernels/cpu/dequant.c) to give the same bits.

For each type: random blocks (random quant bytes, random finite f16 scales
of both signs over many magnitudes); edge blocks (all-zero bytes, zero, -0,
largest, smallest subnormal and normal, infinite and NaN f16 scales, quant
bytes all 0x00 and all 0xFF, scale and min of opposite signs); and, for the
types with sub-block scales, blocks that put every value of a packed sub-block
scale (and min) field at every sub-block index: 64 blocks for Q4_K's 6-bit
scales and mins, 16 for Q2_K's 4-bit ones, 16 extreme int8 scales rotated
over Q6_K's 16 sub-blocks; the 6-bit fields of Q3_K, Q5_K (Q4_K's packing)
and IQ4_XS get every walking one and walking zero, 0, 63, 15 and 48 at every
sub-block index (each bit of each field set and clear, which is what a
packing's shifts and masks can get wrong). Each packing is first checked
against gguf-py itself (probe blocks whose values are the bare sub-scales),
so the coverage is what it claims. MXFP4, whose scale is an E8M0 byte (a
power of two) rather than an f16, gets its own cases: random blocks with
scales around 1 and with any byte, every E8M0 byte 0..255 (2^-128 ..
2^127 halved: subnormal, normal and overflowing products) each with every
code 0..15 in both nibble positions, and the all-0x00, all-0xFF and
all-zero blocks. About 450 KB.

Needs only numpy and gguf (the venv's). Deterministic (fixed seed).

Format, all little-endian:
  "ZIDQFIX1", u32 case count, then per case:
  u32 ggml type, u32 value count, u32 byte count, u32 label length,
  the label (ASCII), the block bytes, the values as float32.
"""

import argparse
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# type -> byte offsets of its f16 fields (d first, then the min or dmin)
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
BLOCK_TYPES = list(F16_FIELDS)
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
# Types whose block scale is one E8M0 byte at offset 0 (no f16 field).
E8M0_TYPES = [T.MXFP4]

# Six-bit sub-scale values for the walking-bits blocks.
WALK6 = [1 << i for i in range(6)] + [63 ^ (1 << i) for i in range(6)] + [0, 63, 15, 48]

F16_SPECIALS = {
    "zero": 0x0000, "minus_zero": 0x8000, "max": 0x7BFF, "minus_max": 0xFBFF,
    "min_subnormal": 0x0001, "max_subnormal": 0x03FF, "min_normal": 0x0400,
    "inf": 0x7C00, "minus_inf": 0xFC00, "nan": 0x7E00, "nan_payload": 0xFE01,
}

# Specials also tried in d alone and in the min alone.
ONE_FIELD = ("zero", "minus_zero", "max", "inf", "nan")

rng = np.random.default_rng(20)


def f16_bits(x):
    return np.array(x, dtype=np.float16).view(np.uint16).item()


def rand_f16(n):
    """Finite f16 values of both signs, magnitudes 2^-14 .. 2^4."""
    v = rng.uniform(0.5, 1.0, n) * np.exp2(rng.integers(-14, 5, n)) * rng.choice([-1, 1], n)
    return v.astype(np.float16).view(np.uint16)


def set_f16(block, off, bits):
    block[off:off + 2] = np.array([bits], dtype=np.uint16).view(np.uint8)


def random_blocks(qt, n):
    _, bb = GGML_QUANT_SIZES[qt]
    blocks = rng.integers(0, 256, (n, bb), dtype=np.uint8)
    for b in blocks:
        for off in F16_FIELDS[qt]:
            set_f16(b, off, rand_f16(1)[0])
    return blocks


def edge_blocks(qt):
    """(label, blocks) pairs of edge cases common to the block types."""
    _, bb = GGML_QUANT_SIZES[qt]
    f16 = F16_FIELDS[qt]
    out = [("all_zero_bytes", np.zeros((1, bb), dtype=np.uint8))]
    for name, bits in F16_SPECIALS.items():
        b = random_blocks(qt, 1)
        for off in f16:
            set_f16(b[0], off, bits)
        out.append(("scale_" + name, b))
        if len(f16) == 2 and name in ONE_FIELD:  # in one field, the other ordinary
            b2 = random_blocks(qt, 2)
            set_f16(b2[0], f16[0], bits)
            set_f16(b2[1], f16[1], bits)
            out.append(("scale_" + name + "_one_field", b2))
    for fill in (0x00, 0xFF):
        b = np.full((1, bb), fill, dtype=np.uint8)
        for off in f16:
            set_f16(b[0], off, f16_bits(0.375))
        out.append(("quants_%02x" % fill, b))
    if len(f16) == 2:
        b = random_blocks(qt, 2)
        set_f16(b[0], f16[0], f16_bits(0.125)), set_f16(b[0], f16[1], f16_bits(-0.5))
        set_f16(b[1], f16[0], f16_bits(-0.125)), set_f16(b[1], f16[1], f16_bits(0.5))
        out.append(("scale_min_opposite_signs", b))
    return out


# ---- packing of the sub-block scales (the inverse of each type's unpacking) ----

def pack_q3k_scales(sc):
    """16 6-bit scales (biased values 0..63) -> Q3_K's 12 bytes."""
    p = np.zeros(12, dtype=np.uint8)
    for s in range(16):
        lo, hi = sc[s] & 15, sc[s] >> 4
        p[s % 8] |= lo << (4 * (s // 8))
        p[8 + s % 4] |= hi << (2 * (s // 4))
    return p


def pack_k4_scales(sc, mn):
    """8 6-bit scales and 8 6-bit mins -> Q4_K / Q5_K's 12 bytes."""
    p = np.zeros(12, dtype=np.uint8)
    for s in range(4):
        p[s] = sc[s] | (sc[s + 4] >> 4) << 6
        p[s + 4] = mn[s] | (mn[s + 4] >> 4) << 6
        p[s + 8] = (sc[s + 4] & 15) | (mn[s + 4] & 15) << 4
    return p


def pack_iq4xs_scales(sc):
    """8 6-bit scales (biased) -> IQ4_XS's u16 scales_h and 4 bytes scales_l."""
    h = 0
    lo = np.zeros(4, dtype=np.uint8)
    for s in range(8):
        h |= int(sc[s] >> 4) << (2 * s)
        lo[s // 2] |= (sc[s] & 15) << (4 * (s % 2))
    return np.array([h], dtype=np.uint16).view(np.uint8), lo


def deq(qt, blocks):
    return dequantize(blocks.reshape(-1), qt).astype(np.float32).reshape(len(blocks), -1)


def probe(qt, blocks, want):
    """Checks, with gguf-py, that the blocks' sub-block scales are `want`
    ([n][sub-blocks]): each block is copied with d = 1 (and dmin = 0) and
    quants that make every value its sub-block's bare scale."""
    pb = blocks.copy()
    one, zero = f16_bits(1.0), f16_bits(0.0)
    for b in pb:
        if qt == T.Q2_K:
            b[16:80] = 0x55  # q = 1
            set_f16(b, 80, one), set_f16(b, 82, zero)
        elif qt == T.Q3_K:
            b[0:32] = 0xFF  # high bit set: no -4
            b[32:96] = 0x55  # low bits 1
            set_f16(b, 108, one)
        elif qt in (T.Q4_K, T.Q5_K):
            set_f16(b, 0, one), set_f16(b, 2, zero)
            if qt == T.Q4_K:
                b[16:144] = 0x11
            else:
                b[16:48] = 0x00
                b[48:176] = 0x11
        elif qt == T.Q6_K:
            b[0:128] = 0x11  # low 4 bits 1
            b[128:192] = 0xAA  # high 2 bits 2: q = 33 - 32 = 1
            set_f16(b, 208, one)
        elif qt == T.IQ4_XS:
            b[8:136] = 0x88  # kvalues[8] = 1
            set_f16(b, 0, one)
    got = deq(qt, pb)
    per = got.shape[1] // want.shape[1]
    assert (got.reshape(len(pb), want.shape[1], per) == want[:, :, None]).all(), qt.name


def probe_mins(blocks, want):
    """Q4_K / Q5_K: the mins, with d = 0 and dmin = 1 (values are -min)."""
    pb = blocks.copy()
    for b in pb:
        set_f16(b, 0, f16_bits(0.0)), set_f16(b, 2, f16_bits(1.0))
    got = deq(T.Q4_K if len(pb[0]) == 144 else T.Q5_K, pb)
    assert (got.reshape(len(pb), 8, 32) == -want[:, :, None]).all()


def pattern_blocks(qt):
    """(label, blocks): every value of each packed sub-block field at every
    sub-block index (see the module docstring)."""
    out = []
    if qt == T.Q2_K:
        n = 16
        blocks = random_blocks(qt, n)
        sc = np.array([[(b + k) & 15 for k in range(16)] for b in range(n)])
        mn = np.array([[(3 * b + 5 * k + 7) & 15 for k in range(16)] for b in range(n)])
        blocks[:, 0:16] = (sc | mn << 4).astype(np.uint8)
        probe(qt, blocks, sc.astype(np.float32))
        out.append(("every_scale_and_min_at_every_sub_block", blocks))
    elif qt == T.Q3_K:
        n = len(WALK6)
        blocks = random_blocks(qt, n)
        sc = np.array([[WALK6[(b + k) % n] for k in range(16)] for b in range(n)])
        for b in range(n):
            blocks[b, 96:108] = pack_q3k_scales(sc[b])
        probe(qt, blocks, (sc - 32).astype(np.float32))
        out.append(("walking_scale_bits", blocks))
    elif qt in (T.Q4_K, T.Q5_K):
        if qt == T.Q4_K:
            n = 64
            sc = np.array([[(b + 9 * s) & 63 for s in range(8)] for b in range(n)])
            mn = np.array([[(3 * b + 5 * s + 17) & 63 for s in range(8)] for b in range(n)])
            label = "every_scale_and_min_at_every_sub_block"
        else:
            n = len(WALK6)
            sc = np.array([[WALK6[(b + s) % n] for s in range(8)] for b in range(n)])
            mn = np.array([[WALK6[(b + 3 * s + 1) % n] for s in range(8)] for b in range(n)])
            label = "walking_scale_and_min_bits"
        blocks = random_blocks(qt, n)
        for b in range(n):
            blocks[b, 4:16] = pack_k4_scales(sc[b], mn[b])
        probe(qt, blocks, sc.astype(np.float32))
        probe_mins(blocks, mn.astype(np.float32))
        out.append((label, blocks))
    elif qt == T.Q6_K:
        vals = [-128, -127, -64, -33, -32, -31, -2, -1, 0, 1, 2, 31, 32, 63, 64, 127]
        n = 16
        blocks = random_blocks(qt, n)
        sc = np.array([[vals[(b + k) % 16] for k in range(16)] for b in range(n)])
        blocks[:, 192:208] = sc.astype(np.int8).view(np.uint8)
        probe(qt, blocks, sc.astype(np.float32))
        out.append(("extreme_scales_at_every_sub_block", blocks))
    elif qt == T.IQ4_XS:
        n = len(WALK6)
        blocks = random_blocks(qt, n)
        sc = np.array([[WALK6[(b + s) % n] for s in range(8)] for b in range(n)])
        for b in range(n):
            h, lo = pack_iq4xs_scales(sc[b])
            blocks[b, 2:4], blocks[b, 4:8] = h, lo
        probe(qt, blocks, (sc - 32).astype(np.float32))
        out.append(("walking_scale_bits", blocks))
    elif qt in (T.Q5_0, T.Q5_1):
        qh_off = 2 if qt == T.Q5_0 else 4
        blocks = random_blocks(qt, 4)
        for b, qh in zip(blocks, (0, 0xFFFFFFFF, 0xAAAAAAAA, 0x55555555)):
            b[qh_off:qh_off + 4] = np.array([qh], dtype=np.uint32).view(np.uint8)
        out.append(("high_bit_patterns", blocks))
    elif qt in (T.Q4_0, T.Q4_1, T.IQ4_NL):
        off = {T.Q4_0: 2, T.Q4_1: 4, T.IQ4_NL: 2}[qt]
        blocks = random_blocks(qt, 1)
        blocks[0, off:off + 16] = np.arange(16, dtype=np.uint8) * 17  # every code, both nibbles
        out.append(("every_code", blocks))
    return out


def every_code_qs(rot):
    """16 quant bytes holding every 4-bit code in both nibble positions,
    rotated by `rot` so that each code also meets every value position."""
    c = (np.arange(16) + rot) % 16
    return (c | ((c + 5) % 16) << 4).astype(np.uint8)


def e8m0_cases(qt):
    """(label, blocks) of a type whose block is an E8M0 byte then nibbles."""
    _, bb = GGML_QUANT_SIZES[qt]
    out = []
    b = rng.integers(0, 256, (32, bb), dtype=np.uint8)
    b[:, 0] = rng.integers(110, 141, 32)  # scales 2^-18 .. 2^12
    out.append(("random", b))
    out.append(("random_any_scale", rng.integers(0, 256, (32, bb), dtype=np.uint8)))
    b = np.zeros((256, bb), dtype=np.uint8)
    for e in range(256):
        b[e, 0] = e
        b[e, 1:17] = every_code_qs(e)
    out.append(("every_scale_byte_every_code", b))
    out.append(("all_zero_bytes", np.zeros((1, bb), dtype=np.uint8)))
    for fill in (0x00, 0xFF):
        b = np.full((1, bb), fill, dtype=np.uint8)
        b[0, 0] = 127  # scale 1 (halved: 0.5)
        out.append(("quants_%02x" % fill, b))
        b = np.full((2, bb), fill, dtype=np.uint8)
        b[:, 0] = (0, 255)
        out.append(("quants_%02x_scale_00_ff" % fill, b))
    return out


def float_cases(qt):
    """F32 / F16 / BF16 rows: random values and the special ones."""
    if qt == T.F32:
        vals = np.concatenate([rng.standard_normal(64).astype(np.float32),
                               np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -3.4e38],
                                        dtype=np.float32)])
        data = vals.view(np.uint8)
    else:
        bits = rng.integers(0, 1 << 16, 64, dtype=np.uint16)
        special = [0x0000, 0x8000, 0x0001, 0x7C00, 0xFC00, 0x3C00, 0x7BFF, 0x0400]
        data = np.concatenate([bits, np.array(special, dtype=np.uint16)]).view(np.uint8)
    return [("random_and_special", data)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "dequant.bin"))
    args = ap.parse_args()
    cases = []  # (type, label, bytes)
    for qt in FLOAT_TYPES:
        for label, data in float_cases(qt):
            cases.append((qt, label, data))
    for qt in BLOCK_TYPES:
        n_random = 6 if GGML_QUANT_SIZES[qt][0] == 256 else 32
        cases.append((qt, "random", random_blocks(qt, n_random)))
        for label, blocks in edge_blocks(qt) + pattern_blocks(qt):
            cases.append((qt, label, blocks))
    for qt in E8M0_TYPES:  # last, so that the other types' random bytes stay as they were
        for label, blocks in e8m0_cases(qt):
            cases.append((qt, label, blocks))
    out = bytearray(b"ZIDQFIX1")
    out += struct.pack("<I", len(cases))
    for qt, label, data in cases:
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):
            vals = np.ascontiguousarray(dequantize(data, qt), dtype=np.float32).reshape(-1)
        name = ("%s %s" % (qt.name, label)).encode("ascii")
        out += struct.pack("<IIII", int(qt), vals.size, data.size, len(name))
        out += name + data.tobytes() + vals.astype("<f4").tobytes()
    with open(args.out, "wb") as f:
        f.write(out)
    print("wrote %s: %d cases, %d bytes" % (args.out, len(cases), len(out)))


if __name__ == "__main__":
    main()
