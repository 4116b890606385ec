// A target's new process becomes a target too, for a program whose events are scoped by a targets map:
// appended after that program (profile.c), whose targets and is_target() it uses. A raw
// tracepoint: closing a perf tracepoint event waits for RCU grace periods, a raw one does not (profile.c).
// With CFI_UNWIND, any new process starts with its parent's image (images.c).
// args: struct task_struct *parent, struct task_struct *child
#ifdef CFI_UNWIND
static inline void image_fork(u32 parent, u32 child);  // images.c
#endif
RAW_TRACEPOINT_PROBE(sched_process_fork)
{
#ifdef FILTER_PIDS
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(parent))
        return 0;
    u32 child = forked_process(ctx, parent);
    if (child) {
        u8 one = 1;
        targets.update(&child, &one);
    }
#endif
#ifdef CFI_UNWIND
    u32 forker = bpf_get_current_pid_tgid() >> 32;
    u32 forked = forked_process(ctx, forker);
    if (forked)
        image_fork(forker, forked);  // images.c
#endif
    return 0;
}
