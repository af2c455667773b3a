/*
 * io_uring engine, tests only: the fault plan of engine_args fault_*=
 * (fault_plan in uring_internal.h), applied to copies of completions as
 * each ring reaps them, and to a ring's submits (fault_op=submit).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engines/uring/uring_internal.h"

/* 1 if this completion is to be faulted (takes one of the plan's faults). */
static int fault_take(fault_plan *f, const char *path)
{
    if (f->op != OP_SUBMIT && f->path[0] && (!path || !strstr(path, f->path)))
        return 0;
    long left = atomic_load(&f->left);
    while (left != 0) {
        if (left < 0)
            return 1;
        if (atomic_compare_exchange_weak(&f->left, &left, left - 1))
            return 1;
    }
    return 0;
}

/* Applies the fault plan to a copy of one completion (see fault_plan). */
void fr_uring_fault_inject(uring *u, struct io_uring_cqe *cqe)
{
    fault_plan *f = &u->fault;
    enum op op;
    const char *path;
    if (u->phase == PH_RANGES) {
        op = OP_READ;
        path = u->image.path;
    } else if (u->phase == PH_FILE_RANGES) {
        op = ud_op(cqe->user_data);
        path = u->files_path(u, ud_index(cqe->user_data));
    } else {
        op = ud_op(cqe->user_data);
        path = u->paths ? u->paths[ud_index(cqe->user_data)] : NULL;
    }
    if (op != f->op || (f->mode == FAULT_SHORT && cqe->res <= 0) || !fault_take(f, path))
        return;
    atomic_fetch_add(&f->done, 1);
    switch (f->mode) {
    case FAULT_STALL: {
        struct timespec ts = {f->stall_ms / 1000, (f->stall_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        return;
    }
    case FAULT_SHORT:
        cqe->res /= 2;
        return;
    default:
        break;
    }
    /* An open that did succeed gave a descriptor: a plain one is closed
     * here; a direct one stays in its slot until the next open into the
     * slot replaces it or the ring closes. */
    if (op == OP_OPEN && cqe->res >= 0 && (u->phase == PH_OPEN || u->phase == PH_PIPELINED))
        close(cqe->res);
    cqe->res = f->mode == FAULT_EIO      ? -EIO
               : f->mode == FAULT_EINTR  ? -EINTR
               : f->mode == FAULT_EAGAIN ? -EAGAIN
                                         : -ECANCELED;
}

int fr_uring_fault_submit(uring *u)
{
    fault_plan *f = &u->fault;
    if (f->mode == FAULT_OFF || f->op != OP_SUBMIT || !fault_take(f, NULL))
        return 0;
    atomic_fetch_add(&f->done, 1);
    return f->mode == FAULT_EIO      ? -EIO
           : f->mode == FAULT_EINTR  ? -EINTR
           : f->mode == FAULT_EAGAIN ? -EAGAIN
                                     : -EBUSY;
}
