/*
 * chat_template_source.c - the built-in chat templates and the loading of
 * `--chat-template FILE|NAME` (see chat_template_source.h).
 *
 * The templates are written for this project from the formats' published
 * descriptions. Each starts with the same prelude: `text` is a message's
 * content, or "" when it is not a string (null content beside tool calls),
 * so a built-in template never fails on a message the router accepted.
 */
#include "chat_template_source.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ChatML (Qwen, SmolLM, Hermes, ...): every role as it is. */
static const char CHATML[] =
    "{%- for m in messages -%}\n"
    "{%- set text = m.content if m.content is string else '' -%}\n"
    "{{- '<|im_start|>' ~ m.role ~ '\\n' ~ text ~ '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

/* Gemma: the assistant is "model"; user and model contents are trimmed.
 * Gemma has no system turn: a system message's text, followed by a blank
 * line, opens the next user turn (Gemma 3's template does this for a
 * leading system message; several are joined by blank lines). One left
 * over at the end becomes a user turn of its own. */
static const char GEMMA[] =
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(sys=none) -%}\n"
    "{%- for m in messages -%}\n"
    "{%- set text = m.content if m.content is string else '' -%}\n"
    "{%- if m.role == 'system' -%}\n"
    "{%- set ns.sys = text if ns.sys is none else ns.sys ~ '\\n\\n' ~ text -%}\n"
    "{%- else -%}\n"
    "{%- set role = 'model' if m.role == 'assistant' else m.role -%}\n"
    "{{- '<start_of_turn>' ~ role ~ '\\n' -}}\n"
    "{%- if ns.sys is not none and role != 'model' -%}\n"
    "{{- ns.sys ~ '\\n\\n' -}}{%- set ns.sys = none -%}\n"
    "{%- endif -%}\n"
    "{{- text | trim ~ '<end_of_turn>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if ns.sys is not none -%}{{- '<start_of_turn>user\\n' ~ ns.sys ~ '<end_of_turn>\\n' -}}"
    "{%- endif -%}\n"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n";

/* Llama 3 Instruct: BOS before the first message, contents trimmed, no
 * default system prompt (Llama 3.1's date header is not added). */
static const char LLAMA3[] =
    "{%- for m in messages -%}\n"
    "{%- set text = m.content if m.content is string else '' -%}\n"
    "{%- if loop.first -%}{{- bos_token -}}{%- endif -%}\n"
    "{{- '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\\n\\n' ~ text | trim ~ '<|eot_id|>' "
    "-}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}\n";

/* Mistral 7B Instruct v0.3: user turns in [INST] ... [/INST], each
 * assistant reply after a space, trimmed, ending with EOS. The system text
 * goes before the last message, when that is a user message (as the
 * published template: a conversation ending with a reply drops it). */
static const char MISTRAL[] =
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(sys=none) -%}\n"
    "{%- for m in messages if m.role == 'system' -%}\n"
    "{%- set text = m.content if m.content is string else '' -%}\n"
    "{%- set ns.sys = text if ns.sys is none else ns.sys ~ '\\n\\n' ~ text -%}\n"
    "{%- endfor -%}\n"
    "{%- for m in messages if m.role != 'system' -%}\n"
    "{%- set text = m.content if m.content is string else '' -%}\n"
    "{%- if m.role == 'assistant' -%}\n"
    "{{- ' ' ~ text | trim ~ eos_token -}}\n"
    "{%- elif loop.last and ns.sys is not none -%}\n"
    "{{- '[INST] ' ~ ns.sys ~ '\\n\\n' ~ text ~ '[/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- '[INST] ' ~ text ~ '[/INST]' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n";

/* Phi-3 / Phi-3.5: <|system|>, <|user|>, <|assistant|> turns closed by
 * <|end|>; an empty system message is left out; other roles are user
 * turns; without a generation prompt the text ends with EOS. */
static const char PHI3[] =
    "{%- for m in messages -%}\n"
    "{%- set text = m.content if m.content is string else '' -%}\n"
    "{%- set role = m.role if m.role in ['system', 'assistant'] else 'user' -%}\n"
    "{%- if role != 'system' or text -%}\n"
    "{{- '<|' ~ role ~ '|>\\n' ~ text ~ '<|end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}"
    "{%- endif -%}\n";

const char *const zi_chat_template_names[] = {"chatml", "gemma", "llama3", "mistral", "phi3", NULL};
static const char *const SOURCES[] = {CHATML, GEMMA, LLAMA3, MISTRAL, PHI3};

const char *zi_chat_template_builtin(const char *name) {
    for (size_t i = 0; name && zi_chat_template_names[i]; i++)
        if (!strcmp(name, zi_chat_template_names[i])) return SOURCES[i];
    return NULL;
}

const char *zi_chat_template_name_list(char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; zi_chat_template_names[i] && n < cap; i++) {
        int w = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", zi_chat_template_names[i]);
        if (w < 0) break;
        n += (size_t)w;
    }
    return buf;
}

int zi_chat_template_load(const char *arg, char **src, size_t *len, zi_error *err) {
    *src = NULL;
    *len = 0;
    if (!arg || !*arg) return zi_error_set(err, ZI_EINVAL, "--chat-template: empty value");
    const char *b = zi_chat_template_builtin(arg);
    if (b) {
        *len = strlen(b);
        *src = strdup(b);
        return *src ? ZI_OK : zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    FILE *f = fopen(arg, "rb");
    if (!f) {
        int e = errno;
        char names[128];
        /* A bare word is more likely a mistyped name than a missing file. */
        if (e == ENOENT && !strchr(arg, '/') && !strchr(arg, '.'))
            return zi_error_set(err, ZI_EIO,
                                "--chat-template %s: not a built-in template (%s) and no such file",
                                arg, zi_chat_template_name_list(names, sizeof names));
        return zi_error_set(err, ZI_EIO, "--chat-template %s: cannot open: %s", arg, strerror(e));
    }
    struct stat st;
    int rc = ZI_OK;
    if (fstat(fileno(f), &st) != 0)
        rc = zi_error_set(err, ZI_EIO, "--chat-template %s: %s", arg, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = zi_error_set(err, ZI_EINVAL, "--chat-template %s: not a regular file", arg);
    else if ((unsigned long long)st.st_size > ZI_CHAT_TEMPLATE_MAX_SOURCE)
        rc =
            zi_error_set(err, ZI_ERANGE,
                         "--chat-template %s: %lld bytes, more than a chat template's limit of %zu",
                         arg, (long long)st.st_size, ZI_CHAT_TEMPLATE_MAX_SOURCE);
    else if (st.st_size == 0)
        rc = zi_error_set(err, ZI_EINVAL, "--chat-template %s: the file is empty", arg);
    char *buf = NULL;
    size_t got = 0;
    if (!rc) {
        /* Read up to one byte past the limit: the file may grow after fstat. */
        size_t cap = (size_t)st.st_size + 1;
        buf = malloc(cap + 1);
        if (!buf) rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
        while (!rc && got < cap) {
            size_t r = fread(buf + got, 1, cap - got, f);
            if (r == 0) break;
            got += r;
        }
        if (!rc && ferror(f))
            rc = zi_error_set(err, ZI_EIO, "--chat-template %s: cannot read: %s", arg,
                              strerror(errno));
        else if (!rc && got > ZI_CHAT_TEMPLATE_MAX_SOURCE)
            rc = zi_error_set(err, ZI_ERANGE,
                              "--chat-template %s: more than a chat template's limit of %zu bytes",
                              arg, ZI_CHAT_TEMPLATE_MAX_SOURCE);
        else if (!rc && got == 0)
            rc = zi_error_set(err, ZI_EINVAL, "--chat-template %s: the file is empty", arg);
    }
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[got] = '\0';
    *src = buf;
    *len = got;
    return ZI_OK;
}

int zi_chat_template_from_arg(const char *arg, zi_chat_template **out, zi_error *err) {
    *out = NULL;
    char *src;
    size_t len;
    int rc = zi_chat_template_load(arg, &src, &len, err);
    if (rc) return rc;
    rc = zi_chat_template_compile(src, len, out, err);
    free(src);
    if (rc) {
        if (zi_chat_template_builtin(arg))
            zi_error_prefix(err, "--chat-template %s (built-in)", arg);
        else
            zi_error_prefix(err, "--chat-template %s", arg);
    }
    return rc;
}
