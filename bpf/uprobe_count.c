// Exact uprobe call counts, kept in the kernel per (probe id, process).
//
// One program serves every probe: each uprobe is attached through a BPF link whose cookie is the
// probe id, so adding a probe needs no recompilation. MAX_PROBES, MAX_ROWS come from cflags.
//
// Rows are keyed by (probe, pid, instance): the instance is when the process first hit a probe, so a
// pid reused by a new process gets new rows. When a process's last thread exits, its instance moves
// from `procs` to `exited`: no thread of it can hit a probe any more, so its rows are final and user
// space folds them into its own totals and deletes them (the per-pid map stays as small as the set of
// live processes), without racing a single increment.

struct row_t {
    u32 probe;
    u32 pid;  // tgid: the process, not the thread
    u64 instance;
};

struct proc_t {
    u64 instance;  // bpf_ktime_get_ns() at the process's first hit
    char comm[TASK_COMM_LEN];
};

struct instance_t {
    u32 pid;
    u32 pad;
    u64 instance;
};

struct comm_t {
    char comm[TASK_COMM_LEN];
};

BPF_ARRAY(totals, u64, MAX_PROBES);                       // probe id -> calls, never loses a hit
BPF_HASH(per_pid, struct row_t, u64, MAX_ROWS);           // (probe id, pid, instance) -> calls
BPF_HASH(procs, u32, struct proc_t, MAX_ROWS);            // live process that hit a probe -> instance
BPF_HASH(exited, struct instance_t, struct comm_t, MAX_ROWS);  // exited instances not yet folded
BPF_ARRAY(lost_rows, u64, MAX_PROBES);                    // probe id -> hits per_pid (or procs) had no room for
BPF_HASH(followed, u32, u32, MAX_ROWS);                   // pid -> followed root it descends from

static void count_lost(u32 probe)
{
    u64 *lost = lost_rows.lookup(&probe);
    if (lost)
        __sync_fetch_and_add(lost, 1);
}

static struct proc_t *current_proc(u32 pid)
{
    struct proc_t *proc = procs.lookup(&pid);
    if (proc)
        return proc;
    struct proc_t fresh = {.instance = bpf_ktime_get_ns()};
    bpf_get_current_comm(&fresh.comm, sizeof(fresh.comm));
    procs.insert(&pid, &fresh);  // fails if another thread of the process inserted first: use its
    return procs.lookup(&pid);
}

int count_call(struct pt_regs *ctx)
{
    u32 probe = bpf_get_attach_cookie(ctx);
    u64 *total = totals.lookup(&probe);
    if (!total)
        return 0;
    __sync_fetch_and_add(total, 1);

    u32 pid = bpf_get_current_pid_tgid() >> 32;
    struct proc_t *proc = current_proc(pid);
    if (!proc) {
        count_lost(probe);
        return 0;
    }
    struct row_t key = {.probe = probe, .pid = pid, .instance = proc->instance};
    u64 *calls = per_pid.lookup(&key);
    if (calls) {
        __sync_fetch_and_add(calls, 1);
        return 0;
    }
    u64 one = 1;
    if (per_pid.insert(&key, &one) == 0)
        return 0;
    calls = per_pid.lookup(&key);  // another CPU inserted the row first
    if (calls) {
        __sync_fetch_and_add(calls, 1);
        return 0;
    }
    count_lost(probe);
    return 0;
}

// The cheapest possible handler: what the benchmark compares count_call against.
int empty_handler(struct pt_regs *ctx)
{
    return 0;
}

// Children of a followed process are followed too (optrace count -- CMD). Raw tracepoints: closing a perf
// tracepoint event waits for RCU grace periods (see profile.c). args: parent, child (task_struct *).
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    u32 *root = followed.lookup(&parent);
    if (!root)
        return 0;
    u32 child = forked_process(ctx, parent);
    if (child) {
        u32 value = *root;
        followed.update(&child, &value);
    }
    return 0;
}

// The process is gone once its last thread exits (group_dead, Linux 6.16+); older kernels only tell
// which thread exits, and the leader's exit stands for the process's. args: p, group_dead (6.16+).
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 pid = pid_tgid >> 32;
#ifdef HAVE_GROUP_DEAD
    if (!(u8)ctx->args[1])
        return 0;
#else
    if ((u32)pid_tgid != pid)
        return 0;
#endif
    struct proc_t *proc = procs.lookup(&pid);
    if (!proc)
        return 0;
    struct instance_t gone = {.pid = pid, .instance = proc->instance};
    struct comm_t comm = {};
    __builtin_memcpy(comm.comm, proc->comm, sizeof(comm.comm));
    if (exited.insert(&gone, &comm) == 0)  // full: the rows stay live (still exact), never folded
        procs.delete(&pid);
    return 0;
}
