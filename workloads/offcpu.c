/* Ground truth for off-CPU and wall-clock time: threads that sleep, block on a pipe read, wait on a
 * mutex, wait for the disk in fsync and burn CPU, each blocking in a function of its own name. Every thread measures its own
 * blocked time (around the blocking calls), CPU time and lifetime, and the program prints them as one
 * JSON line on stderr at exit, for tests to compare with optrace's figures.
 *
 * Designed (scale 1.0): sleeper 10 x 50 ms; pipe_reader waits for 10 messages that pipe_writer sends
 * after sleeping 100 ms each; mutex_waiter waits for the lock lock_holder keeps while it burns 1.2 s of
 * CPU; syncer writes a block and waits for it in fsync, 16 times (x scale) and more until its waits add up
 * to 0.1 s (x scale), at most 400 times (x scale); the block is 64 KiB, twice as large after each fsync
 * that took less than 2 ms, up to 4 MiB: a disk that answers a 64 KiB fsync in a millisecond gave 5 ms of
 * waits in 5 rounds, too few to tell the disk's waits from noise (a file in $TMPDIR or /var/tmp, unlinked
 * at once, written over from its start: fsync waits for the disk, in state D, where a tmpfs would not);
 * burner burns 0.8 s of CPU; main waits in join_workers. Burning is by CPU time (burn.h), so on a
 * busy machine the burners take longer in wall time but the CPU share stays as designed. Each thread is
 * named after its role (its comm); the main thread keeps the program's name. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "burn.h"

static double scale = 1.0;
static int pipe_fds[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t lock_taken;

struct role {
    const char *name;
    void *(*run)(void *);
    double blocked;  /* seconds in the role's blocking calls */
    double cpu;      /* thread CPU seconds */
    double lifetime; /* wall seconds from start to end */
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The blocking calls are made from helpers of their own: with frame pointers, the caller of a libc
 * function that keeps none (glibc's read, nanosleep, pthread_mutex_lock) is skipped by the unwinder,
 * so the role function is kept as the helper's caller. */
__attribute__((noinline)) void sleep_for(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

__attribute__((noinline)) void read_byte(int fd)
{
    char byte;
    if (read(fd, &byte, 1) != 1)
        exit(2);
}

__attribute__((noinline)) void lock_mutex(pthread_mutex_t *mutex)
{
    if (pthread_mutex_lock(mutex) != 0) /* checked: not a tail call, so this frame stays */
        exit(2);
}

BURN_FUNCTION(burn_cpu)

__attribute__((noinline)) double sleeper(void)
{
    double t0 = wall_now();
    for (int i = 0; i < 10; i++)
        sleep_for(0.05 * scale);
    return wall_now() - t0;
}

__attribute__((noinline)) double pipe_reader(void)
{
    double blocked = 0;
    for (int i = 0; i < 10; i++) {
        double t0 = wall_now();
        read_byte(pipe_fds[0]);
        blocked += wall_now() - t0;
    }
    return blocked;
}

__attribute__((noinline)) double pipe_writer(void)
{
    double t0 = wall_now();
    for (int i = 0; i < 10; i++) {
        sleep_for(0.1 * scale);
        if (write(pipe_fds[1], "x", 1) != 1)
            exit(2);
    }
    return wall_now() - t0;
}

__attribute__((noinline)) double lock_holder(void)
{
    pthread_mutex_lock(&lock);
    pthread_barrier_wait(&lock_taken);
    burn_cpu(1.2 * scale);
    pthread_mutex_unlock(&lock);
    return 0;
}

__attribute__((noinline)) double mutex_waiter(void)
{
    pthread_barrier_wait(&lock_taken);
    double t0 = wall_now();
    lock_mutex(&lock);
    double blocked = wall_now() - t0;
    pthread_mutex_unlock(&lock);
    return blocked;
}

__attribute__((noinline)) void sync_file(int fd)
{
    if (fsync(fd) != 0)
        exit(2);
}

#define SYNC_MIN_BLOCK (64 << 10)
#define SYNC_MAX_BLOCK (4 << 20)

__attribute__((noinline)) double syncer(void)
{
    static char block[SYNC_MAX_BLOCK];
    const char *folder = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
    char path[4096];
    snprintf(path, sizeof(path), "%s/optrace-offcpu-XXXXXX", folder);
    int fd = mkstemp(path);
    if (fd < 0)
        exit(2);
    unlink(path);
    double blocked = 0, enough = 0.1 * scale;
    int rounds = (int)(16 * scale) + 1, most = (int)(400 * scale) + 1;
    size_t size = SYNC_MIN_BLOCK;
    for (int i = 0; i < most && (i < rounds || blocked < enough); i++) {
        block[0] = (char)i;
        if (pwrite(fd, block, size, 0) != (ssize_t)size)
            exit(2);
        double t0 = wall_now();
        sync_file(fd);
        double took = wall_now() - t0;
        blocked += took;
        if (took < 0.002 && size < SYNC_MAX_BLOCK)
            size *= 2;
    }
    close(fd);
    return blocked;
}

__attribute__((noinline)) double burner(void)
{
    burn_cpu(0.8 * scale);
    return 0;
}

#define ROLE_THREAD(fn)                                         \
    static void *fn##_thread(void *arg)                         \
    {                                                           \
        struct role *role = arg;                                \
        pthread_setname_np(pthread_self(), role->name);         \
        double t0 = wall_now();                                 \
        role->blocked = fn();                                   \
        role->cpu = cpu_now();                                  \
        role->lifetime = wall_now() - t0;                       \
        return NULL;                                            \
    }

ROLE_THREAD(sleeper)
ROLE_THREAD(pipe_reader)
ROLE_THREAD(pipe_writer)
ROLE_THREAD(lock_holder)
ROLE_THREAD(mutex_waiter)
ROLE_THREAD(syncer)
ROLE_THREAD(burner)

static struct role roles[] = {
    {"sleeper", sleeper_thread},         {"pipe_reader", pipe_reader_thread},
    {"pipe_writer", pipe_writer_thread}, {"lock_holder", lock_holder_thread},
    {"mutex_waiter", mutex_waiter_thread}, {"syncer", syncer_thread},  {"burner", burner_thread},
};
#define NROLES (sizeof(roles) / sizeof(roles[0]))

__attribute__((noinline)) double join_workers(pthread_t *threads)
{
    double t0 = wall_now();
    for (size_t i = 0; i < NROLES; i++)
        pthread_join(threads[i], NULL);
    return wall_now() - t0;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        scale = atof(argv[1]);
    double t0 = wall_now();
    if (pipe(pipe_fds) != 0 || pthread_barrier_init(&lock_taken, NULL, 2) != 0)
        return 2;
    pthread_t threads[NROLES];
    for (size_t i = 0; i < NROLES; i++)
        if (pthread_create(&threads[i], NULL, roles[i].run, &roles[i]) != 0)
            return 2;
    double joined = join_workers(threads);
    double main_cpu = cpu_now(), main_life = wall_now() - t0;
    fprintf(stderr, "{\"join_workers\": {\"blocked\": %.6f, \"cpu\": %.6f, \"lifetime\": %.6f}", joined, main_cpu,
            main_life);
    for (size_t i = 0; i < NROLES; i++)
        fprintf(stderr, ", \"%s\": {\"blocked\": %.6f, \"cpu\": %.6f, \"lifetime\": %.6f}", roles[i].name,
                roles[i].blocked, roles[i].cpu, roles[i].lifetime);
    fprintf(stderr, "}\n");
    return 0;
}
