/* http_service.c - a small real service: HTTP on libevent's evhttp, every
 * request handled by a task, answers from SQLite.
 *
 *   http_service PORT [--timeout-ms N] [--db-slots N] [--db-latency-ms N]
 *
 * Listens on 127.0.0.1:PORT (0: a free port, printed on the first line).
 *
 *   GET /rate?currency=USD   a currency's rate
 *   GET /item?id=42          an item's name and price
 *   GET /slow?ms=N           a query that takes N ms (to see the deadline)
 *   GET /stats               the counters below, as JSON
 *
 * Any request may shorten its own deadline with "deadline_ms=N" in the
 * query (as clients send grpc-timeout); it cannot lengthen it.
 *
 * What it shows:
 *   - the loop/thread border: SQLite's blocking C API runs only on a pool
 *     of threads, through ferry_to_thread(); opening, seeding, querying and
 *     closing the database included.  The loop owns the list of free
 *     connections, so it needs no mutex;
 *   - a semaphore with one permit per connection limits concurrent database
 *     work;
 *   - singleflight collapses identical concurrent queries into one;
 *   - a deadline per request (--timeout-ms, default 1000): a deadline scope
 *     around the handler; the query receives the same deadline and stops
 *     itself (SQLite progress handler), and the client gets 504;
 *   - graceful shutdown on SIGINT or SIGTERM: stop accepting, finish every
 *     request in flight, close, exit 0.
 *
 * The database is in memory, seeded at start.  --db-latency-ms (default
 * 20) adds a simulated round trip to every query, through a sleep_ms() SQL
 * function, so that concurrency is visible; it is the only simulated part.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <sqlite3.h>

#include "ferry/ferry.h"

#define MAX_SLOTS 64

/* ---- settings ------------------------------------------------------------ */

static int opt_port;
static int opt_timeout_ms = 1000;
static int opt_slots = 4;
static int opt_latency_ms = 20;

/* ---- the database: pool threads only ------------------------------------ */

/* One connection.  `db` and `deadline` are used only by the pool thread
 * running a job on it; the loop hands a connection to one job at a time. */
struct conn {
    sqlite3 *db;
    int64_t  deadline;     /* of the running job, for progress and sleep_ms */
};

enum query { Q_RATE, Q_ITEM, Q_SLOW };

/* What a query returns; copied to every caller of a collapsed query. */
struct answer {
    bool   found;
    double value;
    char   name[32];
};

/* A query job: filled on the loop, run on a pool thread. */
struct db_job {
    struct conn  *conn;
    enum query    kind;
    char          key[16];   /* Q_RATE: the currency */
    long          id;        /* Q_ITEM: the item */
    int           sleep_ms;  /* latency to add */
    int64_t       deadline;  /* the request's (ferry_now() time) */
    struct answer out;
};

/* The slot-count stays fixed while the service runs. */
static struct conn conns[MAX_SLOTS];
static const char *db_uri;

/* sleep_ms(N): sleep N ms in 1 ms steps, failing once the deadline passes. */
static void sql_sleep_ms(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    struct conn *c = sqlite3_user_data(ctx);
    int ms = sqlite3_value_int(argv[0]);

    for (int i = 0; i < ms; i++) {
        if (ferry_now() > c->deadline) {
            sqlite3_result_error(ctx, "deadline passed", -1);
            return;
        }
        nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    }
    sqlite3_result_int(ctx, 0);
}

/* Interrupts a running statement once the job's deadline has passed. */
static int sql_progress(void *arg)
{
    struct conn *c = arg;
    return ferry_now() > c->deadline;
}

static int db_open_all(void *arg)
{
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI |
                SQLITE_OPEN_FULLMUTEX;

    for (int i = 0; i < opt_slots; i++) {
        if (sqlite3_open_v2(db_uri, &conns[i].db, flags, NULL) != SQLITE_OK)
            return -EIO;
        conns[i].deadline = INT64_MAX;
        sqlite3_create_function(conns[i].db, "sleep_ms", 1, SQLITE_UTF8, &conns[i],
                                sql_sleep_ms, NULL, NULL);
        sqlite3_progress_handler(conns[i].db, 1000, sql_progress, &conns[i]);
        sqlite3_busy_timeout(conns[i].db, 1000);
    }
    return 0;
}

static int db_close_all(void *arg)
{
    for (int i = 0; i < opt_slots; i++) {
        sqlite3_close(conns[i].db);
        conns[i].db = NULL;
    }
    return 0;
}

static const char seed_sql[] =
    "CREATE TABLE rates(currency TEXT PRIMARY KEY, rate REAL NOT NULL);"
    "INSERT INTO rates VALUES ('USD', 92.51), ('EUR', 99.87), ('GBP', 116.40),"
    " ('JPY', 0.61), ('CNY', 12.74), ('CHF', 104.92), ('TRY', 2.86), ('INR', 1.11);"
    "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL NOT NULL);"
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)"
    " INSERT INTO items SELECT i, 'item-' || i, round(i * 1.25 + 0.99, 2) FROM n;";

static int db_seed(void *arg)
{
    return sqlite3_exec(conns[0].db, seed_sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -EIO;
}

/* Runs on a pool thread: one query on the job's connection. */
static int db_query(void *arg)
{
    struct db_job *job = arg;
    struct conn *c = job->conn;
    sqlite3_stmt *st;
    const char *sql;
    int rc;

    if (job->kind == Q_RATE)
        sql = "SELECT rate, currency FROM rates WHERE currency = ?1 AND sleep_ms(?2) = 0";
    else if (job->kind == Q_ITEM)
        sql = "SELECT price, name FROM items WHERE id = ?1 AND sleep_ms(?2) = 0";
    else
        sql = "SELECT ?1 + 0.0, 'slow' WHERE sleep_ms(?2) = 0";
    c->deadline = job->deadline;
    if (sqlite3_prepare_v2(c->db, sql, -1, &st, NULL) != SQLITE_OK)
        return -EIO;
    if (job->kind == Q_RATE)
        sqlite3_bind_text(st, 1, job->key, -1, SQLITE_STATIC);
    else
        sqlite3_bind_int64(st, 1, job->id);
    sqlite3_bind_int(st, 2, job->sleep_ms);
    rc = sqlite3_step(st);
    memset(&job->out, 0, sizeof job->out);
    if (rc == SQLITE_ROW) {
        job->out.found = true;
        job->out.value = sqlite3_column_double(st, 0);
        snprintf(job->out.name, sizeof job->out.name, "%s",
                 (const char *)sqlite3_column_text(st, 1));
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        rc = 0;
    } else {
        rc = ferry_now() > job->deadline ? -ETIMEDOUT : -EIO;
    }
    sqlite3_finalize(st);
    c->deadline = INT64_MAX;
    return rc;
}

/* ---- the service: loop thread only ---------------------------------------- */

static struct {
    ferry_loop    *loop;
    ferry_pool    *pool;          /* runs every SQLite call */
    struct evhttp *http;
    struct evhttp_bound_socket *listener;
    ferry_sem      slots;         /* one permit per free connection */
    int            free_conn[MAX_SLOTS], nfree;  /* the free connections */
    ferry_flight   flight;        /* identical concurrent queries */
    ferry_event    stop;          /* a signal arrived */
    ferry_event    idle;          /* stopping and nothing in flight */
    bool           stopping;
    int            signal;
    ferry_task    *watchers[2];
    /* counters, served by /stats */
    uint64_t accepted;            /* requests handed to a handler task */
    uint64_t replied;             /* replies given to evhttp */
    uint64_t answered;            /* replies fully written to the client */
    uint64_t client_gone;         /* the client left before its reply */
    uint64_t status[6];           /* by hundreds: [2] 2xx ... [5] 5xx */
    uint64_t timeouts;            /* 504s */
    uint64_t flight_calls;        /* ferry_flight_do() calls */
    uint64_t flight_runs;         /* of those, queries actually run */
    uint64_t db_queries;          /* queries run on the pool */
    uint64_t db_waits;            /* acquires that found no free connection */
    uint64_t db_peak;             /* most connections busy at once */
    uint64_t inflight;            /* handler tasks running */
    uint64_t inflight_at_signal;
} svc;

/* Run a query on a free connection: wait for a permit, take a connection,
 * hand the blocking call to the pool, give both back. */
static int db_run(struct db_job *job)
{
    if (ferry_sem_value(&svc.slots) == 0)
        svc.db_waits++;
    int rc = ferry_sem_acquire(&svc.slots);   /* -ETIMEDOUT at the request's deadline */
    if (rc)
        return rc;
    uint64_t busy = (uint64_t)opt_slots - ferry_sem_value(&svc.slots);
    if (busy > svc.db_peak)
        svc.db_peak = busy;
    int slot = svc.free_conn[--svc.nfree];
    job->conn = &conns[slot];
    svc.db_queries++;
    /* A running query is not interrupted by ferry (a thread cannot be); it
     * stops itself at job->deadline, so this returns soon after it. */
    rc = ferry_to_thread(svc.pool, db_query, job);
    svc.free_conn[svc.nfree++] = slot;
    ferry_sem_release(&svc.slots);
    return rc;
}

/* The shared work of a collapsed query: runs in the leader's task. */
static int flight_query(void *arg, void *out, size_t out_size)
{
    struct db_job *job = arg;

    svc.flight_runs++;
    int rc = db_run(job);
    if (rc == 0 && out != &job->out)
        memcpy(out, &job->out, sizeof job->out);
    return rc;
}

static void on_complete(struct evhttp_request *req, void *arg)
{
    svc.answered++;
}

static void reply(struct evhttp_request *req, int code, const char *reason,
                  struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);

    evhttp_add_header(h, "Content-Type", "application/json");
    if (svc.stopping)
        evhttp_add_header(h, "Connection", "close");
    svc.status[code / 100 < 6 ? code / 100 : 5]++;
    if (code == 504)
        svc.timeouts++;
    svc.replied++;
    if (!evhttp_request_get_connection(req))
        svc.client_gone++;                    /* evhttp frees it, no completion */
    else
        evhttp_request_set_on_complete_cb(req, on_complete, NULL);
    evhttp_send_reply(req, code, reason, body);
}

static void stats_json(struct evbuffer *b)
{
    ferry_pool_stats ps = {0};
    ferry_pool_stats_get(svc.pool, &ps);
    evbuffer_add_printf(b,
        "{\"accepted\":%llu,\"replied\":%llu,\"answered\":%llu,\"inflight\":%llu,"
        "\"status_2xx\":%llu,\"status_4xx\":%llu,\"status_5xx\":%llu,\"timeouts\":%llu,"
        "\"flight_calls\":%llu,\"flight_runs\":%llu,\"flight_collapsed\":%llu,"
        "\"db_slots\":%d,\"db_queries\":%llu,\"db_waits\":%llu,\"db_peak\":%llu,"
        "\"pool_threads\":%u,\"pool_completed\":%llu}\n",
        (unsigned long long)svc.accepted, (unsigned long long)svc.replied,
        (unsigned long long)svc.answered, (unsigned long long)svc.inflight,
        (unsigned long long)svc.status[2], (unsigned long long)svc.status[4],
        (unsigned long long)svc.status[5], (unsigned long long)svc.timeouts,
        (unsigned long long)svc.flight_calls, (unsigned long long)svc.flight_runs,
        (unsigned long long)(svc.flight_calls - svc.flight_runs),
        opt_slots, (unsigned long long)svc.db_queries, (unsigned long long)svc.db_waits,
        (unsigned long long)svc.db_peak, ps.threads, (unsigned long long)ps.completed);
}

/* The handler task of one request. */
static int handle(void *arg)
{
    struct evhttp_request *req = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = evhttp_uri_get_path(uri);
    const char *query = evhttp_uri_get_query(uri);
    struct evkeyvalq params = {0};
    struct evbuffer *body = evbuffer_new();
    struct db_job job = { .sleep_ms = opt_latency_ms };
    int code = 200, rc = 0;
    const char *reason = "OK";

    if (query)
        evhttp_parse_query_str(query, &params);
    const char *cur = evhttp_find_header(&params, "currency");
    const char *id = evhttp_find_header(&params, "id");
    const char *ms = evhttp_find_header(&params, "ms");
    const char *client_ms = evhttp_find_header(&params, "deadline_ms");
    int timeout_ms = opt_timeout_ms;
    if (client_ms && atoi(client_ms) > 0 && atoi(client_ms) < timeout_ms)
        timeout_ms = atoi(client_ms);

    ferry_scope deadline;                      /* the request's deadline */
    job.deadline = ferry_now() + FERRY_MSEC(timeout_ms);
    ferry_scope_enter(&deadline, job.deadline, 0);

    if (!path || !body) {
        code = 400;
    } else if (strcmp(path, "/stats") == 0) {
        stats_json(body);
    } else if (strcmp(path, "/rate") == 0 && cur && strlen(cur) == 3) {
        char key[16];
        job.kind = Q_RATE;
        snprintf(job.key, sizeof job.key, "%s", cur);
        int len = snprintf(key, sizeof key, "rate:%s", cur);
        svc.flight_calls++;
        rc = ferry_flight_do(&svc.flight, key, (size_t)len, flight_query, &job,
                             &job.out, sizeof job.out);
        if (rc == 0 && job.out.found)
            evbuffer_add_printf(body, "{\"currency\":\"%s\",\"rate\":%.2f}\n",
                                job.out.name, job.out.value);
    } else if (strcmp(path, "/item") == 0 && id && atol(id) > 0) {
        char key[32];
        job.kind = Q_ITEM;
        job.id = atol(id);
        int len = snprintf(key, sizeof key, "item:%ld", job.id);
        svc.flight_calls++;
        rc = ferry_flight_do(&svc.flight, key, (size_t)len, flight_query, &job,
                             &job.out, sizeof job.out);
        if (rc == 0 && job.out.found)
            evbuffer_add_printf(body, "{\"id\":%ld,\"name\":\"%s\",\"price\":%.2f}\n",
                                job.id, job.out.name, job.out.value);
    } else if (strcmp(path, "/slow") == 0 && ms && atoi(ms) >= 0) {
        job.kind = Q_SLOW;
        job.sleep_ms = atoi(ms) > 60000 ? 60000 : atoi(ms);
        rc = db_run(&job);                     /* not collapsed: each its own */
        if (rc == 0)
            evbuffer_add_printf(body, "{\"slow\":\"ms=%d\"}\n", job.sleep_ms);
    } else {
        code = 404;
    }
    int scope_rc = ferry_scope_exit(&deadline);

    if (code == 200 && (rc == -ETIMEDOUT || scope_rc == -ETIMEDOUT)) {
        code = 504;
        reason = "Gateway Timeout";
    } else if (code == 200 && rc) {
        code = 503;
        reason = "Service Unavailable";
    } else if (code == 200 && evbuffer_get_length(body) == 0) {
        code = 404;                            /* no such currency or item */
    }
    if (code != 200) {
        evbuffer_drain(body, evbuffer_get_length(body));
        evbuffer_add_printf(body, "{\"error\":%d}\n", code);
        if (code == 404)
            reason = "Not Found";
        else if (code == 400)
            reason = "Bad Request";
    }
    reply(req, code, reason, body);
    evhttp_clear_headers(&params);
    if (body)
        evbuffer_free(body);
    if (--svc.inflight == 0 && svc.stopping)
        ferry_event_set(&svc.idle);
    return 0;
}

/* evhttp's callback for every request: hand it to a task. */
static void on_request(struct evhttp_request *req, void *arg)
{
    svc.accepted++;
    svc.inflight++;
    ferry_event_clear(&svc.idle);
    if (ferry_task_spawn(NULL, svc.loop, handle, req, &(ferry_task_opts){ .name = "request" })) {
        svc.inflight--;
        reply(req, 503, "Service Unavailable", NULL);
    }
}

static int watch_signal(void *arg)
{
    int signum = (int)(intptr_t)arg;

    if (ferry_wait_signal(signum) == 0 && !svc.stopping) {
        svc.signal = signum;
        ferry_event_set(&svc.stop);
    }
    return 0;
}

/* A listening socket on 127.0.0.1:port with a deep backlog. */
static int listen_loopback(int port, int *bound_port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    socklen_t len = sizeof sa;
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -errno;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 1024) ||
        getsockname(fd, (struct sockaddr *)&sa, &len)) {
        int err = -errno;
        close(fd);
        return err;
    }
    *bound_port = ntohs(sa.sin_port);
    return fd;
}

static int server_main(void *arg)
{
    int rc, port = 0, fd;

    /* The database: every SQLite call goes to the pool. */
    rc = ferry_to_thread(svc.pool, db_open_all, NULL);
    if (rc == 0)
        rc = ferry_to_thread(svc.pool, db_seed, NULL);
    if (rc) {
        fprintf(stderr, "http_service: cannot open the database\n");
        goto out_close_db;
    }
    ferry_sem_init(&svc.slots, (uint64_t)opt_slots, FERRY_SEM_BOUNDED);
    for (int i = 0; i < opt_slots; i++)
        svc.free_conn[svc.nfree++] = i;

    fd = listen_loopback(opt_port, &port);
    if (fd < 0) {
        fprintf(stderr, "http_service: cannot listen on 127.0.0.1:%d: %s\n", opt_port,
                strerror(-fd));
        rc = fd;
        goto out_close_db;
    }
    svc.http = evhttp_new(ferry_loop_base(svc.loop));
    svc.listener = svc.http ? evhttp_accept_socket_with_handle(svc.http, fd) : NULL;
    if (!svc.listener) {
        fprintf(stderr, "http_service: evhttp setup failed\n");
        close(fd);
        rc = -ENOMEM;
        goto out_free_http;
    }
    evhttp_set_allowed_methods(svc.http, EVHTTP_REQ_GET);
    evhttp_set_gencb(svc.http, on_request, NULL);

    ferry_task_spawn(&svc.watchers[0], NULL, watch_signal, (void *)(intptr_t)SIGINT, NULL);
    ferry_task_spawn(&svc.watchers[1], NULL, watch_signal, (void *)(intptr_t)SIGTERM, NULL);
    ferry_yield();                              /* both wait for their signal now */
    printf("listening on 127.0.0.1:%d (timeout %d ms, %d database slots, %d ms latency)\n",
           port, opt_timeout_ms, opt_slots, opt_latency_ms);
    fflush(stdout);

    ferry_event_wait(&svc.stop);

    /* Graceful shutdown: stop accepting, finish what is in flight, close. */
    svc.stopping = true;
    svc.inflight_at_signal = svc.inflight;
    evhttp_del_accept_socket(svc.http, svc.listener);
    printf("received %s: listener closed, %llu requests in flight\n",
           svc.signal == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)svc.inflight);
    fflush(stdout);
    /* Requests may still arrive on open connections: wait until nothing is
     * in flight and every reply is written, twice 20 ms apart. */
    for (int quiet = 0; quiet < 2;) {
        if (svc.inflight > 0)
            ferry_event_wait(&svc.idle);
        ferry_sleep(FERRY_MSEC(20));
        bool settled = svc.inflight == 0 &&
                       svc.answered + svc.client_gone == svc.replied;
        quiet = settled ? quiet + 1 : 0;
    }
    for (int i = 0; i < 2; i++) {
        ferry_task_cancel(svc.watchers[i]);
        ferry_task_join(svc.watchers[i], NULL);
    }
    rc = 0;

out_free_http:
    if (svc.http)
        evhttp_free(svc.http);                  /* closes idle connections */
out_close_db:
    ferry_to_thread(svc.pool, db_close_all, NULL);
    ferry_flight_destroy(&svc.flight);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: http_service PORT [--timeout-ms N] [--db-slots N] "
                    "[--db-latency-ms N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    ferry_task *main_task;
    char uri[64];
    int status = -1;

    if (argc < 2)
        usage();
    opt_port = atoi(argv[1]);
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (strcmp(argv[i], "--timeout-ms") == 0)
            opt_timeout_ms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--db-slots") == 0)
            opt_slots = atoi(argv[++i]);
        else if (strcmp(argv[i], "--db-latency-ms") == 0)
            opt_latency_ms = atoi(argv[++i]);
        else
            usage();
    }
    if (opt_port < 0 || opt_port > 65535 || opt_timeout_ms <= 0 || opt_slots <= 0 ||
        opt_slots > MAX_SLOTS || opt_latency_ms < 0)
        usage();
    signal(SIGPIPE, SIG_IGN);
    snprintf(uri, sizeof uri, "file:ferry-http-%d?mode=memory&cache=shared", (int)getpid());
    db_uri = uri;

    /* SIGINT and SIGTERM are for the loop's thread: the pool's threads,
     * created while they are blocked, inherit a mask without them. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    int rc = ferry_pool_new(&svc.pool, &(ferry_pool_opts){ .threads = (unsigned)opt_slots });
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, NULL);
    if (rc)
        return 1;
    if (ferry_loop_new(&svc.loop, NULL)) {
        ferry_pool_free(svc.pool);
        return 1;
    }
    if (ferry_task_spawn(&main_task, svc.loop, server_main, NULL,
                         &(ferry_task_opts){ .name = "server" }) == 0) {
        ferry_loop_run(svc.loop, FERRY_RUN_DEFAULT);
        if (ferry_task_try_join(main_task, &status))
            status = -1;
    }
    ferry_loop_free(svc.loop);
    ferry_pool_free(svc.pool);
    sqlite3_shutdown();
    printf("shutdown: accepted %llu, answered %llu (%llu clients left first), "
           "%llu were in flight at the signal; exit %d\n",
           (unsigned long long)svc.accepted, (unsigned long long)svc.answered,
           (unsigned long long)svc.client_gone, (unsigned long long)svc.inflight_at_signal,
           status == 0 ? 0 : 1);
    return status == 0 ? 0 : 1;
}
