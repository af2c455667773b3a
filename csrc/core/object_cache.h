/*
 * A node-local cache of remote objects (fr_config.cache_dir): an object
 * read once over the network is kept as a plain local file, so that later
 * epochs read it with a file engine (io_uring, psync) instead. Knows
 * nothing of any engine: ctx.c decides what to look up and reads the bytes.
 *
 * Layout under the cache directory:
 *   index.lock        bytes [0, 8): the bytes the entries hold (a hint kept
 *                     by every writer; eviction recounts it); byte ranges of
 *                     it are the locks (below), never its data
 *   XX/ID.data        the object's bytes, exactly: a file engine reads it whole
 *   XX/ID.meta        the entry's record: magic, size, checksum, access
 *                     stamp, ETag (when known) and the full URL
 *   XX/ID.data.tmp,   being written by the holder of the entry's lock
 *   XX/ID.meta.tmp
 * ID is 32 hex digits of two 64-bit hashes of the entry's key: the
 * caller's scope (fr_ocache_open; for S3 the endpoint and a hash of the
 * access key id) and the URL ("s3://bucket/key"), XX its first two (256
 * folders keep directories small). The key in the record is compared on
 * every lookup, so a hash collision is a miss, never another object's
 * bytes. A hit re-checks no access right: whoever can read the directory
 * reads what any process fetched into it.
 *
 * Version and validation: an entry stands for one version of an object,
 * its size and the CRC-32 (zlib) of its bytes, plus the ETag the engine
 * got it with (fr_engine.sample_version).
 * A lookup checks the record (magic, URL), the data file's size against
 * the record (stat), and the size the caller expects when it knows one (a
 * size hint, e.g. from a listing): a changed size is a stale entry. The
 * reader of a hit checks the bytes it read against the checksum
 * (fr_ocache_verify), once per fr_ocache (see fr_ocache_lookup: later
 * reads check the size). Anything that fails is fetched again. An object
 * rewritten with the same size is detected only against a listing
 * (fr_ocache_drop_stale, before a reader starts): lookups stay free of
 * requests.
 *
 * Publishing: written to the .tmp names, then the data renamed into place
 * and then the record; the record is the commit (no record, no entry), and
 * a record that does not match its data fails the size or checksum check.
 * No fsync: after a crash of the machine an entry may hold lost bytes under
 * its final name, which the checksum catches (the cache is disposable;
 * fsync per object would cost a disk flush per miss).
 *
 * Locking between processes (torchrun ranks, DataLoader workers) and
 * contexts: open-file-description byte-range locks (F_OFD_SETLK) on one
 * byte of index.lock per stripe (FR_OCACHE_STRIPES, the ID's hash modulo):
 * the holder of an entry's stripe is its only writer, so one object is
 * fetched by one process at a time; the kernel drops the locks of a
 * process that dies (kill -9 included), and the next holder overwrites
 * (O_TRUNC) or eviction removes the .tmp files it left. Locks of one
 * fr_ocache do not exclude each other (one open file description): a
 * caller locks a stripe once per phase and unlocks every stripe it took at
 * the end of that phase. Callers that may wait (fr_ocache_lock) take
 * stripes in ascending order while holding no stripe taken out of order:
 * no deadlock between processes.
 *
 * Eviction: LRU by the records' access stamps (CLOCK_REALTIME ns, written
 * by lookups that read the record, at most once a second per entry; an
 * fr_ocache reads the record of an entry it remembers once per
 * FR_OCACHE_RECHECK_NS, so LRU is to the minute; atime is not used, being
 * off or relaxed on most mounts). When the counted bytes pass max_bytes,
 * fr_ocache_evict scans every record, removes orphans (temporaries and
 * data without a record whose stripe nobody holds) and the oldest entries
 * until the total is at most 90% of max_bytes; entries being written
 * (stripe held) are skipped.
 *
 * Thread safety: an fr_ocache is used by one thread at a time (its
 * context's); several fr_ocache on one directory, in one process or many,
 * are safe together (the locks above). Every function is reentrant.
 */
#ifndef FASTREAD_OBJECT_CACHE_H
#define FASTREAD_OBJECT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define FR_OCACHE_STRIPES 65536u
#define FR_OCACHE_ID_LEN 32 /* hex digits of an entry's ID */
/* Eviction stops at this fraction (per cent) of max_bytes. */
#define FR_OCACHE_EVICT_TO_PCT 90u

typedef struct fr_ocache fr_ocache;

typedef struct fr_ocache_entry {
    uint64_t size;
    uint32_t crc;
    /* This fr_ocache wrote the entry or checked its bytes against the
     * checksum before, and its record still names that version (size and
     * checksum): a reader checks the size alone (see fr_ocache_lookup). */
    int trusted;
} fr_ocache_entry;

/* Entries an fr_ocache remembers as checked (fr_ocache_trust), at most;
 * about 48 bytes each. Past it, entries are checked whole at every use. */
#define FR_OCACHE_KNOWN_MAX (1u << 18)
/* A remembered entry is found without touching the disk for this long
 * after its last check; then its record is read again (and its access
 * stamp renewed). */
#define FR_OCACHE_RECHECK_NS (60ull * 1000000000ull)

/* Opens (creating it and its index if need be) the cache at `dir`.
 * max_bytes 0: no limit. scope (NULL or "": none): what else than its URL
 * names an object for this fr_ocache's caller, one line (no '\n') under
 * 1024 bytes: an entry's key is the scope and the URL, so that callers of
 * other scopes (another S3 endpoint, other credentials: fr_engine's
 * cache_scope) share no entry. 0, or -errno and why in err. */
int fr_ocache_open(const char *dir, uint64_t max_bytes, const char *scope, fr_ocache **out,
                   char *err, size_t err_len);
void fr_ocache_close(fr_ocache *c);

/* The entry ID of `url` in c's scope: FR_OCACHE_ID_LEN hex digits and a
 * NUL into id. */
void fr_ocache_id(const fr_ocache *c, const char *url, char id[FR_OCACHE_ID_LEN + 1]);
/* The stripe (lock) of `url` in c's scope, in 0..FR_OCACHE_STRIPES-1. */
unsigned fr_ocache_stripe(const fr_ocache *c, const char *url);
/* Longest path fr_ocache_data_path writes, with its NUL. */
size_t fr_ocache_path_max(const fr_ocache *c);
/* The data file of `url`'s entry into out (fr_ocache_path_max bytes). */
void fr_ocache_data_path(const fr_ocache *c, const char *url, char *out);

/* 1 if `url` has a complete entry that passes the checks above
 * (want_size >= 0: the size the caller expects), with its size and
 * checksum in *e; 0 if not (none, stale, damaged, unreadable). Renews the
 * entry's access stamp.
 * Checksums cost more than reading a cached file (zlib's CRC-32 ran at
 * ~1.1 GB/s on the 2-core VM against ~6.7 GB/s for io_uring's reads of
 * cached 92 KiB files): so an fr_ocache remembers the entries it wrote or
 * checked (fr_ocache_trust, up to FR_OCACHE_KNOWN_MAX). One of those is
 * found with no system call for FR_OCACHE_RECHECK_NS after its last check,
 * then by its record again; while its record names the version checked,
 * e->trusted is set and the reader checks the size it read, not the
 * checksum. So every byte is checked once per process (a first epoch from
 * another process's entries costs a checksum pass); bytes damaged on disk
 * after that check go unnoticed for the life of the fr_ocache. */
int fr_ocache_lookup(fr_ocache *c, const char *url, int64_t want_size, fr_ocache_entry *e);
/* Remembers `url`'s entry e as checked (its bytes matched). */
void fr_ocache_trust(fr_ocache *c, const char *url, const fr_ocache_entry *e);
/* Forgets it: the next lookup reads the record, the next read checks all. */
void fr_ocache_forget(fr_ocache *c, const char *url);
/* 1 if `len` bytes are the entry's (size and checksum), else 0. */
int fr_ocache_verify(const fr_ocache_entry *e, const void *bytes, uint64_t len);

/* The entry's stripe: 1 taken, 0 held by another fr_ocache (try only),
 * or -errno. fr_ocache_lock waits for it. */
int fr_ocache_trylock(fr_ocache *c, unsigned stripe);
int fr_ocache_lock(fr_ocache *c, unsigned stripe);
void fr_ocache_unlock(fr_ocache *c, unsigned stripe);

/* Stores `len` bytes as `url`'s entry (replacing any), with `etag` (NULL
 * or "" when unknown). The caller holds the URL's stripe. 0 or -errno
 * (then no entry: the caller's bytes are unaffected). */
int fr_ocache_publish(fr_ocache *c, const char *url, const void *bytes, uint64_t len,
                      const char *etag);
/* Test hook: fr_ocache_publish that stops (returns -EINTR) after writing
 * `stop_after` bytes of the data's temporary file, as a writer killed
 * mid-write leaves it. */
int fr_ocache_publish_partial(fr_ocache *c, const char *url, const void *bytes, uint64_t len,
                              uint64_t stop_after);

/* Removes `url`'s entry if it is of another version than the store names
 * now (a listing's `version`, its ETag, NULL or "": unknown; `size` < 0:
 * unknown): the size differs, or both the entry and the listing have an
 * ETag and they differ (quotes and a W/ prefix aside). Takes the URL's
 * stripe (waits). 1 removed, 0 kept (or no entry), or -errno. */
int fr_ocache_drop_stale(fr_ocache *c, const char *url, const char *version, int64_t size);

/* The bytes the cache counts (index.lock's counter). */
uint64_t fr_ocache_usage(fr_ocache *c);
/* 1 if the count is over max_bytes (never without a limit). */
int fr_ocache_over(fr_ocache *c);
/* The scan above; call holding no stripe. Entries removed, or -errno. */
long fr_ocache_evict(fr_ocache *c);

#endif
