/* Another user's exec storm (issue 42): every PERIOD_MS, TRUES x /bin/true, then a fresh process (this
 * program exec'd again) that starts and joins 8 threads, 10 times over.
 *   execstorm SECONDS [PERIOD_MS] [TRUES] [MIN_EXECS]
 * (defaults: 50 ms, 20, 0; PERIOD_MS 0: no pause between rounds). It goes on after SECONDS until it exec'd
 * MIN_EXECS processes (a loaded machine gives it fewer a second), then prints how many ("execs N"). */
#define _GNU_SOURCE
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void *nothing(void *arg)
{
    return arg;
}

static int join_threads(void)
{
    for (int round = 0; round < 10; round++) {
        pthread_t threads[8];
        for (int i = 0; i < 8; i++)
            if (pthread_create(&threads[i], NULL, nothing, NULL) != 0)
                return 1;
        for (int i = 0; i < 8; i++)
            pthread_join(threads[i], NULL);
    }
    return 0;
}

static int run(char *const argv[])
{
    pid_t pid;
    int status;
    if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0)
        return 0;
    waitpid(pid, &status, 0);
    return 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--threads") == 0)
        return join_threads();
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    long period_ms = argc > 2 ? atol(argv[2]) : 50;
    int trues = argc > 3 ? atoi(argv[3]) : 20;
    long min_execs = argc > 4 ? atol(argv[4]) : 0;
    char *true_argv[] = {"/bin/true", NULL};
    char *threads_argv[] = {"/proc/self/exe", "--threads", NULL};
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len > 0) {
        self[len] = 0;
        threads_argv[0] = self;
    }
    long execs = 0;
    double end = now() + seconds;
    while (now() < end || execs < min_execs) {
        for (int i = 0; i < trues; i++)
            execs += run(true_argv);
        execs += run(threads_argv);
        if (period_ms > 0)
            usleep(period_ms * 1000);
    }
    printf("execs %ld\n", execs);
    return 0;
}
