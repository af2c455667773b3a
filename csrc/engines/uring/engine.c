/*
 * io_uring engine: engine_args, open and close, and the caller's side of
 * read_files and read_ranges: which phases run on the rings, in which
 * order, and the repair of what the fast path could not finish. The design
 * is described in uring_internal.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/engine_args.h"
#include "engines/uring/uring_internal.h"

#define MAX_RINGS 64
#define COOP_DEFAULT 2 /* index into fr_uring_setup_choices: COOP_TASKRUN */
#define WINDOW 256

/* A probe's ring set up and torn down on a thread of its own, joined before
 * the answer is returned, never on the caller's: a thread that sets up a
 * ring is on that ring's list of tasks, and the kernel's teardown of it,
 * asynchronous and tens of ms after io_uring_queue_exit (Linux 6.18: after
 * the ring's references drain), queues work to every task still on the
 * list with TWA_SIGNAL. That ends whatever blocking system call the caller
 * is in at that moment early, as a signal would: a write into a full pipe
 * returns short, and Python's unbuffered stdout (PYTHONUNBUFFERED=1, -u)
 * drops the rest of a print: a child's 86 KB JSON line cut at 64 KiB (the
 * pipe's size) + its "\n", exit status 0, after a Reader probed io_uring
 * on the child's main thread. An exited thread is on no ring's list. */
typedef struct off_thread_job {
    int (*fn)(struct off_thread_job *);
    char *why;
    size_t why_len;
    int rc;
} off_thread_job;

static void *off_thread_main(void *arg)
{
    off_thread_job *j = arg;
    j->rc = j->fn(j);
    return NULL;
}

/* Runs j->fn(j) on a fresh thread, joined (here, as before, if no thread
 * can be made); returns its result. */
static int run_off_thread(off_thread_job *j)
{
    pthread_t t;
    if (pthread_create(&t, NULL, off_thread_main, j) != 0)
        return j->fn(j);
    pthread_join(t, NULL);
    return j->rc;
}

static int probe_here(off_thread_job *j)
{
    char *why = j->why;
    size_t why_len = j->why_len;
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc < 0) {
        fr_set_err(why, why_len, "io_uring_queue_init failed: %s%s", strerror(-rc),
                   rc == -EPERM || rc == -ENOSYS
                       ? " (io_uring disabled by the kernel, seccomp or a container policy)"
                       : "");
        return rc;
    }
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    int missing = 0;
    if (probe) {
        if (!io_uring_opcode_supported(probe, IORING_OP_OPENAT) ||
            !io_uring_opcode_supported(probe, IORING_OP_READ) ||
            !io_uring_opcode_supported(probe, IORING_OP_CLOSE))
            missing = 1;
        io_uring_free_probe(probe);
    }
    io_uring_queue_exit(&ring);
    if (missing) {
        fr_set_err(why, why_len, "the kernel's io_uring lacks openat/read/close (needs Linux >= 5.6)");
        return -ENOTSUP;
    }
    return 0;
}

static int uring_probe(char *why, size_t why_len)
{
    off_thread_job j = {.fn = probe_here, .why = why, .why_len = why_len};
    return run_off_thread(&j);
}

static void uring_close(void *state)
{
    uring *u = state;
    if (!u)
        return;
    if (u->pool) {
        fr_threadpool_run_helpers(u->pool, PH_TEARDOWN, 0);
        fr_threadpool_stop(u->pool);
    }
    if (u->caller_ring && u->rings) {
        fr_uring_ring_files_free(&u->rings[0]);
        fr_uring_ring_teardown(&u->rings[0]);
    }
    fr_image_cache_close(&u->image);
    fr_uring_files_free(u);
    free(u->rings);
    free(u->range_res);
    free(u->sizes);
    free(u->open_res);
    free(u->read_res);
    free(u->fds);
    free(u->live);
    free(u->live_slot);
    free(u->stuck);
    free(u->leftover);
    free(u->placed);
    free(u);
}

/* engine_args: "taskrun=defer|single|coop|plain" (the first setup choice
 * tried: SINGLE_ISSUER + DEFER_TASKRUN, SINGLE_ISSUER + COOP_TASKRUN,
 * COOP_TASKRUN, none; default coop), "open=staged|linked" (with size hints:
 * read once the open is done, or openat -> read -> close linked; see
 * ring_chained), "unsized=pipelined|direct|fds|windows" (sizes unknown,
 * batch not dense: one phase per window, the default, through direct
 * descriptors on machines of DIRECT_MIN_CPUS or more, else ordinary ones;
 * always direct (ring_direct; ordinary where the rings have no direct
 * ones); always ordinary (ring_pipelined); or the two-phase windows of
 * dense batches; for A/B measurements in one process) and "setup_extra=<n>" (more
 * IORING_SETUP_* bits, tried first and dropped if refused: for experiments
 * and for testing the fallback).
 *
 * For tests only, fault injection (fault_plan): "fault_mode=eio|eintr|eagain|
 * short|stall|ecanceled|ebusy" turns it on; "fault_op=open|read|submit"
 * (default read: file and range reads), "fault_path=<substring>" (default:
 * every path; a range's path is its image's; submits have no path),
 * "fault_count=<n>" (default 1; -1: every matching completion; counted per
 * context, over all its rings) and "fault_stall_ms=<ms>" (default 200)
 * choose where. eio/eintr/eagain/ecanceled replace the completion's result
 * with that -errno, short halves a read's byte count, stall holds the
 * completion back in the ring's thread; with fault_op=submit, eio/eintr/
 * eagain/ebusy are what io_uring_enter returns instead of submitting (a
 * count of -1 would refuse every submit: only 1.. is taken). */
/* enum fault_mode's names, for messages. */
static const char *const fault_mode_names[] = {"off",   "eio",       "eintr", "eagain",
                                               "short", "stall",     "ecanceled", "ebusy"};

static int parse_args(uring *u, const char *args, char *err, size_t err_len)
{
    /* Defaults first: each output is left alone when its key is absent.
     * taskrun's index is the one into fr_uring_setup_choices, fault_mode's
     * counts from FAULT_EIO, open's is the `linked` flag. */
    enum { UNSIZED_PIPELINED, UNSIZED_DIRECT, UNSIZED_FDS, UNSIZED_WINDOWS };
    int taskrun = (int)u->first_choice, linked = u->linked, unsized = -1;
    int mode = -1, op = 1 /* read */;
    long long extra = 0, count = 1, stall_ms = 200;
    int mode_given = 0, op_given = 0, path_given = 0, count_given = 0, stall_given = 0;
    const fr_arg_spec specs[] = {
        {.key = "taskrun", .kind = FR_ARG_CHOICE, .out = &taskrun,
         .choices = "defer|single|coop|plain"},
        {.key = "open", .kind = FR_ARG_CHOICE, .out = &linked, .choices = "staged|linked"},
        {.key = "unsized", .kind = FR_ARG_CHOICE, .out = &unsized,
         .choices = "pipelined|direct|fds|windows"},
        {.key = "setup_extra", .kind = FR_ARG_INT, .out = &extra, .min = 0, .max = 0xFFFFFFFFLL},
        /* For tests only: the fault plan. */
        {.key = "fault_mode", .kind = FR_ARG_CHOICE, .out = &mode,
         .choices = "eio|eintr|eagain|short|stall|ecanceled|ebusy", .given = &mode_given},
        {.key = "fault_op", .kind = FR_ARG_CHOICE, .out = &op, .choices = "open|read|submit",
         .given = &op_given},
        {.key = "fault_path", .kind = FR_ARG_STR, .out = u->fault.path,
         .max = sizeof(u->fault.path), .given = &path_given},
        {.key = "fault_count", .kind = FR_ARG_INT, .out = &count, .min = -1, .max = 3600000,
         .given = &count_given},
        {.key = "fault_stall_ms", .kind = FR_ARG_INT, .out = &stall_ms, .min = 0,
         .max = 3600000, .given = &stall_given},
    };
    int rc = fr_args_parse("io_uring", args, specs, sizeof(specs) / sizeof(specs[0]), err,
                           err_len);
    if (rc)
        return rc;
    /* A fault plan without a mode would silently inject nothing: a test
     * that thinks it injects faults must not pass for that reason. */
    if (!mode_given && (op_given || path_given || count_given || stall_given)) {
        fr_set_err(err, err_len,
                   "io_uring: engine_args fault_* items need "
                   "fault_mode=eio|eintr|eagain|short|stall|ecanceled|ebusy");
        return -EINVAL;
    }
    /* What each event can be made to do (mode: counted from FAULT_EIO). */
    enum fault_mode fmode = mode_given ? (enum fault_mode)(FAULT_EIO + mode) : FAULT_OFF;
    int submit = op == 2;
    /* A short open would halve a descriptor number: the engine would close
     * another file's descriptor and leak its own. */
    if (mode_given &&
        (submit ? fmode == FAULT_SHORT || fmode == FAULT_STALL || fmode == FAULT_ECANCELED
                : fmode == FAULT_EBUSY || (op == 0 && fmode == FAULT_SHORT))) {
        fr_set_err(err, err_len,
                   "io_uring: engine_args fault_mode=%s does not apply to fault_op=%s (a "
                   "submit fails with eio|eintr|eagain|ebusy; a completion with "
                   "eio|eintr|eagain|ecanceled, or comes back stalled, or short for a read)",
                   fault_mode_names[fmode], submit ? "submit" : op == 0 ? "open" : "read");
        return -EINVAL;
    }
    if (submit && count < 0) {
        /* Every submit refused: the ring could never make progress. */
        fr_set_err(err, err_len, "io_uring: engine_args fault_count=-1 does not apply to "
                                 "fault_op=submit (give a count of faults)");
        return -EINVAL;
    }
    u->first_choice = (unsigned)taskrun;
    u->linked = linked;
    if (unsized >= 0) {
        u->unsized_windows = unsized == UNSIZED_WINDOWS;
        if (unsized != UNSIZED_PIPELINED) /* pipelined: direct or fds as the CPUs say */
            u->unsized_fds = unsized == UNSIZED_FDS;
    }
    u->extra_flags = (unsigned)extra;
    u->fault.mode = fmode;
    u->fault.op = op == 0 ? OP_OPEN : submit ? OP_SUBMIT : OP_READ;
    u->fault.stall_ms = (long)stall_ms;
    atomic_store(&u->fault.left, (long)count);
    return 0;
}

static int all_fixed_files(const uring *u);

static int uring_open(const fr_config *cfg, void **state, char *err, size_t err_len)
{
    uring *u = calloc(1, sizeof(*u));
    if (!u)
        return -ENOMEM;
    u->cfg = *cfg;
    u->window = WINDOW;
    u->unsized_fds = fr_usable_cpus() < DIRECT_MIN_CPUS; /* engine_args may say otherwise */
    u->cfg.engine_args = NULL; /* borrowed: not kept */
    u->depth = cfg->queue_depth;
    fr_image_cache_init(&u->image);
    u->first_choice = COOP_DEFAULT;
    int rc = parse_args(u, cfg->engine_args, err, err_len);
    if (rc) {
        free(u);
        return rc;
    }
    /* threads: rings, each with its own thread (0: one per CPU, as psync). */
    unsigned n = cfg->threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
        if (n > 16)
            n = 16;
    }
    if (n > MAX_RINGS)
        n = MAX_RINGS;
    u->nrings = n;
    u->rings = calloc(n, sizeof(*u->rings));
    if (!u->rings) {
        free(u);
        return -ENOMEM;
    }
    /* queue_depth per ring, not shared out: cold files want many reads in
     * flight (2-core VM, 6,000 cold 92 KB files, 4 rings: 6.6k files/s with
     * 64 in flight in all, 8.9k with 256), and warm ones are bounded by the
     * batch anyway. */
    for (unsigned k = 0; k < n; k++)
        u->rings[k].depth = u->depth;
    /* fr_read_file_ranges: each ring keeps its share of max_open_files
     * files open in its table (file_ranges.c). */
    unsigned open_files = cfg->max_open_files ? cfg->max_open_files : FR_MAX_OPEN_FILES;
    u->files_cap = open_files / n > 0 ? open_files / n : 1;
    u->files_stuck = fr_uring_files_stuck;
    u->files_path = fr_uring_files_run_path;
    /* Without SINGLE_ISSUER any thread may submit to a ring, so the caller
     * drives ring 0 itself: it starts at once instead of sleeping while
     * every ring thread wakes, twice per call without size hints (size,
     * then read). With SINGLE_ISSUER asked for, every ring has its own
     * thread, because the caller may be a different thread at each call. */
    u->caller_ring = fr_uring_setup_choices[u->first_choice] & IORING_SETUP_SINGLE_ISSUER ? 0 : 1;
    unsigned helpers = n - (unsigned)u->caller_ring;
    rc = fr_threadpool_start_ex(&u->pool, helpers, fr_uring_run_phase, u, "uring", err, err_len);
    if (rc) {
        free(u->rings);
        free(u);
        return rc;
    }
    fr_threadpool_set_spin(u->pool, (long)cfg->spin_us * 1000);
    /* Each thread sets up its own ring, so a SINGLE_ISSUER ring belongs to
     * the one thread that will ever submit to it. */
    if (u->caller_ring)
        fr_uring_ring_setup(u, &u->rings[0]);
    fr_threadpool_run_helpers(u->pool, PH_SETUP, 0);
    for (unsigned k = 0; k < n; k++) {
        if (u->rings[k].setup_rc) {
            rc = u->rings[k].setup_rc;
            fr_set_err(err, err_len, "io_uring: cannot set up ring %u of %u (%u entries): %s", k,
                       n, u->rings[k].depth * 4, strerror(-rc));
            uring_close(u);
            return rc;
        }
    }
    u->files_native = cfg->register_files && !cfg->o_direct && all_fixed_files(u) &&
                      fr_uring_files_check(&u->rings[0].ring, NULL, 0) == 0;
    *state = u;
    return 0;
}

static int files_usable_here(off_thread_job *j)
{
    struct io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) < 0)
        return 0;
    int ok = io_uring_register_files_sparse(&ring, 1) == 0 &&
             fr_uring_files_check(&ring, NULL, 0) == 0;
    io_uring_queue_exit(&ring);
    (void)j;
    return ok;
}

int fr_uring_files_usable(const fr_config *cfg)
{
    if (!cfg->register_files || cfg->o_direct)
        return 0;
    /* Off the caller's thread, as uring_probe (a table reader's open). */
    off_thread_job j = {.fn = files_usable_here};
    return run_off_thread(&j);
}

static int grow_scratch(uring *u, size_t n)
{
    if (n <= u->cap)
        return 0;
    size_t cap = u->cap ? u->cap : 64;
    while (cap < n)
        cap *= 2;
#define GROW(field)                                                         \
    do {                                                                    \
        void *p_ = realloc(u->field, cap * sizeof(*u->field));              \
        if (!p_)                                                            \
            return -ENOMEM;                                                 \
        u->field = p_;                                                      \
    } while (0)
    GROW(sizes);
    GROW(open_res);
    GROW(read_res);
    GROW(fds);
    GROW(live);
    GROW(live_slot);
    GROW(stuck);
    GROW(leftover);
    GROW(placed);
#undef GROW
    for (size_t i = u->cap; i < cap; i++)
        u->live[i] = NULL;
    u->cap = cap;
    return 0;
}

/* Runs one phase on every ring; 0 or the first batch-level -errno.
 *
 * A ring takes at most per_turn new files per submit. Taking as many as its
 * depth allows, the first ring thread to wake took the whole batch (64 files,
 * depth 64) before the others woke, and cached files, which complete inside
 * the submit, were read by one thread. Small turns keep every ring busy
 * until the list ends; 16 files per io_uring_enter keeps the syscall a small
 * share of the work, and cold rings still fill up to their depth over a few
 * turns (a turn returns at the first completion). */
static int run_rings(uring *u, enum phase phase, size_t count)
{
    size_t per_turn = count / (4 * (size_t)u->nrings);
    u->per_turn = per_turn < 1 ? 1 : per_turn > 16 ? 16 : per_turn;
    u->phase_count = count;
    atomic_store(&u->phase_err, 0);
    u->phase = phase;
    if (u->caller_ring)
        fr_threadpool_run_claimed(u->pool, (int)phase, count); /* ring 0 claims to the end */
    else
        fr_threadpool_run_helpers(u->pool, (int)phase, count);
    return atomic_load(&u->phase_err);
}

static int layout_window(uring *u, fr_batch *batch, size_t first, size_t count)
{
    if (u->order) {
        /* Files of a list (leftovers of pipelined windows): appended. */
        size_t off = fr_round_up(batch->arena.used, u->bump_align);
        for (size_t k = first; k < first + count; k++) {
            size_t i = u->order[k];
            if (u->sizes[i] < 0)
                continue; /* recorded by the final pass */
            batch->samples[i].offset = off;
            batch->samples[i].length = 0;
            off += fr_uring_slot_len(u, u->sizes[i]);
        }
        int rc = fr_arena_reserve(&batch->arena, off);
        if (rc == 0)
            batch->arena.used = off;
        return rc;
    }
    fr_sample *saved = batch->samples;
    batch->samples = saved + first;
    int rc = fr_layout(batch, u->sizes + first, count, u->cfg.o_direct, u->cfg.direct_alignment);
    batch->samples = saved;
    return rc;
}

static void close_window(uring *u, size_t first, size_t count)
{
    for (size_t k = first; k < first + count; k++) {
        size_t i = item(u, k);
        if (u->fds[i] >= 0) {
            close(u->fds[i]);
            u->fds[i] = -1;
        }
    }
}

/* Sizes, lays out and reads files 0..n-1 (u->order[0..n-1] if set) in
 * windows of u->window, two phases each: every open (sizing), then every
 * read. 0 or a batch-level -errno. */
static int read_sized_windows(uring *u, fr_batch *batch, size_t n)
{
    size_t count;
    unsigned fd_waits = 0;
    for (size_t first = 0; first < n; first += count) {
        count = n - first < u->window ? n - first : u->window;
        u->first = first;
        int rc = run_rings(u, PH_OPEN, count);
        size_t opened = 0, out_of_fds = 0;
        for (size_t k = first; rc == 0 && k < first + count; k++) {
            size_t i = item(u, k);
            if (u->stuck[i])
                u->sizes[i] = u->stuck[i]; /* its open was cancelled */
            opened += u->fds[i] >= 0;
            out_of_fds += u->sizes[i] == -EMFILE || u->sizes[i] == -ENFILE;
        }
        if (rc == 0 && out_of_fds && (count > 1 || fd_waits < FR_RETRY_LIMIT)) {
            /* Out of descriptors: close the window and size fewer files
             * at a time. At one file, other threads (a reader's other
             * workers) may hold them all for a moment: wait a little,
             * FR_RETRY_LIMIT times at most, before EMFILE is the error. */
            close_window(u, first, count);
            if (count == 1) {
                fd_waits++;
                fr_pause_1ms();
            }
            u->window = opened / 2 > 1 ? opened / 2 : 1;
            u->window_shrinks++;
            count = 0; /* the same files again */
            continue;
        }
        fd_waits = 0;
        if (rc == 0)
            rc = layout_window(u, batch, first, count);
        if (rc == 0)
            rc = run_rings(u, PH_READ, count);
        if (rc) {
            close_window(u, first, count);
            return rc;
        }
    }
    return 0;
}

/* The rings all have direct descriptors, or none has (same kernel, same
 * request): the first one says. */
static int all_fixed_files(const uring *u)
{
    for (unsigned k = 0; k < u->nrings; k++)
        if (!u->rings[k].fixed_files)
            return 0;
    return 1;
}

/* Unknown sizes, a batch that is not dense: windows of PH_PIPELINED (see
 * ring_pipelined). What a window leaves (files sized when the reserved
 * room was spent, files refused a descriptor) goes through the two-phase
 * path as a list before the next window starts, so descriptors stay bounded
 * by the window. 0 or a batch-level -errno. */
static int read_pipelined(uring *u, fr_batch *batch, size_t n)
{
    u->bump_align = u->cfg.o_direct ? u->cfg.direct_alignment : FR_SAMPLE_ALIGN;
    size_t start = fr_round_up(batch->arena.used, u->bump_align);
    /* Room for every file at the last call's mean slot, and an eighth more
     * (a batch of 256 ImageNet JPEGs, sizes varying by about 70%, varies by
     * about 5% in sum): refused (memory) it is simply less room, the
     * leftovers then reserve exactly what they need and fail the batch if
     * that is refused too. */
    size_t per_file = u->est_slot + u->est_slot / 8;
    if (per_file > 0 && n <= (SIZE_MAX - start) / per_file)
        (void)fr_arena_reserve(&batch->arena, start + n * per_file);
    int direct = all_fixed_files(u) && !u->unsized_fds;
    size_t count;
    for (size_t first = 0; first < n; first += count) {
        count = n - first < u->window ? n - first : u->window;
        u->order = NULL;
        u->first = first;
        atomic_store(&u->bump, fr_round_up(batch->arena.used, u->bump_align));
        u->bump_limit = batch->arena.capacity;
        memset(u->placed + first, 0, count);
        int rc = run_rings(u, direct ? PH_DIRECT : PH_PIPELINED, count);
        u->pipelined_windows++;
        u->direct_windows += direct;
        if (rc) {
            close_window(u, first, count);
            return rc;
        }
        size_t end = atomic_load(&u->bump);
        if (end > batch->arena.used)
            batch->arena.used = end;
        /* Leftovers: no room from the front of the list, no descriptor from
         * its back. */
        size_t *list = u->leftover;
        size_t roomless = 0, fdless = 0;
        for (size_t i = first; i < first + count; i++) {
            if (u->stuck[i])
                u->sizes[i] = u->stuck[i];
            if (u->sizes[i] >= 0 && !u->placed[i])
                list[first + roomless++] = i;
            else if (u->sizes[i] == -EMFILE || u->sizes[i] == -ENFILE)
                list[first + count - 1 - fdless++] = i;
        }
        if (roomless) {
            /* Sized, laid out at the arena's end, read: through their open
             * descriptors, or (PH_DIRECT, which closed them) opened again
             * into direct ones, their sizes now known. */
            u->deferred_files += (long)roomless;
            u->order = list + first;
            u->first = 0;
            rc = layout_window(u, batch, 0, roomless);
            if (rc == 0)
                rc = run_rings(u, direct ? PH_CHAINED : PH_READ, roomless);
            if (rc) {
                close_window(u, 0, roomless);
                u->order = NULL;
                return rc;
            }
        }
        if (fdless) {
            /* Opened again, the two-phase way, whose windows shrink until
             * descriptors suffice. */
            u->order = list + first + count - fdless;
            for (size_t k = 0; k < fdless; k++) {
                size_t i = u->order[k];
                u->open_res[i] = 0;
                u->sizes[i] = 0;
            }
            rc = read_sized_windows(u, batch, fdless);
            u->order = NULL;
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Forgets the call's paths (a later range phase has none) and every file
 * still marked in flight (a broken ring leaves some). Returns rc. */
static int end_call(uring *u, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        u->live[i] = NULL;
    u->paths = NULL;
    return rc;
}

static void not_file_ranges(uring *u)
{
    if (u->files)
        fr_uring_files_last_off(u);
}

static int uring_read_files(void *state, const char *const *paths, const int64_t *size_hints,
                            size_t n, fr_batch *batch)
{
    uring *u = state;
    not_file_ranges(u);
    int rc = grow_scratch(u, n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        u->open_res[i] = 0;
        u->read_res[i] = -ECANCELED;
        u->fds[i] = -1;
        u->stuck[i] = 0;
    }
    u->paths = paths;
    u->batch = batch;
    u->first = 0;
    int known = size_hints != NULL && all_fixed_files(u);
    for (size_t i = 0; known && i < n; i++)
        known = size_hints[i] >= 0;

    if (known) {
        memcpy(u->sizes, size_hints, n * sizeof(*u->sizes));
        rc = fr_layout(batch, u->sizes, n, u->cfg.o_direct, u->cfg.direct_alignment);
        if (rc == 0)
            rc = run_rings(u, PH_CHAINED, n);
        if (rc)
            return end_call(u, n, rc);
    } else {
        u->bump_align = u->cfg.o_direct ? u->cfg.direct_alignment : FR_SAMPLE_ALIGN;
        size_t start = fr_round_up(batch->arena.used, u->bump_align);
        rc = batch->dense || u->unsized_windows || u->est_slot > PIPELINE_MAX_SLOT
                 ? read_sized_windows(u, batch, n)
                 : read_pipelined(u, batch, n);
        u->order = NULL;
        if (rc)
            return end_call(u, n, rc);
        size_t sized = 0;
        for (size_t i = 0; i < n; i++)
            sized += u->sizes[i] >= 0;
        if (sized && batch->arena.used > start)
            u->est_slot = (batch->arena.used - start) / sized;
    }

    for (size_t i = 0; i < n; i++) {
        fr_sample *s = &batch->samples[i];
        if (u->sizes[i] < 0) {
            /* Recorded by fr_layout; not by the pipelined path. */
            s->offset = 0;
            s->length = u->sizes[i];
            continue;
        }
        if (u->stuck[i]) {
            s->length = u->stuck[i]; /* no regular file any more: cancelled */
            continue;
        }
        int64_t size = u->sizes[i];
        int64_t open_res = u->open_res[i], read_res = u->read_res[i];
        size_t slot = fr_request_len((size_t)size, u->cfg.o_direct, u->cfg.direct_alignment);
        int direct_refused = u->cfg.o_direct && (open_res == -EINVAL || read_res == -EINVAL);
        if (open_res < 0 && !direct_refused && !retryable(open_res)) {
            s->length = open_res; /* e.g. the file vanished since it was sized */
        } else if (read_res == size) {
            s->length = size;
        } else if (read_res < 0 && !direct_refused && !retryable(read_res) &&
                   read_res != -ECANCELED) {
            s->length = read_res;
        } else {
            /* Short, changed size, cut at FR_MAX_REQUEST, O_DIRECT refused by
             * the file system, or a hinted file that moved: finish it the
             * slow, sure way. */
            if (direct_refused)
                u->direct_fallbacks++;
            fr_read_whole(batch, i, paths[i], slot);
        }
    }
    return end_call(u, n, 0);
}

static int grow_range_scratch(uring *u, size_t n)
{
    if (n <= u->rcap)
        return 0;
    size_t cap = u->rcap ? u->rcap : 64;
    while (cap < n)
        cap *= 2;
    int64_t *r = realloc(u->range_res, cap * sizeof(*r));
    if (!r)
        return -ENOMEM;
    u->range_res = r;
    u->rcap = cap;
    return 0;
}

static int uring_read_ranges(void *state, const char *path, const fr_range *ranges, size_t n,
                             fr_batch *batch)
{
    uring *u = state;
    not_file_ranges(u);
    int rc = grow_range_scratch(u, n);
    if (rc)
        return rc;
    int changed = fr_image_cache_get(&u->image, path, u->cfg.o_direct);
    if (changed < 0)
        return changed;
    if (changed)
        u->image_gen++; /* every ring re-points its fixed slot */
    int fd = u->image.fd >= 0 ? u->image.fd : u->image.err;
    int direct = fd >= 0 && u->image.direct;
    rc = fr_layout_ranges(batch, ranges, n, direct, u->cfg.direct_alignment);
    if (rc)
        return rc;
    if (fd < 0) { /* the image cannot be opened: every sample says why */
        for (size_t i = 0; i < n; i++)
            batch->samples[i].length = fd;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        u->range_res[i] = batch->samples[i].length; /* 0, or -EINVAL from the layout */
    u->batch = batch;
    u->ranges = ranges;
    u->range_direct = direct;
    rc = run_rings(u, PH_RANGES, n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        fr_sample *s = &batch->samples[i];
        int64_t res = u->range_res[i];
        if (s->length < 0)
            continue; /* a bad range */
        if (res == 0) {
            s->length = (int64_t)ranges[i].length;
        } else if (res == -EAGAIN || res == -EINTR || res == -ECANCELED ||
                   (res == -EINVAL && direct)) {
            if (res == -EINVAL)
                u->direct_fallbacks++;
            fr_read_range_plain(batch, i, path, &ranges[i]);
        } else {
            s->length = res;
        }
    }
    return 0;
}

/* Ranges of many files on the rings (file_ranges.c); -ENOTSUP where this
 * kernel or configuration cannot (the context then reads them with psync:
 * fr_read_file_ranges in ctx.c asks "file_ranges_native" first). */
static int uring_read_file_ranges(void *state, const char *const *paths, size_t npaths,
                                  const fr_file_range *jobs, size_t n, fr_batch *batch)
{
    uring *u = state;
    if (!u->files_native)
        return -ENOTSUP;
    if (n > UINT32_MAX)
        return -EINVAL;
    size_t nruns;
    int rc = fr_uring_files_prepare(u, paths, npaths, jobs, n, batch, &nruns);
    if (rc)
        return rc;
    u->paths = NULL; /* no file list: the stuck check asks file_ranges.c */
    u->batch = batch;
    u->order = NULL;
    u->first = 0;
    if (nruns)
        rc = run_rings(u, PH_FILE_RANGES, nruns);
    fr_uring_files_settle(u, batch);
    return rc;
}

static int uring_sample_error(const void *state, size_t i, char *out, size_t len)
{
    return fr_uring_files_error(state, i, out, len);
}

static long uring_stat(const void *state, const char *key)
{
    const uring *u = state;
    const uring_ring *r0 = &u->rings[0];
    long v;
    if (fr_uring_files_stat(u, key, &v))
        return v;
    if (strcmp(key, "fixed_files") == 0)
        return all_fixed_files(u);
    if (strcmp(key, "fixed_buffers") == 0)
        return r0->fixed_buffers;
    if (strcmp(key, "queue_depth") == 0)
        return u->depth;
    if (strcmp(key, "threads") == 0 || strcmp(key, "rings") == 0)
        return u->nrings;
    if (strcmp(key, "setup_flags") == 0)
        return (long)r0->flags;
    if (strcmp(key, "o_direct") == 0)
        return u->cfg.o_direct;
    if (strcmp(key, "direct_fallbacks") == 0)
        return u->direct_fallbacks;
    if (strcmp(key, "image_fixed") == 0)
        return r0->fixed_files && r0->image_gen != 0 && r0->image_gen == u->image_gen;
    if (strcmp(key, "image_direct") == 0)
        return u->image.fd >= 0 ? u->image.direct : -1;
    if (strcmp(key, "window") == 0)
        return (long)u->window;
    if (strcmp(key, "window_shrinks") == 0)
        return u->window_shrinks;
    if (strcmp(key, "pipelined_windows") == 0)
        return u->pipelined_windows;
    if (strcmp(key, "direct_windows") == 0)
        return u->direct_windows;
    if (strcmp(key, "deferred_files") == 0)
        return u->deferred_files;
    if (strcmp(key, "est_slot") == 0)
        return (long)u->est_slot;
    if (strcmp(key, "faults_injected") == 0)
        return atomic_load(&u->fault.done);
    return fr_threadpool_stat(u->pool, key);
}

const fr_engine fr_engine_uring = {
    .name = "io_uring",
    .probe = uring_probe,
    .open = uring_open,
    .close = uring_close,
    .read_files = uring_read_files,
    .uses_size_hints = 1,
    .stat = uring_stat,
    .read_ranges = uring_read_ranges,
    .sample_error = uring_sample_error,
    .read_file_ranges = uring_read_file_ranges,
};
