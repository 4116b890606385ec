/* A known call chain for the unwind-walk test, built -O2 -fomit-frame-pointer -fno-optimize-sibling-calls:
 *   main -> outer -> qsort (libc, no frame pointers) -> compare -> middle -> inner -> spin
 * spin runs until the parent kills the process; "ready" on stdout once it spins. */
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;

__attribute__((noinline)) static int spin(int x)
{
    static int announced;
    if (!announced) {
        announced = 1;
        puts("ready");
        fflush(stdout);
    }
    for (;;)
        sink += (unsigned long)x;
    return x;
}

__attribute__((noinline)) static int inner(int x) { return spin(x + 1) + 1; }
__attribute__((noinline)) static int middle(int x) { return inner(x * 3) + 2; }

static int compare(const void *a, const void *b)
{
    int r = middle(*(const int *)a - *(const int *)b);
    return r > 0;
}

__attribute__((noinline)) static int outer(void)
{
    int values[2] = {2, 1};
    qsort(values, 2, sizeof values[0], compare);
    return values[0];
}

int main(void)
{
    return outer();
}
