/*
 * stop_signal.c - see stop_signal.h.
 */
#include "stop_signal.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t stop_flag;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

void zi_stop_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal; /* no SA_RESTART: a blocking poll returns */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

bool zi_stop_requested(void) {
    return stop_flag != 0;
}

void zi_stop_request(void) {
    stop_flag = 1;
}
