/* test_queue.c - FIFO, LIFO and priority queues: order, backpressure,
 * cancellation with exact item accounting, task_done/join, shutdown.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry_int.h"

#define T(name) \
    Test(queue, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 10.)

static ferry_queue g_q;
static int g_rc[32];
static int g_got[32];

/* ---- Order ---------------------------------------------------------- */

static int order_main(void *arg)
{
    int *out = arg;

    for (int i = 0; i < 5; i++)
        if (ferry_queue_put(&g_q, &i))
            return 1;
    for (int i = 0; i < 5; i++)
        if (ferry_queue_get(&g_q, &out[i]))
            return 2;
    return 0;
}

T(fifo_and_lifo_order)
{
    int out[5];

    cr_assert_eq(ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(tu_run(order_main, out), 0);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(out[i], i);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);

    cr_assert_eq(ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_LIFO, NULL, NULL), 0);
    cr_assert_eq(tu_run(order_main, out), 0);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(out[i], 4 - i);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

/* Elements of 1 to 24 bytes (the ring copies 4, 8 and 16 bytes inline,
 * other sizes with memcpy): FIFO order through a bounded ring that wraps
 * many times, and through unbounded storage that grows while its head is
 * in the middle; LIFO order too. */
static size_t g_esize;

static void elem_fill(unsigned char *e, long v)
{
    for (size_t b = 0; b < g_esize; b++)
        e[b] = (unsigned char)(v * 31 + (long)b);
}

static int any_size_main(void *arg)
{
    unsigned char in[24], out[24];
    long next_put = 0, next_get = 0;
    (void)arg;

    /* Bounded (capacity 5): 3 in, 2 out, so the ring wraps again and again. */
    for (int round = 0; round < 20; round++) {
        for (int k = 0; k < 3 && next_put - next_get < 5; k++) {
            elem_fill(in, next_put++);
            if (ferry_queue_try_put(&g_q, in))
                return 1;
        }
        for (int k = 0; k < 2; k++) {
            elem_fill(in, next_get++);
            if (ferry_queue_try_get(&g_q, out) || memcmp(in, out, g_esize) != 0)
                return 2;
        }
    }
    while (next_get < next_put) {
        elem_fill(in, next_get++);
        if (ferry_queue_get(&g_q, out) || memcmp(in, out, g_esize) != 0)
            return 3;
    }
    return 0;
}

static int any_size_grow_main(void *arg)
{
    unsigned char in[24], out[24];
    bool lifo = arg != NULL;

    /* 6 in, 3 out (the head moves), then 40 more in: the storage grows
     * from 8 slots with its elements wrapped around the end. */
    for (long v = 0; v < 6; v++) {
        elem_fill(in, v);
        if (ferry_queue_put(&g_q, in))
            return 1;
    }
    for (long v = 0; v < 3; v++) {
        elem_fill(in, lifo ? 5 - v : v);
        if (ferry_queue_get(&g_q, out) || memcmp(in, out, g_esize) != 0)
            return 2;
    }
    for (long v = 6; v < 46; v++) {
        elem_fill(in, v);
        if (ferry_queue_put(&g_q, in))
            return 3;
    }
    for (long k = 0; k < 43; k++) {
        long v = lifo ? (k < 40 ? 45 - k : 2 - (k - 40)) : 3 + k;
        elem_fill(in, v);
        if (ferry_queue_get(&g_q, out) || memcmp(in, out, g_esize) != 0)
            return 4;
    }
    return 0;
}

T(elements_of_any_size_keep_their_order_through_wrap_and_growth)
{
    static const size_t sizes[] = { 1, 3, 4, 8, 12, 16, 24 };

    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        g_esize = sizes[i];
        cr_assert_eq(ferry_queue_init(&g_q, g_esize, 5, FERRY_QUEUE_FIFO, NULL, NULL), 0);
        cr_assert_eq(tu_run(any_size_main, NULL), 0, "size %zu, bounded FIFO", g_esize);
        cr_assert_eq(ferry_queue_destroy(&g_q), 0);
        cr_assert_eq(ferry_queue_init(&g_q, g_esize, 0, FERRY_QUEUE_FIFO, NULL, NULL), 0);
        cr_assert_eq(tu_run(any_size_grow_main, NULL), 0, "size %zu, growing FIFO", g_esize);
        cr_assert_eq(ferry_queue_destroy(&g_q), 0);
        cr_assert_eq(ferry_queue_init(&g_q, g_esize, 0, FERRY_QUEUE_LIFO, NULL, NULL), 0);
        cr_assert_eq(tu_run(any_size_grow_main, (void *)1), 0, "size %zu, LIFO", g_esize);
        cr_assert_eq(ferry_queue_destroy(&g_q), 0);
    }
}

struct job {
    int prio;
    int id;
    char pad[3];      /* an odd size: elements must still come out aligned */
};

static int g_misaligned;

static int job_cmp(const void *a, const void *b, void *arg)
{
    const struct job *x = a, *y = b;

    if (((uintptr_t)a % _Alignof(struct job)) || ((uintptr_t)b % _Alignof(struct job)))
        g_misaligned++;
    (*(int *)arg)++;
    return (x->prio > y->prio) - (x->prio < y->prio);
}

#define NJOBS 500

static int prio_main(void *arg)
{
    struct job *out = arg;
    unsigned seed = 42;

    for (int i = 0; i < NJOBS; i++) {
        struct job j = { .prio = rand_r(&seed) % 7, .id = i };
        if (ferry_queue_put(&g_q, &j))
            return 1;
    }
    for (int i = 0; i < NJOBS; i++)
        if (ferry_queue_get(&g_q, &out[i]))
            return 2;
    return 0;
}

T(priority_order_is_stable)
{
    static struct job out[NJOBS];
    int calls = 0;

    g_misaligned = 0;
    cr_assert_eq(ferry_queue_init(&g_q, sizeof(struct job), 0, FERRY_QUEUE_PRIORITY,
                                  job_cmp, &calls), 0);
    cr_assert_eq(tu_run(prio_main, out), 0);
    cr_assert_gt(calls, 0);
    cr_assert_eq(g_misaligned, 0);
    for (int i = 1; i < NJOBS; i++) {
        cr_assert_leq(out[i - 1].prio, out[i].prio, "priority order broken at %d", i);
        if (out[i - 1].prio == out[i].prio)
            cr_assert_lt(out[i - 1].id, out[i].id, "equal priorities out of put order at %d", i);
    }
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

static int grow_main(void *arg)
{
    for (int i = 0; i < 5000; i++)
        if (ferry_queue_try_put(&g_q, &i))
            return 1;
    for (int i = 0; i < 5000; i++) {
        int v = -1;
        if (ferry_queue_try_get(&g_q, &v) || v != i)
            return 2;
        /* Interleave so the ring wraps while it grows. */
        if (i % 3 == 0 && ferry_queue_try_put(&g_q, &(int){ 5000 + i }))
            return 3;
    }
    return 0;
}

T(unbounded_grows_and_gives_storage_back)
{
    cr_assert_eq(ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(tu_run(grow_main, NULL), 0);
    cr_assert_eq(ferry_queue_size(&g_q), 1667);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

static int drain_main(void *arg)
{
    int v;

    for (int i = 0; i < 3000; i++)
        if (ferry_queue_put(&g_q, &i))
            return 1;
    for (int i = 0; i < 3000; i++)
        if (ferry_queue_get(&g_q, &v) || v != i)
            return 2;
    return 0;
}

T(drained_large_queue_frees_its_storage)
{
    cr_assert_eq(ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(tu_run(drain_main, NULL), 0);
    cr_assert_null(g_q.buf);
    cr_assert_eq(ferry_queue_size(&g_q), 0);
}

/* ---- Backpressure and try ------------------------------------------- */

static int try_main(void *arg)
{
    int *r = arg, v = 7, out = 0;

    r[0] = ferry_queue_try_get(&g_q, &out);       /* empty: -EAGAIN */
    r[1] = ferry_queue_try_put(&g_q, &v);
    r[2] = ferry_queue_try_put(&g_q, &v);
    r[3] = ferry_queue_try_put(&g_q, &v);         /* maxsize 2: QueueFull */
    r[4] = ferry_queue_full(&g_q);
    r[5] = (int)ferry_queue_size(&g_q);
    r[6] = ferry_queue_try_get(&g_q, &out);
    r[7] = out;
    r[8] = ferry_queue_empty(&g_q);
    r[9] = ferry_queue_full(&g_q);
    return 0;
}

T(try_put_full_and_try_get_empty)
{
    int r[10];
    ferry_queue q = FERRY_QUEUE_INIT(sizeof(int), 2);

    g_q = q;
    cr_assert_eq(tu_run(try_main, r), 0);
    cr_assert_eq(r[0], -EAGAIN);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], 0);
    cr_assert_eq(r[3], -EAGAIN);
    cr_assert_eq(r[4], true);
    cr_assert_eq(r[5], 2);
    cr_assert_eq(r[6], 0);
    cr_assert_eq(r[7], 7);
    cr_assert_eq(r[8], false);
    cr_assert_eq(r[9], false);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

/* The seed's pipeline: 10 workers, a queue of 100, a producer that cannot
 * run ahead, sentinels to stop, join for the processing. */
static int g_processed, g_max_size;

static int pipe_worker(void *arg)
{
    int item;

    for (;;) {
        int rc = ferry_queue_get(&g_q, &item);
        if (rc)
            return rc;
        if (item < 0) {
            ferry_queue_task_done(&g_q);
            return 0;
        }
        ferry_yield();               /* handle(item) */
        g_processed++;
        ferry_queue_task_done(&g_q);
    }
}

static int pipeline_main(void *arg)
{
    ferry_group g;
    int stop = -1, rc;

    ferry_group_init(&g);
    for (int i = 0; i < 10; i++)
        ferry_group_spawn(&g, pipe_worker, NULL, NULL);
    for (int i = 0; i < 2000; i++) {
        if ((rc = ferry_queue_put(&g_q, &i)) != 0)
            return rc;
        if (ferry_queue_size(&g_q) > (size_t)g_max_size)
            g_max_size = (int)ferry_queue_size(&g_q);
    }
    rc = ferry_queue_join(&g_q);
    if (rc)
        return rc;
    for (int i = 0; i < 10; i++)
        ferry_queue_put(&g_q, &stop);
    return ferry_group_wait(&g);
}

T(pipeline_with_backpressure_and_join)
{
    ferry_queue_init(&g_q, sizeof(int), 100, FERRY_QUEUE_FIFO, NULL, NULL);
    g_processed = g_max_size = 0;
    cr_assert_eq(tu_run(pipeline_main, NULL), 0);
    cr_assert_eq(g_processed, 2000);
    cr_assert_leq(g_max_size, 100);
    cr_assert_eq(ferry_queue_size(&g_q), 0);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

/* ---- Cancellation --------------------------------------------------- */

static int getter(void *arg)
{
    int id = (int)(intptr_t)arg;

    g_got[id] = -1;
    g_rc[id] = ferry_queue_get(&g_q, &g_got[id]);
    return 0;
}

static int putter(void *arg)
{
    int id = (int)(intptr_t)arg;
    int item = 100 + id;

    g_rc[id] = ferry_queue_put(&g_q, &item);
    return 0;
}

static int get_cancel_main(void *arg)
{
    int *r = arg, v;
    ferry_task *t[4];

    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(getter, (void *)(intptr_t)i);
    tu_settle();
    ferry_task_cancel(t[2]);           /* middle one, while queued */
    tu_settle();
    v = 10;
    ferry_queue_put(&g_q, &v);          /* promised to 1 ... */
    ferry_task_cancel(t[1]);           /* ... cancelled before it runs */
    r[0] = ferry_queue_destroy(&g_q);   /* woken getter not run yet: busy */
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    r[1] = (int)ferry_queue_size(&g_q);
    return 0;
}

T(get_cancelled_queued_or_after_grant_loses_no_item)
{
    int r[2];

    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(get_cancel_main, r), 0);
    cr_assert_eq(r[0], -EBUSY);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_got[1], -1, "a cancelled get must leave `out` untouched");
    cr_assert_eq(g_rc[2], -ECANCELED);
    cr_assert_eq(g_got[2], -1);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_got[3], 10, "the item must reach the third getter");
    cr_assert_eq(r[1], 0);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

static int put_cancel_main(void *arg)
{
    int *r = arg, v = 1;
    ferry_task *t[4];

    ferry_queue_put(&g_q, &v);          /* full (capacity 1) */
    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(putter, (void *)(intptr_t)i);
    tu_settle();
    ferry_task_cancel(t[2]);
    tu_settle();
    ferry_queue_get(&g_q, &v);          /* slot promised to 1 ... */
    ferry_task_cancel(t[1]);           /* ... cancelled before it runs */
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    r[0] = (int)ferry_queue_size(&g_q);
    r[1] = -1;
    ferry_queue_try_get(&g_q, &r[1]);
    r[2] = ferry_queue_try_get(&g_q, &v);
    return 0;
}

T(put_cancelled_queued_or_after_grant_inserts_nothing)
{
    int r[3];

    ferry_queue_init(&g_q, sizeof(int), 1, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(put_cancel_main, r), 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_rc[2], -ECANCELED);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(r[0], 1);
    cr_assert_eq(r[1], 103, "only the third putter's item may be in the queue");
    cr_assert_eq(r[2], -EAGAIN);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

static int cancelled_uncontended_main(void *arg)
{
    int *r = arg, v = 5;

    ferry_queue_put(&g_q, &v);
    ferry_task_cancel(ferry_task_current());
    r[0] = ferry_queue_get(&g_q, &v);     /* item there, but cancelled */
    r[1] = ferry_queue_put(&g_q, &v);     /* room there, but cancelled */
    r[2] = (int)ferry_queue_size(&g_q);
    r[3] = ferry_queue_join(&g_q);
    return 0;
}

T(uncontended_get_put_join_are_cancellation_points)
{
    int r[4];

    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(cancelled_uncontended_main, r), 0);
    cr_assert_eq(r[0], -ECANCELED);
    cr_assert_eq(r[1], -ECANCELED);
    cr_assert_eq(r[2], 1);
    cr_assert_eq(r[3], -ECANCELED);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

static int deadline_getter(void *arg)
{
    ferry_scope s;
    int v = -1;

    ferry_scope_enter(&s, ferry_now() + tu_ms(10), 0);
    g_rc[0] = ferry_queue_get(&g_q, &v);
    ferry_scope_exit(&s);
    g_got[0] = v;
    return 0;
}

static int deadline_putter(void *arg)
{
    ferry_scope s;
    int v = 99;

    ferry_scope_enter(&s, ferry_now() + tu_ms(10), 0);
    g_rc[1] = ferry_queue_put(&g_q, &v);
    ferry_scope_exit(&s);
    return 0;
}

static int deadline_main(void *arg)
{
    int *r = arg, v = 1;

    tu_join(tu_spawn(deadline_getter, NULL));   /* empty queue */
    ferry_queue_put(&g_q, &v);             /* now full */
    tu_join(tu_spawn(deadline_putter, NULL));
    r[0] = (int)ferry_queue_size(&g_q);
    ferry_queue_get(&g_q, &r[1]);
    return 0;
}

T(deadline_expires_in_get_and_put)
{
    int r[2];

    ferry_queue_init(&g_q, sizeof(int), 1, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(deadline_main, r), 0);
    cr_assert_eq(g_rc[0], -ETIMEDOUT);
    cr_assert_eq(g_got[0], -1);
    cr_assert_eq(g_rc[1], -ETIMEDOUT);
    cr_assert_eq(r[0], 1);
    cr_assert_eq(r[1], 1);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

/*
 * Exact accounting under cancellation at every point: producers put unique
 * ids into a small queue, consumers get them, and a chaos task cancels a
 * task after a varying number of switches.  Every id whose put returned 0
 * must come out exactly once (from a get that returned 0 or the final
 * drain), and no other id may.
 */
#define NPROD 4
#define NCONS 4
#define PER_PROD 30
#define MAXID (NPROD * PER_PROD)

static unsigned char g_put_ok[MAXID], g_seen[MAXID];
static int g_dups, g_bogus;

static void seen(int id)
{
    if (id < 0 || id >= MAXID || !g_put_ok[id])
        g_bogus++;
    else if (g_seen[id]++)
        g_dups++;
}

static int chaos_producer(void *arg)
{
    int base = (int)(intptr_t)arg * PER_PROD;

    for (int i = 0; i < PER_PROD; i++) {
        int id = base + i;
        int rc = ferry_queue_put(&g_q, &id);
        if (rc == 0)
            g_put_ok[id] = 1;
        else if (rc != -ECANCELED)
            g_bogus++;
        if (rc)
            return 0;
    }
    return 0;
}

static int chaos_consumer(void *arg)
{
    for (;;) {
        int id = -7;
        int rc = ferry_queue_get(&g_q, &id);
        if (rc == 0) {
            seen(id);
            ferry_queue_task_done(&g_q);
        } else {
            if (id != -7)
                g_bogus++;          /* a failed get wrote `out` */
            return 0;
        }
        if (ferry_yield())
            return 0;
    }
}

static int int_cmp(const void *a, const void *b, void *arg)
{
    return (*(const int *)a % 5) - (*(const int *)b % 5);
}

static int chaos_main(void *arg)
{
    unsigned seed = (unsigned)(intptr_t)arg;
    ferry_task *t[NPROD + NCONS];
    int id;

    for (int i = 0; i < NPROD; i++)
        t[i] = tu_spawn(chaos_producer, (void *)(intptr_t)i);
    for (int i = 0; i < NCONS; i++)
        t[NPROD + i] = tu_spawn(chaos_consumer, NULL);
    for (int step = 0; step < 12; step++) {
        for (int k = rand_r(&seed) % 6; k >= 0; k--)
            ferry_yield();
        ferry_task_cancel(t[rand_r(&seed) % (NPROD + NCONS)]);
        if (rand_r(&seed) % 4 == 0) {
            /* Grant and cancel in the same step. */
            int v;
            if (ferry_queue_try_get(&g_q, &v) == 0) {
                seen(v);
                ferry_queue_task_done(&g_q);
            }
            ferry_task_cancel(t[NPROD + rand_r(&seed) % NCONS]);
        }
    }
    for (int i = 0; i < NPROD; i++)
        ferry_task_cancel(t[i]);
    for (int i = 0; i < NPROD + NCONS; i++)
        ferry_task_cancel(t[i]);
    for (int i = 0; i < NPROD + NCONS; i++)
        tu_join(t[i]);
    while (ferry_queue_try_get(&g_q, &id) == 0) {
        seen(id);
        ferry_queue_task_done(&g_q);
    }
    return ferry_queue_join(&g_q);
}

T(cancellation_at_every_point_keeps_exact_accounting)
{
    for (int seed = 1; seed <= 300; seed++) {
        memset(g_put_ok, 0, sizeof g_put_ok);
        memset(g_seen, 0, sizeof g_seen);
        g_dups = g_bogus = 0;
        /* Every kind, capacities 1 to 3. */
        enum ferry_queue_kind kind = (enum ferry_queue_kind)(seed % 3);
        ferry_queue_init(&g_q, sizeof(int), (size_t)(1 + (seed / 3) % 3), kind,
                         kind == FERRY_QUEUE_PRIORITY ? int_cmp : NULL, NULL);
        cr_assert_eq(tu_run(chaos_main, (void *)(intptr_t)seed), 0, "seed %d", seed);
        cr_assert_eq(g_dups, 0, "an item came out twice (seed %d)", seed);
        cr_assert_eq(g_bogus, 0, "an item came out that was not put (seed %d)", seed);
        for (int id = 0; id < MAXID; id++)
            cr_assert_eq(g_seen[id], g_put_ok[id], "item %d lost (seed %d)", id, seed);
        cr_assert_eq(ferry_queue_destroy(&g_q), 0);
    }
}

/* ---- task_done / join ----------------------------------------------- */

static int joiner(void *arg)
{
    int id = (int)(intptr_t)arg;

    g_rc[id] = ferry_queue_join(&g_q);
    return 0;
}

static int join_main(void *arg)
{
    int *r = arg, v = 1;
    ferry_task *j;

    r[0] = ferry_queue_task_done(&g_q);      /* nothing put: -EINVAL */
    r[1] = ferry_queue_join(&g_q);           /* nothing unfinished: at once */
    ferry_queue_put(&g_q, &v);
    ferry_queue_put(&g_q, &v);
    j = tu_spawn(joiner, (void *)(intptr_t)1);
    tu_settle();
    ferry_queue_get(&g_q, &v);
    ferry_queue_get(&g_q, &v);
    ferry_queue_task_done(&g_q);
    tu_settle();
    r[2] = g_rc[1];                          /* still waiting: sentinel */
    r[3] = ferry_queue_task_done(&g_q);
    tu_join(j);
    r[4] = ferry_queue_task_done(&g_q);      /* beyond: -EINVAL */
    return 0;
}

T(task_done_and_join)
{
    int r[5];

    g_rc[1] = 12345;
    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_LIFO, NULL, NULL);
    cr_assert_eq(tu_run(join_main, r), 0);
    cr_assert_eq(r[0], -EINVAL);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], 12345);
    cr_assert_eq(r[3], 0);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(r[4], -EINVAL);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

/* ---- Shutdown ------------------------------------------------------- */

static int graceful_main(void *arg)
{
    int *r = arg, v;
    ferry_task *p[3], *g[3], *j;

    for (v = 1; v <= 2; v++)
        ferry_queue_put(&g_q, &v);            /* full */
    for (int i = 1; i <= 2; i++)
        p[i] = tu_spawn(putter, (void *)(intptr_t)i);
    j = tu_spawn(joiner, (void *)(intptr_t)5);
    tu_settle();
    r[0] = ferry_queue_shutdown(&g_q, false);
    for (int i = 1; i <= 2; i++)
        tu_join(p[i]);
    r[1] = ferry_queue_put(&g_q, &v);         /* -ESHUTDOWN */
    r[2] = ferry_queue_try_put(&g_q, &v);
    r[3] = ferry_queue_get(&g_q, &r[10]);     /* drains: 1 */
    r[4] = ferry_queue_try_get(&g_q, &r[11]); /* drains: 2 */
    r[5] = ferry_queue_get(&g_q, &v);         /* empty: -ESHUTDOWN */
    r[6] = ferry_queue_try_get(&g_q, &v);
    /* Getters blocked on an empty queue at shutdown. */
    for (int i = 3; i <= 4; i++)
        g[i - 3] = tu_spawn(getter, (void *)(intptr_t)i);
    tu_settle();
    ferry_queue_task_done(&g_q);
    ferry_queue_task_done(&g_q);
    tu_join(j);
    for (int i = 0; i < 2; i++)
        tu_join(g[i]);
    r[7] = ferry_queue_destroy(&g_q);
    return 0;
}

T(graceful_shutdown_wakes_putters_and_drains)
{
    int r[12];

    ferry_queue_init(&g_q, sizeof(int), 2, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(graceful_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(g_rc[1], -ESHUTDOWN);
    cr_assert_eq(g_rc[2], -ESHUTDOWN);
    cr_assert_eq(r[1], -ESHUTDOWN);
    cr_assert_eq(r[2], -ESHUTDOWN);
    cr_assert_eq(r[3], 0);
    cr_assert_eq(r[10], 1);
    cr_assert_eq(r[4], 0);
    cr_assert_eq(r[11], 2);
    cr_assert_eq(r[5], -ESHUTDOWN);
    cr_assert_eq(r[6], -ESHUTDOWN);
    cr_assert_eq(g_rc[3], -ESHUTDOWN);
    cr_assert_eq(g_rc[4], -ESHUTDOWN);
    cr_assert_eq(g_rc[5], 0, "join returns once both items are done");
    cr_assert_eq(r[7], 0);
}

static int blocked_getters_main(void *arg)
{
    int *r = arg;
    ferry_task *g[3];

    for (int i = 0; i < 3; i++)
        g[i] = tu_spawn(getter, (void *)(intptr_t)(i + 1));
    tu_settle();
    r[0] = ferry_queue_shutdown(&g_q, false);
    for (int i = 0; i < 3; i++)
        tu_join(g[i]);
    r[1] = ferry_queue_shutdown(&g_q, false);     /* again: nothing */
    return 0;
}

T(shutdown_wakes_blocked_getters)
{
    int r[2];

    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(blocked_getters_main, r), 0);
    cr_assert_eq(r[0], 0);
    for (int i = 1; i <= 3; i++)
        cr_assert_eq(g_rc[i], -ESHUTDOWN);
    cr_assert_eq(r[1], 0);
    cr_assert(ferry__waitq_empty(&g_q.getters));
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

static int immediate_main(void *arg)
{
    int *r = arg, v = 0;
    ferry_task *p, *j;

    for (int i = 0; i < 3; i++)
        ferry_queue_put(&g_q, &v);                 /* full (3) */
    p = tu_spawn(putter, (void *)(intptr_t)2);
    j = tu_spawn(joiner, (void *)(intptr_t)3);
    tu_settle();
    ferry_queue_get(&g_q, &v);                     /* slot promised to 2 */
    ferry_queue_task_done(&g_q);
    /* Shut down before putter 2 runs: its item must not go in. */
    r[0] = ferry_queue_shutdown(&g_q, true);
    r[1] = (int)ferry_queue_size(&g_q);
    tu_join(p);
    tu_join(j);
    r[2] = ferry_queue_get(&g_q, &v);
    r[3] = (int)ferry_queue_size(&g_q);
    r[4] = ferry_queue_task_done(&g_q);            /* dropped ones count as done */
    r[5] = ferry_queue_destroy(&g_q);
    return 0;
}

T(immediate_shutdown_drops_items_and_releases_join)
{
    int r[6];

    ferry_queue_init(&g_q, sizeof(int), 3, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(immediate_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(g_rc[2], -ESHUTDOWN);
    cr_assert_eq(g_rc[3], 0, "join must be released by the immediate shutdown");
    cr_assert_eq(r[2], -ESHUTDOWN);
    cr_assert_eq(r[3], 0);
    cr_assert_eq(r[4], -EINVAL);
    cr_assert_eq(r[5], 0);
}

static int immediate_promised_main(void *arg)
{
    int *r = arg, v = 42;
    ferry_task *g, *j;

    g = tu_spawn(getter, (void *)(intptr_t)1);
    tu_settle();
    ferry_queue_put(&g_q, &v);                     /* promised to getter 1 */
    j = tu_spawn(joiner, (void *)(intptr_t)2);
    r[0] = ferry_queue_shutdown(&g_q, true);       /* before 1 runs */
    tu_join(g);
    tu_join(j);
    r[1] = (int)ferry_queue_size(&g_q);
    return 0;
}

T(immediate_shutdown_drops_item_promised_to_a_getter)
{
    int r[2];

    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(immediate_promised_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(g_rc[1], -ESHUTDOWN);
    cr_assert_eq(g_got[1], -1);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

/* ---- NULL and invalid arguments, storage limits ------------------------ */

static int nulls_rc[32], nnulls, nbools;
static bool nulls_bool[8];

static int nulls_task(void *arg)
{
    ferry_queue bad_kind = { .elem_size = 4, .kind = 7 };
    ferry_queue neg_kind = { .elem_size = 4, .kind = -1 };
    ferry_queue no_cmp = FERRY_QUEUE_PRIORITY_INIT(4, 0, NULL, NULL);
    ferry_queue q = FERRY_QUEUE_INIT(sizeof(int), 0);
    int item = 1, i = 0, b = 0;

    (void)arg;
    /* Bad arguments and queues that were never valid. */
    nulls_rc[i++] = ferry_queue_init(NULL, 4, 0, FERRY_QUEUE_FIFO, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 0, 0, FERRY_QUEUE_FIFO, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 4, 0, (enum ferry_queue_kind)3, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 4, 0, (enum ferry_queue_kind)-1, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 4, 0, FERRY_QUEUE_FIFO, NULL, &item);   /* arg without cmp */
    nulls_rc[i++] = ferry_queue_destroy(NULL);
    nulls_rc[i++] = ferry_queue_put(&bad_kind, &item);
    nulls_rc[i++] = ferry_queue_put(&neg_kind, &item);
    nulls_rc[i++] = ferry_queue_put(&no_cmp, &item);
    nulls_rc[i++] = ferry_queue_put(&q, NULL);
    nulls_rc[i++] = ferry_queue_try_put(&q, NULL);
    nulls_rc[i++] = ferry_queue_get(&q, NULL);
    nulls_rc[i++] = ferry_queue_get(&bad_kind, &item);
    nulls_rc[i++] = ferry_queue_try_get(&q, NULL);
    nulls_rc[i++] = ferry_queue_try_get(&bad_kind, &item);
    nulls_rc[i++] = ferry_queue_task_done(&bad_kind);
    nulls_rc[i++] = ferry_queue_join(&bad_kind);
    nulls_rc[i++] = ferry_queue_shutdown(&bad_kind, false);
    nulls_bool[b++] = ferry_queue_size(NULL) != 0;
    nulls_bool[b++] = !ferry_queue_empty(NULL);
    nulls_bool[b++] = ferry_queue_full(NULL);
    nnulls = i;
    /* Nothing was bound or allocated by the refusals. */
    nulls_bool[b++] = q.loop != NULL;
    nbools = b;
    return 0;
}

T(refuses_null_and_invalid_arguments_and_binds_nothing)
{
    cr_assert_eq(tu_run(nulls_task, NULL), 0);
    cr_assert_eq(nnulls, 18);
    cr_assert_eq(nbools, 4);
    tu_assert_einval_and_false(nulls_rc, nnulls, nulls_bool, nbools);
}

static int cmp_bytes(const void *a, const void *b, void *arg)
{
    (void)arg;
    return memcmp(a, b, 1);
}

static int qlimit_rc[4];

static int queue_limits_task(void *arg)
{
    /* Element sizes no storage can hold: refused before any copy. */
    ferry_queue prio = FERRY_QUEUE_PRIORITY_INIT(SIZE_MAX / 2 + 2, 0, cmp_bytes, NULL);
    ferry_queue fifo = FERRY_QUEUE_INIT(SIZE_MAX / 4, 0);
    char item[16] = { 0 };

    (void)arg;
    qlimit_rc[0] = ferry_queue_try_put(&prio, item);
    qlimit_rc[1] = ferry_queue_put(&fifo, item);
    qlimit_rc[2] = (int)(ferry_queue_size(&prio) + ferry_queue_size(&fifo));
    qlimit_rc[3] = ferry_queue_destroy(&prio) + ferry_queue_destroy(&fifo);
    return 0;
}

T(element_size_too_large_to_store_is_enomem)
{
    cr_assert_eq(tu_run(queue_limits_task, NULL), 0);
    cr_assert_eq(qlimit_rc[0], -ENOMEM);
    cr_assert_eq(qlimit_rc[1], -ENOMEM);
    cr_assert_eq(qlimit_rc[2], 0);
    cr_assert_eq(qlimit_rc[3], 0);
}

/* ---- The all-zero queue --------------------------------------------- */

static ferry_queue zq_static;
static int zq_rc[16];
static void *zq_out[6];
static char za, zb, zc;

/* `ferry_queue q = {0};` and a static queue are unbounded FIFO queues of
 * pointers: every put of a pointer comes out in order, and more puts than
 * any small default bound would allow do not wait. */
static int zero_queue_main(void *arg)
{
    ferry_queue q = { 0 };
    void *items[3] = { &za, &zb, &zc };
    int n = 0;

    (void)arg;
    for (int i = 0; i < 3; i++)
        zq_rc[n++] = ferry_queue_put(&q, &items[i]);
    for (int i = 0; i < 3; i++)
        zq_rc[n++] = ferry_queue_get(&q, &zq_out[i]);
    for (int i = 0; i < 1000 && zq_rc[n] == 0; i++)
        zq_rc[n] = ferry_queue_try_put(&zq_static, &items[i % 3]);
    n++;
    zq_rc[n++] = ferry_queue_size(&zq_static) == 1000 ? 0 : -1;
    for (int i = 0; i < 3; i++)
        zq_rc[n++] = ferry_queue_get(&zq_static, &zq_out[3 + i]);
    zq_rc[n++] = ferry_queue_destroy(&q);
    zq_rc[n++] = ferry_queue_destroy(&zq_static);
    return n;
}

T(all_zero_queue_is_an_unbounded_fifo_of_pointers)
{
    int n = tu_run(zero_queue_main, NULL);

    for (int i = 0; i < 13; i++)
        cr_assert_eq(zq_rc[i], 0, "step %d: %d", i, zq_rc[i]);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(zq_out[i], i % 3 == 0 ? (void *)&za : i % 3 == 1 ? (void *)&zb : (void *)&zc,
                     "item %d out of order", i);
    cr_assert_eq(n, 13, "the task returned %d", n);
}

/* ---- Errors --------------------------------------------------------- */

static int bind_q(void *arg)
{
    int v = 1;
    return ferry_queue_put(&g_q, &v);
}

static int foreign_q(int *r)
{
    int n = 0, v = 0;

    r[n++] = ferry_queue_put(&g_q, &v);
    r[n++] = ferry_queue_try_put(&g_q, &v);
    r[n++] = ferry_queue_get(&g_q, &v);
    r[n++] = ferry_queue_try_get(&g_q, &v);
    r[n++] = ferry_queue_task_done(&g_q);
    r[n++] = ferry_queue_join(&g_q);
    r[n++] = ferry_queue_shutdown(&g_q, true);
    r[n++] = ferry_queue_destroy(&g_q);
    return n;
}

T(errors_einval_eperm)
{
    int r[1];

    cr_assert_eq(ferry_queue_init(NULL, 4, 0, FERRY_QUEUE_FIFO, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_queue_init(&g_q, 0, 0, FERRY_QUEUE_FIFO, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_queue_init(&g_q, 4, 0, FERRY_QUEUE_PRIORITY, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_queue_init(&g_q, 4, 0, FERRY_QUEUE_FIFO, job_cmp, NULL), -EINVAL);
    cr_assert_eq(ferry_queue_init(&g_q, 4, 0, (enum ferry_queue_kind)7, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_queue_try_put(NULL, &r[0]), -EINVAL);

    cr_assert_eq(ferry_queue_init(&g_q, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(tu_run(bind_q, NULL), 0);
    tu_assert_eperm_elsewhere(foreign_q);
    cr_assert_eq(ferry_queue_size(&g_q), 1);
    cr_assert_eq(ferry_queue_destroy(&g_q), 0);
}

static int destroy_busy_main(void *arg)
{
    int *r = arg;
    ferry_task *t = tu_spawn(getter, (void *)(intptr_t)1);

    tu_settle();
    r[0] = ferry_queue_destroy(&g_q);
    ferry_task_cancel(t);
    tu_join(t);
    r[1] = ferry_queue_destroy(&g_q);
    return 0;
}

T(destroy_with_waiters_is_ebusy)
{
    int r[2];

    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(tu_run(destroy_busy_main, r), 0);
    cr_assert_eq(r[0], -EBUSY);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(tu_leaks(), 0);
}

static ferry_queue pq = FERRY_QUEUE_INIT(sizeof(int), 1);
static int pq_rc[4] = { 1, 1, 1, 1 }, putter_rc = 1;

static int blocked_putter(void *arg)
{
    int v = 2;

    (void)arg;
    putter_rc = ferry_queue_put(&pq, &v);
    return 0;
}

static int queue_putter_main(void *arg)
{
    ferry_task *p;
    int v = 1, out = 0;

    (void)arg;
    pq_rc[3] = ferry_queue_empty(&pq);
    ferry_queue_put(&pq, &v);                  /* full now */
    ferry_task_spawn(&p, NULL, blocked_putter, NULL, NULL);
    ferry_yield();                             /* the putter waits */
    pq_rc[0] = ferry_queue_destroy(&pq);
    ferry_queue_get(&pq, &out);
    ferry_task_join(p, NULL);
    ferry_queue_get(&pq, &out);
    pq_rc[1] = out;
    pq_rc[2] = ferry_queue_destroy(&pq);
    return 0;
}

T(destroy_is_ebusy_while_a_putter_waits)
{
    cr_assert_eq(tu_run(queue_putter_main, NULL), 0);
    cr_assert_eq(pq_rc[3], 1, "a new queue is empty");
    cr_assert_eq(pq_rc[0], -EBUSY);
    cr_assert_eq(putter_rc, 0);
    cr_assert_eq(pq_rc[1], 2);
    cr_assert_eq(pq_rc[2], 0);
}

static ferry_queue jq = FERRY_QUEUE_INIT(sizeof(int), 0);
static int jq_rc[5] = { 1, 1, 1, 1, 1 }, joined_rc = 1;

static int queue_joiner(void *arg)
{
    (void)arg;
    joined_rc = ferry_queue_join(&jq);
    return 0;
}

static int queue_destroy_main(void *arg)
{
    ferry_task *j;
    int v = 5, out = 0;

    (void)arg;
    ferry_queue_put(&jq, &v);
    ferry_task_spawn(&j, NULL, queue_joiner, NULL, NULL);
    ferry_yield();                               /* the joiner waits */
    jq_rc[0] = ferry_queue_destroy(&jq);         /* a joiner waits */
    ferry_queue_get(&jq, &out);
    ferry_queue_task_done(&jq);                  /* the joiner is woken */
    jq_rc[1] = ferry_queue_destroy(&jq);         /* ... but has not run */
    ferry_task_join(j, NULL);
    jq_rc[2] = ferry_queue_destroy(&jq);
    jq_rc[3] = out;
    jq_rc[4] = ferry_queue_task_done(&jq);       /* destroyed: all-zero, nothing put */
    return 0;
}

T(destroy_is_ebusy_while_a_joiner_waits_or_has_not_run)
{
    cr_assert_eq(tu_run(queue_destroy_main, NULL), 0);
    cr_assert_eq(jq_rc[0], -EBUSY);
    cr_assert_eq(jq_rc[1], -EBUSY);
    cr_assert_eq(jq_rc[2], 0);
    cr_assert_eq(jq_rc[3], 5);
    cr_assert_eq(jq_rc[4], -EINVAL);
    cr_assert_eq(joined_rc, 0);
}

/* ---- Destroy once the bound loop is freed --------------------------- */

/* Put two items (the queue keeps storage), then wait for a third get that
 * never comes: the loop's freeing cancels the wait. */
static int fill_then_wait(void *arg)
{
    int v = 1;

    (void)arg;
    ferry_queue_put(&g_q, &v);
    ferry_queue_put(&g_q, &v);
    return ferry_queue_join(&g_q);
}

static void *thread_destroy_queue(void *arg)
{
    *(int *)arg = ferry_queue_destroy(&g_q);
    return NULL;
}

T(destroy_after_the_bound_loop_is_freed)
{
    ferry_loop *loop2;
    int rt = 1;

    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(ferry_loop_new(&loop2, NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, loop2, fill_then_wait, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop2, FERRY_RUN_ONCE), 0);
    cr_assert_eq(ferry_queue_size(&g_q), 2);
    tu_on_thread(thread_destroy_queue, &rt);
    cr_assert_eq(rt, -EPERM, "from a thread while the loop lives: %d", rt);

    ferry_loop_free(loop2);
    rt = 1;
    tu_on_thread(thread_destroy_queue, &rt);
    cr_assert_eq(rt, 0, "from a thread once the loop is freed: %d", rt);
    cr_assert_eq(ferry_queue_size(&g_q), 0);
    cr_assert_eq(tu_leaks(), 0, "the queue's storage was given back");
}
