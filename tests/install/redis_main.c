/* redis_main.c - a program built out of tree against an installed ferry's
 * Redis part (ferry::ferry_redis, pkg-config ferry-redis), by
 * tests/install/check.sh.  No server is needed: it connects to a port of
 * 127.0.0.1 where nothing listens and exits 0 only if the connection is
 * refused cleanly (-ECONNREFUSED, no connection object).
 */
#include <errno.h>
#include <stdio.h>

#include <ferry/ferry.h>
#include <ferry/redis.h>

static int main_task(void *arg)
{
    ferry_redis *r = NULL;
    int rc = ferry_redis_connect(&r, "127.0.0.1", 1, NULL);

    (void)arg;
    if (rc != -ECONNREFUSED || r != NULL) {
        fprintf(stderr, "redis_main: connect gave %d\n", rc);
        return 1;
    }
    return 0;
}

int main(void)
{
#if !FERRY_HAVE_REDIS
#error "the installed ferry says it has no Redis part"
#endif
    return ferry_run(main_task, NULL);
}
