/* Demo workload with designed CPU shares (of the process's CPU time):
 *   hot_a 40%, hot_b 20%, lib_burn (libburn.so) 20%, demo::Hasher::mix (C++) 20%.
 * Usage: demo [CPU-SECONDS]   (default 3) */
#include <stdlib.h>
#include "burn.h"

void lib_burn(double seconds);
void hasher_run(double seconds);

BURN_FUNCTION(hot_a)
BURN_FUNCTION(hot_b)

int main(int argc, char **argv)
{
    double total = argc > 1 ? atof(argv[1]) : 3.0;
    double start = cpu_now();
    const double round = 0.010;

    while (cpu_now() - start < total) {
        hot_a(0.4 * round);
        hot_b(0.2 * round);
        lib_burn(0.2 * round);
        hasher_run(0.2 * round);
    }
    return 0;
}
