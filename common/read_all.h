/*
 * read_all.h - reading the whole of a stream (a file, a pipe, stdin) into
 * memory, up to a limit: the one loop behind the command line's speaker,
 * image and code files and the tokenizer's voice files.
 *
 * It returns a bare status rather than a message because each caller names
 * its input its own way ("voice 'x'", "--tts-speaker FILE", an image path):
 * the caller turns ZI_ERANGE / ZI_EIO / ZI_ENOMEM into its own words.
 */
#ifndef ZI_READ_ALL_H
#define ZI_READ_ALL_H

#include <stddef.h>
#include <stdio.h>

/* Reads f to its end into a malloc'd buffer *buf of *len bytes followed by
 * a NUL (not counted), so text may be parsed in place. Returns ZI_OK;
 * ZI_ERANGE when the stream holds more than max bytes; ZI_EIO on a read
 * error; ZI_ENOMEM when memory is short. On failure *buf is NULL and *len
 * 0. f stays open (the caller closes it). */
int zi_read_all(FILE *f, size_t max, char **buf, size_t *len);

#endif
