/* ferry/queue.h - FIFO, LIFO and priority queues between tasks, with
 * backpressure (asyncio.Queue, LifoQueue, PriorityQueue).
 *
 * Elements have a fixed size chosen at init and are copied in by put and
 * out by get, so a queue carries pointers or small structs alike; what a
 * copied pointer points to stays the business of whoever holds the copy.
 *
 * A queue belongs to the loop that first uses it; from another thread or
 * another loop, every call returns -EPERM.  put, get and join suspend;
 * they are cancellation points (also when they need not wait) and honour
 * the task's deadline scopes.  All or nothing: a put that returns an error
 * inserted nothing, a get that returns an error removed nothing.
 *
 * Waiting tasks are served in FIFO order and no newcomer overtakes them:
 * when a get frees a slot, the slot is reserved for the first waiting
 * putter; when a put adds an item, it is reserved for the first waiting
 * getter.  A reserved slot or item whose task is cancelled before it runs
 * goes to the next waiter.
 *
 * Shutdown follows Python 3.13: afterwards put returns -ESHUTDOWN and get
 * drains what is left, then returns -ESHUTDOWN; an immediate shutdown also
 * drops the items (counting them as done for join).  Blocked putters and
 * getters are woken with -ESHUTDOWN.
 */
#ifndef FERRY_QUEUE_H
#define FERRY_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/detail.h"
#include "ferry/task.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_queue ferry_queue;

/*
 * Order of a priority queue: negative if `a` must come out before `b`,
 * positive if after, 0 if equal (equal elements come out in the order they
 * were put: the queue is stable).  Called on the loop thread with pointers
 * to elements aligned for any type; it must not call into the queue.
 */
typedef int (*ferry_queue_cmp)(const void *a, const void *b, void *arg);

/* Kinds of queue. */
enum ferry_queue_kind {
    FERRY_QUEUE_FIFO = 0,   /* first in, first out (the all-zero kind) */
    FERRY_QUEUE_LIFO,       /* last in, first out */
    FERRY_QUEUE_PRIORITY,   /* smallest by `cmp` first, stable */
};

struct ferry_queue {
    /* private: use the functions below */
    struct ferry__waitq getters;   /* tasks in ferry_queue_get() */
    struct ferry__waitq putters;   /* tasks in ferry_queue_put(); w->data = item */
    struct ferry__waitq joiners;   /* tasks in ferry_queue_join() */
    ferry_loop         *loop;      /* bound at first use */
    size_t              elem_size; /* bytes per element; 0: sizeof(void *) */
    size_t              capacity;  /* most elements held, 0: unbounded */
    int                 kind;      /* enum ferry_queue_kind */
    ferry_queue_cmp     cmp;       /* FERRY_QUEUE_PRIORITY only */
    void               *cmp_arg;   /* passed to cmp */
    unsigned char      *buf;       /* `slots` slots of `slot_size` bytes, plus one spare */
    size_t              slot_size; /* elem_size, or rounded up for the priority seq */
    size_t              slots;     /* slots allocated (without the spare) */
    size_t              head;      /* FIFO: index of the oldest element */
    size_t              count;     /* elements stored */
    size_t              res_get;   /* stored elements promised to woken getters */
    size_t              res_put;   /* free slots promised to woken putters */
    size_t              unfinished;/* put but not yet task_done */
    uint64_t            seq;       /* put counter: the priority tie-break */
    size_t              pending;   /* woken waiters that have not resumed yet */
    uint8_t             shutdown;  /* 0 open, 1 shut down, 2 shut down immediately */
};

/* Static initialisers.  All-zero storage (`ferry_queue q = {0};`, a static
 * queue, calloc'd memory) is a valid unbounded FIFO queue of pointers:
 * elem_size 0 in storage or an initialiser stands for sizeof(void *), and
 * put and get copy one `void *` in and out.  ferry_queue_init() still wants
 * an explicit size. */
#define FERRY_QUEUE_INIT(esize, cap) \
    { .elem_size = (esize), .capacity = (cap), .kind = FERRY_QUEUE_FIFO }
#define FERRY_QUEUE_LIFO_INIT(esize, cap) \
    { .elem_size = (esize), .capacity = (cap), .kind = FERRY_QUEUE_LIFO }
#define FERRY_QUEUE_PRIORITY_INIT(esize, cap, cmpfn, arg) \
    { .elem_size = (esize), .capacity = (cap), .kind = FERRY_QUEUE_PRIORITY, \
      .cmp = (cmpfn), .cmp_arg = (arg) }

/*
 * Initialise an empty, unbound queue of elements of `elem_size` bytes that
 * holds at most `capacity` of them (0: unbounded).  `cmp` and `arg` are for
 * FERRY_QUEUE_PRIORITY and must be NULL for the other kinds.  Storage is
 * allocated as elements arrive (see ferry_queue_put()).
 * Thread: any.  Suspends: no.
 * Returns: 0; -EINVAL (NULL queue, elem_size 0, unknown kind, priority
 * without cmp).
 */
int ferry_queue_init(ferry_queue *q, size_t elem_size, size_t capacity,
                     enum ferry_queue_kind kind, ferry_queue_cmp cmp, void *arg);

/*
 * Free the storage, dropping any elements left, and unbind.
 * Thread: the bound loop's; any if never used or once that loop is freed.
 * Suspends: no.
 * Returns: 0; -EBUSY (tasks wait on it, or woken ones have not run yet:
 * nothing changed); -EPERM; -EINVAL.
 */
int ferry_queue_destroy(ferry_queue *q);

/*
 * Copy the element at `item` into the queue, waiting while it is full.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (inserted); -ECANCELED, -ETIMEDOUT (nothing inserted);
 * -ESHUTDOWN (shut down, also while waiting: nothing inserted); -ENOMEM
 * (no room could be allocated: nothing inserted); -EPERM; -EINVAL.
 */
int ferry_queue_put(ferry_queue *q, const void *item);

/*
 * Insert without waiting.
 * Thread: loop (task or callback).  Suspends: no.
 * Returns: 0; -EAGAIN (full, or putters already wait: QueueFull);
 * -ESHUTDOWN; -ENOMEM; -EPERM; -EINVAL.
 */
int ferry_queue_try_put(ferry_queue *q, const void *item);

/*
 * Remove the next element (FIFO: oldest; LIFO: newest; priority: smallest)
 * and copy it to `out`, waiting while the queue is empty.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (copied to `out`); -ECANCELED, -ETIMEDOUT (nothing removed,
 * `out` untouched); -ESHUTDOWN (shut down and nothing left for us);
 * -EPERM; -EINVAL.
 */
int ferry_queue_get(ferry_queue *q, void *out /* OUT */);

/*
 * Remove without waiting.
 * Thread: loop (task or callback).  Suspends: no.
 * Returns: 0; -EAGAIN (nothing available now: QueueEmpty); -ESHUTDOWN
 * (shut down and nothing available); -EPERM; -EINVAL.
 */
int ferry_queue_try_get(ferry_queue *q, void *out /* OUT */);

/*
 * Mark one element taken by get as processed.  When every element put has
 * been marked, the tasks in ferry_queue_join() wake.
 * Thread: loop (task or callback).  Suspends: no.
 * Returns: 0; -EINVAL (more calls than elements put, or NULL); -EPERM.
 */
int ferry_queue_task_done(ferry_queue *q);

/*
 * Wait until every element put has been marked with task_done (returns at
 * once if so).
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0; -ECANCELED; -ETIMEDOUT; -EPERM; -EINVAL.
 */
int ferry_queue_join(ferry_queue *q);

/*
 * Shut the queue down (Python 3.13's Queue.shutdown): put fails with
 * -ESHUTDOWN from now on, and every blocked putter and getter wakes with
 * -ESHUTDOWN.  Gets still drain what is left, unless `immediate`, which
 * drops every stored element (also those promised to woken getters),
 * counts each one as done and so may release join.  A second call may
 * upgrade to immediate; otherwise it does nothing.
 * Thread: loop (task or callback).  Suspends: no.
 * Returns: 0; -EPERM; -EINVAL.
 */
int ferry_queue_shutdown(ferry_queue *q, bool immediate);

/* Thread: loop.  Suspends: no.
 * Returns: the elements stored now (including those promised to woken
 * getters). */
size_t ferry_queue_size(const ferry_queue *q);
/* Thread: loop.  Suspends: no.
 * Returns: true if a get would wait now (nothing stored that is not
 * promised to a woken getter). */
bool ferry_queue_empty(const ferry_queue *q);
/* Thread: loop.  Suspends: no.
 * Returns: true if a put would wait now (bounded, and no slot that is not
 * promised to a woken putter). */
bool ferry_queue_full(const ferry_queue *q);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_QUEUE_H */
