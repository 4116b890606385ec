/* Context-switch-heavy benchmark target: two threads pass a byte back and forth over two pipes, so
 * each round trip is two blocking reads and (on a busy or single CPU) two context switches. Prints
 * "elapsed_s round_trips_per_s cpu_s" on stdout (cpu_s: the process's user + system time, where the
 * BPF programs run at its switches are counted). Usage: pingpong ROUND_TRIPS [WORK]: each thread runs WORK
 * steps of an integer recurrence before each write (the bench sets it so the pair switches at a given rate). */
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static long trips = 100000;
static long work;
static volatile unsigned long sink;

static void busy(void)
{
    unsigned long x = sink;
    for (long i = 0; i < work; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
}

static void *responder(void *arg)
{
    char byte;
    (void)arg;
    for (long i = 0; i < trips; i++)
        if (read(ping[0], &byte, 1) != 1 || (busy(), write(pong[1], &byte, 1)) != 1)
            exit(2);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        trips = atol(argv[1]);
    if (argc > 2)
        work = atol(argv[2]);
    if (pipe(ping) != 0 || pipe(pong) != 0)
        return 2;
    pthread_t thread;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (pthread_create(&thread, NULL, responder, NULL) != 0)
        return 2;
    char byte = 'x';
    for (long i = 0; i < trips; i++)
        if ((busy(), write(ping[1], &byte, 1)) != 1 || read(pong[0], &byte, 1) != 1)
            return 2;
    pthread_join(thread, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 1e-6;
    printf("%.6f %.0f %.6f\n", seconds, trips / seconds, cpu);
    return 0;
}
