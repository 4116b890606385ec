/* A tiny "JIT": copies a counting loop's machine code into anonymous executable memory (mmap PROT_EXEC),
 * writes its own /tmp/perf-PID.map line for it, and burns CPU: JIT_SHARE of the CPU time in the copied
 * code, the rest in native_burn() (a normal symbol), until SECONDS of CPU time have passed.
 * usage: jitcode SECONDS [JIT_SHARE [nomap]]   (defaults 2 and 0.7; "nomap": write no perf map, for tests
 * that plant one) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "burn.h"

#define JIT_NAME "jitcode::hot loop(long)"

#if !defined(__x86_64__)
#error "jitcode copies x86-64 machine code"
#endif
/* mov %rdi,%rax; 1: dec %rax; jne 1b; ret */
static const unsigned char loop_code[] = {0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0xc3};

typedef long (*loop_fn)(long);
volatile unsigned sink;

__attribute__((noinline)) void native_burn(double seconds)
{
    unsigned acc = sink;
    BURN_FOR(seconds, acc);
    sink = acc;
}

static void jit_burn(loop_fn fn, double seconds)
{
    double deadline = cpu_now() + seconds;
    while (cpu_now() < deadline)
        fn(200000);
}

static void write_perf_map(void *code, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    dprintf(fd, "%lx %zx %s\n", (unsigned long)code, size, JIT_NAME);
    close(fd);
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double share = argc > 2 ? atof(argv[2]) : 0.7;
    void *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memcpy(code, loop_code, sizeof loop_code);
    if (mprotect(code, 4096, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        return 1;
    }
    if (!(argc > 3 && strcmp(argv[3], "nomap") == 0))
        write_perf_map(code, sizeof loop_code);
    printf("%p %zu\n", code, sizeof loop_code);
    fflush(stdout);
    double end = cpu_now() + seconds;
    while (cpu_now() < end) {
        jit_burn((loop_fn)code, 0.1 * share);
        native_burn(0.1 * (1 - share));
    }
    return 0;
}
