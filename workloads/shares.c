/* A workload whose CPU shares are set by its argument, so two records differ by a known amount
 * (tests of `optrace diff`): share_a takes PCT% of the process's CPU time, share_b the rest, both
 * called from main through work_round, interleaved every 10 ms of CPU time.
 * Usage: shares PCT [CPU-SECONDS]   (PCT 0..100, default 2 s) */
#include <stdlib.h>
#include "burn.h"

BURN_FUNCTION(share_a)
BURN_FUNCTION(share_b)

__attribute__((noinline)) static void work_round(double a_seconds, double b_seconds)
{
    if (a_seconds > 0)
        share_a(a_seconds);
    if (b_seconds > 0)
        share_b(b_seconds);
}

int main(int argc, char **argv)
{
    double pct = argc > 1 ? atof(argv[1]) : 50.0;
    double total = argc > 2 ? atof(argv[2]) : 2.0;
    double start = cpu_now();
    const double round = 0.010;

    if (pct < 0 || pct > 100)
        return 2;
    while (cpu_now() - start < total)
        work_round(round * pct / 100.0, round * (100.0 - pct) / 100.0);
    return 0;
}
