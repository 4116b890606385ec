// The replay's stand-in for BCC: the BPF programs' own C (bpf/*.c, as bpf/loader.py joins them) compiled by
// the host compiler into a shared library that tests drive through ctypes (tests/replay/replay.py).
//
// What BCC gives a program is given here in plain C: the map declarations (BPF_HASH, BPF_ARRAY, ...) become
// objects with the methods BCC's rewriter accepts (lookup, update, insert, delete, call, perf_submit,
// ringbuf_output), kept in host memory; the helpers read a snapshot's memory (bpf_probe_read_user), the
// sampled thread (pid, tid, fs base, comm) and a clock the test sets. A tail call runs the program in the
// slot and then jumps back to where the run began (longjmp), so the code after a successful call never runs,
// as in the kernel; after REPLAY_MAX_TAIL_CALLS calls, or for an empty slot, it fails and the program goes
// on, as in the kernel. The OpenTelemetry eBPF profiler's coredump tests do the same for its programs.
//
// Nothing here checks what the verifier checks: the replay proves the rules, the kernel still verifies them.
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <setjmp.h>

void *calloc(size_t count, size_t size);
void free(void *pointer);

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef int8_t s8;
typedef int16_t s16;
typedef int32_t s32;
typedef int64_t s64;
typedef u8 __u8;
typedef u16 __u16;
typedef u32 __u32;
typedef u64 __u64;
typedef s32 __s32;
typedef s64 __s64;

#define BPF_F_USER_STACK (1ULL << 8)
#define BPF_F_USER_BUILD_ID (1ULL << 11)
#define BPF_F_NO_PREALLOC 1
#define BPF_F_MMAPABLE (1U << 10)
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define REPLAY_MAX_TAIL_CALLS 33  // MAX_TAIL_CALL_CNT since Linux 5.17
#define REPLAY_EFAULT 14
#define REPLAY_MAX_MAPS 128
#define REPLAY_MAX_HASH 65536  // slots of a hash map here, whatever its size in the kernel

struct task_struct;
struct pt_regs;

struct bpf_raw_tracepoint_args {
    __u64 args[0];
};

enum replay_kind { REPLAY_BY_TYPE = -2, REPLAY_ARRAY = 0, REPLAY_HASH, REPLAY_LRU_HASH, REPLAY_PROG_ARRAY, REPLAY_OUTPUT };

// One map. Hash maps: open addressing over `slots` slots (a power of two), `used[i]` marks a slot in use.
struct replay_map {
    const char *name;
    int kind;
    const char *type;  // REPLAY_BY_TYPE: BCC's map type name ("hash", "lru_hash", "array")
    u32 key_size;
    u32 value_size;
    u32 max_entries;
    u32 slots;
    u32 count;
    u8 *keys;
    u8 *values;
    u8 *used;
    int (**progs)(void *);
    u8 *output;          // REPLAY_OUTPUT: what the programs wrote, record after record (u32 size, bytes)
    u64 output_bytes;
    u64 output_capacity;
    u32 *lookups;        // with `logging`: the indices an array map was looked up at
    u32 lookups_count;
    u32 logging;
};

struct replay_ops {
    void *(*lookup)(const void *key);
    int (*update)(const void *key, const void *value);
    int (*insert)(const void *key, const void *value);
    int (*delete)(const void *key);
    long (*call)(void *ctx, u32 index);
    int (*perf_submit)(void *ctx, void *data, u32 size);
    long (*ringbuf_output)(void *data, u64 size, u64 flags);
};

static struct replay_map *replay_maps[REPLAY_MAX_MAPS];
static u32 replay_map_count;

static void replay_register(struct replay_map *map)
{
    if (replay_map_count < REPLAY_MAX_MAPS)
        replay_maps[replay_map_count++] = map;
}

static int replay_kind_of(const char *type)
{
    if (!strcmp(type, "hash"))
        return REPLAY_HASH;
    if (!strcmp(type, "lru_hash"))
        return REPLAY_LRU_HASH;
    if (!strcmp(type, "array") || !strcmp(type, "percpu_array"))
        return REPLAY_ARRAY;
    return -1;  // a map type the replay does not know: replay_open() fails
}

static int replay_open(struct replay_map *map)
{
    if (map->kind == REPLAY_BY_TYPE)
        map->kind = replay_kind_of(map->type);
    if (map->kind < 0)
        return -1;
    if (map->kind == REPLAY_ARRAY && !map->values) {
        map->values = calloc(map->max_entries, map->value_size);
        map->lookups = calloc(4096, sizeof(u32));
    } else if ((map->kind == REPLAY_HASH || map->kind == REPLAY_LRU_HASH) && !map->keys) {
        u32 slots = 1;
        while (slots < map->max_entries && slots < REPLAY_MAX_HASH)
            slots <<= 1;
        map->slots = slots;
        map->keys = calloc(slots, map->key_size);
        map->values = calloc(slots, map->value_size);
        map->used = calloc(slots, 1);
    } else if (map->kind == REPLAY_PROG_ARRAY && !map->progs) {
        map->progs = calloc(map->max_entries, sizeof(*map->progs));
    }
    return 0;
}

static u32 replay_hash(const u8 *key, u32 size)
{
    u32 hash = 2166136261u;
    for (u32 i = 0; i < size; i++)
        hash = (hash ^ key[i]) * 16777619u;
    return hash;
}

// The slot holding `key`, or the free slot where it would go (slots when the map is full and it is absent).
static u32 replay_slot(struct replay_map *map, const void *key)
{
    u32 mask = map->slots - 1, at = replay_hash(key, map->key_size) & mask;
    for (u32 i = 0; i < map->slots; i++, at = (at + 1) & mask) {
        if (!map->used[at] || !memcmp(map->keys + (u64)at * map->key_size, key, map->key_size))
            return at;
    }
    return map->slots;
}

static void *replay_lookup(struct replay_map *map, const void *key)
{
    if (replay_open(map))
        return 0;
    if (map->kind == REPLAY_ARRAY) {
        u32 index = *(const u32 *)key;
        if (map->logging && map->lookups_count < 4096)
            map->lookups[map->lookups_count++] = index;
        return index < map->max_entries ? map->values + (u64)index * map->value_size : 0;
    }
    u32 at = replay_slot(map, key);
    return at < map->slots && map->used[at] ? map->values + (u64)at * map->value_size : 0;
}

// BPF_ANY (insert == 0) or BPF_NOEXIST (insert == 1); an LRU map drops an entry when full.
static int replay_update(struct replay_map *map, const void *key, const void *value, int insert)
{
    if (replay_open(map))
        return -1;
    if (map->kind == REPLAY_ARRAY) {
        void *slot = replay_lookup(map, key);
        if (!slot || insert)
            return -1;
        memcpy(slot, value, map->value_size);
        return 0;
    }
    u32 at = replay_slot(map, key);
    if (at < map->slots && map->used[at]) {
        if (insert)
            return -1;
    } else {
        if (map->count >= map->max_entries || at >= map->slots) {
            if (map->kind != REPLAY_LRU_HASH)
                return -1;
            memset(map->used, 0, map->slots);  // evicts everything: the replay's maps are never that full
            map->count = 0;
            at = replay_slot(map, key);
        }
        map->used[at] = 1;
        map->count++;
        memcpy(map->keys + (u64)at * map->key_size, key, map->key_size);
    }
    memcpy(map->values + (u64)at * map->value_size, value, map->value_size);
    return 0;
}

static int replay_delete(struct replay_map *map, const void *key)
{
    if (replay_open(map) || map->kind == REPLAY_ARRAY)
        return -1;
    u32 at = replay_slot(map, key);
    if (at >= map->slots || !map->used[at])
        return -1;
    // Backward-shift deletion keeps every other key reachable from its home slot.
    u32 mask = map->slots - 1, hole = at, next = (at + 1) & mask;
    map->used[hole] = 0;
    map->count--;
    while (map->used[next]) {
        u32 home = replay_hash(map->keys + (u64)next * map->key_size, map->key_size) & mask;
        if (((next - home) & mask) >= ((next - hole) & mask)) {
            memcpy(map->keys + (u64)hole * map->key_size, map->keys + (u64)next * map->key_size, map->key_size);
            memcpy(map->values + (u64)hole * map->value_size, map->values + (u64)next * map->value_size,
                   map->value_size);
            map->used[hole] = 1;
            map->used[next] = 0;
            hole = next;
        }
        next = (next + 1) & mask;
    }
    return 0;
}

static int replay_output(struct replay_map *map, const void *data, u64 size)
{
    if (map->output_bytes + 4 + size > map->output_capacity) {
        u64 capacity = (map->output_capacity ? map->output_capacity * 2 : 1 << 16) + 4 + size;
        u8 *grown = calloc(capacity, 1);
        if (!grown)
            return -1;
        if (map->output)
            memcpy(grown, map->output, map->output_bytes);
        free(map->output);
        map->output = grown;
        map->output_capacity = capacity;
    }
    u32 record = (u32)size;
    memcpy(map->output + map->output_bytes, &record, 4);
    memcpy(map->output + map->output_bytes + 4, data, size);
    map->output_bytes += 4 + size;
    return 0;
}

// The sample being replayed.
static jmp_buf *replay_top;
static u32 replay_tail_calls;
static u64 replay_pid_tgid;
static u64 replay_now_ns;
static char replay_comm[16];
static u8 replay_task[4096];  // bpf_get_current_task(): fields at the offsets kernel_offsets holds

static long replay_tail_call(void *ctx, struct replay_map *map, u32 index)
{
    if (replay_open(map) || index >= map->max_entries || !map->progs[index] || replay_tail_calls >= REPLAY_MAX_TAIL_CALLS)
        return -1;
    replay_tail_calls++;
    map->progs[index](ctx);
    longjmp(*replay_top, 1);
}

#define REPLAY_MAP(_kind, _type, _ktype, _vtype, _name, _size)                                                     \
    static struct replay_map _name##__map = {#_name, _kind, _type, sizeof(_ktype), sizeof(_vtype), (_size)};      \
    __attribute__((constructor)) static void _name##__register(void) { replay_register(&_name##__map); }          \
    static void *_name##__lookup(const void *key) { return replay_lookup(&_name##__map, key); }                   \
    static int _name##__update(const void *key, const void *value) { return replay_update(&_name##__map, key, value, 0); } \
    static int _name##__insert(const void *key, const void *value) { return replay_update(&_name##__map, key, value, 1); } \
    static int _name##__delete(const void *key) { return replay_delete(&_name##__map, key); }                     \
    static long _name##__call(void *ctx, u32 index) { return replay_tail_call(ctx, &_name##__map, index); }       \
    static int _name##__perf_submit(void *ctx, void *data, u32 size) { return replay_output(&_name##__map, data, size); } \
    static long _name##__ringbuf_output(void *data, u64 size, u64 flags) { return replay_output(&_name##__map, data, size); } \
    __attribute__((unused)) static struct replay_ops _name = {_name##__lookup, _name##__update, _name##__insert,   \
                                                              _name##__delete, _name##__call, _name##__perf_submit, \
                                                              _name##__ringbuf_output}

#define BPF_F_TABLE(_type, _ktype, _vtype, _name, _size, _flags) REPLAY_MAP(REPLAY_BY_TYPE, _type, _ktype, _vtype, _name, _size)
#define BPF_TABLE(_type, _ktype, _vtype, _name, _size) REPLAY_MAP(REPLAY_BY_TYPE, _type, _ktype, _vtype, _name, _size)
#define BPF_HASH(_name, _ktype, _vtype, _size) REPLAY_MAP(REPLAY_HASH, 0, _ktype, _vtype, _name, _size)
#define BPF_ARRAY(_name, _vtype, _size) REPLAY_MAP(REPLAY_ARRAY, 0, u32, _vtype, _name, _size)
#define BPF_PERCPU_ARRAY(_name, _vtype, _size) REPLAY_MAP(REPLAY_ARRAY, 0, u32, _vtype, _name, _size)  // one CPU
#define BPF_PROG_ARRAY(_name, _size) REPLAY_MAP(REPLAY_PROG_ARRAY, 0, u32, u32, _name, _size)
#define BPF_PERF_OUTPUT(_name) REPLAY_MAP(REPLAY_OUTPUT, 0, u32, u32, _name, 0)
#define BPF_RINGBUF_OUTPUT(_name, _pages) REPLAY_MAP(REPLAY_OUTPUT, 0, u32, u32, _name, 0)

#define RAW_TRACEPOINT_PROBE(_event) int raw_tracepoint__##_event(struct bpf_raw_tracepoint_args *ctx)
// A syscall exit tracepoint's arguments as BCC generates them (profile.c reads ``ret`` only)
struct replay_syscall_exit_args {
    __u64 common;
    long syscall_nr;
    long ret;
};
#define TRACEPOINT_PROBE(_category, _event) \
    int tracepoint__##_category##__##_event(struct replay_syscall_exit_args *args)
#define PT_REGS_PARM2(x) ((x)->si)
#define PT_REGS_PARM3(x) ((x)->dx)
#define PT_REGS_PARM5(x) ((x)->r8)
#define PT_REGS_PARM6(x) ((x)->r9)

// The process's memory: regions of a snapshot, or a reader of a live process (the snapshot's maker).
struct replay_region {
    u64 start;
    u64 size;
    u8 *data;
};

#define REPLAY_MAX_REGIONS 4096
#define REPLAY_MAX_LOG 65536
static struct replay_region replay_regions[REPLAY_MAX_REGIONS];
static u32 replay_region_count;
static int (*replay_reader)(u64 address, u32 size, void *into);
static u64 replay_log_addresses[REPLAY_MAX_LOG];
static u32 replay_log_sizes[REPLAY_MAX_LOG];
static u32 replay_log_count;

static int replay_read_regions(void *into, u32 size, u64 address)
{
    u8 *to = into;
    while (size) {
        u32 i = 0;
        for (; i < replay_region_count; i++) {
            struct replay_region *r = &replay_regions[i];
            if (address >= r->start && address - r->start < r->size)
                break;
        }
        if (i == replay_region_count)
            return -1;
        struct replay_region *r = &replay_regions[i];
        u64 held = r->size - (address - r->start);
        u32 part = held < size ? (u32)held : size;
        memcpy(to, r->data + (address - r->start), part);
        to += part;
        address += part;
        size -= part;
    }
    return 0;
}

static long bpf_probe_read_user(void *into, u32 size, const void *from)
{
    u64 address = (u64)from;
    if (replay_log_count < REPLAY_MAX_LOG) {
        replay_log_addresses[replay_log_count] = address;
        replay_log_sizes[replay_log_count++] = size;
    }
    int failed = replay_reader ? replay_reader(address, size, into) : replay_read_regions(into, size, address);
    if (failed) {
        memset(into, 0, size);
        return -REPLAY_EFAULT;
    }
    return 0;
}

// Kernel memory here is the replay's own (maps, the task stand-in): a plain copy.
static long bpf_probe_read_kernel(void *into, u32 size, const void *from)
{
    if ((u64)from < 4096) {
        memset(into, 0, size);
        return -REPLAY_EFAULT;
    }
    memcpy(into, from, size);
    return 0;
}

static long bpf_probe_read_kernel_str(void *into, u32 size, const void *from)
{
    if (!size || (u64)from < 4096)
        return -REPLAY_EFAULT;
    strncpy(into, from, size - 1);
    ((char *)into)[size - 1] = 0;
    return (long)strlen(into) + 1;
}

static u64 bpf_get_current_pid_tgid(void) { return replay_pid_tgid; }
static u64 bpf_ktime_get_ns(void) { return replay_now_ns; }
static u64 bpf_get_current_task(void) { return (u64)replay_task; }
static struct task_struct *bpf_get_current_task_btf(void) { return (struct task_struct *)replay_task; }
static u32 bpf_get_prandom_u32(void) { return 4; }
static u64 bpf_get_attach_cookie(void *ctx) { return 0; }
static long bpf_get_stack(void *ctx, void *into, u32 size, u64 flags) { return 0; }  // no kernel-walked stacks
static struct pt_regs *replay_task_regs;
static long bpf_task_pt_regs(struct task_struct *task) { return (long)replay_task_regs; }

static long bpf_get_current_comm(void *into, u32 size)
{
    memset(into, 0, size);
    memcpy(into, replay_comm, size < sizeof(replay_comm) ? size : sizeof(replay_comm));
    return 0;
}
