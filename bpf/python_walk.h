// The CFI walker's Python state (unwind.c's struct unwind_state holds one): which eval calls of the
// interpreter are expanded into Python frames, and how far the thread's frame chain has been walked.
// Put before unwind.c by profiler.py with the CFI walker; the Python programs themselves are python.c,
// compiled with -DPYTHON_UNWIND. Without it, no process is a Python process here.

#define RUNTIME_FRAME (1ULL << 62)  // a runtime's frame word: bits 63-62 01, 59-56 the runtime's id (docs/runtimes.md)
#define RUNTIME_WORD_MASK (0xCFULL << 56)  // what tells a runtime's words (bits 61-60 mark a copy's chain)
#define PY_RUNTIME_ID 1  // optrace.pythonlayout.PYTHON_RUNTIME_ID
#define PYTHON_FRAME (RUNTIME_FRAME | (u64)PY_RUNTIME_ID << 56)  // a code object and an instruction (python.c)

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
    PY_NATIVE_CUT,    // the Python frames are whole, the native frames among the outer ones are not (the
                      // sample's tail calls went to them: python_rest_due)
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
    u32 call_done;    // python_next: the frame it gave was the eval call's last
    u64 capture[4];   // python_capture: code objects to capture (PY_CAPTURES_PER_SAMPLE)
    u32 scanned;      // python_capture: frames looked at
    u32 scans;        // python_thread: programs the thread search took so far
    u64 scan;         // python_thread: where the search goes on
    u32 rest;         // 1: python_step puts the rest of the thread's chain, every eval call's frames, and ends
    u32 tail_calls;   // tail calls the sample's walk made (the kernel allows MAX_TAIL_CALLS)
};

#define MAX_TAIL_CALLS 33  // MAX_TAIL_CALL_CNT (Linux 5.17+; 32 before: the last call then fails, and is handled)
#define PY_FRAMES_PER_PROG 32  // Python frames python_step puts per program
#define PY_REST_MIN_FRAMES 16  // Python frames a stack holds before its rest may be put without native frames
#define PY_REST_CALLS 12       // programs the rest takes at most (PY_FRAMES_PER_PROG frames each)

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
    u8 frame_bytes;  // of a frame read: up to its last field the walk reads (a frame may end a mapping)
    u8 pad[2];
    u32 instance;  // tells this process from an earlier one with its pid (py_seen)
};

BPF_HASH(py_procs, u32, struct py_proc, PYTHON_PROCS);

#define PY_FRAME_WINDOW 128  // optrace.pythonlayout.FRAME_WINDOW
#define PY_WINDOW 4096       // bytes of the thread's frames read at once
#define PY_PAGE_MASK (~4095ULL)
#define PY_CODE_SHIFT 12     // PYTHON_CODE_SHIFT
#define PY_CODE_MASK ((1ULL << 44) - 1)
#define PY_INSTR_MASK 0xfff
#define PY_NO_OFFSET 0xffff
#define ENTRY_PER_CALL 0  // optrace.pythonlayout.ENTRY_*
#define ENTRY_FLAG 1
#define ENTRY_SHIM 2
#define INSTR_LASTI_BYTES 0  // INSTR_*
#define INSTR_LASTI_UNITS 1
#define INSTR_POINTER 2

// The frames read last: `valid` bytes from `base` (0: none this sample). In 3.11+ a thread's frames are
// pushed on a stack of their own, each after its caller: one read ending at a frame's end holds the frames
// of its callers before it (pyfixed.py's 50-deep recursion: 100-odd bytes a frame, 2-3 reads where there
// were 50; with 32 frames a program, the BPF time per sample with Python frames went from 2.26x to 1.26x the
// native walk's, medians of 3 interleaved rounds at load 29).
struct py_scratch {
    u8 window[PY_WINDOW + PY_FRAME_WINDOW];  // a frame's fields are read at (offset & (PY_WINDOW - 1)) + field
    u64 base;
    u32 valid;
    u32 pad;
};

BPF_PERCPU_ARRAY(py_scratch, struct py_scratch, 1);

static inline u64 read_word(u64 address)
{
    u64 value = 0;
    if (bpf_probe_read_user(&value, sizeof(value), (void *)address))
        return 0;
    return value;
}

// A field's bytes in the window, read as one load: clang takes a u8 array's element as unaligned and
// splits the load into byte loads (27 instructions for a u64, verified for every frame of every path:
// a fifth of python_step's 30k). A frame's fields are aligned when the frame is; when it is not (the
// process's memory), an unaligned load of a map value is allowed on x86 and reads the same bytes.
#define WINDOW_FIELD(type, s, index) (*(type *)__builtin_assume_aligned(&(s)->window[index], sizeof(type)))

// The field at `offset` of the frame at `at` in the window.
static inline u64 field_u64(struct py_scratch *s, u32 at, u32 offset)
{
    offset &= PY_FRAME_WINDOW - 1;
    if (offset > PY_FRAME_WINDOW - 8)
        return 0;
    return WINDOW_FIELD(u64, s, (at & (PY_WINDOW - 1)) + offset);
}

static inline u8 field_u8(struct py_scratch *s, u32 at, u32 offset)
{
    return s->window[(at & (PY_WINDOW - 1)) + (offset & (PY_FRAME_WINDOW - 1))];
}

// Reads `len` bytes at `start` into the window (0: done).
static inline int read_window(struct py_scratch *s, u64 start, u64 len)
{
    asm volatile("" : "+r"(len));  // the mask below stays, as the verifier needs it
    len &= 2 * PY_WINDOW - 1;
    if (len > PY_WINDOW || bpf_probe_read_user(s->window, len, (void *)start))
        return -1;
    s->base = start;
    s->valid = len;
    return 0;
}

// Where the frame at `frame` is in the window; -1: unreadable. A frame not in it is read alone, and when
// its caller's frame lies below it within PY_WINDOW (3.11+'s frame stack), the PY_WINDOW bytes that end at
// its end are read (or, when those cross into an unmapped page, from its caller's page): its callers'
// frames are then in the window. Frames on the heap (up to 3.10, generators) cost a read each, as before.
static inline s32 frame_in_window(struct py_scratch *s, struct py_proc *proc, u64 frame)
{
    u32 size = proc->frame_bytes;
    asm volatile("" : "+r"(size));
    size &= PY_FRAME_WINDOW - 1;
    u64 at = frame - s->base;
    if (frame >= s->base && at + size <= s->valid)
        return at;
    if (read_window(s, frame, size)) {
        s->valid = 0;
        return -1;
    }
    u64 previous = field_u64(s, 0, proc->frame_previous), end = frame + size;
    if (previous >= frame || frame - previous > PY_WINDOW - PY_FRAME_WINDOW)
        return 0;  // the caller is elsewhere: this frame alone
    if (!read_window(s, end - PY_WINDOW, PY_WINDOW) ||
        !read_window(s, previous & PY_PAGE_MASK, end - (previous & PY_PAGE_MASK)))
        return frame - s->base;
    if (read_window(s, frame, size)) {  // the caller's page is not mapped: this frame alone again
        s->valid = 0;
        return -1;
    }
    return 0;
}

// The Python walk is over for this sample: eval frames from here on stay native.
static inline void python_fail(struct python_walk *pw, u32 status)
{
    pw->state = PY_FAILED;
    if (!pw->status)
        pw->status = status;
}

static inline u32 instruction(struct py_proc *proc, struct py_scratch *s, u32 at, u64 code)
{
    u32 field = proc->frame_instr;
    if (proc->instr_kind == INSTR_POINTER) {
        u64 first = code + (proc->code_adaptive & 0xffff);
        u64 instr = field_u64(s, at, field);
        return instr > first ? (instr - first) / 2 : 0;
    }
    field &= PY_FRAME_WINDOW - 1;
    if (field > PY_FRAME_WINDOW - 4)
        return 0;
    s32 lasti = WINDOW_FIELD(s32, s, (at & (PY_WINDOW - 1)) + field);
    if (lasti < 0)
        return 0;
    return proc->instr_kind == INSTR_LASTI_BYTES ? (u32)lasti / 2 : (u32)lasti;
}

// The next Python frame of the eval call being expanded, as a frame word, or 0 when the call has no more;
// pw->call_done says whether the call's frames are done. In rest mode (pw->rest) the calls' bounds do not
// matter: a call's first frame is passed over, and only the chain's end is done. The frame chain is the
// process's memory: a frame that is its own predecessor ends the chain (longer loops end at the stack's
// frame limit).
static inline u64 python_next(struct python_walk *pw, struct py_proc *proc, struct py_scratch *s)
{
    pw->call_done = 1;
    u64 frame = pw->frame;
    if (!frame) {
        if (!pw->emitted && !pw->status && !pw->rest)
            pw->status = PY_CHAIN_END;
        return 0;
    }
    s32 at = frame_in_window(s, proc, frame);
    if (at < 0) {
        pw->frame = 0;
        python_fail(pw, PY_READ_FAULT);
        return 0;
    }
    u64 previous = field_u64(s, at, proc->frame_previous);
    if (previous == frame) {
        previous = 0;
        python_fail(pw, PY_LOOP);
    }
    pw->frame = previous;
    u8 mark = field_u8(s, at, proc->frame_entry);
    if (proc->entry_kind == ENTRY_SHIM && mark >= proc->entry_value) {
        pw->call_done = !pw->rest;
        return 0;  // the frame the eval call started with: the call's frames are all put
    }
    u64 code = field_u64(s, at, proc->frame_code) & ~proc->code_tag_mask;
    u32 instr = instruction(proc, s, at, code);
    pw->call_done = !pw->rest && (proc->entry_kind == ENTRY_PER_CALL || (proc->entry_kind == ENTRY_FLAG && mark));
    return PYTHON_FRAME | ((code >> 3) & PY_CODE_MASK) << PY_CODE_SHIFT | (instr > PY_INSTR_MASK ? PY_INSTR_MASK : instr);
}
#endif

static inline void python_walk_start(struct python_walk *pw, u32 pid)
{
    pw->mode = 0;
    pw->native_done = 0;
    pw->status = PY_OK;
    pw->frames = 0;
    pw->frame = 0;
    pw->scans = 0;
    pw->scan = 0;
    pw->rest = 0;
    pw->tail_calls = 1;  // unwind_user_stack's, to unwind_step
    pw->state = PY_ABSENT;
#ifdef PYTHON_UNWIND
    struct py_proc *proc = py_procs.lookup(&pid);
    if (!proc)
        return;
    u32 zero = 0;
    struct py_scratch *s = py_scratch.lookup(&zero);
    if (s)
        s->valid = 0;  // another sample's reads
    pw->eval_start0 = proc->eval_start0;
    pw->eval_end0 = proc->eval_end0;
    pw->eval_start1 = proc->eval_start1;
    pw->eval_end1 = proc->eval_end1;
    pw->state = PY_PENDING;
#endif
}

// Whether the sample's tail calls left are only enough for the rest of the thread's Python frames (a stack of
// `len` frames, at most `cap`): then they go to those, without the native frames among them (rest mode),
// rather than to native frames in which the walk would run out. Up to 3.10 each Python call takes 3-4
// native frames, 4 a program: a 300-deep stack's walk ran out after 40-60 Python frames.
static inline int python_rest_due(struct python_walk *pw, u32 len, u32 cap)
{
    if (pw->state != PY_READY || !pw->frame || pw->frames < PY_REST_MIN_FRAMES || len >= cap)
        return 0;
    u32 needed = (cap - len) / PY_FRAMES_PER_PROG + 1;
    if (needed > PY_REST_CALLS)
        needed = PY_REST_CALLS;
    return pw->tail_calls + needed >= MAX_TAIL_CALLS;
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
