/*
 * tool_call_format.h - the tool-call formats of chat-model families: their
 * names (the choices of --tool-call-format, in options.c), and which one a
 * chat template's source asks for, found by the substrings llama.cpp's
 * chat code looks for (docs/http.md, "Tool-call formats"). zinfer serve
 * detects the format; zinfer-http parses it (http/tool_formats.h).
 */
#ifndef ZI_TOOL_CALL_FORMAT_H
#define ZI_TOOL_CALL_FORMAT_H

#include <stddef.h>

/* In the order of --tool-call-format's choices (common/options.c spells
 * them; tests/unit/test_tool_formats.c checks the two agree). */
typedef enum zi_tool_format {
    ZI_TF_AUTO,        /* from the chat template (zi_tool_format_detect) */
    ZI_TF_GENERIC,     /* Hermes/Qwen <tool_call>{json}, Mistral, Llama 3, bare JSON */
    ZI_TF_HERMES,      /* = generic */
    ZI_TF_MISTRAL,     /* = generic */
    ZI_TF_LLAMA3,      /* = generic */
    ZI_TF_QWEN3_CODER, /* <tool_call><function=N><parameter=K>V</parameter>... */
    ZI_TF_GPT_OSS,     /* harmony: <|channel|>commentary to=functions.N ...<|message|>{} */
    ZI_TF_DEEPSEEK_V3, /* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{}...; R1 too */
    ZI_TF_DEEPSEEK_V32, /* DSML: <｜DSML｜function_calls><｜DSML｜invoke name="N">...; V4 too */
    ZI_TF_GLM_45,       /* <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>... */
    ZI_TF_KIMI_K2,      /* <|tool_calls_section_begin|><|tool_call_begin|>functions.N:0... */
    ZI_TF_GRANITE,      /* <|tool_call|>[{"name", "arguments"}] */
    ZI_TF_COMMAND_R,    /* <|START_ACTION|>[{"tool_name", "parameters"}]<|END_ACTION|> */
    ZI_TF_FUNCTIONARY,  /* v3.2: >>>N\n{} (or N\n{} at the start); >>>all\n text */
    ZI_TF_FUNCTIONARY_V31, /* <function=N>{}</function> */
    ZI_TF_COUNT
} zi_tool_format;

/* The format's --tool-call-format name ("qwen3-coder"); NULL out of range. */
const char *zi_tool_format_name(zi_tool_format f);

/* The format a chat template's source asks for (never AUTO): the family
 * whose markers it writes, GENERIC when none. */
zi_tool_format zi_tool_format_detect(const char *src, size_t len);

/* The formats that parse alike (hermes, mistral, llama3: generic). */
zi_tool_format zi_tool_format_parser(zi_tool_format f);

#endif
