/*
 * test_tool_formats.c - cmocka tests of the families' tool-call formats
 * (http/tool_formats.c through the driver http/tool_stream.c): outputs
 * written as each family's chat template writes a call (one call, two,
 * text before, nested objects, escapes, non-ASCII text) parsed whole give
 * the expected calls and content, and fed split at every byte, in three
 * pieces and byte by byte give the same events joined; the vendored
 * templates select their family's format; --tool-call-format's choices
 * are the formats' names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "options.h"
#include "tool_stream.h"
#include "tool_transcript.h"
#include "vendor_dir.h"

/* The tools, in the router's shape: city and query typed string. */
static json_t *tools(void) {
    return json_loads(
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
        "{\"type\": \"integer\"}}}}},"
        " {\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"}, \"filters\": "
        "{\"type\": \"object\"}}}}}]",
        0, NULL);
}

typedef struct fcase {
    zi_tool_format f;
    const char *text, *content; /* content: NULL when none */
    int n;
    const char *name[2], *args[2]; /* args: the JSON expected (compared as JSON) */
} fcase;

static const fcase CASES[] = {
    /* Qwen3-Coder: XML parameters, typed by the tools' schemas */
    {ZI_TF_QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     NULL,
     1,
     {"get_weather"},
     {"{\"city\": \"Paris\", \"days\": 3}"}},
    {ZI_TF_QWEN3_CODER,
     "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nS\xc3\xa3o \"Paulo\"\n"
     "a\\b\tc\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n"
     "<parameter=query>\nx </p> y\n\n</parameter>\n<parameter=filters>\n{\"a\": [1, {\"b\": "
     "null}], \"c\": \"\xe6\x9d\xb1\"}\n</parameter>\n</function>\n</tool_call>",
     "Let me look.",
     2,
     {"get_weather", "search"},
     {"{\"city\": \"S\xc3\xa3o \\\"Paulo\\\"\\na\\\\b\\tc\"}",
      "{\"query\": \"x </p> y\\n\", \"filters\": {\"a\": [1, {\"b\": null}], \"c\": "
      "\"\xe6\x9d\xb1\"}}"}},
    /* a parameter the schema does not type string: JSON when it is, else text */
    {ZI_TF_QWEN3_CODER,
     "<tool_call>\n<function=search>\n<parameter=limit>\nTrue\n</parameter>\n<parameter=x>\n"
     "not json\n</parameter>\n</function>\n</tool_call>",
     NULL,
     1,
     {"search"},
     {"{\"limit\": true, \"x\": \"not json\"}"}},
    /* Qwen3 / Hermes 2 Pro: JSON in <tool_call> (the generic parser) */
    {ZI_TF_HERMES,
     "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"caf\xc3\xa9 \\\"x\\\"\"}}\n"
     "</tool_call>",
     NULL,
     1,
     {"search"},
     {"{\"query\": \"caf\xc3\xa9 \\\"x\\\"\"}"}},
    /* GLM-4.5/4.6 */
    {ZI_TF_GLM_45,
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
     NULL,
     1,
     {"get_weather"},
     {"{\"city\": \"Paris\", \"days\": 3}"}},
    {ZI_TF_GLM_45,
     "Checking both.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>\xe6\x9d\xb1"
     "\xe4\xba\xac \"x\"\n</arg_value>\n</tool_call>\n<tool_call>search\n<arg_key>filters</arg_key>"
     "\n<arg_value>{\"k\": {\"n\": [1, 2]}}</arg_value>\n</tool_call>",
     "Checking both.",
     2,
     {"get_weather", "search"},
     {"{\"city\": \"\xe6\x9d\xb1\xe4\xba\xac \\\"x\\\"\\n\"}",
      "{\"filters\": {\"k\": {\"n\": [1, 2]}}}"}},
    /* gpt-oss: harmony headers; analysis text passes as content here */
    {ZI_TF_GPT_OSS,
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
     "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"
     "<|call|>",
     "Need the weather.",
     1,
     {"get_weather"},
     {"{\"city\": \"Paris\"}"}},
    {ZI_TF_GPT_OSS,
     "<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{\"query\": "
     "\"a\\\"b\", \"filters\": {\"x\": [1, {\"y\": "
     "\"\xc3\xa9\"}]}}<|call|><|start|>assistant<|channel|>"
     "commentary to=functions.get_weather<|message|>{\"city\": \"Oslo\"}<|call|>",
     NULL,
     2,
     {"search", "get_weather"},
     {"{\"query\": \"a\\\"b\", \"filters\": {\"x\": [1, {\"y\": \"\xc3\xa9\"}]}}",
      "{\"city\": \"Oslo\"}"}},
    /* DeepSeek V3.1 */
    {ZI_TF_DEEPSEEK_V3,
     "I will check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
     "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\": "
     "\"\\u00e9\\n\", \"filters\": {\"a\": {}}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "I will check.",
     2,
     {"get_weather", "search"},
     {"{\"city\": \"Paris\"}", "{\"query\": \"\\u00e9\\n\", \"filters\": {\"a\": {}}}"}},
    /* DeepSeek R1: the type, then the name and fenced JSON */
    {ZI_TF_DEEPSEEK_V3,
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
     "{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
     "<｜tool▁sep｜>search\n```json\n{\"query\": "
     "\"```\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     NULL,
     2,
     {"get_weather", "search"},
     {"{\"city\": \"Paris\", \"days\": 2}", "{\"query\": \"```\"}"}},
    /* DeepSeek V3.2 DSML: string="true" values as written, "false" JSON */
    {ZI_TF_DEEPSEEK_V32,
     "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
     "name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" "
     "string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
     NULL,
     1,
     {"get_weather"},
     {"{\"city\": \"Paris\", \"days\": 3}"}},
    {ZI_TF_DEEPSEEK_V32,
     "I will check both.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">S\xc3\xa3o \"Paulo\"\na\\b\tc \xe6\x9d\xb1 "
     "</p> <｜DSML｜x</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"search\">\n"
     "<｜DSML｜parameter name=\"query\" string=\"true\">  spaced\n</｜DSML｜parameter>\n"
     "<｜DSML｜parameter name=\"filters\" string=\"false\">{\"a\": [1, {\"b\": null}], \"c\": "
     "\"\xe6\x9d\xb1\", \"d\": {\"e\": {\"f\": \"\\u00e9\\n\"}}}</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
     "I will check both.",
     2,
     {"get_weather", "search"},
     {"{\"city\": \"S\xc3\xa3o \\\"Paulo\\\"\\na\\\\b\\tc \xe6\x9d\xb1 </p> <｜DSML｜x\"}",
      "{\"query\": \"  spaced\\n\", \"filters\": {\"a\": [1, {\"b\": null}], \"c\": "
      "\"\xe6\x9d\xb1\", \"d\": {\"e\": {\"f\": \"\\u00e9\\n\"}}}}"}},
    /* V4's block; "false" with Python's True or not JSON; no attribute:
     * the schema's type */
    {ZI_TF_DEEPSEEK_V32,
     "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"limit\" "
     "string=\"false\">True</｜DSML｜parameter>\n<｜DSML｜parameter name=\"x\" string=\"false\">"
     "not json</｜DSML｜parameter>\n<｜DSML｜parameter name=\"query\">[1]</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"days\">"
     " 4 </｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
     NULL,
     2,
     {"search", "get_weather"},
     {"{\"limit\": true, \"x\": \"not json\", \"query\": \"[1]\"}", "{\"days\": 4}"}},
    /* text after the block is content; a call with no parameters */
    {ZI_TF_DEEPSEEK_V32,
     "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls> Done.",
     " Done.",
     1,
     {"search"},
     {"{}"}},
    /* Kimi K2 */
    {ZI_TF_KIMI_K2,
     "<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.get_weather:0"
     "<|tool_call_argument_begin|>{\"city\": \"\xe6\x9d\xb1\xe4\xba\xac\"}<|tool_call_end|>\n"
     "<|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{\"query\": \"q\", "
     "\"filters\": {\"n\": [[1], {\"m\": true}]}}<|tool_call_end|>\n<|tool_calls_section_end|>",
     NULL,
     2,
     {"get_weather", "search"},
     {"{\"city\": \"\xe6\x9d\xb1\xe4\xba\xac\"}",
      "{\"query\": \"q\", \"filters\": {\"n\": [[1], {\"m\": true}]}}"}},
    /* Granite 3.x */
    {ZI_TF_GRANITE,
     "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
     "{\"name\": \"search\", \"arguments\": {\"query\": \"a\\\\b\"}}]",
     NULL,
     2,
     {"get_weather", "search"},
     {"{\"city\": \"Paris\"}", "{\"query\": \"a\\\\b\"}"}},
    /* Command-R7B and Command-R+ */
    {ZI_TF_COMMAND_R,
     "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
     "\"parameters\": {\"city\": \"Paris\"}}\n]<|END_ACTION|>",
     NULL,
     1,
     {"get_weather"},
     {"{\"city\": \"Paris\"}"}},
    {ZI_TF_COMMAND_R,
     "Plan: search.\nAction:\n```json\n[\n    {\n        \"tool_name\": \"search\",\n        "
     "\"parameters\": {\"query\": \"\xc3\xbc\", \"filters\": {\"d\": [1]}}\n    }\n]\n```",
     "Plan: search.",
     1,
     {"search"},
     {"{\"query\": \"\xc3\xbc\", \"filters\": {\"d\": [1]}}"}},
    /* Command R7B's answer markers are dropped */
    {ZI_TF_COMMAND_R,
     "<|START_RESPONSE|>Sunny, \xc3\xa9t\xc3\xa9.<|END_RESPONSE|>",
     "Sunny, \xc3\xa9t\xc3\xa9.",
     0,
     {NULL},
     {NULL}},
    /* Functionary v3.2 (the prompt ends in ">>>") */
    {ZI_TF_FUNCTIONARY,
     "get_weather\n{\"city\": \"Paris\"}>>>search\n{\"query\": \"x\", \"filters\": {\"y\": "
     "{\"z\": \"\xc3\xa9\"}}}",
     NULL,
     2,
     {"get_weather", "search"},
     {"{\"city\": \"Paris\"}", "{\"query\": \"x\", \"filters\": {\"y\": {\"z\": \"\xc3\xa9\"}}}"}},
    {ZI_TF_FUNCTIONARY,
     "all\nSure, one moment.>>>get_weather\n{\"city\": \"Paris\"}",
     "Sure, one moment.",
     1,
     {"get_weather"},
     {"{\"city\": \"Paris\"}"}},
    /* Functionary v3.1 */
    {ZI_TF_FUNCTIONARY_V31,
     "Looking.<function=get_weather>{\"city\": \"Paris\"}</function><function=search>"
     "{\"query\": \"\\\"q\\\"\"}</function>",
     "Looking.",
     2,
     {"get_weather", "search"},
     {"{\"city\": \"Paris\"}", "{\"query\": \"\\\"q\\\"\"}"}},
    /* not calls: an unknown tool, text without markers */
    {ZI_TF_QWEN3_CODER,
     "<tool_call>\n<function=other>\n</function>\n</tool_call>",
     "<tool_call>\n<function=other>\n</function>\n</tool_call>",
     0,
     {NULL},
     {NULL}},
    {ZI_TF_DEEPSEEK_V3, "Just text, \xc3\xa9.", "Just text, \xc3\xa9.", 0, {NULL}, {NULL}},
    {ZI_TF_DEEPSEEK_V32,
     "Say <｜DSML｜function_calls>\n<｜DSML｜invoke name=\"other\">\n</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     "Say <｜DSML｜function_calls>\n<｜DSML｜invoke name=\"other\">\n</｜DSML｜invoke>\n"
     "</｜DSML｜function_calls>",
     0,
     {NULL},
     {NULL}},
    {ZI_TF_DEEPSEEK_V32,
     "<｜DSML｜ is a marker, \xc3\xa9.",
     "<｜DSML｜ is a marker, \xc3\xa9.",
     0,
     {NULL},
     {NULL}},
    {ZI_TF_FUNCTIONARY, "all\nNo tools needed.", "No tools needed.", 0, {NULL}, {NULL}},
};

/* Each family's template's own rendering (jinja2's, in
 * tests/fixtures/chat_template_corpus.json.gz) of the assistant's calls of
 * family_two_calls (tests/fixtures/chat_template_conversations.json):
 * get_weather {location, unit}, then search {query, filters}. */
static const struct {
    zi_tool_format f;
    const char *file, *text;
    int n;
} RENDERED[] = {
    {ZI_TF_QWEN3_CODER, "Qwen3-Coder.jinja",
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nS\xc3\xa3o "
     "Paulo\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</"
     "tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\na \"quoted\" \\ "
     "path\n</parameter>\n<parameter=filters>\n{\"year\": 2024, \"limit\": "
     "3}\n</parameter>\n</function>\n</tool_call>",
     2},
    {ZI_TF_HERMES, "Qwen-Qwen3-0.6B.jinja",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"S\xc3\xa3o Paulo\", "
     "\"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
     "{\"query\": \"a \\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": 2024, \"limit\": "
     "3}}}\n</tool_call>",
     2},
    {ZI_TF_HERMES, "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"S\xc3\xa3o Paulo\", "
     "\"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
     "{\"query\": \"a \\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": 2024, \"limit\": "
     "3}}}\n</tool_call>",
     2},
    {ZI_TF_GPT_OSS, "openai-gpt-oss-120b.jinja",
     "<|start|>assistant to=functions.get_weather<|channel|>commentary "
     "json<|message|>{\"location\": \"S\xc3\xa3o Paulo\", \"unit\": \"celsius\"}<|call|>",
     1},
    {ZI_TF_DEEPSEEK_V3, "deepseek-ai-DeepSeek-V3.1.jinja",
     "<\xef\xbd\x9ctool\xe2\x96\x81"
     "calls\xe2\x96\x81"
     "begin\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "begin\xef\xbd\x9c>get_weather<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>{\"location\": "
     "\"S\xc3\xa3o Paulo\", \"unit\": \"celsius\"}<\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "end\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "begin\xef\xbd\x9c>search<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>{\"query\": \"a "
     "\\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": 2024, \"limit\": "
     "3}}<\xef\xbd\x9ctool\xe2\x96\x81"
     "call\xe2\x96\x81"
     "end\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81"
     "calls\xe2\x96\x81"
     "end\xef\xbd\x9c>",
     2},
    {ZI_TF_DEEPSEEK_V32, "deepseek-ai-DeepSeek-V3.2.jinja",
     "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
     "name=\"location\" string=\"true\">S\xc3\xa3o Paulo</｜DSML｜parameter>\n<｜DSML｜parameter "
     "name=\"unit\" "
     "string=\"true\">celsius</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke "
     "name=\"search\">\n<｜DSML｜parameter name=\"query\" string=\"true\">a \"quoted\" \\ "
     "path</｜DSML｜parameter>\n<｜DSML｜parameter name=\"filters\" string=\"false\">{\"year\": "
     "2024, \"limit\": 3}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
     2},
    {ZI_TF_DEEPSEEK_V32, "deepseek-ai-DeepSeek-V4.jinja",
     "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
     "name=\"location\" string=\"true\">S\xc3\xa3o Paulo</｜DSML｜parameter>\n<｜DSML｜parameter "
     "name=\"unit\" "
     "string=\"true\">celsius</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke "
     "name=\"search\">\n<｜DSML｜parameter name=\"query\" string=\"true\">a \"quoted\" \\ "
     "path</｜DSML｜parameter>\n<｜DSML｜parameter name=\"filters\" string=\"false\">{\"year\": "
     "2024, \"limit\": 3}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
     2},
    {ZI_TF_GLM_45, "GLM-4.6.jinja",
     "<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>S\xc3\xa3o "
     "Paulo</arg_value>\n<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</"
     "tool_call>\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a \"quoted\" \\ "
     "path</arg_value>\n<arg_key>filters</arg_key>\n<arg_value>{\"year\": 2024, \"limit\": "
     "3}</arg_value>\n</tool_call>",
     2},
    {ZI_TF_GLM_45, "GLM-4.7-Flash.jinja",
     "<tool_call>get_weather<arg_key>location</arg_key><arg_value>S\xc3\xa3o "
     "Paulo</arg_value><arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>"
     "<tool_call>search<arg_key>query</arg_key><arg_value>a \"quoted\" \\ path</arg_value>"
     "<arg_key>filters</arg_key><arg_value>{\"year\": 2024, \"limit\": 3}</arg_value></tool_call>",
     2},
    {ZI_TF_GENERIC, "ibm-granite-granite-4.0.jinja",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"S\xc3\xa3o Paulo\", "
     "\"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
     "{\"query\": \"a \\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": 2024, \"limit\": "
     "3}}}\n</tool_call>",
     2},
    {ZI_TF_KIMI_K2, "moonshotai-Kimi-K2.jinja",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_"
     "begin|>{\"location\": \"S\xc3\xa3o Paulo\", \"unit\": "
     "\"celsius\"}<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|"
     ">{\"query\": \"a \\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": 2024, \"limit\": "
     "3}}<|tool_call_end|><|tool_calls_section_end|>",
     2},
    {ZI_TF_COMMAND_R, "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
     "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
     "\"parameters\": {\"location\": \"S\xc3\xa3o Paulo\", \"unit\": \"celsius\"}},\n    "
     "{\"tool_call_id\": \"1\", \"tool_name\": \"search\", \"parameters\": {\"query\": \"a "
     "\\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": 2024, \"limit\": 3}}}\n]<|END_ACTION|>",
     2},
    {ZI_TF_COMMAND_R, "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
     "Action:\n```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": "
     "{\n            \"location\": \"S\xc3\xa3o Paulo\",\n            \"unit\": \"celsius\"\n      "
     "  }\n    },\n    {\n        \"tool_name\": \"search\",\n        \"parameters\": {\n          "
     "  \"query\": \"a \\\"quoted\\\" \\\\ path\",\n            \"filters\": {\n                "
     "\"year\": 2024,\n                \"limit\": 3\n            }\n        }\n    }\n]```",
     2},
    {ZI_TF_FUNCTIONARY, "meetkai-functionary-medium-v3.2.jinja",
     ">>>get_weather\n{\"location\": \"S\xc3\xa3o Paulo\", \"unit\": "
     "\"celsius\"}>>>search\n{\"query\": \"a \\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": "
     "2024, \"limit\": 3}}",
     2},
    {ZI_TF_FUNCTIONARY_V31, "meetkai-functionary-medium-v3.1.jinja",
     "<function=get_weather>{\"location\": \"S\xc3\xa3o Paulo\", \"unit\": "
     "\"celsius\"}</function><function=search>{\"query\": \"a \\\"quoted\\\" \\\\ path\", "
     "\"filters\": {\"year\": 2024, \"limit\": 3}}</function>",
     2},
};

static void args_equal(const char *got, const char *want) {
    json_t *a = json_loads(got, 0, NULL), *b = json_loads(want, 0, NULL);
    if (!a || !b || !json_equal(a, b)) fail_msg("arguments %s, expected %s", got, want);
    json_decref(a);
    json_decref(b);
}

static void test_formats(void **state) {
    (void)state;
    json_t *tl = tools(), *nm = json_pack("[s,s]", "get_weather", "search");
    assert_non_null(tl);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const fcase *c = &CASES[i];
        print_message("case %zu (%s)\n", i, zi_tool_format_name(c->f));
        setup su = {c->f, nm, tl};
        /* whole */
        json_t *calls = NULL;
        char *content = NULL;
        assert_int_equal(
            zi_tool_stream_parse_all(nm, c->f, tl, c->text, strlen(c->text), &calls, &content), 0);
        if (!c->n) { /* content: NULL when it is the text itself */
            assert_null(calls);
            if (strcmp(c->content, c->text))
                assert_string_equal(content, c->content);
            else
                assert_null(content);
        } else {
            assert_non_null(calls);
            assert_int_equal(json_array_size(calls), c->n);
            for (int k = 0; k < c->n; k++) {
                json_t *fn = json_object_get(json_array_get(calls, k), "function");
                assert_string_equal(json_string_value(json_object_get(fn, "name")), c->name[k]);
                args_equal(json_string_value(json_object_get(fn, "arguments")), c->args[k]);
            }
            if (c->content)
                assert_string_equal(content, c->content);
            else
                assert_null(content);
        }
        /* streamed, split everywhere: the same as whole */
        transcript *whole = malloc(sizeof *whole);
        all_splits(&su, c->text, whole);
        assert_int_equal(whole->n_calls, c->n);
        assert_int_equal(whole->ok, c->n > 0);
        for (int k = 0; k < c->n; k++) {
            assert_string_equal(whole->name[k], c->name[k]);
            assert_string_equal(
                whole->args[k],
                json_string_value(json_object_get(
                    json_object_get(json_array_get(calls, k), "function"), "arguments")));
        }
        assert_string_equal(whole->content, c->content ? c->content : "");
        free(whole);
        json_decref(calls);
        free(content);
    }
    json_decref(tl);
    json_decref(nm);
}

/* What the families' templates render for a call parses back to it. */
static void test_rendered(void **state) {
    (void)state;
    static const char *const name[2] = {"get_weather", "search"};
    static const char *const args[2] = {
        "{\"location\": \"S\u00e3o Paulo\", \"unit\": \"celsius\"}",
        "{\"query\": \"a \\\"quoted\\\" \\\\ path\", \"filters\": {\"year\": 2024, "
        "\"limit\": 3}}"};
    json_t *tl = tools(), *nm = json_pack("[s,s]", "get_weather", "search");
    for (size_t i = 0; i < sizeof RENDERED / sizeof RENDERED[0]; i++) {
        print_message("%s\n", RENDERED[i].file);
        json_t *calls = NULL;
        char *content = NULL;
        const char *text = RENDERED[i].text;
        assert_int_equal(
            zi_tool_stream_parse_all(nm, RENDERED[i].f, tl, text, strlen(text), &calls, &content),
            0);
        assert_non_null(calls);
        assert_null(content);
        assert_int_equal(json_array_size(calls), RENDERED[i].n);
        for (int k = 0; k < RENDERED[i].n; k++) {
            json_t *fn = json_object_get(json_array_get(calls, k), "function");
            assert_string_equal(json_string_value(json_object_get(fn, "name")), name[k]);
            args_equal(json_string_value(json_object_get(fn, "arguments")), args[k]);
        }
        setup su = {RENDERED[i].f, nm, tl};
        transcript *whole = malloc(sizeof *whole);
        all_splits(&su, text, whole);
        assert_int_equal(whole->n_calls, RENDERED[i].n);
        assert_true(whole->ok);
        free(whole);
        json_decref(calls);
    }
    json_decref(tl);
    json_decref(nm);
}

/* A call sent, then the text goes wrong: broken (Qwen3-Coder, DSML: a
 * parameter that never closes is truncated at the end). */
static void test_truncated(void **state) {
    (void)state;
    json_t *tl = tools(), *nm = json_pack("[s,s]", "get_weather", "search");
    setup su = {ZI_TF_QWEN3_CODER, nm, tl};
    transcript *t = malloc(sizeof *t);
    run(&su, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", NULL, 0, t);
    assert_int_equal(t->n_calls, 1);
    assert_string_equal(t->args[0], "{\"city\": \"Par");
    assert_false(t->ok);
    su.f = ZI_TF_KIMI_K2;
    run(&su,
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0"
        "<|tool_call_argument_begin|>{\"query\": \"a\"",
        NULL, 0, t);
    assert_int_equal(t->n_calls, 1);
    assert_false(t->ok);
    /* DSML: a string value cut short; an unknown tool's invoke after a
     * sent call (its text goes on as content) */
    su.f = ZI_TF_DEEPSEEK_V32;
    run(&su,
        "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter "
        "name=\"query\" string=\"true\">caf\xc3\xa9 </｜DSML｜par",
        NULL, 0, t);
    assert_int_equal(t->n_calls, 1);
    assert_string_equal(t->args[0], "{\"query\": \"caf\xc3\xa9 ");
    assert_false(t->ok);
    run(&su,
        "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"other\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        NULL, 0, t);
    assert_int_equal(t->n_calls, 1);
    assert_string_equal(t->args[0], "{}");
    assert_string_equal(
        t->content,
        "\n<｜DSML｜invoke name=\"other\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>");
    assert_false(t->ok);
    free(t);
    json_decref(tl);
    json_decref(nm);
}

/* Any text, in any format: the same events however it is split (and no
 * fault under the sanitizers). The cases cut short, with a byte changed
 * or doubled, at positions from a fixed-seed generator. */
static void test_mangled(void **state) {
    (void)state;
    json_t *tl = tools(), *nm = json_pack("[s,s]", "get_weather", "search");
    uint32_t seed = 12345;
    char buf[1024];
    transcript *whole = malloc(sizeof *whole);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        size_t n = strlen(CASES[i].text);
        assert_true(n + 1 < sizeof buf);
        for (int m = 0; m < 12; m++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % n;
            memcpy(buf, CASES[i].text, n + 1);
            /* UTF-8 kept valid (a completion's text is): whole characters
             * cut, ASCII bytes changed or doubled */
            while (at && ((unsigned char)buf[at] & 0xC0) == 0x80) at--;
            if ((unsigned char)buf[at] >= 0x80 || m % 3 == 0) {
                buf[at] = '\0'; /* cut short */
            } else if (m % 3 == 1) {
                buf[at] = "{}[]<>\"\\\n:,|x"[(seed >> 20) % 14]; /* changed */
            } else {
                memmove(buf + at + 1, buf + at, n - at + 1); /* doubled */
            }
            for (int f = ZI_TF_GENERIC; f < ZI_TF_COUNT; f += 4) {
                setup su = {f == ZI_TF_GENERIC ? CASES[i].f : (zi_tool_format)f, nm, tl};
                all_splits(&su, buf, whole);
            }
        }
    }
    free(whole);
    json_decref(tl);
    json_decref(nm);
}

static const struct {
    const char *file;
    zi_tool_format f;
} TEMPLATES[] = {
    {"Qwen3-Coder.jinja", ZI_TF_QWEN3_CODER},
    {"Qwen-Qwen3-0.6B.jinja", ZI_TF_GENERIC},
    {"openai-gpt-oss-120b.jinja", ZI_TF_GPT_OSS},
    {"deepseek-ai-DeepSeek-V3.1.jinja", ZI_TF_DEEPSEEK_V3},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ZI_TF_DEEPSEEK_V3},
    {"deepseek-ai-DeepSeek-V3.2.jinja", ZI_TF_DEEPSEEK_V32},
    {"deepseek-ai-DeepSeek-V4.jinja", ZI_TF_DEEPSEEK_V32},
    {"deepseek-ai-DeepSeek-V4-Flash-0731.jinja", ZI_TF_DEEPSEEK_V32},
    {"GLM-4.6.jinja", ZI_TF_GLM_45},
    {"GLM-4.7-Flash.jinja", ZI_TF_GLM_45},
    {"Kimi-K2-Instruct.jinja", ZI_TF_KIMI_K2},
    {"Kimi-K2-Thinking.jinja", ZI_TF_KIMI_K2},
    {"moonshotai-Kimi-K2.jinja", ZI_TF_KIMI_K2},
    {"ibm-granite-granite-3.3-2B-Instruct.jinja", ZI_TF_GRANITE},
    {"ibm-granite-granite-4.0.jinja", ZI_TF_GENERIC}, /* Hermes <tool_call>{json} */
    {"ibm-granite-granite-4.1.jinja", ZI_TF_GENERIC},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", ZI_TF_COMMAND_R},
    {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", ZI_TF_COMMAND_R},
    {"meetkai-functionary-medium-v3.2.jinja", ZI_TF_FUNCTIONARY},
    {"meetkai-functionary-medium-v3.1.jinja", ZI_TF_FUNCTIONARY_V31},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ZI_TF_GENERIC},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", ZI_TF_GENERIC},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ZI_TF_GENERIC},
};

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = NULL;
    size_t cap = 0, n = 0, r;
    do {
        if (n + 4096 > cap) b = realloc(b, cap = cap * 2 + 8192);
        r = fread(b + n, 1, cap - n, f);
        n += r;
    } while (r);
    fclose(f);
    *len = n;
    return b;
}

static void test_detect(void **state) {
    (void)state;
    char dir[4096];
    zi_test_vendor_dir(dir, sizeof dir, "templates");
    int found = 0;
    for (size_t i = 0; i < sizeof TEMPLATES / sizeof TEMPLATES[0]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, TEMPLATES[i].file);
        size_t len;
        char *src = slurp(path, &len);
        if (!src) continue;
        found++;
        zi_tool_format f = zi_tool_format_detect(src, len);
        if (f != TEMPLATES[i].f)
            fail_msg("%s: %s, expected %s", TEMPLATES[i].file, zi_tool_format_name(f),
                     zi_tool_format_name(TEMPLATES[i].f));
        free(src);
    }
    if (!found) skip();
    assert_int_equal(found, sizeof TEMPLATES / sizeof TEMPLATES[0]);
    assert_int_equal(zi_tool_format_detect("", 0), ZI_TF_GENERIC);
}

/* --tool-call-format's choices are the formats' names, in enum order. */
static void test_option_choices(void **state) {
    (void)state;
    char joined[512] = "";
    for (int f = 0; f < ZI_TF_COUNT; f++) {
        if (f) strcat(joined, "|");
        strcat(joined, zi_tool_format_name((zi_tool_format)f));
    }
    assert_string_equal(zi_option_get(ZI_O_TOOL_CALL_FORMAT)->choices, joined);
    assert_null(zi_tool_format_name(ZI_TF_COUNT));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),   cmocka_unit_test(test_rendered),
        cmocka_unit_test(test_truncated), cmocka_unit_test(test_mangled),
        cmocka_unit_test(test_detect),    cmocka_unit_test(test_option_choices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
