/* Ground truth for uprobe call counting.
 *
 *   calls N [LIBC_N [WAIT_MS|-]]   call target() exactly N times, then labs() (libc) LIBC_N times
 *
 * WAIT_MS (default 0) is slept before the calls, so a probe can be attached to a running process; with
 * "-" the program waits for a line on stdin instead. target_alias is a second name for target
 * (one address, so one probe). Prints "done N" when finished.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) void target(void)
{
    sink++;
    __asm__ volatile("" ::: "memory");
}

void target_alias(void) __attribute__((alias("target")));

/* Through a volatile pointer so the compiler cannot inline or fold the libc call. */
long (*volatile libc_labs)(long) = labs;

static void wait_before(const char *arg)
{
    if (strcmp(arg, "-") == 0) {
        char line[16];
        if (!fgets(line, sizeof line, stdin))
            fprintf(stderr, "calls: stdin closed, starting anyway\n");
        return;
    }
    long ms = atol(arg);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: calls N [LIBC_N [WAIT_MS|-]]\n");
        return 2;
    }
    long n = atol(argv[1]);
    long libc_n = argc > 2 ? atol(argv[2]) : 0;
    if (argc > 3)
        wait_before(argv[3]);
    for (long i = 0; i < n; i++)
        target();
    for (long i = 0; i < libc_n; i++)
        sink += libc_labs(-i);
    printf("done %ld %ld\n", n, libc_n);
    return 0;
}
