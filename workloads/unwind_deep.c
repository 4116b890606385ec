/* Deep stacks without frame pointers (tests/unwind): descend(N) recurses N levels, then burns CPU, so
 * nearly every sample is N + 3 frames deep (N + burn + main + libc's two + _start).
 * Usage: unwind-deep [DEPTH] [CPU-SECONDS]   (default 200 frames, 2 s) */
#include <stdlib.h>
#include "burn.h"

BURN_FUNCTION(bottom)

static volatile unsigned sink;

__attribute__((noinline)) void descend(int depth, double seconds)
{
    volatile unsigned scratch[4];
    scratch[depth & 3] = sink;
    if (depth > 0)
        descend(depth - 1, seconds);
    else
        bottom(seconds);
    sink += scratch[depth & 3];
}

int main(int argc, char **argv)
{
    descend(argc > 1 ? atoi(argv[1]) : 200, argc > 2 ? atof(argv[2]) : 2.0);
    return 0;
}
