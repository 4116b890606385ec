// Python frames in the CFI walker's stacks (appended after unwind.c by profiler.py, with -DPYTHON_UNWIND).
//
// A native frame in the interpreter's eval function (_PyEval_EvalFrameDefault) is replaced by the Python
// frames that eval call ran (unwind.c hands over through python_walk.mode): python_step reads the thread's
// frame chain, PY_FRAMES_PER_PROG frames per program, and puts a frame word per Python frame (the code
// object's address and the instruction in code units: optrace/pythonlayout.py), until the call's first
// frame: the one frame of a call up to 3.10, the frame marked is_entry in 3.11, the C stack's shim frame
// from 3.12. The native walk then goes on from the eval frame's caller, so native frames between two eval
// calls (a builtin calling back into Python) stay where they are.
//
// The thread's PyThreadState is found once per thread: the walk of the interpreter's thread list
// (python_thread) matches thread_id (pthread_self(), the thread's fs base on x86_64) and caches the
// state in py_threads, checked again at every use (a thread state is freed with its thread).
//
// Names: the first time a stored stack holds a code object of a process, python_capture copies the code
// object's first bytes and the name, file and line-table objects it points to into a perf buffer
// (py_captures), so user space names the frames even after the process is gone (frontend/runtimes/cpython/).
//
// Everything read here is the process's memory, which its owner controls: every read is bounded, every
// loop has a fixed bound, a chain that loops or runs too deep ends the stack's Python part with a status
// (python_walk.status), and offsets from the map are masked to the windows read.

#define PY_MAX_THREADS 256       // thread states searched per program
#define PY_THREAD_PROGS 4        // programs a search may take: a thread beyond 1,024 states has no Python frames
#define PY_MISS_NS 100000000ULL  // a thread not found is not searched for again for 100 ms
#define PY_CAPTURES_PER_SAMPLE 4  // code objects captured at most per sample (the others at a later one)
#define PY_SCAN_FRAMES 32         // frames python_capture looks at per program
#define PY_CODE_WINDOW 256        // CODE_WINDOW
#define PY_NAME_BYTES 160         // CAPTURE_PARTS
#define PY_FILE_BYTES 320
#define PY_LINES_BYTES 1056

struct py_capture {
    u32 pid;
    u32 failed;  // bit i: part i could not be read (its bytes are zeros)
    u64 code;
    u8 code_bytes[PY_CODE_WINDOW];
    u8 name[PY_NAME_BYTES];
    u8 qualname[PY_NAME_BYTES];
    u8 filename[PY_FILE_BYTES];
    u8 linetable[PY_LINES_BYTES];
};

struct py_seen_key {
    u32 pid;
    u32 pad;
    u64 code;
};

TABLE_BYTES(py_capture);
struct py_thread {
    u64 tstate;     // the thread's PyThreadState, 0: not found
    u64 missed_at;  // when it was not found (bpf_ktime_get_ns): not searched again for PY_MISS_NS
};

BPF_TABLE("lru_hash", u64, struct py_thread, py_threads, 16384);  // pid << 32 | tid -> its PyThreadState
BPF_TABLE("lru_hash", struct py_seen_key, u32, py_seen, 65536);  // code objects captured: process instance
BPF_PERCPU_ARRAY(py_capture_scratch, struct py_capture_bytes, 1);
BPF_PERF_OUTPUT(py_captures);

static inline struct unwind_state *walk_state(void)
{
    u32 zero = 0;
    return (struct unwind_state *)unwind_states.lookup(&zero);
}

// The thread's fs base: what pthread_self() returns, and what a PyThreadState's thread_id holds.
static inline u64 thread_fs_base(void)
{
    u32 offset = kernel_offset(TASK_FSBASE);
    u64 base = 0;
    if (offset)
        bpf_probe_read_kernel(&base, sizeof(base), (void *)bpf_get_current_task() + offset);
    return base;
}

// The frame the thread's state says runs now: its first Python frame.
static inline u64 current_frame(struct py_proc *proc, u64 tstate)
{
    u64 frame = read_word(tstate + (proc->tstate_frame & 0xffff));
    if (frame && proc->cframe_current_frame != PY_NO_OFFSET)
        frame = read_word(frame + (proc->cframe_current_frame & 0xffff));
    return frame;
}

// Whether the thread's state is known: its cached state still belongs to it (the walk's first frame is
// set), or it was not found a moment ago (the walk fails at once, rather than search every sample again).
static inline int python_thread_ready(struct unwind_state *st, struct py_proc *proc)
{
    u64 key = (u64)st->key.pid << 32 | st->key.tid;
    struct py_thread *cached = py_threads.lookup(&key);
    if (!cached)
        return 0;
    u64 tstate = cached->tstate;
    if (!tstate) {
        if (bpf_ktime_get_ns() - cached->missed_at >= PY_MISS_NS)
            return 0;
        python_fail(&st->py, PY_NO_THREAD);
        return 1;
    }
    u64 base = thread_fs_base();
    if (!base || read_word(tstate + (proc->tstate_thread_id & 0xffff)) != base) {
        py_threads.delete(&key);
        return 0;
    }
    st->py.frame = current_frame(proc, tstate);
    st->py.state = PY_READY;
    return 1;
}

// The rest of the thread's chain is put (rest mode): the sample ends with every Python frame and the native
// frames walked before the rest began.
static inline void python_rest_end(struct unwind_state *st)
{
    st->stack.status = UNWIND_DEPTH;
    if (!st->py.status)
        st->py.status = PY_NATIVE_CUT;
}

// python_step could not be reached (out of tail calls): the eval frame stays as it is and the stack ends here.
static inline void python_give_up(void *ctx, struct unwind_state *st)
{
    keep_eval_frame(st);
    st->stack.status = UNWIND_DEPTH;
    unwind_finish(ctx, st);
}

// The sample's tail calls are spent: its stack ends here.
static inline void python_out_of_calls(struct unwind_state *st, u32 status)
{
    st->stack.status = UNWIND_DEPTH;
    st->py.status = st->py.status ? st->py.status : status;
    st->py.native_done = 1;
}

// One Python frame of the chain: 0 to go on with this eval call, 1 when its frames are done.
static inline int python_frame(struct unwind_state *st, struct py_proc *proc, struct py_scratch *s)
{
    return python_put(st, python_next(&st->py, proc, s));
}

// Puts the Python frames of one eval call in place of its native frame, then hands back to the native
// walk (or ends the sample when that walk is over, or the stack is full).
int python_step(void *ctx)
{
    struct unwind_state *st = walk_state();
    if (!st)
        return 0;
    u32 pid = st->key.pid, zero = 0;
    struct py_proc *proc = py_procs.lookup(&pid);
    struct py_scratch *s = py_scratch.lookup(&zero);
    if (!proc || !s) {
        python_fail(&st->py, PY_NO_THREAD);
    } else if (st->py.state == PY_PENDING && !python_thread_ready(st, proc)) {
        walk_call(ctx, st, PROG_PYTHON_THREAD);
        python_fail(&st->py, PY_NO_THREAD);  // out of tail calls
    }
    int done = st->py.state != PY_READY;
    for (int i = 0; i < PY_FRAMES_PER_PROG && !done; i++)
        done = python_frame(st, proc, s);
    if (!done) {
        walk_call(ctx, st, PROG_PYTHON_STEP);
        python_out_of_calls(st, PY_DEPTH);  // this call's Python frames are cut short
    }
    if (st->py.rest) {
        python_rest_end(st);
    } else {
        python_call_done(st);
        if (!st->py.native_done) {
            python_rest_or_step(ctx, st);
            python_out_of_calls(st, PY_OK);
        }
    }
    unwind_finish(ctx, st);
    return 0;
}

// Finds the thread's PyThreadState in the interpreter's list (PY_MAX_THREADS states per program, the search
// going on in the next one, up to PY_THREAD_PROGS), caches what it found or that it found none, and goes
// back to python_step.
int python_thread(void *ctx)
{
    struct unwind_state *st = walk_state();
    if (!st)
        return 0;
    u32 pid = st->key.pid;
    struct py_proc *proc = py_procs.lookup(&pid);
    u64 base = thread_fs_base();
    if (!proc || !base) {
        python_fail(&st->py, PY_NO_THREAD);
        walk_call(ctx, st, PROG_PYTHON_STEP);
        python_give_up(ctx, st);
        return 0;
    }
    u64 tstate = st->py.scan;
    if (!st->py.scans) {
        u64 interp = read_word(proc->runtime + (proc->interpreters_head & 0xffff));
        tstate = interp ? read_word(interp + (proc->interp_threads_head & 0xffff)) : 0;
    }
    u32 id_at = proc->tstate_thread_id & 0xffff, next_at = proc->tstate_next & 0xffff;
    for (int i = 0; i < PY_MAX_THREADS && tstate; i++) {
        if (read_word(tstate + id_at) == base)
            break;
        tstate = read_word(tstate + next_at);
    }
    u64 key = (u64)pid << 32 | st->key.tid;
    struct py_thread found = {.tstate = tstate};
    if (tstate && read_word(tstate + id_at) == base) {
        st->py.frame = current_frame(proc, tstate);
        st->py.state = PY_READY;
        py_threads.update(&key, &found);
    } else if (tstate && st->py.scans + 1 < PY_THREAD_PROGS) {
        st->py.scan = tstate;  // the list goes on: searched on by the next program
        st->py.scans++;
        walk_call(ctx, st, PROG_PYTHON_THREAD);
        python_fail(&st->py, PY_NO_THREAD);  // out of tail calls (not cached: the thread may be there)
    } else {
        found.tstate = 0;
        found.missed_at = bpf_ktime_get_ns();
        py_threads.update(&key, &found);
        python_fail(&st->py, PY_NO_THREAD);
    }
    walk_call(ctx, st, PROG_PYTHON_STEP);
    python_give_up(ctx, st);
    return 0;
}

// The first bytes of the object at `address` into `to`, or its failure bit set (no branch: four of them in
// each of four captures were the most of what the verifier walked).
static inline void capture_part(u8 *to, u32 size, u64 address, u32 bit, struct py_capture *c)
{
    c->failed |= (bpf_probe_read_user(to, size, (void *)address) != 0) << bit;
}

static inline u64 code_pointer(struct py_capture *c, u32 offset)
{
    offset &= PY_CODE_WINDOW - 1;
    if (offset > PY_CODE_WINDOW - 8)
        return 0;
    return *(u64 *)&c->code_bytes[offset];
}

static inline int capture_code(void *ctx, struct py_proc *proc, u32 pid, u64 code)
{
    u32 zero = 0;
    struct py_capture *c = (struct py_capture *)py_capture_scratch.lookup(&zero);
    if (!c || bpf_probe_read_user(c->code_bytes, sizeof(c->code_bytes), (void *)code))
        return -1;
    c->pid = pid;
    c->code = code;
    c->failed = 0;
    capture_part(c->name, sizeof(c->name), code_pointer(c, proc->code_name), 1, c);
    capture_part(c->qualname, sizeof(c->qualname), code_pointer(c, proc->code_qualname), 2, c);
    capture_part(c->filename, sizeof(c->filename), code_pointer(c, proc->code_filename), 3, c);
    capture_part(c->linetable, sizeof(c->linetable), code_pointer(c, proc->code_linetable), 4, c);
    return py_captures.perf_submit(ctx, c, sizeof(struct py_capture));
}

// The code objects of a stack just stored that this process has not had captured (at most
// PY_CAPTURES_PER_SAMPLE: the rest wait for a later sample of a stack that holds them). The frames are
// looked at PY_SCAN_FRAMES per program (tail-calling itself), then the code objects found are captured:
// one loop over all the frames took the verifier 0.6 s of CPU.
int python_capture(void *ctx)
{
    struct unwind_state *st = walk_state();
    if (!st)
        return 0;
    u32 pid = st->key.pid;
    struct py_proc *proc = py_procs.lookup(&pid);
    if (!proc)
        return 0;
    u32 instance = proc->instance;
    // The count and the codes live in the walk's state, not on the stack: the verifier tracks stack
    // slots and registers, and states told apart by them made the loop more than it verifies.
    volatile u32 *found = &st->py.emitted;
    u32 first = st->py.scanned, len = st->stack.len;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < PY_SCAN_FRAMES; i++) {
        u32 at = first + i;
        if (at >= len || *found >= PY_CAPTURES_PER_SAMPLE)
            break;
        u64 word = st->stack.frames[at & (UNWIND_MAX_FRAMES - 1)];
        if ((word & RUNTIME_WORD_MASK) != PYTHON_FRAME)
            continue;
        struct py_seen_key key = {.pid = pid, .code = ((word >> PY_CODE_SHIFT) & PY_CODE_MASK) << 3};
        u32 *seen = py_seen.lookup(&key);
        if (!seen || *seen != instance)
            st->py.capture[(*found)++ & (PY_CAPTURES_PER_SAMPLE - 1)] = key.code;
    }
    st->py.scanned = first + PY_SCAN_FRAMES;
    if (st->py.scanned < len && *found < PY_CAPTURES_PER_SAMPLE)
        walk_call(ctx, st, PROG_PYTHON_CAPTURE);  // the next frames; out of tail calls: capture these
#pragma clang loop unroll(disable)
    for (int i = 0; i < PY_CAPTURES_PER_SAMPLE; i++) {
        struct py_seen_key key = {.pid = pid, .code = st->py.capture[i]};
        if (i >= *found || !key.code)
            break;
        if (capture_code(ctx, proc, pid, key.code) == 0)
            py_seen.update(&key, &instance);
    }
    return 0;
}
