// The replay's API for tests/replay/replay.py, appended after the programs (it names their maps and
// kernel_offsets.h's TASK_FSBASE). Every function returns 0 (or a count) on success, -1 otherwise.

#define REPLAY_FSBASE_AT 64  // where the task stand-in holds the thread's fs base

static struct replay_map *replay_find(const char *name)
{
    for (u32 i = 0; i < replay_map_count; i++) {
        if (!strcmp(replay_maps[i]->name, name))
            return replay_open(replay_maps[i]) ? 0 : replay_maps[i];
    }
    return 0;
}

int replay_map_sizes(const char *name, u32 *key_size, u32 *value_size, u32 *max_entries)
{
    struct replay_map *map = replay_find(name);
    if (!map)
        return -1;
    *key_size = map->key_size;
    *value_size = map->value_size;
    *max_entries = map->max_entries;
    return 0;
}

int replay_map_update(const char *name, const void *key, const void *value)
{
    struct replay_map *map = replay_find(name);
    return map ? replay_update(map, key, value, 0) : -1;
}

int replay_map_lookup(const char *name, const void *key, void *value)
{
    struct replay_map *map = replay_find(name);
    void *found = map ? replay_lookup(map, key) : 0;
    if (!found)
        return -1;
    memcpy(value, found, map->value_size);
    return 0;
}

// The entries of a hash map (keys, values: room for `room` of each); their number.
int replay_map_entries(const char *name, void *keys, void *values, u32 room)
{
    struct replay_map *map = replay_find(name);
    if (!map || !map->used)
        return -1;
    u32 n = 0;
    for (u32 i = 0; i < map->slots && n < room; i++) {
        if (!map->used[i])
            continue;
        memcpy((u8 *)keys + (u64)n * map->key_size, map->keys + (u64)i * map->key_size, map->key_size);
        memcpy((u8 *)values + (u64)n * map->value_size, map->values + (u64)i * map->value_size, map->value_size);
        n++;
    }
    return (int)n;
}

// The values of an array map's first `count` entries, in place (the stack store's arena is read from it).
int replay_array_read(const char *name, u32 first, u32 count, void *into)
{
    struct replay_map *map = replay_find(name);
    if (!map || map->kind != REPLAY_ARRAY || (u64)first + count > map->max_entries)
        return -1;
    memcpy(into, map->values + (u64)first * map->value_size, (u64)count * map->value_size);
    return 0;
}

int replay_prog_set(const char *name, u32 index, int (*program)(void *))
{
    struct replay_map *map = replay_find(name);
    if (!map || map->kind != REPLAY_PROG_ARRAY || index >= map->max_entries)
        return -1;
    map->progs[index] = program;
    return 0;
}

// What a perf or ring buffer got since the last take: records of (u32 size, bytes); returns the bytes
// copied (at most `room`, whole records), and forgets them.
long replay_output_take(const char *name, void *into, u64 room)
{
    struct replay_map *map = replay_find(name);
    if (!map || map->kind != REPLAY_OUTPUT)
        return -1;
    u64 bytes = map->output_bytes < room ? map->output_bytes : 0;
    if (bytes)
        memcpy(into, map->output, bytes);
    if (bytes || !map->output_bytes)
        map->output_bytes = 0;
    return bytes ? (long)bytes : (map->output_bytes ? -2 : 0);  // -2: not enough room
}

int replay_array_log(const char *name, int on)
{
    struct replay_map *map = replay_find(name);
    if (!map || map->kind != REPLAY_ARRAY)
        return -1;
    map->logging = on;
    map->lookups_count = 0;
    return 0;
}

int replay_array_logged(const char *name, u32 *into, u32 room)
{
    struct replay_map *map = replay_find(name);
    if (!map || map->kind != REPLAY_ARRAY)
        return -1;
    u32 n = map->lookups_count < room ? map->lookups_count : room;
    memcpy(into, map->lookups, (u64)n * sizeof(u32));
    return (int)n;
}

int replay_add_region(u64 start, u64 size, const void *data)
{
    if (replay_region_count >= REPLAY_MAX_REGIONS)
        return -1;
    u8 *copy = calloc(size ? size : 1, 1);
    if (!copy)
        return -1;
    memcpy(copy, data, size);
    replay_regions[replay_region_count++] = (struct replay_region){start, size, copy};
    return 0;
}

void replay_clear_regions(void)
{
    for (u32 i = 0; i < replay_region_count; i++)
        free(replay_regions[i].data);
    replay_region_count = 0;
}

void replay_set_reader(int (*reader)(u64 address, u32 size, void *into))
{
    replay_reader = reader;
}

// The reads of process memory since the last call: (address, size) pairs; their number.
int replay_reads(u64 *addresses, u32 *sizes, u32 room)
{
    u32 n = replay_log_count < room ? replay_log_count : room;
    memcpy(addresses, replay_log_addresses, (u64)n * sizeof(u64));
    memcpy(sizes, replay_log_sizes, (u64)n * sizeof(u32));
    replay_log_count = 0;
    return (int)n;
}

// The sampled thread: its ids, fs base (pthread_self()), name, and the clock.
int replay_set_current(u32 pid, u32 tid, u64 fs_base, const char *comm, u64 now_ns)
{
    replay_pid_tgid = (u64)pid << 32 | tid;
    replay_now_ns = now_ns;
    memset(replay_comm, 0, sizeof(replay_comm));
    strncpy(replay_comm, comm, sizeof(replay_comm) - 1);
    memcpy(replay_task + REPLAY_FSBASE_AT, &fs_base, sizeof(fs_base));
    u32 index = TASK_FSBASE, at = REPLAY_FSBASE_AT;
    return kernel_offsets.update(&index, &at);
}

// Runs `program` on a perf event context holding the user registers (ip, sp, bp) of a sample taken in user
// mode; returns the tail calls it made.
int replay_sample(int (*program)(void *), u64 ip, u64 sp, u64 bp)
{
    static struct bpf_perf_event_data ctx;
    static jmp_buf top;
    memset(&ctx, 0, sizeof(ctx));
    ctx.regs.ip = ip;
    ctx.regs.sp = sp;
    ctx.regs.bp = bp;
    ctx.regs.cs = 0x33;  // user mode
    replay_task_regs = &ctx.regs;
    replay_top = &top;
    replay_tail_calls = 0;
    if (!setjmp(top))
        program(&ctx);
    return (int)replay_tail_calls;
}

// Every map empty again (programs stay in their slots), as a newly loaded program's.
void replay_reset(void)
{
    for (u32 i = 0; i < replay_map_count; i++) {
        struct replay_map *map = replay_maps[i];
        if (replay_open(map))
            continue;
        if (map->kind == REPLAY_ARRAY)
            memset(map->values, 0, (u64)map->max_entries * map->value_size);
        if (map->used)
            memset(map->used, 0, map->slots);
        map->count = 0;
        map->output_bytes = 0;
        map->lookups_count = 0;
    }
    replay_log_count = 0;
}
