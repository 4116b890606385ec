// Copies of user stacks, for samples the CFI walker cannot walk yet (appended after unwind.c by profiler.py,
// with -DCFI_UNWIND): a process whose unwind table is not loaded (its first samples), or a PC in a file
// mapped since its table was read. As perf's dwarf mode does, the sample keeps the user registers and the
// stack's first bytes; user space walks them with the same rules once the process's tables are there
// (frontend/unwind/stackcopy.py), so no sample's stack depends on when its table was loaded.
//
// A copy goes to the ring buffer `stack_copies` as a head and the stack's bytes from rsp up: a first
// partial page, then whole pages until COPY_MAX_BYTES or the first page that cannot be read (the end of
// the stack's mapping). The count key names it by id (key_t.copy): each copied sample is a count of its
// own, decoded at every drain. A full ring costs the copy, not the sample: it takes the kernel's
// frame-pointer stack as before (counted, `copies_full`).
//
// A Python process's copy keeps its Python frames, which live in the process's heap, not on its stack: the
// copy's head has the interpreter's eval function (py_procs), and copy_sample_stack goes on in copy_python
// (copypython.c), which stores the thread's Python frames as the sample's user stack; user space puts each
// eval call's frames in place of its eval frame when it walks the copy (frontend/unwind/copies.py).
//
// The first copy of a process's epoch wakes user space (whose loop polls the ring's fd), which loads the
// process's tables at once: its copies stop, and the ones taken are walked with the mappings it read.
// The others do not wake anyone: the ring is read at every drain and every poll.

#ifndef COPY_MAX_BYTES
#define COPY_MAX_BYTES 28672  // a multiple of COPY_PAGE (profiler.py sets it from stackcopies.py)
#endif
#ifndef COPY_RING_PAGES
#define COPY_RING_PAGES 2048
#endif
#define COPY_PAGE 4096
#define COPY_PAGES (COPY_MAX_BYTES / COPY_PAGE)

struct copy_head {
    u32 id;
    u32 pid;
    u32 tid;
    u32 bytes;  // of stack after the head
    u64 epoch;  // the process's mappings epoch (profile.c) when the copy was taken
    u64 exec_epoch;  // when the process last exec'd (0: not seen)
    u64 ip;
    u64 sp;
    u64 bp;
    u32 flags;  // COPY_* (unwind.c)
    u32 pad;
    u64 eval[4];  // a Python process's eval function: [start, end) twice (py_procs), else zeros
};

struct copy_buffer {
    struct copy_head head;
    u8 stack[COPY_MAX_BYTES];
};

TABLE_BYTES(copy_buffer);
BPF_PERCPU_ARRAY(copy_scratch, struct copy_buffer_bytes, 1);
BPF_RINGBUF_OUTPUT(stack_copies, COPY_RING_PAGES);
BPF_ARRAY(copy_ids, u64, 1);  // the last id handed out (ids are its low 32 bits, 0 is no copy)
BPF_TABLE("lru_hash", u32, u64, copy_wakes, PROCS_SIZE);  // pid -> the epoch whose first copy woke user space

// The stack's bytes from sp, as many whole pages as can be read after the first partial one.
static inline u32 copy_stack_bytes(struct copy_buffer *buf, u64 sp)
{
    u32 done = COPY_PAGE - (sp & (COPY_PAGE - 1));
    if (bpf_probe_read_user(buf->stack, done, (void *)sp))
        return 0;
#pragma clang loop unroll(disable)
    for (int i = 1; i < COPY_PAGES; i++) {
        if (done > COPY_MAX_BYTES - COPY_PAGE)
            break;
        if (bpf_probe_read_user(buf->stack + done, COPY_PAGE, (void *)(sp + done)))
            break;
        done += COPY_PAGE;
    }
    return done;
}

static inline int copy_allowed(u32 pid);  // images.c: copies of one process are bounded per second

// Copies the stack at (ip, sp, bp) and names it in the key; 0 when no copy was kept (the ring is full, the
// process had its copies for this second, or the stack cannot be read).
static inline u32 copy_user_stack(struct key_t *key, u64 ip, u64 sp, u64 bp, u32 flags)
{
    u32 zero = 0;
    if (!copy_allowed(key->pid))
        return 0;
    struct copy_buffer *buf = (struct copy_buffer *)copy_scratch.lookup(&zero);
    u64 *last_id = copy_ids.lookup(&zero);
    if (!buf || !last_id)
        return 0;
    u32 bytes = copy_stack_bytes(buf, sp);
    if (!bytes)
        return 0;
    u32 pid = key->pid;
    u64 epoch = current_epoch(pid);
    u64 *exec_epoch = exec_epochs.lookup(&pid);
    buf->head.pid = pid;
    buf->head.tid = key->tid;
    buf->head.bytes = bytes;
    buf->head.epoch = epoch;
    buf->head.exec_epoch = exec_epoch ? *exec_epoch : 0;
    buf->head.ip = ip;
    buf->head.sp = sp;
    buf->head.bp = bp;
    buf->head.flags = flags;
    buf->head.pad = 0;
    __builtin_memset(buf->head.eval, 0, sizeof(buf->head.eval));
#ifdef PYTHON_UNWIND
    struct py_proc *py = py_procs.lookup(&pid);
    if (py) {
        buf->head.eval[0] = py->eval_start0;
        buf->head.eval[1] = py->eval_end0;
        buf->head.eval[2] = py->eval_start1;
        buf->head.eval[3] = py->eval_end1;
    }
#endif
    u32 id = __sync_fetch_and_add(last_id, 1) + 1;  // a u64: BPF's fetch-and-add returns 64-bit values only
    if (!id)  // wrapped: 0 means none
        id = __sync_fetch_and_add(last_id, 1) + 1;
    buf->head.id = id;
    u64 *woke = copy_wakes.lookup(&pid);
    u64 wake = BPF_RB_NO_WAKEUP;
    if (!woke || *woke != epoch) {
        copy_wakes.update(&pid, &epoch);
        wake = BPF_RB_FORCE_WAKEUP;
    }
    u32 size = sizeof(struct copy_head) + bytes;
    if (size > sizeof(struct copy_buffer))
        return 0;
    if (stack_copies.ringbuf_output(buf, size, wake)) {
        unwind_count(UNWIND_COPIES_FULL);
        return 0;
    }
    unwind_count(UNWIND_COPIES);
    key->copy = id;
    return id;
}

// A sample of a process without an unwind table: its user registers and stack copied (on_sample, and
// on_switch_out for off-CPU waits); 0 when there is no copy. A Python process's sample goes on in
// copy_python (copypython.c), which takes its Python frames and counts it or opens its wait (``set``,
// ``kernel_missing``, ``wait_task``: the caller's): no return then.
static inline u32 copy_sample_stack(struct bpf_perf_event_data *ctx, struct key_t *key, u32 set, int kernel_missing,
                                    u64 wait_task)
{
    u64 ip, sp, bp;
    if (!user_registers(ctx, &ip, &sp, &bp))
        return 0;
    u32 id = copy_user_stack(key, ip, sp, bp, 0);
#ifdef PYTHON_UNWIND
    u32 zero = 0, pid = key->pid;
    struct unwind_state *st = (struct unwind_state *)unwind_states.lookup(&zero);
    if (id && st && py_procs.lookup(&pid)) {
        unwind_begin(st, key, set, kernel_missing, wait_task);
        st->py.emitted = 0;
        unwind_progs.call(ctx, PROG_COPY_PYTHON);  // the program is not loaded yet: the kernel's leaf
    }
#endif
    return id;
}
