// The CFI walker's Python state (unwind.c's struct unwind_state holds one): which eval calls of the
// interpreter are expanded into Python frames, and how far the thread's frame chain has been walked.
// Put before unwind.c by profiler.py with the CFI walker; the Python programs themselves are python.c,
// compiled with -DPYTHON_UNWIND. Without it, no process is a Python process here.

#define PYTHON_FRAME (1ULL << 62)  // a frame word holding a code object and an instruction (python.c)

// python_walk.state
#define PY_ABSENT 0   // not a Python process this walker knows (or Python frames are off)
#define PY_PENDING 1  // a Python process: its thread's state is looked up at the first eval frame
#define PY_READY 2    // `frame` is the next Python frame of the thread's chain
#define PY_FAILED 3   // no Python frames this sample (status says why): eval frames stay native

// Why a stack's Python frames stopped short (keep in sync with PYTHON_STATUSES in bpf/pythonmaps.py)
enum python_status {
    PY_OK = 0,
    PY_NO_THREAD,     // the thread's PyThreadState was not found (or the process has no thread_id check)
    PY_READ_FAULT,    // a thread state or frame could not be read
    PY_DEPTH,         // the stack's frame limit was reached in Python frames
    PY_LOOP,          // the frame chain led back to the same frame
    PY_CHAIN_END,     // eval frames were left when the thread's frame chain ended
};

struct python_walk {
    u64 frame;   // the next Python frame of the thread's chain, 0: none left
    u64 native;  // the eval call's own frame word, kept when no Python frame takes its place
    u64 eval_start0, eval_end0, eval_start1, eval_end1;  // the eval function, copied from py_procs
    u32 mode;         // 1: python_step puts the Python frames of one eval call next
    u32 state;        // PY_*
    u32 status;       // enum python_status
    u32 frames;       // Python frames in the stack
    u32 emitted;      // Python frames put for the current eval call
    u32 native_done;  // the native walk ended at the eval frame being expanded
    u64 capture[4];   // python_capture: code objects to capture (PY_CAPTURES_PER_SAMPLE)
    u32 scanned;      // python_capture: frames looked at
    u32 pad;
};

#ifdef PYTHON_UNWIND
#ifndef PYTHON_PROCS
#define PYTHON_PROCS 4096
#endif

// What the walker knows of one process's interpreter (optrace/pythonlayout.py; packed by bpf/pythonmaps.py).
// Offsets are u16s; frame fields below PY_FRAME_WINDOW, code fields below PY_CODE_WINDOW.
struct py_proc {
    u64 runtime;  // _PyRuntime
    u64 eval_start0, eval_end0, eval_start1, eval_end1;
    u64 code_tag_mask;
    u16 interpreters_head;
    u16 interp_threads_head;
    u16 tstate_next;
    u16 tstate_thread_id;
    u16 tstate_frame;
    u16 cframe_current_frame;  // 0xffff: tstate_frame points at the frame
    u16 frame_previous;
    u16 frame_code;
    u16 frame_instr;
    u16 frame_entry;
    u16 code_adaptive;
    u16 code_name;
    u16 code_qualname;
    u16 code_filename;
    u16 code_linetable;
    u8 entry_kind;
    u8 entry_value;
    u8 instr_kind;
    u8 pad[3];
    u32 instance;  // tells this process from an earlier one with its pid (py_seen)
};

BPF_HASH(py_procs, u32, struct py_proc, PYTHON_PROCS);
#endif

static inline void python_walk_start(struct python_walk *pw, u32 pid)
{
    pw->mode = 0;
    pw->status = PY_OK;
    pw->frames = 0;
    pw->frame = 0;
    pw->state = PY_ABSENT;
#ifdef PYTHON_UNWIND
    struct py_proc *proc = py_procs.lookup(&pid);
    if (!proc)
        return;
    pw->eval_start0 = proc->eval_start0;
    pw->eval_end0 = proc->eval_end0;
    pw->eval_start1 = proc->eval_start1;
    pw->eval_end1 = proc->eval_end1;
    pw->state = PY_PENDING;
#endif
}

// Whether `pc` is in the eval function of a Python process whose frames can still be had: then the
// walk's next step is python_step (mode), which puts that call's Python frames in place of `pc`'s frame.
static inline int python_eval_frame(struct python_walk *pw, u64 pc)
{
    if (pw->state != PY_PENDING && pw->state != PY_READY)
        return 0;
    if ((pc >= pw->eval_start0 && pc < pw->eval_end0) || (pc >= pw->eval_start1 && pc < pw->eval_end1)) {
        pw->mode = 1;
        pw->emitted = 0;
        return 1;
    }
    return 0;
}
