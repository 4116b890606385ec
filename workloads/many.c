/* 500 distinct functions fn_000 .. fn_499, for timing how long attaching a 500-function glob takes.
 *
 *   many [ROUNDS]     calls every function ROUNDS times (default 1)
 */
#include <stdio.h>
#include <stdlib.h>

#define F(n) __attribute__((noinline)) long fn_##n(long x) { return x * 1##n + 7; }
#define F10(p) F(p##0) F(p##1) F(p##2) F(p##3) F(p##4) F(p##5) F(p##6) F(p##7) F(p##8) F(p##9)
#define F100(p) F10(p##0) F10(p##1) F10(p##2) F10(p##3) F10(p##4) F10(p##5) F10(p##6) F10(p##7) F10(p##8) F10(p##9)
F100(0) F100(1) F100(2) F100(3) F100(4)

#define R(n) fn_##n,
#define R10(p) R(p##0) R(p##1) R(p##2) R(p##3) R(p##4) R(p##5) R(p##6) R(p##7) R(p##8) R(p##9)
#define R100(p) R10(p##0) R10(p##1) R10(p##2) R10(p##3) R10(p##4) R10(p##5) R10(p##6) R10(p##7) R10(p##8) R10(p##9)
static long (*const functions[])(long) = {R100(0) R100(1) R100(2) R100(3) R100(4)};

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 1, sum = 0;
    for (long r = 0; r < rounds; r++)
        for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++)
            sum += functions[i](r);
    printf("%ld\n", sum);
    return 0;
}
