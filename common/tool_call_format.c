/*
 * tool_call_format.c - the tool-call formats' names and their detection
 * from a chat template's source (tool_call_format.h). The substrings are
 * those of the families' chat templates (llama.cpp's vendored copies) and
 * of llama.cpp's common chat code.
 */
#include "tool_call_format.h"

#include <string.h>

static const char *const NAMES[ZI_TF_COUNT] = {
    "auto",        "generic", "hermes",      "mistral",       "llama3",
    "qwen3-coder", "gpt-oss", "deepseek-v3", "deepseek-v3.2", "glm-4.5",
    "kimi-k2",     "granite", "command-r",   "functionary",   "functionary-v3.1",
};

const char *zi_tool_format_name(zi_tool_format f) {
    return (unsigned)f < ZI_TF_COUNT ? NAMES[f] : NULL;
}

zi_tool_format zi_tool_format_parser(zi_tool_format f) {
    return f == ZI_TF_HERMES || f == ZI_TF_MISTRAL || f == ZI_TF_LLAMA3 || f == ZI_TF_AUTO
               ? ZI_TF_GENERIC
               : f;
}

static int has(const char *src, size_t len, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= len; i++)
        if (src[i] == needle[0] && !memcmp(src + i, needle, m)) return 1;
    return 0;
}

zi_tool_format zi_tool_format_detect(const char *s, size_t n) {
    /* Most specific first: several families write `<tool_call>`. DeepSeek
     * V3.2 and V4 build their markers from a variable (dsml_token), so
     * the token and the block's name are looked for apart. */
    if (has(s, n, "｜DSML｜") && (has(s, n, "function_calls") || has(s, n, "tool_calls")))
        return ZI_TF_DEEPSEEK_V32;
    if (has(s, n, "<|channel|>")) return ZI_TF_GPT_OSS;
    if (has(s, n, ">>>all")) return ZI_TF_FUNCTIONARY;
    if (has(s, n, "<|tool_calls_section_begin|>") && has(s, n, "<|tool_call_begin|>"))
        return ZI_TF_KIMI_K2;
    if (has(s, n, "<tool_call>") && has(s, n, "<arg_key>") && has(s, n, "<arg_value>"))
        return ZI_TF_GLM_45;
    if (has(s, n, "<|START_ACTION|>") || (has(s, n, "Action:") && has(s, n, "tool_name")))
        return ZI_TF_COMMAND_R;
    if (has(s, n, "<tool_call>") && has(s, n, "<function=") && has(s, n, "<parameter="))
        return ZI_TF_QWEN3_CODER;
    if (has(s, n, "<｜tool▁calls▁begin｜>") && has(s, n, "<｜tool▁sep｜>"))
        return ZI_TF_DEEPSEEK_V3;
    if (has(s, n, "<|tool_call|>")) return ZI_TF_GRANITE;
    if (has(s, n, "<function=") && has(s, n, "<|start_header_id|>")) return ZI_TF_FUNCTIONARY_V31;
    return ZI_TF_GENERIC;
}
