/* test_htab.c - the hash table under singleflight and the per-key locks
 * (src/htab.h): keys that share a hash, removal in a probe run that wraps
 * around the end of the table, a table that cannot grow.
 */
#include <errno.h>
#include <stdint.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "htab.h"

#define T(name) Test(htab, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 10.)

struct ent {
    struct ferry__hent node;
};

static void ent_set(struct ent *e, uint64_t hash, const char *key, size_t len)
{
    e->node.hash = hash;
    e->node.key = (const unsigned char *)key;
    e->node.len = len;
}

T(tells_apart_keys_with_the_same_hash)
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

T(removal_shifts_a_probe_run_that_wraps_around)
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

T(a_table_that_cannot_double_refuses_an_insert_and_stays_unchanged)
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
