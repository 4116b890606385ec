/* Syscall-heavy workload: reads /dev/zero in 64 KiB chunks, so most samples land in the kernel.
 * Usage: syscalls [SECONDS]   (default 2, wall time) */
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 16];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0)
        return 1;
    double end = now() + secs;
    while (now() < end)
        for (int i = 0; i < 64; i++)
            if (read(fd, buf, sizeof buf) < 0)
                return 1;
    close(fd);
    return 0;
}
