/* A native burner for the hostile-ELF rows: spends its CPU time in hostile_burn(), a real function.
 * usage: burn [SECONDS]   (no argument: forever). Built with -DNEEDLIB it also calls needlib_tick() from
 * a shared library (its DT_NEEDED entry). */
#include <stdlib.h>
#include <time.h>

#ifdef NEEDLIB
void needlib_tick(void);
#else
static void needlib_tick(void) {}
#endif

volatile unsigned long sink;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void hostile_burn(double seconds)
{
    double deadline = now() + seconds;
    while (seconds <= 0 || now() < deadline) {
        for (int i = 0; i < 1000000; i++)
            sink += i;
        needlib_tick();
    }
}

/* aligned: padding after hostile_burn's ret, an address inside no function */
__attribute__((aligned(64))) int main(int argc, char **argv)
{
    hostile_burn(argc > 1 ? atof(argv[1]) : 0);
    return 0;
}
