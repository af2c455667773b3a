/*
 * fastread_device_cache.cuh: the HBM page cache (hit, miss, CLOCK replacement), pins,
 * the hot-row cache and the locality order of a batch's ids.
 * Part of fastread_device.cuh: include that, not this (it supplies the shim,
 * the layout and the helpers this part uses; the build embeds the parts,
 * inlined in this order, as the one header NVRTC compiles).
 */
#ifndef FASTREAD_DEVICE_CACHE_CUH
#define FASTREAD_DEVICE_CACHE_CUH
#ifndef FASTREAD_DEVICE_CUH
#error "include fastread_device.cuh, not fastread_device_cache.cuh"
#endif

/* ----------------------------------------------------------------- cache */

enum { FR_HIT = 0, FR_OWN = 1, FR_BUSY = 2 };

/* ------------------------------------------------------------------ pins
 * A hit through the reference count costs two atomics and two fences on
 * the slot; in a hot gather every row is a hit, thousands of warps hit the
 * same few hundred slots, and those costs set the speed. Pins let
 * fastread's own gather read most hits with plain loads instead:
 *   - The host gives each gather an epoch E (result->epoch, and the word
 *     epoch_now that every evictor reads). A thread that has a slot safely
 *     (a reference on a hit, or EXCL as its loader) may pin it for E:
 *     pins[slot] = E << 32 | page, stored before the fence that precedes
 *     dropping the reference (or publishing the page).
 *   - An evictor, once it holds EXCL (refs was 0) and after its fence,
 *     skips a slot whose pin epoch is >= epoch_now. The pin store happened
 *     before the reference was dropped, and the evictor's CAS saw that drop,
 *     so the evictor sees the pin. A stale epoch_now is only ever older
 *     (smaller), which skips more, never less.
 *   - So a slot pinned for E holds the same page until gather E ends: a
 *     reader of gather E that finds pins[pt[page] - 1] == E << 32 | page
 *     (an acquire load: the row's loads come after it) may copy the row with
 *     no atomics and no fences. Any other answer takes the counted path.
 *   - At most pin_limit slots (half the cache) are pinned per gather, so a
 *     gather whose pages do not fit still finds victims. Between gathers
 *     the host moves epoch_now past E while users' kernels may run
 *     (fr_store_device_serve), so their misses can evict what E pinned.
 *   - Page numbers are kept in 32 bits: the host turns pins off for arrays
 *     of 2^32 pages or more. */

FR_DEV fr_u64 fr_pin_word(fr_u32 epoch, fr_u64 page)
{
    return ((fr_u64)epoch << 32) | (page & 0xFFFFFFFFull);
}

/* Pins `slot` (holding `page`, held by the caller) for gather `epoch`. */
FR_DEV void fr_cache_pin(const fr_dev_cache *c, fr_u32 slot, fr_u64 page, fr_u32 epoch)
{
    if (!epoch || !c->pins)
        return;
    fr_u64 want = fr_pin_word(epoch, page);
    if (fr_load64(&c->pins[slot]) == want)
        return;
    if (fr_load64(c->pinned) >= c->pin_limit || fr_atom_add64(c->pinned, 1) >= c->pin_limit)
        return;
    fr_store64(&c->pins[slot], want);
}

/* 1 and *slot when `page` sits in a slot pinned for gather `epoch`: read it
 * with no reference (see above). */
FR_DEV int fr_cache_pinned(const fr_dev_cache *c, fr_u64 page, fr_u32 epoch, fr_u32 *slot)
{
    fr_u32 e = fr_load32(&c->page_table[page]);
    if (e == 0 || e == FR_PT_LOADING)
        return 0;
    if (fr_load_acq64(&c->pins[e - 1]) != fr_pin_word(epoch, page))
        return 0;
    *slot = e - 1;
    return 1;
}

/* For an evictor holding EXCL on `slot`, after its fence. */
FR_DEV int fr_cache_pinned_now(const fr_dev_cache *c, fr_u32 slot)
{
    if (!c->pins)
        return 0;
    fr_u32 pe = (fr_u32)(fr_load64(&c->pins[slot]) >> 32);
    return pe != 0 && pe >= fr_load32(c->epoch_now);
}

/* Clock sweep for a slot no one holds: EXCL taken on it, or -1 after a
 * bounded number of steps found none (every slot looked at was held,
 * loading or recently used: the caller gives its claim back and retries).
 * The bound keeps thousands of loaders from hammering the hand when the
 * cache is small; the hand is shared, so the sweep still goes round. */
FR_DEV fr_i64 fr_cache_victim(const fr_dev_cache *c)
{
    fr_u64 steps = 2ull * c->nslots + 32;
    if (steps > 512)
        steps = 512;
    for (fr_u64 k = 0; k < steps; k++) {
        fr_u32 h = fr_atom_add32(c->hand, 1) % c->nslots;
        if (fr_load32(&c->clock_bits[h])) {
            fr_store32(&c->clock_bits[h], 0); /* second chance */
            continue;
        }
        if (fr_load32(&c->refs[h]) == 0 && fr_atom_cas32(&c->refs[h], 0, FR_REF_EXCL) == 0) {
            fr_fence();
            if (fr_cache_pinned_now(c, h)) { /* the running gather reads it unreferenced */
                fr_atom_add32(&c->refs[h], (fr_u32)0 - FR_REF_EXCL);
                continue;
            }
            return h;
        }
    }
    return -1;
}

/* One look at page `page`: FR_HIT (a reference taken on *slot), FR_OWN
 * (this thread loads it into *slot: EXCL held, page table LOADING), or
 * FR_BUSY (another thread is loading it or the slot moved: retry). */
FR_DEV int fr_cache_lookup_e(const fr_dev_cache *c, fr_u64 page, fr_u32 *slot,
                             fr_u64 *evictions, fr_u32 epoch)
{
    fr_u32 e = fr_load32(&c->page_table[page]);
    if (e == FR_PT_LOADING)
        return FR_BUSY;
    if (e != 0) {
        fr_u32 sl = e - 1;
        fr_u32 r = fr_atom_add32(&c->refs[sl], 1);
        if (!(r & FR_REF_EXCL)) {
            fr_fence();
            if (fr_load64(&c->tags[sl]) == page) {
                if (!fr_load32(&c->clock_bits[sl]))
                    fr_store32(&c->clock_bits[sl], 1);
                fr_cache_pin(c, sl, page, epoch); /* before the release's fence */
                *slot = sl;
                return FR_HIT;
            }
        }
        fr_atom_add32(&c->refs[sl], (fr_u32)-1);
        return FR_BUSY;
    }
    if (fr_atom_cas32(&c->page_table[page], 0, FR_PT_LOADING) != 0)
        return FR_BUSY;
    fr_i64 v = fr_cache_victim(c);
    if (v < 0) {
        fr_store32(&c->page_table[page], 0);
        return FR_BUSY;
    }
    fr_u32 sl = (fr_u32)v;
    fr_u64 old = fr_load64(&c->tags[sl]);
    if (old != FR_TAG_NONE) {
        fr_store32(&c->page_table[old], 0); /* only the EXCL holder changes it */
        (*evictions)++;
    }
    fr_store64(&c->tags[sl], page);
    fr_fence();
    *slot = sl;
    return FR_OWN;
}

FR_DEV int fr_cache_lookup(const fr_dev_cache *c, fr_u64 page, fr_u32 *slot, fr_u64 *evictions)
{
    return fr_cache_lookup_e(c, page, slot, evictions, 0);
}

/* The loader's page is in its slot: readers may have it (the loader keeps
 * one reference). */
FR_DEV void fr_cache_publish_e(const fr_dev_cache *c, fr_u64 page, fr_u32 slot, fr_u32 epoch)
{
    fr_fence(); /* the page's bytes before the pin and the page table entry */
    fr_cache_pin(c, slot, page, epoch);
    fr_store32(&c->clock_bits[slot], 1);
    fr_atom_add32(&c->refs[slot], 1u - FR_REF_EXCL);
    fr_fence();
    fr_store32(&c->page_table[page], slot + 1);
}

FR_DEV void fr_cache_publish(const fr_dev_cache *c, fr_u64 page, fr_u32 slot)
{
    fr_cache_publish_e(c, page, slot, 0);
}

/* The load failed: the slot goes back empty and the page absent. */
FR_DEV void fr_cache_abandon(const fr_dev_cache *c, fr_u64 page, fr_u32 slot)
{
    fr_store64(&c->tags[slot], FR_TAG_NONE);
    fr_fence();
    fr_store32(&c->page_table[page], 0);
    fr_atom_add32(&c->refs[slot], (fr_u32)0 - FR_REF_EXCL);
}

FR_DEV void fr_cache_release(const fr_dev_cache *c, fr_u32 slot)
{
    fr_fence();
    fr_atom_add32(&c->refs[slot], (fr_u32)-1);
}

enum { FR_GOT_HIT = 0, FR_GOT_MISS = 1, FR_GOT_WAITED = 2, FR_GOT_PINNED = 3 };

/* Page `page` in the cache, loading it if needed (one thread), for gather
 * `epoch` (0: none). >= 0 (FR_GOT_PINNED: the slot is pinned for epoch, no
 * reference held; other FR_GOT_*: a reference held on *slot, release it with
 * fr_cache_release) or a negative errno. */
FR_DEV int fr_cache_acquire_e(const fr_dev_store *s, fr_u64 page, fr_u32 *slot,
                              fr_dev_counts *cnt, fr_u32 epoch)
{
    if (epoch && s->cache.pins && fr_cache_pinned(&s->cache, page, epoch, slot))
        return FR_GOT_PINNED;
    fr_dev_waiter w;
    int waited = 0;
    for (;;) {
        int r = fr_cache_lookup_e(&s->cache, page, slot, &cnt->c[FR_CNT_EVICTIONS], epoch);
        if (r == FR_HIT)
            return waited ? FR_GOT_WAITED : FR_GOT_HIT;
        if (r == FR_OWN) {
            int rc = fr_dev_fetch_page(s, page, fr_dev_slot_data(&s->cache, *slot),
                                       fr_dev_page_len(s, page), cnt);
            if (rc) {
                fr_cache_abandon(&s->cache, page, *slot);
                return rc;
            }
            fr_cache_publish_e(&s->cache, page, *slot, epoch);
            cnt->c[FR_CNT_MISSES]++;
            return FR_GOT_MISS;
        }
        if (!waited) {
            waited = 1;
            fr_dev_wait_start(s, &w, 2048);
        }
        int rc = fr_dev_wait_step(s, &w);
        if (rc)
            return rc;
    }
}

FR_DEV int fr_cache_acquire(const fr_dev_store *s, fr_u64 page, fr_u32 *slot,
                            fr_dev_counts *cnt)
{
    return fr_cache_acquire_e(s, page, slot, cnt, 0);
}

/* Where row `id` is readable: host tier or (acquired) cache page. Returns
 * 0 with *src set, or -errno; *held is set to the slot+1 to release (0:
 * nothing held). One thread. */
FR_DEV int fr_dev_row_src(const fr_dev_store *s, fr_u64 id, const fr_u8 **src, fr_u32 *held,
                          fr_dev_counts *cnt, fr_u32 epoch)
{
    *held = 0;
    if (s->host_rows) {
        fr_i64 hs = s->host_slot ? (fr_i64)s->host_slot[id] : (fr_i64)id;
        if (hs >= 0) {
            *src = s->host_rows + (fr_u64)hs * s->row_bytes;
            cnt->c[FR_CNT_HOST_TIER]++;
            return 0;
        }
    }
    fr_u64 page = id / s->rows_per_page;
    fr_u32 slot = 0; /* set by acquire whenever rc >= 0 */
    int rc = fr_cache_acquire_e(s, page, &slot, cnt, epoch);
    if (rc < 0)
        return rc;
    if (rc == FR_GOT_HIT || rc == FR_GOT_PINNED)
        cnt->c[FR_CNT_HITS]++;
    else if (rc == FR_GOT_WAITED)
        cnt->c[FR_CNT_COALESCED]++;
    *held = rc == FR_GOT_PINNED ? 0 : slot + 1;
    *src = fr_dev_slot_data(&s->cache, slot) + (id % s->rows_per_page) * s->row_bytes;
    return 0;
}

/* Row `id` to dst (one thread) for gather `epoch` (0: users' kernels, which
 * never pin): 0, or -errno (FR_DEV_ERANGE for a bad id). */
FR_DEV int fr_dev_read_row_e(const fr_dev_store *s, fr_i64 id, void *dst, fr_dev_counts *cnt,
                             fr_u32 epoch)
{
    if (id < 0 || (fr_u64)id >= s->rows)
        return FR_DEV_ERANGE;
    const fr_u8 *src;
    fr_u32 held;
    int rc = fr_dev_row_src(s, (fr_u64)id, &src, &held, cnt, epoch);
    if (rc)
        return rc;
    fr_copy_bytes((fr_u8 *)dst, src, s->row_bytes);
    if (held)
        fr_cache_release(&s->cache, held - 1);
    return 0;
}

/* Row `id` to dst (one thread): 0, or -errno (FR_DEV_ERANGE for a bad id). */
FR_DEV int fr_dev_read_row(const fr_dev_store *s, fr_i64 id, void *dst, fr_dev_counts *cnt)
{
    return fr_dev_read_row_e(s, id, dst, cnt, 0);
}

/* ------------------------------------------------------------ hot rows
 * Sparse batches over an array larger than the page cache read their rows
 * on their own (row fetches, fr_dev_fetch_rows_warp) and leave the page
 * cache alone: a 64 KiB page brought for one row would evict pages other
 * rows need. Rows asked for again (power-law ids: neighbour sampling,
 * embedding lookups) were then read from storage every time, and their
 * pages cannot simply be cached instead: the hot rows of a power law over a
 * shuffled table are one or two per page (1M zipf(1.2) ids over 16M rows
 * touch 82k 64 KiB pages; a 1 GiB cache holds 16k). So rows are kept by
 * row, in 8-way sets, with TinyLFU's admission:
 *   - Frequency: a count-min sketch (2 rows of 32-bit counters, 4 per slot
 *     each) behind a doorkeeper (one bit a row, 32 per slot): a row's first
 *     request since the last reset sets its bit, the rest count in the
 *     sketch, so rows seen once do not fill the counters until everything
 *     reads as a repeat. The estimate is the bit plus the smaller counter.
 *     Counted: the rows row fetches bring (a warp's lanes wanting one row
 *     once, with their number), and a cached row's first hit since it went
 *     in or since a sweep cleared its reference bit (fr_rows_hit_first): a
 *     row that keeps being asked for gains frequency while cached, and a
 *     gather whose rows are all referenced costs no atomics. The host
 *     halves every counter and empties the doorkeeper after 10 x slots
 *     fetched rows (TinyLFU's reset: fr_rows_age, a launch of its own
 *     before the pass, so no estimate reads a half-halved sketch).
 *   - Candidates: a fetched row whose estimate reaches the gather's
 *     rows_list_from (fr_dev_result) is listed with its output position,
 *     about once per gather (`seen`: epoch and row hash per word; a
 *     collision lists a row twice, never holds it back), at most adm_cap
 *     (slots / 2) a gather (once the list is full nothing more is marked or
 *     claimed). rows_list_from is 1 while the cache has room
 *     (fr_rows_list_from: under 7/8 of the slots filled), then `threshold`
 *     (2: asked for before). Listing happens after the warp's ring cell is
 *     released; once the cache is full a row seen once costs one atomic on
 *     its doorkeeper word and nothing else.
 *   - Admission: after the gather, fr_rows_admit (on the same stream: no
 *     gather of ours reads these arrays meanwhile) copies each candidate
 *     from the output into its set: a free way; else, for a row estimated
 *     `threshold` times or more, a way not hit since the last sweep (second
 *     chance: a candidate that finds every way of a full set referenced
 *     clears their bits) holding the least frequent row, replaced only by a
 *     row estimated more frequent (TinyLFU: a row seen twice never pushes
 *     out a hotter one). A row seen once only ever takes a free way, so a
 *     one-off scan evicts nothing by itself, and only from a gather whose
 *     list did not overflow (fr_rows_pass_floor: a batch with more distinct
 *     rows than adm_cap, uniform ids, copies in only rows counted before).
 *     Measured with the emulation of csrc/tests/test_gather_rows.c at the
 *     benchmark's scale (1M zipf(1.2) ids over 16M rows, 512k slots;
 *     `test_gather_rows full`), against the policy of 548de3b (threshold 2
 *     for every candidate, 4 ways, no doorkeeper, hits not counted): the
 *     first repeat found 89.0% of its rows cached (rows asked once in the
 *     first gather were listed only on the repeat) against 100.0% now; the
 *     second sent 583 of its 31,250 warps to storage (rows whose 4-way set
 *     was full) against 20; after a one-off scan of 4 x slots rows, 3,060
 *     warps against 24 (the scan's rows, their counters filled by the scan
 *     itself, had pushed out rows of the hot set).
 *   - Lookup: fastread's gathers look there after the host tier, with plain
 *     loads (two 32-byte sectors: the set's 8 tags); a hit on a row whose
 *     reference bit is clear sets it (a store) and counts once. Users'
 *     kernels (epoch 0) never read it: they may run while fr_rows_admit does.
 * Memory: a quarter of cache_bytes for the rows (taken from the page
 * cache), plus per slot 8 (tag) + 32 (sketch) + 8 (half a candidate) + 4
 * (seen) + 4 (doorkeeper) bytes. Only where row fetches can happen (backend
 * proxy, an array larger than the cache, not all in the host tier);
 * FASTREAD_GATHER_ADMIT=off turns it off. */
#define FR_ROWS_WAYS 8u
#define FR_RTAG_REF 0x8000000000000000ull  /* hit since the last admission pass */
#define FR_RTAG_BUSY 0x7FFFFFFFFFFFFFFFull /* fr_rows_admit is filling the slot */
#define FR_ROWS_COUNT_MAX 255u             /* counters saturate (TinyLFU's small counters) */

FR_DEV fr_u64 fr_mix64(fr_u64 x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The first of row id's FR_ROWS_WAYS slots. */
FR_DEV fr_u32 fr_rows_set(const fr_dev_rows *r, fr_u64 id)
{
    return (fr_u32)fr_mix64(id) & r->slot_mask & ~(FR_ROWS_WAYS - 1);
}

/* The slot holding row id, or -1 (plain loads: tags change only between
 * fastread's gathers). *tag: what the slot's tag word holds. */
FR_DEV fr_i64 fr_rows_find(const fr_dev_rows *r, fr_u64 id, fr_u64 *tag)
{
    fr_u32 w = fr_rows_set(r, id);
#ifdef FR_GPU
    /* The set's 64 bytes in four 16-byte loads (sets start at multiples of
     * 64 bytes of a cuMemAlloc'ed array). */
    const ulonglong2 *t2 = (const ulonglong2 *)(r->tags + w);
    fr_i64 at = -1;
#pragma unroll
    for (fr_u32 k = 0; k < FR_ROWS_WAYS / 2; k++) {
        ulonglong2 p = t2[k];
        if ((p.x & ~FR_RTAG_REF) == id + 1) {
            *tag = p.x;
            at = (fr_i64)(w + 2 * k);
        }
        if ((p.y & ~FR_RTAG_REF) == id + 1) {
            *tag = p.y;
            at = (fr_i64)(w + 2 * k + 1);
        }
    }
    return at;
#else
    for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++) {
        fr_u64 t = fr_load64(&r->tags[w + k]);
        if ((t & ~FR_RTAG_REF) == id + 1) {
            *tag = t;
            return (fr_i64)(w + k);
        }
    }
    return -1;
#endif
}

FR_DEV void fr_rows_counters(const fr_dev_rows *r, fr_u64 id, fr_u32 **c0, fr_u32 **c1)
{
    fr_u64 h = fr_mix64(id ^ 0x9E3779B97F4A7C15ull);
    *c0 = &r->sketch[h & r->width_mask];
    *c1 = &r->sketch[(fr_u64)r->width_mask + 1 + ((h >> 32) & r->width_mask)];
}

/* Row id's doorkeeper bit: *w's bit `*bit`. */
FR_DEV void fr_rows_door(const fr_dev_rows *r, fr_u64 id, fr_u32 **w, fr_u32 *bit)
{
    fr_u64 h = fr_mix64(id ^ 0x2545F4914F6CDD1Dull);
    *w = &r->door[(h >> 5) & r->door_mask];
    *bit = 1u << (h & 31);
}

/* Row id's estimated count: its doorkeeper bit plus the smaller of its two
 * counters. */
FR_DEV fr_u32 fr_rows_estimate(const fr_dev_rows *r, fr_u64 id)
{
    fr_u32 *c0, *c1, *w, bit;
    fr_rows_counters(r, id, &c0, &c1);
    fr_rows_door(r, id, &w, &bit);
    fr_u32 a = fr_load32(c0), b = fr_load32(c1);
    return (a < b ? a : b) + ((fr_load32(w) & bit) != 0);
}

FR_DEV fr_u32 fr_rows_bump(fr_u32 *c, fr_u32 k)
{
    fr_u32 v = fr_load32(c);
    if (v >= FR_ROWS_COUNT_MAX || k == 0)
        return v; /* saturated (or nothing to add): no atomic */
    return fr_atom_add32(c, k) + k;
}

/* Counts k requests of row id; its estimate after them. The first request
 * since the last reset only sets the doorkeeper bit (TinyLFU's doorkeeper:
 * rows seen once stay out of the sketch, so a stream of them does not fill
 * its counters until every row reads as a repeat); the rest count in the
 * sketch. */
FR_DEV fr_u32 fr_rows_note(const fr_dev_rows *r, fr_u64 id, fr_u32 k)
{
    fr_u32 *c0, *c1, *w, bit;
    fr_rows_counters(r, id, &c0, &c1);
    fr_rows_door(r, id, &w, &bit);
    int seen = (fr_load32(w) & bit) != 0 || (fr_atom_or32(w, bit) & bit) != 0;
    fr_u32 add = seen ? k : k - 1;
    fr_u32 a = fr_rows_bump(c0, add), b = fr_rows_bump(c1, add);
    return (a < b ? a : b) + 1;
}

/* 1 when the caller lists row id in gather `epoch`: its estimate `est`
 * reached `from` (the gather's rows_list_from; 0: the threshold) and, as
 * far as `seen` knows, no one listed it in this gather yet. A seen word
 * holds the low 16 bits of the epoch and 16 bits of the row's hash: a row
 * whose word another row took is listed again (a duplicate the pass
 * skips), never held back. */
FR_DEV int fr_rows_mark(const fr_dev_rows *r, fr_u64 id, fr_u32 est, fr_u32 epoch, fr_u32 from)
{
    if (est < (from ? from : r->threshold) || !epoch)
        return 0;
    /* The list is full (fr_rows_put drops what comes after): no seen word
     * exchanged, no claim on the counter. A uniform 1M batch lists at first
     * sight until here (adm_cap), not its 1M rows. */
    if (fr_load64(r->adm_n) >= r->adm_cap)
        return 0;
    fr_u64 h = fr_mix64(id ^ 0xD1B54A32D192ED03ull);
    fr_u32 *w = &r->seen[h & r->seen_mask];
    fr_u32 v = (epoch << 16) | (fr_u32)(h >> 48);
    return fr_load32(w) != v && fr_atom_xchg32(w, v) != v;
}

/* Candidate i (claimed from adm_n): row id at output position pos;
 * past adm_cap, dropped. */
FR_DEV void fr_rows_put(const fr_dev_rows *r, fr_u64 i, fr_u64 id, fr_u64 pos)
{
    if (i >= r->adm_cap)
        return;
    fr_store64(&r->adm[2 * i], id);
    fr_store64(&r->adm[2 * i + 1], pos);
}

/* The host's side of the policy, here so that the emulation in
 * csrc/tests/test_gather_rows.c runs the rules gather_device_rows.c does.
 * A gather lists rows at first sight while the passes have filled under
 * 7/8 of the slots (`filled`; with 8-way sets the last free ways are spread
 * over sets most of whose rows are in), then from the threshold on. */
FR_DEV fr_u32 fr_rows_list_from(const fr_dev_rows *r, fr_u64 filled)
{
    fr_u64 slots = (fr_u64)r->slot_mask + 1;
    return filled < slots - slots / 8 ? 1u : r->threshold;
}

/* The least estimate the pass admits, from the candidates the gather
 * listed (`listed`: the list's counter, which counts past adm_cap). A list
 * that overflowed came from a batch with more distinct rows than half the
 * slots: no working set that fits, so rows seen once (listed at first
 * sight) are copied in only while a batch's distinct rows fit the list,
 * and from an overflowing one only rows counted before go in (the
 * threshold). On the GPU (nvidia-h200, 16M x 512 B rows, 1 GiB cache, a
 * fresh store each gather) a warm uniform 1M gather listed every row and
 * copied 259,654 of them into the cache, never to be asked again: 20.7M
 * rows/s against 32-51M before first-sight listing. A power-law batch's
 * distinct rows fit (1M zipf(1.2) ids: ~133k of 256k), so it is still
 * resident after one gather. */
FR_DEV fr_u32 fr_rows_pass_floor(const fr_dev_rows *r, fr_u64 listed)
{
    return listed >= r->adm_cap ? r->threshold : 0u;
}

/* TinyLFU's reset is due (fr_rows_age) after 10 x slots counted rows. */
FR_DEV int fr_rows_age_due(const fr_dev_rows *r, fr_u64 noted)
{
    return noted >= 10 * ((fr_u64)r->slot_mask + 1);
}

/* A hit on slot rs (row id) whose reference bit is clear: the bit set
 * (tags are read only by fastread's gathers: a plain store) and the hit
 * counted once in the sketch, so a row that keeps being asked for gains
 * frequency while cached, and a newcomer that merely looks frequent to a
 * crowded sketch does not push it out. Out of line on the GPU: the hot
 * path's registers stay as they were. */
#ifdef FR_GPU
static __device__ __noinline__
#else
static inline
#endif
void fr_rows_hit_first(const fr_dev_rows *r, fr_i64 rs, fr_u64 id, fr_u64 tag)
{
#ifdef FR_GPU
    r->tags[rs] = tag | FR_RTAG_REF;
#else
    fr_store64(&r->tags[rs], tag | FR_RTAG_REF); /* host threads play warps */
#endif
    (void)fr_rows_note(r, id, 1);
}

/* What fr_rows_admit_one did. */
enum { FR_ROWS_OUT = 0, FR_ROWS_FILLED = 1, FR_ROWS_REPLACED = 2 };

/* Admits row id, its bytes at src, if the policy lets it in (one thread,
 * while no gather of ours runs; other threads of the pass admit other rows
 * at the same time): FR_ROWS_FILLED (into a free way), FR_ROWS_REPLACED or
 * FR_ROWS_OUT.
 * A set with a way another thread is filling (BUSY) is looked at again
 * until that thread is done, which it always is soon (it copies one row
 * and waits for nothing): the pass runs every candidate at once, and with
 * a first gather's ~130k candidates over 65k sets most share a set with
 * another. Giving up there (a first version) left a third of the
 * candidates for later gathers; so did a second one that gave up after 64
 * looks, BUSY ones included, where one row's copy outlasts them. Those
 * waits are bounded by time only (FR_ROWS_BUSY_NS, a guard, never reached
 * by a pass that works); losing a CAS (another thread took the way) counts
 * as a try. Waiting on BUSY rather than taking another free way keeps a
 * row listed twice from going in twice (a version that did that: 1,814
 * admitted of 1,500 rows). */
#define FR_ROWS_ADMIT_TRIES 64
#define FR_ROWS_BUSY_NS 10000000ull
FR_DEV int fr_rows_admit_one(const fr_dev_rows *r, fr_u64 row_bytes, fr_u64 id, const fr_u8 *src,
                             fr_u32 floor)
{
    fr_u32 w = fr_rows_set(r, id);
    fr_u32 est = fr_rows_estimate(r, id); /* the sketch holds still during the pass */
    if (est < floor)
        return FR_ROWS_OUT; /* fr_rows_pass_floor: no tag read, no copy */
    fr_u64 busy_since = 0;
    for (int lost = 0; lost < FR_ROWS_ADMIT_TRIES;) {
        fr_u64 t[FR_ROWS_WAYS];
        fr_u32 v = FR_ROWS_WAYS;
        int busy = 0;
        for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++) {
            t[k] = fr_load64(&r->tags[w + k]);
            if ((t[k] & ~FR_RTAG_REF) == id + 1)
                return FR_ROWS_OUT; /* already in */
            busy |= t[k] == FR_RTAG_BUSY;
            if (t[k] == 0 && v == FR_ROWS_WAYS)
                v = k;
        }
        if (busy) {
            /* A way is being filled, maybe with this very row (listed twice):
             * taking another free way could keep it twice. Look again. */
            fr_u64 now = fr_dev_now_ns();
            if (!busy_since)
                busy_since = now;
            else if (now - busy_since > FR_ROWS_BUSY_NS)
                return FR_ROWS_OUT;
            fr_pause();
            continue;
        }
        if (v == FR_ROWS_WAYS) { /* full */
            if (est < r->threshold)
                return FR_ROWS_OUT; /* seen once: free ways only (scans evict nothing) */
            /* The least frequent way not hit lately. */
            fr_u32 least = 0xFFFFFFFFu;
            for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++) {
                if (t[k] & FR_RTAG_REF)
                    continue;
                fr_u32 e = fr_rows_estimate(r, t[k] - 1);
                if (e < least) {
                    least = e;
                    v = k;
                }
            }
            if (v == FR_ROWS_WAYS) { /* every way hit since the last pass: second chance */
                for (fr_u32 k = 0; k < FR_ROWS_WAYS; k++)
                    fr_atom_cas64(&r->tags[w + k], t[k], t[k] & ~FR_RTAG_REF);
                return FR_ROWS_OUT;
            }
            if (est <= least)
                return FR_ROWS_OUT; /* TinyLFU: only a more frequent row replaces one */
        }
        if (fr_atom_cas64(&r->tags[w + v], t[v], FR_RTAG_BUSY) != t[v]) {
            lost++; /* another thread took the way first: look again */
            continue;
        }
        fr_copy_bytes(r->data + (fr_u64)(w + v) * row_bytes, src, row_bytes);
        fr_fence();
        fr_store64(&r->tags[w + v], id + 1);
        return t[v] == 0 ? FR_ROWS_FILLED : FR_ROWS_REPLACED;
    }
    return FR_ROWS_OUT; /* a set this contended waits for the next pass */
}

/* ------------------------------------------------------- locality order
 * GPU threads reading page-locked host memory over PCIe go through an
 * address translation whose reach is about 1 GiB (measured on an H100 with
 * bench/gather/probe_hosttier.cu: random 512-byte rows run at PCIe line rate,
 * 98M rows/s, from tables up to 1 GiB, then fall to 54M at 2 GiB and 32M at
 * 8 GiB, however the memory was allocated, huge pages included). The same
 * 8 GiB gather with its ids grouped into buckets of 16-128 MiB of the table
 * runs at 92-97M rows/s. So gathers from a large host tier first order the
 * ids by bucket (a counting sort: fr_order_count, then fr_order_place) and
 * then read rows in that order, each written to its own position. Order
 * within a bucket does not matter, so the sort is neither stable nor exact.
 * Ids out of range go to bucket 0; the gather reports them. */
#define FR_ORDER_MAX_BUCKETS 1024u

FR_DEV fr_u32 fr_order_bucket(fr_i64 id, fr_u64 rows, fr_u32 shift, fr_u32 nbuckets)
{
    fr_u64 b = (id < 0 || (fr_u64)id >= rows) ? 0 : (fr_u64)id >> shift;
    return b < nbuckets ? (fr_u32)b : nbuckets - 1;
}

FR_DEV fr_i64 fr_load_id(const void *ids, int id_bytes, fr_u64 i)
{
    return id_bytes == 4 ? (fr_i64)((const fr_i32 *)ids)[i] : ((const fr_i64 *)ids)[i];
}

#endif /* FASTREAD_DEVICE_CACHE_CUH */
