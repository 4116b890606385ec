/* The shared-library part of unwind_tree.c's call tree (another file, other unwind rows). */
#include "burn.h"

BURN_FUNCTION(leaf_z)

static volatile unsigned sink;

__attribute__((noinline)) void tree_c(double seconds)
{
    volatile unsigned scratch[20];
    scratch[sink % 20] = sink;
    leaf_z(seconds);
    sink += scratch[sink % 20];
}
