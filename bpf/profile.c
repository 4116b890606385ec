// CPU profile sampler: counts (process, thread, comm, user stack, kernel stack) in the kernel.
//
// Stacks go to the stack store (stackstore.c, loaded before this file) and keys name them by hash. Counts
// come in two sets (0 and 1): `active[0]` says which set the sampler writes; the frontend flips it, waits
// a grace period, then reads and clears the other set's counts, so a drain never races with the sampler
// and nothing is lost or counted twice. Each set has two count maps: `counts` for keys whose stacks are
// named from files (build-ids, CFI frames in files) or kernel IPs alone, which a recording sums as bytes
// and decodes once at its end; `rawcounts` for keys with raw user IPs, named from the process's mappings
// of the key's epoch (or JIT symbols of the drain's time), which each drain decodes.
//
// User stacks are taken as build-id + file offset (valid after the process is gone) until the
// frontend has read the process's mappings, then as raw IPs, which cost the kernel far less (see
// frontend/symbols/addrspace.py). A process's `epoch` changes whenever its executable mappings may
// have: at its first sample, at exec, at each mmap/mprotect asking for PROT_EXEC. The frontend reads
// the epoch, then /proc/PID/maps, then stores the epoch in `known`; raw IPs are taken only while
// the two agree, and the key carries the epoch, so each raw stack is read with the mappings it ran in.

struct key_t {
    u32 pid;
    u32 tid;       // the thread (the kernel's pid): report's tid key
    u64 user;      // the user stack's hash in the stack store, 0: none
    u64 kernel;    // the kernel stack's hash, 0: none
    u64 epoch;     // STACK_RAW only: the mappings' epoch
    u32 user_kind; // STACK_* of the user stack (0: none)
    u32 copy;      // a copy of the user stack that replaces or continues `user` (stackcopy.c); 0: none
    char comm[TASK_COMM_LEN];
};

struct proc_event_t {
    u32 pid;
    u32 kind;  // 0 exec, 1 exit
    char filename[256];
};

// Indices into `lost` (keep in sync with LOST_REASONS in profiler.py).
enum lost_reason {
    USER_STACK_MISSING = 0,  // walked, but the stack store's half was full
    KERNEL_STACK_MISSING,
    COUNTS_MAP_FULL,
    IDLE,
    ENDED_BETWEEN_TICKS,  // per-task events: samples owed to threads that ended between two ticks, not taken
    CARRIED,  // not lost: samples taken for such threads at their process's next tick (see sample_due)
    NR_LOST,
};

BPF_HASH(counts0, struct key_t, u64, COUNTS_SIZE);
BPF_HASH(counts1, struct key_t, u64, COUNTS_SIZE);
BPF_HASH(rawcounts0, struct key_t, u64, COUNTS_SIZE);
BPF_HASH(rawcounts1, struct key_t, u64, COUNTS_SIZE);
BPF_TABLE("lru_hash", u32, u64, epochs, PROCS_SIZE);  // pid -> when its executable mappings last changed
BPF_TABLE("lru_hash", u32, u64, known, PROCS_SIZE);   // pid -> the epoch the frontend read its mappings at
BPF_TABLE("lru_hash", u32, u64, exec_epochs, PROCS_SIZE);  // pid -> its epoch at its last exec (stackcopy.c)
BPF_ARRAY(active, u32, 2);  // [0]: the set the sampler writes; [1]: non-zero once sampling is over (-d)
BPF_PERCPU_ARRAY(lost, u64, NR_LOST);
BPF_HASH(targets, u32, u8, TARGETS_SIZE);
BPF_PERF_OUTPUT(proc_events);

static inline void count_lost_n(u32 reason, u64 n)
{
    u64 *slot = lost.lookup(&reason);
    if (slot)
        *slot += n;
}

static inline void count_lost(u32 reason)
{
    count_lost_n(reason, 1);
}

static inline int is_target(u32 tgid)
{
#ifdef FILTER_PIDS
    return targets.lookup(&tgid) != 0;
#else
    return 1;
#endif
}

#ifdef FILTER_PIDS
// Which ticks are samples, with events bound to the targets' threads. Each thread's event starts its period
// at zero, so with a tick per sampling period a thread that lives less than one period was never sampled
// (a thread-per-request server's threads never reached 10 ms: 0-5 % of its samples). The events tick at a
// fraction of the period instead (profiler.py: TICK_NS), each tick adds its period to its process's time,
// and the tick that crosses the process's next threshold is a sample: a process's samples follow its CPU
// time, not its threads' lifetimes. There is one threshold in each period of the process's time, at a
// random place in it (threshold_of): a tick is a sample with a chance of its time over the period, whatever
// the order of the threads' ticks. Thresholds at the multiples of the period gave every sample to one of two
// threads ticking in turn when the period was an even number of ticks (-F 500: 99.7 % to one of two equal
// threads); at -F 499, runs of ~250 samples to one thread, longer when the turns slip (a CI run under load:
// 68 % / 32 %). The CPU time of a thread between its last tick and its end is added at its exit (the
// kernel's own count, exact there); a threshold it crosses is owed, and the process's next tick takes it
// (CARRIED).
enum sampling_setting {
    SAMPLE_NS = 0,  // the sampling period (1e9 / F); 0: every tick is a sample (an event counted in cycles)
    ATTACHED_NS,    // bpf_ktime_get_ns() when the last events were opened: threads born later are counted whole
    NR_SAMPLING_SETTINGS,
};
#define MAX_OWED 64  // samples owed to a process at most; more are lost (ENDED_BETWEEN_TICKS)

struct process_time {
    u64 ns;    // CPU time counted
    u64 owed;  // thresholds crossed by threads that ended between ticks, for the next ticks to take
    u64 seed;  // where each period's threshold lies (threshold_of)
};

BPF_ARRAY(sampling, u64, NR_SAMPLING_SETTINGS);  // set by the frontend before the attach
BPF_TABLE("lru_hash", u32, struct process_time, process_times, PROCS_SIZE);
struct thread_time {
    u64 counted;  // the CPU time its ticks counted
    u64 owed;     // thresholds its ticks crossed beyond one each, for its next ticks to take
};

BPF_TABLE("lru_hash", u32, struct thread_time, thread_times, TARGETS_SIZE);

static inline u64 sampling_setting(u32 index)
{
    u64 *value = sampling.lookup(&index);
    return value ? *value : 0;
}

static inline struct process_time *process_time(u32 tgid, u64 period)
{
    struct process_time *time = process_times.lookup(&tgid);
    if (time)
        return time;
    struct process_time fresh = {.seed = ((u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32()};
    process_times.insert(&tgid, &fresh);  // another CPU's insert first is kept
    return process_times.lookup(&tgid);
}

// The threshold in the process's period `k`: k * period plus a place in the period drawn from the process's
// seed (splitmix64's mix), the same for every CPU that asks, so concurrent ticks need no lock.
static inline u64 threshold_of(u64 seed, u64 k, u64 period)
{
    u64 z = seed + (k + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return k * period + (z ^ (z >> 31)) % period;
}

// Adds `ns` to the process's time; how many thresholds the time it added, (before, before + ns], holds.
// Every period strictly between the first and the last holds its threshold; the two ends are looked at.
static inline u64 add_time(struct process_time *time, u64 ns, u64 period)
{
    u64 before = __sync_fetch_and_add(&time->ns, ns), after = before + ns;
    u64 first = before / period, last = after / period;
    u64 at_first = threshold_of(time->seed, first, period);
    if (first == last)
        return at_first > before && at_first <= after;
    return (last - first - 1) + (at_first > before) + (threshold_of(time->seed, last, period) <= after);
}

static inline void owe(struct process_time *time, u64 samples)
{
    if (time->owed + samples > MAX_OWED) {
        count_lost_n(ENDED_BETWEEN_TICKS, samples);
        return;
    }
    __sync_fetch_and_add(&time->owed, samples);
}

// A tick that crosses two thresholds (one near its period's end, the next near the following one's start) is
// one sample now and one at the thread's next tick: its own stack a tick later, not another thread's.
static inline int sample_due(struct bpf_perf_event_data *ctx, u32 tid, u32 tgid)
{
    u64 period = sampling_setting(SAMPLE_NS);
    if (!period)
        return 1;
    u64 ns = ctx->sample_period;  // (an inherited event's count cannot be read here: bpf_perf_prog_read_value)
    struct thread_time fresh = {}, *thread = thread_times.lookup(&tid);
    if (!thread) {
        thread_times.update(&tid, &fresh);
        thread = thread_times.lookup(&tid);
    }
    if (thread)
        thread->counted += ns;  // only this thread's ticks write it, one at a time
    struct process_time *time = process_time(tgid, period);
    if (!time)
        return 1;
    u64 crossed = add_time(time, ns, period);
    if (crossed > 1 && thread && thread->owed + crossed - 1 <= MAX_OWED)
        thread->owed += crossed - 1;
    else if (crossed > 1)
        count_lost_n(ENDED_BETWEEN_TICKS, crossed - 1);
    if (crossed)
        return 1;
    if (thread && thread->owed) {
        thread->owed -= 1;
        return 1;
    }
    if (time->owed == 0)
        return 0;
    u64 owed = __sync_fetch_and_add(&time->owed, -1);
    if (owed == 0 || owed > MAX_OWED) {  // another CPU took the last one
        __sync_fetch_and_add(&time->owed, 1);
        return 0;
    }
    count_lost(CARRIED);
    return 1;
}

// A target's thread ends: its CPU time since its last tick goes to its process (born before the events
// were opened, its time is not all the recording's: left out, less than a tick), and so do the samples its
// ticks still owed it. When the process ends, what it is still owed is lost.
static inline u64 time_since_last_tick(u32 tid, u64 *owed)
{
    struct thread_time *last = thread_times.lookup(&tid);
    u64 counted = last ? last->counted : 0;
    *owed = last ? last->owed : 0;
    thread_times.delete(&tid);
    void *task = (void *)bpf_get_current_task();
    u64 started = 0, runtime = 0;
    bpf_probe_read_kernel(&started, sizeof(started), task + kernel_offset(TASK_START_TIME));
    if (started < sampling_setting(ATTACHED_NS))
        return 0;
    bpf_probe_read_kernel(&runtime, sizeof(runtime), task + kernel_offset(TASK_RUNTIME));
    return runtime > counted ? runtime - counted : 0;
}

static inline void thread_ended(u32 tid, u32 tgid)
{
    u64 period = sampling_setting(SAMPLE_NS);
    if (!period)  // every tick a sample: no time is kept
        return;
    u64 owed = 0, ns = time_since_last_tick(tid, &owed);
    struct process_time *time = process_time(tgid, period);
    if (!time)
        return;
    u64 crossed = add_time(time, ns, period) + owed;
    if (tid != tgid) {
        owe(time, crossed);
        return;
    }
    count_lost_n(ENDED_BETWEEN_TICKS, crossed + time->owed);  // the process ends: nothing can take them
    process_times.delete(&tgid);
}
#endif

// `raw`: the key's user stack holds raw IPs (rawcounts), else counts. Written out per map: BCC accepts
// map calls only literally, and a map cannot be picked at run time.
static inline void add_count(struct key_t *key, u32 set, int raw)
{
    u64 zero = 0;
    u64 *value;
    if (raw && set == 1) {
        value = rawcounts1.lookup(key);
        if (!value) {
            rawcounts1.insert(key, &zero);  // fails harmlessly when another CPU created it first
            value = rawcounts1.lookup(key);
        }
    } else if (raw) {
        value = rawcounts0.lookup(key);
        if (!value) {
            rawcounts0.insert(key, &zero);
            value = rawcounts0.lookup(key);
        }
    } else if (set == 1) {
        value = counts1.lookup(key);
        if (!value) {
            counts1.insert(key, &zero);
            value = counts1.lookup(key);
        }
    } else {
        value = counts0.lookup(key);
        if (!value) {
            counts0.insert(key, &zero);
            value = counts0.lookup(key);
        }
    }
    if (value)
        __sync_fetch_and_add(value, 1);
    else
        count_lost(COUNTS_MAP_FULL);
}

static inline void new_epoch(u32 tgid)
{
    u64 now = bpf_ktime_get_ns();
    epochs.update(&tgid, &now);
}

#ifdef CFI_UNWIND
static inline int unwind_user_stack(struct bpf_perf_event_data *ctx, struct key_t *key, u32 set,
                                    int kernel_missing, u64 wait_task);  // unwind.c
static inline void forget_unwind_table(u32 pid);  // unwind.c
static inline u32 copy_sample_stack(struct bpf_perf_event_data *ctx, struct key_t *key, u32 set, int kernel_missing,
                                    u64 wait_task);  // stackcopy.c
static inline int was_sampled(u32 pid);  // images.c
static inline void image_exec(u32 tgid, u64 bprm, u64 exec_epoch);  // images.c
static inline void image_mmap(u32 tgid, u64 start, u64 len, u64 pgoff, u32 fd, u64 epoch);
static inline void image_mprotect(u32 tgid);
static inline void image_exit(u32 tgid, u32 tid, int sampled);
#endif

// The process's epoch, set now if it has none.
static inline u64 current_epoch(u32 tgid)
{
    u64 *epoch = epochs.lookup(&tgid);
    if (epoch)
        return *epoch;
    new_epoch(tgid);
    epoch = epochs.lookup(&tgid);
    return epoch ? *epoch : 0;
}

// The epoch under which this process's raw IPs can be read, or 0: build-id stacks then.
static inline u64 raw_epoch(u32 tgid)
{
#ifndef RAW_STACKS
    return 0;
#endif
    u64 *epoch = epochs.lookup(&tgid);
    if (!epoch) {
        new_epoch(tgid);
        return 0;
    }
    u64 *read_at = known.lookup(&tgid);
    return read_at && *read_at == *epoch ? *epoch : 0;
}

// One loss per sample at most: the user stack's, else the kernel stack's.
static inline void count_stack_loss(int user_missing, int kernel_missing)
{
    if (user_missing)
        count_lost(USER_STACK_MISSING);
    else if (kernel_missing)
        count_lost(KERNEL_STACK_MISSING);
}

// The user stack as the kernel walks it (frame pointers): raw IPs when the process's mappings are known,
// else build-ids. Returns whether the stack's frames are all named from files (see store_walked_stack).
// With a copy of the stack (key->copy), only its leaf: what the sample shows if the copy is never walked
// (frame pointers through code built without them give frames that are not there).
static inline void take_user_stack(void *ctx, struct key_t *key, int *user_missing, int *files_only)
{
    u64 epoch = raw_epoch(key->pid);
    u32 frames = key->copy ? 1 : 127;
    if (epoch) {
        key->user_kind = STACK_RAW;
        key->epoch = epoch;
        key->user = store_walked_stack(ctx, BPF_F_USER_STACK, STACK_RAW, frames, user_missing, files_only);
    } else {
        key->user_kind = STACK_BUILD_ID;
        key->user = store_walked_stack(ctx, BPF_F_USER_STACK | BPF_F_USER_BUILD_ID, STACK_BUILD_ID, frames,
                                       user_missing, files_only);
    }
    if (!key->user) {
        key->user_kind = 0;
        key->epoch = 0;
    }
}

int on_sample(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if ((u32)id == 0) {
        count_lost(IDLE);
        return 0;
    }
    // No pid check: with target pids, the events are bound to the targets' tasks (perfevents.py).
    u32 zero = 0, one = 1;
    u32 *stopped = active.lookup(&one);
    if (stopped && *stopped)
        return 0;
#ifdef FILTER_PIDS
    if (!sample_due(ctx, (u32)id, tgid))
        return 0;
#endif
    int in_kernel = (ctx->regs.cs & 3) == 0;
    u32 *active_set = active.lookup(&zero);
    u32 set = active_set ? *active_set : 0;
    struct key_t key = {.pid = tgid, .tid = (u32)id};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));

    int kernel_missing = 0, user_missing = 0, files_only = 0;
    if (in_kernel)
        key.kernel = store_walked_stack(ctx, 0, STACK_KERNEL, 127, &kernel_missing, &files_only);
#ifdef CFI_UNWIND
    // Processes with unwind tables are counted there (no return); those without get a copy of their stack (a
    // thread that is exiting, whose stack can no longer be read, the copy taken as it began: images.c).
    if (unwind_user_stack(ctx, &key, set, kernel_missing, 0))
        copy_sample_stack(ctx, &key, set, kernel_missing, 0);
#endif
    take_user_stack(ctx, &key, &user_missing, &files_only);
    count_stack_loss(user_missing, kernel_missing);
    add_count(&key, set, (key.user && !files_only) || key.copy);  // a copy is walked at its drain
    return 0;
}

// The sched tracepoints (fork's is in forks.c) are raw tracepoints: closing a perf tracepoint event waits for
// RCU grace periods (32-70 ms each on this VM, one after another under a kernel-wide lock), a raw one does not.
// They read two fields at offsets from the running kernel's BTF (bpf/btf.py), else from the headers compiled
// against.
// Exec'd files let the frontend find the objects behind build-ids of processes that already exited.
// args: struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm
RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid))
        return 0;
    new_epoch(tgid);
#ifdef CFI_UNWIND
    forget_unwind_table(tgid);
    u64 epoch = current_epoch(tgid);
    exec_epochs.update(&tgid, &epoch);
    image_exec(tgid, ctx->args[2], epoch);
#endif
    struct proc_event_t ev = {.pid = tgid, .kind = 0};
    const char *filename = NULL;
    bpf_probe_read_kernel(&filename, sizeof(filename), (void *)ctx->args[2] + kernel_offset(BINPRM_FILENAME));
    if (filename)
        bpf_probe_read_kernel_str(&ev.filename, sizeof(ev.filename), filename);
    proc_events.perf_submit(ctx, &ev, sizeof(ev));
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
#ifdef FILTER_PIDS
    if (!is_target(tgid))
        return 0;
    thread_ended((u32)id, tgid);
#endif
    if ((u32)id != tgid || !is_target(tgid))
        return 0;
#ifdef CFI_UNWIND
    image_exit(tgid, (u32)id, was_sampled(tgid));  // before its epoch goes: the copy of its stack carries it
#endif
    epochs.delete(&tgid);
    known.delete(&tgid);
    struct proc_event_t ev = {.pid = tgid, .kind = 1};
    proc_events.perf_submit(ctx, &ev, offsetof(struct proc_event_t, filename));
    return 0;
}

#ifdef TRACK_MAPPINGS
// New executable file mappings (dlopen) change the process's epoch once they exist: at the syscall's
// exit, so a read of /proc/PID/maps that saw the old epoch cannot have missed them. Raw IPs and the
// CFI unwinder's mapping tables (unwind.c) both rely on it. Only the exit tracepoints: the call's
// arguments are still in the registers saved at syscall entry (bpf_task_pt_regs), and each perf
// tracepoint closed at the end waits for an RCU grace period under a kernel-wide lock (~46 ms here).
#define PROT_EXEC_BIT 0x4

static inline void exec_mapping_made(int is_mmap, u64 ret)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid))
        return;
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    u64 prot = 0, fd = 0;  // mprotect: the range may be a file's, it does not say: every PROT_EXEC counts
    bpf_probe_read_kernel(&prot, sizeof(prot), &PT_REGS_PARM3(regs));
    if (is_mmap)  // the fifth argument, -1 for an anonymous mapping
        bpf_probe_read_kernel(&fd, sizeof(fd), &PT_REGS_PARM5(regs));
    if (!(prot & PROT_EXEC_BIT) || (int)fd < 0)
        return;
    new_epoch(tgid);
#ifdef CFI_UNWIND
    if (!is_mmap) {
        image_mprotect(tgid);
    } else if (ret < (u64)-4095) {  // the mapping is made: where, how long, from which file offset
        u64 len = 0, pgoff = 0;
        bpf_probe_read_kernel(&len, sizeof(len), &PT_REGS_PARM2(regs));
        bpf_probe_read_kernel(&pgoff, sizeof(pgoff), &PT_REGS_PARM6(regs));
        image_mmap(tgid, ret, len, pgoff, (u32)fd, current_epoch(tgid));
    }
#endif
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
    exec_mapping_made(1, args->ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mprotect)
{
    exec_mapping_made(0, args->ret);
    return 0;
}
#endif
