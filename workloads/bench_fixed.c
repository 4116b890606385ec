/* Fixed-work target for the profiler overhead benchmark (bench/bench_profile.py).
 * Usage: bench-fixed ITERATIONS
 * Prints "ready", waits for a line on stdin (so a profiler can attach first), runs ITERATIONS
 * steps of an integer recurrence four calls deep (so stack walks have real frames to follow), prints
 * {"wall_s": ..., "cpu_s": ...} for the work alone, then waits for EOF on stdin before exiting
 * (so a profiler that symbolizes at its own exit still finds the process). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHUNK 100000L

volatile unsigned sink;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

__attribute__((noinline)) unsigned work_leaf(unsigned acc, long n)
{
    for (long i = 0; i < n; i++)
        acc = (acc * 1103515245u + 12345u) ^ (acc >> 13);
    return acc;
}

__attribute__((noinline)) unsigned work_mid(unsigned acc, long n)
{
    return work_leaf(acc, n) + 1;
}

__attribute__((noinline)) unsigned work_outer(unsigned acc, long n)
{
    return work_mid(acc, n) ^ 7;
}

static void wait_for(int want_eof)
{
    int c;
    while ((c = getchar()) != EOF)
        if (!want_eof && c == '\n')
            return;
}

int main(int argc, char **argv)
{
    long iterations = argc > 1 ? atol(argv[1]) : 1000000000L;
    unsigned acc = sink;

    printf("ready\n");
    fflush(stdout);
    wait_for(0);
    double wall0 = clock_s(CLOCK_MONOTONIC), cpu0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (long done = 0; done < iterations; done += CHUNK)
        acc = work_outer(acc, CHUNK);
    double wall = clock_s(CLOCK_MONOTONIC) - wall0, cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    sink = acc;
    printf("{\"wall_s\": %.6f, \"cpu_s\": %.6f}\n", wall, cpu);
    fflush(stdout);
    wait_for(1);
    return 0;
}
