/* redis_uploads.c - "no more than five uploads at a time" across four
 * worker processes, with the limit kept in Redis.
 *
 * The seed (asyncio) ends where one process stops:
 *
 *     _s3_slots = asyncio.Semaphore(5)      # per process!
 *
 * With four worker processes that is twenty uploads at once.  This program
 * starts four workers (itself, spawned with an argument), each running 20
 * upload tasks; an "upload" is a 50 ms sleep.  Each upload counts itself
 * in and out on the server (INCR, and the highest count kept by a Lua
 * script), so the peak is measured where the processes meet.  First with
 * a ferry_sem of 5 in each process (the seed's mistake), then with
 * ferry_redis_sem "uploads" of 5 shared by all four.
 *
 *     redis_uploads [PORT]      a redis-server on 127.0.0.1:PORT (6379)
 */
#include <errno.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ferry/ferry.h"
#include "ferry/redis.h"

#define WORKERS   4
#define TASKS     20
#define LIMIT     5
#define UPLOAD_MS 50

extern char **environ;

static int port = 6379;
static bool shared_limit;       /* worker: the Redis semaphore, else a local one */
static ferry_redis *conn;
static ferry_redis_sem *slots;  /* shared_limit */
static ferry_sem local_slots = FERRY_SEM_INIT(LIMIT);
static int failures;
static int64_t last_fence;      /* fences seen by this worker grow */

static const char count_in_lua[] =
    "local c = redis.call('INCR', KEYS[1]) "
    "if c > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], c) end "
    "return c";

/* One upload, counted in and out on the server. */
static int put_object(void)
{
    const char *argv[] = { "EVAL", count_in_lua, "2", "uploads:running", "uploads:peak" };
    redisReply *rep = NULL;
    int rc = ferry_redis_commandv(conn, &rep, 5, argv, NULL);

    ferry_redis_reply_free(rep);
    if (rc == 0)
        rc = ferry_sleep(FERRY_MSEC(UPLOAD_MS));
    if (rc == 0)
        rc = ferry_redis_command(conn, &rep, "DECR uploads:running");
    ferry_redis_reply_free(rep);
    return rc;
}

static int upload_task(void *arg)
{
    ferry_redis_permit *permit;
    int rc;

    (void)arg;
    if (!shared_limit) {
        rc = ferry_sem_acquire(&local_slots);
        if (rc == 0) {
            rc = put_object();
            ferry_sem_release(&local_slots);
        }
    } else {
        rc = ferry_redis_sem_acquire(slots, &permit);
        if (rc == 0) {
            /* The fence goes with the write to the resource, which refuses
             * a lower one than it has seen. */
            if (ferry_redis_permit_fence(permit) <= last_fence)
                failures++;
            last_fence = ferry_redis_permit_fence(permit);
            rc = put_object();
            ferry_redis_permit_release(permit);
        }
    }
    if (rc)
        failures++;
    return 0;
}

static int worker_main(void *arg)
{
    ferry_group g;
    int rc;

    (void)arg;
    rc = ferry_redis_connect(&conn, "127.0.0.1", port, NULL);
    if (rc)
        return rc;
    if (shared_limit)
        rc = ferry_redis_sem_new(&slots, conn, "uploads", LIMIT, NULL);
    if (rc == 0) {
        ferry_group_init(&g);
        for (int i = 0; i < TASKS; i++)
            ferry_group_spawn(&g, upload_task, NULL, NULL);
        rc = ferry_group_wait(&g);
        ferry_redis_sem_free(slots);
    }
    ferry_redis_close(conn);
    return rc ? rc : failures;
}

/* Start the workers and wait for them (polling, so the loop stays free). */
static int run_workers(const char *self, const char *mode)
{
    char portbuf[16];
    char *argv[] = { (char *)self, (char *)mode, portbuf, NULL };
    pid_t pids[WORKERS];
    int bad = 0, status;

    snprintf(portbuf, sizeof(portbuf), "%d", port);
    for (int i = 0; i < WORKERS; i++) {
        if (posix_spawn(&pids[i], self, NULL, NULL, argv, environ) != 0)
            return -1;
    }
    for (int i = 0; i < WORKERS; i++) {
        while (waitpid(pids[i], &status, WNOHANG) == 0)
            ferry_sleep(FERRY_MSEC(10));
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            bad++;
    }
    return bad;
}

static long long get_int(const char *key)
{
    redisReply *rep = NULL;
    long long v = -1;

    if (ferry_redis_command(conn, &rep, "GET %s", key) == 0 && rep->type == REDIS_REPLY_STRING)
        v = strtoll(rep->str, NULL, 10);
    ferry_redis_reply_free(rep);
    return v;
}

static const char *self_path;

static int main_task(void *arg)
{
    redisReply *rep = NULL;
    long long peak_local, peak_shared;
    int bad;

    (void)arg;
    if (ferry_redis_connect(&conn, "127.0.0.1", port, NULL) != 0) {
        printf("no redis-server on 127.0.0.1:%d\n", port);
        return 1;
    }
    ferry_redis_command(conn, &rep, "DEL uploads:running uploads:peak");
    ferry_redis_reply_free(rep);
    bad = run_workers(self_path, "local");
    peak_local = get_int("uploads:peak");
    printf("a Semaphore(%d) in each process, %d workers x %d uploads: at most %lld at once "
           "(measured by the server)\n", LIMIT, WORKERS, TASKS, peak_local);

    ferry_redis_command(conn, &rep, "DEL uploads:running uploads:peak");
    ferry_redis_reply_free(rep);
    bad += run_workers(self_path, "shared");
    peak_shared = get_int("uploads:peak");
    printf("ferry_redis_sem 'uploads' of %d, %d workers x %d uploads: at most %lld at once "
           "(measured by the server), fences growing in every worker: %s\n",
           LIMIT, WORKERS, TASKS, peak_shared, bad ? "no" : "yes");
    ferry_redis_close(conn);
    return bad == 0 && peak_shared <= LIMIT ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && (strcmp(argv[1], "local") == 0 || strcmp(argv[1], "shared") == 0)) {
        shared_limit = strcmp(argv[1], "shared") == 0;
        port = atoi(argv[2]);
        return ferry_run(worker_main, NULL) == 0 ? 0 : 1;
    }
    if (argc == 2)
        port = atoi(argv[1]);
    self_path = "/proc/self/exe";
    return ferry_run(main_task, NULL);
}
