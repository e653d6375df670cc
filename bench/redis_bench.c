/* redis_bench.c - the Redis part (ferry/redis.h, ferry/redis_queue.h)
 * against a plain blocking hiredis client, the floor, and a small asyncio
 * program with redis-py's asyncio client, in the same run.
 *
 *   ferry-redis-bench [-r RUNS] [-n OPS] [-p PORT] [-L LIMIT] [-T TASKS]
 *                     [-H HOLD_US] [WORKLOAD...]
 *
 * Workloads (default: all), the first four each done by 1 and by 4
 * processes at once:
 *
 *   redis_queue_1p, redis_queue_4p  one op = a put, a get through the
 *             consumer group and an ack: ferry_redis_queue_put(),
 *             ferry_redis_queue_get(), ferry_redis_queue_ack() in one task
 *             (system ferry); XADD, XREADGROUP ... BLOCK, XACK with
 *             redisCommand() in a loop (system hiredis-blocking); the
 *             same three commands awaited in turn with redis.asyncio
 *             (system asyncio-redispy, bench/redis_asyncio.py).  Every
 *             process puts before it gets, so each get finds an item.
 *             check=ok: every process ended well, the stream holds OPS
 *             entries and none is pending.
 *
 *   redis_sem_1p, redis_sem_4p  one op = an acquire and a release of a
 *             permit of a semaphore of 4 permits (so the processes never
 *             wait for each other: the round trip is measured, not the
 *             polling): ferry_redis_sem_acquire() and
 *             ferry_redis_permit_release() in one task (system ferry); the
 *             same Lua scripts with redisCommand() (EVALSHA for both, the
 *             release sent without waiting for its answer: it is read
 *             with the next acquire's, as ferry's release is not waited
 *             for either); the same with
 *             redis.asyncio, the release and the next acquire sent in one
 *             pipeline (system asyncio-redispy, which reads the scripts
 *             from redis/redis_sem_lua.h).  check=ok: every process ended
 *             well, the fence counter is OPS, nothing is held, and
 *             (systems ferry and asyncio-redispy) the scripts they loaded
 *             are this program's copies (else the floor runs other
 *             scripts: FAIL).
 *
 *   redis_limiter_4p  a service's shape: 4 processes of TASKS tasks
 *             (default 64), each taking requests in turn until its process
 *             has done its share; a request holds a permit of a semaphore
 *             of LIMIT permits (default 32) for HOLD_US (default 2,000 us,
 *             a ferry_sleep()).  Systems: ferry (the wake channel), ferry-
 *             polling (the same with opts.poll_only: polls every 5 ms
 *             doubling up to 100 ms) and no-limiter (the same requests
 *             without the semaphore).  A table gives the requests per
 *             second, their share of what the limit allows (LIMIT permits
 *             each busy all the time: LIMIT / HOLD_US), and the acquire
 *             scripts the server ran per grant (INFO commandstats:
 *             EVALSHA calls, less the one release of each grant, over
 *             grants).  check=ok: every process ended
 *             well, the fence counter is OPS and nothing is held.
 *
 * OPS (default 20,000) is the total over the processes.  Each
 * measurement runs in fresh processes (this program, run again with
 * --child, or python3 running bench/redis_asyncio.py): they connect and
 * set up, say they are ready, and the timed part runs from the moment all
 * are released until the last has exited.  The server is flushed before
 * each measurement.  Systems take turns at going first from run to run,
 * so that a drift of the machine's load spreads over all.  The asyncio
 * row runs when the python3 of PATH can import redis.asyncio (redis-py 4.2
 * or later); otherwise one line says it is left out, and the other two
 * systems run.
 *
 * The server is a redis-server started here on a free port of 127.0.0.1
 * (as the tests start theirs), or the one at -p PORT on 127.0.0.1 (it is
 * flushed: give a scratch server).  rss_kb is the largest peak RSS of the
 * measurement's processes.
 *
 * stdout: a note "# run R: load average L at its start" before each run
 * and a BENCH line per workload, system and run (bench/parts.py makes the
 * report's table of them), then the medians and the ratios ferry /
 * hiredis-blocking and ferry / asyncio-redispy as a quick markdown
 * table.  Exit status: 0
 * if every check was ok, 1 otherwise, 2 on usage errors.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <ferry/ferry.h>
#include <ferry/redis.h>
#include <ferry/redis_queue.h>

#include "redis_server.h"
#include "redis_sem_lua.h"

#define SYS_FERRY   "ferry"
#define SYS_HIREDIS "hiredis-blocking"
#define SYS_ASYNCIO "asyncio-redispy"
#define SYS_POLLING "ferry-polling"
#define SYS_NOLIMIT "no-limiter"
#define MAX_SYS     3
#define MAX_RUNS    99
#define MAX_PROCS   4
#define PAYLOAD     "0123456789abcdef"  /* 16 bytes per item */

struct workload {
    const char *name;
    const char *kind;  /* what the child does: "queue", "sem" or "limiter" */
    int procs;
};

static const struct workload workloads[] = {
    { "redis_queue_1p", "queue", 1 },
    { "redis_queue_4p", "queue", 4 },
    { "redis_sem_1p", "sem", 1 },
    { "redis_sem_4p", "sem", 4 },
    { "redis_limiter_4p", "limiter", 4 },
};
#define NWORK ((int)(sizeof(workloads) / sizeof(workloads[0])))

/* The limiter's shape (-L, -T, -H): permits, tasks per process, hold. */
static int g_limit = 32, g_tasks = 64, g_hold_us = 2000;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- children ---------------------------------------------------------- */

/* What a child was asked to do (argv after --child). */
struct child {
    const char *kind;
    int port;
    long n;
    int idx;
};

static struct child g_child;

/* Say ready on stdout, then wait for the release: stdin reaches its end. */
static void ready_and_wait(void)
{
    char c;

    if (write(1, "r", 1) != 1)
        _exit(3);
    while (read(0, &c, 1) > 0)
        ;
}

static int ferry_queue_main(void *arg)
{
    ferry_redis *conn;
    ferry_redis_queue *q;
    ferry_redis_item *it;
    char consumer[32];
    int rc;

    (void)arg;
    snprintf(consumer, sizeof(consumer), "c%d", g_child.idx);
    rc = ferry_redis_connect(&conn, "127.0.0.1", g_child.port, NULL);
    if (rc)
        return rc;
    rc = ferry_redis_queue_open(&q, conn, "bq", "g", consumer);
    if (rc)
        return rc;
    ready_and_wait();
    for (long i = 0; i < g_child.n && rc == 0; i++) {
        rc = ferry_redis_queue_put(q, PAYLOAD, sizeof(PAYLOAD) - 1, 0, NULL);
        if (rc == 0)
            rc = ferry_redis_queue_get(q, &it, FERRY_SEC(5));
        if (rc == 0) {
            rc = ferry_redis_queue_ack(q, it->id);
            ferry_redis_item_free(it);
        }
    }
    ferry_redis_queue_close(q);
    ferry_redis_close(conn);
    return rc;
}

/* One blocking command; false on an error or an error reply. */
static bool hiredis_do(redisContext *c, redisReply **out, const char *fmt, ...)
{
    redisReply *r;
    va_list ap;

    va_start(ap, fmt);
    r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r == NULL)
        return false;
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0) {
        fprintf(stderr, "redis_bench: %s\n", r->str);
        freeReplyObject(r);
        return false;
    }
    if (out != NULL)
        *out = r;
    else
        freeReplyObject(r);
    return true;
}

static int hiredis_queue(void)
{
    redisContext *c = redisConnect("127.0.0.1", g_child.port);
    redisReply *r = NULL;
    char consumer[32], id[FERRY_REDIS_ID_MAX];
    bool ok;

    if (c == NULL || c->err)
        return 1;
    snprintf(consumer, sizeof(consumer), "c%d", g_child.idx);
    if (!hiredis_do(c, NULL, "XGROUP CREATE bq g 0 MKSTREAM"))
        return 1;
    ready_and_wait();
    for (long i = 0; i < g_child.n; i++) {
        if (!hiredis_do(c, NULL, "XADD bq * d %s", PAYLOAD))
            return 1;
        if (!hiredis_do(c, &r, "XREADGROUP GROUP g %s COUNT 1 BLOCK 5000 STREAMS bq >", consumer))
            return 1;
        /* [[key, [[id, fields]]]] */
        ok = r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
             r->element[0]->element[1]->elements == 1;
        if (ok)
            snprintf(id, sizeof(id), "%s", r->element[0]->element[1]->element[0]->element[0]->str);
        freeReplyObject(r);
        if (!ok || !hiredis_do(c, &r, "XACK bq g %s", id))
            return 1;
        ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        if (!ok)
            return 1;
    }
    redisFree(c);
    return 0;
}

/* The floor runs the library's own scripts (acquire_lua, release_lua).
 * The parent checks after each ferry measurement that the server's script
 * cache holds no other script than these two. */

#define SEM_KEY    "bsem"
#define SEM_LIMIT  "4"
#define SEM_LEASE  "10000" /* ferry's default lease, ms */
#define SEM_WTTL   "1000"  /* ferry's default waiter ttl, ms */

static int ferry_sem_main(void *arg)
{
    ferry_redis *conn;
    ferry_redis_sem *sem;
    ferry_redis_permit *p;
    int rc;

    (void)arg;
    rc = ferry_redis_connect(&conn, "127.0.0.1", g_child.port, NULL);
    if (rc)
        return rc;
    rc = ferry_redis_sem_new(&sem, conn, SEM_KEY, (unsigned)atoi(SEM_LIMIT), NULL);
    if (rc)
        return rc;
    ready_and_wait();
    for (long i = 0; i < g_child.n && rc == 0; i++) {
        rc = ferry_redis_sem_acquire(sem, &p);
        if (rc == 0)
            rc = ferry_redis_permit_release(p);
    }
    if (ferry_redis_sem_free(sem) != 0 && rc == 0)
        rc = -EBUSY;
    ferry_redis_close(conn);
    return rc;
}

/* The reply to a command appended earlier; false on an error. */
static bool hiredis_reply(redisContext *c, long long *integer)
{
    void *v = NULL;
    redisReply *r;
    bool ok;

    if (redisGetReply(c, &v) != REDIS_OK || v == NULL)
        return false;
    r = v;
    ok = r->type == REDIS_REPLY_INTEGER;
    if (ok && integer != NULL)
        *integer = r->integer;
    freeReplyObject(r);
    return ok;
}

static int hiredis_sem(void)
{
    static const char *const keys[] = {
        "{" SEM_KEY "}:holders", "{" SEM_KEY "}:queue", "{" SEM_KEY "}:alive",
        "{" SEM_KEY "}:ticket", "{" SEM_KEY "}:fence", "{" SEM_KEY "}:fences",
    };
    redisContext *c = redisConnect("127.0.0.1", g_child.port);
    redisReply *r = NULL;
    char sha[41], rsha[41], token[64];
    long long granted;

    if (c == NULL || c->err || !hiredis_do(c, &r, "SCRIPT LOAD %s", acquire_lua))
        return 1;
    snprintf(sha, sizeof(sha), "%s", r->str);
    freeReplyObject(r);
    if (!hiredis_do(c, &r, "SCRIPT LOAD %s", release_lua))
        return 1;
    snprintf(rsha, sizeof(rsha), "%s", r->str);
    freeReplyObject(r);
    ready_and_wait();
    for (long i = 0; i < g_child.n; i++) {
        /* The previous release goes out with this acquire. */
        snprintf(token, sizeof(token), "%ld:%ld", (long)getpid(), i);
        redisAppendCommand(c, "EVALSHA %s 6 %s %s %s %s %s %s %s %s %s %s", sha, keys[0],
                           keys[1], keys[2], keys[3], keys[4], keys[5], token, SEM_LIMIT,
                           SEM_LEASE, SEM_WTTL);
        if (i > 0 && !hiredis_reply(c, NULL))
            return 1;
        if (!hiredis_reply(c, &granted) || granted <= 0)
            return 1;
        redisAppendCommand(c, "EVALSHA %s 6 %s %s %s %s %s %s %s %s", rsha, keys[0], keys[1],
                           keys[2], keys[3], keys[4], keys[5], token, SEM_LIMIT);
    }
    if (g_child.n > 0 && !hiredis_reply(c, NULL))
        return 1;
    redisFree(c);
    return 0;
}

static int child_limiter(const char *sys);

static int child_main(const char *sys)
{
    bool sem = strcmp(g_child.kind, "sem") == 0;

    if (strcmp(g_child.kind, "limiter") == 0)
        return child_limiter(sys);

    if (strcmp(sys, SYS_FERRY) == 0) {
        if (sem)
            return ferry_run(ferry_sem_main, NULL) == 0 ? 0 : 1;
        return ferry_run(ferry_queue_main, NULL) == 0 ? 0 : 1;
    }
    if (sem)
        return hiredis_sem();
    return hiredis_queue();
}

/* ---- the limiter --------------------------------------------------------- */

/*
 * A service's requests, each holding a permit of a semaphore of g_limit
 * shared by the processes for g_hold_us: g_tasks tasks per process take
 * requests until the process has done its share.  System ferry waits with
 * the wake channel, ferry-polling with opts.poll_only (the default polls,
 * 5 ms doubling up to 100 ms), no-limiter does the same requests without
 * the semaphore.
 */
#define LIM_KEY "blim"

static ferry_redis_sem *g_lim;
static long g_lim_left;   /* requests of this process not yet started */
static int g_lim_err;     /* the first error of a task */

static int limiter_task(void *arg)
{
    ferry_redis_permit *p = NULL;
    int rc = 0;

    (void)arg;
    while (g_lim_left > 0 && g_lim_err == 0) {
        g_lim_left--;
        if (g_lim != NULL)
            rc = ferry_redis_sem_acquire(g_lim, &p);
        if (rc == 0)
            rc = ferry_sleep(FERRY_USEC(g_hold_us));
        if (rc == 0 && p != NULL)
            rc = ferry_redis_permit_release(p);
        p = NULL;
        if (rc && g_lim_err == 0)
            g_lim_err = rc;
    }
    return rc;
}

static int ferry_limiter_main(void *arg)
{
    const char *sys = arg;
    ferry_redis_sem_opts o = { .poll_only = strcmp(sys, SYS_POLLING) == 0 };
    ferry_redis *conn = NULL;
    ferry_group g;
    int rc = 0;

    if (strcmp(sys, SYS_NOLIMIT) != 0) {
        rc = ferry_redis_connect(&conn, "127.0.0.1", g_child.port, NULL);
        if (rc == 0)
            rc = ferry_redis_sem_new(&g_lim, conn, LIM_KEY, (unsigned)g_limit, &o);
        if (rc)
            return rc;
    }
    g_lim_left = g_child.n;
    ready_and_wait();
    ferry_group_init(&g);
    for (int i = 0; i < g_tasks && rc == 0; i++)
        rc = ferry_group_spawn(&g, limiter_task, NULL, NULL);
    if (ferry_group_wait(&g) != 0 && rc == 0)
        rc = g_lim_err != 0 ? g_lim_err : -EIO;
    if (ferry_redis_sem_free(g_lim) != 0 && rc == 0)
        rc = -EBUSY;
    ferry_redis_close(conn);
    return rc;
}

static int child_limiter(const char *sys)
{
    return ferry_run(ferry_limiter_main, (void *)sys) == 0 ? 0 : 1;
}

/* ---- the parent -------------------------------------------------------- */

struct result {
    double ops_per_s;
    double polls;   /* limiter: acquire scripts run per grant; else 0 */
    bool ok;
};

static long long query(int port, const char *cmd /* no arguments */)
{
    struct tu_redis s = { .port = port };

    return tu_redis_query(&s, NULL, 0, cmd);
}

static long long query_pending(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r;
    long long v = -1;

    if (c == NULL || c->err)
        goto out;
    r = redisCommand(c, "XPENDING bq g");
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
        r->element[0]->type == REDIS_REPLY_INTEGER)
        v = r->element[0]->integer;
    if (r)
        freeReplyObject(r);
out:
    if (c)
        redisFree(c);
    return v;
}

/* The server's count of cached scripts; -1 if unknown. */
static long cached_scripts(int port)
{
    struct tu_redis s = { .port = port };
    char info[4096];
    const char *p;

    if (tu_redis_query(&s, info, sizeof(info), "INFO memory") <= 0)
        return -1;
    p = strstr(info, "number_of_cached_scripts:");
    return p != NULL ? atol(p + strlen("number_of_cached_scripts:")) : -1;
}

/* After a semaphore measurement: n grants, nothing held; after ferry's
 * and the asyncio program's, their scripts were this program's copies
 * (loading the copies adds no script to the cache, which SCRIPT FLUSH
 * emptied before). */
static bool sem_check(int port, long n, bool check_scripts)
{
    struct tu_redis s = { .port = port };
    char fence[32];
    long before;
    bool ok;

    ok = tu_redis_query(&s, fence, sizeof(fence), "GET {" SEM_KEY "}:fence") > 0 &&
         atol(fence) == n && tu_redis_query(&s, NULL, 0, "ZCARD {" SEM_KEY "}:holders") == 0;
    if (!ok)
        fprintf(stderr, "redis_bench: fence %s, expected %ld, or permits still held\n", fence, n);
    if (ok && check_scripts) {
        before = cached_scripts(port);
        tu_redis_query(&s, NULL, 0, "SCRIPT LOAD %s", acquire_lua);
        tu_redis_query(&s, NULL, 0, "SCRIPT LOAD %s", release_lua);
        if (before != 2 || cached_scripts(port) != before) {
            fprintf(stderr, "redis_bench: the scripts of this program differ from the ones "
                            "the measured system ran (redis/redis_sem.c, redis_sem_lua.h)\n");
            ok = false;
        }
    }
    return ok;
}

/* The calls of `cmd` since the last CONFIG RESETSTAT; -1 if unknown. */
static long command_calls(int port, const char *cmd)
{
    struct tu_redis s = { .port = port };
    char info[8192], key[64];
    const char *p;

    if (tu_redis_query(&s, info, sizeof(info), "INFO commandstats") <= 0)
        return -1;
    snprintf(key, sizeof(key), "cmdstat_%s:calls=", cmd);
    p = strstr(info, key);
    return p != NULL ? atol(p + strlen(key)) : 0;
}

/* After a limiter measurement with the semaphore: n grants, nothing held. */
static bool limiter_check(int port, long n)
{
    struct tu_redis s = { .port = port };
    char fence[32];
    bool ok;

    ok = tu_redis_query(&s, fence, sizeof(fence), "GET {" LIM_KEY "}:fence") > 0 &&
         atol(fence) == n && tu_redis_query(&s, NULL, 0, "ZCARD {" LIM_KEY "}:holders") == 0;
    if (!ok)
        fprintf(stderr, "redis_bench: limiter fence %s, expected %ld, or permits still held\n",
                fence, n);
    return ok;
}

/* One measurement: `w` by `sys` in w->procs fresh processes. */
static struct result measure(const char *self, const struct workload *w, const char *sys, int port,
                             long n)
{
    struct result res = { 0, 0, true };
    bool limiter = strcmp(w->kind, "limiter") == 0;
    pid_t pids[MAX_PROCS];
    int ready[2], go[2], status;
    char portbuf[16], nbuf[24], idxbuf[8], shape[48], c;
    struct rusage ru;
    long rss = 0;
    double t0, secs;

    query(port, "FLUSHALL");
    query(port, "SCRIPT FLUSH");
    query(port, "CONFIG RESETSTAT");
    snprintf(shape, sizeof(shape), "%d:%d:%d", g_limit, g_tasks, g_hold_us);
    if (pipe(ready) != 0 || pipe(go) != 0) {
        res.ok = false;
        return res;
    }
    snprintf(portbuf, sizeof(portbuf), "%d", port);
    snprintf(nbuf, sizeof(nbuf), "%ld", n / w->procs);
    for (int i = 0; i < w->procs; i++) {
        snprintf(idxbuf, sizeof(idxbuf), "%d", i);
        pids[i] = fork();
        if (pids[i] == 0) {
            dup2(go[0], 0);
            dup2(ready[1], 1);
            close(go[1]);
            close(ready[0]);
            if (strcmp(sys, SYS_ASYNCIO) == 0)
                execlp("python3", "python3", FERRY_REDIS_ASYNCIO_PY, w->kind, portbuf, nbuf,
                       idxbuf, FERRY_SEM_SCRIPTS_HEADER, (char *)NULL);
            else
                execl(self, self, "--child", w->kind, sys, portbuf, nbuf, idxbuf, shape,
                      (char *)NULL);
            _exit(127);
        }
    }
    close(ready[1]);
    close(go[0]);
    for (int i = 0; i < w->procs; i++) {
        if (read(ready[0], &c, 1) != 1)
            res.ok = false;
    }
    t0 = now_s();
    close(go[1]);
    for (int i = 0; i < w->procs; i++) {
        if (pids[i] < 0 || wait4(pids[i], &status, 0, &ru) != pids[i] || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            res.ok = false;
        else if (ru.ru_maxrss > rss)
            rss = ru.ru_maxrss;
    }
    secs = now_s() - t0;
    close(ready[0]);
    if (limiter) {
        long grants = (n / w->procs) * w->procs;

        if (strcmp(sys, SYS_NOLIMIT) != 0) {
            if (!limiter_check(port, grants))
                res.ok = false;
            /* EVALSHA runs the acquire's polls and one release per grant. */
            res.polls = (double)(command_calls(port, "evalsha") - grants) / (double)grants;
        }
    } else if (strcmp(w->kind, "queue") == 0) {
        if (query(port, "XLEN bq") != (n / w->procs) * w->procs || query_pending(port) != 0)
            res.ok = false;
    } else if (!sem_check(port, (n / w->procs) * w->procs, strcmp(sys, SYS_HIREDIS) != 0)) {
        res.ok = false;
    }
    res.ops_per_s = (double)n / secs;
    printf("BENCH workload=%s system=%s n=%ld seconds=%.6f ns_per_op=%.2f ops_per_s=%.0f "
           "rss_kb=%ld check=%s procs=%d",
           w->name, sys, (n / w->procs) * w->procs, secs, secs * 1e9 / (double)n, res.ops_per_s,
           rss, res.ok ? "ok" : "FAIL", w->procs);
    if (limiter)
        printf(" limit=%d tasks=%d hold_us=%d polls_per_grant=%.2f", g_limit, g_tasks, g_hold_us,
               res.polls);
    printf("\n");
    fflush(stdout);
    return res;
}

/* A note for the report: the 1-minute load average as a run starts. */
static void print_load(int run)
{
    char load[32] = "?";
    FILE *f = fopen("/proc/loadavg", "r");

    if (f) {
        if (fscanf(f, "%31s", load) != 1)
            strcpy(load, "?");
        fclose(f);
    }
    printf("# run %d: load average %s at its start\n", run, load);
    fflush(stdout);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [-r RUNS] [-n OPS] [-p PORT] [-L LIMIT] [-T TASKS] [-H HOLD_US] "
            "[WORKLOAD...]\n",
            prog);
}

/* The systems measured for `w`, in out[]; how many. */
static int systems_of(const struct workload *w, bool have_py, const char *out[MAX_SYS])
{
    if (strcmp(w->kind, "limiter") == 0) {
        out[0] = SYS_FERRY;
        out[1] = SYS_POLLING;
        out[2] = SYS_NOLIMIT;
        return 3;
    }
    out[0] = SYS_FERRY;
    out[1] = SYS_HIREDIS;
    out[2] = SYS_ASYNCIO;
    return have_py ? 3 : 2;
}

int main(int argc, char **argv)
{
    static double ops[MAX_SYS][NWORK][MAX_RUNS], polls[MAX_SYS][NWORK][MAX_RUNS];
    bool want[NWORK], any = false, any_limiter = false, all_ok = true, have_py;
    const char *systems[MAX_SYS];
    struct tu_redis srv;
    int runs = 3, port = 0, opt, nsys;
    long n = 20000;

    if (argc == 8 && strcmp(argv[1], "--child") == 0) {
        g_child.kind = argv[2];
        g_child.port = atoi(argv[4]);
        g_child.n = atol(argv[5]);
        g_child.idx = atoi(argv[6]);
        if (sscanf(argv[7], "%d:%d:%d", &g_limit, &g_tasks, &g_hold_us) != 3)
            return 2;
        return child_main(argv[3]);
    }
    while ((opt = getopt(argc, argv, "r:n:p:L:T:H:h")) != -1) {
        switch (opt) {
        case 'r':
            runs = atoi(optarg);
            break;
        case 'n':
            n = atol(optarg);
            break;
        case 'p':
            port = atoi(optarg);
            break;
        case 'L':
            g_limit = atoi(optarg);
            break;
        case 'T':
            g_tasks = atoi(optarg);
            break;
        case 'H':
            g_hold_us = atoi(optarg);
            break;
        default:
            usage(argv[0]);
            return 2;
        }
    }
    if (runs < 1 || runs > MAX_RUNS || n < MAX_PROCS || g_limit < 1 || g_tasks < 1 ||
        g_hold_us < 0) {
        usage(argv[0]);
        return 2;
    }
    for (int i = 0; i < NWORK; i++)
        want[i] = optind == argc;
    for (int a = optind; a < argc; a++) {
        bool found = false;

        for (int i = 0; i < NWORK; i++) {
            if (strcmp(argv[a], workloads[i].name) == 0)
                want[i] = found = true;
        }
        if (!found) {
            fprintf(stderr, "redis_bench: no workload %s\n", argv[a]);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    memset(&srv, 0, sizeof(srv));
    if (port == 0) {
        int rc = tu_redis_start(&srv);

        if (rc) {
            fprintf(stderr, "redis_bench: could not start redis-server: %d\n", rc);
            return 1;
        }
        port = srv.port;
    }
    /* The asyncio row needs the python3 of PATH with redis-py 4.2 or later
     * (redis.asyncio); without it the other two systems still run. */
    have_py = system("python3 -c 'import redis.asyncio' >/dev/null 2>&1") == 0;
    if (!have_py)
        printf("redis_bench: system %s left out: python3 -c 'import redis.asyncio' failed "
               "(redis-py 4.2 or later is needed)\n",
               SYS_ASYNCIO);
    for (int r = 0; r < runs; r++) {
        print_load(r + 1);
        for (int i = 0; i < NWORK; i++) {
            if (!want[i])
                continue;
            if (strcmp(workloads[i].kind, "limiter") == 0)
                any_limiter = true;
            else
                any = true;
            nsys = systems_of(&workloads[i], have_py, systems);
            /* The systems take turns at going first. */
            for (int k = 0; k < nsys; k++) {
                int sy = (r + k) % nsys;
                struct result res = measure("/proc/self/exe", &workloads[i], systems[sy], port, n);

                ops[sy][i][r] = res.ops_per_s;
                polls[sy][i][r] = res.polls;
                all_ok = all_ok && res.ok;
            }
        }
    }
    if (any && have_py) {
        printf("\n| workload | ferry ops/s | hiredis-blocking ops/s | asyncio-redispy ops/s "
               "| ferry / hiredis | ferry / asyncio |\n");
        printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
    } else if (any) {
        printf("\n| workload | ferry ops/s | hiredis-blocking ops/s | ferry / hiredis |\n");
        printf("| --- | ---: | ---: | ---: |\n");
    }
    for (int i = 0; any && i < NWORK; i++) {
        double f, h, a;

        if (!want[i] || strcmp(workloads[i].kind, "limiter") == 0)
            continue;
        f = median(ops[0][i], runs);
        h = median(ops[1][i], runs);
        if (have_py) {
            a = median(ops[2][i], runs);
            printf("| %s | %.0f | %.0f | %.0f | %.2f | %.2f |\n", workloads[i].name, f, h, a, f / h,
                   f / a);
        } else {
            printf("| %s | %.0f | %.0f | %.2f |\n", workloads[i].name, f, h, f / h);
        }
    }
    if (any_limiter) {
        /* What the limit allows: every permit busy all the time. */
        double cap = g_limit * (g_hold_us > 0 ? 1e6 / g_hold_us : 0);

        printf("\nlimiter: %d processes x %d tasks, limit %d, hold %d us", MAX_PROCS, g_tasks,
               g_limit, g_hold_us);
        if (cap > 0)
            printf(": the limit allows %.0f grants/s", cap);
        printf("\n");
        printf("\n| workload | system | requests/s | of what the limit allows "
               "| acquire polls per grant |\n");
        printf("| --- | --- | ---: | ---: | ---: |\n");
    }
    for (int i = 0; any_limiter && i < NWORK; i++) {
        double cap = g_limit * (g_hold_us > 0 ? 1e6 / g_hold_us : 0);

        if (!want[i] || strcmp(workloads[i].kind, "limiter") != 0)
            continue;
        nsys = systems_of(&workloads[i], have_py, systems);
        for (int k = 0; k < nsys; k++) {
            double f = median(ops[k][i], runs);

            if (strcmp(systems[k], SYS_NOLIMIT) == 0)
                printf("| %s | %s | %.0f | - | - |\n", workloads[i].name, systems[k], f);
            else if (cap > 0)
                printf("| %s | %s | %.0f | %.2f | %.2f |\n", workloads[i].name, systems[k], f,
                       f / cap, median(polls[k][i], runs));
            else
                printf("| %s | %s | %.0f | - | %.2f |\n", workloads[i].name, systems[k], f,
                       median(polls[k][i], runs));
        }
    }
    if (srv.pid > 0)
        tu_redis_stop(&srv);
    return all_ok ? 0 : 1;
}
