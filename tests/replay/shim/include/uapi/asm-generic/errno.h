/* The replay's stand-in for BCC's kernel header path (bpf/kernel_types.h includes this one). */
#include <asm-generic/errno.h>
