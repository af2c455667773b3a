/* The descriptor LRU of fr_read_file_ranges (see fd_cache.h). */
/* O_PATH, AT_FDCWD (fr_shard_dir) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engines/fd_cache.h"

#define NONE UINT32_MAX

static uint32_t bucket_of(const fr_fd_cache *c, uint32_t file)
{
    return (uint32_t)((file * 2654435761u) & (c->nbuckets - 1));
}

int fr_fd_cache_init(fr_fd_cache *c, uint32_t cap)
{
    if (cap < 1)
        cap = 1;
    uint32_t nb = 1;
    while (nb < cap * 2u && nb < (1u << 30))
        nb <<= 1;
    c->entries = calloc(cap, sizeof(*c->entries));
    c->buckets = malloc(nb * sizeof(*c->buckets));
    c->pinned_list = malloc(cap * sizeof(*c->pinned_list));
    if (!c->entries || !c->buckets || !c->pinned_list) {
        free(c->entries);
        free(c->buckets);
        free(c->pinned_list);
        c->entries = NULL;
        c->buckets = NULL;
        c->pinned_list = NULL;
        return -ENOMEM;
    }
    c->npinned = 0;
    c->nbuckets = nb;
    c->cap = cap;
    c->table = NULL;
    c->opens = c->hits = c->evictions = 0;
    c->keys_only = 0;
    c->used = 0;
    c->head = c->tail = NONE;
    for (uint32_t b = 0; b < nb; b++)
        c->buckets[b] = NONE;
    for (uint32_t i = 0; i < cap; i++) {
        c->entries[i].fd = -1;
        c->entries[i].next = i + 1 < cap ? i + 1 : NONE;
    }
    c->free_head = 0;
    return 0;
}

void fr_fd_cache_clear(fr_fd_cache *c)
{
    if (!c->entries)
        return;
    for (uint32_t i = 0; i < c->cap; i++) {
        if (c->entries[i].fd >= 0 && !c->keys_only)
            close(c->entries[i].fd);
        c->entries[i].fd = -1;
        c->entries[i].pinned = 0;
        c->entries[i].next = i + 1 < c->cap ? i + 1 : NONE;
    }
    for (uint32_t b = 0; b < c->nbuckets; b++)
        c->buckets[b] = NONE;
    c->free_head = 0;
    c->npinned = 0;
    c->used = 0;
    c->head = c->tail = NONE;
}

void fr_fd_cache_free(fr_fd_cache *c)
{
    fr_fd_cache_clear(c);
    free(c->entries);
    free(c->buckets);
    free(c->pinned_list);
    c->entries = NULL;
    c->buckets = NULL;
    c->pinned_list = NULL;
}

void fr_fd_cache_use_table(fr_fd_cache *c, const void *table)
{
    if (c->table != table) {
        fr_fd_cache_clear(c);
        c->table = table;
    }
}

static void unlink_lru(fr_fd_cache *c, uint32_t i)
{
    fr_fd_entry *e = &c->entries[i];
    if (e->prev != NONE)
        c->entries[e->prev].next = e->next;
    else
        c->head = e->next;
    if (e->next != NONE)
        c->entries[e->next].prev = e->prev;
    else
        c->tail = e->prev;
}

static void push_front(fr_fd_cache *c, uint32_t i)
{
    fr_fd_entry *e = &c->entries[i];
    e->prev = NONE;
    e->next = c->head;
    if (c->head != NONE)
        c->entries[c->head].prev = i;
    c->head = i;
    if (c->tail == NONE)
        c->tail = i;
}

/* Entry i pinned for the phase, listed once. */
static void pin(fr_fd_cache *c, uint32_t i)
{
    fr_fd_entry *e = &c->entries[i];
    if (e->pinned)
        return;
    e->pinned = 1;
    e->pin_at = c->npinned;
    c->pinned_list[c->npinned++] = i;
}

/* Entry i unpinned and off the list (the list's last takes its place). */
static void unpin(fr_fd_cache *c, uint32_t i)
{
    fr_fd_entry *e = &c->entries[i];
    if (!e->pinned)
        return;
    uint32_t last = c->pinned_list[--c->npinned];
    c->pinned_list[e->pin_at] = last;
    c->entries[last].pin_at = e->pin_at;
    e->pinned = 0;
}

static uint32_t find(const fr_fd_cache *c, uint32_t file, uint32_t **link)
{
    uint32_t *at = &c->buckets[bucket_of(c, file)];
    while (*at != NONE && c->entries[*at].file != file)
        at = &c->entries[*at].hnext;
    if (link)
        *link = at;
    return *at;
}

int fr_fd_cache_get(fr_fd_cache *c, uint32_t file)
{
    uint32_t i = find(c, file, NULL);
    if (i == NONE)
        return -1;
    unlink_lru(c, i);
    push_front(c, i);
    pin(c, i);
    c->hits++;
    return c->entries[i].fd;
}

/* Unlinks entry i; returns its descriptor (the caller closes it). */
static int remove_entry(fr_fd_cache *c, uint32_t i)
{
    uint32_t *link;
    (void)find(c, c->entries[i].file, &link);
    *link = c->entries[i].hnext;
    unlink_lru(c, i);
    int fd = c->entries[i].fd;
    c->entries[i].fd = -1;
    unpin(c, i);
    c->entries[i].next = c->free_head;
    c->free_head = i;
    c->used--;
    return fd;
}

int fr_fd_cache_reserve_take(fr_fd_cache *c, uint32_t k, int *victims, uint32_t *nvictims)
{
    *nvictims = 0;
    if (k > c->cap)
        return -EBUSY;
    uint32_t i = c->tail;
    while (c->used + k > c->cap && i != NONE) {
        uint32_t prev = c->entries[i].prev;
        if (!c->entries[i].pinned) {
            victims[(*nvictims)++] = remove_entry(c, i);
            c->evictions++;
        }
        i = prev;
    }
    return c->used + k <= c->cap ? 0 : -EBUSY;
}

int fr_fd_cache_reserve(fr_fd_cache *c, uint32_t k)
{
    if (k > c->cap)
        return -EBUSY;
    /* At most k victims are taken (each frees one entry): close them here. */
    int small[16];
    int *victims = k <= 16 ? small : malloc(k * sizeof(*victims));
    if (!victims)
        return -ENOMEM;
    uint32_t n;
    int rc = fr_fd_cache_reserve_take(c, k, victims, &n);
    for (uint32_t v = 0; v < n && !c->keys_only; v++)
        close(victims[v]);
    if (victims != small)
        free(victims);
    return rc;
}

int fr_fd_cache_put(fr_fd_cache *c, uint32_t file, int fd)
{
    int rc = fr_fd_cache_reserve(c, 1);
    if (rc)
        return rc;
    uint32_t i = c->free_head;
    c->free_head = c->entries[i].next;
    fr_fd_entry *e = &c->entries[i];
    e->file = file;
    e->fd = fd;
    pin(c, i);
    uint32_t b = bucket_of(c, file);
    e->hnext = c->buckets[b];
    c->buckets[b] = i;
    push_front(c, i);
    c->used++;
    c->opens++;
    return 0;
}

void fr_fd_cache_unpin_all(fr_fd_cache *c)
{
    for (uint32_t p = 0; p < c->npinned; p++)
        c->entries[c->pinned_list[p]].pinned = 0;
    c->npinned = 0;
}

void fr_fd_cache_drop(fr_fd_cache *c, uint32_t file)
{
    uint32_t i = find(c, file, NULL);
    if (i != NONE) {
        int fd = remove_entry(c, i);
        if (!c->keys_only)
            close(fd);
    }
}

void fr_shard_dir_open(fr_shard_dir *d, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path)
        return;
    size_t len = (size_t)(slash - path);
    char buf[4096];
    if (len >= sizeof(buf))
        return;
    memcpy(buf, path, len);
    buf[len] = 0;
    int fd;
    do {
        fd = open(buf, O_PATH | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return;
    d->fd = fd;
    d->dir = path;
    d->len = len;
}

const char *fr_shard_dir_name(const fr_shard_dir *d, const char *path, int *dirfd)
{
    if (d->fd >= 0 && strncmp(path, d->dir, d->len) == 0 && path[d->len] == '/' &&
        path[d->len + 1] && !strchr(path + d->len + 1, '/')) {
        *dirfd = d->fd;
        return path + d->len + 1;
    }
    *dirfd = AT_FDCWD;
    return path;
}

void fr_shard_dir_close(fr_shard_dir *d)
{
    if (d->fd >= 0)
        close(d->fd);
    fr_shard_dir_init(d);
}
