/*
 * io_uring engine, private to csrc/engines/uring/: what its files share.
 *
 * io_uring: a batch spread over `threads` rings, each driven by one thread
 * (the caller's for ring 0, a pool thread's for the others), with up to
 * queue_depth files in flight on each.
 *
 * Why several rings: on cached files nearly all the work is the kernel's
 * (path walk, page-cache copy), and io_uring does it inline in the thread
 * that submits. One ring is one core: measured on the 2-core VM, one ring
 * spends 14-17 us of CPU per 92 KB file against psync's 16-19 us per file
 * per thread (no io-wq workers appear), yet psync with 4 threads read 1.4x
 * as many files a second because it used both cores. So every context owns
 * `threads` rings; each ring's thread claims files from the batch a few at a
 * time (see run_rings), so one call on one list uses every ring
 * (fr_read_files runs near a reader's speed).
 *
 * By default the calling thread drives ring 0 and pool threads the others.
 * Asked for SINGLE_ISSUER ("taskrun=defer|single"), every ring is created,
 * submitted to, waited on and torn down by its own pool thread, never by the
 * caller (who may be a different thread at every call: the context is only
 * used by one thread at a time). That is what allows
 * IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN (task work,
 * e.g. the next op of a linked chain, runs only when the ring's thread
 * waits). They are not the default: on the 2-core VM (6.18 kernel), 21 paired
 * rounds of 4,096 cached 92 KB files, 2 rings, batch 64, DEFER_TASKRUN used
 * 22.9 us of CPU per file against COOP_TASKRUN's 19.8 without size hints
 * and 18.7 against 18.0 with them (less CPU in only 10 and 7 of the 21
 * rounds): every op here completes inline, so there is little task work to
 * defer. So rings get COOP_TASKRUN (Linux 5.19), then plain rings where
 * refused; engine_args "taskrun=defer|single|coop|plain" picks the first
 * choice tried, and fr_ctx_stat "setup_flags" says what the kernel granted.
 *
 * When every file's size is known (a reader remembers them from earlier
 * epochs), the arena is laid out before anything is submitted, and each file
 * is opened into a direct descriptor, then read (into a registered buffer
 * when possible) -> close, hard-linked so a failed read never leaks the
 * descriptor slot (see ring_chained for why the open is not linked too).
 *
 * Otherwise each file is sized as it opens: openat (which the kernel
 * completes inline when the path is cached), then a stat (cheap: the inode
 * is in memory once open; also the check that it is a regular file, which
 * no read result can stand in for: a FIFO with a writer or /dev/null gives
 * a short read too), then read -> close. In a batch that is not dense, of
 * files that were at most PIPELINE_MAX_SLOT on average last call, the ring
 * reads each file as soon as it is sized, into room reserved in the arena,
 * one phase per window: through a direct descriptor, sized by stat() of the
 * path (ring_direct, which explains why), or where the rings have none
 * through an ordinary one, sized by fstat (ring_pipelined). Otherwise (a
 * dense batch, laid out in input order; large files) it sizes a whole
 * window first with ordinary descriptors (ring_open, then ring_read: two
 * phases). The stat is a system call on the ring's thread, not io_uring's
 * statx, which io_uring always hands to a worker thread, which costs more
 * than the read of a small file.
 *
 * Anything the fast path cannot finish (a short read, a file whose size
 * changed, a read cut at FR_MAX_REQUEST) is repaired synchronously afterwards,
 * by the caller, once every ring is idle.
 *
 * Registered buffers are cached per ring and arena and identified by the
 * arena's address and generation. A new arena's first generation is drawn
 * per arena (buffers.c), so an arena calloc'd where a freed one was does not
 * match the freed one's registration; a registration outliving its arena
 * only keeps its old pages pinned until the slot is reused.
 */
/*
 * Its files:
 *   ring.c       one ring on its own thread: setup, teardown, registered
 *                buffers, submit/wait/reap, stuck-request cancels
 *   faults.c     the test-only fault plan, applied to completions
 *   strategies.c the ways a ring reads a phase's files (linked, chained,
 *                open/read windows, pipelined, direct, ranges) and the
 *                pool's entry point that picks one
 *   file_ranges.c ranges of many files (fr_read_file_ranges): per ring an
 *                LRU of files in direct-descriptor slots, each miss one
 *                linked openat -> read chain, nearby ranges one READV
 *   engine.c     engine_args, open/close, read_files/read_ranges (which
 *                phases run, in which order, and the repair afterwards),
 *                stats, and fr_engine_uring
 */
#ifndef FASTREAD_URING_INTERNAL_H
#define FASTREAD_URING_INTERNAL_H

#include <liburing.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "engines/engine.h"
#include "engines/io_common.h"
#include "engines/range_io.h"

#define NBUF_SLOTS 16

enum op { OP_OPEN = 1, OP_READ, OP_CLOSE, OP_CANCEL,
          OP_SUBMIT /* fault_plan only: io_uring_enter's submit, no request */ };

/* What the pool's threads are asked to do. */
enum phase {
    PH_SETUP,
    PH_TEARDOWN,
    PH_CHAINED,
    PH_OPEN,
    PH_READ,
    PH_PIPELINED,
    PH_DIRECT,
    PH_RANGES,
    PH_FILE_RANGES
};

/* Setup flag sets, tried in order from the one asked for until the kernel
 * takes one: DEFER_TASKRUN needs SINGLE_ISSUER and Linux 6.1, COOP_TASKRUN
 * 5.19. The default starts at COOP_DEFAULT (see the top of the file).
 * Defined in ring.c. */
#define NCHOICES 4
extern const unsigned fr_uring_setup_choices[NCHOICES];

typedef struct buf_slot {
    const fr_arena *arena;
    uint64_t generation;
    uint64_t last_used;
} buf_slot;

/* One ring and everything the kernel keeps per ring. Touched only by the
 * pool thread that owns it (see the top of the file). */
typedef struct uring_ring {
    struct io_uring ring;
    int up;
    int setup_rc; /* 0, or why the ring could not be set up */
    unsigned flags; /* setup flags the kernel took */
    unsigned depth; /* files in flight on this ring */
    int fixed_files;
    int fixed_buffers;
    buf_slot bufs[NBUF_SLOTS];
    uint64_t tick;
    unsigned *free_slots;
    unsigned nfree;
    struct opened {
        size_t index;
        unsigned slot;
    } *opened; /* files opened whose read is not submitted yet */
    unsigned nopened;
    unsigned busy; /* PH_PIPELINED: files opened whose close has not completed */
    uint64_t image_gen; /* the image generation in fixed slot `depth`, 0: none */
    /* fr_read_file_ranges (file_ranges.c): the LRU of the files this ring
     * holds in slots depth + 1 .. of its table; made on first use. */
    struct ring_files *files;
} uring_ring;

/* Test-only fault injection (engine_args fault_*=, see parse_args): makes
 * chosen completions of this context's rings fail (EIO, EINTR, EAGAIN,
 * ECANCELED), come back short or late, as a disk, a network file system, a
 * cancellation or a signal would, or makes a ring's submit (io_uring_enter)
 * fail (fault_op=submit: EIO, EINTR, EAGAIN, EBUSY) without submitting, so
 * tests can prove every such event surfaces per sample (or per batch, for a
 * broken submit) or is retried, never hangs and never leaks. Off (mode
 * FAULT_OFF) it costs one predictable branch per completion and per
 * submit. */
enum fault_mode {
    FAULT_OFF = 0,
    FAULT_EIO,
    FAULT_EINTR,
    FAULT_EAGAIN,
    FAULT_SHORT,
    FAULT_STALL,
    FAULT_ECANCELED,
    FAULT_EBUSY
};

typedef struct fault_plan {
    enum fault_mode mode;
    enum op op;       /* OP_OPEN, OP_READ (range reads are reads) or OP_SUBMIT */
    char path[64];    /* substring of the paths to fault; empty: every path */
    long stall_ms;    /* how long FAULT_STALL holds a completion back */
    atomic_long left; /* faults still to inject: -1 every one, shared by the rings */
    atomic_long done; /* faults injected so far (fr_ctx_stat "faults_injected") */
} fault_plan;

typedef struct uring {
    fr_config cfg;
    fault_plan fault;
    unsigned nrings;
    unsigned depth; /* queue_depth: files in flight per ring */
    unsigned first_choice; /* index into fr_uring_setup_choices */
    unsigned extra_flags;  /* engine_args setup_extra=: tried first, dropped if refused */
    int linked;            /* engine_args open=linked: openat linked to its read */
    int unsized_windows;   /* engine_args unsized=windows: no PH_PIPELINED */
    int unsized_fds;       /* PH_PIPELINED, not PH_DIRECT: see DIRECT_MIN_CPUS */
    int caller_ring;       /* ring 0 is driven by the calling thread (see uring_open) */
    uring_ring *rings;           /* rings[w - 1] belongs to pool thread w */
    fr_threadpool *pool;
    long direct_fallbacks;
    /* Files sized at once: WINDOW, less once the process ran out of
     * descriptors (RLIMIT_NOFILE): a window that hits EMFILE is closed and
     * sized again at half the files it got (one at a time at worst). */
    size_t window;
    long window_shrinks;

    /* The phase being run: set by the caller before it hands the phase to
     * the pool, read-only while the threads run. */
    enum phase phase;
    const char *const *paths;
    fr_batch *batch;
    size_t first; /* window start: claimed item k is file item(u, first + k) */
    const size_t *order; /* NULL, or the files a phase works on (see item) */

    /* PH_PIPELINED: slots are taken from [bump, bump_limit) of the arena as
     * files are sized (see pipelined_cqe). */
    atomic_size_t bump;
    size_t bump_limit;
    size_t bump_align;
    size_t est_slot;    /* mean slot of the last call's files, for the next reservation */
    size_t *leftover;   /* files a pipelined window could not finish (grown with cap) */
    unsigned char *placed; /* PH_PIPELINED: file i has its slot */
    long pipelined_windows;
    long direct_windows; /* of those, read through direct descriptors (PH_DIRECT) */
    long deferred_files; /* files sized in a pipelined window but read after it (no room) */
    const fr_range *ranges;
    int range_direct;
    atomic_int phase_err; /* the first batch-level -errno of a phase */
    size_t per_turn;      /* files (ranges) a ring claims per submit: see run_rings */
    size_t phase_count;   /* items of the running phase */

    /* Range reads: the image, opened by the caller; each ring puts it in its
     * fixed slot `depth` when direct descriptors are on. */
    fr_image_cache image;
    uint64_t image_gen; /* bumped whenever the cached image changes */
    size_t rcap;
    int64_t *range_res; /* per range: 0, or the first failed chunk's result */

    /* Per-call results, grown as needed. Entry i is written only by the
     * thread that claimed file i, and read by the caller after the phase
     * (the pool's lock orders the two). */
    size_t cap;
    int64_t *sizes;
    int64_t *open_res;
    int64_t *read_res;
    int *fds;
    /* The ring with requests of file i in flight, or NULL: written by the
     * thread that claimed file i, read by every ring's stuck check. */
    _Atomic(uring_ring *) *live;
    unsigned *live_slot; /* its direct-descriptor slot (chained, linked) */
    int64_t *stuck;      /* 0, or the error of file i's cancelled requests */

    /* fr_read_file_ranges through the rings (file_ranges.c): slots per
     * ring for the files' LRU (max_open_files shared out), whether this
     * kernel takes the chains (files_native), the call's state. */
    unsigned files_cap;
    int files_native;
    struct uring_files *files;
    /* file_ranges.c's answers to ring.c (the stuck check) and faults.c
     * (a run's path), set by engine.c: file_ranges.c calls into ring.c,
     * so ring.c and faults.c call it back through these, not by name (no
     * call cycle between the objects: tests/test_layering.py). */
    size_t (*files_stuck)(struct uring *u, uring_ring *r);
    const char *(*files_path)(const struct uring *u, size_t k);
} uring;

static inline uint64_t pack(size_t i, unsigned slot, enum op op)
{
    return ((uint64_t)i << 24) | ((uint64_t)slot << 4) | (uint64_t)op;
}
static inline size_t ud_index(uint64_t ud) { return (size_t)(ud >> 24); }
static inline unsigned ud_slot(uint64_t ud) { return (unsigned)((ud >> 4) & 0xFFFFF); }
static inline enum op ud_op(uint64_t ud) { return (enum op)(ud & 0xF); }

/* The file at position k of the running phase: order[k], or k itself. */
static inline size_t item(const uring *u, size_t k) { return u->order ? u->order[k] : k; }

/* Marks file i's requests as in flight on ring r (r NULL: no longer). Entry i
 * is touched only by the thread that claimed file i. */
static inline void set_live(uring *u, size_t i, uring_ring *r, unsigned slot)
{
    u->live[i] = r;
    u->live_slot[i] = slot;
}

/* Results that are no sample's error: the repair path reads the sample again
 * (EINTR, EAGAIN; ECANCELED, a request the kernel cancelled and we did not:
 * ours, of paths that stopped being files, are told by u->stuck, and a
 * linked read cancelled by its failed open has the open's error). */
static inline int retryable(int64_t res)
{
    return res == -EINTR || res == -EAGAIN || res == -ECANCELED;
}

typedef void (*cqe_fn)(uring *u, uring_ring *r, const struct io_uring_cqe *cqe);

/* Files whose mean slot (the last call's) is larger keep the two-phase path:
 * their reads dwarf a phase's hand-off, and the pipelined path's tail (a ring
 * holding files another could read) showed instead. On the 2-core VM, in
 * one process (engine_args unsized=), 1 MiB files, batch 256: 0.95-1.01 of
 * the two-phase path's files/s over four runs of 15 rounds; 4 KiB: 1.00-1.42,
 * 92 KiB: 0.92-1.06. */
#define PIPELINE_MAX_SLOT ((size_t)512 << 10)

/* Below this many CPUs, PH_PIPELINED (ordinary descriptors, fstat) is the
 * default: few threads hardly contend for the table's lock, and stat() of
 * the path costs more than fstat. On the 2-core VM, read_files() of 64
 * cached 4 KiB files ran 0.91x as fast through PH_DIRECT (92 KiB: 1.01x);
 * on the 16-core H200 1.59x (92 KiB: 0.97x at 64 files, 1.13x at 256).
 * engine_args unsized=direct|fds overrides. */
#define DIRECT_MIN_CPUS 4

/* ---- ring.c: one ring, on its own thread ---- */

/* Sets ring r up with the first setup flags the kernel takes, from
 * u->first_choice on; r->setup_rc says why not. */
void fr_uring_ring_setup(uring *u, uring_ring *r);
void fr_uring_ring_teardown(uring_ring *r);
/* The registered-buffer index for the arena, or -1 to read unregistered. */
int fr_uring_buffer_index(uring_ring *r, const fr_arena *arena);
/* Submits, waits and reaps once, handing completions to fn; (size_t)-1 when
 * the ring broke (drained, error recorded in u->phase_err). */
size_t fr_uring_turn(uring *u, uring_ring *r, size_t *inflight, cqe_fn fn);

/* ---- file_ranges.c: ranges of many files (fr_read_file_ranges) ---- */

/* Whether a ring of this kernel can open into direct descriptors and read
 * through them in one linked chain: 0, or -ENOTSUP with why. */
int fr_uring_files_check(struct io_uring *ring, char *why, size_t why_len);
/* The caller's side of one call: lays the jobs out, sorts them into runs
 * (returned in *nruns) and builds their vectors; 0 or -errno. */
int fr_uring_files_prepare(uring *u, const char *const *paths, size_t npaths,
                           const fr_file_range *jobs, size_t n, fr_batch *batch, size_t *nruns);
/* After PH_FILE_RANGES: each job's length or -errno, the runs the rings
 * could not finish read again the slow way. */
void fr_uring_files_settle(uring *u, fr_batch *batch);
/* PH_FILE_RANGES on ring r. */
void fr_uring_ring_files(uring *u, uring_ring *r);
/* Cancels ring r's reads of paths that are no files any more (see
 * STUCK_CHECK_MS); returns the cancels submitted. */
size_t fr_uring_files_stuck(uring *u, uring_ring *r);
/* The path run k of the call in progress reads (the fault plan's). */
const char *fr_uring_files_run_path(const uring *u, size_t k);
/* The engine's next call is no file-range call (sample_error says nothing). */
void fr_uring_files_last_off(uring *u);
/* Why sample i of the last call failed (1), or 0. */
int fr_uring_files_error(const uring *u, size_t i, char *out, size_t len);
/* A fd_cache_* or file_range_* statistic into *out: 1, or 0 if not one. */
int fr_uring_files_stat(const uring *u, const char *key, long *out);
/* Frees ring r's LRU (its thread, at teardown) and the call's state. */
void fr_uring_ring_files_free(uring_ring *r);
void fr_uring_files_free(uring *u);

/* ---- faults.c: test-only fault injection ---- */

/* Applies u->fault to a copy of one completion (mode not FAULT_OFF). */
void fr_uring_fault_inject(uring *u, struct io_uring_cqe *cqe);
/* The -errno a submit is made to fail with instead of being made
 * (fault_op=submit), or 0: submit for real. */
int fr_uring_fault_submit(uring *u);

/* ---- strategies.c: how a ring reads a phase ---- */

/* The thread pool's entry point: runs `phase` on the ring of `worker`. */
void fr_uring_run_phase(void *arg, int phase, unsigned worker);
/* The arena slot of a file of `size` bytes in a batch that is not dense. */
size_t fr_uring_slot_len(const uring *u, int64_t size);

#endif
