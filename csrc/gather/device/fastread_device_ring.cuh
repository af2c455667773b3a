/*
 * fastread_device_ring.cuh: the submission ring (GPU side, then the host side the proxy
 * threads use) and the backend fetches that go through it.
 * Part of fastread_device.cuh: include that, not this (it supplies the shim,
 * the layout and the helpers this part uses; the build embeds the parts,
 * inlined in this order, as the one header NVRTC compiles).
 */
#ifndef FASTREAD_DEVICE_RING_CUH
#define FASTREAD_DEVICE_RING_CUH
#ifndef FASTREAD_DEVICE_CUH
#error "include fastread_device.cuh, not fastread_device_ring.cuh"
#endif

/* ------------------------------------------------------------------ ring */

/* Takes a ticket and submits a read of `page` (len bytes). Waits (up to the
 * timeout) while the ring is full; *full_waits counts that. 0 or -errno;
 * *ticket names the request for fr_ring_wait / fr_ring_release. */
FR_DEV int fr_ring_claim(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 t,
                         fr_u64 *full_waits)
{
    fr_dev_ring_cell *c = &r->cells[t & ((1ull << r->log2_entries) - 1)];
    fr_u64 lap = t >> r->log2_entries;
    if (fr_sys_load_acq64(&c->seq) != 4 * lap) {
        (*full_waits)++;
        fr_dev_waiter w;
        fr_dev_wait_start(s, &w, 8192);
        while (fr_sys_load_acq64(&c->seq) != 4 * lap) {
            int rc = fr_dev_wait_step(s, &w);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Submits the request of claimed ticket t (its staging already written,
 * for row lists). */
FR_DEV void fr_ring_publish(const fr_dev_ring *r, fr_u64 t, fr_u64 page, fr_u32 len)
{
    fr_dev_ring_cell *c = &r->cells[t & ((1ull << r->log2_entries) - 1)];
    c->page = page;
    c->len = len;
    fr_sys_store_rel64(&c->seq, 4 * (t >> r->log2_entries) + 1);
}

FR_DEV int fr_ring_submit_at(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 page,
                             fr_u32 len, fr_u64 t, fr_u64 *full_waits)
{
    int rc = fr_ring_claim(s, r, t, full_waits);
    if (rc == 0)
        fr_ring_publish(r, t, page, len);
    return rc;
}

FR_DEV int fr_ring_submit(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 page,
                          fr_u32 len, fr_u64 *ticket, fr_u64 *full_waits)
{
    *ticket = fr_atom_add64(r->tail, 1);
    return fr_ring_submit_at(s, r, page, len, *ticket, full_waits);
}

/* Waits for request `ticket`: its status (0 or -errno from the host), or a
 * timeout / cancel. The cell stays ours until fr_ring_release. */
FR_DEV int fr_ring_wait(const fr_dev_store *s, const fr_dev_ring *r, fr_u64 ticket)
{
    fr_dev_ring_cell *c = &r->cells[ticket & ((1ull << r->log2_entries) - 1)];
    fr_u64 done = 4 * (ticket >> r->log2_entries) + 3;
    if (fr_sys_load_acq64(&c->seq) != done) {
        /* A page read by the host takes tens of microseconds: polls every
         * few microseconds at most. */
        fr_dev_waiter w;
        fr_dev_wait_start(s, &w, 8192);
        while (fr_sys_load_acq64(&c->seq) != done) {
            int rc = fr_dev_wait_step(s, &w);
            if (rc)
                return rc;
        }
    }
    return *(volatile fr_i32 *)&c->status;
}

FR_DEV const fr_u8 *fr_ring_staging(const fr_dev_ring *r, fr_u64 ticket)
{
    return r->staging + (ticket & ((1ull << r->log2_entries) - 1)) * (fr_u64)r->page_bytes;
}

/* Rows one row-list request carries: as many as its staging holds, at most
 * FR_RING_MAX_ROWS (0 when a row is larger than a page: no row fetches). */
FR_DEV fr_u32 fr_ring_rows_per_request(const fr_dev_ring *r, fr_u64 row_bytes)
{
    fr_u64 k = row_bytes ? r->page_bytes / row_bytes : 0;
    return k < FR_RING_MAX_ROWS ? (fr_u32)k : FR_RING_MAX_ROWS;
}

/* Frees the request's cell for the next lap. */
FR_DEV void fr_ring_release(const fr_dev_ring *r, fr_u64 ticket)
{
    fr_dev_ring_cell *c = &r->cells[ticket & ((1ull << r->log2_entries) - 1)];
    fr_sys_store_rel64(&c->seq, 4 * ((ticket >> r->log2_entries) + 1));
}

/* ------------------------------------------------------ backend fetches */

#if defined(FR_FETCH_EXTERN)
/* The backend's device half (gather_backend.h), compiled in after this
 * header. */
FR_DEV int fr_backend_fetch_page(const fr_dev_store *s, fr_u64 page, fr_u8 *dst, fr_u32 len,
                                 fr_u64 deadline_ns);
#endif

/* Brings `len` bytes of page `page` into dst (one thread). */
FR_DEV int fr_dev_fetch_page(const fr_dev_store *s, fr_u64 page, fr_u8 *dst, fr_u32 len,
                             fr_dev_counts *cnt)
{
#if defined(FR_FETCH_EXTERN)
    (void)cnt;
    return fr_backend_fetch_page(s, page, dst, len, fr_dev_now_ns() + s->timeout_ns);
#else
    const fr_dev_ring *r = &s->fetch.ring;
    fr_u64 t;
    int rc = fr_ring_submit(s, r, page, len, &t, &cnt->c[FR_CNT_RING_FULL]);
    if (rc)
        return rc;
    rc = fr_ring_wait(s, r, t);
    if (rc == FR_DEV_ETIMEDOUT || rc == FR_DEV_ECANCELED)
        return rc; /* the cell stays taken: the host resets the ring */
    if (rc == 0)
        fr_copy_bytes(dst, fr_ring_staging(r, t), len);
    fr_ring_release(r, t);
    return rc;
#endif
}

/* Rows ids[0..n) read on their own (row fetches) into dsts[i], by one
 * thread, as one row-list request (n <= fr_ring_rows_per_request): the
 * host-emulated kernel's counterpart of fr_dev_fetch_rows_warp. */
FR_DEV int fr_dev_fetch_rows(const fr_dev_store *s, const fr_u64 *ids, fr_u32 n,
                             fr_u8 *const *dsts, fr_dev_counts *cnt)
{
#if defined(FR_FETCH_EXTERN)
    (void)s;
    (void)ids;
    (void)n;
    (void)dsts;
    (void)cnt;
    return FR_DEV_EIO; /* row fetches go through the ring only */
#else
    const fr_dev_ring *r = &s->fetch.ring;
    const fr_u64 rb = s->row_bytes;
    if (n == 0 || n > fr_ring_rows_per_request(r, rb))
        return FR_DEV_EIO;
    fr_u64 t = fr_atom_add64(r->tail, 1);
    int rc = fr_ring_claim(s, r, t, &cnt->c[FR_CNT_RING_FULL]);
    if (rc)
        return rc;
    fr_u64 *list = (fr_u64 *)fr_ring_staging(r, t);
    for (fr_u32 i = 0; i < n; i++)
        fr_store64(&list[i], ids[i] * rb);
    fr_ring_publish(r, t, rb, FR_RING_ROWS | n);
    rc = fr_ring_wait(s, r, t);
    if (rc == FR_DEV_ETIMEDOUT || rc == FR_DEV_ECANCELED)
        return rc; /* the cell stays taken: the host resets the ring */
    if (rc == 0) {
        for (fr_u32 i = 0; i < n; i++)
            fr_copy_bytes(dsts[i], fr_ring_staging(r, t) + i * rb, rb);
        cnt->c[FR_CNT_DIRECT_ROWS] += n;
    }
    fr_ring_release(r, t);
    return rc;
#endif
}

/* -------------------------------------------------- host side of the ring */
#ifndef FR_GPU
/* For the proxy's service threads (and tests): `r` holds host addresses. */

static inline fr_dev_ring_cell *fr_ring_host_cell(const fr_dev_ring *r, fr_u64 pos)
{
    return &r->cells[pos & ((1ull << r->log2_entries) - 1)];
}

/* 1 if request `pos` (a ticket) has been submitted and not yet served. */
static inline int fr_ring_host_submitted(const fr_dev_ring *r, fr_u64 pos)
{
    return __atomic_load_n(&fr_ring_host_cell(r, pos)->seq, __ATOMIC_ACQUIRE) ==
           4 * (pos >> r->log2_entries) + 1;
}

static inline fr_u8 *fr_ring_host_staging(const fr_dev_ring *r, fr_u64 pos)
{
    return r->staging + (pos & ((1ull << r->log2_entries) - 1)) * (fr_u64)r->page_bytes;
}

/* Posts the completion of request `pos` (its staging page already written). */
static inline void fr_ring_host_complete(const fr_dev_ring *r, fr_u64 pos, fr_i32 status)
{
    fr_dev_ring_cell *c = fr_ring_host_cell(r, pos);
    c->status = status;
    __atomic_store_n(&c->seq, 4 * (pos >> r->log2_entries) + 3, __ATOMIC_RELEASE);
}

/* Every cell free for lap 0 (after a failed gather; no thread may be using
 * the ring; the device's ticket counter is reset by the caller). */
static inline void fr_ring_host_reset(const fr_dev_ring *r)
{
    fr_u64 n = 1ull << r->log2_entries;
    for (fr_u64 i = 0; i < n; i++) {
        r->cells[i].status = 0;
        __atomic_store_n(&r->cells[i].seq, 0, __ATOMIC_RELEASE);
    }
}
#endif /* !FR_GPU */

#endif /* FASTREAD_DEVICE_RING_CUH */
