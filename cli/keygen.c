/*
 * keygen.c - `zinfer keygen`: a new ZeroMQ CURVE key pair in two files
 * (keygen.h; the file format is protocol/curve.h's).
 */
#include "keygen.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "curve.h"

static const char USAGE[] =
    "usage: zinfer keygen OUT [--force]\n"
    "\n"
    "Writes a new CURVE key pair: OUT.key, the secret key (mode 0600), and\n"
    "OUT.pub, its public key, each one Z85 line after '#' comments. Give the\n"
    "secret key to the process that owns it (--curve-secret), list the public\n"
    "key where that process must be let in (the router's --backend-keys or\n"
    "--client-keys), and give the router's public key to the processes that\n"
    "connect to it (--router-key). For `zinfer serve --keys DIR`:\n"
    "  zinfer keygen DIR/router && zinfer keygen DIR/worker\n"
    "See docs/security.md.\n"
    "\n"
    "  --force     replace existing files\n"
    "  -h, --help  this text\n";

int zi_keygen_main(int argc, char **argv) {
    const char *out = NULL;
    bool force = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (!strcmp(a, "--force")) {
            force = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "zinfer keygen: unknown option '%s' (see zinfer keygen --help)\n", a);
            return 2;
        } else if (out) {
            fprintf(stderr, "zinfer keygen: one OUT only ('%s' and '%s')\n", out, a);
            return 2;
        } else {
            out = a;
        }
    }
    if (!out) {
        fputs(USAGE, stderr);
        return 2;
    }
    zi_error err = {0};
    zi_curve_key pub;
    if (zi_curve_keygen(out, force, &pub, &err) != ZI_OK) {
        fprintf(stderr, "zinfer keygen: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s.key (secret) and %s.pub (public key %s)\n", out, out, pub.z85);
    return 0;
}
