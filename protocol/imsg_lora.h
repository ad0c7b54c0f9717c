/*
 * imsg_lora.h - the messages that load and unload LoRA adapters on a
 * running worker (docs/lora.md, docs/protocol.md), one struct, encoder and
 * decoder each, as protocol/imsg.h does for the others:
 *
 *   router -> worker  lora       load (name, path, scale) or unload (name)
 *   worker -> router  lora_done  the outcome, and the worker's adapters
 *
 * The worker names its adapters (by place, its ids) in these replies and
 * in its register message ("loras"), so the router knows them.
 * Decoders read without copying (strings point into the parsed message).
 */
#ifndef ZI_IMSG_LORA_H
#define ZI_IMSG_LORA_H

#include "imsg.h"

/* lora: rid (0: nobody waits for the answer), load or unload, the
 * adapter's name; a load's file (a path on the worker's host) and default
 * scale. */
typedef struct zi_im_lora {
    int64_t rid;
    bool load;
    zi_im_str name, path;
    double scale;
} zi_im_lora;
int zi_im_lora_pack(const zi_im_lora *m, zi_msg *out);
/* ZI_EINVAL naming the key: action not "load" or "unload", name missing
 * or empty, a load's path missing or empty, scale not a number. */
int zi_im_lora_unpack(const msgpack_object *o, zi_im_lora *m, zi_error *err);

/* lora_done: rid; ok, else code and message (the error); id, the place a
 * load took (-1: none); names, the worker's adapters after the op by
 * place ("" for a free one). */
typedef struct zi_im_lora_done {
    int64_t rid;
    bool ok;
    zi_im_str code, message;
    int64_t id;
    const char *const *names;    /* pack */
    size_t n_names;              /* pack */
    const msgpack_object *loras; /* unpack: the names' array, or NULL */
} zi_im_lora_done;
int zi_im_lora_done_pack(const zi_im_lora_done *m, zi_msg *out);
/* Never fails: rid 0 when not an int64, ok false when absent, code and
 * message absent (p NULL) when not strings, id -1 when absent. */
void zi_im_lora_done_unpack(const msgpack_object *o, zi_im_lora_done *m);

/* Packs names[0..n) as a msgpack array of strings under key (NULL names
 * as ""): the "loras" of register and lora_done. */
void zi_im_lora_names_put(zi_imap *b, const char *key, const char *const *names, size_t n);

#endif
