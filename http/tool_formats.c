/*
 * tool_formats.c - the region scanners of the tool-call formats
 * (tool_formats.h). The markers are those the families' chat templates
 * (llama.cpp's vendored copies) write and llama.cpp's common chat code
 * parses; each scan starts again from the region's start (regions are
 * short).
 */
#include "tool_formats.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- openers ------------------------------------------------------------ */

enum {
    K_JSON,   /* a call object or an array of them; no closing marker */
    K_HERMES, /* JSON, then </tool_call> */
    K_QWEN,   /* <function=N><parameter=K>V</parameter>...</function></tool_call>, or K_HERMES */
    K_GLM,    /* N<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>, or K_HERMES */
    K_DS_SECTION,   /* DeepSeek: calls, then <｜tool▁calls▁end｜> */
    K_DS_CALL,      /* DeepSeek: one call, its opener read */
    K_DSML_FC,      /* DeepSeek V3.2 DSML: invokes, then </｜DSML｜function_calls> */
    K_DSML_TC,      /* DeepSeek V4 DSML: invokes, then </｜DSML｜tool_calls> */
    K_KIMI_SECTION, /* Kimi K2: calls, then <|tool_calls_section_end|> */
    K_KIMI_CALL,    /* Kimi K2: one call, its opener read */
    K_HARMONY,      /* gpt-oss: a message header up to <|message|> */
    K_DROP,         /* a marker that is dropped (gpt-oss's ends) */
    K_COHERE,       /* JSON with tool_name, then <|END_ACTION|> */
    K_COHERE_TEXT,  /* after "Action:": JSON, fenced in ```json ... ``` or not */
    K_FUNC32,       /* Functionary v3.2: N\n{...} or all\n */
    K_FUNC31,       /* Functionary v3.1: N>{...}</function> */
};

static const zi_tf_opener OPEN_GENERIC[] = {{"<tool_call>", K_HERMES}, {NULL, 0}};
static const zi_tf_opener OPEN_QWEN[] = {{"<tool_call>", K_QWEN}, {NULL, 0}};
static const zi_tf_opener OPEN_GLM[] = {{"<tool_call>", K_GLM}, {NULL, 0}};
static const zi_tf_opener OPEN_DS[] = {
    {"<｜tool▁calls▁begin｜>", K_DS_SECTION}, {"<｜tool▁call▁begin｜>", K_DS_CALL}, {NULL, 0}};
static const zi_tf_opener OPEN_DSML[] = {
    {"<｜DSML｜function_calls>", K_DSML_FC}, {"<｜DSML｜tool_calls>", K_DSML_TC}, {NULL, 0}};
static const zi_tf_opener OPEN_KIMI[] = {{"<|tool_calls_section_begin|>", K_KIMI_SECTION},
                                         {"<|tool_call_begin|>", K_KIMI_CALL},
                                         {NULL, 0}};
static const zi_tf_opener OPEN_HARMONY[] = {{"<|start|>", K_HARMONY}, {"<|channel|>", K_HARMONY},
                                            {"<|end|>", K_DROP},      {"<|call|>", K_DROP},
                                            {"<|return|>", K_DROP},   {NULL, 0}};
static const zi_tf_opener OPEN_GRANITE[] = {{"<|tool_call|>", K_JSON}, {NULL, 0}};
/* Command R7B's text comes between <|START_RESPONSE|> and <|END_RESPONSE|>. */
static const zi_tf_opener OPEN_COHERE[] = {{"<|START_ACTION|>", K_COHERE},
                                           {"Action:", K_COHERE_TEXT},
                                           {"<|START_RESPONSE|>", K_DROP},
                                           {"<|END_RESPONSE|>", K_DROP},
                                           {NULL, 0}};
static const zi_tf_opener OPEN_FUNC32[] = {{">>>", K_FUNC32}, {NULL, 0}};
static const zi_tf_opener OPEN_FUNC31[] = {{"<function=", K_FUNC31}, {NULL, 0}};

const zi_tf_opener *zi_tf_openers(zi_tool_format f) {
    switch (zi_tool_format_parser(f)) {
    case ZI_TF_QWEN3_CODER:
        return OPEN_QWEN;
    case ZI_TF_GLM_45:
        return OPEN_GLM;
    case ZI_TF_DEEPSEEK_V3:
        return OPEN_DS;
    case ZI_TF_DEEPSEEK_V32:
        return OPEN_DSML;
    case ZI_TF_KIMI_K2:
        return OPEN_KIMI;
    case ZI_TF_GPT_OSS:
        return OPEN_HARMONY;
    case ZI_TF_GRANITE:
        return OPEN_GRANITE;
    case ZI_TF_COMMAND_R:
        return OPEN_COHERE;
    case ZI_TF_FUNCTIONARY:
        return OPEN_FUNC32;
    case ZI_TF_FUNCTIONARY_V31:
        return OPEN_FUNC31;
    default:
        return OPEN_GENERIC;
    }
}

static const char *const START_MARKERS[] = {"[TOOL_CALLS]", "<|python_tag|>"};

int zi_tf_start(zi_tool_format f, const char *s, size_t n, size_t from, int final, int *kind,
                size_t *body) {
    const char *p = s + from;
    size_t avail = n - from;
    f = zi_tool_format_parser(f);
    if (f == ZI_TF_FUNCTIONARY) {
        /* The generation prompt ends in ">>>": the reply starts with a
         * recipient; one written out again is the opener's. */
        if (avail < 3 && !memcmp(p, ">>>", avail) && !final) return ZI_TF_MORE;
        if (avail >= 3 && !memcmp(p, ">>>", 3)) return ZI_TF_FAIL;
        *kind = K_FUNC32, *body = from;
        return ZI_TF_DONE;
    }
    if (f != ZI_TF_GENERIC) return ZI_TF_FAIL;
    if (!avail) return final ? ZI_TF_FAIL : ZI_TF_MORE;
    for (size_t m = 0; m < sizeof START_MARKERS / sizeof START_MARKERS[0]; m++) {
        size_t ml = strlen(START_MARKERS[m]);
        if (avail < ml && !memcmp(p, START_MARKERS[m], avail) && !final) return ZI_TF_MORE;
        if (avail >= ml && !memcmp(p, START_MARKERS[m], ml)) {
            *kind = K_JSON, *body = from + ml;
            return ZI_TF_DONE;
        }
    }
    if (*p == '{' || *p == '[') {
        *kind = K_JSON, *body = from;
        return ZI_TF_DONE;
    }
    return ZI_TF_FAIL;
}

/* ---- JSON --------------------------------------------------------------- */

static int sp(char c) {
    return isspace((unsigned char)c);
}

static void skip_ws(const char *s, size_t n, size_t *i) {
    while (*i < n && sp(s[*i])) (*i)++;
}

/* A JSON string starting at *i (a '"'): DONE with *i just after it; FAIL
 * with *i at the byte that cannot be in it. */
static int str_end(const char *s, size_t n, size_t *i) {
    size_t j = *i + 1;
    while (j < n) {
        if (s[j] == '\\') {
            j += 2;
            continue;
        }
        if (s[j] == '"') {
            *i = j + 1;
            return ZI_TF_DONE;
        }
        if ((unsigned char)s[j] < 0x20) {
            *i = j;
            return ZI_TF_FAIL;
        }
        j++;
    }
    return ZI_TF_MORE;
}

static int literal_char(char c) {
    return isalnum((unsigned char)c) || c == '-' || c == '+' || c == '.';
}

/* Skips the JSON value at *i, loosely (brackets matched, strings closed;
 * the arguments are validated whole once they end). FAIL with *i at the
 * byte that cannot be there. */
static int skip_value(const char *s, size_t n, size_t *i) {
    char stack[ZI_TF_MAX_DEPTH];
    int d = 0;
    size_t j = *i;
    for (;;) {
        if (j >= n) return ZI_TF_MORE;
        char c = s[j];
        if (c == '"') {
            int r = str_end(s, n, &j);
            if (r == ZI_TF_MORE) return r;
            if (r == ZI_TF_FAIL) break;
        } else if (c == '{' || c == '[') {
            if (d == ZI_TF_MAX_DEPTH) break;
            stack[d++] = c;
            j++;
        } else if (c == '}' || c == ']') {
            if (!d || stack[d - 1] != (c == '}' ? '{' : '[')) break;
            d--;
            j++;
        } else if (literal_char(c)) {
            while (j < n && literal_char(s[j])) j++;
            if (j >= n) return ZI_TF_MORE; /* a number may go on */
        } else if (d && (sp(c) || c == ',' || c == ':')) {
            j++;
            continue;
        } else {
            break;
        }
        if (!d) {
            *i = j;
            return ZI_TF_DONE;
        }
    }
    *i = j; /* every break is a byte that cannot be there */
    return ZI_TF_FAIL;
}

/* Skips call c's arguments object at *j: as skip_value, noting where its
 * text went wrong (the end of what may be sent of it). */
static int skip_args(const char *s, size_t n, size_t *j, zi_tf_call *c) {
    c->has_args = 1;
    c->args_from = *j;
    int r = skip_value(s, n, j);
    if (r == ZI_TF_DONE) c->args_to = *j;
    if (r == ZI_TF_FAIL) c->args_bad = *j;
    return r;
}

static int known(const json_t *names, const char *name, size_t len) {
    size_t i;
    json_t *x;
    if (!len || len > ZI_TF_NAME_MAX || memchr(name, '\0', len)) return 0;
    json_array_foreach(names, i, x) {
        if (json_string_length(x) == len && !memcmp(json_string_value(x), name, len)) return 1;
    }
    return 0;
}

static int key_is(const char *s, size_t from, size_t to, const char *k) {
    return to - from == strlen(k) && !memcmp(s + from, k, to - from);
}

static zi_tf_call *new_call(zi_tf_scan *sc) {
    if (sc->ncalls == ZI_TF_MAX_CALLS) return NULL;
    zi_tf_call *c = &sc->calls[sc->ncalls++];
    memset(c, 0, sizeof *c);
    return c;
}

static void set_name(zi_tf_call *c, const char *name, size_t len) {
    memcpy(c->name, name, len);
    c->name[len] = '\0';
    c->has_name = 1;
}

/* The call object at *i (a '{'): "name" (or, cohere, "tool_name") and
 * "arguments" or "parameters" (an object); other keys skipped. */
static int scan_call(zi_tf_scan *sc, size_t *i, int cohere) {
    const char *s = sc->s;
    size_t n = sc->n, j = *i + 1;
    zi_tf_call *c = new_call(sc);
    if (!c) return ZI_TF_FAIL;
    for (;;) {
        skip_ws(s, n, &j);
        if (j >= n) return ZI_TF_MORE;
        if (s[j] != '"') return ZI_TF_FAIL;
        size_t k0 = j;
        int r = str_end(s, n, &j);
        if (r != ZI_TF_DONE) return r;
        size_t k1 = j;
        skip_ws(s, n, &j);
        if (j >= n) return ZI_TF_MORE;
        if (s[j++] != ':') return ZI_TF_FAIL;
        skip_ws(s, n, &j);
        if (j >= n) return ZI_TF_MORE;
        if (key_is(s, k0 + 1, k1 - 1, "name") ||
            (cohere && key_is(s, k0 + 1, k1 - 1, "tool_name"))) {
            if (c->has_name || s[j] != '"') return ZI_TF_FAIL;
            size_t v0 = j;
            if ((r = str_end(s, n, &j)) != ZI_TF_DONE) return r;
            json_t *v = json_loadb(s + v0, j - v0, JSON_DECODE_ANY, NULL);
            int ok =
                json_is_string(v) && known(sc->names, json_string_value(v), json_string_length(v));
            if (ok) set_name(c, json_string_value(v), json_string_length(v));
            json_decref(v);
            if (!ok) return ZI_TF_FAIL;
        } else if (key_is(s, k0 + 1, k1 - 1, "arguments") ||
                   key_is(s, k0 + 1, k1 - 1, "parameters")) {
            if (c->has_args || s[j] != '{') return ZI_TF_FAIL;
            if ((r = skip_args(s, n, &j, c)) != ZI_TF_DONE) return r;
        } else if ((r = skip_value(s, n, &j)) != ZI_TF_DONE) {
            return r;
        }
        skip_ws(s, n, &j);
        if (j >= n) return ZI_TF_MORE;
        if (s[j] == ',') {
            j++;
            continue;
        }
        if (s[j] != '}' || !c->has_name || !c->has_args) return ZI_TF_FAIL;
        *i = j + 1;
        return ZI_TF_DONE;
    }
}

/* The marker m at *j after whitespace: DONE with *j after it; MORE while
 * the text ends in a prefix of it; FAIL on other text. */
static int expect(const zi_tf_scan *sc, size_t *j, const char *m) {
    size_t k = *j, ml = strlen(m);
    skip_ws(sc->s, sc->n, &k);
    size_t avail = sc->n - k;
    if (avail >= ml && !memcmp(sc->s + k, m, ml)) {
        *j = k + ml;
        return ZI_TF_DONE;
    }
    return avail < ml && !memcmp(sc->s + k, m, avail) ? ZI_TF_MORE : ZI_TF_FAIL;
}

/* The region ends with marker `close` (NULL: none) after *j; the text's
 * end stands for a missing one. */
static int close_region(zi_tf_scan *sc, size_t j, const char *close) {
    if (close) {
        int r = expect(sc, &j, close);
        if (r == ZI_TF_FAIL) return r;
        if (r == ZI_TF_MORE) {
            if (!sc->final) return r;
            j = sc->n; /* unclosed at the end of the text */
        }
    }
    sc->end = j;
    return ZI_TF_DONE;
}

/* One call object or an array of them from `from`, then `close`. */
static int scan_json(zi_tf_scan *sc, size_t from, const char *close, int cohere) {
    const char *s = sc->s;
    size_t n = sc->n, j = from;
    skip_ws(s, n, &j);
    if (j >= n) return ZI_TF_MORE;
    int r;
    if (s[j] == '{') {
        if ((r = scan_call(sc, &j, cohere)) != ZI_TF_DONE) return r;
    } else if (s[j] == '[') {
        for (j++;;) {
            skip_ws(s, n, &j);
            if (j >= n) return ZI_TF_MORE;
            if (s[j] != '{') return ZI_TF_FAIL;
            if ((r = scan_call(sc, &j, cohere)) != ZI_TF_DONE) return r;
            skip_ws(s, n, &j);
            if (j >= n) return ZI_TF_MORE;
            if (s[j] == ']') break;
            if (s[j++] != ',') return ZI_TF_FAIL;
        }
        j++;
    } else {
        return ZI_TF_FAIL;
    }
    return close_region(sc, j, close);
}

/* ---- calls named by markers, JSON arguments ----------------------------- */

typedef struct named_fmt {
    const char *call_open;  /* before each call (in a section) */
    const char *name_end;   /* after the name */
    const char *prefix;     /* dropped before the name when there */
    int index_suffix;       /* the name ends in ":DIGITS" (dropped) */
    const char *call_close; /* after the arguments */
    const char *close;      /* the section's end; NULL: one call, no section */
} named_fmt;

static const named_fmt DS = {"<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",      NULL, 0,
                             "<｜tool▁call▁end｜>",   "<｜tool▁calls▁end｜>"};
static const named_fmt KIMI = {"<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                               "functions.",          1,
                               "<|tool_call_end|>",   "<|tool_calls_section_end|>"};
static const named_fmt FUNC31 = {NULL, ">", NULL, 0, "</function>", NULL};

/* Where marker m first occurs in s[from..n), or n. */
static size_t find(const char *s, size_t n, size_t from, const char *m) {
    size_t ml = strlen(m);
    for (size_t i = from; i + ml <= n; i++)
        if (s[i] == m[0] && !memcmp(s + i, m, ml)) return i;
    return n;
}

/* The name at s[from..to) (trimmed, the prefix and index dropped) into a
 * new call: 0, or -1 when it is no known tool's. */
static int named_call(zi_tf_scan *sc, const named_fmt *nf, size_t from, size_t to) {
    const char *s = sc->s;
    while (from < to && sp(s[from])) from++;
    while (to > from && sp(s[to - 1])) to--;
    size_t pl = nf->prefix ? strlen(nf->prefix) : 0;
    if (pl && to - from >= pl && !memcmp(s + from, nf->prefix, pl)) from += pl;
    if (nf->index_suffix) {
        size_t k = to;
        while (k > from && isdigit((unsigned char)s[k - 1])) k--;
        if (k < to && k > from && s[k - 1] == ':') to = k - 1;
    }
    zi_tf_call *c = new_call(sc);
    if (!c || !known(sc->names, s + from, to - from)) return -1;
    set_name(c, s + from, to - from);
    return 0;
}

/* Calls written `call_open NAME name_end {args} call_close`: one (no
 * section, or in_call: the opener was the first call's call_open and the
 * section's own opener missing) or a section of them up to `close` (the
 * text's end, or other text after a call, standing for a missing one). */
static int scan_named(zi_tf_scan *sc, size_t j, const named_fmt *nf, int in_call) {
    const char *s = sc->s;
    size_t n = sc->n;
    for (int first = 1;; first = 0) {
        if (!(first && in_call)) {
            int r = nf->close ? expect(sc, &j, nf->close) : ZI_TF_FAIL;
            if (r == ZI_TF_DONE) {
                sc->end = j;
                return r;
            }
            if (r == ZI_TF_MORE) return sc->final ? close_region(sc, n, NULL) : r;
            r = expect(sc, &j, nf->call_open);
            if (r == ZI_TF_MORE && !sc->final) return r;
            if (r != ZI_TF_DONE) return first ? ZI_TF_FAIL : close_region(sc, j, NULL);
        }
        size_t e = find(s, n, j, nf->name_end);
        if (e == n) return n - j > ZI_TF_NAME_MAX + 64 ? ZI_TF_FAIL : ZI_TF_MORE;
        size_t n0 = j, n1 = e;
        j = e + strlen(nf->name_end);
        /* DeepSeek R1 writes `function<sep>NAME\n```json\n{...}\n```` */
        int fenced = nf == &DS && e - n0 == 8 && !memcmp(s + n0, "function", 8);
        if (fenced) {
            n0 = j, n1 = find(s, n, j, "\n");
            if (n1 == n) return n - j > ZI_TF_NAME_MAX ? ZI_TF_FAIL : ZI_TF_MORE;
            j = n1;
        }
        if (named_call(sc, nf, n0, n1)) return ZI_TF_FAIL;
        zi_tf_call *c = &sc->calls[sc->ncalls - 1];
        if (fenced) {
            int r = expect(sc, &j, "```json");
            if (r != ZI_TF_DONE) return r;
        }
        skip_ws(s, n, &j);
        if (j >= n) return ZI_TF_MORE;
        if (s[j] != '{') return ZI_TF_FAIL;
        int r = skip_args(s, n, &j, c);
        if (r != ZI_TF_DONE) return r;
        if (fenced && (r = expect(sc, &j, "```")) != ZI_TF_DONE)
            return r == ZI_TF_MORE && sc->final ? close_region(sc, n, NULL) : r;
        r = expect(sc, &j, nf->call_close);
        if (r == ZI_TF_MORE) return sc->final ? close_region(sc, n, NULL) : r;
        if (r == ZI_TF_FAIL) return r;
        if (!nf->close || in_call) {
            sc->end = j;
            return ZI_TF_DONE;
        }
    }
}

/* ---- arguments written as XML parameters -------------------------------- */

static int put(zi_tf_scan *sc, zi_tf_call *c, const char *p, size_t n) {
    if (c->json_len + n + 1 > c->json_cap) {
        size_t cap = c->json_cap ? c->json_cap : 64;
        while (cap < c->json_len + n + 1) cap *= 2;
        char *b = realloc(c->json, cap);
        if (!b) {
            sc->oom = 1;
            return -1;
        }
        c->json = b, c->json_cap = cap;
    }
    memcpy(c->json + c->json_len, p, n);
    c->json[c->json_len += n] = '\0';
    return 0;
}

/* s[0..n) as the inside of a JSON string. */
static int put_escaped(zi_tf_scan *sc, zi_tf_call *c, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[8];
        const char *p = e;
        size_t l = 2;
        e[0] = '\\';
        if (ch == '"' || ch == '\\')
            e[1] = (char)ch;
        else if (ch == '\n')
            e[1] = 'n';
        else if (ch == '\r')
            e[1] = 'r';
        else if (ch == '\t')
            e[1] = 't';
        else if (ch < 0x20)
            l = (size_t)snprintf(e, sizeof e, "\\u%04x", ch);
        else
            p = s + i, l = 1;
        if (put(sc, c, p, l)) return -1;
    }
    return 0;
}

/* Whether the schema of tool `name`'s parameter `key` (k bytes) says
 * "string" (so its value is the text as written, never JSON). */
static int string_typed(const zi_tf_scan *sc, const char *name, const char *key, size_t k) {
    size_t i;
    json_t *t;
    json_array_foreach(sc->tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *tn = json_string_value(json_object_get(fn, "name"));
        if (!tn || strcmp(tn, name)) continue;
        json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        char kb[256];
        if (k >= sizeof kb) return 0;
        memcpy(kb, key, k);
        kb[k] = '\0';
        json_t *ty = json_object_get(json_object_get(props, kb), "type");
        return json_is_string(ty) && !strcmp(json_string_value(ty), "string");
    }
    return 0;
}

/* A whole value of a parameter not typed string: its JSON text when it is
 * JSON (Python's True / False / None as JSON's), else a string. */
static int put_value(zi_tf_scan *sc, zi_tf_call *c, const char *v, size_t n) {
    while (n && sp(*v)) v++, n--;
    while (n && sp(v[n - 1])) n--;
    static const char *const PY[][2] = {{"True", "true"}, {"False", "false"}, {"None", "null"}};
    for (size_t i = 0; i < 3; i++)
        if (n == strlen(PY[i][0]) && !memcmp(v, PY[i][0], n))
            return put(sc, c, PY[i][1], strlen(PY[i][1]));
    json_t *j = n ? json_loadb(v, n, JSON_DECODE_ANY, NULL) : NULL;
    int ok = j != NULL;
    json_decref(j);
    if (ok) return put(sc, c, v, n);
    return put(sc, c, "\"", 1) || put_escaped(sc, c, v, n) || put(sc, c, "\"", 1);
}

/* How many bytes at the end of s[from..n) may begin marker m (held back
 * while a value streams). */
static size_t held(const char *s, size_t from, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n - from ? ml - 1 : n - from; k; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

/* A parameter's key has been read (s[k0..k1)); its value begins at *j and
 * ends at marker `vend`; str: it is a string (its text as written), else
 * JSON where it parses (put_value). trim_nl: one newline each side is the
 * layout's (Qwen3-Coder). DONE with *j after vend; MORE with the decided
 * part of a string value written. */
static int xml_value(zi_tf_scan *sc, zi_tf_call *c, size_t k0, size_t k1, size_t *j,
                     const char *vend, int str, int trim_nl) {
    const char *s = sc->s;
    size_t n = sc->n, v0 = *j;
    json_t *kj = json_stringn(s + k0, k1 - k0);
    char *ks = kj ? json_dumps(kj, JSON_ENCODE_ANY) : NULL;
    json_decref(kj);
    if (!ks) {
        sc->oom = 1;
        return ZI_TF_FAIL;
    }
    int bad = put(sc, c, c->json_len > 1 ? ", " : "", c->json_len > 1 ? 2 : 0) ||
              put(sc, c, ks, strlen(ks)) || put(sc, c, ": ", 2);
    free(ks);
    if (bad) return ZI_TF_FAIL;
    if (trim_nl) {
        if (v0 >= n) return ZI_TF_MORE;
        if (s[v0] == '\n') v0++;
    }
    size_t e = find(s, n, v0, vend);
    if (e == n) {
        if (!str) return ZI_TF_MORE;
        size_t to = n - held(s, v0, n, vend);
        if (trim_nl && to > v0 && s[to - 1] == '\n') to--; /* may be the layout's */
        if (put(sc, c, "\"", 1) || put_escaped(sc, c, s + v0, to - v0)) return ZI_TF_FAIL;
        return ZI_TF_MORE;
    }
    size_t ve = e;
    if (trim_nl && ve > v0 && s[ve - 1] == '\n') ve--;
    *j = e + strlen(vend);
    if (str) {
        if (put(sc, c, "\"", 1) || put_escaped(sc, c, s + v0, ve - v0) || put(sc, c, "\"", 1))
            return ZI_TF_FAIL;
        return ZI_TF_DONE;
    }
    return put_value(sc, c, s + v0, ve - v0) ? ZI_TF_FAIL : ZI_TF_DONE;
}

typedef struct xml_fmt {
    const char *key_open, *key_close; /* around a parameter's name */
    const char *val_open;             /* between name and value ("" when key_close is it) */
    const char *val_close, *call_close, *close;
    int trim_nl;
} xml_fmt;

static const xml_fmt QWEN = {"<parameter=",  ">", "", "</parameter>", "</function>",
                             "</tool_call>", 1};
static const xml_fmt GLM = {
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</tool_call>", NULL, 0};

static int xfail(zi_tf_scan *sc, size_t j) {
    sc->fail_at = j;
    return ZI_TF_FAIL;
}

/* The parameters of call c from j, then its closing markers. */
static int scan_params(zi_tf_scan *sc, zi_tf_call *c, size_t j, const xml_fmt *xf) {
    const char *s = sc->s;
    size_t n = sc->n;
    c->has_args = c->written = 1;
    c->args_from = j;
    if (put(sc, c, "{", 1)) return ZI_TF_FAIL;
    for (;;) {
        int r = expect(sc, &j, xf->call_close);
        if (r == ZI_TF_DONE) {
            if (put(sc, c, "}", 1)) return ZI_TF_FAIL;
            c->json_done = 1;
            if (!xf->close) {
                sc->end = j;
                return r;
            }
            r = close_region(sc, j, xf->close);
            return r == ZI_TF_FAIL ? xfail(sc, j) : r;
        }
        if (r == ZI_TF_MORE) return r;
        if ((r = expect(sc, &j, xf->key_open)) != ZI_TF_DONE)
            return r == ZI_TF_FAIL ? xfail(sc, j) : r;
        size_t k0 = j, k1 = find(s, n, j, xf->key_close);
        if (k1 == n) return n - j > 256 ? xfail(sc, j) : ZI_TF_MORE;
        if (memchr(s + k0, '<', k1 - k0) || memchr(s + k0, '\n', k1 - k0)) return xfail(sc, j);
        j = k1 + strlen(xf->key_close);
        if (*xf->val_open && (r = expect(sc, &j, xf->val_open)) != ZI_TF_DONE)
            return r == ZI_TF_FAIL ? xfail(sc, j) : r;
        int str = string_typed(sc, c->name, s + k0, k1 - k0);
        if ((r = xml_value(sc, c, k0, k1, &j, xf->val_close, str, xf->trim_nl)) != ZI_TF_DONE)
            return r;
    }
}

/* Qwen3-Coder, after <tool_call>: <function=NAME> and its parameters, or
 * a Hermes JSON call. */
static int scan_qwen(zi_tf_scan *sc, size_t j) {
    const char *s = sc->s;
    size_t n = sc->n;
    skip_ws(s, n, &j);
    if (j < n && s[j] == '{') return scan_json(sc, j, "</tool_call>", 0);
    int r = expect(sc, &j, "<function=");
    if (r != ZI_TF_DONE) return r;
    size_t e = find(s, n, j, ">");
    if (e == n) return n - j > ZI_TF_NAME_MAX ? ZI_TF_FAIL : ZI_TF_MORE;
    zi_tf_call *c = new_call(sc);
    if (!c || !known(sc->names, s + j, e - j)) return ZI_TF_FAIL;
    set_name(c, s + j, e - j);
    return scan_params(sc, c, e + 1, &QWEN);
}

/* GLM-4.5, after <tool_call>: NAME, then <arg_key>/<arg_value> pairs;
 * or a Hermes JSON call. */
static int scan_glm(zi_tf_scan *sc, size_t j) {
    const char *s = sc->s;
    size_t n = sc->n;
    skip_ws(s, n, &j);
    if (j < n && s[j] == '{') return scan_json(sc, j, "</tool_call>", 0);
    size_t e = j;
    while (e < n && s[e] != '\n' && s[e] != '<') e++;
    if (e == n) return n - j > ZI_TF_NAME_MAX ? ZI_TF_FAIL : ZI_TF_MORE;
    size_t t = e;
    while (t > j && sp(s[t - 1])) t--;
    zi_tf_call *c = new_call(sc);
    if (!c || !known(sc->names, s + j, t - j)) return ZI_TF_FAIL;
    set_name(c, s + j, t - j);
    return scan_params(sc, c, e, &GLM);
}

/* DeepSeek V3.2 / V4 (DSML), after the block's opener: invokes
 *   <｜DSML｜invoke name="NAME">
 *   <｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 * up to `close` (the text's end, or other text after an invoke, standing
 * for a missing one). string="true": V is a string as written (no
 * escaping, no trimming); "false": JSON (put_value); no attribute: as the
 * tool's schema types K. */
#define DSML_INVOKE "<｜DSML｜invoke name=\""
#define DSML_PARAM "<｜DSML｜parameter name=\""
static int scan_dsml(zi_tf_scan *sc, size_t j, const char *close) {
    const char *s = sc->s;
    size_t n = sc->n;
    for (int first = 1;; first = 0) {
        int r = expect(sc, &j, close);
        if (r == ZI_TF_DONE) {
            sc->end = j;
            return r;
        }
        if (r == ZI_TF_MORE) return sc->final && !first ? close_region(sc, n, NULL) : r;
        size_t inv = j; /* a bad invoke after a sent call: the text goes on here */
        r = expect(sc, &j, DSML_INVOKE);
        if (r == ZI_TF_MORE && !sc->final) return r;
        if (r != ZI_TF_DONE) return first ? ZI_TF_FAIL : close_region(sc, j, NULL);
        size_t e = find(s, n, j, "\"");
        if (e == n) return n - j > ZI_TF_NAME_MAX ? xfail(sc, inv) : ZI_TF_MORE;
        size_t n0 = j;
        j = e + 1;
        if ((r = expect(sc, &j, ">")) != ZI_TF_DONE) return r == ZI_TF_FAIL ? xfail(sc, inv) : r;
        zi_tf_call *c = new_call(sc);
        if (!c || !known(sc->names, s + n0, e - n0)) return xfail(sc, inv);
        set_name(c, s + n0, e - n0);
        c->has_args = c->written = 1;
        c->args_from = j;
        if (put(sc, c, "{", 1)) return ZI_TF_FAIL;
        for (;;) {
            r = expect(sc, &j, "</｜DSML｜invoke>");
            if (r == ZI_TF_DONE) break;
            if (r == ZI_TF_MORE) return r;
            if ((r = expect(sc, &j, DSML_PARAM)) != ZI_TF_DONE)
                return r == ZI_TF_FAIL ? xfail(sc, j) : r;
            size_t k0 = j, k1 = find(s, n, j, "\"");
            if (k1 == n) return n - j > 256 ? xfail(sc, j) : ZI_TF_MORE;
            if (memchr(s + k0, '<', k1 - k0) || memchr(s + k0, '\n', k1 - k0)) return xfail(sc, j);
            j = k1 + 1;
            /* string="true" | string="false" | nothing, then ">" */
            int str = -1;
            static const char *const ATTR[] = {"string=\"true\">", "string=\"false\">", ">"};
            for (int a = 0; a < 3 && str < 0; a++) {
                r = expect(sc, &j, ATTR[a]);
                if (r == ZI_TF_MORE) return r;
                if (r == ZI_TF_DONE)
                    str = a == 2 ? string_typed(sc, c->name, s + k0, k1 - k0) : a == 0;
            }
            if (str < 0) return xfail(sc, j);
            r = xml_value(sc, c, k0, k1, &j, "</｜DSML｜parameter>", str, 0);
            if (r != ZI_TF_DONE) return r;
        }
        if (put(sc, c, "}", 1)) return ZI_TF_FAIL;
        c->json_done = 1;
    }
}

/* ---- gpt-oss, Functionary v3.2, Command-R ------------------------------- */

/* A harmony header up to <|message|>: a call when it says
 * `to=functions.NAME`, its JSON arguments then ending at <|call|>; else
 * the header alone (dropped; the message's text follows as content). */
static int scan_harmony(zi_tf_scan *sc, size_t j) {
    const char *s = sc->s;
    size_t n = sc->n, m = find(s, n, j, "<|message|>");
    if (m == n) return n - j > 512 || sc->final ? ZI_TF_FAIL : ZI_TF_MORE;
    size_t t = find(s, m, j, "to=functions.");
    size_t body = m + strlen("<|message|>");
    if (t == m) {
        sc->end = body;
        return ZI_TF_DONE;
    }
    size_t a = t + strlen("to=functions."), e = a;
    while (e < m && !sp(s[e]) && s[e] != '<') e++;
    zi_tf_call *c = new_call(sc);
    if (!c || !known(sc->names, s + a, e - a)) return ZI_TF_FAIL;
    set_name(c, s + a, e - a);
    skip_ws(s, n, &body);
    if (body >= n) return ZI_TF_MORE;
    if (s[body] != '{') return ZI_TF_FAIL;
    int r = skip_args(s, n, &body, c);
    if (r != ZI_TF_DONE) return r;
    return close_region(sc, body, "<|call|>");
}

/* Functionary v3.2, after ">>>" (or at the text's start): "all\n" (text
 * follows) or NAME "\n" and its JSON arguments. */
static int scan_func32(zi_tf_scan *sc, size_t j) {
    const char *s = sc->s;
    size_t n = sc->n, e = j;
    while (e < n && (isalnum((unsigned char)s[e]) || s[e] == '_' || s[e] == '-' || s[e] == '.'))
        e++;
    if (e == n) return e - j > ZI_TF_NAME_MAX || sc->final ? ZI_TF_FAIL : ZI_TF_MORE;
    if (s[e] != '\n') return ZI_TF_FAIL;
    if (e - j == 3 && !memcmp(s + j, "all", 3)) {
        sc->end = e + 1;
        return ZI_TF_DONE;
    }
    zi_tf_call *c = new_call(sc);
    if (!c || !known(sc->names, s + j, e - j)) return ZI_TF_FAIL;
    set_name(c, s + j, e - j);
    j = e + 1;
    skip_ws(s, n, &j);
    if (j >= n) return ZI_TF_MORE;
    if (s[j] != '{') return ZI_TF_FAIL;
    int r = skip_args(s, n, &j, c);
    if (r != ZI_TF_DONE) return r;
    sc->end = j;
    return ZI_TF_DONE;
}

/* Command-R's "Action:" then a JSON list, in a ```json fence or not. */
static int scan_cohere_text(zi_tf_scan *sc, size_t j) {
    size_t k = j;
    int r = expect(sc, &k, "```");
    if (r == ZI_TF_MORE) return sc->final ? ZI_TF_FAIL : r;
    if (r == ZI_TF_FAIL) return scan_json(sc, j, NULL, 1);
    if (sc->n - k < 4 && !memcmp(sc->s + k, "json", sc->n - k))
        return sc->final ? ZI_TF_FAIL : ZI_TF_MORE;
    if (!memcmp(sc->s + k, "json", 4)) k += 4;
    return scan_json(sc, k, "```", 1);
}

int zi_tf_scan_region(zi_tf_scan *sc, int kind, size_t from) {
    int r = ZI_TF_FAIL;
    switch (kind) {
    case K_JSON:
        r = scan_json(sc, from, NULL, 0);
        break;
    case K_HERMES:
        r = scan_json(sc, from, "</tool_call>", 0);
        break;
    case K_QWEN:
        r = scan_qwen(sc, from);
        break;
    case K_GLM:
        r = scan_glm(sc, from);
        break;
    case K_DS_SECTION:
    case K_DS_CALL:
        r = scan_named(sc, from, &DS, kind == K_DS_CALL);
        break;
    case K_DSML_FC:
        r = scan_dsml(sc, from, "</｜DSML｜function_calls>");
        break;
    case K_DSML_TC:
        r = scan_dsml(sc, from, "</｜DSML｜tool_calls>");
        break;
    case K_KIMI_SECTION:
    case K_KIMI_CALL:
        r = scan_named(sc, from, &KIMI, kind == K_KIMI_CALL);
        break;
    case K_FUNC31:
        r = scan_named(sc, from, &FUNC31, 1);
        break;
    case K_HARMONY:
        r = scan_harmony(sc, from);
        break;
    case K_DROP:
        sc->end = from;
        r = ZI_TF_DONE;
        break;
    case K_COHERE:
        r = scan_json(sc, from, "<|END_ACTION|>", 1);
        break;
    case K_COHERE_TEXT:
        r = scan_cohere_text(sc, from);
        break;
    case K_FUNC32:
        r = scan_func32(sc, from);
        break;
    }
    return sc->oom ? ZI_TF_FAIL : r;
}

int zi_tf_call_args(const zi_tf_scan *sc, const zi_tf_call *c, const char **p, size_t *len) {
    if (c->written) {
        *p = c->json ? c->json : "";
        *len = c->json_len;
        return c->json_done;
    }
    *p = sc->s + c->args_from;
    *len = (c->args_to ? c->args_to : c->args_bad ? c->args_bad : sc->n) - c->args_from;
    return c->args_to != 0;
}

void zi_tf_scan_clear(zi_tf_scan *sc) {
    for (int k = 0; k < sc->ncalls; k++) free(sc->calls[k].json);
    sc->ncalls = 0;
    sc->oom = 0;
}
