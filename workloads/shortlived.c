/* A short-lived process: burns CPU in short_burn for the given CPU milliseconds, then exits.
 * Usage: shortlived [MS]   (default 40) */
#include <stdlib.h>
#include "burn.h"

volatile unsigned sink;

__attribute__((noinline)) void short_burn(double seconds)
{
    unsigned acc = sink;
    BURN_FOR(seconds, acc);
    sink = acc;
}

int main(int argc, char **argv)
{
    short_burn((argc > 1 ? atof(argv[1]) : 40.0) / 1000.0);
    return 0;
}
