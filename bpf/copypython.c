// The Python frames of a copied sample (appended after python.c by profiler.py, with -DPYTHON_UNWIND): a
// sample of a Python process whose unwind table is not loaded has its stack copied (stackcopy.c), and so
// does a CFI walk that meets a file whose rows are not in the kernel (unwind.c's unwind_done), but the
// Python frames of the part walked in user space are the thread's frame chain in the heap, gone by then.
// So copy_python, tail-called by copy_sample_stack or unwind_done, reads the rest of the chain now
// (python.c's python_next, from the thread's state found as python.c finds it, or from where the walk's
// Python frames stopped) and stores its frame words, leaf first, after what the walk took (nothing, for a
// first sample), each marked CHAIN_WORD, the last of each eval call CHAIN_CALL_END. It then counts the sample
// (or opens its wait) as on_sample (unwind_done) would have, with the copy, which user space walks later,
// putting each eval call's frames in place of its eval frame (frontend/unwind/copies.py). A first sample
// whose chain cannot be read keeps the kernel's leaf, as before.
//
// The thread's state: python_thread (python.c) is loaded a second time (bpf/unwindmaps.py) with chain_progs
// for its program array, where PROG_PYTHON_STEP is copy_python and PROG_PYTHON_THREAD that copy: its search,
// done, comes back here.

#define CHAIN_CALL_END (1ULL << 61)  // in a chain's frame word: its eval call's last frame (copies.py)
#define CHAIN_WORD (1ULL << 60)      // a frame word of the chain read at the copy (not walked with the stack)

BPF_PROG_ARRAY(chain_progs, UNWIND_PROGS);

// One Python frame of the chain into the sample's stack; at a 3.12+ shim (no frame: the call's end), the
// frame put before it is marked as its call's last.
static inline void chain_frame(struct unwind_state *st, struct py_proc *proc, struct py_scratch *s)
{
    u64 word = python_next(&st->py, proc, s);
    if (word) {
        if (push_frame(st, word | CHAIN_WORD | (st->py.call_done ? CHAIN_CALL_END : 0)))
            python_fail(&st->py, PY_DEPTH);
        else
            st->py.frames++;
        return;
    }
    u32 last = st->stack.len;
    asm volatile("" : "+r"(last));
    if (st->py.call_done && last > 0 && last <= UNWIND_MAX_FRAMES &&
        (st->stack.frames[(last - 1) & (UNWIND_MAX_FRAMES - 1)] & CHAIN_WORD))
        st->stack.frames[(last - 1) & (UNWIND_MAX_FRAMES - 1)] |= CHAIN_CALL_END;
}

// The chain is taken: the sample stored and counted (or its wait opened), then its code objects captured.
// Its key has the copy: counted with the keys whose stacks are decoded at each drain.
static inline void chain_done(void *ctx, struct unwind_state *st)
{
    if (!st->stack.len) {  // no Python frame: the kernel's leaf, as on_sample takes it for a copy
        int user_missing = 0, files_only = 0;
        take_user_stack(ctx, &st->key, &user_missing, &files_only);
#ifdef OFF_CPU
        if (st->wait_task) {
            open_wait(st->wait_task, &st->key);
            return;
        }
#endif
        count_stack_loss(user_missing, st->kernel_missing);
        add_count(&st->key, st->set, 1);
        return;
    }
    st->stack.status = UNWIND_COPIED;
    unwind_store(st);
#ifdef OFF_CPU
    if (st->wait_task)
        open_wait(st->wait_task, &st->key);
    else
#endif
    {
        count_stack_loss(!st->key.user, st->kernel_missing);
        add_count(&st->key, st->set, 1);
    }
    if (st->fresh) {
        st->py.scanned = 0;
        st->py.emitted = 0;
        unwind_progs.call(ctx, PROG_PYTHON_CAPTURE);
    }
}

// Whether the thread's state is known (python.c's cache); else its search, which comes back to copy_python
// (no return then; out of tail calls: no Python frames).
static inline void chain_thread(void *ctx, struct unwind_state *st, struct py_proc *proc)
{
    if (st->py.state != PY_PENDING || python_thread_ready(st, proc))
        return;
    chain_progs.call(ctx, PROG_PYTHON_THREAD);
    python_fail(&st->py, PY_NO_THREAD);
}

int copy_python(void *ctx)
{
    u32 zero = 0;
    struct py_scratch *s = py_scratch.lookup(&zero);
    struct unwind_state *st = walk_state();
    if (!st)
        return 0;
    u32 pid = st->key.pid;
    struct py_proc *proc = py_procs.lookup(&pid);
    if (proc && s)
        chain_thread(ctx, st, proc);
    else
        python_fail(&st->py, PY_NO_THREAD);
    for (int i = 0; i < PY_FRAMES_PER_PROG && proc && s && st->py.state == PY_READY && st->py.frame; i++)
        chain_frame(st, proc, s);
    if (st->py.state == PY_READY && st->py.frame) {
        chain_progs.call(ctx, PROG_PYTHON_STEP);  // the next frames
        python_fail(&st->py, PY_DEPTH);            // out of tail calls: the chain is cut here
    }
    chain_done(ctx, st);
    return 0;
}
