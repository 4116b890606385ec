/* A hot static function spread over many addresses, for the test of stripped code named by function:
 * built -O2 and stripped, `mix` (static, never inlined) is about a kilobyte of straight code, 64
 * unrolled rounds of shift, xor, multiply and rotate per step, and takes nearly all the CPU time; main
 * calls it until the process has used ARGV[1] seconds of CPU (1 by default). */
#include <stdlib.h>
#include <time.h>

#define ROUND(k) \
    x ^= x >> ((k) % 23 + 7); \
    x *= 0x9E3779B97F4A7C15ull + (k); \
    x = (x << ((k) % 31 + 1)) | (x >> (63 - (k) % 31));
#define ROUNDS8(b) ROUND(b) ROUND(b + 1) ROUND(b + 2) ROUND(b + 3) ROUND(b + 4) ROUND(b + 5) ROUND(b + 6) ROUND(b + 7)

volatile unsigned long sink;

static __attribute__((noinline)) unsigned long mix(unsigned long x, long steps)
{
    for (long i = 0; i < steps; i++) {
        ROUNDS8(0) ROUNDS8(8) ROUNDS8(16) ROUNDS8(24) ROUNDS8(32) ROUNDS8(40) ROUNDS8(48) ROUNDS8(56)
    }
    return x;
}

static double cpu_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    unsigned long x = 1;
    while (cpu_seconds() < seconds)
        x = mix(x, 10000);
    sink = x;
    return 0;
}
