/* Shared-library part of the demo workload: lib_burn gets 20% of the CPU time. */
#include "burn.h"

volatile unsigned lib_sink;

__attribute__((noinline)) void lib_burn(double seconds)
{
    unsigned acc = lib_sink;
    BURN_FOR(seconds, acc);
    lib_sink = acc;
}
