// Process images: the executable file mappings of each process exec'd during the session, recorded by the
// kernel as they are made (appended after stackcopy.c with -DCFI_UNWIND; profile.c's exec, exit and mmap
// hooks and forks.c call in here). User space builds a process's unwind tables from its image, and walks its
// stack copies with them (frontend/unwind/images.py), without reading /proc/PID/maps: a compiler's assembler
// lives for 50 ms and was gone, in 2 of 3 cases on a loaded machine, before user space could read its maps
// after its first sample. Nothing goes to user space until a process is sampled: an exec or a mapping costs a
// few reads of kernel memory and a map update here, and the image of a process never sampled goes at its exit.
//
// An image holds the path the process exec'd, the executable's text (mm->start_code..end_code), the dynamic linker's load address (AT_BASE
// of the auxiliary vector: the linker maps itself before the process runs, with no mmap call this sees) and
// each file mapping made with PROT_EXEC by mmap (the libraries ld.so maps, dlopen), with each file's
// identity: device, inode, size and mtime, the key user space knows files by (a stat of the file). Up to
// IMAGE_MAPS mappings; the ones that do not fit are counted (``dropped``), and an mprotect that makes memory
// executable marks the image incomplete (its file is not known here): user space then reads /proc if it can.
//
// A sampled process's image is kept after its exit (its copies are walked later) until user space is done
// with it (bpf/images.py forgets it); a forked process starts with a copy of its parent's.
//
// The exit hook also copies the exiting thread's stack (stackcopy.c's ring, the same copy for every sample
// taken while it exits): the kernel's tracepoint comes before the process's memory is torn down (Linux 6.16+:
// sched_process_exit has group_dead), while samples of exit_mmap's work come after, when the user stack can
// no longer be read.

#ifndef IMAGE_MAPS
#define IMAGE_MAPS 24
#endif
#define IMAGE_MAPS_POW2 32  // a power of two above IMAGE_MAPS, for the verifier's bound on a slot
#define IMAGE_SEARCH_STEPS 6  // log2(IMAGE_MAPS_POW2) + 1
#ifndef IMAGES_SIZE
#define IMAGES_SIZE 8192
#endif
#define AUXV_PAIRS 28  // mm_struct.saved_auxv holds AT_VECTOR_SIZE (56) words
#define AT_BASE 7
#define EXIT_COPIES 1024
#ifndef COPIES_PER_SECOND
#define COPIES_PER_SECOND 1000  // a process's stack copies per second, at most (stackcopy.c): above 999 Hz, so a
// single-threaded process whose table is late keeps every stack (at 200 a Python process's copies stopped in the
// first second, before copy_python was in place: 177 of 200 native only, tests/unwind/test_copied_python.py)
#endif
#define IMAGE_PATH 256
#ifndef IMAGE_FILES
#define IMAGE_FILES 8192  // MAX_GENERATION_FILES
#endif

// Indices into image_offsets (keep in sync with IMAGE_FIELDS in images.py); 0: not known, nothing recorded
enum image_offset {
    IO_TASK_MM = 0,
    IO_TASK_FILES,
    IO_TASK_FS,
    IO_TASK_NSPROXY,
    IO_BINPRM_FILE,
    IO_FILE_INODE,
    IO_INODE_INO,
    IO_INODE_SB,
    IO_INODE_SIZE,
    IO_INODE_MTIME_SEC,
    IO_INODE_MTIME_NSEC,
    IO_SB_DEV,
    IO_MM_START_CODE,
    IO_MM_END_CODE,
    IO_MM_SAVED_AUXV,
    IO_FILES_FDT,
    IO_FDT_MAX_FDS,
    IO_FDT_FD,
    IO_FS_ROOT_DENTRY,
    IO_DENTRY_INODE,
    IO_NSPROXY_MNT_NS,
    IO_MNT_NS_INUM,
    NR_IMAGE_OFFSETS,
};

// Image flags
#define IMAGE_INCOMPLETE 1  // an mprotect made memory executable: a mapping may be missing
#define IMAGE_WALKED 2      // a sample was walked from it (the process was sampled)

struct image_file {
    u64 ino;
    u64 size;
    u64 mtime_ns;
    u32 dev;  // the kernel's dev_t (MAJOR << 20 | MINOR), not stat's encoding
    u32 pad;
};

struct image_map {
    u64 start;
    u64 end;
    u64 pgoff;  // file offset of start
    u64 epoch;  // the process's epoch once it was made (profile.c)
    struct image_file file;
};

struct image {
    u64 exec_epoch;  // the exec_epochs value it belongs to (stackcopy.c's copies carry theirs)
    u64 start_code;  // the executable's text (mm_struct)
    u64 end_code;
    u64 interp_base;  // AT_BASE: the dynamic linker's load bias, 0 for a static program
    struct image_file exe;
    u64 root_ino;  // the process's root directory (a chroot or container names other files)
    u32 root_dev;
    u32 mnt_ns;
    u32 count;
    u32 dropped;  // mappings that did not fit
    u32 flags;    // IMAGE_*
    u32 pad;
    struct image_map maps[IMAGE_MAPS];
    char path[IMAGE_PATH];  // the exec'd path as passed to execve (may be relative)
};

// A file whose rows are in unwind_rows (unwindmaps.py), by identity: how a mapping of it is walked. Its
// executable segment places the executable's text (start_code is its vaddr relocated) and the linker's.
struct unwind_file {
    u32 row_start;
    u32 row_count;
    u32 file_id;
    u32 flags;       // MAPPING_* (unwind.c)
    s64 vaddr_adj;   // of its executable segment: ELF virtual address = file offset + vaddr_adj
    u64 x_vaddr;     // the segment's virtual address and size in the file
    u64 x_size;
    u64 used;        // when a walk last went through it (bpf_ktime_get_ns: user space's monotonic clock)
};

struct exit_copy {
    u64 task;  // the task_struct, with the thread id: a reused id is another thread
    u32 copy;  // the copy's id (stackcopy.c)
    u32 pad;
};

TABLE_BYTES(image);
BPF_ARRAY(image_offsets, u32, NR_IMAGE_OFFSETS);
BPF_F_TABLE("hash", u32, struct image_bytes, images, IMAGES_SIZE, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(image_scratch, struct image_bytes, 1);
BPF_TABLE("lru_hash", u32, struct exit_copy, exit_copies, EXIT_COPIES);  // tid -> its stack at exit
BPF_PERCPU_ARRAY(image_counters, u64, 5);  // IMAGE_COUNTERS in images.py
struct copy_quota {
    u64 since;  // the second its count is of (bpf_ktime_get_ns)
    u64 count;
};

BPF_TABLE("lru_hash", u32, struct copy_quota, copy_quotas, EXIT_COPIES);  // pid -> copies this second
BPF_HASH(unwind_files, struct image_file, struct unwind_file, IMAGE_FILES);  // identity -> rows (unwindmaps.py)
BPF_HASH(unwind_interps, struct image_file, struct image_file, IMAGE_FILES);  // executable -> its PT_INTERP file

enum image_counter {
    IMAGES_FULL = 0,   // an exec whose image did not fit in the map
    IMAGE_MAPS_DROPPED,
    EXIT_COPIES_TAKEN,
    IMAGES_UNKNOWN_FIELDS,  // an exec seen before the offsets were set (or without BTF): no image
    COPIES_OVER_QUOTA,      // copies refused: the process had COPIES_PER_SECOND this second
};

static inline void image_count(u32 counter)
{
    u64 *slot = image_counters.lookup(&counter);
    if (slot)
        (*slot)++;
}

static inline u32 image_off(u32 index)
{
    u32 *known = image_offsets.lookup(&index);
    return known ? *known : 0;
}

static inline u64 read_ptr(u64 base, u32 index)
{
    u64 value = 0;
    u32 offset = image_off(index);
    if (base && offset)
        bpf_probe_read_kernel(&value, sizeof(value), (void *)(base + offset));
    return value;
}

static inline int file_identity(u64 file, struct image_file *id)
{
    u64 inode = read_ptr(file, IO_FILE_INODE);
    if (!inode)
        return 0;
    u64 sb = read_ptr(inode, IO_INODE_SB);
    s64 sec = (s64)read_ptr(inode, IO_INODE_MTIME_SEC);
    u32 nsec = 0, dev = 0;
    bpf_probe_read_kernel(&nsec, sizeof(nsec), (void *)(inode + image_off(IO_INODE_MTIME_NSEC)));
    if (sb)
        bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(sb + image_off(IO_SB_DEV)));
    id->ino = read_ptr(inode, IO_INODE_INO);
    id->size = read_ptr(inode, IO_INODE_SIZE);
    id->mtime_ns = sec * 1000000000ULL + nsec;
    id->dev = dev;
    id->pad = 0;
    return id->ino != 0;
}

// The exec'd process's image, replacing any before (profile.c's sched_process_exec, after its epoch is set).
static inline void image_exec(u32 tgid, u64 bprm, u64 exec_epoch)
{
    u32 zero = 0;
    if (!image_off(IO_TASK_MM)) {
        image_count(IMAGES_UNKNOWN_FIELDS);
        return;
    }
    struct image *img = (struct image *)image_scratch.lookup(&zero);
    if (!img)
        return;
    u64 task = bpf_get_current_task();
    u64 mm = read_ptr(task, IO_TASK_MM);
    img->exec_epoch = exec_epoch;
    img->start_code = read_ptr(mm, IO_MM_START_CODE);
    img->end_code = read_ptr(mm, IO_MM_END_CODE);
    img->interp_base = 0;
    u64 auxv = mm ? mm + image_off(IO_MM_SAVED_AUXV) : 0;
#pragma clang loop unroll(disable)
    for (int i = 0; i < AUXV_PAIRS && auxv; i++) {
        u64 pair[2] = {};
        if (bpf_probe_read_kernel(pair, sizeof(pair), (void *)(auxv + i * sizeof(pair))) || !pair[0])
            break;
        if (pair[0] == AT_BASE) {
            img->interp_base = pair[1];
            break;
        }
    }
    if (!file_identity(read_ptr(bprm, IO_BINPRM_FILE), &img->exe))
        img->exe.ino = 0;
    u64 root = read_ptr(read_ptr(task, IO_TASK_FS), IO_FS_ROOT_DENTRY);
    u64 root_inode = read_ptr(root, IO_DENTRY_INODE);
    img->root_ino = read_ptr(root_inode, IO_INODE_INO);
    u64 root_sb = read_ptr(root_inode, IO_INODE_SB);
    u32 dev = 0, inum = 0;
    if (root_sb)
        bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(root_sb + image_off(IO_SB_DEV)));
    img->root_dev = dev;
    u64 mnt_ns = read_ptr(read_ptr(task, IO_TASK_NSPROXY), IO_NSPROXY_MNT_NS);
    if (mnt_ns)
        bpf_probe_read_kernel(&inum, sizeof(inum), (void *)(mnt_ns + image_off(IO_MNT_NS_INUM)));
    img->mnt_ns = inum;
    img->count = 0;
    img->dropped = 0;
    img->flags = 0;
    img->pad = 0;
    const char *filename = NULL;
    img->path[0] = 0;
    bpf_probe_read_kernel(&filename, sizeof(filename), (void *)(bprm + kernel_offset(BINPRM_FILENAME)));
    if (filename)
        bpf_probe_read_kernel_str(img->path, sizeof(img->path), filename);
    if (images.update(&tgid, (struct image_bytes *)img))
        image_count(IMAGES_FULL);
}

// A file mapping made executable by mmap(fd) at [start, start + len) (profile.c's sys_exit_mmap): added to the
// process's image (if it has one), kept sorted by start, replacing a mapping it overlaps.
static inline void image_mmap(u32 tgid, u64 start, u64 len, u64 pgoff, u32 fd, u64 epoch)
{
    struct image *img = (struct image *)images.lookup(&tgid);
    if (!img)
        return;
    u64 fdt = read_ptr(read_ptr(bpf_get_current_task(), IO_TASK_FILES), IO_FILES_FDT);
    u32 max_fds = 0;
    if (fdt)
        bpf_probe_read_kernel(&max_fds, sizeof(max_fds), (void *)(fdt + image_off(IO_FDT_MAX_FDS)));
    if (fd >= max_fds)
        return;
    u64 files = read_ptr(fdt, IO_FDT_FD);
    u64 file = 0;
    if (files)
        bpf_probe_read_kernel(&file, sizeof(file), (void *)(files + (u64)fd * sizeof(u64)));
    struct image_map map = {.start = start, .end = start + ((len + 4095) & ~4095ULL), .pgoff = pgoff, .epoch = epoch};
    if (!file_identity(file, &map.file))
        return;
    u32 count = img->count;
    if (count > IMAGE_MAPS)
        return;
    // One pass from the end: the mapping it overlaps goes (MAP_FIXED over it), those after it move up one.
    u32 at = count;  // where it goes
#pragma clang loop unroll(disable)
    for (u32 i = IMAGE_MAPS; i > 0; i--) {
        u32 j = i - 1;
        if (j >= count)
            continue;
        struct image_map *m = &img->maps[j & (IMAGE_MAPS_POW2 - 1)];
        if (j >= IMAGE_MAPS)
            return;
        if (m->start < map.end && map.start < m->end) {  // replaced in place
            *m = map;
            return;
        }
        if (m->start < map.start)
            break;
        if (j + 1 >= IMAGE_MAPS) {  // the last one falls off
            img->dropped++;
            image_count(IMAGE_MAPS_DROPPED);
        } else {
            img->maps[(j + 1) & (IMAGE_MAPS_POW2 - 1)] = *m;
        }
        at = j;
    }
    if (at >= IMAGE_MAPS) {
        img->dropped++;
        image_count(IMAGE_MAPS_DROPPED);
        return;
    }
    img->maps[at & (IMAGE_MAPS_POW2 - 1)] = map;
    if (count < IMAGE_MAPS)
        img->count = count + 1;
}

// An mprotect made memory executable: which file it is, if any, is not known here.
static inline void image_mprotect(u32 tgid)
{
    struct image *img = (struct image *)images.lookup(&tgid);
    if (img)
        img->flags |= IMAGE_INCOMPLETE;
}

// A new process (sched_process_fork): it runs its parent's image until it execs, and has its parent's epochs
// (the same mappings: its copies are walked with the tables of the image it was given).
static inline void image_fork(u32 parent, u32 child)
{
    struct image *img = (struct image *)images.lookup(&parent);
    if (!img)
        return;
    images.update(&child, (struct image_bytes *)img);
    u64 *epoch = epochs.lookup(&parent);
    if (epoch)
        epochs.update(&child, epoch);
    u64 *exec_epoch = exec_epochs.lookup(&parent);
    if (exec_epoch)
        exec_epochs.update(&child, exec_epoch);
}

// Whether the process was sampled since its exec: its stack was copied (stackcopy.c), its table loaded, or
// a sample walked from its image.
static inline int was_sampled(u32 pid)
{
    struct image *img = (struct image *)images.lookup(&pid);
    return copy_wakes.lookup(&pid) || unwind_procs.lookup(&pid) || (img && (img->flags & IMAGE_WALKED));
}

// A process exits (profile.c's sched_process_exit, its main thread): a sampled one has its stack copied once,
// for the samples taken while it exits (see the top of this file; COPY_SHARED: several samples name the copy).
// One whose stack was copied keeps its image for user space, whose copies it walks (it forgets it at the
// exit event); another's goes.
static inline void image_exit(u32 tgid, u32 tid, int sampled)
{
    u64 ip, sp, bp;
    u32 id = 0;
    struct key_t key = {.pid = tgid, .tid = tid};
    if (sampled && tid == tgid && task_user_registers(&ip, &sp, &bp))
        id = copy_user_stack(&key, ip, sp, bp, COPY_SHARED);
    if (id) {
        struct exit_copy copy = {.task = bpf_get_current_task(), .copy = id};
        exit_copies.update(&tid, &copy);
        image_count(EXIT_COPIES_TAKEN);
    } else if (tid == tgid && !copy_wakes.lookup(&tgid)) {  // no copy of it is to be walked: user space won't ask
        images.delete(&tgid);
    }
}

// The copy of the stack a thread had when it began to exit, for a sample taken since (0: none).
static inline u32 exit_copy_of(u32 tid)
{
    struct exit_copy *copy = exit_copies.lookup(&tid);
    if (!copy || copy->task != bpf_get_current_task())
        return 0;
    return copy->copy;
}

// Whether the process's image can be walked: complete (every executable mapping in it). It is marked walked.
static inline int walkable_image(u32 pid)
{
    struct image *img = (struct image *)images.lookup(&pid);
    if (!img || img->dropped || (img->flags & IMAGE_INCOMPLETE) || !img->exe.ino)
        return 0;
    if (!(img->flags & IMAGE_WALKED))
        img->flags |= IMAGE_WALKED;
    return 1;
}

// The mapping that holds ``pc`` in the process's image, as a table's entry would say (the state's
// image_map): its file's rows by identity, MAPPING_COPY when user space does not know the file yet (the copy
// makes it), 0 when no file of the image holds ``pc`` (anonymous code, [vdso]: frame pointers). Which of the
// image's files holds it is found first and then forgotten (forget(), unwind.c): one path on from there, so the
// verifier does not follow every way through the search apart (it did: 198k instructions for unwind_step).
#define IMAGE_EXE IMAGE_MAPS
#define IMAGE_NONE (IMAGE_MAPS + 1)
static inline struct unwind_mapping *image_mapping(struct unwind_state *st, u64 pc)
{
    u32 pid = st->key.pid;
    struct image *img = (struct image *)images.lookup(&pid);
    if (!img)
        return 0;
    struct unwind_mapping *m = &st->image_map;
    u32 slot = IMAGE_NONE;
    if (pc >= img->start_code && pc < img->end_code) {
        slot = IMAGE_EXE;
    } else {  // a binary search of the mappings, sorted by start (image_mmap)
        u32 lo = 0, hi = img->count;
        if (hi > IMAGE_MAPS)
            hi = IMAGE_MAPS;
        for (int i = 0; i < IMAGE_SEARCH_STEPS; i++) {
            if (lo >= hi)
                break;
            u32 mid = forget(st, (lo + hi) / 2);
            struct image_map *m = &img->maps[mid & (IMAGE_MAPS_POW2 - 1)];
            if (mid >= IMAGE_MAPS)
                break;
            if (pc < m->start) {
                hi = mid;
            } else if (pc >= m->end) {
                lo = mid + 1;
            } else {
                slot = mid;
                break;
            }
        }
    }
    slot = forget(st, slot);
    // The file's identity copied to the stack and its placement as scalars: one lookup, one path on.
    struct image_file key = {};
    u64 base = 0;  // bias = base - (the file's vaddr_adj for an mmap'd one, its x_vaddr for the executable)
    if (slot < IMAGE_MAPS) {  // an mmap'd file
        struct image_map *map = &img->maps[slot & (IMAGE_MAPS_POW2 - 1)];
        key = map->file;
        base = map->start - map->pgoff;
    } else if (slot == IMAGE_EXE) {
        key = img->exe;
        base = img->start_code;
    } else {  // maybe the dynamic linker: placed by its identity, once user space found it for this program
        if (!img->interp_base)
            return 0;
        struct image_file *interp = unwind_interps.lookup(&img->exe);
        if (!interp)
            goto unknown;
        key = *interp;
        base = img->interp_base;
    }
    struct unwind_file *file = unwind_files.lookup(&key);
    if (!file)
        goto unknown;
    u64 bias = base - (slot < IMAGE_MAPS ? file->vaddr_adj : slot == IMAGE_EXE ? file->x_vaddr : 0);
    if (slot > IMAGE_EXE && (pc < base + file->x_vaddr || pc >= base + file->x_vaddr + file->x_size))
        return 0;  // in none of its files: anonymous code, [vdso]
    file->used = bpf_ktime_get_ns();
    m->bias = bias;
    m->offset_adj = -bias - file->vaddr_adj;
    m->row_start = file->row_start;
    m->row_count = file->row_count;
    m->file_id = file->file_id;
    m->flags = file->flags;
    return m;
unknown:  // a file user space has not placed yet: the copy does
    m->flags = MAPPING_COPY;
    return m;
}

// Whether the process may have one more copy of its stack this second (stackcopy.c): a process whose table
// does not come, or a file of which finds no room in the rows, is copied at most COPIES_PER_SECOND times a
// second, its other samples walked as far as the walker can (counted), not copied at every sample.
static inline int copy_allowed(u32 pid)
{
    u64 now = bpf_ktime_get_ns();
    struct copy_quota *quota = copy_quotas.lookup(&pid);
    if (!quota || now - quota->since >= 1000000000ULL) {
        struct copy_quota fresh = {.since = now, .count = 1};
        copy_quotas.update(&pid, &fresh);
        return 1;
    }
    if (quota->count >= COPIES_PER_SECOND) {
        image_count(COPIES_OVER_QUOTA);
        return 0;
    }
    quota->count++;
    return 1;
}
