/* fault_prim.c - allocation failures in the primitives that allocate
 * (queue storage, singleflight calls, per-key locks, their hash table):
 * every failing allocation gives -ENOMEM, changes nothing, leaks nothing.
 *
 * Each case fails the 1st, 2nd, ... allocation of one operation in turn
 * until the operation runs without reaching the armed point.
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
static int g_enomem;          /* -ENOMEM results seen */

#define CHECK(cond) do { if (!(cond)) g_bad++; } while (0)

/* ---- Queue ---------------------------------------------------------- */

static int queue_grow_main(void *arg)
{
    int v, out;

    for (unsigned long nth = 1; nth < 10; nth++) {
        ferry_queue_init(&g_q, sizeof(int), 0, (enum ferry_queue_kind)*(int *)arg, NULL, NULL);
        /* Fill to the first growth point (8), then one more. */
        for (v = 0; v < 8; v++)
            CHECK(ferry_queue_put(&g_q, &v) == 0);
        ferry__fault_arm(nth, false);
        int rc = ferry_queue_put(&g_q, &v);
        unsigned long hits = ferry__fault_hits();
        ferry__fault_reset();
        if (hits) {
            CHECK(rc == -ENOMEM);
            g_enomem++;
            CHECK(ferry_queue_size(&g_q) == 8);
        } else {
            CHECK(rc == 0);
            CHECK(ferry_queue_size(&g_q) == 9);
        }
        /* Everything stored comes out intact. */
        size_t n = ferry_queue_size(&g_q);
        for (size_t i = 0; i < n; i++) {
            CHECK(ferry_queue_try_get(&g_q, &out) == 0);
            if (*(int *)arg == FERRY_QUEUE_FIFO)
                CHECK(out == (int)i);
        }
        CHECK(ferry_queue_destroy(&g_q) == 0);
        if (!hits)
            break;
    }
    return 0;
}

T(queue_growth_failure_inserts_nothing)
{
    int kinds[2] = { FERRY_QUEUE_FIFO, FERRY_QUEUE_LIFO };

    for (int k = 0; k < 2; k++) {
        g_bad = g_enomem = 0;
        cr_assert_eq(tu_run(queue_grow_main, &kinds[k]), 0);
        cr_assert_eq(g_bad, 0);
        cr_assert_eq(g_enomem, 1, "the growth makes one allocation");
    }
}

static int first_put_main(void *arg)
{
    int v = 3;

    ferry_queue_init(&g_q, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL);
    ferry__fault_arm(1, true);
    CHECK(ferry_queue_try_put(&g_q, &v) == -ENOMEM);
    CHECK(ferry_queue_put(&g_q, &v) == -ENOMEM);
    ferry__fault_reset();
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
    cr_assert_eq(g_bad, 0);
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
    char key[32];
    int out;

    ferry_flight_init(&g_f);
    /* A new call allocates its entry and, in an empty group, the table. */
    for (unsigned long nth = 1; nth < 10; nth++) {
        snprintf(key, sizeof key, "key-%lu", nth);
        g_calls = 0;
        out = -1;
        ferry__fault_arm(nth, false);
        int rc = ferry_flight_do(&g_f, key, strlen(key), count_fn, NULL, &out, sizeof out);
        unsigned long hits = ferry__fault_hits();
        ferry__fault_reset();
        CHECK(ferry_flight_count(&g_f) == 0);
        if (hits) {
            CHECK(rc == -ENOMEM);
            CHECK(g_calls == 0);
            CHECK(out == -1);
            g_enomem++;
        } else {
            CHECK(rc == 0);
            CHECK(g_calls == 1);
            break;
        }
    }
    CHECK(ferry_flight_destroy(&g_f) == 0);
    return 0;
}

T(flight_allocation_failure_runs_nothing)
{
    g_bad = g_enomem = 0;
    cr_assert_eq(tu_run(flight_main, NULL), 0);
    cr_assert_eq(g_bad, 0);
    cr_assert_eq(g_enomem, 2, "the call and the table are two allocations");
}

/* ---- Per-key locks and the table's growth --------------------------- */

static int keylock_main(void *arg)
{
    char key[32];
    int held = 0;

    ferry_keylock_init(&g_kl);
    /* Hold keys up to and past the table's growth points, failing each
     * allocation of every acquire in turn. */
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "k%d", i);
        for (unsigned long nth = 1;; nth++) {
            ferry__fault_arm(nth, false);
            int rc = ferry_keylock_acquire(&g_kl, key, strlen(key));
            unsigned long hits = ferry__fault_hits();
            ferry__fault_reset();
            if (hits) {
                CHECK(rc == -ENOMEM);
                CHECK(!ferry_keylock_locked(&g_kl, key, strlen(key)));
                CHECK(ferry_keylock_count(&g_kl) == (size_t)held);
                g_enomem++;
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
    return 0;
}

T(keylock_allocation_failures_change_nothing)
{
    g_bad = g_enomem = 0;
    cr_assert_eq(tu_run(keylock_main, NULL), 0);
    cr_assert_eq(g_bad, 0);
    /* 40 entries plus the table's first allocation and its growths at 13
     * and 25 keys. */
    cr_assert_eq(g_enomem, 40 + 3);
    cr_assert_eq(tu_leaks(), 0);
}
