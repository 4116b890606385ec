/* Many distinct stacks, from threads that may start late.
 *
 *   stacks SECONDS [THREADS] [DELAY_S] [cpu]
 *
 * After DELAY_S seconds (default 0; negative: once a line is read from stdin), starts THREADS threads
 * (default 1); each, for SECONDS seconds (of wall time; with "cpu", of its own CPU time, so a busy machine
 * does not shrink its work),
 * calls chains of DEPTH functions picked among s0..s7 by a random number, the leaf (leaf_burn) burning a
 * few microseconds: 8^6 = 262,144 distinct user stacks, so a profile at 10k samples/s meets a new stack
 * at most samples (the cost of stack maps, drains and symbolization at scale). Prints the threads' ids.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 6

typedef unsigned long (*step_fn)(int depth, unsigned long path);
static const step_fn steps[8];
static volatile unsigned long sink;
static double seconds = 1;

__attribute__((noinline)) unsigned long leaf_burn(unsigned long path)
{
    unsigned long acc = path;
    for (int i = 0; i < 2000; i++)
        acc = acc * 6364136223846793005UL + 1442695040888963407UL;
    return acc;
}

/* The call is not a tail call (its result is used after it), so every level keeps its frame. */
#define STEP(n)                                                                 \
    __attribute__((noinline)) unsigned long s##n(int depth, unsigned long path) \
    {                                                                           \
        unsigned long r = depth ? steps[path & 7](depth - 1, path >> 3) : leaf_burn(path); \
        sink += r;                                                              \
        return r + n;                                                           \
    }
STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7)
static const step_fn steps[8] = {s0, s1, s2, s3, s4, s5, s6, s7};

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run(void *arg)
{
    unsigned long x = (unsigned long)arg * 0x9E3779B97F4A7C15UL + 1;
    printf("thread %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 64; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            steps[x & 7](DEPTH - 1, x >> 3);
        }
    return NULL;
}

int main(int argc, char **argv)
{
    seconds = argc > 1 ? atof(argv[1]) : 1;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    double delay = argc > 3 ? atof(argv[3]) : 0;
    if (argc > 4 && strcmp(argv[4], "cpu") == 0)
        clock_id = CLOCK_THREAD_CPUTIME_ID;
    if (threads < 1 || threads > 64)
        return 2;
    char line[16];
    if (delay > 0)
        usleep((useconds_t)(delay * 1e6));
    else if (delay < 0 && !fgets(line, sizeof line, stdin))
        return 1;
    pthread_t ids[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&ids[i], NULL, run, (void *)(long)(i + 1));
    for (int i = 0; i < threads; i++)
        pthread_join(ids[i], NULL);
    return 0;
}
