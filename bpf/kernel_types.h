// The kernel types the programs use, declared here instead of taken from the kernel headers: clang parsed
// linux/ptrace.h, uapi/linux/bpf_perf_event.h, linux/sched.h and what they pull in for 0.8 s of the
// compile's 1.34 s here, before the first sample.
// x86_64 layouts, which are ABI (struct pt_regs is what ptrace's user_regs_struct mirrors; the perf
// event context is uapi); tests/core/test_kernel_types.py checks them against the running kernel's BTF.
// Field offsets of other structures come from the kernel's BTF at load time (kernel_offsets.h). With
// KERNEL_HEADERS (no BTF, or another architecture: bpf/loader.py decides) the headers are used instead.
#ifdef KERNEL_HEADERS
#include <uapi/linux/ptrace.h>
#include <linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include <linux/sched.h>
#include <linux/binfmts.h>
#define HEADER_OFFSET(type, field) offsetof(type, field)
#else
#include <uapi/asm-generic/errno.h>

#define TASK_COMM_LEN 16
#define HEADER_OFFSET(type, field) 0

struct task_struct;
struct linux_binprm;

struct pt_regs {
    unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
    unsigned long ax, cx, dx, si, di, orig_ax;
    unsigned long ip, cs, flags, sp, ss;
};

struct bpf_perf_event_data {
    struct pt_regs regs;
    __u64 sample_period;
    __u64 addr;
};
#endif
