// User stacks unwound from call-frame information (.eh_frame), for code built without frame pointers.
//
// Appended to profile.c by profiler.py (compiled with -DCFI_UNWIND): profile.c's on_sample calls
// unwind_user_stack() for processes whose mapping table user space has loaded (bpf/unwindmaps.py);
// the walk itself runs in the tail-called program unwind_step, UNWIND_FRAMES_PER_PROG frames per
// call, tail-calling itself until the stack ends or UNWIND_MAX_FRAMES frames are taken, then puts the
// stack in the stack store (stackstore.c) under a 64-bit hash of its frames, salted with the mapping
// tables' generation (a file id may name another file in the next one), and counts the sample.
//
// Per frame: find the mapping that holds the PC (binary search of the process's sorted mappings),
// then the file's row that holds the PC's ELF address (binary search of its rows in unwind_rows),
// compute the CFA, read the return address at CFA-8 and the caller's rbp if saved. A PC with no CFI
// (JIT code, a file whose table is not loaded) is walked by frame pointers. Frames in a known file are
// stored as (file id, file offset), named in user space even after the process exited; others as raw IPs.
//
// Verifier budget: bpf_loop needs a BPF_PSEUDO_FUNC relocation that BCC 0.26 does not make, so depth
// comes from tail calls: at most 33 per sample (MAX_TAIL_CALL_CNT; 32 before Linux 5.17), 4 frames per
// program, 128 frames in 32 programs. One frame is at most 9 + 24 bounded search steps. The mapping
// search's midpoint goes through memory (forget()): known exactly, it made the verifier follow every
// path through the halvings apart (160k instructions verified, 0.11 s of kernel CPU at start-up here);
// forgotten, the paths meet again at each step (17k, 0.015 s). The verifier's time now grows with the
// frames a program walks: 0.031 s with 8, which would take about 4% off the BPF time per sample (xz at
// 999 Hz: 5.0 -> 4.8 us, measured when 8 was the default).

#ifndef UNWIND_MAX_FRAMES
#define UNWIND_MAX_FRAMES 512  // a power of two, frames of either kind (native, Python)
#endif
#define UNWIND_FRAMES_PER_PROG 4
#define UNWIND_MAX_MAPPINGS 256  // executable file mappings per process, a power of two
#define MAPPING_SEARCH_STEPS 9   // log2(UNWIND_MAX_MAPPINGS) + 1
#define ROW_SEARCH_STEPS 24      // rows per file < 2^24
#ifndef UNWIND_ROWS
#define UNWIND_ROWS (1 << 20)
#endif
#ifndef UNWIND_PROCS
#define UNWIND_PROCS 8192
#endif

// Row kinds (keep in sync with optrace.frontend.unwind.table)
#define CFA_RSP 0
#define CFA_RBP 1
#define CFA_PLT 2
#define CFA_END 3
#define CFA_UNSUPPORTED 4
#define CFA_OUTERMOST 5
#define RBP_SAME 0
#define RBP_AT_CFA 1
#define RBP_UNSUPPORTED 2

// Why a walk ended (keep in sync with UNWIND_STATUSES in unwindmaps.py)
enum unwind_status {
    UNWIND_OUTERMOST = 0,  // CFI says the return address is undefined: the thread's first frame
    UNWIND_END,            // a zero return address or frame pointer: the end of a chain
    UNWIND_NO_CFI,         // frame pointers could not go on where there is no CFI
    UNWIND_EXPRESSION,     // a rule that needs a DWARF expression
    UNWIND_READ_FAULT,     // the stack could not be read, or did not grow towards its base
    UNWIND_DEPTH,          // UNWIND_STACK_CAP frames taken, or the sample's tail calls
    UNWIND_COPIED,         // a PC in a file mapped since the table was read: a copy of the stack goes on
};

// The programs of the walk, in unwind_progs (keep in sync with unwindmaps.py)
#define PROG_UNWIND_STEP 0
#define PROG_PYTHON_STEP 1    // python.c: the Python frames of one eval call
#define PROG_PYTHON_THREAD 2  // python.c: the sampled thread's PyThreadState
#define PROG_PYTHON_CAPTURE 3 // python.c: code objects of a new stack, captured for naming
#define PROG_COPY_PYTHON 4    // copypython.c: the Python frames of a copied sample's thread
#define UNWIND_PROGS 5

// Indices into unwind_counters (keep in sync with UNWIND_COUNTERS in unwindmaps.py)
enum unwind_counter {
    UNWIND_STACKS_FULL = 0,  // the stack store was full: the sample kept no user stack
    UNWIND_NO_USER_REGS,     // a kernel thread, or no user registers saved
    UNWIND_COPIES,           // stacks copied (stackcopy.c)
    UNWIND_COPIES_FULL,      // copies the ring buffer had no room for
    UNWIND_NR_COUNTERS,
};

// copy_head.flags (stackcopy.c; keep in sync with frontend/unwind/copies.py)
#define COPY_CONTINUES 1       // the copy goes on from the key's CFI stack (whose walk stopped at ip), else it
                               // replaces its user stack (the leaf the kernel took)
#define COPY_RETURN_ADDRESS 2  // ip is a return address (looked up at ip - 1)
#define COPY_SHARED 4          // several samples name the copy (a thread's stack at its exit, images.c)

#define MAPPING_COPY 1  // unwind_mapping.flags: the file's rows are not loaded (yet): a copy of the stack goes on

#define FILE_FRAME (1ULL << 63)  // a frame (file id << 40 | file offset), else a raw IP
#define FILE_OFFSET_BITS 40

struct unwind_row {
    u64 pc;  // ELF virtual address where the row starts; it holds until the next row's pc
    s32 cfa_offset;
    s16 rbp_offset;
    u8 cfa_type;
    u8 rbp_type;
};

struct unwind_mapping {
    u64 start;
    u64 end;
    u64 bias;        // ELF virtual address = pc - bias
    u64 offset_adj;  // file offset = pc + offset_adj
    u32 row_start;   // the file's rows in unwind_rows
    u32 row_count;   // 0: no CFI loaded, frame pointers
    u32 file_id;     // 0: frames stay raw IPs
    u32 flags;       // MAPPING_*
};

struct unwind_proc {
    u32 count;
    u32 pad;
    u64 epoch;  // the process's epoch (profile.c) when its mappings were read
    struct unwind_mapping maps[UNWIND_MAX_MAPPINGS];  // sorted by start, not overlapping
};

struct unwind_stack {
    u32 len;
    u32 status;  // enum unwind_status
    u64 frames[UNWIND_MAX_FRAMES];
};

struct unwind_state {
    struct unwind_stack stack;  // its frames are stored
    struct key_t key;           // the sample's count key, completed and counted at the end
    u64 ip;
    u64 sp;
    u64 bp;
    u64 hash;
    u32 set;             // the count set the sample belongs to
    u32 raw_frames;      // frames outside files with a build-id (JIT code): the count goes to rawcounts
    u32 kernel_missing;  // the sample's kernel stack could not be stored
    u32 forgotten;       // see forget()
    u32 walked;          // native frames walked (a return address is looked up at pc - 1)
    u64 wait_task;       // off-CPU (offcpu.c): the task whose wait the stack opens; 0: a CPU sample
    u64 wakee;           // a waker's stack (wakers.c): the task it woke, whose wait it joins; 0: none
    u32 stale;           // the process's mappings changed since its table was read (see unwind_frame)
    u32 fresh;           // the stack store had not held this stack yet (unwind_done)
    u32 image;           // walked from the process's image (images.c): it has no mapping table
    u32 pad_image;
    struct unwind_mapping image_map;  // the mapping image_mapping() found for the current frame
    struct python_walk py;  // python.c's part of the walk (python_walk.h)
};

BPF_F_TABLE("array", u32, struct unwind_row, unwind_rows, UNWIND_ROWS, BPF_F_MMAPABLE);
TABLE_BYTES(unwind_proc);  // see table_bytes.h
TABLE_BYTES(unwind_state);
BPF_F_TABLE("hash", u32, struct unwind_proc_bytes, unwind_procs, UNWIND_PROCS, BPF_F_NO_PREALLOC);
BPF_ARRAY(unwind_generation, u64, 1);  // the mapping tables' generation (UnwindMaps.generation)
BPF_PERCPU_ARRAY(unwind_states, struct unwind_state_bytes, 1);
BPF_PERCPU_ARRAY(unwind_counters, u64, UNWIND_NR_COUNTERS);
BPF_PROG_ARRAY(unwind_progs, UNWIND_PROGS);

#define UNWIND_STACK_CAP STORE_MAX_WORDS  // frames a stack holds: a stored record's most (508)

// Tail-calls the walk's program `prog`: returns only when the call could not be made (out of tail calls).
static inline void walk_call(void *ctx, struct unwind_state *st, u32 prog)
{
    st->py.tail_calls++;
    unwind_progs.call(ctx, prog);
}

static inline void unwind_count(u32 counter)
{
    u64 *slot = unwind_counters.lookup(&counter);
    if (slot)
        (*slot)++;
}

// The user registers the current task saved on kernel entry (0 for a kernel thread, or none saved).
static inline int task_user_registers(u64 *ip, u64 *sp, u64 *bp)
{
    struct task_struct *task = bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    u64 cs = 0;
    *ip = 0;
    if (!regs || bpf_probe_read_kernel(&cs, sizeof(cs), &regs->cs) || (cs & 3) != 3)
        return 0;
    bpf_probe_read_kernel(ip, sizeof(*ip), &regs->ip);
    bpf_probe_read_kernel(sp, sizeof(*sp), &regs->sp);
    bpf_probe_read_kernel(bp, sizeof(*bp), &regs->bp);
    return *ip != 0;
}

// The user registers: the sample's when it hit user mode, else those the task saved on kernel entry.
static inline int user_registers(struct bpf_perf_event_data *ctx, u64 *ip, u64 *sp, u64 *bp)
{
    if ((ctx->regs.cs & 3) == 3) {
        *ip = ctx->regs.ip;
        *sp = ctx->regs.sp;
        *bp = ctx->regs.bp;
        return 1;
    }
    return task_user_registers(ip, sp, bp);
}

static inline u32 copy_user_stack(struct key_t *key, u64 ip, u64 sp, u64 bp, u32 flags);  // stackcopy.c
static inline int walkable_image(u32 pid);  // images.c
static inline u32 exit_copy_of(u32 tid);  // images.c
static inline struct unwind_mapping *image_mapping(struct unwind_state *st, u64 pc);  // images.c

// The process exec'd: its mappings are all new (profile.c's exec tracepoint).
static inline void forget_unwind_table(u32 pid)
{
    unwind_procs.delete(&pid);
}

// A walk's state from its start: the sample's key, count set and wait, no frame yet.
static inline void unwind_begin(struct unwind_state *st, struct key_t *key, u32 set, int kernel_missing, u64 wait_task)
{
    u32 zero = 0, pid = key->pid;
    u64 *generation = unwind_generation.lookup(&zero);
    st->key = *key;
    st->set = set;
    st->raw_frames = 0;
    st->kernel_missing = kernel_missing;
    st->stack.len = 0;
    st->stack.status = UNWIND_DEPTH;
    st->walked = 0;
    st->fresh = 0;
    st->wait_task = wait_task;
    st->wakee = 0;
    st->image = 0;
    python_walk_start(&st->py, pid);
    st->hash = (FNV_BASIS ^ STACK_CFI ^ (generation ? *generation : 0) << 8) * FNV_PRIME;
}

// A walk's state from the first frame on (its registers are set), with the process's table (NULL: walked
// from its image, images.c).
static inline void unwind_start(struct unwind_state *st, struct unwind_proc *proc, struct key_t *key, u32 set,
                                int kernel_missing, u64 wait_task)
{
    unwind_begin(st, key, set, kernel_missing, wait_task);
    st->stale = proc ? proc->epoch != current_epoch(key->pid) : 0;
    st->image = !proc;
}

// Called by on_sample; returns only when the sample is not unwound here (the process has no mapping
// table, or the tail call failed): 1 when its stack is to be copied (stackcopy.c), 0 when it cannot be
// (no user registers). The caller then takes the frame-pointer stack (or its leaf, with a copy).
static inline int unwind_user_stack(struct bpf_perf_event_data *ctx, struct key_t *key, u32 set, int kernel_missing,
                                    u64 wait_task)
{
    u32 pid = key->pid;
    struct unwind_proc *proc = (struct unwind_proc *)unwind_procs.lookup(&pid);
    // A table older than the process's last new executable mapping (dlopen) still holds for every file it
    // has: a PC in none of its mappings may be in a file mapped since, and the walk goes on from a copy of
    // the stack there (unwind_frame), until user space loads the table again. An exec drops the table
    // (forget_unwind_table). A process without a table is walked from its image (images.c) when the kernel
    // holds a complete one: the files user space knows have rows by identity, and a PC in another is copied.
    int image = !proc && walkable_image(pid);
    if (!proc && !image)
        return 1;
    u32 zero = 0;
    struct unwind_state *st = (struct unwind_state *)unwind_states.lookup(&zero);
    if (!st)
        return 0;
    if (!user_registers(ctx, &st->ip, &st->sp, &st->bp)) {
        unwind_count(UNWIND_NO_USER_REGS);
        return 0;
    }
    unwind_start(st, proc, key, set, kernel_missing, wait_task);
    unwind_progs.call(ctx, PROG_UNWIND_STEP);
    return 1;  // the walker is not loaded yet
}

// `value` read back from the state's memory: the verifier no longer knows it, so the search paths that
// computed it differently are verified as one (it still checks every use against its bounds).
static inline u32 forget(struct unwind_state *st, u32 value)
{
    *(volatile u32 *)&st->forgotten = value;
    return *(volatile u32 *)&st->forgotten;
}

static inline struct unwind_mapping *find_mapping(struct unwind_state *st, struct unwind_proc *proc, u64 pc)
{
    u32 lo = 0, hi = proc->count;
    if (hi > UNWIND_MAX_MAPPINGS)
        hi = UNWIND_MAX_MAPPINGS;
    for (int i = 0; i < MAPPING_SEARCH_STEPS; i++) {
        if (lo >= hi)
            break;
        u32 mid = forget(st, (lo + hi) / 2);
        struct unwind_mapping *m = &proc->maps[mid & (UNWIND_MAX_MAPPINGS - 1)];
        if (pc < m->start)
            hi = mid;
        else if (pc >= m->end)
            lo = mid + 1;
        else
            return m;
    }
    return 0;
}

// The row that holds ELF address `vaddr`: the last of the file's rows whose pc <= vaddr.
static inline struct unwind_row *find_row(struct unwind_mapping *m, u64 vaddr)
{
    u32 first = m->row_start, lo = m->row_start, hi = m->row_start + m->row_count;
    for (int i = 0; i < ROW_SEARCH_STEPS; i++) {
        if (lo >= hi)
            break;
        u32 mid = lo + (hi - lo) / 2;
        struct unwind_row *row = unwind_rows.lookup(&mid);
        if (!row)
            return 0;
        if (row->pc <= vaddr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == first)
        return 0;
    u32 found = lo - 1;
    return unwind_rows.lookup(&found);
}

static inline int read_user(u64 *value, u64 address)
{
    return bpf_probe_read_user(value, sizeof(*value), (void *)address);
}

// Appends a frame word (a file frame, a raw IP, a Python frame); 1 when the stack is full.
static inline int push_frame(struct unwind_state *st, u64 frame)
{
    u32 n = st->stack.len;
    // Hides n's range from clang: knowing it (< UNWIND_MAX_FRAMES, one more per inlined frame), the optimizer
    // spent 0.6 s of the 1.5 s compile on this file here (0.15 s without); the verifier still sees the check.
    asm volatile("" : "+r"(n));
    if (n >= UNWIND_STACK_CAP) {
        st->stack.status = UNWIND_DEPTH;
        return 1;
    }
    if (!(frame & (FILE_FRAME | RUNTIME_FRAME)))
        st->raw_frames++;
    u32 slot = n;
    asm volatile("" : "+r"(slot));  // and clang keeps the mask the verifier needs
    st->stack.frames[slot & (UNWIND_MAX_FRAMES - 1)] = frame;
    st->stack.len = n + 1;
    st->hash = (st->hash ^ frame) * 0x100000001b3ULL;
    return 0;
}

// The eval frame being expanded stays as it is (no Python frame could take its place).
static inline int keep_eval_frame(struct unwind_state *st)
{
    st->py.mode = 0;
    return push_frame(st, st->py.native);
}

// Puts a Python frame word (0: none) of the eval call being expanded; 1 when the call's frames are done.
static inline int python_put(struct unwind_state *st, u64 word)
{
    if (word) {
        if (push_frame(st, word)) {
            st->py.status = PY_DEPTH;
            st->py.native_done = 1;
            return 1;
        }
        st->py.emitted++;
        st->py.frames++;
    }
    return st->py.call_done;
}

// The eval call's Python frames are done: back to the native walk, from the eval frame's caller.
static inline void python_call_done(struct unwind_state *st)
{
    st->py.mode = 0;
    if (!st->py.emitted && keep_eval_frame(st))  // no Python frame took its place
        st->py.native_done = 1;
}

// An eval frame's first Python frame, put right away when the thread's chain is known: for 3.8-3.10 and
// many calls of 3.11+ it is the call's only one, and python_step (a tail call) is not needed.
static inline void python_inline(struct unwind_state *st)
{
#ifdef PYTHON_UNWIND
    u32 pid = st->key.pid, zero = 0;
    struct py_proc *proc = py_procs.lookup(&pid);
    struct py_scratch *s = py_scratch.lookup(&zero);
    if (st->py.state == PY_READY && proc && s && python_put(st, python_next(&st->py, proc, s)))
        python_call_done(st);
#endif
}

// One frame: record the PC, then find the caller's registers. Returns 0 to go on, 1 when done. A PC in the
// Python interpreter's eval function is not recorded here: st->py.mode asks python_step to put the Python
// frames that call ran in its place (python.c), once the caller's registers are found.
static inline int unwind_frame(struct unwind_state *st, struct unwind_proc *proc)
{
    if (st->stack.len >= UNWIND_STACK_CAP) {
        st->stack.status = UNWIND_DEPTH;
        return 1;
    }
    u64 pc = st->ip;
    struct unwind_mapping *m = proc ? find_mapping(st, proc, pc) : image_mapping(st, pc);
    // A file whose rows are not loaded (unwindmaps.py loads a large file's once a copy shows they are used),
    // or maybe one mapped since the table was read (else anonymous code: frame pointers): a copy goes on.
    if (m ? m->flags & MAPPING_COPY : st->stale) {
        st->stack.status = UNWIND_COPIED;
        return 1;
    }
    u64 frame = pc;
    if (m && m->file_id)
        frame = FILE_FRAME | ((u64)m->file_id << FILE_OFFSET_BITS) | ((pc + m->offset_adj) & ((1ULL << FILE_OFFSET_BITS) - 1));
    if (python_eval_frame(&st->py, pc)) {
        st->py.native = frame;
        python_inline(st);
        if (st->py.native_done)  // the stack is full
            return 1;
    } else if (push_frame(st, frame)) {
        return 1;
    }
    u32 walked = st->walked;
    st->walked = walked + 1;

    struct unwind_row *row = 0;
    if (m && m->row_count)  // a return address is looked up at the call: pc - 1
        row = find_row(m, (walked ? pc - 1 : pc) - m->bias);
    u8 cfa_type = row ? row->cfa_type : CFA_END;
    u64 cfa, bp = st->bp, ra = 0;
    switch (cfa_type) {
    case CFA_RSP:
        cfa = st->sp + row->cfa_offset;
        break;
    case CFA_RBP:
        cfa = st->bp + row->cfa_offset;
        break;
    case CFA_PLT:
        cfa = st->sp + row->cfa_offset + ((pc & 15) >= 11 ? 8 : 0);
        break;
    case CFA_OUTERMOST:
        st->stack.status = UNWIND_OUTERMOST;
        return 1;
    case CFA_END:  // frame pointers: the caller's rbp at rbp, the return address above it
        if (!st->bp || st->bp < st->sp || read_user(&bp, st->bp) || read_user(&ra, st->bp + 8)) {
            st->stack.status = st->bp ? UNWIND_NO_CFI : UNWIND_END;
            return 1;
        }
        if (!ra) {
            st->stack.status = UNWIND_END;
            return 1;
        }
        st->ip = ra;
        st->sp = st->bp + 16;
        st->bp = bp;
        return 0;
    default:
        st->stack.status = UNWIND_EXPRESSION;
        return 1;
    }
    if (cfa <= st->sp || read_user(&ra, cfa - 8)) {
        st->stack.status = UNWIND_READ_FAULT;
        return 1;
    }
    if (row->rbp_type == RBP_AT_CFA) {
        if (read_user(&bp, cfa + row->rbp_offset)) {
            st->stack.status = UNWIND_READ_FAULT;
            return 1;
        }
    } else if (row->rbp_type != RBP_SAME) {
        st->stack.status = UNWIND_EXPRESSION;
        return 1;
    }
    if (!ra) {
        st->stack.status = UNWIND_END;
        return 1;
    }
    st->ip = ra;
    st->sp = cfa;
    st->bp = bp;
    return 0;
}

// The walked stack stored (once per store epoch) as the sample's user stack; when the store is full, the
// sample keeps none.
static inline void unwind_store(struct unwind_state *st)
{
    u32 status = st->stack.status | st->py.status << 8;
    u64 hash = (st->hash ^ st->stack.len) * FNV_PRIME;
    hash = (hash ^ status) * FNV_PRIME;
    u32 len = st->stack.len;
    if (len > UNWIND_MAX_FRAMES)
        len = UNWIND_MAX_FRAMES;
    st->key.user = store_stack(st->stack.frames, len, hash, STACK_CFI, status, &st->fresh);
    st->key.user_kind = st->key.user ? STACK_CFI : 0;
    st->key.epoch = 0;
    if (!st->key.user)
        unwind_count(UNWIND_STACKS_FULL);
}

// The walk is over: store the stack (once per store epoch) and count the sample under it; when the store
// is full, the sample keeps no user stack.
static inline void unwind_done(void *ctx, struct unwind_state *st)
{
    st->key.copy = 0;
    // A waker's stack is not copied (its wakeup is joined at once, wakers.c): it ends where the copy would go on.
    if (st->stack.status == UNWIND_COPIED && (st->wakee ||
        !copy_user_stack(&st->key, st->ip, st->sp, st->bp, COPY_CONTINUES | (st->walked ? COPY_RETURN_ADDRESS : 0))))
        st->stack.status = UNWIND_NO_CFI;  // no room for the copy: the walk ends here
#ifdef PYTHON_UNWIND
    else if (st->stack.status == UNWIND_COPIED && (st->py.state == PY_PENDING || st->py.state == PY_READY))
        unwind_progs.call(ctx, PROG_COPY_PYTHON);  // the rest of its Python frames, then stored and counted there
#endif
    if (st->stack.status == UNWIND_READ_FAULT)  // an exiting thread's stack is gone: the copy taken as it began
        st->key.copy = exit_copy_of(st->key.tid);  // replaces the user stack (images.c)
    unwind_store(st);
#ifdef WAKERS
    if (st->wakee) {
        note_waker(st->wakee, &st->key);
        return;
    }
#endif
#ifdef OFF_CPU
    if (st->wait_task) {
        open_wait(st->wait_task, &st->key);
        return;
    }
#endif
    count_stack_loss(!st->key.user, st->kernel_missing);
    add_count(&st->key, st->set, st->key.user && (st->raw_frames || st->key.copy));
}

// The end of a sample's walk, from any of the walk's programs: the stack stored and counted, then the code
// objects of a new stack with Python frames captured (python.c).
static inline void unwind_finish(void *ctx, struct unwind_state *st)
{
    unwind_done(ctx, st);
    if (st->fresh && st->py.frames) {
        st->py.scanned = 0;
        st->py.emitted = 0;
        walk_call(ctx, st, PROG_PYTHON_CAPTURE);
    }
}

// The native walk goes on (unwind_step), or, when the tail calls left are for the rest of the thread's Python
// frames, python_step puts those and ends the sample (python_rest_due). Returns when out of tail calls.
static inline void python_rest_or_step(void *ctx, struct unwind_state *st)
{
    if (python_rest_due(&st->py, st->stack.len, UNWIND_STACK_CAP)) {
        st->py.rest = 1;
        walk_call(ctx, st, PROG_PYTHON_STEP);
        st->py.rest = 0;
    }
    walk_call(ctx, st, PROG_UNWIND_STEP);
}

int unwind_step(void *ctx)
{
    u32 zero = 0;
    struct unwind_state *st = (struct unwind_state *)unwind_states.lookup(&zero);
    if (!st)
        return 0;
    u32 pid = st->key.pid;
    struct unwind_proc *proc = st->image ? 0 : (struct unwind_proc *)unwind_procs.lookup(&pid);
    int done = 0;
    if (!proc && !st->image) {  // user space dropped the table meanwhile
        st->stack.status = UNWIND_NO_CFI;
        done = 1;
    }
    for (int i = 0; i < UNWIND_FRAMES_PER_PROG && !done && !st->py.mode; i++)
        done = unwind_frame(st, proc);
    if (st->py.mode) {  // an eval call's Python frames come next, then the walk goes on (or ends)
        st->py.native_done = done;
        walk_call(ctx, st, PROG_PYTHON_STEP);
        keep_eval_frame(st);  // no Python step: the eval frame stays as it is
    } else if (!done) {
        python_rest_or_step(ctx, st);
    }
    if (!done)
        st->stack.status = UNWIND_DEPTH;  // out of tail calls
    unwind_finish(ctx, st);
    return 0;
}
