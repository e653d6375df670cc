/* htab.c - the byte-string hash table of singleflight and per-key locks.
 * Loop thread only.
 */
#include "loop_only.h"

#include <string.h>

#include "ferry_int.h"
#include "htab.h"

uint64_t ferry__hash(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;

    for (i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    /* FNV's low bits are weak for short keys; mix them (fmix64). */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static bool node_is(const struct ferry__hent *n, uint64_t hash, const void *key, size_t len)
{
    return n->hash == hash && n->len == len && (len == 0 || memcmp(n->key, key, len) == 0);
}

struct ferry__hent *ferry__htab_find(const struct ferry__htab *t, uint64_t hash, const void *key,
                                     size_t len)
{
    size_t mask, i;

    if (t->cap == 0)
        return NULL;
    mask = t->cap - 1;
    for (i = hash & mask; t->slots[i]; i = (i + 1) & mask)
        if (node_is(t->slots[i], hash, key, len))
            return t->slots[i];
    return NULL;
}

static void place(struct ferry__hent **slots, size_t cap, struct ferry__hent *n)
{
    size_t mask = cap - 1, i;

    for (i = n->hash & mask; slots[i]; i = (i + 1) & mask)
        ;
    slots[i] = n;
}

/* Move every node into a new array of `cap` slots.  -ENOMEM: unchanged. */
static int resize(struct ferry__htab *t, size_t cap)
{
    struct ferry__hent **ns = ferry__calloc(cap, sizeof *ns);
    size_t i;

    if (ns == NULL)
        return -ENOMEM;
    for (i = 0; i < t->cap; i++)
        if (t->slots[i])
            place(ns, cap, t->slots[i]);
    ferry__free(t->slots);
    t->slots = ns;
    t->cap = cap;
    return 0;
}

int ferry__htab_insert(struct ferry__htab *t, struct ferry__hent *n)
{
    if ((t->count + 1) * 4 > t->cap * 3) {
        size_t cap = t->cap ? t->cap * 2 : HTAB_MIN_SLOTS;
        if (cap < t->cap || resize(t, cap))
            return -ENOMEM;
    }
    place(t->slots, t->cap, n);
    t->count++;
    return 0;
}

void ferry__htab_remove(struct ferry__htab *t, struct ferry__hent *n)
{
    size_t mask = t->cap - 1, i, j, k;

    for (i = n->hash & mask; t->slots[i] != n; i = (i + 1) & mask)
        ;
    t->slots[i] = NULL;
    /* Backward shift: pull later nodes of the probe run into the hole when
     * their home slot is not cyclically in (hole, their slot]. */
    for (j = (i + 1) & mask; t->slots[j]; j = (j + 1) & mask) {
        k = t->slots[j]->hash & mask;
        if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
            t->slots[i] = t->slots[j];
            t->slots[j] = NULL;
            i = j;
        }
    }
    t->count--;
    if (t->cap > HTAB_MIN_SLOTS && t->count * 8 < t->cap)
        (void)resize(t, t->cap / 2); /* on -ENOMEM keep the larger array */
}

struct ferry__hent *ferry__htab_next(const struct ferry__htab *t, size_t *pos)
{
    while (*pos < t->cap) {
        struct ferry__hent *n = t->slots[(*pos)++];
        if (n)
            return n;
    }
    return NULL;
}

void ferry__htab_release(struct ferry__htab *t)
{
    ferry__free(t->slots);
    t->slots = NULL;
    t->cap = 0;
    t->count = 0;
}
