/* Time-to-first-sample target for bench/bench_profile.py.
 * Usage: bench-phases SLOT_MS
 * Prints its start time (CLOCK_MONOTONIC seconds), then spends wall-clock slot k, from
 * start + k*SLOT_MS to start + (k+1)*SLOT_MS, busy in the function slot_K (K = k as three digits;
 * 800 slots, 20 s at the default 25 ms). The first slot_K a profiler's output names dates its first
 * sample to within one slot.
 * Then it waits for EOF on stdin before exiting (profilers that symbolize at exit still find it). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile unsigned sink;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define SLOT_FN(n)                                                        \
    __attribute__((noinline)) void slot_##n(double end)                  \
    {                                                                     \
        unsigned acc = sink;                                              \
        while (mono() < end)                                              \
            for (int i = 0; i < 10000; i++)                               \
                acc = acc * 1103515245u + 12345u;                         \
        sink = acc;                                                       \
    }
#define SLOT_PTR(n) slot_##n,
#define X10(M, p) M(p##0) M(p##1) M(p##2) M(p##3) M(p##4) M(p##5) M(p##6) M(p##7) M(p##8) M(p##9)
#define X100(M, p) X10(M, p##0) X10(M, p##1) X10(M, p##2) X10(M, p##3) X10(M, p##4) \
                   X10(M, p##5) X10(M, p##6) X10(M, p##7) X10(M, p##8) X10(M, p##9)
#define X800(M) X100(M, 0) X100(M, 1) X100(M, 2) X100(M, 3) X100(M, 4) X100(M, 5) X100(M, 6) X100(M, 7)

X800(SLOT_FN)
static void (*const slots[])(double) = {X800(SLOT_PTR)};

int main(int argc, char **argv)
{
    double slot = (argc > 1 ? atof(argv[1]) : 25.0) / 1000.0;
    double start = mono();

    printf("%.6f\n", start);
    fflush(stdout);
    for (size_t k = 0; k < sizeof slots / sizeof slots[0]; k++)
        slots[k](start + (k + 1) * slot);
    while (getchar() != EOF)
        ;
    return 0;
}
