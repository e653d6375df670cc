/* fault_prim.c - allocation failures in the primitives that allocate
 * (queue storage, singleflight calls, per-key locks, their hash table):
 * every failing allocation gives -ENOMEM, changes nothing, leaks nothing.
 *
 * Each case fails the 1st, 2nd, ... allocation of one operation in turn,
 * once (transient) and from then on (persistent), until the operation runs
 * without reaching the armed point.  Right after every injected failure
 * the live allocations must be what they were before the call: a failed
 * call keeps nothing it allocated.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "htab.h"

#define T(name) \
    Test(fault_prim, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 20.)

static ferry_queue g_q;
static ferry_flight g_f;
static ferry_keylock g_kl;
static int g_calls;
static int g_bad;             /* inconsistencies seen inside tasks */
static char g_first_bad[160]; /* the first of them */

#define CHECK(cond) do {                                                        \
        if (!(cond) && !g_bad++)                                                \
            snprintf(g_first_bad, sizeof g_first_bad, "line %d: %s", __LINE__,  \
                     #cond);                                                    \
    } while (0)

static const char *const mode_name[2] = { "transient", "persistent" };

/* ---- Queue ---------------------------------------------------------- */

struct grow_arg {
    int kind;
    int enomem[2];            /* per mode */
};

static int queue_grow_main(void *arg)
{
    struct grow_arg *a = arg;
    int v, out;

    for (int persist = 0; persist < 2; persist++) {
        for (unsigned long nth = 1; nth < 10; nth++) {
            ferry_queue_init(&g_q, sizeof(int), 0, (enum ferry_queue_kind)a->kind, NULL, NULL);
            /* Fill to the first growth point (8), then one more. */
            for (v = 0; v < 8; v++)
                CHECK(ferry_queue_put(&g_q, &v) == 0);
            long live = ferry__alloc_live();
            ferry__fault_arm(nth, persist);
            int rc = ferry_queue_put(&g_q, &v);
            unsigned long hits = ferry__fault_hits();
            ferry__fault_reset();
            if (hits) {
                CHECK(rc == -ENOMEM);
                CHECK(ferry__alloc_live() == live);
                a->enomem[persist]++;
                CHECK(ferry_queue_size(&g_q) == 8);
            } else {
                CHECK(rc == 0);
                CHECK(ferry_queue_size(&g_q) == 9);
            }
            /* Everything stored comes out intact. */
            size_t n = ferry_queue_size(&g_q);
            for (size_t i = 0; i < n; i++) {
                CHECK(ferry_queue_try_get(&g_q, &out) == 0);
                if (a->kind == FERRY_QUEUE_FIFO)
                    CHECK(out == (int)i);
            }
            CHECK(ferry_queue_destroy(&g_q) == 0);
            if (!hits)
                break;
        }
    }
    return 0;
}

T(queue_growth_failure_inserts_nothing)
{
    int kinds[2] = { FERRY_QUEUE_FIFO, FERRY_QUEUE_LIFO };

    for (int k = 0; k < 2; k++) {
        struct grow_arg a = { .kind = kinds[k] };
        g_bad = 0;
        cr_assert_eq(tu_run(queue_grow_main, &a), 0);
        cr_assert_eq(g_bad, 0, "%d checks failed, first at %s", g_bad, g_first_bad);
        for (int m = 0; m < 2; m++)
            cr_assert_eq(a.enomem[m], 1, "%s: the growth makes one allocation, %d failed",
                         mode_name[m], a.enomem[m]);
    }
}

static int first_put_main(void *arg)
{
    int v = 3;
    long live = ferry__alloc_live();

    ferry_queue_init(&g_q, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL);
    ferry__fault_arm(1, true);
    CHECK(ferry_queue_try_put(&g_q, &v) == -ENOMEM);
    CHECK(ferry_queue_put(&g_q, &v) == -ENOMEM);
    ferry__fault_reset();
    CHECK(ferry__alloc_live() == live);
    CHECK(ferry_queue_size(&g_q) == 0);
    CHECK(ferry_queue_try_get(&g_q, &v) == -EAGAIN);
    CHECK(ferry_queue_join(&g_q) == 0);         /* nothing counted as put */
    CHECK(ferry_queue_put(&g_q, &v) == 0);
    CHECK(ferry_queue_destroy(&g_q) == 0);
    return 0;
}

T(queue_first_allocation_failure)
{
    g_bad = 0;
    cr_assert_eq(tu_run(first_put_main, NULL), 0);
    cr_assert_eq(g_bad, 0, "%d checks failed, first at %s", g_bad, g_first_bad);
}

/* ---- Singleflight --------------------------------------------------- */

static int count_fn(void *arg, void *out, size_t size)
{
    g_calls++;
    *(int *)out = 1;
    return 0;
}

static int flight_main(void *arg)
{
    int *enomem = arg;
    char key[32];
    int out;

    for (int persist = 0; persist < 2; persist++) {
        ferry_flight_init(&g_f);
        /* A new call allocates its entry and, in an empty group, the table. */
        for (unsigned long nth = 1; nth < 10; nth++) {
            snprintf(key, sizeof key, "key-%d-%lu", persist, nth);
            g_calls = 0;
            out = -1;
            long live = ferry__alloc_live();
            ferry__fault_arm(nth, persist);
            int rc = ferry_flight_do(&g_f, key, strlen(key), count_fn, NULL, &out, sizeof out);
            unsigned long hits = ferry__fault_hits();
            ferry__fault_reset();
            CHECK(ferry_flight_count(&g_f) == 0);
            if (hits) {
                CHECK(rc == -ENOMEM);
                CHECK(g_calls == 0);
                CHECK(out == -1);
                CHECK(ferry__alloc_live() == live);
                enomem[persist]++;
            } else {
                CHECK(rc == 0);
                CHECK(g_calls == 1);
                break;
            }
        }
        CHECK(ferry_flight_destroy(&g_f) == 0);
    }
    return 0;
}

T(flight_allocation_failure_runs_nothing)
{
    int enomem[2] = { 0, 0 };

    g_bad = 0;
    cr_assert_eq(tu_run(flight_main, enomem), 0);
    cr_assert_eq(g_bad, 0, "%d checks failed, first at %s", g_bad, g_first_bad);
    for (int m = 0; m < 2; m++)
        cr_assert_eq(enomem[m], 2, "%s: the call and the table are two allocations, %d failed",
                     mode_name[m], enomem[m]);
}

/* ---- Per-key locks and the table's growth --------------------------- */

static int keylock_main(void *arg)
{
    int *enomem = arg;
    char key[32];

    for (int persist = 0; persist < 2; persist++) {
        int held = 0;

        ferry_keylock_init(&g_kl);
        /* Hold keys up to and past the table's growth points, failing each
         * allocation of every acquire in turn. */
        for (int i = 0; i < 40; i++) {
            snprintf(key, sizeof key, "k%d", i);
            for (unsigned long nth = 1;; nth++) {
                long live = ferry__alloc_live();
                ferry__fault_arm(nth, persist);
                int rc = ferry_keylock_acquire(&g_kl, key, strlen(key));
                unsigned long hits = ferry__fault_hits();
                ferry__fault_reset();
                if (hits) {
                    CHECK(rc == -ENOMEM);
                    CHECK(!ferry_keylock_locked(&g_kl, key, strlen(key)));
                    CHECK(ferry_keylock_count(&g_kl) == (size_t)held);
                    CHECK(ferry__alloc_live() == live);
                    enomem[persist]++;
                    continue;
                }
                CHECK(rc == 0);
                held++;
                break;
            }
        }
        CHECK(ferry_keylock_count(&g_kl) == 40);
        /* Shrinking may fail too: the table keeps its larger array. */
        ferry__fault_arm(1, true);
        for (int i = 0; i < 40; i++) {
            snprintf(key, sizeof key, "k%d", i);
            CHECK(ferry_keylock_release(&g_kl, key, strlen(key)) == 0);
        }
        ferry__fault_reset();
        CHECK(ferry_keylock_count(&g_kl) == 0);
        CHECK(ferry_keylock_destroy(&g_kl) == 0);
    }
    return 0;
}

T(keylock_allocation_failures_change_nothing)
{
    int enomem[2] = { 0, 0 };

    g_bad = 0;
    cr_assert_eq(tu_run(keylock_main, enomem), 0);
    cr_assert_eq(g_bad, 0, "%d checks failed, first at %s", g_bad, g_first_bad);
    /* 40 entries plus the table's first allocation and its growths at 13
     * and 25 keys. */
    for (int m = 0; m < 2; m++)
        cr_assert_eq(enomem[m], 40 + 3, "%s: %d failed", mode_name[m], enomem[m]);
    cr_assert_eq(tu_leaks(), 0);
}
