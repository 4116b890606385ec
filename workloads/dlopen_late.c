/* A library loaded while the process is profiled: burns in main for BEFORE seconds of CPU, then
 * dlopen()s LIB and burns in its lib_burn for AFTER seconds (tests/record: the sampler reads a
 * process's mappings once, so it must notice the new executable mapping).
 * Usage: dlopen-late LIB BEFORE AFTER */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "burn.h"

BURN_FUNCTION(before_dlopen)

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: dlopen-late LIB BEFORE AFTER\n");
        return 2;
    }
    before_dlopen(atof(argv[2]));
    void *lib = dlopen(argv[1], RTLD_NOW);
    void (*burn)(double) = lib ? (void (*)(double))dlsym(lib, "lib_burn") : NULL;
    if (!burn) {
        fprintf(stderr, "dlopen-late: %s\n", dlerror());
        return 1;
    }
    burn(atof(argv[3]));
    return 0;
}
