/* CPU burning with a CPU-time deadline, so shares hold on a busy machine. */
#ifndef OPTRACE_BURN_H
#define OPTRACE_BURN_H
#include <time.h>

static inline double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The clock is read once per 100k iterations (about 0.1 ms), so time in the clock_gettime syscall
 * stays well under 1% of the samples. */
#define BURN_FOR(seconds, acc)                                        \
    do {                                                              \
        double deadline_ = cpu_now() + (seconds);                     \
        while (cpu_now() < deadline_)                                 \
            for (int i_ = 0; i_ < 100000; i_++)                       \
                (acc) = (acc) * 1103515245u + 12345u;                 \
    } while (0)

/* A function that burns CPU under its own name: the names are the workloads' ground truth. */
#define BURN_FUNCTION(name)                                 \
    __attribute__((noinline)) void name(double seconds)     \
    {                                                       \
        static volatile unsigned sink_;                     \
        unsigned acc = sink_;                               \
        BURN_FOR(seconds, acc);                             \
        sink_ = acc;                                        \
    }
#endif
