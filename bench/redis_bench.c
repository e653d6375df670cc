/* redis_bench.c - the Redis part (ferry/redis.h, ferry/redis_queue.h)
 * against a plain blocking hiredis client, the floor, in the same run.
 *
 *   ferry-redis-bench [-r RUNS] [-n OPS] [-p PORT] [WORKLOAD...]
 *
 * Workloads (default: all), each done by 1 and by 4 processes at once:
 *
 *   redis_queue_1p, redis_queue_4p  one op = a put, a get through the
 *             consumer group and an ack: ferry_redis_queue_put(),
 *             ferry_redis_queue_get(), ferry_redis_queue_ack() in one task
 *             (system ferry); XADD, XREADGROUP ... BLOCK, XACK with
 *             redisCommand() in a loop (system hiredis-blocking).  Every
 *             process puts before it gets, so each get finds an item.
 *             check=ok: every process ended well, the stream holds OPS
 *             entries and none is pending.
 *
 * OPS (default 20,000) is the total over the processes.  Each
 * measurement runs in fresh processes (this program, run again with
 * --child): they connect and set up, say they are ready, and the timed part
 * runs from the moment all are released until the last has exited.  The
 * server is flushed before each measurement.  Systems alternate which
 * goes first from run to run, so that a drift of the machine's load
 * spreads over both.
 *
 * The server is a redis-server started here on a free port of 127.0.0.1
 * (as the tests start theirs), or the one at -p PORT on 127.0.0.1 (it is
 * flushed: give a scratch server).  rss_kb is the largest peak RSS of the
 * measurement's processes.
 *
 * stdout: a BENCH line per workload, system and run, then the medians and
 * the ratios ferry / hiredis-blocking as a markdown table.  Exit status: 0
 * if every check was ok, 1 otherwise, 2 on usage errors.
 */
#include <errno.h>
#include <signal.h>
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

#define SYS_FERRY   "ferry"
#define SYS_HIREDIS "hiredis-blocking"
#define MAX_RUNS    99
#define MAX_PROCS   4
#define PAYLOAD     "0123456789abcdef"  /* 16 bytes per item */

struct workload {
    const char *name;
    const char *kind;  /* what the child does: "queue" */
    int procs;
};

static const struct workload workloads[] = {
    { "redis_queue_1p", "queue", 1 },
    { "redis_queue_4p", "queue", 4 },
};
#define NWORK ((int)(sizeof(workloads) / sizeof(workloads[0])))

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

static int child_main(const char *sys)
{
    if (strcmp(sys, SYS_FERRY) == 0)
        return ferry_run(ferry_queue_main, NULL) == 0 ? 0 : 1;
    return hiredis_queue();
}

/* ---- the parent -------------------------------------------------------- */

struct result {
    double ops_per_s;
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

/* One measurement: `w` by `sys` in w->procs fresh processes. */
static struct result measure(const char *self, const struct workload *w, const char *sys, int port,
                             long n)
{
    struct result res = { 0, true };
    pid_t pids[MAX_PROCS];
    int ready[2], go[2], status;
    char portbuf[16], nbuf[24], idxbuf[8], c;
    struct rusage ru;
    long rss = 0;
    double t0, secs;

    query(port, "FLUSHALL");
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
            execl(self, self, "--child", w->kind, sys, portbuf, nbuf, idxbuf, (char *)NULL);
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
        if (pids[i] < 0 || waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            res.ok = false;
    }
    secs = now_s() - t0;
    close(ready[0]);
    if (getrusage(RUSAGE_CHILDREN, &ru) == 0)
        rss = ru.ru_maxrss;
    if (query(port, "XLEN bq") != (n / w->procs) * w->procs || query_pending(port) != 0)
        res.ok = false;
    res.ops_per_s = (double)n / secs;
    printf("BENCH workload=%s system=%s n=%ld seconds=%.6f ns_per_op=%.2f ops_per_s=%.0f "
           "rss_kb=%ld check=%s procs=%d\n",
           w->name, sys, (n / w->procs) * w->procs, secs, secs * 1e9 / (double)n, res.ops_per_s,
           rss, res.ok ? "ok" : "FAIL", w->procs);
    fflush(stdout);
    return res;
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
    fprintf(stderr, "usage: %s [-r RUNS] [-n OPS] [-p PORT] [WORKLOAD...]\n", prog);
}

int main(int argc, char **argv)
{
    static double fer[NWORK][MAX_RUNS], hir[NWORK][MAX_RUNS];
    bool want[NWORK], any = false, all_ok = true;
    struct tu_redis srv;
    int runs = 3, port = 0, opt;
    long n = 20000;

    if (argc == 7 && strcmp(argv[1], "--child") == 0) {
        g_child.kind = argv[2];
        g_child.port = atoi(argv[4]);
        g_child.n = atol(argv[5]);
        g_child.idx = atoi(argv[6]);
        return child_main(argv[3]);
    }
    while ((opt = getopt(argc, argv, "r:n:p:h")) != -1) {
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
        default:
            usage(argv[0]);
            return 2;
        }
    }
    if (runs < 1 || runs > MAX_RUNS || n < MAX_PROCS) {
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
    for (int r = 0; r < runs; r++) {
        for (int i = 0; i < NWORK; i++) {
            struct result a, b;

            if (!want[i])
                continue;
            any = true;
            if (r % 2 == 0) {
                a = measure("/proc/self/exe", &workloads[i], SYS_FERRY, port, n);
                b = measure("/proc/self/exe", &workloads[i], SYS_HIREDIS, port, n);
            } else {
                b = measure("/proc/self/exe", &workloads[i], SYS_HIREDIS, port, n);
                a = measure("/proc/self/exe", &workloads[i], SYS_FERRY, port, n);
            }
            fer[i][r] = a.ops_per_s;
            hir[i][r] = b.ops_per_s;
            all_ok = all_ok && a.ok && b.ok;
        }
    }
    if (any) {
        printf("\n| workload | ferry ops/s | hiredis-blocking ops/s | ferry / hiredis |\n");
        printf("| --- | ---: | ---: | ---: |\n");
        for (int i = 0; i < NWORK; i++) {
            double f, h;

            if (!want[i])
                continue;
            f = median(fer[i], runs);
            h = median(hir[i], runs);
            printf("| %s | %.0f | %.0f | %.2f |\n", workloads[i].name, f, h, f / h);
        }
    }
    if (srv.pid > 0)
        tu_redis_stop(&srv);
    return all_ok ? 0 : 1;
}
