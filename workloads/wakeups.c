/* Ground truth for off-CPU time joined to its wakers (record --off-cpu --wakers), built without frame
 * pointers: two producer/consumer pairs, each consumer waiting in a function of its own for what its
 * producer hands over from a function of its own, so the waker's stack at each wake-up is known.
 *
 *   consumer waits in take_item (pthread_cond_wait) for items producer makes: it burns 20 ms of CPU per
 *   item (scale 1.0), then publish_item signals the condition variable.
 *   pipe_consumer waits in read_byte (read) for bytes pipe_producer writes from write_byte after sleeping
 *   30 ms each.
 *
 * Each consumer measures its blocked time (around its waits) and the program prints the roles' times as one
 * JSON line on stderr at exit. Arguments: scale (default 1.0), items (default 100). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "burn.h"

static double scale = 1.0;
static int items = 100;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER;
static int queued, done;
static int pipe_fds[2];
static double consumer_blocked, pipe_consumer_blocked;

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

BURN_FUNCTION(burn_cpu)

__attribute__((noinline)) void publish_item(void)
{
    pthread_mutex_lock(&lock);
    queued++;
    pthread_cond_signal(&ready);
    pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) void *producer(void *arg)
{
    (void)arg;
    for (int i = 0; i < items; i++) {
        burn_cpu(0.02 * scale);
        publish_item();
    }
    pthread_mutex_lock(&lock);
    done = 1;
    pthread_cond_signal(&ready);
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* 1 with an item taken, 0 when the producer is done; the time it waited is added to *blocked. */
__attribute__((noinline)) int take_item(double *blocked)
{
    pthread_mutex_lock(&lock);
    double t0 = wall_now();
    while (!queued && !done)
        pthread_cond_wait(&ready, &lock);
    *blocked += wall_now() - t0;
    int got = queued > 0;
    if (got)
        queued--;
    pthread_mutex_unlock(&lock);
    return got;
}

__attribute__((noinline)) void *consumer(void *arg)
{
    (void)arg;
    while (take_item(&consumer_blocked))
        ;
    return NULL;
}

__attribute__((noinline)) void write_byte(int fd)
{
    char byte = 1;
    if (write(fd, &byte, 1) != 1)
        exit(2);
}

__attribute__((noinline)) void *pipe_producer(void *arg)
{
    (void)arg;
    for (int i = 0; i < items / 2; i++) {
        struct timespec ts = {0, (long)(0.03 * scale * 1e9)};
        while (nanosleep(&ts, &ts) != 0)
            ;
        write_byte(pipe_fds[1]);
    }
    close(pipe_fds[1]);
    return NULL;
}

/* 1 with a byte read, 0 at the end of the pipe. */
__attribute__((noinline)) int read_byte(int fd, double *blocked)
{
    char byte;
    double t0 = wall_now();
    ssize_t got = read(fd, &byte, 1);
    *blocked += wall_now() - t0;
    return got == 1;
}

__attribute__((noinline)) void *pipe_consumer(void *arg)
{
    (void)arg;
    while (read_byte(pipe_fds[0], &pipe_consumer_blocked))
        ;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        scale = atof(argv[1]);
    if (argc > 2)
        items = atoi(argv[2]);
    if (scale <= 0 || items <= 0 || pipe(pipe_fds) != 0)
        return 2;
    struct { const char *name; void *(*run)(void *); pthread_t thread; } roles[] = {
        {"consumer", consumer}, {"producer", producer}, {"pipe_consumer", pipe_consumer},
        {"pipe_producer", pipe_producer},
    };
    double t0 = wall_now();
    for (int i = 0; i < 4; i++) {
        pthread_create(&roles[i].thread, NULL, roles[i].run, NULL);
        pthread_setname_np(roles[i].thread, roles[i].name);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(roles[i].thread, NULL);
    fprintf(stderr, "{\"consumer\": {\"blocked\": %.6f}, \"pipe_consumer\": {\"blocked\": %.6f}, \"wall\": %.6f}\n",
            consumer_blocked, pipe_consumer_blocked, wall_now() - t0);
    return 0;
}
