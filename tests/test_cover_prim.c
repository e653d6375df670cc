/* test_cover_prim.c - the error returns and rare paths of the primitives
 * (lock, semaphore, event, condition, queue, singleflight, per-key locks)
 * and of the hash table under them (issue 6: every error-return branch
 * reached), each checked for what it returns and what it leaves behind.
 * Assertions stay on the main stack (TESTING.md): task bodies record.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "htab.h"

#define T(name) Test(cover_prim, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

static int ret0(void *arg)
{
    (void)arg;
    return 0;
}

/* Run fn(arg) in a new thread and wait for it. */
static void on_thread(void *(*fn)(void *), void *arg)
{
    pthread_t th;

    cr_assert_eq(pthread_create(&th, NULL, fn, arg), 0);
    pthread_join(th, NULL);
}

/* ---- NULL and invalid arguments ------------------------------------- */

static int nulls_rc[64], nnulls, nbools;
static bool nulls_bool[16];

static int nulls_task(void *arg)
{
    ferry_sem sem;
    ferry_cond cond = FERRY_COND_INIT;
    ferry_queue bad_kind = { .elem_size = 4, .kind = 7 };
    ferry_queue neg_kind = { .elem_size = 4, .kind = -1 };
    ferry_queue no_cmp = FERRY_QUEUE_PRIORITY_INIT(4, 0, NULL, NULL);
    ferry_queue zero = { 0 };
    ferry_queue q = FERRY_QUEUE_INIT(sizeof(int), 0);
    ferry_flight f = FERRY_FLIGHT_INIT;
    ferry_keylock kl = FERRY_KEYLOCK_INIT;
    int item = 1, i = 0, b = 0;

    (void)arg;
    /* lock */
    nulls_rc[i++] = ferry_lock_init(NULL);
    nulls_rc[i++] = ferry_lock_destroy(NULL);
    nulls_rc[i++] = ferry_lock_acquire(NULL);
    nulls_rc[i++] = ferry_lock_try_acquire(NULL);
    nulls_rc[i++] = ferry_lock_release(NULL);
    nulls_bool[b++] = ferry_lock_locked(NULL);
    /* semaphore */
    nulls_rc[i++] = ferry_sem_init(NULL, 1, 0);
    nulls_rc[i++] = ferry_sem_init(&sem, 1, 0x40);
    nulls_rc[i++] = ferry_sem_destroy(NULL);
    nulls_rc[i++] = ferry_sem_acquire_n(NULL, 1);
    nulls_rc[i++] = ferry_sem_try_acquire_n(NULL, 1);
    nulls_rc[i++] = ferry_sem_release_n(NULL, 1);
    nulls_bool[b++] = ferry_sem_value(NULL) != 0;
    /* event */
    nulls_rc[i++] = ferry_event_init(NULL);
    nulls_rc[i++] = ferry_event_destroy(NULL);
    nulls_rc[i++] = ferry_event_set(NULL);
    nulls_rc[i++] = ferry_event_clear(NULL);
    nulls_rc[i++] = ferry_event_wait(NULL);
    nulls_bool[b++] = ferry_event_is_set(NULL);
    /* condition */
    nulls_rc[i++] = ferry_cond_init(NULL, NULL);
    nulls_rc[i++] = ferry_cond_destroy(NULL);
    nulls_rc[i++] = ferry_cond_wait(NULL);
    nulls_rc[i++] = ferry_cond_wait_for(&cond, NULL, NULL);
    nulls_rc[i++] = ferry_cond_notify(NULL, 1);
    nulls_bool[b++] = ferry_cond_lock(NULL) != NULL;
    /* queue: bad arguments and queues that were never valid */
    nulls_rc[i++] = ferry_queue_init(NULL, 4, 0, FERRY_QUEUE_FIFO, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 0, 0, FERRY_QUEUE_FIFO, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 4, 0, (enum ferry_queue_kind)3, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 4, 0, (enum ferry_queue_kind)-1, NULL, NULL);
    nulls_rc[i++] = ferry_queue_init(&q, 4, 0, FERRY_QUEUE_FIFO, NULL, &item);   /* arg without cmp */
    nulls_rc[i++] = ferry_queue_destroy(NULL);
    nulls_rc[i++] = ferry_queue_put(&bad_kind, &item);
    nulls_rc[i++] = ferry_queue_put(&neg_kind, &item);
    nulls_rc[i++] = ferry_queue_put(&no_cmp, &item);
    nulls_rc[i++] = ferry_queue_put(&zero, &item);
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
    /* singleflight and per-key locks */
    nulls_rc[i++] = ferry_flight_init(NULL);
    nulls_rc[i++] = ferry_flight_destroy(NULL);
    nulls_bool[b++] = ferry_flight_count(NULL) != 0;
    nulls_rc[i++] = ferry_keylock_init(NULL);
    nulls_rc[i++] = ferry_keylock_destroy(NULL);
    nulls_rc[i++] = ferry_keylock_acquire(NULL, "k", 1);
    nulls_rc[i++] = ferry_keylock_try_acquire(&kl, NULL, 1);
    nulls_rc[i++] = ferry_keylock_release(&kl, NULL, 1);
    nulls_bool[b++] = ferry_keylock_count(NULL) != 0;
    nulls_bool[b++] = ferry_keylock_locked(NULL, "k", 1);
    nulls_bool[b++] = ferry_keylock_locked(&kl, NULL, 1);
    nulls_bool[b++] = ferry_keylock_locked(&kl, "k", 1);   /* no such key */
    nulls_bool[b++] = ferry_keylock_locked(&kl, NULL, 0);  /* the empty key, not held */
    nnulls = i;
    /* Nothing was bound or allocated by the refusals. */
    nulls_bool[b++] = q.loop != NULL || f.loop != NULL || kl.loop != NULL || kl.keys.cap != 0;
    nbools = b;
    return 0;
}

T(every_primitive_refuses_null_and_invalid_arguments)
{
    cr_assert_eq(tu_run(nulls_task, NULL), 0);
    cr_assert_eq(nnulls, 47);
    cr_assert_eq(nbools, 14);
    for (int i = 0; i < nnulls; i++)
        cr_assert_eq(nulls_rc[i], -EINVAL, "call %d returned %d", i, nulls_rc[i]);
    for (int i = 0; i < nbools; i++)
        cr_assert_not(nulls_bool[i], "predicate %d", i);
}

/* ---- semaphore limits --------------------------------------------------- */

static int sem_rc[8];

static int sem_limits_task(void *arg)
{
    ferry_sem sem = FERRY_SEM_INIT(UINT64_MAX - 1);
    ferry_sem bounded = FERRY_SEM_BOUNDED_INIT(2);

    (void)arg;
    sem_rc[0] = ferry_sem_release_n(&sem, 2);           /* would wrap */
    sem_rc[1] = ferry_sem_release_n(&sem, 0);
    sem_rc[2] = ferry_sem_try_acquire_n(&sem, 0);
    sem_rc[3] = ferry_sem_try_acquire_n(&bounded, 3);   /* above the bound: never */
    sem_rc[4] = ferry_sem_acquire_n(&bounded, 3);
    sem_rc[5] = ferry_sem_release(&bounded);            /* above the bound */
    sem_rc[6] = ferry_sem_release_n(&sem, 1);           /* exactly UINT64_MAX */
    sem_rc[7] = ferry_sem_value(&sem) == UINT64_MAX && ferry_sem_value(&bounded) == 2;
    return 0;
}

T(semaphore_refuses_wrapping_zero_and_unsatisfiable_counts)
{
    cr_assert_eq(tu_run(sem_limits_task, NULL), 0);
    cr_assert_eq(sem_rc[0], -EOVERFLOW);
    cr_assert_eq(sem_rc[1], -EINVAL);
    cr_assert_eq(sem_rc[2], -EINVAL);
    cr_assert_eq(sem_rc[3], -EINVAL);
    cr_assert_eq(sem_rc[4], -EINVAL);
    cr_assert_eq(sem_rc[5], -EOVERFLOW);
    cr_assert_eq(sem_rc[6], 0);
    cr_assert_eq(sem_rc[7], 1, "a refused call changed the count");
}

/* ---- destroy while in use ------------------------------------------------ */

static ferry_sem busy_sem;
static ferry_event busy_ev;
static ferry_lock shared_lock;
static ferry_cond busy_cond;
static int destroy_rc[10], waiter_rc[3] = { 1, 1, 1 };

static int sem_waiter(void *arg)
{
    (void)arg;
    waiter_rc[0] = ferry_sem_acquire(&busy_sem);
    return 0;
}

static int ev_waiter(void *arg)
{
    (void)arg;
    waiter_rc[1] = ferry_event_wait(&busy_ev);
    return 0;
}

static int cond_waiter(void *arg)
{
    (void)arg;
    ferry_lock_acquire(&shared_lock);
    waiter_rc[2] = ferry_cond_wait(&busy_cond);
    ferry_lock_release(&shared_lock);
    return 0;
}

static int destroy_busy_main(void *arg)
{
    ferry_task *t[3];
    int i = 0;

    (void)arg;
    ferry_cond_init(&busy_cond, &shared_lock);
    ferry_task_spawn(&t[0], NULL, sem_waiter, NULL, NULL);
    ferry_task_spawn(&t[1], NULL, ev_waiter, NULL, NULL);
    ferry_task_spawn(&t[2], NULL, cond_waiter, NULL, NULL);
    ferry_yield();                                     /* all three wait */
    destroy_rc[i++] = ferry_sem_destroy(&busy_sem);    /* a waiter */
    destroy_rc[i++] = ferry_event_destroy(&busy_ev);
    destroy_rc[i++] = ferry_cond_destroy(&busy_cond);
    /* Woken but not yet run: still busy. */
    ferry_sem_release(&busy_sem);
    ferry_event_set(&busy_ev);
    ferry_lock_acquire(&shared_lock);
    ferry_cond_notify(&busy_cond, 1);
    ferry_lock_release(&shared_lock);
    destroy_rc[i++] = ferry_sem_destroy(&busy_sem);
    destroy_rc[i++] = ferry_cond_destroy(&busy_cond);
    for (int k = 0; k < 3; k++)
        ferry_task_join(t[k], NULL);
    destroy_rc[i++] = ferry_sem_destroy(&busy_sem);
    destroy_rc[i++] = ferry_event_destroy(&busy_ev);
    destroy_rc[i++] = ferry_cond_destroy(&busy_cond);
    destroy_rc[i++] = ferry_lock_destroy(&shared_lock);
    return i;
}

T(destroy_of_a_primitive_with_waiters_or_woken_waiters_is_ebusy)
{
    cr_assert_eq(tu_run(destroy_busy_main, NULL), 9);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(destroy_rc[i], -EBUSY, "destroy %d returned %d", i, destroy_rc[i]);
    for (int i = 5; i < 9; i++)
        cr_assert_eq(destroy_rc[i], 0, "destroy %d returned %d", i, destroy_rc[i]);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(waiter_rc[i], 0, "waiter %d returned %d", i, waiter_rc[i]);
}

/* ---- condition: preconditions ------------------------------------------- */

static int cond_rc[4] = { 1, 1, 1, 1 };
static int pred_calls;

static bool count_pred(void *arg)
{
    (void)arg;
    pred_calls++;
    return true;
}

static int cond_pre_task(void *arg)
{
    ferry_cond c = FERRY_COND_INIT;

    (void)arg;
    cond_rc[0] = ferry_cond_wait_for(&c, count_pred, NULL);   /* lock not held */
    ferry_lock_acquire(ferry_cond_lock(&c));
    ferry_task_cancel(ferry_task_current());
    cond_rc[1] = ferry_cond_wait_for(&c, count_pred, NULL);   /* cancelled: pred not called */
    cond_rc[2] = ferry_lock_locked(ferry_cond_lock(&c));      /* still held */
    ferry_lock_release(ferry_cond_lock(&c));
    cond_rc[3] = ferry_cond_destroy(&c);
    return 0;
}

T(cond_wait_for_checks_the_lock_and_cancellation_before_the_predicate)
{
    cr_assert_eq(tu_run(cond_pre_task, NULL), 0);
    cr_assert_eq(cond_rc[0], -EPERM);
    cr_assert_eq(cond_rc[1], -ECANCELED);
    cr_assert_eq(cond_rc[2], 1);
    cr_assert_eq(cond_rc[3], 0);
    cr_assert_eq(pred_calls, 0);
}

/* ---- from another thread ------------------------------------------------- */

static ferry_lock fl_lock;
static ferry_cond own_cond;     /* its own lock used directly, the condition never */
static int foreign_rc[3] = { 1, 1, 1 };

static int bind_task(void *arg)
{
    (void)arg;
    ferry_lock_acquire(&fl_lock);
    ferry_lock_release(&fl_lock);
    ferry_lock_acquire(ferry_cond_lock(&own_cond));
    ferry_lock_release(ferry_cond_lock(&own_cond));
    return 0;
}

static void *foreign_destroys(void *arg)
{
    (void)arg;
    foreign_rc[0] = ferry_lock_destroy(&fl_lock);
    foreign_rc[1] = ferry_cond_destroy(&own_cond);
    foreign_rc[2] = ferry_lock_try_acquire(&fl_lock);
    return NULL;
}

T(destroy_from_a_thread_other_than_the_bound_loops_is_eperm)
{
    cr_assert_eq(tu_run(bind_task, NULL), 0);
    on_thread(foreign_destroys, NULL);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(foreign_rc[i], -EPERM, "call %d returned %d", i, foreign_rc[i]);
    /* Still bound and usable here. */
    cr_assert_eq(ferry_lock_destroy(&fl_lock), 0);
    cr_assert_eq(ferry_cond_destroy(&own_cond), 0);
}

/* ---- queue storage limits ------------------------------------------------ */

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

T(queue_with_an_element_size_too_large_to_store_returns_enomem)
{
    cr_assert_eq(tu_run(queue_limits_task, NULL), 0);
    cr_assert_eq(qlimit_rc[0], -ENOMEM);
    cr_assert_eq(qlimit_rc[1], -ENOMEM);
    cr_assert_eq(qlimit_rc[2], 0);
    cr_assert_eq(qlimit_rc[3], 0);
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

T(queue_destroy_is_ebusy_while_a_putter_waits)
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
    jq_rc[4] = ferry_queue_task_done(&jq);       /* destroyed: all-zero, invalid */
    return 0;
}

T(queue_destroy_is_ebusy_while_a_joiner_waits_or_has_not_run)
{
    cr_assert_eq(tu_run(queue_destroy_main, NULL), 0);
    cr_assert_eq(jq_rc[0], -EBUSY);
    cr_assert_eq(jq_rc[1], -EBUSY);
    cr_assert_eq(jq_rc[2], 0);
    cr_assert_eq(jq_rc[3], 5);
    cr_assert_eq(jq_rc[4], -EINVAL);
    cr_assert_eq(joined_rc, 0);
}

/* ---- singleflight ---------------------------------------------------------- */

static ferry_flight fg = FERRY_FLIGHT_INIT;
static int flight_rc[2] = { 1, 1 }, fn_calls;

static int yield_then(void *arg, void *out, size_t out_size)
{
    (void)out; (void)out_size;
    fn_calls++;
    ferry_yield();                 /* the second caller joins meanwhile */
    return (int)(intptr_t)arg;
}

struct caller {
    int idx;      /* where its result goes */
    int status;   /* what fn returns if it leads */
};

static int flight_caller(void *arg)
{
    struct caller *c = arg;

    flight_rc[c->idx] = ferry_flight_do(&fg, "key", 3, yield_then,
                                        (void *)(intptr_t)c->status, NULL, 0);
    return 0;
}

/* Two callers of one key; the leader's fn returns `status`. */
static void flight_pair(int status)
{
    struct caller c[2] = { { 0, status }, { 1, status } };
    ferry_task *t[2];

    fn_calls = 0;
    flight_rc[0] = flight_rc[1] = 1;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ferry_task_spawn(&t[i], tu_loop, flight_caller, &c[i], NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ferry_task_try_join(t[i], NULL), 0);
}

T(singleflight_without_a_result_buffer_shares_the_status)
{
    flight_pair(0);
    cr_assert_eq(fn_calls, 1);
    cr_assert_eq(flight_rc[0], 0);
    cr_assert_eq(flight_rc[1], 0);
    cr_assert_eq(ferry_flight_count(&fg), 0);
    cr_assert_eq(ferry_flight_destroy(&fg), 0);
}

T(singleflight_leader_timing_out_on_its_own_fails_the_waiters_too)
{
    /* fn returns -ETIMEDOUT although its task was neither cancelled nor
     * past a deadline: the waiter is not handed the lead, it shares the
     * failure. */
    flight_pair(-ETIMEDOUT);
    cr_assert_eq(fn_calls, 1);
    cr_assert_eq(flight_rc[0], -ETIMEDOUT);
    cr_assert_eq(flight_rc[1], -ETIMEDOUT);
    cr_assert_eq(ferry_flight_count(&fg), 0);
    cr_assert_eq(ferry_flight_destroy(&fg), 0);
}

/* ---- per-key locks ------------------------------------------------------- */

static ferry_keylock kl = FERRY_KEYLOCK_INIT;
static int kl_rc[4] = { 1, 1, 1, 1 };
static ferry_event kl_go;

static int key_holder(void *arg)
{
    (void)arg;
    ferry_keylock_acquire(&kl, "k", 1);
    ferry_event_wait(&kl_go);
    return ferry_keylock_release(&kl, "k", 1);
}

static int key_thief(void *arg)
{
    (void)arg;
    kl_rc[0] = ferry_keylock_release(&kl, "k", 1);     /* held by another task */
    kl_rc[1] = ferry_keylock_release(&kl, "nope", 4);  /* nobody's */
    kl_rc[2] = ferry_keylock_locked(&kl, "k", 1);
    kl_rc[3] = (int)ferry_keylock_count(&kl);
    return ferry_event_set(&kl_go);
}

T(keylock_release_by_a_task_that_does_not_hold_the_key_is_eperm)
{
    ferry_task *h, *t;
    int st = 1;

    cr_assert_eq(ferry_task_spawn(&h, tu_loop, key_holder, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, key_thief, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(h, &st), 0);
    cr_assert_eq(st, 0, "the holder's release failed: %d", st);
    cr_assert_eq(ferry_task_try_join(t, NULL), 0);
    cr_assert_eq(kl_rc[0], -EPERM);
    cr_assert_eq(kl_rc[1], -EPERM);
    cr_assert_eq(kl_rc[2], 1);
    cr_assert_eq(kl_rc[3], 1, "a failed release made or dropped a key");
    cr_assert_eq(ferry_keylock_count(&kl), 0);
    cr_assert_eq(ferry_keylock_destroy(&kl), 0);
}

static int kl_nomem_rc[3] = { 1, 1, 1 };

static int keylock_nomem_task(void *arg)
{
    ferry_keylock k = FERRY_KEYLOCK_INIT;

    (void)arg;
    ferry__fault_arm(1, true);
    kl_nomem_rc[0] = ferry_keylock_try_acquire(&k, "k", 1);
    ferry__fault_reset();
    kl_nomem_rc[1] = (int)ferry_keylock_count(&k);
    kl_nomem_rc[2] = ferry_keylock_try_acquire(&k, "k", 1);
    ferry_keylock_release(&k, "k", 1);
    return ferry_keylock_destroy(&k);
}

T(keylock_try_acquire_without_memory_is_enomem_and_makes_no_key)
{
    cr_assert_eq(tu_run(keylock_nomem_task, NULL), 0);
    cr_assert_eq(kl_nomem_rc[0], -ENOMEM);
    cr_assert_eq(kl_nomem_rc[1], 0);
    cr_assert_eq(kl_nomem_rc[2], 0);
}

/* ---- the hash table ------------------------------------------------------- */

struct ent {
    struct ferry__hent node;
};

static void ent_set(struct ent *e, uint64_t hash, const char *key, size_t len)
{
    e->node.hash = hash;
    e->node.key = (const unsigned char *)key;
    e->node.len = len;
}

Test(cover_prim, htab_tells_apart_keys_with_the_same_hash)
{
    struct ferry__htab t = { 0 };
    struct ent e[4];
    size_t pos = 0, n = 0;

    /* Four keys, one hash: lengths and bytes must decide. */
    ent_set(&e[0], 5, "a", 1);
    ent_set(&e[1], 5, "ab", 2);
    ent_set(&e[2], 5, "ac", 2);
    ent_set(&e[3], 5, "", 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ferry__htab_insert(&t, &e[i].node), 0);
    cr_assert_eq(ferry__htab_find(&t, 5, "a", 1), &e[0].node);
    cr_assert_eq(ferry__htab_find(&t, 5, "ab", 2), &e[1].node);
    cr_assert_eq(ferry__htab_find(&t, 5, "ac", 2), &e[2].node);
    cr_assert_eq(ferry__htab_find(&t, 5, "", 0), &e[3].node);
    cr_assert_null(ferry__htab_find(&t, 5, "ad", 2));
    cr_assert_null(ferry__htab_find(&t, 5, "abc", 3));
    cr_assert_null(ferry__htab_find(&t, 6, "a", 1));
    ferry__htab_remove(&t, &e[1].node);
    cr_assert_null(ferry__htab_find(&t, 5, "ab", 2));
    cr_assert_eq(ferry__htab_find(&t, 5, "ac", 2), &e[2].node);
    cr_assert_eq(ferry__htab_find(&t, 5, "", 0), &e[3].node);
    while (ferry__htab_next(&t, &pos))
        n++;
    cr_assert_eq(n, 3);
    cr_assert_eq(t.count, 3);
    ferry__htab_release(&t);
    cr_assert_eq(t.cap, 0);
}

Test(cover_prim, htab_removal_shifts_a_probe_run_that_wraps_around)
{
    struct ferry__htab t = { 0 };
    struct ent e[4];

    /* Home slot 15 of 16: the run wraps to slots 0 and 1; a key whose
     * home is 0 comes after it. */
    ent_set(&e[0], 15, "x", 1);
    ent_set(&e[1], 15, "y", 1);
    ent_set(&e[2], 15, "z", 1);
    ent_set(&e[3], 16, "w", 1);      /* home slot 0 */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ferry__htab_insert(&t, &e[i].node), 0);
    cr_assert_eq(t.cap, HTAB_MIN_SLOTS);
    ferry__htab_remove(&t, &e[0].node);
    cr_assert_null(ferry__htab_find(&t, 15, "x", 1));
    cr_assert_eq(ferry__htab_find(&t, 15, "y", 1), &e[1].node);
    cr_assert_eq(ferry__htab_find(&t, 15, "z", 1), &e[2].node);
    cr_assert_eq(ferry__htab_find(&t, 16, "w", 1), &e[3].node);
    cr_assert_eq(t.slots[15], &e[1].node, "the run was not shifted back into the hole");
    ferry__htab_remove(&t, &e[2].node);
    ferry__htab_remove(&t, &e[1].node);
    cr_assert_eq(ferry__htab_find(&t, 16, "w", 1), &e[3].node);
    cr_assert_eq(t.slots[0], &e[3].node);
    ferry__htab_release(&t);
}

Test(cover_prim, htab_that_cannot_double_refuses_an_insert_and_stays_unchanged)
{
    /* A table of 2^63 slots (never allocated: only its counters) that is
     * 3/4 full cannot grow: the doubled size would wrap to 0. */
    struct ferry__htab t = { .slots = NULL, .cap = (SIZE_MAX >> 1) + 1,
                             .count = (SIZE_MAX >> 3) + 1 };
    struct ferry__htab before = t;
    struct ent e;

    ent_set(&e, 1, "k", 1);
    cr_assert_eq(ferry__htab_insert(&t, &e.node), -ENOMEM);
    cr_assert_eq(t.cap, before.cap);
    cr_assert_eq(t.count, before.count);
    cr_assert_null(t.slots);
}
