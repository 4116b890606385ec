/* An eval function GCC splits in two: its unlikely blocks go to _PyEval_EvalFrameDefault.cold, a part of
 * their own with an FDE of its own, named in .symtab only (tests/python/test_evalcold.py strips the file).
 * Built with -DNO_SPLIT it has no cold part; its only way out is a tail call. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((cold, noinline)) void complain(long i) { fprintf(stderr, "bad %ld\n", i); }
__attribute__((noinline)) long tail(long s) { return s * 7; }

__attribute__((noinline)) long _PyEval_EvalFrameDefault(long *values, int n)
{
    long sum = 0;
    for (int i = 0; i < n; i++) {
#ifndef NO_SPLIT
        if (__builtin_expect(values[i] < 0, 0)) {
            complain(i);
            sum -= values[i] * 3;
            if (values[i] < -100)
                abort();
            continue;
        }
#endif
        sum += values[i];
    }
    return tail(sum);
}

int main(int argc, char **argv)
{
    long values[4] = {1, 2, 3, argc};
    return (int)_PyEval_EvalFrameDefault(values, 4);
}
