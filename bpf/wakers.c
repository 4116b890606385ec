// Waker stacks (record --off-cpu --wakers): the stacks of the thread that wakes a thread with an open wait
// (offcpu.c), taken at the wake-up, kept for the woken task (offcpu.c's note_waker) and joined to its wait's
// time when it runs again, as BCC's offwaketime joins them (it takes frame-pointer stacks on a kprobe; this
// kernel has none). Appended last (after unwind.c, stackcopy.c and python.c when they are compiled in), with
// -DWAKERS.
//
// on_waking is a raw tracepoint on sched_waking, which try_to_wake_up fires in the waker's context (the
// thread that wakes, or whatever an interrupt that wakes came in). It cannot tail-call the CFI walker's
// programs, which are perf-event programs (a program array serves programs of one type): the walker's
// programs are loaded a second time as raw tracepoint programs (offcpu.py's load_walker), with this file's
// waker_progs and waker_states in place of unwind_progs and unwind_states (bpf/programobject.py sets each
// map reference of a loaded copy), so a waker's stack is walked by the same code, Python frames and all,
// with a state of its own. A waker whose process has no unwind table (or before the copies are loaded)
// gets the kernel's frame-pointer stack, as build-id frames (named without its mappings); its stack is
// never copied (stackcopy.c: a copy is walked later, a wakeup is joined at once).
//
// Bounds: a waker is walked only for a task with an open wait (one array read says no for the others), at
// most once per wait (a task is woken once per sleep); `wakers` is an LRU map of WAIT_START_SIZE entries; a
// wakeup whose count finds wakeup_counts full is counted as lost (offcpu.c).

#ifdef CFI_UNWIND
BPF_PERCPU_ARRAY(waker_states, struct unwind_state_bytes, 1);
BPF_PROG_ARRAY(waker_progs, UNWIND_PROGS);
#endif

// The waker's user stack walked from CFI (its end notes the waker: unwind.c's unwind_done); 0 when it is not
// (no table, no user registers, or the walker's copies not loaded yet).
static inline int walk_waker(void *ctx, struct key_t *key, u64 wakee)
{
#ifdef CFI_UNWIND
    u32 pid = key->pid;
    struct unwind_proc *proc = (struct unwind_proc *)unwind_procs.lookup(&pid);
    u32 zero = 0;
    struct unwind_state *st = (struct unwind_state *)waker_states.lookup(&zero);
    if (!proc || !st || !task_user_registers(&st->ip, &st->sp, &st->bp))
        return 0;
    unwind_start(st, proc, key, 0, 0, 0);
    st->wakee = wakee;
    waker_progs.call(ctx, PROG_UNWIND_STEP);
#endif
    return 0;
}

// args: struct task_struct *p
int on_waking(struct bpf_raw_tracepoint_args *ctx)
{
    u64 wakee = ctx->args[0];
    if (!may_have_wait(wakee))
        return 0;
    u32 one = 1;
    u32 *stopped = active.lookup(&one);
    if (stopped && *stopped)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    struct key_t key = {.pid = id >> 32, .tid = (u32)id};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    int missing = 0, files_only = 0;
    // Always: it tells a wake-up from an interrupt (the interrupted thread is no waker) from a thread's.
    key.kernel = store_walked_stack(ctx, 0, STACK_KERNEL, 127, &missing, &files_only);
    if ((u32)id == 0) {  // the idle task: an interrupt woke it
        note_waker(wakee, &key);
        return 0;
    }
    walk_waker(ctx, &key, wakee);
    key.user_kind = STACK_BUILD_ID;
    key.user = store_walked_stack(ctx, BPF_F_USER_STACK | BPF_F_USER_BUILD_ID, STACK_BUILD_ID, 127, &missing,
                                  &files_only);
    if (!key.user)
        key.user_kind = 0;
    note_waker(wakee, &key);
    return 0;
}
