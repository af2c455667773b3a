/*
 * The host backend of fr_store (gather.h): row gathers done entirely on the
 * host. Ids are validated, sorted (keeping their input positions), runs of
 * nearby rows coalesced into range reads, the ranges read through an engine
 * (fr_read_ranges on one fr_ctx per host thread), and the rows scattered to
 * the output in input order. Internal: gather.c is its only caller, and it
 * serialises calls to fr_host_gather_run (one gather at a time per store).
 */
#ifndef FASTREAD_GATHER_HOST_H
#define FASTREAD_GATHER_HOST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fr_host_gather fr_host_gather;

typedef struct fr_host_gather_config {
    const char *path;
    uint64_t offset, rows, row_bytes;
    const char *engine;      /* "auto": io_uring where it runs, else psync */
    const char *engine_args;
    int o_direct;            /* -1: when offset and row_bytes are 4 KiB multiples */
    unsigned queue_depth;    /* 0: default */
    unsigned threads;        /* 0: default */
    const atomic_int *cancel; /* nonzero: a gather in flight stops with -ECANCELED */
} fr_host_gather_config;

/* What one gather did, added to the caller's totals. */
typedef struct fr_host_gather_counts {
    uint64_t reads;     /* range reads sent to the engine */
    uint64_t bytes;     /* bytes those reads asked for */
    uint64_t coalesced; /* rows served by a read made for another row */
} fr_host_gather_counts;

/* Size of the file or block device at `path` in *size: 0 or -errno (with why). */
int fr_host_file_size(const char *path, uint64_t *size, char *err, size_t err_len);

/* Opens the file (checking it holds offset + rows * row_bytes bytes) and the
 * engine contexts. 0 or -errno with a message naming the path or engine. */
int fr_host_gather_open(const fr_host_gather_config *cfg, fr_host_gather **out, char *err,
                        size_t err_len);
void fr_host_gather_close(fr_host_gather *g);

/* Rows ids[0..n) to out in input order. 0, -ERANGE (*bad_index: position of
 * the first id out of range), -ECANCELED, -EIO/-ENODATA (message names the
 * path), -ENOMEM. Not thread-safe: one call at a time. */
int fr_host_gather_run(fr_host_gather *g, const int64_t *ids, size_t n, void *out,
                       size_t *bad_index, fr_host_gather_counts *counts, char *err,
                       size_t err_len);

/* The same for 4-byte ids (converted on the fly). */
int fr_host_gather_run32(fr_host_gather *g, const int32_t *ids, size_t n, void *out,
                         size_t *bad_index, fr_host_gather_counts *counts, char *err,
                         size_t err_len);

/* Host memory held for gathers (sort buffers, range lists, read arenas). */
uint64_t fr_host_gather_bytes(fr_host_gather *g);
const char *fr_host_gather_engine(const fr_host_gather *g);
/* The last gather's microseconds: checks, sort and plan; reads and scatter
 * (for $FASTREAD_GATHER_TIMELINE). */
void fr_host_gather_last_times(const fr_host_gather *g, double *prep_us, double *read_us);
int fr_host_gather_direct(const fr_host_gather *g); /* 1 if reads use O_DIRECT */

#endif
