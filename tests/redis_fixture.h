/* redis_fixture.h - the Criterion fixture of the Redis tests: a loop and a
 * redis-server of the test's own (redis_server.h) in g_srv.  Without
 * redis-server the test is skipped, and says so on stderr, so that a
 * machine without it cannot pass the Redis tests silently.
 * Define REDIS_SUITE (the suite's name, a bare word) before including it.
 */
#ifndef FERRY_TESTS_REDIS_FIXTURE_H
#define FERRY_TESTS_REDIS_FIXTURE_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "redis_server.h"
#include "testutil.h"

#define REDIS_STR_(x) #x
#define REDIS_STR(x) REDIS_STR_(x)

static struct tu_redis g_srv;

static void redis_setup(void)
{
    int rc;

    tu_loop_setup();
    memset(&g_srv, 0, sizeof(g_srv));
    rc = tu_redis_start(&g_srv);
    if (rc == -ENOENT) {
        fprintf(stderr, "%s: SKIPPED: no redis-server in PATH (install redis-server)\n",
                REDIS_STR(REDIS_SUITE));
        cr_skip_test("no redis-server");
    }
    cr_assert_eq(rc, 0, "redis-server did not start: %d", rc);
}

static void redis_teardown(void)
{
    tu_redis_stop(&g_srv);
    tu_loop_teardown();
}

#endif /* FERRY_TESTS_REDIS_FIXTURE_H */
