/*
 * info.h - `zinfer info`: what a GGUF file holds (architecture, parameter
 * count, tensor types, tokenizer, chat template, context length) and the
 * memory a worker would need to serve it, read from the file's header
 * without loading the weights. `zinfer info --help` documents the output
 * and its JSON keys.
 */
#ifndef ZI_INFO_H
#define ZI_INFO_H

/* argv[0] is "info"; returns the exit status: 0 when the file was
 * described (one zinfer cannot run included: the output says why), 1 when
 * it cannot be read (one line on stderr naming it), 2 on bad usage. */
int zi_info_main(int argc, char **argv);

#endif
