// C++ part of the demo workload: Hasher::mix gets 20% of the CPU time (its name must demangle).
#include "demo_hasher.h"

extern "C" {
#include "burn.h"
}

namespace demo {

__attribute__((noinline)) unsigned Hasher::mix(double seconds)
{
    unsigned acc = state_;
    BURN_FOR(seconds, acc);
    state_ = acc;
    return acc;
}

}  // namespace demo

extern "C" __attribute__((noinline)) void hasher_run(double seconds)
{
    static demo::Hasher hasher;
    hasher.mix(seconds);
}
