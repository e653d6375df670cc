/* flight.c - singleflight and per-key locks over one hash table each.
 * Loop thread only.
 *
 * Singleflight: a call in flight is an entry holding its waiters.  The
 * leader runs fn, then removes the entry and wakes every waiter with the
 * status, copying the result into each waiter's buffer (which lives on the
 * waiter's stack while it waits).  A woken waiter never touches the entry
 * again, so the leader frees it at once.  If the leader is cancelled, it
 * wakes the first waiter with a "lead" grant instead; that waiter runs fn
 * (or, if it was itself cancelled meanwhile, passes the lead on).
 *
 * Per-key locks: an entry holds a ferry_lock and counts the tasks holding
 * or acquiring it; the last one out frees it.
 */
#include "loop_only.h"

#include <string.h>

#include "ferry/flight.h"
#include "htab.h"
#include "loop_int.h"
#include "sync_int.h"

/* w->n of a waiter woken to become the leader. */
#define FLIGHT_LEAD 1

/* One call in flight. */
struct flight_call {
    struct ferry__hent node;     /* in ferry_flight.calls */
    struct ferry__waitq waiters; /* joiners; w->data = their out buffer */
    struct ferry_task *leader;   /* runs fn now (or is woken to) */
    size_t out_size;             /* every caller's result size */
    unsigned char key[];         /* copy of the key */
};

/* One key's lock. */
struct keylock_entry {
    struct ferry__hent node; /* in ferry_keylock.keys */
    ferry_lock lock;         /* the key's lock */
    size_t refs;             /* tasks holding it or in acquire */
    unsigned char key[];     /* copy of the key */
};

/* Allocate `size` bytes of entry followed by a copy of the key, and set
 * the node at offset 0 of the entry.  NULL on -ENOMEM. */
static void *entry_new(size_t size, const void *key, size_t len, uint64_t hash)
{
    unsigned char *e;
    struct ferry__hent *n;

    if (len > SIZE_MAX - size)
        return NULL;
    e = ferry__calloc(1, size + len);
    if (e == NULL)
        return NULL;
    if (len)
        memcpy(e + size, key, len);
    n = (struct ferry__hent *)(void *)e;
    n->hash = hash;
    n->key = e + size;
    n->len = len;
    return e;
}

/* ---- Singleflight --------------------------------------------------- */

int ferry_flight_init(ferry_flight *f)
{
    if (f == NULL)
        return -EINVAL;
    memset(f, 0, sizeof(*f));
    return 0;
}

int ferry_flight_destroy(ferry_flight *f)
{
    int rc;

    if (f == NULL)
        return -EINVAL;
    rc = ferry__bound_here(f->loop, NULL);
    if (rc)
        return rc;
    if (f->calls.count)
        return -EBUSY;
    ferry__htab_release(&f->calls);
    f->loop = NULL;
    return 0;
}

size_t ferry_flight_count(const ferry_flight *f)
{
    return f ? f->calls.count : 0;
}

/* Make the first waiting caller the leader.  False if nobody waits. */
static bool flight_hand_over(struct flight_call *c)
{
    struct ferry__waiter *w = ferry__first_waiting(&c->waiters);

    if (w == NULL)
        return false;
    c->leader = w->task;
    w->n = FLIGHT_LEAD;
    ferry__grant(w, 0);
    return true;
}

/* The call ends with `status`: remove it, give every waiter the status
 * and (on success) a copy of the result, free it. */
static void flight_finish(ferry_flight *f, struct flight_call *c, int status, const void *out)
{
    struct ferry__waiter *w;

    ferry__htab_remove(&f->calls, &c->node);
    while ((w = ferry__first_waiting(&c->waiters)) != NULL) {
        if (status >= 0 && c->out_size)
            memcpy(w->data, out, c->out_size);
        ferry__grant(w, status);
    }
    ferry__free(c);
}

int ferry_flight_do(ferry_flight *f, const void *key, size_t key_len, ferry_flight_fn fn, void *arg,
                    void *out, size_t out_size)
{
    struct ferry_task *self;
    struct flight_call *c;
    struct ferry__waiter w;
    uint64_t hash;
    int rc, st;

    if (f == NULL || fn == NULL || (key == NULL && key_len) || (out == NULL && out_size))
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    rc = ferry__bind_task(&f->loop, self);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    hash = ferry__hash(key, key_len);
    c = (struct flight_call *)ferry__htab_find(&f->calls, hash, key, key_len);
    if (c) {
        if (c->leader == self)
            return -EDEADLK;
        if (c->out_size != out_size)
            return -EINVAL;
        ferry__waiter_init(&w, self, "singleflight", f);
        w.data = out;
        rc = ferry__wait(&c->waiters, &w, FERRY_NEVER);
        if (w.state != FERRY__W_GRANTED)
            return rc; /* left while waiting; the call goes on */
        if (w.n != FLIGHT_LEAD)
            return w.result; /* the result is ours: keep it */
        if (rc) {
            /* Handed the lead, then cancelled before running: pass it on,
             * or end the call if nobody waits any more. */
            if (!flight_hand_over(c)) {
                ferry__htab_remove(&f->calls, &c->node);
                ferry__free(c);
            }
            return rc;
        }
    } else {
        c = entry_new(sizeof(*c), key, key_len, hash);
        if (c == NULL)
            return -ENOMEM;
        if (ferry__htab_insert(&f->calls, &c->node)) {
            ferry__free(c);
            return -ENOMEM;
        }
        c->leader = self;
        c->out_size = out_size;
    }
    st = fn(arg, out, out_size);
    /* A leader stopped by its own cancellation or deadline does not fail
     * the waiters: one of them takes over, as the waiters were not
     * cancelled. */
    if ((st == -ECANCELED || st == -ETIMEDOUT) && ferry__check_inline(self) != 0 &&
        flight_hand_over(c))
        return st;
    flight_finish(f, c, st, out);
    return st;
}

/* ---- Per-key locks -------------------------------------------------- */

int ferry_keylock_init(ferry_keylock *kl)
{
    if (kl == NULL)
        return -EINVAL;
    memset(kl, 0, sizeof(*kl));
    return 0;
}

int ferry_keylock_destroy(ferry_keylock *kl)
{
    struct ferry__hent *n;
    ferry_loop *live;
    size_t pos = 0;
    int rc;

    if (kl == NULL)
        return -EINVAL;
    rc = ferry__bound_here(kl->loop, &live);
    if (rc)
        return rc;
    /* Only broken keys with nobody but their dead holder are left idle. */
    while ((n = ferry__htab_next(&kl->keys, &pos)) != NULL) {
        struct keylock_entry *e = (struct keylock_entry *)(void *)n;
        if (!e->lock.broken || e->refs > 1 || !ferry__lock_idle(&e->lock))
            return -EBUSY;
    }
    pos = 0;
    while ((n = ferry__htab_next(&kl->keys, &pos)) != NULL) {
        if (live)
            ferry__lock_forget(live, &((struct keylock_entry *)(void *)n)->lock);
        ferry__free(n);
    }
    ferry__htab_release(&kl->keys);
    kl->loop = NULL;
    return 0;
}

size_t ferry_keylock_count(const ferry_keylock *kl)
{
    return kl ? kl->keys.count : 0;
}

static struct keylock_entry *keylock_find(const ferry_keylock *kl, const void *key, size_t len)
{
    return (struct keylock_entry *)ferry__htab_find(&kl->keys, ferry__hash(key, len), key, len);
}

/* The entry of `key`, made if missing, with one more reference. */
static int keylock_ref(ferry_keylock *kl, const void *key, size_t len, struct keylock_entry **out)
{
    uint64_t hash = ferry__hash(key, len);
    struct keylock_entry *e;

    e = (struct keylock_entry *)ferry__htab_find(&kl->keys, hash, key, len);
    if (e == NULL) {
        e = entry_new(sizeof(*e), key, len, hash);
        if (e == NULL)
            return -ENOMEM;
        if (ferry__htab_insert(&kl->keys, &e->node)) {
            ferry__free(e);
            return -ENOMEM;
        }
    }
    e->refs++;
    *out = e;
    return 0;
}

/* Drop a reference; the last one frees the entry (a broken key keeps its
 * dead holder's reference, so it stays). */
static void keylock_unref(ferry_keylock *kl, struct keylock_entry *e)
{
    if (--e->refs == 0) {
        ferry__htab_remove(&kl->keys, &e->node);
        ferry__free(e);
    }
}

static int keylock_enter(ferry_keylock *kl, const void *key, size_t len, struct ferry_task **self)
{
    int rc;

    if (kl == NULL || (key == NULL && len))
        return -EINVAL;
    rc = ferry__enter_task_inline(self);
    if (rc)
        return rc;
    return ferry__bind_task(&kl->loop, *self);
}

int ferry_keylock_acquire(ferry_keylock *kl, const void *key, size_t key_len)
{
    struct ferry_task *self;
    struct keylock_entry *e;
    int rc;

    rc = keylock_enter(kl, key, key_len, &self);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    rc = keylock_ref(kl, key, key_len, &e);
    if (rc)
        return rc;
    rc = ferry__lock_acquire_task(&e->lock, self);
    if (rc)
        keylock_unref(kl, e);
    return rc;
}

int ferry_keylock_try_acquire(ferry_keylock *kl, const void *key, size_t key_len)
{
    struct ferry_task *self;
    struct keylock_entry *e;
    int rc;

    rc = keylock_enter(kl, key, key_len, &self);
    if (rc)
        return rc;
    rc = keylock_ref(kl, key, key_len, &e);
    if (rc)
        return rc;
    rc = ferry__lock_try_acquire_task(&e->lock, self);
    if (rc)
        keylock_unref(kl, e);
    return rc;
}

int ferry_keylock_release(ferry_keylock *kl, const void *key, size_t key_len)
{
    struct ferry_task *self;
    struct keylock_entry *e;
    int rc;

    rc = keylock_enter(kl, key, key_len, &self);
    if (rc)
        return rc;
    e = keylock_find(kl, key, key_len);
    if (e == NULL)
        return -EPERM;
    rc = ferry__lock_release_task(&e->lock, self);
    if (rc)
        return rc;
    keylock_unref(kl, e);
    return 0;
}

bool ferry_keylock_locked(const ferry_keylock *kl, const void *key, size_t key_len)
{
    struct keylock_entry *e;

    if (kl == NULL || (key == NULL && key_len))
        return false;
    e = keylock_find(kl, key, key_len);
    return e != NULL && ferry_lock_locked(&e->lock);
}
