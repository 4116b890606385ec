/* A process that fakes a CPython 3.11 (built as "python3.11" with -rdynamic so _PyRuntime, Py_Version and
 * _PyEval_EvalFrameDefault are in .dynsym), for the hostile-input tests of frontend/python/. The layout's
 * offsets come as -D flags from the test (optrace's 3.11 table). Modes (argv[1]):
 *   garbage   _PyRuntime full of 0x41 bytes: interpreters.head points nowhere
 *   zero      _PyRuntime all zeros: an interpreter not started yet
 *   mismatch  a thread state whose interp does not point back to the interpreter
 *   loop      a consistent interpreter whose two frames point at each other; the code object's name claims
 *             1 GiB of characters and its line table 1 TiB of bytes
 *   deep      the same with a chain of 10000 distinct frames
 * Prints "ready <native tid>" and waits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const unsigned long Py_Version = PY_VERSION_HEX;
unsigned char _PyRuntime[1 << 16];
#define FRAMES 10000
#define FRAME_SIZE 256
unsigned char arena[(1 << 16) + FRAMES * FRAME_SIZE];

void _PyEval_EvalFrameDefault(void) {
    for (;;)
        pause();
}

static void put(unsigned char *at, uint64_t value) { memcpy(at, &value, 8); }
static uint64_t addr(unsigned char *at) { return (uint64_t)(uintptr_t)at; }

static void fake_interpreter(int frames, int loop, int back_pointer_ok) {
    unsigned char *interp = arena, *tstate = arena + 4096, *cframe = arena + 8192, *code = arena + 12288;
    unsigned char *name = arena + 16384, *table = arena + 20480, *frame0 = arena + 65536;
    put(_PyRuntime + INTERPRETERS_HEAD, addr(interp));
    put(interp + INTERP_THREADS_HEAD, addr(tstate));
    put(tstate + TSTATE_INTERP, back_pointer_ok ? addr(interp) : addr(arena + 64));
    put(tstate + TSTATE_THREAD_ID, (uint64_t)pthread_self());
    put(tstate + TSTATE_NATIVE_THREAD_ID, (uint64_t)gettid());
    put(tstate + TSTATE_FRAME, addr(cframe));
    put(cframe + CFRAME_CURRENT_FRAME, addr(frame0));
    for (int i = 0; i < frames; i++) {
        unsigned char *frame = frame0 + i * FRAME_SIZE;
        unsigned char *previous = i + 1 < frames ? frame + FRAME_SIZE : (loop ? frame0 : NULL);
        put(frame + FRAME_PREVIOUS, addr(previous));
        put(frame + FRAME_CODE, addr(code));
        put(frame + FRAME_INSTR, addr(code + CODE_ADAPTIVE + 2 * (i % 100)));
    }
    put(code + CODE_NAME, addr(name));
    put(code + CODE_QUALNAME, addr(name));
    put(code + CODE_FILENAME, addr(name));
    put(code + CODE_LINETABLE, addr(table));
    put(name + UNICODE_LENGTH, 1ull << 30);
    uint32_t state = 1u << 2 | 1u << 5 | 1u << 6; /* kind 1, compact, ascii */
    memcpy(name + UNICODE_STATE, &state, 4);
    memset(name + UNICODE_ASCII_DATA, 'A', 4000);
    put(table + BYTES_SIZE, 1ull << 40);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "garbage";
    if (!strcmp(mode, "garbage"))
        memset(_PyRuntime, 0x41, sizeof _PyRuntime);
    else if (!strcmp(mode, "mismatch"))
        fake_interpreter(1, 0, 0);
    else if (!strcmp(mode, "loop"))
        fake_interpreter(2, 1, 1);
    else if (!strcmp(mode, "deep"))
        fake_interpreter(FRAMES, 0, 1);
    printf("ready %d\n", (int)gettid());
    fflush(stdout);
    _PyEval_EvalFrameDefault();
    return 0;
}
