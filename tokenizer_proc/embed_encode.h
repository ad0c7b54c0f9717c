/*
 * embed_encode.h - the tokenizer process's half of the `embed` op
 * (docs/protocol.md): the client's `input` (a string, a list of strings,
 * token ids, or a list of token-id lists) into one token-id list per
 * input, with the request's limits applied.
 */
#ifndef ZI_EMBED_ENCODE_H
#define ZI_EMBED_ENCODE_H

#include <stdint.h>

#include "embeddings.h"
#include "imsg_embed.h"
#include "tokenizer.h"

/*
 * Encodes m->input into out (zeroed first): a string is encoded as a
 * generate prompt is (BOS as the model says, special-token text parsed);
 * token ids must lie in 0..vocab-1. An input of more than m->max_length
 * tokens is cut to its first max_length when m->truncate (counted in
 * *n_truncated), else refused; more than m->max_tokens tokens in all is
 * refused. Errors (ZI_EINVAL) name the field: "input", "input[i]". tok
 * may be NULL (a vocabulary zinfer cannot tokenize): a string input is then
 * ZI_EUNSUPPORTED, token ids are served.
 *
 * With m->query (a reranker's request), each input is a document string
 * paired with the query as llama.cpp's format_prompt_rerank pairs them:
 * with the model's rerank template (rerank_tmpl, the file's
 * `tokenizer.chat_template.rerank`; NULL when it has none) its "{query}"
 * and "{document}" replaced in one pass (llama.cpp replaces them one after
 * the other, so a query spelling "{document}" would get the document too:
 * not here, which bounds the text), encoded without BOS and with
 * special-token text parsed; without one, [BOS] query [EOS] [SEP] document [EOS]
 * (zi_tokenizer_pair_markers), query and document encoded as plain text.
 */
int zi_embed_encode(zi_tokenizer *tok, int32_t vocab, const zi_im_embed_encode *m,
                    const char *rerank_tmpl, zi_embeddings_request *out, int64_t *n_truncated,
                    zi_error *err);

#endif
