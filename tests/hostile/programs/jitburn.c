/* A hostile "JIT": runs forever in anonymous executable memory, so that a profiler reading the whole
 * machine meets it and looks for its JIT symbols (/tmp/perf-PID.map).
 * usage: jitburn MAPSRC SLOTS
 *   SLOTS 16-byte slots of code at JIT_BASE, each a jump to the next, the last back to the first (so
 *   samples land all over the region: one distinct perf-map name per slot can be hit).
 *   MAPSRC: a file copied to /tmp/perf-PID.map first (created O_EXCL|O_NOFOLLOW), or "-" for none
 *   (a perf map planted some other way, e.g. a bind mount inside a namespace). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#define JIT_BASE 0x100000000000UL
#define SLOT 16

static void copy_map(const char *src)
{
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    int in = open(src, O_RDONLY | O_CLOEXEC);
    int out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (in < 0 || out < 0 || fstat(in, &st) != 0) {
        perror(src);
        exit(1);
    }
    for (off_t left = st.st_size; left > 0;) {
        ssize_t n = sendfile(out, in, NULL, left);
        if (n <= 0) {
            perror("sendfile");
            exit(1);
        }
        left -= n;
    }
    close(in);
    close(out);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: jitburn MAPSRC SLOTS\n");
        return 2;
    }
    size_t slots = strtoul(argv[2], NULL, 0);
    size_t len = (slots * SLOT + 4095) & ~4095UL;
    unsigned char *code = mmap((void *)JIT_BASE, len, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (code == MAP_FAILED || code != (void *)JIT_BASE) {
        perror("mmap");
        return 1;
    }
    memset(code, 0xcc, len);
    for (size_t i = 0; i < slots; i++) {
        int rel = i + 1 < slots ? SLOT - 5 : -(int)(i * SLOT + 5);
        code[i * SLOT] = 0xe9; /* jmp rel32 */
        memcpy(code + i * SLOT + 1, &rel, 4);
    }
    if (mprotect(code, len, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        return 1;
    }
    if (strcmp(argv[1], "-") != 0)
        copy_map(argv[1]);
    ((void (*)(void))code)();
    return 0;
}
