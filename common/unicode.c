/*
 * unicode.c - UTF-8 decoding/encoding and codepoint flag lookup for the
 * tokenizer (see unicode.h), and the NFD / lowercase mappings. The data
 * itself is generated into unicode_data.c; this file only searches it.
 */
#include "unicode.h"

uint16_t zi_unicode_flags(uint32_t cp) {
    if (cp < 128) return zi_unicode_ascii_flags[cp];
    if (cp > ZI_UNICODE_MAX) return ZI_UC_UNDEFINED;
    /* The last range whose start is <= cp; entry 0 starts at 0. */
    size_t lo = 0, hi = zi_unicode_range_count;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (zi_unicode_range_start[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return zi_unicode_range_flags[lo];
}

/* The index of the last entry of the sorted keys[0..n) that is <= cp, or
 * n when there is none. */
static size_t last_le(const uint32_t *keys, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n; /* answer in [lo - 1, hi - 1] */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid] <= cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo == 0 ? n : lo - 1;
}

uint32_t zi_unicode_nfd_first(uint32_t cp) {
    size_t i = last_le(zi_unicode_nfd_start, zi_unicode_nfd_count, cp);
    return i < zi_unicode_nfd_count && cp <= zi_unicode_nfd_last[i] ? zi_unicode_nfd_value[i] : cp;
}

uint32_t zi_unicode_tolower(uint32_t cp) {
    if (cp < 128) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    size_t i = last_le(zi_unicode_lower_from, zi_unicode_lower_count, cp);
    return i < zi_unicode_lower_count && zi_unicode_lower_from[i] == cp ? zi_unicode_lower_to[i]
                                                                        : cp;
}

static int is_cont(unsigned char b) {
    return (b & 0xC0) == 0x80;
}

size_t zi_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    if ((b0 & 0xE0) == 0xC0) {
        if (n >= 2 && is_cont(s[1])) {
            *cp = ((uint32_t)(b0 & 0x1F) << 6) | (s[1] & 0x3F);
            return 2;
        }
    } else if ((b0 & 0xF0) == 0xE0) {
        if (n >= 3 && is_cont(s[1]) && is_cont(s[2])) {
            *cp = ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
            return 3;
        }
    } else if ((b0 & 0xF8) == 0xF0) {
        if (n >= 4 && is_cont(s[1]) && is_cont(s[2]) && is_cont(s[3])) {
            uint32_t v = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                         ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
            /* llama.cpp would fail outright on such a value; treating the
             * lead byte as invalid is the closest well-defined behaviour. */
            if (v <= ZI_UNICODE_MAX) {
                *cp = v;
                return 4;
            }
        }
    }
    *cp = ZI_UNICODE_REPLACEMENT;
    return 1;
}

size_t zi_utf8_encode(uint32_t cp, unsigned char out[4]) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= ZI_UNICODE_MAX) {
        out[0] = (unsigned char)(0xF0 | (cp >> 18));
        out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (unsigned char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

size_t zi_utf8_lead_len(unsigned char b) {
    if (b < 0x80) return 1;
    if (b < 0xC0) return 0;
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    if (b < 0xF8) return 4;
    return 0;
}
