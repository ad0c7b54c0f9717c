/*
 * fuzz_chat_template.c - libFuzzer entry point for the chat-template engine
 * (chat_template/chat_template.h).
 *
 * The input is a template source. It is compiled and, when it compiles,
 * rendered twice with small limits: with plain {role, content} messages
 * and with a tool-call conversation given as a value tree (tools, an
 * assistant's tool_calls, a tool result, enable_thinking). The checks are
 * the promises chat_template.h makes: a failure leaves no output and a
 * non-empty one-line message (a compile error located "chat template line
 * L col C: ..."), with one of the documented codes; a success gives a
 * NUL-terminated string of the stated length within max_output. A broken
 * promise calls __builtin_trap(), which libFuzzer (and
 * fuzz_chat_template_replay.c, which links this same file) reports as a
 * crash. Time and memory are bounded by the render limits, so a hang or
 * an out-of-memory report is a bug too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

#define S(lit)                                                                                     \
    {                                                                                              \
        ZI_CHAT_STR, {                                                                             \
            .s = { lit, sizeof(lit) - 1 }                                                          \
        }                                                                                          \
    }

static const zi_chat_pair args[] = {{"city", 4, S("Oslo")}};
static const zi_chat_pair fn[] = {{"name", 4, S("get_weather")},
                                  {"arguments", 9, {ZI_CHAT_DICT, {.dict = {args, 1}}}}};
static const zi_chat_pair call[] = {{"id", 2, S("c1")},
                                    {"type", 4, S("function")},
                                    {"function", 8, {ZI_CHAT_DICT, {.dict = {fn, 2}}}}};
static const zi_chat_value calls[] = {{ZI_CHAT_DICT, {.dict = {call, 3}}}};
static const zi_chat_pair m0[] = {{"role", 4, S("system")}, {"content", 7, S("Be brief.")}};
static const zi_chat_pair m1[] = {{"role", 4, S("user")}, {"content", 7, S("Weather {{ x }}?")}};
static const zi_chat_pair m2[] = {{"role", 4, S("assistant")},
                                  {"content", 7, {ZI_CHAT_NONE, {.b = 0}}},
                                  {"tool_calls", 10, {ZI_CHAT_LIST, {.list = {calls, 1}}}}};
static const zi_chat_pair m3[] = {
    {"role", 4, S("tool")}, {"tool_call_id", 12, S("c1")}, {"content", 7, S("{\"t\": 3}")}};
static const zi_chat_value msgs[] = {{ZI_CHAT_DICT, {.dict = {m0, 2}}},
                                     {ZI_CHAT_DICT, {.dict = {m1, 2}}},
                                     {ZI_CHAT_DICT, {.dict = {m2, 3}}},
                                     {ZI_CHAT_DICT, {.dict = {m3, 3}}}};
static const zi_chat_value messages = {ZI_CHAT_LIST, {.list = {msgs, 4}}};
static const zi_chat_pair tfn[] = {{"name", 4, S("get_weather")},
                                   {"description", 11, S("Weather.")}};
static const zi_chat_pair tool[] = {{"type", 4, S("function")},
                                    {"function", 8, {ZI_CHAT_DICT, {.dict = {tfn, 2}}}}};
static const zi_chat_value tools[] = {{ZI_CHAT_DICT, {.dict = {tool, 2}}}};
static const zi_chat_var vars[] = {{"tools", 5, {ZI_CHAT_LIST, {.list = {tools, 1}}}},
                                   {"enable_thinking", 15, {ZI_CHAT_BOOL, {.b = 0}}}};

static void render(const zi_chat_template *t, const zi_chat_message *m, size_t n,
                   const zi_chat_render_opts *o) {
    char *out = (char *)1;
    size_t len = 12345;
    zi_error err = {0};
    int rc = zi_chat_template_render(t, m, n, o, &out, &len, &err);
    if (rc == ZI_OK) {
        CHECK(out != NULL);
        CHECK(strlen(out) <= len && out[len] == '\0');
        CHECK(len <= o->max_output);
        free(out);
    } else {
        CHECK(out == NULL);
        CHECK(rc == ZI_EINVAL || rc == ZI_EUNSUPPORTED || rc == ZI_ERANGE || rc == ZI_ENOMEM ||
              rc == ZI_EFORMAT);
        /* (raise_exception's message is the template's text, as it is:
         * it may be empty or hold newlines) */
        if (rc != ZI_EINVAL) CHECK(err.msg[0] != '\0' && !strchr(err.msg, '\n'));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_chat_template *t = (zi_chat_template *)1;
    zi_error err = {0};
    int rc = zi_chat_template_compile((const char *)data, size, &t, &err);
    if (rc != ZI_OK) {
        CHECK(t == NULL);
        CHECK(rc == ZI_EFORMAT || rc == ZI_EUNSUPPORTED || rc == ZI_EINVAL || rc == ZI_ENOMEM ||
              rc == ZI_ERANGE);
        CHECK(err.msg[0] != '\0' && !strchr(err.msg, '\n'));
        /* a syntax or unsupported-construct error says where it is */
        if (rc == ZI_EFORMAT || rc == ZI_EUNSUPPORTED)
            CHECK(strncmp(err.msg, "chat template line ", 19) == 0);
        return 0;
    }
    zi_chat_render_opts o = {0};
    o.add_generation_prompt = 1;
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    o.max_output = 1 << 16;
    o.max_memory = 8 << 20;
    o.max_iterations = 20000;
    o.max_steps = 200000;
    o.now = 86400;
    zi_chat_message plain[2] = {{"user", "Hi", 0, 0}, {"assistant", "Hello", 0, 0}};
    render(t, plain, 2, &o);
    o.messages = &messages;
    o.vars = vars;
    o.n_vars = 2;
    render(t, NULL, 0, &o);
    zi_chat_template_free(t);
    return 0;
}
