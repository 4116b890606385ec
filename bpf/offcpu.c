// Off-CPU time: how long each thread waits between leaving a CPU and getting one again, summed in the
// kernel per (process, thread, comm, user stack, kernel stack) as taken when the thread left.
//
// One raw tracepoint, sched_switch(preempt, prev, next, prev_state): it runs on the CPU switching, in
// the context of `prev`, so prev's ids, comm and stacks come from the helpers. The start of a wait is
// keyed by the task_struct pointer (the tracepoint's prev, then next): nothing is read from the
// task_struct itself, whose layout BCC only knows from headers that need not match the running kernel.
// A dead task (TASK_DEAD in prev_state) leaves no entry, so a pointer reused by a new task never
// finds a stale start time (its own open entry, if a switch-in was missed, is removed then).
//
// Stacks come in two sets, like profile.c: `active[0]` is the set switch-outs write. The frontend
// flips it, waits a grace period, notes the old set's stacks a waiting thread's entry still names (in
// `start`), reads the counts, then clears the old set's other stacks. Counts are keyed by the set their
// stacks are in and read with lookup-and-delete, from both sets.

// WAIT_EVERY > 1: one wait in WAIT_EVERY (on average) is recorded and counted WAIT_EVERY times (its
// time, and the lost counters it adds to), so the sums stay estimates of all the waits' time while only
// one switch-out in WAIT_EVERY pays for stacks. Chosen at random: a counter (perf's -c for tracepoint
// events) would always pick the same one of two threads that alternate on a CPU. WAIT_THRESHOLD is
// 2^32 / WAIT_EVERY, against bpf_get_prandom_u32().
#ifndef WAIT_EVERY
#define WAIT_EVERY 1
#endif

// Kernel stacks start at __schedule: the program's own frame and bpf_trace_run4 are skipped.
#define KERNEL_SKIP (2 & BPF_F_SKIP_FIELD_MASK)

#define STATE_INTERRUPTIBLE 0x1
#define STATE_UNINTERRUPTIBLE 0x2
#define STATE_DEAD 0x80
#define STATE_NOLOAD 0x400

// Which waits are kept (keep in sync with STATES in offcpu.py).
#define KEEP_RUNNING 0x1   // preempted or yielded: waiting for a CPU
#define KEEP_SLEEPING 0x2  // S (and I: idle kernel waits)
#define KEEP_DISK 0x4      // D
#define KEEP_OTHER 0x8     // stopped, traced

struct key_t {
    u32 set;
    u32 pid;
    u32 tid;
    s32 user_stack_id;
    s32 kernel_stack_id;
    u32 pad;
    char comm[TASK_COMM_LEN];
};

struct start_t {
    u64 ts;
    struct key_t key;
};

// Indices into `lost` (keep in sync with LOST_REASONS in offcpu.py).
enum lost_reason {
    USER_STACK_COLLISION = 0,
    KERNEL_STACK_COLLISION,
    COUNTS_MAP_FULL,
    SHORT_WAITS,
    MISSED_SWITCH_INS,
    NR_LOST,
};

BPF_HASH(counts, struct key_t, u64, COUNTS_SIZE);
BPF_TABLE("lru_hash", u64, struct start_t, start, START_SIZE);
BPF_STACK_TRACE(ustacks0, STACK_SIZE);
BPF_STACK_TRACE(ustacks1, STACK_SIZE);
BPF_STACK_TRACE(kstacks0, STACK_SIZE);
BPF_STACK_TRACE(kstacks1, STACK_SIZE);
BPF_ARRAY(active, u32, 1);
BPF_PERCPU_ARRAY(lost, u64, NR_LOST);
#ifdef TARGETS_BY_PID
// A byte per pid (offcpu.py: when pid_max is small enough): every switch-out on the machine asks whether
// the thread leaving belongs to a target, and an array read costs nothing next to a hash lookup (about
// 100 ns here, most of what a switch of another process paid). Sized from pid_max at load: were pid_max
// raised during the recording, a child given a pid beyond the array would not be profiled.
BPF_ARRAY(targets, u8, TARGETS_SIZE);

static inline int is_target(u32 tgid)
{
    u8 *target = targets.lookup(&tgid);
    return target && *target;
}
#else
BPF_HASH(targets, u32, u8, TARGETS_SIZE);

static inline int is_target(u32 tgid)
{
    return targets.lookup(&tgid) != 0;
}
#endif
// How many open waits (`start` entries) hash to each slot. Every switch on the machine asks whether the
// thread coming in has an open wait: a slot at 0 answers no with one array read instead of a hash
// lookup. Counted up after an entry is added and down after one is deleted, so a slot is never below its
// entries (the task that owns an entry is not switched in on another CPU while it is being switched
// out); an entry the LRU evicts leaves its slot counted: that only costs a lookup.
#define OPEN_SLOTS 65536
BPF_ARRAY(open_waits, u32, OPEN_SLOTS);

static inline u32 *open_slot(u64 task)
{
    u32 slot = (u32)((task * 0x9E3779B97F4A7C15ULL) >> 48);  // task_structs are slab objects: spread them
    return open_waits.lookup(&slot);
}

static inline int may_have_wait(u64 task)
{
    u32 *slot = open_slot(task);
    return !slot || *slot != 0;
}

static inline void forget_wait(u64 task)
{
    u32 *slot = open_slot(task);
    if (start.delete(&task) == 0 && slot)
        __sync_fetch_and_add(slot, -1);
}

static inline void count_lost(u32 reason)
{
    u64 *slot = lost.lookup(&reason);
    if (slot)
        *slot += WAIT_EVERY;
}

static inline int kept_state(u64 preempt, u32 state)
{
    u32 kind;
    if (preempt || state == 0)
        kind = KEEP_RUNNING;
    else if ((state & STATE_UNINTERRUPTIBLE) && !(state & STATE_NOLOAD))
        kind = KEEP_DISK;
    else if (state & (STATE_INTERRUPTIBLE | STATE_UNINTERRUPTIBLE))
        kind = KEEP_SLEEPING;
    else
        kind = KEEP_OTHER;
    return (KEEP_STATES & kind) != 0;
}

static inline void switch_out(struct bpf_raw_tracepoint_args *ctx, u64 task)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 state = ctx->args[3];
    if ((u32)id == 0)
        return;
#ifdef FILTER_PIDS
    if (!is_target(tgid))
        return;
#endif
    // Leaving the CPU while its last wait is still open: the switch that ended that wait was not seen.
    // (This machine's kernel emits no sched_switch when its VM agent's threads leave a CPU, ftrace
    // neither, so a thread switched in from one of them comes back unseen.) The wait is counted as
    // lost rather than stretched over the time the thread ran since; a dead thread's entry goes too.
    if (may_have_wait(task) && start.lookup(&task)) {
        count_lost(MISSED_SWITCH_INS);
        forget_wait(task);
    }
    if ((state & STATE_DEAD) || !kept_state(ctx->args[0], state))
        return;
#if WAIT_EVERY > 1
    if (bpf_get_prandom_u32() >= WAIT_THRESHOLD)
        return;
#endif
    u32 zero = 0;
    u32 *set = active.lookup(&zero);
    struct start_t entry = {.ts = bpf_ktime_get_ns()};
    entry.key.set = set ? *set : 0;
    entry.key.pid = tgid;
    entry.key.tid = id;
    bpf_get_current_comm(&entry.key.comm, sizeof(entry.key.comm));
    // BCC accepts map calls only literally, so each set is written out.
    // The kernel stack is most of the cost (about 1.9 of 3.2 us a switch here: the ORC unwinder from the
    // tracepoint), so it can be left out (USER_STACKS_ONLY, as perf's --off-cpu does).
    entry.key.kernel_stack_id = -EFAULT;
    if (entry.key.set == 1) {
        entry.key.user_stack_id = ustacks1.get_stackid(ctx, BPF_F_USER_STACK);
#ifndef USER_STACKS_ONLY
        entry.key.kernel_stack_id = kstacks1.get_stackid(ctx, KERNEL_SKIP);
#endif
    } else {
        entry.key.user_stack_id = ustacks0.get_stackid(ctx, BPF_F_USER_STACK);
#ifndef USER_STACKS_ONLY
        entry.key.kernel_stack_id = kstacks0.get_stackid(ctx, KERNEL_SKIP);
#endif
    }
    if (entry.key.user_stack_id == -EEXIST)
        count_lost(USER_STACK_COLLISION);
    if (entry.key.kernel_stack_id == -EEXIST)
        count_lost(KERNEL_STACK_COLLISION);
    u32 *slot = open_slot(task);
    if (start.update(&task, &entry) == 0 && slot)
        __sync_fetch_and_add(slot, 1);
}

static inline void switch_in(u64 task)
{
    if (!may_have_wait(task))
        return;
    struct start_t *entry = start.lookup(&task);
    if (!entry)
        return;
    u64 delta = bpf_ktime_get_ns() - entry->ts;
    struct key_t key = entry->key;
    if (delta < MIN_BLOCK_NS) {
        forget_wait(task);
        count_lost(SHORT_WAITS);
        return;
    }
    u64 *value = counts.lookup(&key);
    if (!value) {
        u64 zero = 0;
        counts.insert(&key, &zero);  // fails harmlessly when another CPU created it first
        value = counts.lookup(&key);
    }
    if (value)
        __sync_fetch_and_add(value, delta * WAIT_EVERY);
    else
        count_lost(COUNTS_MAP_FULL);
    // Only now: a drain that finds no entry for this wait finds its count (see offcpu.py's drain).
    forget_wait(task);
}

// args: bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state
// Attached by offcpu.py (a RAW_TRACEPOINT_PROBE would be attached at load, before the targets are set).
int on_switch(struct bpf_raw_tracepoint_args *ctx)
{
    switch_out(ctx, ctx->args[1]);
    switch_in(ctx->args[2]);
    return 0;
}
