/* queue.c - FIFO, LIFO and priority queues between tasks.
 * Loop thread only.
 *
 * Handoff by reservation: an element stays in the queue until the getter
 * that was promised it runs (res_get counts such promises), and a free slot
 * stays free until the putter promised it runs (res_put).  So a getter or
 * putter cancelled after it was woken but before it ran only gives its
 * promise back to the next waiter: no element moves, none is lost or
 * duplicated, and newcomers cannot take a promised element or slot.
 *
 * Storage: `slots` slots of `slot_size` bytes plus one spare (the priority
 * heap's sift buffer).  FIFO is a ring from `head`; LIFO and priority use
 * [0, count).  A priority slot is the element followed by its put sequence
 * number (the tie-break that makes the heap stable), padded so that every
 * element is aligned for any type.  Invariant: slots >= count + res_put,
 * so a woken putter always finds room without allocating.
 */
#include "loop_only.h"

#include <stdalign.h>
#include <string.h>

#include "ferry/queue.h"
#include "loop_int.h" /* the inline entry checks */
#include "sync_int.h"
#include "wait_int.h"
#include "select_int.h"

/* Storage of an emptied queue above this many slots is given back. */
#define QUEUE_KEEP_SLOTS 1024

/* A zero elem_size is the all-zero queue's: elements are pointers.  The
 * size is filled in once the queue is bound (on its loop's thread), so a
 * call from elsewhere writes nothing. */
static int q_valid(const ferry_queue *q)
{
    if (q == NULL || q->kind < FERRY_QUEUE_FIFO || q->kind > FERRY_QUEUE_PRIORITY ||
        (q->kind == FERRY_QUEUE_PRIORITY && q->cmp == NULL))
        return -EINVAL;
    return 0;
}

static inline int q_bind(ferry_queue *q)
{
    int rc = ferry__bind_inline(&q->loop);

    if (rc == 0 && q->elem_size == 0)
        q->elem_size = sizeof(void *);
    return rc;
}

static inline int q_bind_task(ferry_queue *q, const struct ferry_task *self)
{
    int rc = ferry__bind_task(&q->loop, self);

    if (rc == 0 && q->elem_size == 0)
        q->elem_size = sizeof(void *);
    return rc;
}

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* Offset of the sequence number inside a priority slot. */
static size_t seq_off(const ferry_queue *q)
{
    return round_up(q->elem_size, sizeof(uint64_t));
}

static unsigned char *slot_at(const ferry_queue *q, size_t i)
{
    return q->buf + i * q->slot_size;
}

/* Copy one element: the common sizes as one or two moves, not a call of
 * libc's memcpy(), whose set-up costs more than the copy. */
static inline void elem_copy(void *dst, const void *src, size_t n)
{
    switch (n) {
    case 4:
        __builtin_memcpy(dst, src, 4);
        break;
    case 8:
        __builtin_memcpy(dst, src, 8);
        break;
    case 16:
        __builtin_memcpy(dst, src, 16);
        break;
    default:
        memcpy(dst, src, n);
        break;
    }
}

/* Elements a getter may take now (not promised to a woken getter). */
static size_t q_avail(const ferry_queue *q)
{
    return q->count - q->res_get;
}

/* Slots a putter may take now (not used, not promised). */
static size_t q_free(const ferry_queue *q)
{
    size_t used = q->count + q->res_put;

    if (q->capacity == 0)
        return SIZE_MAX;
    return used >= q->capacity ? 0 : q->capacity - used;
}

/* q_room() when the storage is full: allocate more. */
static int q_grow(ferry_queue *q)
{
    size_t need = q->count + q->res_put + 1;
    size_t n, i;
    unsigned char *nb;

    if (q->slot_size == 0) {
        if (q->kind == FERRY_QUEUE_PRIORITY) {
            if (q->elem_size > SIZE_MAX / 2)
                return -ENOMEM;
            q->slot_size = round_up(seq_off(q) + sizeof(uint64_t), alignof(max_align_t));
        } else {
            q->slot_size = q->elem_size;
        }
    }
    n = q->slots ? (q->slots > SIZE_MAX / 2 ? SIZE_MAX : q->slots * 2) : 8;
    if (q->capacity && n > q->capacity)
        n = q->capacity;
    if (n < need)
        n = need;
    if (n >= SIZE_MAX / q->slot_size)
        return -ENOMEM;
    nb = ferry__malloc((n + 1) * q->slot_size);
    if (nb == NULL)
        return -ENOMEM;
    if (q->kind == FERRY_QUEUE_FIFO) {
        for (i = 0; i < q->count; i++)
            memcpy(nb + i * q->slot_size, slot_at(q, (q->head + i) % q->slots), q->slot_size);
    } else if (q->count) {
        memcpy(nb, q->buf, q->count * q->slot_size);
    }
    ferry__free(q->buf);
    q->buf = nb;
    q->slots = n;
    q->head = 0;
    return 0;
}

/* Make sure one more element than count + res_put fits.  -ENOMEM leaves
 * the queue as it was. */
static inline int q_room(ferry_queue *q)
{
    if (__builtin_expect(q->count + q->res_put < q->slots, 1))
        return 0;
    return q_grow(q);
}

/* ---- Priority heap -------------------------------------------------- */

static uint64_t slot_seq(const ferry_queue *q, const unsigned char *s)
{
    uint64_t seq;

    memcpy(&seq, s + seq_off(q), sizeof seq);
    return seq;
}

/* True if slot `a` must come out before slot `b`. */
static bool heap_before(const ferry_queue *q, const unsigned char *a, const unsigned char *b)
{
    int c = q->cmp(a, b, q->cmp_arg);

    if (c != 0)
        return c < 0;
    return slot_seq(q, a) < slot_seq(q, b);
}

/* Move the element in the spare slot up from hole `i` to its place. */
static void heap_up(ferry_queue *q, size_t i)
{
    unsigned char *spare = slot_at(q, q->slots);

    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_before(q, spare, slot_at(q, p)))
            break;
        memcpy(slot_at(q, i), slot_at(q, p), q->slot_size);
        i = p;
    }
    memcpy(slot_at(q, i), spare, q->slot_size);
}

/* Move the element in the spare slot down from hole `i` to its place in a
 * heap of q->count elements. */
static void heap_down(ferry_queue *q, size_t i)
{
    unsigned char *spare = slot_at(q, q->slots);

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->count)
            break;
        if (c + 1 < q->count && heap_before(q, slot_at(q, c + 1), slot_at(q, c)))
            c++;
        if (!heap_before(q, slot_at(q, c), spare))
            break;
        memcpy(slot_at(q, i), slot_at(q, c), q->slot_size);
        i = c;
    }
    memcpy(slot_at(q, i), spare, q->slot_size);
}

/* ---- Storage -------------------------------------------------------- */

/* q_push() of a LIFO or priority queue. */
static void q_push_other(ferry_queue *q, const void *item)
{
    unsigned char *s;

    if (q->kind == FERRY_QUEUE_LIFO) {
        elem_copy(slot_at(q, q->count), item, q->elem_size);
    } else {
        s = slot_at(q, q->slots);
        memcpy(s, item, q->elem_size);
        memcpy(s + seq_off(q), &q->seq, sizeof q->seq);
        heap_up(q, q->count);
    }
    q->seq++;
    q->count++;
}

/* Store a copy of `item`; room was made by q_room().  The FIFO ring wraps
 * by comparison: head < slots and count < slots, so one subtraction does,
 * and a division (`%`, 20 to 40 cycles) per element is avoided. */
static inline void q_push(ferry_queue *q, const void *item)
{
    size_t i;

    if (__builtin_expect(q->kind != FERRY_QUEUE_FIFO, 0)) {
        q_push_other(q, item);
        return;
    }
    i = q->head + q->count;
    if (i >= q->slots)
        i -= q->slots;
    elem_copy(slot_at(q, i), item, q->elem_size);
    q->seq++;
    q->count++;
}

/* q_pop() of a LIFO or priority queue. */
static void q_pop_other(ferry_queue *q, void *out)
{
    if (q->kind == FERRY_QUEUE_LIFO) {
        elem_copy(out, slot_at(q, q->count - 1), q->elem_size);
        q->count--;
        return;
    }
    memcpy(out, slot_at(q, 0), q->elem_size);
    q->count--;
    if (q->count) {
        memcpy(slot_at(q, q->slots), slot_at(q, q->count), q->slot_size);
        heap_down(q, 0);
    }
}

/* Remove the next element into `out`. */
static inline void q_pop(ferry_queue *q, void *out)
{
    if (__builtin_expect(q->kind != FERRY_QUEUE_FIFO, 0)) {
        q_pop_other(q, out);
        return;
    }
    elem_copy(out, slot_at(q, q->head), q->elem_size);
    if (++q->head == q->slots)
        q->head = 0;
    q->count--;
}

/* ---- Waking --------------------------------------------------------- */

/* Promise available elements to waiting getters, in FIFO order. */
static void serve_getters(ferry_queue *q)
{
    struct ferry__waiter *w;

    while (q_avail(q) > 0 && (w = ferry__first_waiting(&q->getters)) != NULL) {
        q->res_get++;
        q->pending++;
        ferry__grant(w, 0);
    }
}

/* Promise free slots to waiting putters, in FIFO order. */
static void serve_putters(ferry_queue *q)
{
    struct ferry__waiter *w;

    while (q_free(q) > 0 && (w = ferry__first_waiting(&q->putters)) != NULL) {
        q->res_put++;
        q->pending++;
        ferry__grant(w, 0);
    }
}

static void wake_all(ferry_queue *q, struct ferry__waitq *wq, int result)
{
    q->pending += ferry__waitq_grant_all(wq, result);
}

/* An element was stored.  Inline: the list check spares the call when
 * nobody waits. */
static inline void q_added(ferry_queue *q)
{
    q->unfinished++;
    if (!ferry__waitq_empty(&q->getters))
        serve_getters(q);
}

/* q_removed() of an emptied queue: large storage goes back. */
static void q_release_storage(ferry_queue *q)
{
    ferry__free(q->buf);
    q->buf = NULL;
    q->slots = 0;
    q->head = 0;
}

/* An element was removed. */
static inline void q_removed(ferry_queue *q)
{
    if (!ferry__waitq_empty(&q->putters))
        serve_putters(q);
    if (__builtin_expect(q->count == 0, 0) && q->res_put == 0 && q->slots > QUEUE_KEEP_SLOTS)
        q_release_storage(q);
}

/* ---- API ------------------------------------------------------------ */

int ferry_queue_init(ferry_queue *q, size_t elem_size, size_t capacity, enum ferry_queue_kind kind,
                     ferry_queue_cmp cmp, void *arg)
{
    if (q == NULL || elem_size == 0 || (int)kind < FERRY_QUEUE_FIFO || kind > FERRY_QUEUE_PRIORITY)
        return -EINVAL;
    if ((kind == FERRY_QUEUE_PRIORITY) != (cmp != NULL) || (cmp == NULL && arg != NULL))
        return -EINVAL;
    memset(q, 0, sizeof(*q));
    q->elem_size = elem_size;
    q->capacity = capacity;
    q->kind = kind;
    q->cmp = cmp;
    q->cmp_arg = arg;
    return 0;
}

int ferry_queue_destroy(ferry_queue *q)
{
    int rc;

    if (q == NULL)
        return -EINVAL;
    rc = ferry__bound_here(q->loop, NULL);
    if (rc)
        return rc;
    if (!ferry__waitq_empty(&q->getters) || !ferry__waitq_empty(&q->putters) ||
        !ferry__waitq_empty(&q->joiners) || q->pending)
        return -EBUSY;
    ferry__free(q->buf);
    memset(q, 0, sizeof(*q));
    return 0;
}

/*
 * The checks put and get start with: -EINVAL for a bad queue, -EPERM
 * outside a task or from a task of another loop.  A queue bound to the
 * caller's loop was checked when it was bound, so the common case is one
 * comparison.  `q` is not NULL.
 */
static inline int q_enter(ferry_queue *q, struct ferry_task **self)
{
    int rc;

    *self = ferry__self();
    if (__builtin_expect(*self != NULL && q->loop == (*self)->loop, 1))
        return 0;
    rc = q_valid(q);
    if (rc)
        return rc;
    if (*self == NULL)
        return -EPERM;
    return q_bind_task(q, *self);
}

/* ferry_queue_put() when the queue is full: wait for a slot.  Out of line,
 * so that the common path saves no registers. */
static __attribute__((noinline)) int q_put_wait(ferry_queue *q, struct ferry_task *self,
                                                const void *item)
{
    struct ferry__waiter w;
    int rc;

    ferry__waiter_init(&w, self, "queue put", q);
    rc = ferry__wait_inline(&q->putters, &w, FERRY_NEVER);
    if (w.state != FERRY__W_GRANTED)
        return rc;
    q->pending--;
    if (w.result != 0)
        return rc; /* woken by shutdown */
    /* A slot was promised to us. */
    q->res_put--;
    if (rc == 0 && q->shutdown)
        rc = -ESHUTDOWN;
    if (rc == 0)
        rc = q_room(q); /* never allocates: the slot exists */
    if (rc) {
        /* Cancelled (or shut down) after the promise: the slot goes to the
         * next putter, nothing was inserted. */
        serve_putters(q);
        return rc;
    }
    q_push(q, item);
    q_added(q);
    return 0;
}

int ferry_queue_put(ferry_queue *q, const void *item)
{
    struct ferry_task *self;
    int rc;

    if (q == NULL || item == NULL)
        return -EINVAL;
    rc = q_enter(q, &self);
    if (rc)
        return rc;
    ferry__fuzz_point(self);
    if (q->shutdown)
        return -ESHUTDOWN;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (q_free(q) > 0) {
        /* Free slots mean no putter waits (serve_putters() ran). */
        rc = q_room(q);
        if (rc)
            return rc;
        q_push(q, item);
        q_added(q);
        return 0;
    }
    return q_put_wait(q, self, item);
}

int ferry_queue_try_put(ferry_queue *q, const void *item)
{
    int rc;

    rc = q_valid(q);
    if (rc == 0 && item == NULL)
        rc = -EINVAL;
    if (rc)
        return rc;
    rc = q_bind(q);
    if (rc)
        return rc;
    if (q->shutdown)
        return -ESHUTDOWN;
    if (q_free(q) == 0)
        return -EAGAIN;
    rc = q_room(q);
    if (rc)
        return rc;
    q_push(q, item);
    q_added(q);
    return 0;
}

/* ferry_queue_get() when nothing is available: wait for an element. */
static __attribute__((noinline)) int q_get_wait(ferry_queue *q, struct ferry_task *self, void *out)
{
    struct ferry__waiter w;
    int rc;

    if (q->shutdown)
        return -ESHUTDOWN;
    ferry__waiter_init(&w, self, "queue get", q);
    rc = ferry__wait_inline(&q->getters, &w, FERRY_NEVER);
    if (w.state != FERRY__W_GRANTED)
        return rc;
    q->pending--;
    if (w.result != 0)
        return rc; /* woken by shutdown */
    if (q->shutdown == 2)
        return rc ? rc : -ESHUTDOWN; /* our element was dropped */
    /* An element was promised to us. */
    q->res_get--;
    if (rc) {
        /* Cancelled after the promise: the element stays in the queue and
         * goes to the next getter. */
        serve_getters(q);
        return rc;
    }
    q_pop(q, out);
    q_removed(q);
    return 0;
}

int ferry_queue_get(ferry_queue *q, void *out)
{
    struct ferry_task *self;
    int rc;

    if (q == NULL || out == NULL)
        return -EINVAL;
    rc = q_enter(q, &self);
    if (rc)
        return rc;
    ferry__fuzz_point(self);
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (q_avail(q) > 0) {
        /* Available elements mean no getter waits (serve_getters() ran). */
        q_pop(q, out);
        q_removed(q);
        return 0;
    }
    return q_get_wait(q, self, out);
}

int ferry_queue_try_get(ferry_queue *q, void *out)
{
    int rc;

    rc = q_valid(q);
    if (rc == 0 && out == NULL)
        rc = -EINVAL;
    if (rc)
        return rc;
    rc = q_bind(q);
    if (rc)
        return rc;
    if (q_avail(q) == 0)
        return q->shutdown ? -ESHUTDOWN : -EAGAIN;
    q_pop(q, out);
    q_removed(q);
    return 0;
}

int ferry_queue_task_done(ferry_queue *q)
{
    int rc;

    rc = q_valid(q);
    if (rc)
        return rc;
    rc = q_bind(q);
    if (rc)
        return rc;
    if (q->unfinished == 0)
        return -EINVAL;
    if (--q->unfinished == 0)
        wake_all(q, &q->joiners, 0);
    return 0;
}

int ferry_queue_join(ferry_queue *q)
{
    struct ferry_task *self;
    struct ferry__waiter w;
    int rc;

    rc = q_valid(q);
    if (rc)
        return rc;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    rc = q_bind_task(q, self);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    if (rc || q->unfinished == 0)
        return rc;
    ferry__waiter_init(&w, self, "queue join", q);
    rc = ferry__wait(&q->joiners, &w, FERRY_NEVER);
    if (w.state == FERRY__W_GRANTED)
        q->pending--;
    return rc;
}

int ferry_queue_shutdown(ferry_queue *q, bool immediate)
{
    int rc;

    rc = q_valid(q);
    if (rc)
        return rc;
    rc = q_bind(q);
    if (rc)
        return rc;
    if (immediate && q->shutdown != 2) {
        size_t dropped = q->count;

        /* Drop everything, also elements promised to woken getters: they
         * see shutdown == 2 and return -ESHUTDOWN. */
        q->count = 0;
        q->head = 0;
        q->res_get = 0;
        q->unfinished -= dropped < q->unfinished ? dropped : q->unfinished;
        q->shutdown = 2;
        if (q->unfinished == 0)
            wake_all(q, &q->joiners, 0);
    } else if (q->shutdown == 0) {
        q->shutdown = 1;
    }
    /* Waiting getters exist only while nothing is available, so none of
     * them could still get an element. */
    wake_all(q, &q->getters, -ESHUTDOWN);
    wake_all(q, &q->putters, -ESHUTDOWN);
    return 0;
}

size_t ferry_queue_size(const ferry_queue *q)
{
    return q ? q->count : 0;
}

bool ferry_queue_empty(const ferry_queue *q)
{
    return q == NULL || q_avail(q) == 0;
}

bool ferry_queue_full(const ferry_queue *q)
{
    return q != NULL && q_free(q) == 0;
}

/* ---- for select (select_int.h) ------------------------------------------ */

int ferry__queue_sel_try(ferry_queue *q, struct ferry_task *self, void *buf, bool put, int *result)
{
    int rc;

    rc = q_valid(q);
    if (rc)
        return rc;
    rc = q_bind_task(q, self);
    if (rc)
        return rc;
    if (put) {
        if (q->shutdown) {
            *result = -ESHUTDOWN;
            return 1;
        }
        if (q_free(q) == 0)
            return 0;
        rc = q_room(q);
        if (rc)
            return rc;
        q_push(q, buf);
        q_added(q);
        *result = 0;
        return 1;
    }
    if (q_avail(q) == 0) {
        if (!q->shutdown)
            return 0;
        *result = -ESHUTDOWN;
        return 1;
    }
    q_pop(q, buf);
    q_removed(q);
    *result = 0;
    return 1;
}

struct ferry__waitq *ferry__queue_sel_waitq(ferry_queue *q, bool put)
{
    return put ? &q->putters : &q->getters;
}

/* The same steps as q_get_wait() and q_put_wait() after their wait, with
 * "cancelled after the promise" replaced by !perform. */
int ferry__queue_sel_done(ferry_queue *q, struct ferry__waiter *w, void *buf, bool put,
                          bool perform)
{
    q->pending--;
    if (w->result != 0)
        return w->result; /* woken by shutdown: nothing was promised */
    if (put) {
        q->res_put--;
        if (!perform || q->shutdown) {
            serve_putters(q);
            return perform ? -ESHUTDOWN : 0;
        }
        (void)q_room(q); /* never allocates: the slot exists */
        q_push(q, buf);
        q_added(q);
        return 0;
    }
    if (q->shutdown == 2)
        return perform ? -ESHUTDOWN : 0; /* the element was dropped */
    q->res_get--;
    if (!perform) {
        serve_getters(q);
        return 0;
    }
    q_pop(q, buf);
    q_removed(q);
    return 0;
}
