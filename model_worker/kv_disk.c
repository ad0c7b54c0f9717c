/*
 * kv_disk.c - see kv_disk.h.
 *
 * The queue is a ring of slots, each a block's hash, parent, tokens and
 * payload buffer (allocated on first use). The generator's thread is its
 * only producer: it fills the slot past the last queued one without the
 * lock (the writer never touches it) and publishes it under the lock.
 * The writer takes slots from the head, one file each.
 *
 * A file: file_header, block_size int32 tokens, the payload. header_sum
 * covers the header (header_sum itself as 0) and the tokens; payload_sum
 * the payload. Both are a 64-bit multiply-rotate hash (xxHash64's rounds),
 * several GB/s: a 4k-token prefix of a small model reads back in tens of
 * milliseconds, checksum included.
 */
#include "kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- hashing ---- */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t rotl(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static uint64_t round64(uint64_t acc, uint64_t in) {
    return rotl(acc + in * P2, 31) * P1;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* xxHash64 of n bytes (the values it gives on little-endian machines). */
static uint64_t hash_bytes(const void *data, size_t n, uint64_t seed) {
    const uint8_t *p = data, *end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        for (; p + 32 <= end; p += 32) {
            v1 = round64(v1, rd64(p));
            v2 = round64(v2, rd64(p + 8));
            v3 = round64(v3, rd64(p + 16));
            v4 = round64(v4, rd64(p + 24));
        }
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        uint64_t vs[4] = {v1, v2, v3, v4};
        for (int i = 0; i < 4; i++) h = (h ^ round64(0, vs[i])) * P1 + P4;
    } else {
        h = seed + P5;
    }
    h += (uint64_t)n;
    for (; p + 8 <= end; p += 8) h = rotl(h ^ round64(0, rd64(p)), 27) * P1 + P4;
    if (p + 4 <= end) {
        uint32_t v;
        memcpy(&v, p, 4);
        h = rotl(h ^ ((uint64_t)v * P1), 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl(h ^ (*p * P5), 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    return h ^ (h >> 32);
}

static uint64_t mix(uint64_t h, uint64_t v) {
    return hash_bytes(&v, sizeof v, h);
}

/* Bytes of one metadata scalar of GGUF type t (0: not a fixed-size one). */
static size_t scalar_bytes(zi_gguf_type t) {
    switch ((int)t) {
    case 0:
    case 1:
    case 7:
        return 1; /* uint8, int8, bool */
    case 2:
    case 3:
        return 2;
    case 4:
    case 5:
    case 6:
        return 4;
    case 10:
    case 11:
    case 12:
        return 8;
    default:
        return 0;
    }
}

uint64_t zi_kv_disk_model_id(const zi_gguf *g) {
    uint64_t h = mix(0x7a696e6665722d6bULL, (uint64_t)zi_gguf_file_size(g));
    for (uint64_t i = 0, n = zi_gguf_kv_count(g); i < n; i++) {
        const zi_gguf_kv *kv = zi_gguf_kv_at(g, i);
        h = hash_bytes(kv->key.ptr, kv->key.len, mix(h, (uint64_t)kv->type));
        if (kv->type == ZI_GGUF_STRING) {
            h = hash_bytes(kv->str.ptr, kv->str.len, h);
        } else if (kv->type == ZI_GGUF_ARRAY) {
            h = mix(mix(h, (uint64_t)kv->arr_type), kv->arr_len);
            size_t eb = scalar_bytes(kv->arr_type);
            if (eb && kv->arr_len < ((uint64_t)1 << 40) / eb)
                h = hash_bytes(kv->data, (size_t)kv->arr_len * eb, h);
        } else if (scalar_bytes(kv->type)) {
            h = hash_bytes(kv->data, scalar_bytes(kv->type), h);
        }
    }
    for (uint64_t i = 0, n = zi_gguf_tensor_count(g); i < n; i++) {
        const zi_gguf_tensor *t = zi_gguf_tensor_at(g, i);
        h = hash_bytes(t->name.ptr, t->name.len, mix(h, (uint64_t)t->type));
        h = hash_bytes(t->ne, sizeof t->ne, mix(mix(h, t->offset), t->nbytes));
        if (!t->data || !t->nbytes) continue;
        size_t k = t->nbytes < 256 ? (size_t)t->nbytes : 256;
        h = hash_bytes(t->data, k, h);
        h = hash_bytes((const uint8_t *)t->data + t->nbytes - k, k, h);
    }
    return h;
}

uint64_t zi_kv_disk_payload_bytes(const zi_kv_disk_identity *id) {
    return (uint64_t)id->n_layers * (id->k_bytes + id->v_bytes);
}

/* ---- the file ---- */

static const char MAGIC[8] = {'Z', 'I', 'K', 'V', 'B', 'L', 'K', '\n'};

typedef struct file_header {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes; /* sizeof(file_header) */
    zi_kv_disk_identity id;
    uint64_t hash, parent;
    uint64_t payload_bytes;
    uint64_t payload_sum;
    uint64_t header_sum;
} file_header;

_Static_assert(sizeof(zi_kv_disk_identity) == 88, "the identity has no padding");
_Static_assert(sizeof(file_header) == 144, "the header has no padding");

uint64_t zi_kv_disk_file_bytes(const zi_kv_disk_identity *id) {
    return sizeof(file_header) + (uint64_t)id->block_size * sizeof(int32_t) +
           zi_kv_disk_payload_bytes(id);
}

/* Kinds of problems, each logged once. */
enum {
    PB_CORRUPT,
    PB_TRUNCATED,
    PB_FOREIGN,
    PB_STALE,
    PB_READ,
    PB_DIR,
    PB_READONLY,
    PB_FULL,
    PB_WRITE,
    PB_TOO_BIG,
    PB_DIR_ID,
    PB_COUNT
};

typedef struct slot {
    uint64_t hash, parent;
    int32_t *tokens;
    void *payload;
} slot;

struct zi_kv_disk {
    char *dir;
    uint64_t max_bytes;
    zi_kv_disk_identity id;
    uint64_t id_hash;
    uint64_t share_id; /* zi_kv_disk_share_id (0: the directory has no id) */
    size_t payload, file_bytes;
    const zi_logger *log;
    /* the queue */
    slot *slots;
    int n_slots, head, count, busy, stop;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    pthread_t writer;
    int started;
    /* under mu */
    zi_kv_disk_stats st;
    uint8_t logged[PB_COUNT];
    /* the writer's own */
    uint64_t seq;
    int writes_since_scan;
};

static void problem(zi_kv_disk *d, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void problem(zi_kv_disk *d, int kind, const char *fmt, ...) {
    pthread_mutex_lock(&d->mu);
    int first = !d->logged[kind];
    d->logged[kind] = 1;
    pthread_mutex_unlock(&d->mu);
    if (!first) return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zi_log(d->log, ZI_LOG_WARN, "kv disk tier: %s (logged once)", msg);
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void zi_kv_disk_path(const zi_kv_disk *d, uint64_t hash, char *out, size_t cap) {
    snprintf(out, cap, "%s/zkv-%016llx-%016llx.blk", d->dir, (unsigned long long)d->id_hash,
             (unsigned long long)hash);
}

static uint64_t header_checksum(const file_header *h, const int32_t *tokens, uint32_t bs) {
    file_header c = *h;
    c.header_sum = 0;
    return hash_bytes(tokens, (size_t)bs * sizeof *tokens, hash_bytes(&c, sizeof c, 0));
}

/* ---- the directory's bound ---- */

typedef struct dent {
    char name[64];
    struct timespec mtime;
    uint64_t size;
} dent;

static int dent_older(const void *a, const void *b) {
    const dent *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Measures DIR (every worker's block files), removes temporary files older
 * than a minute, and when the files pass the bound removes the least
 * recently used ones down to 90% of it. Writer thread only. */
static void scan_and_trim(zi_kv_disk *d) {
    DIR *dir = opendir(d->dir);
    if (!dir) return; /* the write that follows reports the problem */
    dent *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(dir));) {
        int tmp = !strncmp(e->d_name, ".zkv-tmp-", 9);
        size_t len = strlen(e->d_name);
        if (!tmp && (strncmp(e->d_name, "zkv-", 4) || len < 8 || len >= sizeof v->name ||
                     strcmp(e->d_name + len - 4, ".blk")))
            continue;
        struct stat sb;
        if (fstatat(dirfd(dir), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) || !S_ISREG(sb.st_mode))
            continue;
        if (tmp) {
            if (now - sb.st_mtime > 60) unlinkat(dirfd(dir), e->d_name, 0);
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 256;
            dent *nv = realloc(v, nc * sizeof *v);
            if (!nv) break;
            v = nv, cap = nc;
        }
        memcpy(v[n].name, e->d_name, len + 1);
        v[n].mtime = sb.st_mtim;
        v[n].size = (uint64_t)sb.st_size;
        total += v[n].size;
        n++;
    }
    if (total > d->max_bytes && n > 0) {
        qsort(v, n, sizeof *v, dent_older);
        uint64_t target = d->max_bytes / 10 * 9;
        for (size_t i = 0; i < n && total > target; i++)
            if (!unlinkat(dirfd(dir), v[i].name, 0) || errno == ENOENT) total -= v[i].size;
    }
    closedir(dir);
    free(v);
    pthread_mutex_lock(&d->mu);
    d->st.bytes = total;
    pthread_mutex_unlock(&d->mu);
    d->writes_since_scan = 0;
}

/* ---- writing ---- */

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static void write_failed(zi_kv_disk *d, const char *what, const char *path, int e) {
    int kind = e == EROFS || e == EACCES || e == EPERM ? PB_READONLY
               : e == ENOSPC || e == EDQUOT            ? PB_FULL
                                                       : PB_WRITE;
    problem(d, kind, "cannot %s %s: %s; blocks are not kept on disk while this lasts", what, path,
            strerror(e));
}

/* Writes one queued block as its file. 1: written, 0: there already,
 * -1: not written (logged). */
static int write_block(zi_kv_disk *d, const slot *s) {
    char path[4096], tmp[4096];
    zi_kv_disk_path(d, s->hash, path, sizeof path);
    if (d->file_bytes > d->max_bytes) {
        problem(d, PB_TOO_BIG, "a block's file (%zu bytes) is larger than --kv-disk-bytes (%llu)",
                d->file_bytes, (unsigned long long)d->max_bytes);
        return -1;
    }
    if (access(path, F_OK) == 0) { /* another worker, or an earlier life, wrote it */
        utimensat(AT_FDCWD, path, NULL, 0);
        return 0;
    }
    file_header h = {.version = ZI_KV_DISK_VERSION,
                     .header_bytes = sizeof h,
                     .id = d->id,
                     .hash = s->hash,
                     .parent = s->parent,
                     .payload_bytes = d->payload};
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    h.payload_sum = hash_bytes(s->payload, d->payload, 0);
    h.header_sum = header_checksum(&h, s->tokens, d->id.block_size);
    snprintf(tmp, sizeof tmp, "%s/.zkv-tmp-%ld-%llu", d->dir, (long)getpid(),
             (unsigned long long)d->seq++);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        write_failed(d, "create", tmp, errno);
        return -1;
    }
    int rc = write_all(fd, &h, sizeof h);
    if (!rc) rc = write_all(fd, s->tokens, (size_t)d->id.block_size * sizeof *s->tokens);
    if (!rc) rc = write_all(fd, s->payload, d->payload);
    int e = errno;
    if (close(fd) && !rc) rc = -1, e = errno;
    if (!rc && rename(tmp, path)) rc = -1, e = errno;
    if (rc) {
        unlink(tmp);
        write_failed(d, "write", path, e ? e : EIO);
        return -1;
    }
    return 1;
}

static void *writer_main(void *arg) {
    zi_kv_disk *d = arg;
    scan_and_trim(d);
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (d->count == 0 && !d->stop) pthread_cond_wait(&d->work, &d->mu);
        if (d->count == 0) break; /* stopped, and everything written */
        slot *s = &d->slots[d->head];
        d->busy = 1;
        pthread_mutex_unlock(&d->mu);
        uint64_t t0 = now_us();
        int ok = write_block(d, s);
        uint64_t dt = now_us() - t0;
        pthread_mutex_lock(&d->mu);
        d->st.write_us += dt;
        if (ok > 0) {
            d->st.written_blocks++;
            d->st.bytes += d->file_bytes;
        } else if (ok < 0) {
            d->st.dropped_writes++;
        }
        int trim = ok > 0 && (d->st.bytes > d->max_bytes || ++d->writes_since_scan >= 256);
        if (trim) {
            pthread_mutex_unlock(&d->mu);
            scan_and_trim(d);
            pthread_mutex_lock(&d->mu);
        }
        d->head = (d->head + 1) % d->n_slots;
        d->count--;
        d->busy = 0;
        pthread_cond_broadcast(&d->idle);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* The id in DIR's id file: 16 hex digits (0: none, or not one). */
static uint64_t read_dir_id(const char *path) {
    char buf[40] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 16);
    if (errno || end != buf + 16 || (*end && *end != '\n')) return 0;
    return (uint64_t)v;
}

/* DIR's id (ZI_KV_DISK_DIR_ID_FILE), the file created with a random one
 * when missing. It is written under a temporary name and linked into
 * place, which fails when it exists: two workers starting on one
 * directory (or on one network share from two hosts) end up with the
 * first one's id, whole. 0 when it can be neither read nor made. */
static uint64_t dir_id(zi_kv_disk *d) {
    char path[4200], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", d->dir, ZI_KV_DISK_DIR_ID_FILE);
    uint64_t id = read_dir_id(path);
    if (id) return id;
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = mix(now_us(), (uint64_t)getpid());
    r = r ? r : 1;
    snprintf(tmp, sizeof tmp, "%s/.zkv-tmp-id-%ld-%llu", d->dir, (long)getpid(),
             (unsigned long long)(d->seq & 0xffffffffffffULL));
    char text[24];
    int n = snprintf(text, sizeof text, "%016llx\n", (unsigned long long)r);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
        int ok = write(fd, text, (size_t)n) == n;
        if (close(fd) == 0 && ok && link(tmp, path) && errno != EEXIST) {
            /* a file system without hard links: create it in place */
            int e = errno, fd2 = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
            if (fd2 >= 0) {
                if (write(fd2, text, (size_t)n) != n) e = errno;
                close(fd2);
            } else if (errno != EEXIST) {
                problem(d, PB_DIR_ID, "cannot create %s: %s", path, strerror(e));
            }
        }
        unlink(tmp);
    }
    id = read_dir_id(path);
    if (!id)
        problem(d, PB_DIR_ID,
                "no id in %s: the router cannot tell which workers share this directory", path);
    return id;
}

uint64_t zi_kv_disk_share_id(const zi_kv_disk *d) {
    return d->share_id;
}

int zi_kv_disk_open(const char *dir, uint64_t max_bytes, uint64_t queue_bytes,
                    const zi_kv_disk_identity *id, const zi_logger *log, zi_kv_disk **out,
                    zi_error *err) {
    *out = NULL;
    uint64_t payload = zi_kv_disk_payload_bytes(id);
    if (!dir || !*dir || max_bytes == 0 || id->block_size < 1 || id->block_size > 4096 ||
        payload == 0 || payload > ((uint64_t)1 << 34))
        return zi_error_set(err, ZI_EINVAL,
                            "kv disk tier: directory '%s', %llu bytes, blocks of %u tokens and "
                            "%llu bytes: out of range",
                            dir ? dir : "", (unsigned long long)max_bytes, id->block_size,
                            (unsigned long long)payload);
    zi_kv_disk *d = calloc(1, sizeof *d);
    if (!d) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    d->dir = strdup(dir);
    d->max_bytes = max_bytes;
    d->id = *id;
    d->log = log;
    d->payload = (size_t)payload;
    d->file_bytes = (size_t)zi_kv_disk_file_bytes(id);
    d->id_hash = hash_bytes(&d->id, sizeof d->id, ZI_KV_DISK_VERSION);
    /* temporary names: the pid and this, so that writers on two hosts with
     * the same pid (a directory on a network file system) do not meet */
    d->seq = mix(now_us(), (uint64_t)getpid()) & 0xffffffffffffULL;
    uint64_t n = queue_bytes / (d->payload + (size_t)id->block_size * sizeof(int32_t));
    d->n_slots = n < 4 ? 4 : n > 4096 ? 4096 : (int)n;
    d->slots = calloc((size_t)d->n_slots, sizeof *d->slots);
    if (!d->dir || !d->slots) {
        zi_kv_disk_close(d);
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->idle, NULL);
    d->started = -1; /* the mutex and conditions exist */
    if (mkdir(dir, 0755) && errno != EEXIST)
        problem(d, PB_DIR, "cannot create the directory %s: %s", dir, strerror(errno));
    uint64_t did = dir_id(d);
    d->share_id = did ? mix(did, d->id_hash) | 1 : 0;
    int e = pthread_create(&d->writer, NULL, writer_main, d);
    if (e) {
        zi_kv_disk_close(d);
        return zi_error_set(err, ZI_ENOMEM, "kv disk tier: cannot start its writer: %s",
                            strerror(e));
    }
    d->started = 1;
    *out = d;
    return ZI_OK;
}

void zi_kv_disk_close(zi_kv_disk *d) {
    if (!d) return;
    if (d->started == 1) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_signal(&d->work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->writer, NULL);
    }
    if (d->started) {
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->work);
        pthread_cond_destroy(&d->idle);
    }
    for (int i = 0; d->slots && i < d->n_slots; i++) {
        free(d->slots[i].tokens);
        free(d->slots[i].payload);
    }
    free(d->slots);
    free(d->dir);
    free(d);
}

void *zi_kv_disk_write_begin(zi_kv_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    pthread_mutex_lock(&d->mu);
    int full = d->count == d->n_slots;
    int at = (d->head + d->count) % d->n_slots;
    if (full) d->st.dropped_writes++;
    pthread_mutex_unlock(&d->mu);
    if (full) return NULL;
    slot *s = &d->slots[at]; /* past the queued ones: the writer does not touch it */
    if (!s->payload) {
        s->tokens = malloc((size_t)d->id.block_size * sizeof *s->tokens);
        s->payload = malloc(d->payload);
        if (!s->tokens || !s->payload) {
            free(s->tokens);
            free(s->payload);
            s->tokens = s->payload = NULL;
            pthread_mutex_lock(&d->mu);
            d->st.dropped_writes++;
            pthread_mutex_unlock(&d->mu);
            return NULL;
        }
    }
    s->hash = hash;
    s->parent = parent;
    memcpy(s->tokens, tokens, (size_t)d->id.block_size * sizeof *tokens);
    return s->payload;
}

void zi_kv_disk_write_commit(zi_kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    d->count++;
    pthread_cond_signal(&d->work);
    pthread_mutex_unlock(&d->mu);
}

void zi_kv_disk_flush(zi_kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    while (d->count > 0 || d->busy) pthread_cond_wait(&d->idle, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void zi_kv_disk_get_stats(zi_kv_disk *d, zi_kv_disk_stats *out) {
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    pthread_mutex_unlock(&d->mu);
}

/* ---- reading ---- */

static int read_all(int fd, void *p, size_t n, off_t off) {
    char *c = p;
    while (n > 0) {
        ssize_t r = pread(fd, c, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static int same_layout(const zi_kv_disk_identity *a, const zi_kv_disk_identity *b) {
    return !memcmp(a->kv_tag, b->kv_tag, sizeof a->kv_tag) && a->block_size == b->block_size &&
           a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->k_bytes == b->k_bytes && a->v_bytes == b->v_bytes;
}

/* A file that must not be loaded: counted, logged once for its kind, and
 * removed so that a good one can take its place. */
static int reject(zi_kv_disk *d, int kind, const char *path, const char *why) {
    static const char *const names[] = {[PB_CORRUPT] = "corrupt",
                                        [PB_TRUNCATED] = "truncated",
                                        [PB_FOREIGN] = "another model's",
                                        [PB_STALE] = "stale"};
    pthread_mutex_lock(&d->mu);
    d->st.rejected++;
    pthread_mutex_unlock(&d->mu);
    problem(d, kind, "ignored %s file %s (%s); the prefix is computed instead", names[kind], path,
            why);
    unlink(path);
    return 0;
}

static int read_block(zi_kv_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
                      void *payload) {
    char path[4096];
    zi_kv_disk_path(d, hash, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            problem(d, PB_READ, "cannot read %s: %s", path, strerror(errno));
        return 0;
    }
    const uint32_t bs = d->id.block_size;
    const size_t tok_bytes = (size_t)bs * sizeof(int32_t), head = sizeof(file_header) + tok_bytes;
    int32_t *ftok = malloc(tok_bytes);
    file_header h;
    struct stat sb;
    int ok = 0;
    if (!ftok || fstat(fd, &sb)) {
        problem(d, PB_READ, "cannot read %s: %s", path, ftok ? strerror(errno) : "out of memory");
    } else if ((uint64_t)sb.st_size < head) {
        reject(d, PB_TRUNCATED, path, "shorter than its header");
    } else if (read_all(fd, &h, sizeof h, 0) || read_all(fd, ftok, tok_bytes, sizeof h)) {
        problem(d, PB_READ, "cannot read %s: %s", path, strerror(errno));
    } else if (memcmp(h.magic, MAGIC, sizeof MAGIC)) {
        reject(d, PB_CORRUPT, path, "bad magic");
    } else if (h.version != ZI_KV_DISK_VERSION || h.header_bytes != sizeof h) {
        reject(d, PB_STALE, path, "another format version");
    } else if (h.header_sum != header_checksum(&h, ftok, bs)) {
        if (h.id.model != d->id.model)
            reject(d, PB_FOREIGN, path, "another model file");
        else if (!same_layout(&h.id, &d->id))
            reject(d, PB_STALE, path, "another KV type or layout");
        else
            reject(d, PB_CORRUPT, path, "header checksum mismatch");
    } else if (h.id.model != d->id.model) {
        reject(d, PB_FOREIGN, path, "another model file");
    } else if (!same_layout(&h.id, &d->id) || h.payload_bytes != d->payload) {
        reject(d, PB_STALE, path, "another KV type or layout");
    } else if (h.hash != hash) {
        reject(d, PB_CORRUPT, path, "its hash is not its name's");
    } else if (h.parent != parent || memcmp(ftok, tokens, tok_bytes)) {
        ok = 0; /* another prefix with the same 64-bit hash: a miss */
    } else if ((uint64_t)sb.st_size < head + d->payload) {
        reject(d, PB_TRUNCATED, path, "shorter than its payload");
    } else if ((uint64_t)sb.st_size > head + d->payload) {
        reject(d, PB_CORRUPT, path, "longer than its payload");
    } else if (read_all(fd, payload, d->payload, (off_t)head)) {
        problem(d, PB_READ, "cannot read %s: %s", path, strerror(errno));
    } else if (hash_bytes(payload, d->payload, 0) != h.payload_sum) {
        reject(d, PB_CORRUPT, path, "payload checksum mismatch");
    } else {
        ok = 1;
        futimens(fd, NULL); /* recently used: the bound removes it last */
    }
    free(ftok);
    close(fd);
    return ok;
}

int zi_kv_disk_read(zi_kv_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
                    void *payload) {
    uint64_t t0 = now_us();
    int ok = read_block(d, hash, parent, tokens, payload);
    uint64_t dt = now_us() - t0;
    pthread_mutex_lock(&d->mu);
    d->st.read_us += dt;
    if (ok)
        d->st.hit_blocks++;
    else
        d->st.miss_blocks++;
    pthread_mutex_unlock(&d->mu);
    return ok;
}
