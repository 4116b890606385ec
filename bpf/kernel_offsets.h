// Byte offsets of the kernel fields the raw tracepoints read. The frontend sets them right after loading,
// from the running kernel's BTF (bpf/btf.py): the headers BCC compiles against may be another kernel's.
// Without BTF they stay 0 and the headers' offsets are used (compiled with KERNEL_HEADERS, kernel_types.h).
// loader.py puts kernel_types.h and this file before the program.

enum kernel_offset {
    TASK_TGID = 0,    // struct task_struct, tgid
    BINPRM_FILENAME,  // struct linux_binprm, filename
    TASK_FSBASE,      // struct task_struct, thread.fsbase (x86_64: a thread's TLS base, pthread_self())
    TASK_STATE,       // struct task_struct, __state (offcpu.c: why a thread leaves its CPU)
    TASK_RUNTIME,     // struct task_struct, se.sum_exec_runtime (profile.c: a thread's CPU time at its exit)
    TASK_START_TIME,  // struct task_struct, start_time (profile.c: born since the sampler attached)
    NR_KERNEL_OFFSETS,
};

BPF_ARRAY(kernel_offsets, u32, NR_KERNEL_OFFSETS);

static inline u32 kernel_offset(u32 index)
{
    u32 *known = kernel_offsets.lookup(&index);
    if (known && *known)
        return *known;
    if (index == TASK_TGID)
        return HEADER_OFFSET(struct task_struct, tgid);
    if (index == TASK_FSBASE)
        return HEADER_OFFSET(struct task_struct, thread.fsbase);
    if (index == TASK_STATE)
        return HEADER_OFFSET(struct task_struct, __state);
    if (index == TASK_RUNTIME)
        return HEADER_OFFSET(struct task_struct, se.sum_exec_runtime);
    if (index == TASK_START_TIME)
        return HEADER_OFFSET(struct task_struct, start_time);
    return HEADER_OFFSET(struct linux_binprm, filename);
}

// sched_process_fork's child (raw tracepoint args: parent, child task_struct pointers): the id of the new
// process, or 0 for a new thread of the parent's process (or when the read fails).
static inline u32 forked_process(struct bpf_raw_tracepoint_args *ctx, u32 parent)
{
    u32 child = 0;
    bpf_probe_read_kernel(&child, sizeof(child), (void *)ctx->args[1] + kernel_offset(TASK_TGID));
    return child == parent ? 0 : child;
}
