/* Many distinct stacks, for the output benchmarks (pprof, flame graphs): 17 levels of two functions each,
 * every call picks the next level's function from the bits of a counter, so the leaf spins under one of
 * 2^17 = 131,072 distinct call paths, each as often as the others.
 * Usage: paths [CPU-SECONDS]   (default 3) */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

__attribute__((noinline)) void leaf(unsigned long bits)
{
    for (int i = 0; i < 20000; i++)
        sink = sink * 31 + bits;
}

#define LEVEL(n, next) \
    __attribute__((noinline)) void a##n(unsigned long bits) { if (bits & 1) b##next(bits >> 1); else a##next(bits >> 1); sink++; } \
    __attribute__((noinline)) void b##n(unsigned long bits) { if (bits & 1) a##next(bits >> 1); else b##next(bits >> 1); sink++; }
#define a17 leaf
#define b17 leaf
LEVEL(16, 17) LEVEL(15, 16) LEVEL(14, 15) LEVEL(13, 14) LEVEL(12, 13) LEVEL(11, 12) LEVEL(10, 11) LEVEL(9, 10)
LEVEL(8, 9) LEVEL(7, 8) LEVEL(6, 7) LEVEL(5, 6) LEVEL(4, 5) LEVEL(3, 4) LEVEL(2, 3) LEVEL(1, 2) LEVEL(0, 1)

int main(int argc, char **argv)
{
    double total = argc > 1 ? atof(argv[1]) : 3.0;
    double start = cpu_now();
    for (unsigned long n = 0; cpu_now() - start < total; n++)
        a0(n * 2654435761u);
    return 0;
}
