/*
 * serve.c - `zinfer serve`: the supervisor of a one-machine server.
 *
 * It starts the router, then for each model it serves (--model, repeated,
 * and --models-dir) T tokenizer processes and N model workers (each
 * connecting to the router's backend address and registering with the
 * model's name, which the router routes requests by; with --models-max N
 * only N models' processes run at a time, see "models loaded on demand"
 * below), and the OpenAI HTTP
 * front end zinfer-http (a client of the router; --http), logs every start and
 * exit, restarts a child that dies (after a backoff that doubles from
 * 0.5 s to 8 s and resets once the child has stayed up for 30 s; a child
 * that fails 5 times in a row within 2 s of starting makes the whole server
 * stop with status 1, since it cannot start at all), and on
 * SIGINT/SIGTERM sends SIGTERM to every child, waits up to 5 s, then
 * SIGKILLs what is left. The children are separate binaries so each can
 * also be started by hand (e.g. a worker on another host).
 *
 * A child that cannot start with its configuration (a worker whose model
 * does not load or does not fit in memory) exits with ZI_EXIT_CONFIG and
 * hands its error over a pipe (common/startup.h): on its first start, or
 * while it has never run, that stops the server with status 1 and the
 * error as the last line, reported once, instead of a restart loop that
 * would repeat it. A child that dies after having run is restarted as
 * above (its requests resume on another worker), even when its restart
 * then fails that way: the other workers keep serving.
 *
 * zi_serve_main runs in phases, each a function below: parse_options,
 * validate_options, check_memory (the default budget's fit, from the
 * file's header), find_binaries, plan_children (every child's argv),
 * supervise (start, reap, restart) and stop_children (shutdown).
 */
#include "serve.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "args.h"
#include "backend_select.h"
#include "chat_template_source.h"
#include "cpu_backend.h"
#include "curve.h"
#include "duration.h"
#include "gguf.h"
#include "keypath.h"
#include "log.h"
#include "lora.h"
#include "mem_plan.h"
#include "options.h"
#include "startup.h"
#include "stop_signal.h"
#include "tool_call_format.h"
#include "codec.h"
#include "imsg.h"
#include "types.h"
#include "wire.h"

static const char USAGE_SERVE[] =
    "usage: zinfer serve [options]\n"
    "\n"
    "Starts the server: zinfer-router, tokenizer processes and model workers\n"
    "(binaries next to this one), restarts any that dies, stops them all on\n"
    "SIGINT/SIGTERM. Clients speak msgpack over ZeroMQ (docs/protocol.md), or\n"
    "the OpenAI HTTP API to zinfer-http (docs/http.md). Every option is checked\n"
    "here as the child it is for checks it (the ranges and defaults are\n"
    "common/options.c's), before anything starts.\n"
    "\n";

/* --help: the text above, then the options of the table (options.h):
 * serve's own, then those it passes on, by the child that takes them. */
static void print_usage(void) {
    fputs(USAGE_SERVE, stdout);
    zi_options_usage(stdout, ZI_OWN_SERVE, 28);
    static const struct {
        unsigned owner;
        const char *title;
    } groups[] = {
        {ZI_OWN_WORKER, "Passed to every worker (zinfer-worker --help):"},
        {ZI_OWN_ROUTER, "Passed to zinfer-router (zinfer-router --help):"},
        {ZI_OWN_HTTP, "Passed to zinfer-http, named there without http- (zinfer-http --help):"},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        printf("\n%s\n", groups[g].title);
        zi_options_usage(stdout, ZI_OWN_SERVE_PASS | groups[g].owner, 28);
    }
}

/* The most pass-through arguments for one child: every option of the
 * table with its value (pass_on keeps each option once). */
#define MAX_PASS (2 * ZI_O_COUNT)
/* the worker's fixed args, --model-name, its key options, its options, its
 * --lora pairs, NULL */
#define MAX_ARGS (15 + 2 + 4 + MAX_PASS + 2 * ZI_LORA_MAX_ADAPTERS + 1)
/* the router's: 7 fixed, --served-models, its options, 7 for keys and
 * --insecure, --load-on-demand and --models-at-start N, NULL */
_Static_assert(7 + 2 + MAX_PASS + 7 + 3 + 1 <= MAX_ARGS, "MAX_ARGS too small for the router");

/* The most models one server serves (the router's table holds as many). */
#define MAX_MODELS 64
/* A model name's longest (the router keeps 127 bytes; room for the rest). */
#define MODEL_NAME_MAX 120

typedef struct child {
    char name[MODEL_NAME_MAX + 48];
    char *argv[MAX_ARGS];
    pid_t pid; /* 0 when not running */
    int model; /* the index of its model, -1 for the router and zinfer-http */
    int parked; /* its model is not loaded (--models-max): not started, not restarted */
    int64_t started_ms, restart_at_ms, backoff_ms;
    int fast_failures; /* exits within FAST_FAIL_MS of starting, in a row */
    int startup_fd;    /* the read end of the running child's startup pipe, or -1 */
    int has_run;       /* a run of it ended other than by failing to start */
    int demand;        /* its model loads and unloads on demand (--models-max) */
    int broken;        /* its model could not start when loaded on demand: never loaded again */
    /* why it could not start, to tell the router (model_failed) while
     * fail_pending: the requests waiting for its model end at once */
    int fail_pending;
    char fail_msg[ZI_ERROR_MSG_MAX];
    int64_t parked_ms; /* when it was told to stop for an unload (SIGKILL 5 s later) */
} child;

/* A child that dies this soon after starting, this many times in a row,
 * cannot start at all (bad model file, address in use): give up instead of
 * restarting it forever. */
#define FAST_FAIL_MS 2000
#define FAST_FAIL_LIMIT 5

static void spawn(const zi_logger *lg, child *c) {
    /* The pipe a child that cannot start writes its error to; without one
     * (no descriptors left) it logs the error itself. */
    int fds[2] = {-1, -1};
    if (zi_startup_pipe(fds) != 0) fds[0] = fds[1] = -1;
    pid_t pid = fork();
    if (pid < 0) {
        zi_log(lg, ZI_LOG_ERROR, "%s: fork failed: %s", c->name, strerror(errno));
        if (fds[0] >= 0) close(fds[0]), close(fds[1]);
        c->restart_at_ms = zi_now_ms() + c->backoff_ms;
        return;
    }
    if (pid == 0) {
        /* A child never outlives its supervisor. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        zi_startup_pipe_child(fds[1]);
        execv(c->argv[0], c->argv);
        fprintf(stderr, "zinfer serve: cannot run %s: %s\n", c->argv[0], strerror(errno));
        _exit(127);
    }
    if (fds[1] >= 0) close(fds[1]);
    c->startup_fd = fds[0];
    c->pid = pid;
    c->started_ms = zi_now_ms();
    zi_log(lg, ZI_LOG_INFO, "started %s (pid %d)", c->name, (int)pid);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* "tcp://host:port" -> the same with port + 1 (the backend default). */
static int next_port_addr(const char *addr, char *out, size_t cap) {
    const char *colon = strrchr(addr, ':');
    if (!colon || strncmp(addr, "tcp://", 6) != 0) return -1;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port >= 65535) return -1;
    snprintf(out, cap, "%.*s:%ld", (int)(colon - addr), addr, port + 1);
    return 0;
}

/* Adds a pass-through option (and its value, unless NULL) to list, or
 * replaces the value of an earlier one: the last value counts, as when the
 * child parses its own command line. The lists have room for each option
 * once, so they never overflow. */
static int is_spec_flag(const char *s) {
    return !strcmp(s, "--spec-lookup") || !strcmp(s, "--no-spec-lookup");
}
static void pass_on(const char **list, int *n, const char *flag, const char *value) {
    for (int i = 0; i < *n; i++) { /* flags only: a value is never compared */
        const zi_option *o = zi_option_find(ZI_OWN_CHILDREN, list[i], NULL);
        if (!strcmp(list[i], flag) || (is_spec_flag(flag) && is_spec_flag(list[i]))) {
            list[i] = flag; /* the last of --spec-lookup / --no-spec-lookup wins */
            if (value) list[i + 1] = value;
            return;
        }
        if (o && o->type != ZI_OPT_FLAG) i++; /* over its value */
    }
    list[(*n)++] = flag;
    if (value) list[(*n)++] = value;
}

/* ---- the phases of zi_serve_main ---------------------------------------- */

/* A phase's return value when the server goes on to the next phase; any
 * other value is zinfer serve's exit status (0 --help, 1 cannot run,
 * 2 bad usage). */
#define GO_ON (-1)

/* The command line, and what the children's argument vectors point into
 * (so it lives until the children are stopped). */
/* One model served: its name (what requests name), its file, and its
 * process counts (0: --workers / --tokenizers). */
typedef struct serve_model {
    char name[MODEL_NAME_MAX + 1];
    char path[4096];
    long long workers, tokenizers;
} serve_model;

typedef struct serve_opts {
    serve_model *models; /* --model (each), then --models-dir's; the first is the default */
    int n_models;
    const char *models_dir;                         /* --models-dir, or NULL */
    char served[MAX_MODELS * (MODEL_NAME_MAX + 1)]; /* the router's --served-models */
    long long n_workers_all;                        /* every model's workers together */
    long long models_max;                           /* --models-max (0: off) */
    int on_demand;                                  /* models_max below the number of models */
    /* serve manages the models (the router's --load-on-demand and its
     * models op polled: loads, unloads, keep_alive): several models,
     * --models-max or --keep-alive, and no client keys */
    int manage;
    int has_keep_alive; /* --keep-alive given (the router takes and reports it) */
    int has_max_prompt; /* --max-prompt-tokens given */
    char max_prompt[32]; /* else what the router gets when --ctx-size is larger */
    char at_start[24];  /* the router's --models-at-start: models_max */
    char backend[512];
    char draft[4096]; /* --draft-model, resolved as --model is */
    /* --lora values, each file's real path (the workers' may differ) */
    char lora[ZI_LORA_MAX_ADAPTERS][PATH_MAX + ZI_LORA_NAME_MAX + 64];
    /* the model each adapts (--lora MODEL:NAME=...), "" for the default one */
    char lora_model[ZI_LORA_MAX_ADAPTERS][MODEL_NAME_MAX + 1];
    int n_lora;
    const char *bind, *level, *device, *http;
    const char *tmpl;        /* --chat-template as given, or NULL */
    char mmproj[PATH_MAX];   /* --mmproj's real path, or "" */
    char tts_dec[PATH_MAX];  /* --tts-decoder's real path, or "" */
    char voices[PATH_MAX];   /* --voices' real path, or "" */
    const char *max_pixels;  /* --max-image-pixels as given, or NULL */
    char tmpl_arg[PATH_MAX]; /* what the tokenizers get: the name, or the file's real path */
    long long workers, tokenizers, threads, slots, ctx;
    const char *router_pass[MAX_PASS], *worker_pass[MAX_PASS], *http_pass[MAX_PASS];
    int n_pass, n_wpass, n_hpass;
    int check_only;             /* --check-args */
    char bin[4][PATH_MAX + 32]; /* zinfer-router, -tokenizer, -worker, -http */
    char router_addr[512];      /* where zinfer-http reaches the router */
    char thr[32], sl[32], cx[32];
    const char *keys; /* --keys DIR, or NULL */
    int insecure;     /* --insecure */
    /* With --keys: the key files each child gets (validate_options). */
    char k_router[PATH_MAX + 16], k_router_pub[PATH_MAX + 16], k_worker[PATH_MAX + 16],
        k_backend[PATH_MAX + 16], k_client[PATH_MAX + 16];
    int client_keys; /* DIR/client-keys exists */
    /* --tool-call-format, auto resolved from the chat template
     * (tool_call_format) and passed to zinfer-http by name */
    int tool_format;
    /* auto with several models: each one's, as zinfer-http's
     * --model-tool-call-format NAME=F,... ("" when not passed) */
    char model_tools[MAX_MODELS * (MODEL_NAME_MAX + 24)];
} serve_opts;

/* A model to serve (o->models has room for MAX_MODELS); ZI_EINVAL past it. */
static serve_model *new_model(serve_opts *o, zi_error *err) {
    if (o->n_models == MAX_MODELS) {
        zi_error_set(err, ZI_EINVAL, "--model: more than %d models", MAX_MODELS);
        return NULL;
    }
    serve_model *m = &o->models[o->n_models++];
    memset(m, 0, sizeof *m);
    return m;
}

/* One --model value: [NAME=]PATH[,workers=N][,tokenizers=T]. PATH may
 * be a packaged model's name (zi_resolve_model_arg); NAME defaults to the
 * file's name without .gguf. A value is NAME=PATH when it has a '=' before
 * any '/'. */
static int add_model_arg(serve_opts *o, const char *v, zi_error *err) {
    char buf[4096 + MODEL_NAME_MAX + 64];
    if (strlen(v) >= sizeof buf)
        return zi_error_set(err, ZI_EINVAL, "--model: the value is too long");
    snprintf(buf, sizeof buf, "%s", v);
    long long workers = 0, tokenizers = 0;
    for (char *c; (c = strrchr(buf, ','));) { /* the counts, from the end */
        long long *dst = !strncmp(c + 1, "workers=", 8)       ? &workers
                         : !strncmp(c + 1, "tokenizers=", 11) ? &tokenizers
                                                              : NULL;
        if (!dst) break;
        const char *num = strchr(c, '=') + 1;
        if (zi_parse_int(dst == &workers ? "--model ...,workers" : "--model ...,tokenizers", num, 1,
                         64, dst, err))
            return ZI_EINVAL;
        *c = '\0';
    }
    char *eq = strchr(buf, '='), *slash = strchr(buf, '/');
    const char *path = buf;
    if (eq && (!slash || eq < slash)) {
        *eq = '\0';
        path = eq + 1;
        if (!buf[0])
            return zi_error_set(err, ZI_EINVAL, "--model %s: the name before '=' is empty", v);
    }
    serve_model *m = new_model(o, err);
    if (!m) return ZI_EINVAL;
    m->workers = workers, m->tokenizers = tokenizers;
    if (zi_resolve_model_arg(path, m->path, sizeof m->path, err)) return ZI_EINVAL;
    if (path != buf) {
        if (strlen(buf) > MODEL_NAME_MAX)
            return zi_error_set(err, ZI_EINVAL, "--model %s: a name has at most %d bytes", v,
                                MODEL_NAME_MAX);
        snprintf(m->name, sizeof m->name, "%s", buf);
    } else {
        zi_model_name_of_path(m->path, m->name, sizeof m->name);
    }
    return ZI_OK;
}

/* Phase 1: the options, each checked as it is read with the range of the
 * table (options.h) that the child it is for checks it with. */
static int parse_options(int argc, char **argv, serve_opts *o, zi_logger *lg) {
    zi_error err = {0};
    o->bind = zi_option_get(ZI_O_BIND)->def_text, o->level = "info";
    o->device = zi_option_get(ZI_O_DEVICE)->def_text;
    o->http = zi_option_get(ZI_O_LISTEN)->def_text;
    o->workers = zi_option_def(ZI_O_WORKERS), o->tokenizers = zi_option_def(ZI_O_TOKENIZERS);
    o->threads = zi_option_def(ZI_O_THREADS), o->slots = zi_option_def(ZI_O_SLOTS);
    o->ctx = zi_option_def(ZI_O_CTX_SIZE);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--http") && i + 1 < argc && !strcmp(argv[i + 1], "off")) {
            o->http = argv[++i]; /* serve's own value: no zinfer-http */
            continue;
        }
        zi_opt_id id;
        long long x;
        const char *v;
        int rc =
            zi_options_next(ZI_OWN_SERVE | ZI_OWN_SERVE_PASS, argc, argv, &i, &id, &x, &v, &err);
        zi_device_spec spec;
        if (!rc && id == ZI_O_DEVICE) rc = zi_device_parse(v, &spec, &err);
        if (!rc && id == ZI_O_MODEL) rc = add_model_arg(o, v, &err);
        if (!rc && id == ZI_O_KEEP_ALIVE) { /* checked here, passed to the router as given */
            int64_t ms;
            rc = zi_duration_parse(v, strlen(v), "--keep-alive", &ms, &err);
            o->has_keep_alive = 1;
        }
        if (!rc && id == ZI_O_DRAFT_MODEL)
            rc = zi_resolve_model_arg(v, o->draft, sizeof o->draft, &err);
        if (!rc && id == ZI_O_API_KEY) /* to zinfer-http by the environment, not argv (ps) */
            rc = setenv("ZINFER_API_KEY", v, 1)
                     ? zi_error_set(&err, ZI_EINVAL, "--api-key: %s", strerror(errno))
                     : 0;
        if (rc) {
            fprintf(stderr, "zinfer serve: %s\n", err.msg);
            return 2;
        }
        const zi_option *opt = zi_option_get(id);
        if (opt->owners & ZI_OWN_SERVE_PASS) { /* under the child's name, to each that takes it */
            if (id == ZI_O_MAX_PROMPT_TOKENS) o->has_max_prompt = 1;
            if (opt->owners & ZI_OWN_ROUTER) pass_on(o->router_pass, &o->n_pass, opt->name, v);
            if (opt->owners & ZI_OWN_WORKER) pass_on(o->worker_pass, &o->n_wpass, opt->name, v);
            if (opt->owners & ZI_OWN_HTTP) pass_on(o->http_pass, &o->n_hpass, opt->name, v);
            continue;
        }
        switch (id) {
        case ZI_O_HELP:
            print_usage();
            return 0;
        case ZI_O_CHECK_ARGS:
            o->check_only = 1;
            break;
        case ZI_O_DRAFT_MODEL:
            pass_on(o->worker_pass, &o->n_wpass, opt->name, o->draft);
            break;
        case ZI_O_LORA: { /* as the worker reads it, the file by its real path */
            zi_lora_spec spec;
            char real[PATH_MAX], model[MODEL_NAME_MAX + 1] = "";
            /* MODEL:NAME=...: a ':' before the '=' (names have none) binds
             * the adapter to that --model */
            const char *eq = strchr(v, '='), *colon = NULL;
            for (const char *p = v; eq && p < eq; p++)
                if (*p == ':') colon = p;
            if (colon) {
                if (colon == v || (size_t)(colon - v) > MODEL_NAME_MAX) {
                    fprintf(stderr,
                            "zinfer serve: --lora '%s': MODEL in MODEL:NAME=FILE is not "
                            "a model's name\n",
                            v);
                    return 2;
                }
                memcpy(model, v, (size_t)(colon - v));
                model[colon - v] = '\0';
                v = colon + 1;
            }
            if (zi_lora_spec_parse(v, &spec, &err)) {
                fprintf(stderr, "zinfer serve: %s\n", err.msg);
                return 2;
            }
            if (o->n_lora == ZI_LORA_MAX_ADAPTERS) {
                fprintf(stderr, "zinfer serve: more than %d --lora adapters\n",
                        ZI_LORA_MAX_ADAPTERS);
                return 2;
            }
            if (!realpath(spec.path, real)) {
                fprintf(stderr, "zinfer serve: --lora %s: %s\n", spec.path, strerror(errno));
                return 2;
            }
            snprintf(o->lora_model[o->n_lora], sizeof o->lora_model[0], "%s", model);
            snprintf(o->lora[o->n_lora++], sizeof o->lora[0], "%s=%s:%.9g", spec.name, real,
                     (double)spec.scale);
            break;
        }
        case ZI_O_CHAT_TEMPLATE:
            o->tmpl = v;
            break;
        case ZI_O_MMPROJ: /* the children run elsewhere: its real path */
            if (!realpath(v, o->mmproj)) {
                fprintf(stderr, "zinfer serve: --mmproj %s: %s\n", v, strerror(errno));
                return 2;
            }
            pass_on(o->worker_pass, &o->n_wpass, opt->name, o->mmproj);
            break;
        case ZI_O_MAX_IMAGE_PIXELS:
            o->max_pixels = v;
            break;
        case ZI_O_TTS_DECODER: /* the workers load it beside the codec model */
            if (!realpath(v, o->tts_dec)) {
                fprintf(stderr, "zinfer serve: --tts-decoder %s: %s\n", v, strerror(errno));
                return 2;
            }
            pass_on(o->worker_pass, &o->n_wpass, opt->name, o->tts_dec);
            break;
        case ZI_O_VOICES: /* the tokenizers read the speaker files */
            if (!realpath(v, o->voices)) {
                fprintf(stderr, "zinfer serve: --voices %s: %s\n", v, strerror(errno));
                return 2;
            }
            break;
        case ZI_O_TOOL_CALL_FORMAT: /* choices in zi_tool_format's order */
            o->tool_format = (int)x;
            break;
        case ZI_O_BIND:
            o->bind = v;
            break;
        case ZI_O_BACKEND:
            snprintf(o->backend, sizeof o->backend, "%s", v);
            break;
        case ZI_O_KEYS:
            o->keys = v;
            break;
        case ZI_O_MODELS_DIR:
            o->models_dir = v;
            break;
        case ZI_O_MODELS_MAX:
            o->models_max = x;
            break;
        case ZI_O_INSECURE:
            o->insecure = 1;
            break;
        case ZI_O_LISTEN:
            o->http = v;
            break;
        case ZI_O_DEVICE:
            o->device = v;
            break;
        case ZI_O_WORKERS:
            o->workers = x;
            break;
        case ZI_O_TOKENIZERS:
            o->tokenizers = x;
            break;
        case ZI_O_THREADS: /* 0: CPUs / workers (plan_children) */
            o->threads = x;
            break;
        case ZI_O_SLOTS:
            o->slots = x;
            break;
        case ZI_O_CTX_SIZE:
            o->ctx = x;
            break;
        case ZI_O_LOG_LEVEL:
            o->level = v, lg->level = (int)x;
            break;
        default: /* --model and --api-key are done above */
            break;
        }
    }
    /* A prompt may fill the context asked for: past the router's default
     * limit, --ctx-size is the limit unless --max-prompt-tokens is given
     * (a 32k-token prompt with --ctx-size 32768 was refused at 4096). */
    if (!o->has_max_prompt && o->ctx > zi_option_def(ZI_O_MAX_PROMPT_TOKENS)) {
        snprintf(o->max_prompt, sizeof o->max_prompt, "%lld", o->ctx);
        pass_on(o->router_pass, &o->n_pass, zi_option_get(ZI_O_MAX_PROMPT_TOKENS)->name,
                o->max_prompt);
    }
    return GO_ON;
}

/* Phase 2a: --keys DIR's files, each read and checked once here (a bad one
 * stops the server at once instead of failing every child's start), and
 * the non-loopback backend rule. */
static int validate_keys(serve_opts *o) {
    if (!o->keys) {
        if (zi_addr_is_loopback(o->backend) || o->insecure) return GO_ON;
        fprintf(stderr,
                "zinfer serve: --backend %s is not a loopback address: anyone who reaches it "
                "could register as a worker and read prompts. Give --keys DIR "
                "(docs/security.md), or --insecure\n",
                o->backend);
        return 2;
    }
    if (zi_curve_is_key_text(o->keys)) {
        fprintf(stderr, "zinfer serve: --keys takes a directory, not a key\n");
        return 2;
    }
    snprintf(o->k_router, sizeof o->k_router, "%s/router.key", o->keys);
    snprintf(o->k_router_pub, sizeof o->k_router_pub, "%s/router.pub", o->keys);
    snprintf(o->k_worker, sizeof o->k_worker, "%s/worker.key", o->keys);
    snprintf(o->k_backend, sizeof o->k_backend, "%s/backend-keys", o->keys);
    if (access(o->k_backend, F_OK) != 0)
        snprintf(o->k_backend, sizeof o->k_backend, "%s/worker.pub", o->keys);
    snprintf(o->k_client, sizeof o->k_client, "%s/client-keys", o->keys);
    o->client_keys = access(o->k_client, F_OK) == 0;
    zi_error err = {0};
    zi_curve_key k, pub;
    zi_curve_keys list = {0};
    int rc = zi_curve_load_key("--keys", o->k_router, true, &k, &err);
    if (!rc) rc = zi_curve_public(&k, &pub, &err);
    zi_curve_key rpub;
    if (!rc) rc = zi_curve_load_key("--keys", o->k_router_pub, false, &rpub, &err);
    if (!rc && strcmp(rpub.z85, pub.z85))
        rc = zi_error_set(&err, ZI_EINVAL, "--keys: %s is not the public key of %s",
                          o->k_router_pub, o->k_router);
    if (!rc) rc = zi_curve_load_key("--keys", o->k_worker, true, &k, &err);
    if (!rc) rc = zi_curve_load_list("--keys", o->k_backend, &list, &err);
    zi_curve_keys_free(&list);
    if (!rc && o->client_keys) rc = zi_curve_load_list("--keys", o->k_client, &list, &err);
    zi_curve_keys_free(&list);
    memset(&k, 0, sizeof k);
    if (rc) {
        fprintf(stderr, "zinfer serve: %s\n", err.msg);
        return 2;
    }
    if (o->client_keys && o->http) {
        fprintf(stderr,
                "zinfer serve: %s turns on client keys, and zinfer-http does not hold a CURVE "
                "key: give --http off (docs/security.md)\n",
                o->k_client);
        return 2;
    }
    return GO_ON;
}

/* Why a file of --models-dir is not a model to serve (NULL: it is one):
 * an image projector, a vocabulary-only file, an adapter, or a file that
 * is not GGUF. */
static const char *not_a_model(const char *path, const char *file) {
    if (strstr(file, "mmproj")) return "an image projector";
    zi_gguf *g = NULL;
    zi_error err = {0};
    if (zi_gguf_open_flags(path, ZI_GGUF_ANY_TYPE, &g, &err) != ZI_OK)
        return "not a readable GGUF file";
    const char *why = NULL;
    zi_str t = {0};
    if (zi_gguf_get_str(g, "general.type", &t, NULL) == ZI_OK) {
        if (t.len == 7 && !memcmp(t.ptr, "adapter", 7)) why = "an adapter";
        if (t.len == 6 && !memcmp(t.ptr, "mmproj", 6)) why = "an image projector";
    }
    if (!why && zi_gguf_get_str(g, "general.architecture", &t, NULL) == ZI_OK && t.len == 4 &&
        !memcmp(t.ptr, "clip", 4))
        why = "an image projector";
    if (!why && zi_gguf_tensor_count(g) == 0) why = "vocabulary only";
    zi_gguf_close(g);
    return why;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* --models-dir DIR: each .gguf file in it, by name, after the --model
 * ones (a name already served is skipped, as are files that are no model
 * to serve: each with a log line). */
static int scan_models_dir(serve_opts *o, const zi_logger *lg) {
    DIR *d = opendir(o->models_dir);
    if (!d) {
        fprintf(stderr, "zinfer serve: --models-dir %s: %s\n", o->models_dir, strerror(errno));
        return 1;
    }
    char **files = NULL;
    size_t n = 0, cap = 0;
    int rc = GO_ON;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len <= 5 || strcmp(e->d_name + len - 5, ".gguf")) continue;
        if (n == cap) {
            char **p = realloc(files, (cap = cap ? cap * 2 : 16) * sizeof *p);
            if (!p) break;
            files = p;
        }
        if (!(files[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    qsort(files, n, sizeof *files, cmp_str);
    for (size_t i = 0; i < n && rc == GO_ON; i++) {
        char path[4096], name[MODEL_NAME_MAX + 1];
        snprintf(path, sizeof path, "%s/%s", o->models_dir, files[i]);
        zi_model_name_of_path(files[i], name, sizeof name);
        const char *why = not_a_model(path, files[i]);
        for (int k = 0; k < o->n_models && !why; k++)
            if (!strcmp(o->models[k].name, name)) why = "a model of that name is served already";
        if (why) {
            zi_log(lg, ZI_LOG_INFO, "--models-dir: skipping %s (%s)", files[i], why);
            continue;
        }
        zi_error err = {0};
        serve_model *m = new_model(o, &err);
        if (!m) {
            fprintf(stderr, "zinfer serve: --models-dir %s: %s\n", o->models_dir, err.msg);
            rc = 2;
            break;
        }
        snprintf(m->path, sizeof m->path, "%s", path);
        snprintf(m->name, sizeof m->name, "%s", name);
    }
    for (size_t i = 0; i < n; i++) free(files[i]);
    free(files);
    return rc;
}

/* Phase 2 first: the models to serve (the default one when none is
 * named), their names (distinct, no ',' which the router's list
 * separates them by), their counts, the router's --served-models list. */
static int collect_models(serve_opts *o, const zi_logger *lg) {
    if (o->models_dir) {
        int rc = scan_models_dir(o, lg);
        if (rc != GO_ON) return rc;
    }
    if (o->n_models == 0 && !o->models_dir) {
        serve_model *m = &o->models[o->n_models++];
        memset(m, 0, sizeof *m);
        zi_default_model_path(m->path, sizeof m->path);
        zi_model_name_of_path(m->path, m->name, sizeof m->name);
    }
    if (o->n_models == 0) {
        fprintf(stderr, "zinfer serve: --models-dir %s: no model file in it\n", o->models_dir);
        return 1;
    }
    if (o->n_models > 1 && (o->mmproj[0] || o->draft[0] || o->tmpl)) {
        fprintf(stderr, "zinfer serve: --mmproj, --draft-model and --chat-template belong to one "
                        "model: give them with a single --model\n");
        return 2;
    }
    for (int j = 0; j < o->n_lora; j++) { /* each bound adapter's model is served */
        int k = 0;
        while (o->lora_model[j][0] && k < o->n_models &&
               strcmp(o->models[k].name, o->lora_model[j]))
            k++;
        if (k == o->n_models) {
            char names[512];
            size_t n = 0;
            names[0] = '\0';
            for (int i = 0; i < o->n_models && n < sizeof names; i++)
                n += (size_t)snprintf(names + n, sizeof names - n, "%s'%s'", i ? ", " : "",
                                      o->models[i].name);
            fprintf(stderr, "zinfer serve: --lora %s:%s: no model named '%s' is served (%s)\n",
                    o->lora_model[j], o->lora[j], o->lora_model[j], names);
            return 2;
        }
    }
    size_t at = 0;
    o->n_workers_all = 0;
    for (int k = 0; k < o->n_models; k++) {
        serve_model *m = &o->models[k];
        if (!m->name[0] || strchr(m->name, ',')) {
            fprintf(stderr,
                    "zinfer serve: --model %s: '%s' is not a model name (1 to %d bytes, "
                    "no ','); name it with NAME=PATH\n",
                    m->path, m->name, MODEL_NAME_MAX);
            return 2;
        }
        for (int j = 0; j < k; j++)
            if (!strcmp(o->models[j].name, m->name)) {
                fprintf(stderr,
                        "zinfer serve: two models are named '%s' (%s, %s); name them with "
                        "NAME=PATH\n",
                        m->name, o->models[j].path, m->path);
                return 2;
            }
        if (!m->workers) m->workers = o->workers;
        if (!m->tokenizers) m->tokenizers = o->tokenizers;
        o->n_workers_all += m->workers;
        at +=
            (size_t)snprintf(o->served + at, sizeof o->served - at, "%s%s", k ? "," : "", m->name);
    }
    return GO_ON;
}

/* Phase 2: what the options say together (refused at once, as a child
 * would refuse it later), the backend address, the model files. */
static int validate_options(serve_opts *o, const zi_logger *lg) {
    zi_error err = {0};
    int mrc = collect_models(o, lg);
    if (mrc != GO_ON) return mrc;
    int kv_sizes = 0; /* as the worker: one of them */
    for (int j = 0; j < o->n_wpass; j++)
        kv_sizes += !strcmp(o->worker_pass[j], "--kv-cache-tokens") ||
                    !strcmp(o->worker_pass[j], "--kv-cache-bytes");
    if (kv_sizes > 1) {
        fprintf(stderr, "zinfer serve: give --kv-cache-tokens or --kv-cache-bytes, not both\n");
        return 2;
    }
    for (int j = 0; j + 1 < o->n_wpass; j++) { /* as the worker would refuse it, at once */
        long long bits = 16;
        if (!strcmp(o->worker_pass[j], "--act-bits")) /* parsed by parse_options */
            zi_parse_worker_flag(o->worker_pass[j], o->worker_pass[j + 1], &bits, &err);
        if (bits != 16 && strcmp(o->device, "cpu")) {
            fprintf(stderr, "zinfer serve: --act-bits %lld is a CPU option (--device %s)\n", bits,
                    o->device);
            return 2;
        }
        long long kvt = ZI_KV_DEFAULT;
        if (!strcmp(o->worker_pass[j], "--kv-type"))
            zi_parse_worker_flag(o->worker_pass[j], o->worker_pass[j + 1], &kvt, &err);
        if (kvt != ZI_KV_DEFAULT && strcmp(o->device, "cpu")) {
            fprintf(stderr,
                    "zinfer serve: --kv-type %s is a CPU option: the CUDA backend keeps float32 "
                    "K and V (--device %s; use --kv-type default)\n",
                    zi_kv_type_name((int)kvt), o->device);
            return 2;
        }
    }
    if (!o->backend[0] && next_port_addr(o->bind, o->backend, sizeof o->backend) != 0) {
        fprintf(stderr, "zinfer serve: --backend is required when --bind is not tcp://HOST:PORT\n");
        return 2;
    }
    if (!strcmp(o->http, "off")) o->http = NULL; /* else HOST:PORT, checked by parse_options */
    /* The router binds --bind; zinfer-http (and, with --models-max, serve
     * itself) connect to it, on this host when it binds every interface. */
    const char *star = strstr(o->bind, "://*:");
    const char *any = strstr(o->bind, "://0.0.0.0:");
    if (star || any)
        snprintf(o->router_addr, sizeof o->router_addr, "%.*s://127.0.0.1%s",
                 (int)((star ? star : any) - o->bind), o->bind, strrchr(o->bind, ':'));
    else
        snprintf(o->router_addr, sizeof o->router_addr, "%s", o->bind);
    int krc = validate_keys(o);
    if (krc != GO_ON) return krc;
    o->on_demand = o->models_max > 0 && o->models_max < o->n_models;
    if ((o->on_demand || o->has_keep_alive) && o->client_keys) {
        fprintf(stderr,
                "zinfer serve: %s asks the router which models requests name, "
                "as a client without a CURVE key: not with %s (docs/security.md)\n",
                o->on_demand ? "--models-max" : "--keep-alive", o->k_client);
        return 2;
    }
    /* Several models are managed even without --models-max: load_model and
     * unload_model, and a request for a model unloaded so loads it back
     * (with client keys serve cannot ask the router: then every model
     * stays loaded, and those ops are "unsupported"). */
    o->manage = (o->n_models > 1 || o->on_demand || o->has_keep_alive) && !o->client_keys;
    for (int k = 0; k < o->n_models; k++)
        if (access(o->models[k].path, R_OK) != 0) {
            fprintf(stderr, "zinfer serve: --model %s: %s\n", o->models[k].path, strerror(errno));
            return 1;
        }
    if (o->tmpl) {
        /* Loaded and compiled here once, so that a bad file stops the
         * server at once with its error instead of failing every tokenizer
         * start; the tokenizers get the file's absolute path, which a
         * restart finds whatever its working directory. */
        zi_chat_template *t = NULL;
        zi_error err = {0};
        if (zi_chat_template_from_arg(o->tmpl, &t, &err)) {
            fprintf(stderr, "zinfer serve: %s\n", err.msg);
            return 1;
        }
        zi_chat_template_free(t);
        if (zi_chat_template_builtin(o->tmpl) || !realpath(o->tmpl, o->tmpl_arg))
            snprintf(o->tmpl_arg, sizeof o->tmpl_arg, "%s", o->tmpl);
    }
    return GO_ON;
}

/* --tool-call-format auto: the format the chat template model k's
 * tokenizers use (--chat-template's, else the model file's) asks for;
 * generic when there is none or it cannot be read (the tokenizers then
 * say why). */
static zi_tool_format tool_call_format(const serve_opts *o, int k) {
    zi_tool_format f = ZI_TF_GENERIC;
    zi_error err = {0};
    if (o->tmpl) {
        char *src = NULL;
        size_t len = 0;
        if (!zi_chat_template_load(o->tmpl, &src, &len, &err)) f = zi_tool_format_detect(src, len);
        free(src);
        return f;
    }
    zi_gguf *g = NULL;
    zi_str t = {0};
    if (zi_gguf_open_flags(o->models[k].path, ZI_GGUF_ANY_TYPE, &g, &err) != ZI_OK) return f;
    if (zi_gguf_get_str(g, "tokenizer.chat_template", &t, NULL) == ZI_OK)
        f = zi_tool_format_detect(t.ptr, (size_t)t.len);
    zi_gguf_close(g);
    return f;
}

/* The worker's value of a pass-through option (parsed with its range by
 * parse_options), or dflt when it was not given. */
static long long worker_value(const serve_opts *o, const char *flag, long long dflt) {
    for (int j = 0; j + 1 < o->n_wpass; j++)
        if (!strcmp(o->worker_pass[j], flag)) {
            zi_error err = {0};
            long long v = dflt;
            if (zi_parse_worker_flag(flag, o->worker_pass[j + 1], &v, &err) == ZI_OK) return v;
        }
    return dflt;
}

/* Whether flag (one without a value) is among the options passed to the
 * workers. */
static bool worker_flag(const serve_opts *o, const char *flag) {
    for (int j = 0; j < o->n_wpass; j++) {
        if (!strcmp(o->worker_pass[j], flag)) return true;
        const zi_option *opt = zi_option_find(ZI_OWN_CHILDREN, o->worker_pass[j], NULL);
        if (opt && opt->type != ZI_OPT_FLAG) j++; /* over its value */
    }
    return false;
}

/* One model file's costs from its header (mem_plan.h); nonzero when the
 * file cannot be read that way (the worker will say why). */
static int file_costs(const char *path, const zi_backend *be, int batch, int slots,
                      zi_model_config *cfg, zi_mem_model *out) {
    zi_gguf *g = NULL;
    zi_error err = {0};
    if (zi_gguf_open(path, &g, &err) != ZI_OK) return 1;
    int rc = zi_mem_model_of_file(g, be, batch, slots, cfg, out, &err);
    zi_gguf_close(g);
    return rc;
}

/* Phase 2b: with the default memory budget on the CPU (none of
 * --memory-budget, --kv-cache-tokens, --kv-cache-bytes), every worker's
 * weights, working buffers and a KV cache of --slots x --ctx-size
 * positions must fit in the machine's memory together (mem_plan.h).
 * Checked here from the file's header, before anything starts, so that a
 * configuration that cannot fit stops at once with the numbers, instead
 * of after each worker has loaded its weights (each worker checks its own
 * share again, with the weights as its backend holds them). A file that
 * cannot be read is left to the worker, which names the problem. */
static int check_memory(const serve_opts *o) {
    if (strcmp(o->device, "cpu") || worker_value(o, "--memory-budget", 0) > 0 ||
        worker_value(o, "--kv-cache-tokens", 0) > 0 || worker_value(o, "--kv-cache-bytes", 0) > 0)
        return GO_ON;
    int batch = (int)worker_value(o, "--batch-size", zi_option_def(ZI_O_BATCH_SIZE));
    int block = (int)worker_value(o, "--block-size", zi_option_def(ZI_O_BLOCK_SIZE));
    zi_error err = {0};
    zi_backend *be = NULL;
    zi_cpu_options co = {.n_threads = 1}; /* made only to ask its KV cache's layout */
    if (zi_cpu_backend_create(&co, &be, &err) != ZI_OK) return GO_ON;
    if (zi_backend_set_kv_type(be, (int)worker_value(o, "--kv-type", ZI_KV_DEFAULT), &err)) {
        zi_backend_free(be);
        return GO_ON; /* the worker says why */
    }
    /* Every model's workers together: each model is checked against what
     * the models before it leave of the default budget's share. With
     * --models-max N, the N largest files (the most that can be loaded
     * at once). */
    uint64_t avail = zi_mem_available(), usable = zi_mem_usable(avail), used = 0;
    int slots = (int)o->slots, rc = 0;
    int order[MAX_MODELS], n_check = o->n_models;
    off_t size[MAX_MODELS];
    for (int k = 0; k < o->n_models; k++) {
        struct stat st;
        order[k] = k;
        size[k] = stat(o->models[k].path, &st) == 0 ? st.st_size : 0;
    }
    if (o->on_demand) {
        for (int a = 1; a < o->n_models; a++) /* largest first (insertion sort) */
            for (int b = a; b > 0 && size[order[b]] > size[order[b - 1]]; b--) {
                int t = order[b];
                order[b] = order[b - 1], order[b - 1] = t;
            }
        n_check = (int)o->models_max;
    }
    for (int n = 0; n < n_check && !rc; n++) {
        int k = n;
        const serve_model *sm = &o->models[order[k]];
        zi_model_config cfg, dcfg;
        zi_mem_model mm, dm;
        if (file_costs(sm->path, be, batch, slots, &cfg, &mm)) continue; /* the worker says why */
        /* a hybrid keeps state checkpoints only with the prefix cache */
        if (worker_flag(o, "--no-prefix-cache")) mm.state_ckpts_per_slot = 0;
        int draft = o->draft[0] && !file_costs(o->draft, be, batch, slots, &dcfg, &dm);
        /* The context as the worker cuts it (model_worker/worker_main.c, load). */
        int ctx = (int)(o->ctx < cfg.ctx_train ? o->ctx : cfg.ctx_train);
        if (cfg.encoder && ctx > batch) ctx = batch;
        zi_mem_plan plan;
        uint64_t left = usable > used ? usable - used : 0;
        /* zi_mem_plan_check takes MemAvailable and keeps its share of it */
        uint64_t avail_k = avail == 0 ? 0 : left / ZI_MEM_SHARE_PCT * 100 + 1;
        rc = zi_mem_plan_make(&mm, draft ? &dm : NULL, slots, ctx, block, &plan, &err);
        if (!rc) rc = zi_mem_plan_check(&plan, (int)sm->workers, avail_k, &err);
        if (rc || err.code) {
            if (k > 0)
                fprintf(stderr,
                        "zinfer serve: --model %s: %s (after the %.1f MiB of the %d model(s) "
                        "before it)\n",
                        sm->path, err.msg, (double)used / 1048576.0, k);
            else
                fprintf(stderr, "zinfer serve: --model %s: %s\n", sm->path, err.msg);
            rc = 1;
        } else {
            used += plan.total_bytes * (uint64_t)sm->workers;
        }
    }
    zi_backend_free(be);
    return rc ? 1 : GO_ON;
}

/* Phase 3a: the three binaries, next to this one. */
static int find_binaries(serve_opts *o) {
    char dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0) {
        fprintf(stderr, "zinfer serve: cannot find my own binary: %s\n", strerror(errno));
        return 1;
    }
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    const char *names[4] = {"zinfer-router", "zinfer-tokenizer", "zinfer-worker", "zinfer-http"};
    for (int i = 0; i < (o->http ? 4 : 3); i++) {
        snprintf(o->bin[i], sizeof o->bin[i], "%s/%s", dir, names[i]);
        if (access(o->bin[i], X_OK) != 0) {
            fprintf(stderr, "zinfer serve: %s: %s\n", o->bin[i], strerror(errno));
            return 1;
        }
    }
    return GO_ON;
}

/* A tokenizer's or worker's key options (with --keys), from argv[k]; the
 * next free index. */
static size_t add_backend_keys(const serve_opts *o, child *c, size_t k) {
    if (!o->keys) return k;
    const char *a[] = {"--curve-secret", o->k_worker, "--router-key", o->k_router_pub};
    for (size_t j = 0; j < 4; j++) c->argv[k++] = (char *)a[j];
    return k;
}

/* Phase 3b: every child's name and argument vector: the router, then the
 * tokenizers, then the workers. *ch and *dev (each worker's device string)
 * are the caller's to free; 1 when out of memory. */
static int plan_children(serve_opts *o, child **ch_out, int *nc_out, char (**dev_out)[32]) {
    if (o->threads == 0) {
        /* The CPUs over the workers that run at once: under --models-max
         * those of the models_max models with the most workers. */
        long long running = o->n_workers_all;
        if (o->on_demand) {
            long long w[MAX_MODELS];
            for (int k = 0; k < o->n_models; k++) w[k] = o->models[k].workers;
            running = 0;
            for (long long n = 0; n < o->models_max; n++) { /* the largest, one by one */
                int best = 0;
                for (int k = 1; k < o->n_models; k++)
                    if (w[k] > w[best]) best = k;
                running += w[best];
                w[best] = 0;
            }
        }
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = running > 0 && cpus > running ? cpus / running : 1;
    }
    snprintf(o->thr, sizeof o->thr, "%lld", o->threads);
    snprintf(o->sl, sizeof o->sl, "%lld", o->slots);
    snprintf(o->cx, sizeof o->cx, "%lld", o->ctx);

    long long n_tok = 0;
    for (int k = 0; k < o->n_models; k++) n_tok += o->models[k].tokenizers;
    child *ch = calloc((size_t)(2 + n_tok + o->n_workers_all), sizeof *ch);
    if (!ch) return 1;
    int nc = 0;
    {
        child *c = &ch[nc++];
        snprintf(c->name, sizeof c->name, "router");
        int k = 0;
        const char *a[] = {o->bin[0],     "--bind", o->bind,           "--backend", o->backend,
                           "--log-level", o->level, "--served-models", o->served};
        for (size_t j = 0; j < sizeof a / sizeof a[0]; j++) c->argv[k++] = (char *)a[j];
        for (int j = 0; j < o->n_pass; j++) c->argv[k++] = (char *)o->router_pass[j];
        if (o->keys) {
            const char *ka[] = {"--curve-secret", o->k_router, "--backend-keys", o->k_backend};
            for (size_t j = 0; j < 4; j++) c->argv[k++] = (char *)ka[j];
        }
        if (o->keys && o->client_keys) {
            c->argv[k++] = "--client-keys";
            c->argv[k++] = o->k_client;
        }
        if (o->insecure) c->argv[k++] = "--insecure";
        if (o->manage) c->argv[k++] = "--load-on-demand";
        if (o->on_demand) { /* the others are parked: "unloaded" */
            snprintf(o->at_start, sizeof o->at_start, "%lld", o->models_max);
            c->argv[k++] = "--models-at-start";
            c->argv[k++] = o->at_start;
        }
        c->model = -1;
    }
    /* A child's name says its model when there are several. */
    int many = o->n_models > 1;
    for (int mi = 0; mi < o->n_models; mi++) {
        serve_model *sm = &o->models[mi];
        for (long long t = 0; t < sm->tokenizers; t++) {
            child *c = &ch[nc++];
            snprintf(c->name, sizeof c->name, "tokenizer %lld%s%s", t, many ? " of " : "",
                     many ? sm->name : "");
            c->model = mi;
            c->parked = o->on_demand && mi >= o->models_max; /* the first models_max load */
            c->demand = o->on_demand;
            const char *a[] = {o->bin[1],      "--router", o->backend,    "--model", sm->path,
                               "--model-name", sm->name,   "--log-level", o->level};
            size_t k = 0;
            for (size_t j = 0; j < sizeof a / sizeof a[0]; j++) c->argv[k++] = (char *)a[j];
            if (o->tmpl) {
                c->argv[k++] = "--chat-template";
                c->argv[k++] = o->tmpl_arg;
            }
            if (o->mmproj[0]) {
                c->argv[k++] = "--mmproj";
                c->argv[k++] = o->mmproj;
            }
            if (o->max_pixels) {
                c->argv[k++] = "--max-image-pixels";
                c->argv[k++] = (char *)o->max_pixels;
            }
            if (o->voices[0]) {
                c->argv[k++] = "--voices";
                c->argv[k++] = o->voices;
            }
            k = add_backend_keys(o, c, k);
        }
    }
    /* "cuda" spreads each model's workers over the GPUs: its worker i
     * gets cuda:i, so every model starts at GPU 0 (numbering over all
     * models' workers named GPUs a one-GPU machine does not have). */
    char(*dev)[32] = calloc((size_t)o->n_workers_all, sizeof *dev);
    if (!dev) {
        free(ch);
        return 1;
    }
    long long w = 0;
    for (int mi = 0; mi < o->n_models; mi++) {
        serve_model *sm = &o->models[mi];
        for (long long i = 0; i < sm->workers; i++, w++) {
            if (!strcmp(o->device, "cuda"))
                snprintf(dev[w], sizeof dev[w], "cuda:%lld", i);
            else
                snprintf(dev[w], sizeof dev[w], "%.31s", o->device);
            child *c = &ch[nc++];
            snprintf(c->name, sizeof c->name, "worker %lld%s%s", many ? i : w, many ? " of " : "",
                     many ? sm->name : "");
            c->model = mi;
            c->parked = o->on_demand && mi >= o->models_max;
            c->demand = o->on_demand;
            const char *a[] = {o->bin[2],      "--router",   o->backend,  "--model",     sm->path,
                               "--model-name", sm->name,     "--threads", o->thr,        "--slots",
                               o->sl,          "--ctx-size", o->cx,       "--log-level", o->level,
                               "--device",     dev[w]};
            size_t k = 0;
            for (size_t j = 0; j < sizeof a / sizeof a[0]; j++) c->argv[k++] = (char *)a[j];
            for (int j = 0; j < o->n_wpass; j++) c->argv[k++] = (char *)o->worker_pass[j];
            for (int j = 0; j < o->n_lora; j++) { /* unbound ones: the default model's */
                if (o->lora_model[j][0] ? strcmp(o->lora_model[j], sm->name) != 0 : mi != 0)
                    continue;
                c->argv[k++] = "--lora";
                c->argv[k++] = o->lora[j];
            }
            k = add_backend_keys(o, c, k);
        }
    }
    if (o->http) {
        child *c = &ch[nc++];
        snprintf(c->name, sizeof c->name, "http");
        c->model = -1;
        const char *a[] = {
            o->bin[3],  "--listen",           o->http,
            "--router", o->router_addr,       "--log-level",
            o->level,   "--tool-call-format", zi_tool_format_name((zi_tool_format)o->tool_format)};
        size_t k = 0;
        for (size_t j = 0; j < sizeof a / sizeof a[0]; j++) c->argv[k++] = (char *)a[j];
        if (o->model_tools[0]) {
            c->argv[k++] = "--model-tool-call-format";
            c->argv[k++] = o->model_tools;
        }
        for (int j = 0; j < o->n_hpass; j++) c->argv[k++] = (char *)o->http_pass[j];
    }
    *ch_out = ch;
    *nc_out = nc;
    *dev_out = dev;
    return GO_ON;
}

/* Why the server stopped on its own, for its last line ("" when it did
 * not). */
typedef struct stop_reason {
    char text[ZI_ERROR_MSG_MAX + 96];
    char msg[ZI_ERROR_MSG_MAX]; /* the child's own error, to report it once */
} stop_reason;

/* One child has exited (status as waitpid gives it): log it and schedule
 * its restart after its backoff. A child that could not start with its
 * configuration and has never run stops the server with status 1
 * (*exit_status, *why), as does the fifth fast failure in a row. */
static void child_exited(const zi_logger *lg, child *ch, int nc, child *c, int status,
                         int *exit_status, stop_reason *why) {
    pid_t pid = c->pid;
    c->pid = 0;
    char msg[ZI_ERROR_MSG_MAX];
    zi_startup_pipe_read(c->startup_fd, msg, sizeof msg);
    c->startup_fd = -1;
    if (c->parked) { /* its model was unloaded (--models-max): it stays down */
        zi_log(lg, ZI_LOG_INFO, "%s (pid %d) stopped: its model is unloaded", c->name, (int)pid);
        return;
    }
    int config = WIFEXITED(status) && WEXITSTATUS(status) == ZI_EXIT_CONFIG;
    if (config && c->demand) {
        /* A model loaded on demand that cannot start (its file, its
         * memory) stays unloaded; the router is told why (demand_poll's
         * model_failed), so its requests end "unavailable" with it at
         * once; the other models go on. */
        zi_log(lg, ZI_LOG_ERROR, "%s cannot start: %s; its model stays unloaded", c->name,
               msg[0] ? msg : "a configuration error (see its messages above)");
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s",
                 msg[0] ? msg : "its process could not start (see the server's log)");
        c->fail_pending = 1;
        for (int i = 0; i < nc; i++) {
            if (ch[i].model != c->model) continue;
            ch[i].parked = ch[i].broken = 1;
            if (ch[i].pid > 0) kill(ch[i].pid, SIGTERM), ch[i].parked_ms = zi_now_ms();
        }
        return;
    }
    if (config && !c->has_run) {
        /* Every restart would fail the same way: report it once and stop
         * (the first such child's error is the server's last line; the
         * same error from its siblings is not repeated). */
        if (!why->text[0]) {
            snprintf(why->msg, sizeof why->msg, "%s", msg);
            snprintf(why->text, sizeof why->text, "%s cannot start: %s", c->name,
                     msg[0] ? msg : "a configuration error (see its messages above)");
            zi_log(lg, ZI_LOG_ERROR,
                   "%s (pid %d) cannot start with this configuration (exit status %d); "
                   "stopping the server instead of restarting it",
                   c->name, (int)pid, ZI_EXIT_CONFIG);
            *exit_status = 1;
            zi_stop_request();
        } else if (msg[0] && strcmp(msg, why->msg)) {
            zi_log(lg, ZI_LOG_ERROR, "%s cannot start: %s", c->name, msg);
        }
        return;
    }
    if (config && msg[0]) /* after having run: logged here, restarted below */
        zi_log(lg, ZI_LOG_ERROR, "%s cannot start: %s", c->name, msg);
    if (!config) c->has_run = 1;
    int64_t now = zi_now_ms();
    if (now - c->started_ms > 30000) c->backoff_ms = 500;
    c->fast_failures = now - c->started_ms < FAST_FAIL_MS ? c->fast_failures + 1 : 0;
    if (c->fast_failures >= FAST_FAIL_LIMIT) {
        zi_log(lg, ZI_LOG_ERROR,
               "%s failed %d times in a row right after starting; giving up "
               "(see its messages above)",
               c->name, c->fast_failures);
        *exit_status = 1;
        if (!why->text[0])
            snprintf(why->text, sizeof why->text,
                     "%s failed %d times in a row right after starting (see its messages above)",
                     c->name, c->fast_failures);
        zi_stop_request();
    }
    char how[64];
    if (WIFEXITED(status))
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(status));
    if (zi_stop_requested())
        zi_log(lg, ZI_LOG_WARN, "%s (pid %d) %s", c->name, (int)pid, how);
    else
        zi_log(lg, ZI_LOG_WARN, "%s (pid %d) %s; restarting in %lld ms", c->name, (int)pid, how,
               (long long)c->backoff_ms);
    c->restart_at_ms = now + c->backoff_ms;
    c->backoff_ms = c->backoff_ms * 2 > 8000 ? 8000 : c->backoff_ms * 2;
}

/* ---- managed models: --models-max, load_model, unload_model, keep_alive --
 *
 * serve is the supervisor and the router knows the requests, so serve asks
 * the router as a client: every DEMAND_POLL_MS a "models" op on the
 * router's client socket. A --load-on-demand router lists each model with
 * its waiting and active requests, its idle time and what is asked of it
 * ("want": load_model's "load"; unload_model's "unload", or its
 * keep_alive passed; docs/protocol.md). Each poll:
 *
 * - a loaded model asked to unload, with no request in flight, is
 *   unloaded: its children stopped with SIGTERM and kept down ("parked");
 *   one with requests in flight waits until they are done, so nothing in
 *   flight is lost;
 * - a model not loaded that has requests waiting, or is asked to load, is
 *   loaded (its children started) while fewer than the limit
 *   (--models-max, else every model) have processes; otherwise the loaded
 *   model with no request that has been idle the longest is unloaded
 *   first, and the waiting model loads once its processes have exited.
 *
 * The waiting requests wait in the router (up to --failover-timeout). A
 * model whose processes cannot start is told to the router (its
 * "model_failed" op, with the child's error): its waiting requests end at
 * once with that error, and new ones are refused with it. */

#define DEMAND_POLL_MS 200

typedef struct demand {
    const serve_opts *o;
    void *zctx, *sock;
    int64_t next_ms;  /* the next poll */
    int64_t asked_ms; /* when the outstanding models op went (0: none) */
    unsigned seq;
} demand;

/* Whether model k has a child running, or is loaded (not parked). */
static int model_running(const child *ch, int nc, int k) {
    for (int i = 0; i < nc; i++)
        if (ch[i].model == k && ch[i].pid > 0) return 1;
    return 0;
}
static int model_loaded(const child *ch, int nc, int k) {
    for (int i = 0; i < nc; i++)
        if (ch[i].model == k) return !ch[i].parked;
    return 0;
}

/* Whether model k could not start when loaded on demand (child_exited). */
static int model_broken(const child *ch, int nc, int k) {
    for (int i = 0; i < nc; i++)
        if (ch[i].model == k && ch[i].broken) return 1;
    return 0;
}

static void model_park(const zi_logger *lg, child *ch, int nc, const serve_opts *o, int k, int park,
                       int64_t idle_ms, int64_t waiting) {
    (void)idle_ms; /* the caller says why it unloads */
    if (!park)
        zi_log(lg, ZI_LOG_INFO, "loading model %s (%lld request(s) waiting)", o->models[k].name,
               (long long)waiting);
    for (int i = 0; i < nc; i++) {
        if (ch[i].model != k) continue;
        ch[i].parked = park;
        if (park && ch[i].pid > 0) kill(ch[i].pid, SIGTERM), ch[i].parked_ms = zi_now_ms();
        if (!park) ch[i].restart_at_ms = 0, ch[i].backoff_ms = 500, ch[i].fast_failures = 0;
    }
}

/* The index of the model an entry of the models reply names (o->n_models:
 * none of serve's). */
static int model_index(const serve_opts *o, const zi_im_model_entry *e) {
    int k = 0;
    while (k < o->n_models && (strlen(o->models[k].name) != e->name.n ||
                               memcmp(o->models[k].name, e->name.p, e->name.n)))
        k++;
    return k;
}

static int wants(const zi_im_model_entry *e, const char *w) {
    return e->want.n == strlen(w) && !memcmp(e->want.p, w, e->want.n);
}

/* One models reply: loads and unloads as the comment above says. */
static void demand_apply(const zi_logger *lg, child *ch, int nc, const serve_opts *o,
                         const zi_im_models *ms) {
    long long limit = o->on_demand ? o->models_max : o->n_models;
    for (size_t e = 0; e < ms->n; e++) { /* unloads asked for, once idle */
        int k = model_index(o, &ms->v[e]);
        if (k == o->n_models || !wants(&ms->v[e], "unload") || ms->v[e].active > 0 ||
            !model_loaded(ch, nc, k))
            continue;
        int64_t ka = ms->v[e].keep_alive_ms;
        if (ka >= 0 && ms->v[e].idle_ms >= ka)
            zi_log(lg, ZI_LOG_INFO, "unloading model %s (idle %lld ms: its keep_alive passed)",
                   o->models[k].name, (long long)ms->v[e].idle_ms);
        else
            zi_log(lg, ZI_LOG_INFO, "unloading model %s (asked)", o->models[k].name);
        model_park(lg, ch, nc, o, k, 1, ms->v[e].idle_ms, 0);
    }
    int busy = 0; /* models with processes, loaded or still stopping */
    for (int k = 0; k < o->n_models; k++)
        busy += model_loaded(ch, nc, k) || model_running(ch, nc, k);
    for (size_t e = 0; e < ms->n; e++) {
        int k = model_index(o, &ms->v[e]);
        if (k == o->n_models || model_loaded(ch, nc, k) || model_broken(ch, nc, k) ||
            (ms->v[e].waiting == 0 && !wants(&ms->v[e], "load")))
            continue;
        if (model_running(ch, nc, k)) continue; /* its processes still stopping */
        if (busy < limit) {
            model_park(lg, ch, nc, o, k, 0, 0, ms->v[e].waiting);
            busy++;
            continue;
        }
        /* The loaded model idle the longest, with no request of its own. */
        int victim = -1;
        int64_t idle = -1;
        for (size_t j = 0; j < ms->n; j++) {
            int v = model_index(o, &ms->v[j]);
            /* idle for two polls: a request admitted after the reply the
             * choice is made on has shown up by then */
            if (v == o->n_models || !model_loaded(ch, nc, v) || ms->v[j].active > 0 ||
                ms->v[j].waiting > 0 || ms->v[j].idle_ms < 2 * DEMAND_POLL_MS ||
                wants(&ms->v[j], "load"))
                continue;
            if (ms->v[j].idle_ms > idle) victim = v, idle = ms->v[j].idle_ms;
        }
        if (victim < 0) return; /* every loaded model is busy: the requests wait */
        zi_log(lg, ZI_LOG_INFO, "unloading model %s (idle %lld ms) to make room",
               o->models[victim].name, (long long)idle);
        model_park(lg, ch, nc, o, victim, 1, idle, 0);
        return; /* the waiting model loads once the victim's processes are gone */
    }
}

/* A poll: reads the replies that came, then asks again. */
static void demand_poll(const zi_logger *lg, demand *d, child *ch, int nc) {
    int64_t now = zi_now_ms();
    for (;;) { /* every reply that came (one at a time is asked) */
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, d->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            break;
        }
        msgpack_unpacked u;
        zi_error err = {0};
        zi_im_models *ms = malloc(sizeof *ms);
        if (ms &&
            zi_msgpack_parse(zmq_msg_data(&msg), zmq_msg_size(&msg), NULL, &u, &err) == ZI_OK) {
            /* only the reply to the latest ask: an older one (asked again
             * after 5 s) describes the models as they were */
            const msgpack_object *id = zi_map_get(&u.data, "id");
            char want[32];
            snprintf(want, sizeof want, "serve-%u", d->seq - 1);
            int latest = id && id->type == MSGPACK_OBJECT_STR && id->via.str.size == strlen(want) &&
                         !memcmp(id->via.str.ptr, want, id->via.str.size);
            if (latest && zi_im_models_unpack(&u.data, ms, &err) == ZI_OK)
                demand_apply(lg, ch, nc, d->o, ms);
            msgpack_unpacked_destroy(&u);
        }
        free(ms);
        zmq_msg_close(&msg);
        d->asked_ms = 0;
    }
    for (int i = 0; i < nc; i++) { /* a model that could not load, once */
        if (!ch[i].fail_pending || ch[i].model < 0) continue;
        zi_msg m;
        zi_msg_init(&m);
        msgpack_pack_map(&m.pk, 4);
        zi_pack_kv_str(&m.pk, "op", "model_failed");
        zi_pack_kv_str(&m.pk, "id", "serve-failed");
        zi_pack_kv_str(&m.pk, "model_name", d->o->models[ch[i].model].name);
        char why[ZI_ERROR_MSG_MAX]; /* one line of valid UTF-8, as the router takes it */
        zi_printable_max(why, sizeof why, ch[i].fail_msg, strlen(ch[i].fail_msg), sizeof why - 8);
        zi_pack_kv_str(&m.pk, "message", why);
        if (zmq_send(d->sock, m.sb.data, m.sb.size, ZMQ_DONTWAIT) >= 0) ch[i].fail_pending = 0;
        zi_msg_free(&m);
    }
    if (now < d->next_ms || (d->asked_ms && now - d->asked_ms < 5000)) return;
    d->next_ms = now + DEMAND_POLL_MS;
    char id[32];
    snprintf(id, sizeof id, "serve-%u", d->seq++);
    zi_msg m;
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 2);
    zi_pack_kv_str(&m.pk, "op", "models");
    zi_pack_kv_str(&m.pk, "id", id);
    if (zmq_send(d->sock, m.sb.data, m.sb.size, ZMQ_DONTWAIT) >= 0) d->asked_ms = now;
    zi_msg_free(&m);
}

/* Phase 4: start every child (but those of models not loaded), then reap
 * and restart them until a stop is requested (a signal, or a child that
 * cannot start: *why says which); with --models-max, load and unload
 * models as requests ask (d, NULL otherwise). Returns the exit status: 0,
 * or 1 when a child could not start. */
static int supervise(const zi_logger *lg, child *ch, int nc, demand *d, stop_reason *why) {
    int exit_status = 0;
    for (int i = 0; i < nc; i++) {
        ch[i].backoff_ms = 500;
        ch[i].startup_fd = -1;
        if (!ch[i].parked) spawn(lg, &ch[i]);
    }
    while (!zi_stop_requested()) {
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
            for (int i = 0; i < nc; i++)
                if (ch[i].pid == pid) child_exited(lg, ch, nc, &ch[i], status, &exit_status, why);
        if (d) demand_poll(lg, d, ch, nc);
        int64_t now = zi_now_ms();
        for (int i = 0; i < nc && !zi_stop_requested(); i++)
            if (ch[i].pid == 0 && !ch[i].parked && now >= ch[i].restart_at_ms) spawn(lg, &ch[i]);
        for (int i = 0; i < nc; i++) /* an unloaded model's process stuck in a pass */
            if (ch[i].parked && ch[i].pid > 0 && ch[i].parked_ms && now - ch[i].parked_ms > 5000) {
                zi_log(lg, ZI_LOG_WARN, "%s (pid %d) did not stop for its unload; killing it",
                       ch[i].name, (int)ch[i].pid);
                kill(ch[i].pid, SIGKILL);
                ch[i].parked_ms = 0;
            }
        sleep_ms(50);
    }
    return exit_status;
}

/* Phase 5: SIGTERM to every child, up to 5 s for them to exit, then
 * SIGKILL for what is left. */
static void stop_children(const zi_logger *lg, child *ch, int nc) {
    for (int i = 0; i < nc; i++)
        if (ch[i].pid > 0) kill(ch[i].pid, SIGTERM);
    int64_t deadline = zi_now_ms() + 5000;
    for (;;) {
        int left = 0;
        for (int i = 0; i < nc; i++) {
            if (ch[i].pid <= 0) continue;
            int status;
            pid_t r = waitpid(ch[i].pid, &status, WNOHANG);
            if (r == ch[i].pid || (r < 0 && errno == ECHILD)) {
                zi_log(lg, ZI_LOG_INFO, "%s (pid %d) stopped", ch[i].name, (int)ch[i].pid);
                ch[i].pid = 0;
                if (ch[i].startup_fd >= 0) close(ch[i].startup_fd);
                ch[i].startup_fd = -1;
            } else {
                left++;
            }
        }
        if (!left) break;
        if (zi_now_ms() > deadline) {
            for (int i = 0; i < nc; i++)
                if (ch[i].pid > 0) {
                    zi_log(lg, ZI_LOG_WARN, "%s (pid %d) did not stop; killing it", ch[i].name,
                           (int)ch[i].pid);
                    kill(ch[i].pid, SIGKILL);
                    waitpid(ch[i].pid, NULL, 0);
                    ch[i].pid = 0;
                }
            break;
        }
        sleep_ms(50);
    }
}

int zi_serve_main(int argc, char **argv) {
    zi_logger lg = {.out = stderr, .level = ZI_LOG_INFO, .tag = "zinfer-serve"};
    serve_opts o;
    memset(&o, 0, sizeof o);
    o.models = calloc(MAX_MODELS, sizeof *o.models);
    if (!o.models) {
        fprintf(stderr, "zinfer serve: out of memory\n");
        return 1;
    }
    int rc = parse_options(argc, argv, &o, &lg);
    if (rc == GO_ON) rc = validate_options(&o, &lg);
    if (rc == GO_ON && o.check_only) rc = 0; /* --check-args: all is valid, start nothing */
    if (rc == GO_ON) rc = check_memory(&o);
    if (rc == GO_ON) rc = find_binaries(&o);
    if (rc == GO_ON && o.http) {
        int from_template = o.tool_format == ZI_TF_AUTO;
        if (from_template) o.tool_format = tool_call_format(&o, 0);
        zi_log(&lg, ZI_LOG_INFO, "tool-call format: %s (%s)",
               zi_tool_format_name((zi_tool_format)o.tool_format),
               from_template ? "the chat template's" : "--tool-call-format");
        /* Several models, each with its own chat template: zinfer-http
         * reads each model's tool calls in that model's format. */
        size_t at = 0;
        for (int k = 1; from_template && !o.tmpl && k < o.n_models; k++) {
            if (!at) /* the default's too: "" means none passed */
                at +=
                    (size_t)snprintf(o.model_tools, sizeof o.model_tools, "%s=%s", o.models[0].name,
                                     zi_tool_format_name((zi_tool_format)o.tool_format));
            zi_tool_format f = tool_call_format(&o, k);
            if (at < sizeof o.model_tools)
                at += (size_t)snprintf(o.model_tools + at, sizeof o.model_tools - at, ",%s=%s",
                                       o.models[k].name, zi_tool_format_name(f));
            if (f != (zi_tool_format)o.tool_format)
                zi_log(&lg, ZI_LOG_INFO, "tool-call format of model %s: %s (its chat template's)",
                       o.models[k].name, zi_tool_format_name(f));
        }
    }
    child *ch = NULL;
    int nc = 0;
    char(*dev)[32] = NULL;
    if (rc == GO_ON) rc = plan_children(&o, &ch, &nc, &dev);
    if (rc != GO_ON) {
        free(o.models);
        return rc;
    }
    zi_stop_signals_install();
    for (int k = 0; k < o.n_models; k++)
        zi_log(&lg, ZI_LOG_INFO, "model %s%s: %s, %lld tokenizer(s), %lld worker(s) x %lld threads",
               o.models[k].name, k ? "" : " (the default)", o.models[k].path,
               o.models[k].tokenizers, o.models[k].workers, o.threads);
    zi_log(&lg, ZI_LOG_INFO, "serving %d model(s) on %s (backends %s; HTTP %s)", o.n_models, o.bind,
           o.backend, o.http ? o.http : "off");
    stop_reason why = {0};
    demand dm = {.o = &o}, *d = NULL;
    if (o.manage) { /* the router's client socket (docs above demand_apply) */
        dm.zctx = zmq_ctx_new();
        dm.sock = dm.zctx ? zmq_socket(dm.zctx, ZMQ_DEALER) : NULL;
        int linger = 0;
        if (dm.sock) zmq_setsockopt(dm.sock, ZMQ_LINGER, &linger, sizeof linger);
        if (dm.sock && zmq_connect(dm.sock, o.router_addr) == 0)
            d = &dm;
        else
            zi_log(&lg, ZI_LOG_ERROR, "--models-max: cannot reach the router at %s: %s",
                   o.router_addr, zmq_strerror(zmq_errno()));
        if (o.on_demand)
            zi_log(&lg, ZI_LOG_INFO, "--models-max %lld: models load when a request names them",
                   o.models_max);
    }
    int exit_status = supervise(&lg, ch, nc, d, &why);
    if (dm.sock) zmq_close(dm.sock);
    if (dm.zctx) zmq_ctx_term(dm.zctx);
    zi_log(&lg, exit_status ? ZI_LOG_ERROR : ZI_LOG_INFO, "stopping");
    stop_children(&lg, ch, nc);
    /* Last, after the children's shutdown lines: why it stopped. */
    if (why.text[0]) zi_log(&lg, ZI_LOG_ERROR, "%s", why.text);
    free(ch);
    free(dev);
    free(o.models);
    return exit_status;
}
