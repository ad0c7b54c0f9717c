/*
 * chat_template_cmd.h - `zinfer chat-template`: renders a Jinja chat
 * template file (or a model's tokenizer.chat_template) with messages,
 * tools and variables given as JSON, with the engine the tokenizer process
 * uses (chat_template/chat_template.h). For people checking a template
 * and for the tests that compare the engine with jinja2
 * (tests/e2e/test_template_corpus.py). `zinfer chat-template --help`
 * documents the request and the output.
 */
#ifndef ZI_CHAT_TEMPLATE_CMD_H
#define ZI_CHAT_TEMPLATE_CMD_H

/* argv[0] is "chat-template". Exit status: 0 rendered (every request, in
 * --jsonl mode: each line says how it went), 1 a render failed or a file
 * cannot be read, 2 bad usage, 3 the template was refused at load (one
 * line on stderr: "zinfer: chat-template: FILE: chat template line L col
 * C: ..."). */
int zi_chat_template_main(int argc, char **argv);

#endif
