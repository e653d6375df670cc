/* ferry/flight.h - singleflight (one call per key, its result shared by
 * every concurrent caller) and per-key locks.
 *
 * Both answer the seeds' "one lock per cache is too coarse, a dict of locks
 * leaks": state exists per key only while a call or a lock on that key is
 * alive, and is freed when the last task leaves it, so memory returns to
 * where it was after any number of distinct keys.
 *
 * Keys are byte strings (pointer and length; they need not be
 * NUL-terminated, and the empty key is a key).  ferry copies a key while it
 * is in use: the caller's buffer may change as soon as the call returns.
 *
 * Both belong to the loop that first uses them; from another thread or a
 * task of another loop every call returns -EPERM.
 */
#ifndef FERRY_FLIGHT_H
#define FERRY_FLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/sync.h"
#include "ferry/task.h"

#ifdef __cplusplus
extern "C" {
#endif

/* private: a hash table of byte-string keys (src/htab.h); all-zero is an
 * empty table that has allocated nothing. */
struct ferry__hent;
struct ferry__htab {
    struct ferry__hent **slots; /* `cap` slots, NULL = free */
    size_t               cap;    /* 0 or a power of two */
    size_t               count;  /* nodes stored */
};

/* ---- Singleflight --------------------------------------------------- */

typedef struct ferry_flight ferry_flight;

/*
 * A group of calls deduplicated by key (Go's singleflight.Group, the seeds'
 * dict of in-flight Futures).  The first caller for a key, the leader,
 * runs the function; every caller for the same key that arrives while it
 * runs waits and receives the same status and a copy of the same result.
 * The entry is removed when the call ends: the next caller runs the
 * function again.
 */
struct ferry_flight {
    /* private: use the functions below */
    struct ferry__htab calls; /* key -> call in flight */
    ferry_loop        *loop;  /* bound at first use */
};

/* All-zero is an empty group. */
#define FERRY_FLIGHT_INIT {0}

/*
 * The shared work.  Runs in the leader's task (it may suspend), writes its
 * result into `out` (`out_size` bytes, the leader's own buffer) and returns
 * a status: 0 or more for success, or a negative errno.
 */
typedef int (*ferry_flight_fn)(void *arg, void *out, size_t out_size);

/* Initialise an empty, unbound group.
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL. */
int ferry_flight_init(ferry_flight *f);

/*
 * Free the group's table.
 * Thread: the bound loop's; any if never used or once that loop is freed.
 * Suspends: no.
 * Returns: 0; -EBUSY (a call is in flight: nothing changed); -EPERM; -EINVAL.
 */
int ferry_flight_destroy(ferry_flight *f);

/*
 * Run fn(arg, out, out_size) for `key`, or join the call already running
 * for it and wait for its end.
 *
 * Result:  the leader's status is returned by every caller of that call.
 *          When it is 0 or more, the `out_size` bytes the leader's fn wrote
 *          to its `out` are copied to each waiter's `out`; otherwise the
 *          waiters' `out` is left untouched.  Every caller for one key must
 *          pass the same `out_size`.
 * Owns:    `out` is the caller's; ferry only copies bytes into it.  If the
 *          result is a pointer, every caller receives the same pointer and
 *          ferry never frees it: keep the pointee somewhere that outlives
 *          the callers (a cache) or give it a reference count of your own.
 * Leader cancelled: if the leader's task is cancelled or its deadline
 *          passes and fn returns -ECANCELED or -ETIMEDOUT, the leader
 *          returns that, and the waiters are not failed: the first one
 *          becomes the leader and runs its own fn(arg, out, out_size).  A
 *          leader that is cancelled but whose fn succeeds shares the result.
 * Waiter cancelled: a waiter that is cancelled or times out leaves with
 *          -ECANCELED / -ETIMEDOUT; the call goes on for the others.  A
 *          waiter already woken with the result keeps it.
 *
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: fn's status; -ECANCELED, -ETIMEDOUT (this caller was cancelled
 * before receiving a result, or was the leader and fn returned it);
 * -EDEADLK (fn of the running call for `key` called this for the same key);
 * -ENOMEM (no call made); -EPERM; -EINVAL (NULL f or fn, NULL key with
 * key_len > 0, NULL out with out_size > 0, out_size differing from the
 * running call's).
 */
int ferry_flight_do(ferry_flight *f, const void *key, size_t key_len,
                    ferry_flight_fn fn, void *arg, void *out, size_t out_size);

/* Thread: loop.  Suspends: no.
 * Returns: the number of calls in flight (keys with a live entry). */
size_t ferry_flight_count(const ferry_flight *f);

/* ---- Per-key locks -------------------------------------------------- */

typedef struct ferry_keylock ferry_keylock;

/*
 * A lock per key, with the semantics of ferry_lock (FIFO handoff, -EDEADLK
 * on re-acquire, -EPERM on release by a non-holder, broken when a holder
 * ends holding it).  A key's lock is created on first use and freed when
 * nobody holds or waits for it.  A broken key stays (so later acquirers
 * get -EOWNERDEAD) until ferry_keylock_destroy().
 */
struct ferry_keylock {
    /* private: use the functions below */
    struct ferry__htab keys;  /* key -> its lock */
    ferry_loop        *loop;  /* bound at first use */
};

/* All-zero is an empty set of per-key locks. */
#define FERRY_KEYLOCK_INIT {0}

/* Initialise an empty, unbound set.
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL. */
int ferry_keylock_init(ferry_keylock *kl);

/*
 * Free everything (broken keys included).
 * Thread: the bound loop's; any if never used or once that loop is freed.
 * Suspends: no.
 * Returns: 0; -EBUSY (a key is held or waited for: nothing
 * changed); -EPERM; -EINVAL.
 */
int ferry_keylock_destroy(ferry_keylock *kl);

/*
 * Wait until the lock of `key` is free, then take it.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (held); -ECANCELED, -ETIMEDOUT (not held); -EDEADLK (the
 * caller holds it); -EOWNERDEAD (broken); -ENOMEM (the key's lock could not
 * be made); -EPERM; -EINVAL (NULL kl, NULL key with key_len > 0).
 */
int ferry_keylock_acquire(ferry_keylock *kl, const void *key, size_t key_len);

/*
 * Take the lock of `key` if it is free and nobody waits for it.
 * Thread: loop, in a task.  Suspends: no.
 * Returns: 0; -EAGAIN; -EDEADLK; -EOWNERDEAD; -ENOMEM; -EPERM; -EINVAL.
 */
int ferry_keylock_try_acquire(ferry_keylock *kl, const void *key, size_t key_len);

/*
 * Release the lock of `key` held by the calling task; the next waiter holds
 * it, or the key's lock is freed.
 * Thread: loop, in the holding task.  Suspends: no.
 * Returns: 0; -EPERM (not held by the caller; wrong thread or loop);
 * -EINVAL.
 */
int ferry_keylock_release(ferry_keylock *kl, const void *key, size_t key_len);

/* Thread: loop.  Suspends: no.
 * Returns: true if some task holds the lock of `key` (or it is broken). */
bool ferry_keylock_locked(const ferry_keylock *kl, const void *key, size_t key_len);

/* Thread: loop.  Suspends: no.  Returns: the number of keys with a live lock. */
size_t ferry_keylock_count(const ferry_keylock *kl);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_FLIGHT_H */
