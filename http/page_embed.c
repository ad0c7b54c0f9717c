/*
 * page_embed.c - a build tool, run by meson (not installed): writes the
 * chat page's files (http/page/) into a C file as byte arrays, the table
 * zi_http_page_files of http_page.h, so zinfer-http serves the page with
 * no source tree at hand. Plain C, so the build needs no xxd or script
 * interpreter.
 *
 *   page_embed OUT.c FILE...
 *
 * Each FILE is named in the table by its base name. Exit 0, or 1 with a
 * message naming the file that could not be read or written.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The part of path after its last '/'. */
static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Writes one file as `static const unsigned char fK[]`, 16 bytes a line;
 * *size gets its length. 0, or -1 with the message printed. */
static int write_array(FILE *out, int k, const char *path, size_t *size) {
    FILE *in = fopen(path, "rb");
    if (!in) {
        fprintf(stderr, "page_embed: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(out, "/* %s */\nstatic const unsigned char f%d[] = {", path, k);
    size_t n = 0;
    int c;
    while ((c = fgetc(in)) != EOF) {
        fprintf(out, "%s0x%02x,", n % 16 ? "" : "\n    ", (unsigned)c);
        n++;
    }
    /* a NUL after the bytes (not counted), so no array is empty */
    fprintf(out, "%s0x00};\n\n", n % 16 ? "" : "\n    ");
    int bad = ferror(in);
    fclose(in);
    if (bad) {
        fprintf(stderr, "page_embed: %s: read error\n", path);
        return -1;
    }
    *size = n;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: page_embed OUT.c FILE...\n");
        return 1;
    }
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        fprintf(stderr, "page_embed: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    fprintf(out, "/* Written by http/page_embed.c at build time from http/page/. */\n"
                 "#include \"http_page.h\"\n\n");
    size_t sizes[64];
    int n = argc - 2;
    if (n > (int)(sizeof sizes / sizeof sizes[0])) {
        fprintf(stderr, "page_embed: at most %zu files\n", sizeof sizes / sizeof sizes[0]);
        fclose(out);
        return 1;
    }
    for (int k = 0; k < n; k++)
        if (write_array(out, k, argv[k + 2], &sizes[k])) {
            fclose(out);
            remove(argv[1]);
            return 1;
        }
    fprintf(out, "const zi_http_page_file zi_http_page_files[] = {\n");
    for (int k = 0; k < n; k++)
        fprintf(out, "    {\"%s\", f%d, %zu},\n", base_name(argv[k + 2]), k, sizes[k]);
    fprintf(out, "    {0, 0, 0},\n};\n");
    if (fclose(out)) {
        fprintf(stderr, "page_embed: %s: %s\n", argv[1], strerror(errno));
        remove(argv[1]);
        return 1;
    }
    return 0;
}
