/* A known call tree built -O2 -fomit-frame-pointer (no frame pointers, as Debian builds), for the
 * CFI unwinder's tests (tests/unwind). Shares of the process's CPU time:
 *   main -> run_tree 100%
 *     tree_a 60%: leaf_x 40%, leaf_y 20%
 *     tree_b 40%: tree_c 30% (libunwindtree.so) -> leaf_z 30%; leaf_y 10%
 * Callers keep a local array (rsp-relative CFA offsets other than the default) and do work after each
 * call (no tail calls). Usage: unwind-tree [CPU-SECONDS]   (default 3) */
#include <stdlib.h>
#include "burn.h"

void tree_c(double seconds);  /* libunwindtree.so */

BURN_FUNCTION(leaf_x)
BURN_FUNCTION(leaf_y)

static volatile unsigned sink;

__attribute__((noinline)) void tree_a(double round)
{
    volatile unsigned scratch[48];
    scratch[sink % 48] = sink;
    leaf_x(0.40 * round);
    leaf_y(0.20 * round);
    sink += scratch[sink % 48];
}

__attribute__((noinline)) void tree_b(double round)
{
    volatile unsigned scratch[12];
    scratch[sink % 12] = sink;
    tree_c(0.30 * round);
    leaf_y(0.10 * round);
    sink += scratch[sink % 12];
}

__attribute__((noinline)) void run_tree(double total)
{
    double start = cpu_now();
    const double round = 0.010;
    while (cpu_now() - start < total) {
        tree_a(round);
        tree_b(round);
    }
    sink++;
}

int main(int argc, char **argv)
{
    run_tree(argc > 1 ? atof(argv[1]) : 3.0);
    return 0;
}
