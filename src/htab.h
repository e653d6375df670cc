/* htab.h - a hash table of byte-string keys for singleflight and per-key
 * locks: open addressing, linear probing, deletion by backward shift (no
 * tombstones).  It grows at 3/4 load and shrinks at 1/8, down to
 * HTAB_MIN_SLOTS, so its memory follows the number of live keys; the
 * owner frees it with ferry__htab_release().
 *
 * The table stores pointers to nodes embedded in the caller's entries and
 * owns neither the nodes nor their keys.
 * Loop thread only (like its users; nothing here is shared).
 */
#ifndef FERRY_HTAB_H
#define FERRY_HTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/flight.h"

#define HTAB_MIN_SLOTS 16

/* A node embedded in an entry. */
struct ferry__hent {
    uint64_t hash;            /* ferry__hash(key, len) */
    const unsigned char *key; /* the entry's copy of the key */
    size_t len;               /* key length in bytes */
};

/* struct ferry__htab is defined in ferry/flight.h, which embeds it. */

/* Hash of a byte string (FNV-1a with a final avalanche). */
uint64_t ferry__hash(const void *key, size_t len);

/* The node with this key, or NULL. */
struct ferry__hent *ferry__htab_find(const struct ferry__htab *t, uint64_t hash, const void *key,
                                     size_t len);

/* Add `n` (its key must not be in the table).  Returns 0; -ENOMEM (the
 * table is unchanged). */
int ferry__htab_insert(struct ferry__htab *t, struct ferry__hent *n);

/* Remove `n`, which is in the table.  May shrink the table; never fails. */
void ferry__htab_remove(struct ferry__htab *t, struct ferry__hent *n);

/* Iterate: returns the next node at slot index >= *pos and advances *pos,
 * or NULL at the end.  The table must not change during the iteration. */
struct ferry__hent *ferry__htab_next(const struct ferry__htab *t, size_t *pos);

/* Free the slot array (the nodes are the caller's); the table is empty. */
void ferry__htab_release(struct ferry__htab *t);

#endif /* FERRY_HTAB_H */
