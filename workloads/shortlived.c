/* A short-lived process: burns CPU in short_burn for the given CPU milliseconds, then exits.
 * Usage: shortlived [MS]   (default 40) */
#include <stdlib.h>
#include "burn.h"

BURN_FUNCTION(short_burn)

int main(int argc, char **argv)
{
    short_burn((argc > 1 ? atof(argv[1]) : 40.0) / 1000.0);
    return 0;
}
