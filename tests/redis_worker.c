/* redis_worker.c - a process of its own for the multi-process tests of the
 * Redis semaphore (test_redis_sem.c starts it with posix_spawn, as ferry's
 * fork policy asks).
 *
 *   redis_worker limit PORT KEY LIMIT TASKS ITERS HOLD_MS
 *       TASKS tasks, each ITERS times: acquire a permit of KEY (LIMIT
 *       permits), count itself in on the server ("{KEY}:cur", the highest
 *       count in "{KEY}:peak", one Lua script), sleep HOLD_MS, count itself
 *       out, release.  The tasks start when stdin reaches its end (the
 *       test starts every process's at once), after the connection is
 *       made.  Exit 0 if every step succeeded.
 *   redis_worker hold PORT KEY LEASE_MS
 *       acquire the lock KEY with a lease of LEASE_MS, print its fence on
 *       stdout, then hold it (renewed) until killed.
 *   redis_worker acquire PORT KEY POLL_MS
 *       wait for the lock KEY, polling every POLL_MS (poll_min = poll_max),
 *       print its fence on stdout, release it and exit.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "ferry/redis.h"

static int port, limit, ntasks, iters, hold_ms, lease_ms, poll_ms;
static const char *key;
static ferry_redis *conn;
static ferry_redis_sem *sem;
static int failures;

static const char count_in_lua[] =
    "local c = redis.call('INCR', KEYS[1]) "
    "if c > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], c) end "
    "return c";

static int worker_task(void *arg)
{
    char cur[128], peak[128];
    redisReply *rep;

    (void)arg;
    snprintf(cur, sizeof(cur), "{%s}:cur", key);
    snprintf(peak, sizeof(peak), "{%s}:peak", key);
    for (int i = 0; i < iters; i++) {
        ferry_redis_permit *p;
        const char *argv[] = { "EVAL", count_in_lua, "2", cur, peak };
        int rc = ferry_redis_sem_acquire(sem, &p);

        if (rc) {
            fprintf(stderr, "redis_worker: acquire: %d\n", rc);
            failures++;
            return rc;
        }
        if (ferry_redis_commandv(conn, &rep, 5, argv, NULL) != 0)
            failures++;
        ferry_redis_reply_free(rep);
        ferry_sleep(FERRY_MSEC(hold_ms));
        if (ferry_redis_command(conn, &rep, "DECR %s", cur) != 0)
            failures++;
        ferry_redis_reply_free(rep);
        if (ferry_redis_permit_release(p) != 0)
            failures++;
    }
    return 0;
}

static int limit_main(void *arg)
{
    ferry_redis_sem_opts o = { .lease = FERRY_SEC(5), .poll_min = FERRY_MSEC(2),
                               .poll_max = FERRY_MSEC(20) };
    ferry_group g;
    int rc;

    (void)arg;
    rc = ferry_redis_connect(&conn, "127.0.0.1", port, NULL);
    if (rc)
        return rc;
    rc = ferry_redis_sem_new(&sem, conn, key, (unsigned)limit, &o);
    if (rc == 0) {
        char c;

        /* Blocks the loop, which has nothing else to do yet. */
        while (read(0, &c, 1) > 0)
            ;
        ferry_group_init(&g);
        for (int i = 0; i < ntasks; i++)
            ferry_group_spawn(&g, worker_task, NULL, NULL);
        rc = ferry_group_wait(&g);
        ferry_redis_sem_free(sem);
    }
    ferry_redis_close(conn);
    return rc ? rc : failures;
}

static int hold_main(void *arg)
{
    ferry_redis_sem_opts o = { .lease = FERRY_MSEC(lease_ms) };
    ferry_redis_permit *p;
    int rc;

    (void)arg;
    rc = ferry_redis_connect(&conn, "127.0.0.1", port, NULL);
    if (rc == 0)
        rc = ferry_redis_lock_new(&sem, conn, key, &o);
    if (rc == 0)
        rc = ferry_redis_sem_acquire(sem, &p);
    if (rc)
        return rc;
    printf("%" PRId64 "\n", ferry_redis_permit_fence(p));
    fflush(stdout);
    for (;;)
        ferry_sleep(FERRY_SEC(1));
}

static int acquire_main(void *arg)
{
    ferry_redis_sem_opts o = { .poll_min = FERRY_MSEC(poll_ms), .poll_max = FERRY_MSEC(poll_ms) };
    ferry_redis_permit *p;
    int rc;

    (void)arg;
    rc = ferry_redis_connect(&conn, "127.0.0.1", port, NULL);
    if (rc == 0)
        rc = ferry_redis_lock_new(&sem, conn, key, &o);
    if (rc == 0)
        rc = ferry_redis_sem_acquire(sem, &p);
    if (rc == 0) {
        printf("%" PRId64 "\n", ferry_redis_permit_fence(p));
        fflush(stdout);
        rc = ferry_redis_permit_release(p);
    }
    if (sem != NULL && ferry_redis_sem_free(sem) != 0 && rc == 0)
        rc = -EBUSY;
    ferry_redis_close(conn);
    return rc;
}

int main(int argc, char **argv)
{
    int rc;

    if (argc == 8 && strcmp(argv[1], "limit") == 0) {
        port = atoi(argv[2]);
        key = argv[3];
        limit = atoi(argv[4]);
        ntasks = atoi(argv[5]);
        iters = atoi(argv[6]);
        hold_ms = atoi(argv[7]);
        rc = ferry_run(limit_main, NULL);
    } else if (argc == 5 && strcmp(argv[1], "hold") == 0) {
        port = atoi(argv[2]);
        key = argv[3];
        lease_ms = atoi(argv[4]);
        rc = ferry_run(hold_main, NULL);
    } else if (argc == 5 && strcmp(argv[1], "acquire") == 0) {
        port = atoi(argv[2]);
        key = argv[3];
        poll_ms = atoi(argv[4]);
        rc = ferry_run(acquire_main, NULL);
    } else {
        fprintf(stderr, "usage: redis_worker limit PORT KEY LIMIT TASKS ITERS HOLD_MS\n"
                        "       redis_worker hold PORT KEY LEASE_MS\n"
                        "       redis_worker acquire PORT KEY POLL_MS\n");
        return 2;
    }
    if (rc)
        fprintf(stderr, "redis_worker %s: %d\n", argv[1], rc);
    return rc == 0 ? 0 : 1;
}
