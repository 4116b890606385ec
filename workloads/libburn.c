/* Shared-library part of the demo workload: lib_burn gets 20% of the CPU time. */
#include "burn.h"

BURN_FUNCTION(lib_burn)
