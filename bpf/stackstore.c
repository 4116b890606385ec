// The stack store: every stack a program keeps (kernel IPs, user IPs, build-id frames, CFI frames) is
// stored once, under a 64-bit hash of its words, and count keys name stacks by that hash.
//
// Why: a stack map hands out bucket ids, valid only until the map is cleared, so every drain had to read
// every stack its counts named (a system call each, or a 1 KiB value each in a batch read) and decode it
// before the next drain. Here a stack is appended to an arena that user space reads through a mapping,
// as a record (header, hash, words), once per store epoch however often it is sampled; a count key names
// it by content, so equal keys of different drains are equal bytes, summed without being decoded.
//
// Arena: two halves (the epoch's parity says which one is written), each STORE_CHUNKS chunks of
// STORE_CHUNK_WORDS words; a record never crosses a chunk's end (each chunk has room after it, which the
// verifier needs and nothing uses), a reservation that would is marked to be skipped. Records are
// reserved with an atomic add, so CPUs append side by side; the header is written last (an atomic
// exchange): a reader that meets a header without the COMMITTED bit of this epoch stops there until the
// next read. `store_index` (an LRU hash) says which stacks this epoch already holds; an entry of another
// epoch counts as absent, so the index is never cleared, and an entry it evicts only costs a second copy.
//
// The frontend (bpf/stackstore.py) turns the store over when the written half is half full: the epoch
// moves on and the other half, read to its end before, is written again from its start.

#define STACK_KERNEL 1
#define STACK_RAW 2       // user IPs, the kernel's frame-pointer walk
#define STACK_BUILD_ID 3  // user frames as struct bpf_stack_build_id (4 words each)
#define STACK_CFI 4       // unwind.c's frames: (file id, offset), or raw IPs

#define STORE_CHUNK_WORDS 4096
#define STORE_PAD_WORDS 512       // > the largest record: 2 + 127 x 4 words
#define STORE_MAX_WORDS 508       // a record's words after its header and hash
#ifndef STORE_CHUNKS
#define STORE_CHUNKS 256          // per half: 8 MiB
#endif
#define STORE_WORDS ((u64)STORE_CHUNKS * STORE_CHUNK_WORDS)
#ifndef STORE_INDEX_SIZE
#define STORE_INDEX_SIZE 65536
#endif
#define RECORD_COMMITTED (1ULL << 63)
#define RECORD_SKIP (1ULL << 62)
#define EPOCH_SHIFT 32  // a header's bits 32-47: the epoch's low 16 bits (stale headers of the half's last use)
#define PYTHON_STATUS_SHIFT 48  // bits 48-55: why a stack's Python frames stopped (python.c), 0: they did not
#define FNV_PRIME 0x100000001b3ULL
#define FNV_BASIS 0xcbf29ce484222325ULL

struct store_chunk {
    u64 words[STORE_CHUNK_WORDS + STORE_PAD_WORDS];
};

struct stack_scratch {
    u64 words[512];  // STORE_MAX_WORDS used
};

TABLE_BYTES(store_chunk);  // see table_bytes.h
TABLE_BYTES(stack_scratch);
BPF_F_TABLE("array", u32, struct store_chunk_bytes, store_arena, 2 * STORE_CHUNKS, BPF_F_MMAPABLE);
BPF_ARRAY(store_state, u64, 3);  // [0]: the epoch; [1 + half]: words reserved in that half
BPF_TABLE("lru_hash", u64, u32, store_index, STORE_INDEX_SIZE);  // stack hash -> epoch it was stored in
BPF_PERCPU_ARRAY(stack_scratch, struct stack_scratch_bytes, 1);

// FNV-1a over the first `words` words of `scratch` (whose words after them bpf_get_stack zeroed) and the
// count: every word up to `limit` is hashed, so the loop has one path (a loop that stops at `words` has
// one exit per length, and the verifier walks the rest of the program again from each: 78k instructions
// verified instead of 6k).
static inline u64 hash_scratch(struct stack_scratch *scratch, u32 words, u32 limit, u64 seed)
{
    u64 hash = seed;
#pragma clang loop unroll(disable)  // unrolled, three copies of it are more than a program may hold
    for (int i = 0; i < STORE_MAX_WORDS; i++) {
        if (i < limit)
            hash = (hash ^ scratch->words[i]) * FNV_PRIME;
    }
    return (hash ^ words) * FNV_PRIME;
}

static inline struct store_chunk *store_chunk_at(u64 half, u64 word)
{
    u32 index = half * STORE_CHUNKS + word / STORE_CHUNK_WORDS;
    return (struct store_chunk *)store_arena.lookup(&index);
}

// Reserves `total` words in the half that do not cross a chunk's end; the reservation's first word, or
// STORE_WORDS when the half is full.
static inline u64 store_reserve(u64 *used, u64 half, u32 total, u64 epoch_bits)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        u64 start = __sync_fetch_and_add(used, total);
        if (start >= STORE_WORDS)
            return STORE_WORDS;
        if (start % STORE_CHUNK_WORDS + total <= STORE_CHUNK_WORDS)
            return start;
        struct store_chunk *chunk = store_chunk_at(half, start);  // crosses a chunk's end: skipped
        if (chunk)
            __sync_lock_test_and_set(&chunk->words[start & (STORE_CHUNK_WORDS - 1)], RECORD_SKIP | epoch_bits | total);
    }
    return STORE_WORDS;
}

// Stores n words (at most STORE_MAX_WORDS) under `hash` unless this epoch holds them already; returns the
// hash (never 0, which a count key uses for "no stack"), or 0 when the half is full (the sample keeps no
// such stack: counted as lost by the caller). *fresh: whether the words were stored now. `status`: bits 0-7
// the header's status byte, bits 8-15 its Python status byte (unwind.c, python.c).
static inline u64 store_stack(u64 *words, u32 n, u64 hash, u32 kind, u32 status, u32 *fresh)
{
    hash = hash ? hash : 1;
    u32 zero = 0;
    u64 *epoch_slot = store_state.lookup(&zero);
    if (!epoch_slot)
        return 0;
    u64 epoch = *epoch_slot;
    u32 *stored_in = store_index.lookup(&hash);
    if (stored_in && *stored_in == (u32)epoch)
        return hash;
    u64 half = epoch & 1;
    u32 used_slot = 1 + half;
    u64 *used = store_state.lookup(&used_slot);
    if (!used)
        return 0;
    u64 length = n;
    asm volatile("%0 &= 511" : "+r"(length));  // in asm: clang drops a mask it deems needless, the verifier needs it
    if (length > STORE_MAX_WORDS)
        length = STORE_MAX_WORDS;
    u64 epoch_bits = (epoch & 0xffff) << EPOCH_SHIFT;
    u64 start = store_reserve(used, half, length + 2, epoch_bits);
    if (start >= STORE_WORDS)
        return 0;
    struct store_chunk *chunk = store_chunk_at(half, start);
    if (!chunk)
        return 0;
    u32 offset = start & (STORE_CHUNK_WORDS - 1);
    chunk->words[offset + 1] = hash;
    bpf_probe_read_kernel(&chunk->words[offset + 2], length * 8, words);
    __sync_lock_test_and_set(&chunk->words[offset],
                             RECORD_COMMITTED | epoch_bits | (u64)(status & 0xff) << 24 | (u64)(kind & 0xff) << 16 |
                             (u64)((status >> 8) & 0xff) << PYTHON_STATUS_SHIFT | length);
    u32 stamp = epoch;
    store_index.update(&hash, &stamp);
    *fresh = 1;
    return hash;
}

// A stack the kernel walks (bpf_get_stack's flags; at most `frames` frames, 127) into the per-CPU scratch,
// stored: its hash, or 0 when
// there is none or it could not be stored (*missing is set then if the walk gave frames). For build-id
// stacks, *files_only says whether every frame is a build-id frame (not an IP the kernel fell back to):
// such a stack is named from its files alone, at any time.
static inline u64 store_walked_stack(void *ctx, u64 flags, u32 kind, u32 frames, int *missing, int *files_only)
{
    u32 zero = 0;
    struct stack_scratch *scratch = (struct stack_scratch *)stack_scratch.lookup(&zero);
    if (!scratch)
        return 0;
    if (frames > 127)
        frames = 127;
    u32 size = kind == STACK_BUILD_ID ? frames * 32 : frames * 8;
    long bytes = bpf_get_stack(ctx, scratch->words, size, flags);
    if (bytes <= 0)
        return 0;
    u32 n = (u32)bytes / 8;
    if (kind == STACK_BUILD_ID) {  // an IP frame has status 2 (BPF_STACK_BUILD_ID_IP), a valid one 1, the rest 0
        u64 statuses = 0;
#pragma clang loop unroll(disable)
        for (int i = 0; i < 127; i++)  // bitwise, not a branch: a branch on n would split the verifier's
                                       // states by n's range at every entry (words past `frames` are stale)
            statuses |= (u32)scratch->words[i * 4] & -(u32)(i < frames);
        *files_only = (statuses & 2) == 0;
    }
    u32 fresh = 0;
    u64 hash = store_stack(scratch->words, n, hash_scratch(scratch, n, size / 8, FNV_BASIS ^ kind), kind, 0, &fresh);
    *missing = hash == 0;
    return hash;
}
