/* Two threads with known work, for the per-thread (tid) report:
 *   threads SECONDS   the main thread burns SECONDS of CPU in main_work, a second thread as much in
 *                     worker_work; prints "main TID worker TID".
 * Each function runs on one thread only, so each has exactly one tid and about half of the samples. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "burn.h"

BURN_FUNCTION(main_work)
BURN_FUNCTION(worker_work)

static double seconds;
static pid_t worker_tid;

static void *worker(void *arg)
{
    (void)arg;
    worker_tid = gettid();
    worker_work(seconds);
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t thread;
    seconds = argc > 1 ? atof(argv[1]) : 1.0;
    if (pthread_create(&thread, NULL, worker, NULL) != 0)
        return 1;
    main_work(seconds);
    pthread_join(thread, NULL);
    printf("main %d worker %d\n", (int)gettid(), (int)worker_tid);
    return 0;
}
