// Off-CPU time: how long each thread waits between leaving a CPU and getting one again, summed in the
// kernel per (process, thread, comm, user stack, kernel stack) as taken when the thread left.
//
// Compiled into the CPU sampler's program (after profile.c, with -DOFF_CPU), so a wait's stacks are walked
// by the same programs as a CPU sample's: the CFI walker (unwind.c) and its Python frames (python.c) for
// processes whose tables are loaded, the kernel's frame-pointer walk otherwise (take_user_stack).
//
// Switch-out: on_switch_out runs on the software context-switch perf event (period 1; per CPU for the
// whole machine, else bound to the targets' threads and inherited, see perfevents.py), in the thread that
// is leaving. It is a perf event program so that it can tail-call the walker, which raw tracepoints cannot
// (a program array serves programs of one type). The event comes from __schedule's context switch, so the
// kernel stack starts at schedule(), with no tracing frames above it. The walk's end opens the wait:
// wait_start[task] = {start time, key}. A thread that is runnable (preempted, yielding) waits for a CPU.
//
// Switch-in: on_switch_in, a raw tracepoint on sched_switch (it runs before the context-switch event of the
// same switch), closes `next`'s wait: its time goes to wait_counts of the active set (profile.c's
// `active`), which the frontend flips and drains with the CPU counts. The key names stacks in the stack
// store by hash; the frontend keeps the records of stacks that open waits name (bpf/offcpu.py).
//
// Wakers (-DWAKERS, record --wakers): the wait's time goes to wakeup_counts instead, under its key and the key of
// the thread that woke it (its stacks at the wake-up, walked by wakers.c on sched_waking), as BCC's offwaketime
// joins them, and whether it slept; a wait that was preempted, or whose waker was not seen, has a zero waker. The
// waker is kept per woken task in `wakers` until that task runs again; it belongs to the wait only if it came
// after the switch-out began (the wait's `since`): a wake-up may come while the switch-out's walk still runs
// on the other CPU, and an older one was of a wait that was not recorded.
//
// WAIT_EVERY > 1: one wait in WAIT_EVERY (on average) is recorded and counted WAIT_EVERY times (its time,
// and the lost counters it adds to), so the sums stay estimates of all the waits' time while only one
// switch-out in WAIT_EVERY pays for stacks. Chosen at random: a counter would always pick the same one of
// two threads that alternate on a CPU. WAIT_THRESHOLD is 2^32 / WAIT_EVERY, against bpf_get_prandom_u32().
#ifndef WAIT_EVERY
#define WAIT_EVERY 1
#endif

#define STATE_INTERRUPTIBLE 0x1
#define STATE_UNINTERRUPTIBLE 0x2
#define STATE_DEAD 0x80
#define STATE_NOLOAD 0x400

// Which waits are kept (keep in sync with STATES in offcpu.py).
#define KEEP_RUNNING 0x1   // preempted or yielded: waiting for a CPU
#define KEEP_SLEEPING 0x2  // S (and I: idle kernel waits)
#define KEEP_DISK 0x4      // D
#define KEEP_OTHER 0x8     // stopped, traced

struct wait_t {
    u64 ts;
    u64 since;    // when the switch-out began (ts: when its stacks were taken)
    u32 blocked;  // the thread slept (a wake-up ends the wait), else it was preempted
    u32 pad;
    struct key_t key;
};

// What on_switch_out knew when it began, for the walk's end (open_wait): programs run to their end on a CPU.
struct switch_out_t {
    u64 since;
    u32 blocked;
    u32 pad;
};

// Indices into `wait_lost` (keep in sync with LOST_REASONS in offcpu.py).
enum wait_lost_reason {
    WAIT_USER_STACK_MISSING = 0,
    WAIT_KERNEL_STACK_MISSING,
    WAIT_COUNTS_MAP_FULL,
    WAIT_SHORT,
    WAIT_MISSED_SWITCH_INS,
    WAKEUP_COUNTS_MAP_FULL,
    NR_WAIT_LOST,
};

#ifndef WAKERS
BPF_HASH(wait_counts0, struct key_t, u64, WAIT_COUNTS_SIZE);
BPF_HASH(wait_counts1, struct key_t, u64, WAIT_COUNTS_SIZE);
#endif
BPF_TABLE("lru_hash", u64, struct wait_t, wait_start, WAIT_START_SIZE);
BPF_PERCPU_ARRAY(wait_lost, u64, NR_WAIT_LOST);
BPF_PERCPU_ARRAY(switch_outs, struct switch_out_t, 1);

#ifdef WAKERS
struct waker_t {
    u64 ts;  // when its stacks were taken
    struct key_t key;
};

struct wakeup_key_t {
    struct key_t blocked;
    struct key_t waker;  // zero: none seen
    u32 slept;           // the thread slept (else it was preempted: no waker)
    u32 pad;
};

BPF_HASH(wakeup_counts0, struct wakeup_key_t, u64, WAIT_COUNTS_SIZE);
BPF_HASH(wakeup_counts1, struct wakeup_key_t, u64, WAIT_COUNTS_SIZE);
BPF_TABLE("lru_hash", u64, struct waker_t, wakers, WAIT_START_SIZE);  // woken task -> its last waker
#endif

// How many open waits (`wait_start` entries) hash to each slot. Every switch on the machine asks whether the
// thread coming in has an open wait: a slot at 0 answers no with one array read instead of a hash lookup.
// Counted up when a switch-out begins to open an entry (so a wake-up during its walk finds the slot counted,
// wakers.c) and down after one is deleted, so a slot is never below its entries (the task that owns an entry
// is not switched in on another CPU while it is being switched out); an entry the LRU evicts, or one that
// could not be added, leaves its slot counted: that only costs a lookup.
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
    if (wait_start.delete(&task) == 0 && slot)
        __sync_fetch_and_add(slot, -1);
}

static inline void count_wait_lost(u32 reason)
{
    u64 *slot = wait_lost.lookup(&reason);
    if (slot)
        *slot += WAIT_EVERY;
}

static inline int kept_state(u32 state)
{
    u32 kind;
    if (state == 0)
        kind = KEEP_RUNNING;
    else if ((state & STATE_UNINTERRUPTIBLE) && !(state & STATE_NOLOAD))
        kind = KEEP_DISK;
    else if (state & (STATE_INTERRUPTIBLE | STATE_UNINTERRUPTIBLE))
        kind = KEEP_SLEEPING;
    else
        kind = KEEP_OTHER;
    return (KEEP_STATES & kind) != 0;
}

// The walk of a wait's stacks is over (unwind.c's unwind_done, or on_switch_out): the wait starts now.
static inline void open_wait(u64 task, struct key_t *key)
{
    struct wait_t entry = {.ts = bpf_ktime_get_ns()};
    u32 zero = 0;
    struct switch_out_t *begun = switch_outs.lookup(&zero);
    entry.since = begun ? begun->since : entry.ts;
    entry.blocked = begun ? begun->blocked : 1;
    entry.key = *key;
    if (!key->user)
        count_wait_lost(WAIT_USER_STACK_MISSING);
    wait_start.update(&task, &entry);
}

#ifdef WAKERS
// A waker's stacks are taken (wakers.c): kept for the woken task until it runs again.
static inline void note_waker(u64 wakee, struct key_t *key)
{
    struct waker_t waker = {.ts = bpf_ktime_get_ns()};
    waker.key = *key;
    wakers.update(&wakee, &waker);
}

// The wait's time under its key and its waker's (a zero key when it was preempted, or no waker came after
// it began); the task's waker is forgotten. Written out per map: BCC accepts map calls only literally.
static inline void add_wakeup_time(struct wait_t *entry, u64 task, u32 set, u64 delta)
{
    struct wakeup_key_t key = {};
    key.blocked = entry->key;
    key.slept = entry->blocked;
    struct waker_t *waker = wakers.lookup(&task);
    if (waker) {
        if (entry->blocked && waker->ts >= entry->since)
            key.waker = waker->key;
        wakers.delete(&task);
    }
    u64 zero = 0;
    u64 *value;
    if (set == 1) {
        value = wakeup_counts1.lookup(&key);
        if (!value) {
            wakeup_counts1.insert(&key, &zero);
            value = wakeup_counts1.lookup(&key);
        }
    } else {
        value = wakeup_counts0.lookup(&key);
        if (!value) {
            wakeup_counts0.insert(&key, &zero);
            value = wakeup_counts0.lookup(&key);
        }
    }
    if (value)
        __sync_fetch_and_add(value, delta);
    else
        count_wait_lost(WAKEUP_COUNTS_MAP_FULL);
}
#endif

#ifndef WAKERS
// Written out per map: BCC accepts map calls only literally.
static inline void add_wait_time(struct key_t *key, u32 set, u64 delta)
{
    u64 zero = 0;
    u64 *value;
    if (set == 1) {
        value = wait_counts1.lookup(key);
        if (!value) {
            wait_counts1.insert(key, &zero);  // fails harmlessly when another CPU created it first
            value = wait_counts1.lookup(key);
        }
    } else {
        value = wait_counts0.lookup(key);
        if (!value) {
            wait_counts0.insert(key, &zero);
            value = wait_counts0.lookup(key);
        }
    }
    if (value)
        __sync_fetch_and_add(value, delta);
    else
        count_wait_lost(WAIT_COUNTS_MAP_FULL);
}
#endif

// args: bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state
// Attached by offcpu.py (a RAW_TRACEPOINT_PROBE would be attached at load, before the targets are set).
int on_switch_in(struct bpf_raw_tracepoint_args *ctx)
{
    u64 task = ctx->args[2];
    if (!may_have_wait(task))
        return 0;
    struct wait_t *entry = wait_start.lookup(&task);
    if (!entry)
        return 0;
    u64 delta = bpf_ktime_get_ns() - entry->ts;
    struct wait_t wait = *entry;
    if (delta < MIN_BLOCK_NS) {
#ifdef WAKERS
        wakers.delete(&task);
#endif
        forget_wait(task);
        count_wait_lost(WAIT_SHORT);
        return 0;
    }
    u32 zero = 0;
    u32 *set = active.lookup(&zero);
#ifdef WAKERS
    add_wakeup_time(&wait, task, set ? *set : 0, delta * WAIT_EVERY);
#else
    add_wait_time(&wait.key, set ? *set : 0, delta * WAIT_EVERY);
#endif
    // Only now: a drain that finds no entry for this wait finds its count (see offcpu.py's drain).
    forget_wait(task);
    return 0;
}

static inline u32 task_state(u64 task)
{
    u32 state = 0;
    bpf_probe_read_kernel(&state, sizeof(state), (void *)task + kernel_offset(TASK_STATE));
    return state;
}

int on_switch_out(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if ((u32)id == 0)
        return 0;
    u32 zero = 0, one = 1;
    u32 *stopped = active.lookup(&one);
    if (stopped && *stopped)
        return 0;
    u64 task = bpf_get_current_task();
    // Leaving the CPU while its last wait is still open: the switch that ended that wait was not seen.
    // (This machine's kernel emits no sched_switch when its VM agent's threads leave a CPU, ftrace
    // neither, so a thread switched in from one of them comes back unseen.) The wait is counted as
    // lost rather than stretched over the time the thread ran since; a dead thread's entry goes too.
    if (may_have_wait(task) && wait_start.lookup(&task)) {
        count_wait_lost(WAIT_MISSED_SWITCH_INS);
        forget_wait(task);
    }
    u32 state = task_state(task);
    if ((state & STATE_DEAD) || !kept_state(state))
        return 0;
#if WAIT_EVERY > 1
    if (bpf_get_prandom_u32() >= WAIT_THRESHOLD)
        return 0;
#endif
    struct switch_out_t *begun = switch_outs.lookup(&zero);
    if (begun) {
        begun->since = bpf_ktime_get_ns();
        begun->blocked = state != 0;
    }
    u32 *slot = open_slot(task);  // a wait is being opened (every way on ends in open_wait)
    if (slot)
        __sync_fetch_and_add(slot, 1);
    u32 *active_set = active.lookup(&zero);
    u32 set = active_set ? *active_set : 0;
    struct key_t key = {.pid = tgid, .tid = (u32)id};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    int kernel_missing = 0, user_missing = 0, files_only = 0;
    // The kernel stack is most of the cost (about 1.9 of 3.2 us a switch with frame-pointer user stacks),
    // so it can be left out (USER_STACKS_ONLY, as perf's --off-cpu does).
#ifndef USER_STACKS_ONLY
    key.kernel = store_walked_stack(ctx, 0, STACK_KERNEL, 127, &kernel_missing, &files_only);
    if (kernel_missing)
        count_wait_lost(WAIT_KERNEL_STACK_MISSING);
#endif
#ifdef CFI_UNWIND
    // Processes with unwind tables: opened there (no return); those without get a copy of their stack.
    if (unwind_user_stack(ctx, &key, set, kernel_missing, task))
        copy_sample_stack(ctx, &key, set, kernel_missing, task);
#endif
    take_user_stack(ctx, &key, &user_missing, &files_only);
    open_wait(task, &key);
    return 0;
}
