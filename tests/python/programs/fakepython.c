/* A process that fakes a CPython 3.11 (built as "python3.11" with -rdynamic so _PyRuntime, Py_Version and
 * _PyEval_EvalFrameDefault are in .dynsym), for the hostile-input tests of frontend/runtimes/cpython/ and of the BPF
 * walker (bpf/python.c). The layout's offsets come as -D flags from the test (optrace's 3.11 table), or a
 * 3.13+ one: then RUNTIME_PREFIX is the _Py_DebugOffsets the test made (the start of _PyRuntime) and
 * CFRAME_CURRENT_FRAME is -1 (the thread state points at its frame).
 * Modes (argv[1]):
 *   garbage   _PyRuntime full of 0x41 bytes: interpreters.head points nowhere
 *   zero      _PyRuntime all zeros: an interpreter not started yet
 *   mismatch  a thread state whose interp does not point back to the interpreter
 *   loop      a consistent interpreter whose two frames point at each other; the code object's name claims
 *             1 GiB of characters and its line table 1 TiB of bytes
 *   deep      the same with a chain of 10000 distinct frames
 *   selfloop  the same with one frame that is its own previous frame
 *   names     a chain of NAMES frames, each with a code object of its own whose name, qualname, file name and
 *             line-table pointers point anywhere: NULL, 1, unmapped, kernel and non-canonical addresses, all
 *             ones, into the code object itself, 16 bytes before an unreadable page
 *   threads   10000 thread states, none of them this thread's (the first one consistent)
 *   churn     the deep chain, whose frames' instructions the spinning thread keeps changing: each sample's
 *             stack is one never seen before (with "spin")
 *   tables    the deep chain, each frame with a code object of its own (CODES of them) whose line table is one
 *             bytes object of 1 MiB of valid one-instruction entries, its instructions near the end of it;
 *             with "spin", the top 256 frames are given other code objects and instructions all the time
 *   alias     the deep chain, and the code object's first word points at the code object (with debug offsets
 *             whose frame "previous" is the frame's code object: a frame that is its own previous)
 *   rewrite   the deep chain, while a second thread rewrites the frames' previous, code and instruction
 *             pointers with garbage, loops and other frames all the time (memory changing under the walk)
 * With "spin" as argv[2] the main thread burns CPU inside _PyEval_EvalFrameDefault (a sampling profiler's
 * Python walker then runs at each sample); else it pauses there.
 * Prints "ready <native tid>" and waits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef RUNTIME_PREFIX
#define RUNTIME_PREFIX 0
#endif
const unsigned long Py_Version = PY_VERSION_HEX;
unsigned char _PyRuntime[1 << 16] = {RUNTIME_PREFIX};
#define FRAMES 10000
#define FRAME_SIZE 256
#define NAMES 9
#define CODE_SIZE 512
unsigned char arena[(1 << 16) + FRAMES * FRAME_SIZE];
unsigned char codes[NAMES][CODE_SIZE];
#define CODES 16384
#define TABLE_BYTES (1 << 20)
static volatile int spin, churn, tables;
static unsigned char *many_codes, *big_table;

static void put(unsigned char *at, uint64_t value) { memcpy(at, &value, 8); }
static uint64_t addr(unsigned char *at) { return (uint64_t)(uintptr_t)at; }

static unsigned char *interp = arena, *tstate = arena + 4096, *cframe = arena + 8192, *code = arena + 12288;
static unsigned char *name = arena + 16384, *table = arena + 20480, *frame0 = arena + 65536;

/* Frame i of the top 256 gets code object n and an instruction near the end of the big table. */
static void table_frame(int i, uint64_t n) {
    unsigned char *c = many_codes + n % CODES * CODE_SIZE;
    put(frame0 + i * FRAME_SIZE + FRAME_CODE, addr(c));
    put(frame0 + i * FRAME_SIZE + FRAME_INSTR, addr(c + CODE_ADAPTIVE + 2 * (60000 + n % 5000)));
}

void _PyEval_EvalFrameDefault(void) {
    for (uint64_t turn = 0;; turn++) {
        if (churn)
            put(frame0 + turn % 256 * FRAME_SIZE + FRAME_INSTR, addr(code + CODE_ADAPTIVE + 2 * (turn % 4093)));
        else if (tables && spin)
            table_frame(turn % 256, turn);
        else if (!spin)
            pause();
    }
}

static void fake_thread(unsigned char *state, uint64_t thread_id, uint64_t native_id, int back_pointer_ok) {
    put(state + TSTATE_INTERP, back_pointer_ok ? addr(interp) : addr(arena + 64));
    put(state + TSTATE_THREAD_ID, thread_id);
    put(state + TSTATE_NATIVE_THREAD_ID, native_id);
    put(state + TSTATE_FRAME, CFRAME_CURRENT_FRAME < 0 ? addr(frame0) : addr(cframe));
}

static void fake_interpreter(int frames, int loop, int back_pointer_ok) {
    put(_PyRuntime + INTERPRETERS_HEAD, addr(interp));
    put(interp + INTERP_THREADS_HEAD, addr(tstate));
    fake_thread(tstate, (uint64_t)pthread_self(), (uint64_t)gettid(), back_pointer_ok);
    if (CFRAME_CURRENT_FRAME >= 0)
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

/* Each frame's code object points its names at one of these (the last: 16 bytes before a PROT_NONE page). */
static void fake_names(void) {
    unsigned char *pages = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED || mprotect(pages + 4096, 4096, PROT_NONE))
        exit(1);
    memset(pages, 0x41, 4096);
    fake_interpreter(NAMES, 0, 1);
    for (int i = 0; i < NAMES; i++) {
        uint64_t anywhere[NAMES] = {0, 1, 0xdead00000000ull, 0xffffffff81000000ull, 0x8000000000000000ull,
                                    ~0ull, addr(codes[i]), addr(codes[i]) + 3, addr(pages + 4096 - 16)};
        put(frame0 + i * FRAME_SIZE + FRAME_CODE, addr(codes[i]));
        put(frame0 + i * FRAME_SIZE + FRAME_INSTR, addr(codes[i] + CODE_ADAPTIVE + 2 * i));
        put(codes[i] + CODE_NAME, anywhere[i]);
        put(codes[i] + CODE_QUALNAME, anywhere[(i + 1) % NAMES]);
        put(codes[i] + CODE_FILENAME, anywhere[(i + 2) % NAMES]);
        put(codes[i] + CODE_LINETABLE, anywhere[(i + 3) % NAMES]);
    }
}

/* CODES code objects named "t", all with the one big line table (valid entries, each one instruction). */
static void fake_tables(void) {
    fake_interpreter(FRAMES, 0, 1);
    many_codes = mmap(NULL, (size_t)CODES * CODE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    big_table = mmap(NULL, TABLE_BYTES + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (many_codes == MAP_FAILED || big_table == MAP_FAILED)
        exit(1);
    put(big_table + BYTES_SIZE, TABLE_BYTES);
    memset(big_table + BYTES_DATA, 0xF8, TABLE_BYTES - BYTES_DATA); /* code 15 (no location), one code unit each */
    put(name + UNICODE_LENGTH, 1);
    for (int n = 0; n < CODES; n++) {
        unsigned char *c = many_codes + n * CODE_SIZE;
        put(c + CODE_NAME, addr(name));
        put(c + CODE_QUALNAME, addr(name));
        put(c + CODE_FILENAME, addr(name));
        put(c + CODE_LINETABLE, addr(big_table));
    }
    for (int i = 0; i < FRAMES; i++)
        table_frame(i, i);
}

/* The deep chain's pointers rewritten by a thread of its own, as fast as it can: each frame's previous now
 * garbage, now itself, now another frame; its code and instruction likewise. */
static void *rewriter(void *unused) {
    (void)unused;
    for (uint64_t turn = 1;; turn++) {
        uint64_t r = turn * 0x9E3779B97F4A7C15ull;
        unsigned char *frame = frame0 + r % 300 * FRAME_SIZE;
        uint64_t choices[4] = {r >> 7, addr(frame), addr(frame0 + (r >> 20) % 300 * FRAME_SIZE), 0};
        put(frame + FRAME_PREVIOUS, choices[r >> 62]);
        put(frame + FRAME_CODE, turn % 3 ? addr(code) : r >> 3);
        put(frame + FRAME_INSTR, r >> 11);
    }
    return NULL;
}

/* FRAMES thread states linked by next, none with this thread's id: the first one passes the layout check. */
static void fake_threads(void) {
    fake_interpreter(1, 0, 1);
    for (int i = 0; i < FRAMES; i++) {
        unsigned char *state = frame0 + i * FRAME_SIZE;
        fake_thread(state, 0x1000 + i, 1 << 22 | i, 1);
        put(state + TSTATE_NEXT, i + 1 < FRAMES ? addr(state + FRAME_SIZE) : 0);
    }
    put(interp + INTERP_THREADS_HEAD, addr(frame0));
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "garbage";
    spin = argc > 2 && !strcmp(argv[2], "spin");
    if (!strcmp(mode, "garbage"))
        memset(_PyRuntime, 0x41, sizeof _PyRuntime);
    else if (!strcmp(mode, "mismatch"))
        fake_interpreter(1, 0, 0);
    else if (!strcmp(mode, "loop"))
        fake_interpreter(2, 1, 1);
    else if (!strcmp(mode, "deep"))
        fake_interpreter(FRAMES, 0, 1);
    else if (!strcmp(mode, "selfloop"))
        fake_interpreter(1, 1, 1);
    else if (!strcmp(mode, "names"))
        fake_names();
    else if (!strcmp(mode, "threads"))
        fake_threads();
    else if (!strcmp(mode, "churn"))
        fake_interpreter(FRAMES, 0, 1);
    else if (!strcmp(mode, "tables"))
        fake_tables();
    else if (!strcmp(mode, "alias")) {
        fake_interpreter(FRAMES, 0, 1);
        put(code, addr(code));
    }
    else if (!strcmp(mode, "rewrite")) {
        pthread_t thread;
        fake_interpreter(FRAMES, 0, 1);
        if (pthread_create(&thread, NULL, rewriter, NULL))
            exit(1);
    }
    churn = spin && !strcmp(mode, "churn");
    tables = !strcmp(mode, "tables");
    printf("ready %d\n", (int)gettid());
    fflush(stdout);
    _PyEval_EvalFrameDefault();
    return 0;
}
