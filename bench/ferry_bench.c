/* ferry_bench.c - ferry's side of the benchmark contract
 * (bench/README.md): one BENCH line per workload, with the same semantics
 * and the same n as the peer benchmark programs.
 *
 *   ferry-bench                  every default workload, each in a fresh
 *                                process (fork + exec of itself), so that
 *                                rss_kb is that workload's own peak
 *   ferry-bench NAME...          only these (one name: in this process;
 *                                several: one process each)
 *   ferry-bench --million-idle   the same as `ferry-bench idle_1m`
 *   ferry-bench --list           the workload names
 *   ferry-bench --echo-server PORT
 *                                an echo server on 127.0.0.1:PORT for the
 *                                network workloads (tcp_echo, tcp_bulk) of
 *                                the peers' shared client (echo-pair.sh):
 *                                one task per connection, ferry_stream_read()
 *                                into a 64 KiB buffer of the task's and
 *                                ferry_stream_write() back, until SIGTERM or
 *                                SIGINT (exit 0)
 *   ferry-bench --echo-server PORT --loops N [--work K] [--spread MODE]
 *                                the same service on a runtime of N loops
 *                                (ferry/runtime.h), the port served by every
 *                                loop (MODE reuseport, the default: a
 *                                listener per loop; balanced: one acceptor
 *                                handing connections to the less loaded of
 *                                two loops).  --work K makes each read cost
 *                                the CPU of the tcp_rpc workload: the bytes
 *                                read are folded into x = 0x9e3779b97f4a7c15
 *                                (x = (x ^ b) * 0x100000001b3), then K rounds
 *                                of x ^= x << 13; x ^= x >> 7; x ^= x << 17;
 *                                --work also works without --loops
 *   ferry-bench --echo-server-bev PORT
 *                                the same service with each connection's
 *                                task reading and writing through a libevent
 *                                bufferevent instead of a stream (what
 *                                streams built on bufferevent would cost;
 *                                docs/streams.md)
 *
 * Environment: FERRY_BENCH_STATS=1 prints the loop's and the inbox's
 * counters on stderr after each workload, and the page faults, context
 * switches and loop CPU time of its timed part; FERRY_BENCH_STACK_CACHE=N sets
 * ferry_loop_opts.stack_cache (an experiment knob: the contract's numbers
 * use the defaults).  FERRY_BENCH_IO=libevent registers the echo servers'
 * descriptors through libevent instead of the loop's epoll set (an
 * experiment knob: the portable path of io/stream.c).
 *
 * Workloads (n as the peers'):
 *   switch              two tasks each ferry_yield() n/2 times (n = 2,000,000)
 *   spawn               spawn 1,000 tasks returning arg+1, join each, repeat
 *                       (n = 1,000,000); check the sum
 *   idle_tasks          100,000 tasks wait on one ferry_event; bytes_per_task
 *                       is the current-RSS growth from before spawning until
 *                       all wait, divided by n; then set, all end
 *   lock_contention     100 tasks x 10,000: acquire, read, yield, write, release
 *   queue_pipeline      ferry_queue of int64 (capacity 100), 10 producers,
 *                       10 consumers, 0 = sentinel (n = 1,000,000)
 *   stampede            10,000 tasks ask key i % 10; a miss runs a 1 ms sleep
 *                       on the pool through ferry_flight_do (one fetch per
 *                       key while in flight); the result is kept in a cache
 *                       as the peers keep theirs; fetches must be 10
 *   threadsafe_post     a pthread posts 1,000,000 callbacks with
 *                       ferry_loop_call_soon_threadsafe(); timed from the
 *                       first post until the loop ran the last
 *   offload_rtt         one task: ferry_to_thread(pool, noop), 100,000 in a row
 *   offload_throughput  1,000 tasks x 100 ferry_to_thread(pool, noop)
 *   idle_1m             (not in the default set) 1,000,000 idle tasks with the
 *                       loop's default settings; prints bytes_per_task too
 *
 * Cross-loop calls (not in the default set; bench/run-xloop.sh runs them
 * against an eventfd ping-pong and Go): a runtime of two loops
 * (ferry/runtime.h), the main task on loop 0 calling a no-op on loop 1
 * with ferry_runtime_call():
 *   xloop_call             one task, task flavour (a task per call on
 *                          loop 1), n = 200,000 in a row: the round trip
 *   xloop_call_cb          the same, FERRY_CALL_CALLBACK
 *   xloop_call_batch       64 tasks calling at once, callback flavour
 *                          (n = 1,000,000 calls in all)
 *   xloop_call_batch_task  64 tasks calling at once, task flavour
 *                          (n = 1,000,000)
 * FERRY_BENCH_PIN=1 pins the two loops to the first two CPUs.
 *
 * Spreading connections (not in the default set; bench/run-rpc.sh): a
 * runtime of 8 loops serves a port, a client thread opens 64 connections
 * and keeps them open; the line reports the most and the fewest
 * connections a loop got (max_per_loop, min_per_loop):
 *   spread_balanced        ferry_runtime_listen() in balanced mode
 *   spread_reuseport       the same with a SO_REUSEPORT listener per loop
 *
 * Pools have 4 threads and are created and warmed (8 concurrent no-op jobs)
 * before timing.  Exit status: 0 if every workload ran and every check was
 * ok, 1 otherwise, 2 on usage errors.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <sys/wait.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include <ferry/ferry.h>
#include <ferry/features.h>

#define SYS "ferry"
#define POOL_THREADS 4

/* ---- common ------------------------------------------------------------ */

/* Resource use when the timing began (start_clock()), for
 * FERRY_BENCH_STATS: the whole process's, and the calling thread's (the
 * loop's: every workload runs in the main task of its loop). */
static struct rusage ru_start, ru_start_loop;

/* Begin timing a workload: returns ferry_now(). */
static int64_t start_clock(void)
{
    getrusage(RUSAGE_SELF, &ru_start);
    getrusage(RUSAGE_THREAD, &ru_start_loop);
    return ferry_now();
}

/* Microseconds from a to b. */
static long tv_us(struct timeval a, struct timeval b)
{
    return (long)(b.tv_sec - a.tv_sec) * 1000000L + (long)(b.tv_usec - a.tv_usec);
}

static double secs_since(int64_t t0)
{
    return (double)(ferry_now() - t0) * 1e-9;
}

/* Peak RSS of this process (getrusage ru_maxrss), kB. */
static long peak_rss_kb(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Current RSS from /proc/self/statm, kB (as the peers read it). */
static long cur_rss_kb(void)
{
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2)
        res = -1;
    fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* With FERRY_BENCH_STATS set, print the loop's and its inbox's counters
 * on stderr after a workload (how many polls, eventfd wakeups, drains);
 * and since start_clock(), the page faults and context switches of the
 * whole process, and the CPU time of the loop thread (the kernel counts
 * it in ticks: a coarse split between user and system). */
static void print_stats(const char *workload)
{
    ferry_loop *loop = ferry_loop_current();
    ferry_inbox_stats ib;
    ferry_loop_stats ls;
    struct rusage ru, rl;

    if (!getenv("FERRY_BENCH_STATS") || !loop)
        return;
    getrusage(RUSAGE_SELF, &ru);
    getrusage(RUSAGE_THREAD, &rl);
    fprintf(stderr, "stats %s: process minor_faults=%ld voluntary_switches=%ld "
            "involuntary_switches=%ld; loop thread cpu_us user=%ld sys=%ld\n", workload,
            ru.ru_minflt - ru_start.ru_minflt, ru.ru_nvcsw - ru_start.ru_nvcsw,
            ru.ru_nivcsw - ru_start.ru_nivcsw, tv_us(ru_start_loop.ru_utime, rl.ru_utime),
            tv_us(ru_start_loop.ru_stime, rl.ru_stime));
    if (ferry_loop_stats_get(loop, &ls) == 0)
        fprintf(stderr, "stats %s: turns=%" PRIu64 " steps=%" PRIu64 " polls=%" PRIu64 "\n",
                workload, ls.turns, ls.steps, ls.polls);
    if (ferry_loop_inbox_stats_get(loop, &ib) == 0)
        fprintf(stderr, "stats %s: inbox posts=%" PRIu64 " wakeups=%" PRIu64
                " drains=%" PRIu64 " run=%" PRIu64 " max_batch=%zu\n",
                workload, ib.posts, ib.wakeups, ib.drains, ib.run, ib.max_batch);
}

/* Print the contract's line; returns 0 if ok, 1 otherwise. */
static int report(const char *workload, long n, double secs, bool ok, const char *extra)
{
    printf("BENCH workload=%s system=%s n=%ld seconds=%.6f ns_per_op=%.2f "
           "ops_per_s=%.0f rss_kb=%ld check=%s%s%s\n",
           workload, SYS, n, secs, secs * 1e9 / (double)n,
           secs > 0 ? (double)n / secs : 0.0, peak_rss_kb(), ok ? "ok" : "FAIL",
           extra && *extra ? " " : "", extra && *extra ? extra : "");
    fflush(stdout);
    print_stats(workload);
    return ok ? 0 : 1;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "ferry-bench: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(1);
}

/* Spawn with a handle, or die: a failed spawn is a broken benchmark. */
static ferry_task *spawn(ferry_task_fn fn, void *arg)
{
    ferry_task *t;
    int rc = ferry_task_spawn(&t, NULL, fn, arg, NULL);

    if (rc)
        die("ferry_task_spawn", rc);
    return t;
}

static void spawn_detached(ferry_task_fn fn, void *arg)
{
    int rc = ferry_task_spawn(NULL, NULL, fn, arg, NULL);

    if (rc)
        die("ferry_task_spawn", rc);
}

static int join(ferry_task *t)
{
    int status = 0, rc = ferry_task_join(t, &status);

    if (rc)
        die("ferry_task_join", rc);
    return status;
}

/* ---- the pool ---------------------------------------------------------- */

static atomic_long ran;   /* no-op jobs that really ran */

static int noop_job(void *arg)
{
    (void)arg;
    atomic_fetch_add_explicit(&ran, 1, memory_order_relaxed);
    return 0;
}

static int warm_task(void *arg)
{
    return ferry_to_thread(arg, noop_job, NULL);
}

/* A pool of POOL_THREADS threads, each of which has run a job. */
static ferry_pool *pool_start(void)
{
    ferry_pool_opts o = { .threads = POOL_THREADS };
    ferry_task *t[8];
    ferry_pool *pool;
    int rc = ferry_pool_new(&pool, &o);

    if (rc)
        die("ferry_pool_new", rc);
    for (int i = 0; i < 8; i++)
        t[i] = spawn(warm_task, pool);
    for (int i = 0; i < 8; i++)
        if (join(t[i]) != 0)
            die("warming the pool", EIO);
    atomic_store(&ran, 0);
    return pool;
}

/* ---- switch ------------------------------------------------------------ */

struct sw_count {
    long n;                 /* yields to do */
    long done;              /* yields done */
    char pad[48];           /* one cache line each, as the Go peer */
};

static int switch_task(void *arg)
{
    struct sw_count *c = arg;

    for (long i = 0; i < c->n; i++) {
        if (ferry_yield())
            return 1;
        c->done++;
    }
    return 0;
}

static int w_switch(void *arg)
{
    const long n = 2000000;
    struct sw_count c[2] = { { .n = n / 2 }, { .n = n - n / 2 } };
    ferry_task *t[2];
    int64_t t0;
    bool ok;

    (void)arg;
    t0 = start_clock();
    t[0] = spawn(switch_task, &c[0]);
    t[1] = spawn(switch_task, &c[1]);
    ok = join(t[0]) == 0;
    ok &= join(t[1]) == 0;
    return report("switch", n, secs_since(t0), ok && c[0].done + c[1].done == n, NULL);
}

/* ---- spawn ------------------------------------------------------------- */

static int spawn_job(void *arg)
{
    return (int)((intptr_t)arg + 1);
}

static int w_spawn(void *arg)
{
    enum { N = 1000000, BATCH = 1000 };
    static ferry_task *h[BATCH];
    int64_t sum = 0, t0;

    (void)arg;
    t0 = start_clock();
    for (long b = 0; b < N / BATCH; b++) {
        for (long i = 0; i < BATCH; i++)
            h[i] = spawn(spawn_job, (void *)(intptr_t)(b * BATCH + i));
        for (long i = 0; i < BATCH; i++)
            sum += join(h[i]);
    }
    return report("spawn", N, secs_since(t0), sum == (int64_t)N * (N + 1) / 2, NULL);
}

/* ---- idle_tasks, idle_1m ---------------------------------------------- */

struct idle {
    ferry_event go;         /* what every task waits for */
    ferry_event all_woke;   /* set by the last task to wake */
    long n;                 /* tasks */
    long started;           /* tasks that reached the wait */
    long woke;              /* tasks that returned from it with 0 */
    long errors;            /* waits that failed */
};

static int idle_task(void *arg)
{
    struct idle *s = arg;

    s->started++;
    if (ferry_event_wait(&s->go))
        s->errors++;
    else
        s->woke++;
    if (s->woke + s->errors == s->n)
        ferry_event_set(&s->all_woke);
    return 0;
}

static int idle_run(const char *name, long n)
{
    struct idle s = { .n = n };
    long rss0, rss1;
    char extra[64];
    int64_t t0;
    int rc;

    rss0 = cur_rss_kb();
    t0 = start_clock();
    for (long i = 0; i < n; i++)
        spawn_detached(idle_task, &s);
    while (s.started < n)
        if ((rc = ferry_yield()))
            die("ferry_yield", rc);
    rss1 = cur_rss_kb();
    ferry_event_set(&s.go);
    if ((rc = ferry_event_wait(&s.all_woke)))
        die("ferry_event_wait", rc);
    snprintf(extra, sizeof extra, "bytes_per_task=%ld", (rss1 - rss0) * 1024 / n);
    return report(name, n, secs_since(t0), s.woke == n && !s.errors, extra);
}

static int w_idle_tasks(void *arg)
{
    (void)arg;
    return idle_run("idle_tasks", 100000);
}

static int w_idle_1m(void *arg)
{
    (void)arg;
    return idle_run("idle_1m", 1000000);
}

/* ---- lock_contention --------------------------------------------------- */

struct lockc {
    ferry_lock lock;
    long per;               /* iterations per task */
    long counter;           /* guarded by lock */
};

static int lock_task(void *arg)
{
    struct lockc *s = arg;

    for (long i = 0; i < s->per; i++) {
        long v;
        if (ferry_lock_acquire(&s->lock))
            return 1;
        v = s->counter;
        if (ferry_yield())
            return 1;
        s->counter = v + 1;
        if (ferry_lock_release(&s->lock))
            return 1;
    }
    return 0;
}

static int w_lock_contention(void *arg)
{
    enum { TASKS = 100, PER = 10000 };
    struct lockc s = { .per = PER };
    ferry_task *t[TASKS];
    int64_t t0;
    bool ok = true;

    (void)arg;
    ferry_lock_init(&s.lock);
    t0 = start_clock();
    for (int i = 0; i < TASKS; i++)
        t[i] = spawn(lock_task, &s);
    for (int i = 0; i < TASKS; i++)
        ok &= join(t[i]) == 0;
    return report("lock_contention", (long)TASKS * PER, secs_since(t0),
                  ok && s.counter == (long)TASKS * PER, NULL);
}

/* ---- queue_pipeline ---------------------------------------------------- */

struct pipe {
    ferry_queue q;          /* int64_t items, capacity 100 */
    long per;               /* items per producer */
    int64_t total;          /* sum of what the consumers got */
};

struct producer {
    struct pipe *p;
    int64_t base;           /* puts base+1 .. base+per */
};

static int producer_task(void *arg)
{
    struct producer *pr = arg;

    for (int64_t i = pr->base + 1; i <= pr->base + pr->p->per; i++)
        if (ferry_queue_put(&pr->p->q, &i))
            return 1;
    return 0;
}

static int consumer_task(void *arg)
{
    struct pipe *p = arg;
    int64_t v, s = 0;

    for (;;) {
        if (ferry_queue_get(&p->q, &v))
            return 1;
        if (v == 0)
            break;
        s += v;
    }
    p->total += s;
    return 0;
}

static int w_queue_pipeline(void *arg)
{
    enum { N = 1000000, NP = 10, NC = 10 };
    struct pipe p = { .per = N / NP };
    struct producer pr[NP];
    ferry_task *prod[NP], *cons[NC];
    const int64_t zero = 0;
    int64_t t0;
    bool ok = true;
    int rc;

    (void)arg;
    if ((rc = ferry_queue_init(&p.q, sizeof(int64_t), 100, FERRY_QUEUE_FIFO, NULL, NULL)))
        die("ferry_queue_init", rc);
    t0 = start_clock();
    for (int c = 0; c < NC; c++)
        cons[c] = spawn(consumer_task, &p);
    for (int i = 0; i < NP; i++) {
        pr[i] = (struct producer){ .p = &p, .base = (int64_t)i * p.per };
        prod[i] = spawn(producer_task, &pr[i]);
    }
    for (int i = 0; i < NP; i++)
        ok &= join(prod[i]) == 0;
    for (int c = 0; c < NC; c++)
        if ((rc = ferry_queue_put(&p.q, &zero)))
            die("ferry_queue_put", rc);
    for (int c = 0; c < NC; c++)
        ok &= join(cons[c]) == 0;
    rc = report("queue_pipeline", N, secs_since(t0),
                ok && p.total == (int64_t)N * (N + 1) / 2, NULL);
    ferry_queue_destroy(&p.q);
    return rc;
}

/* ---- stampede ---------------------------------------------------------- */

enum { ST_KEYS = 10 };

struct stampede {
    ferry_pool  *pool;
    ferry_flight flight;    /* one fetch per key while it is in flight */
    bool         have[ST_KEYS];   /* the cache: filled by a fetch */
    long         cache[ST_KEYS];
    long         fetches;   /* fetch functions run */
    long         n, finished, bad;
    bool         lazy;      /* FERRY_BENCH_LAZY: spawn without FERRY_SPAWN_EAGER */
    ferry_event  all_done;  /* set by the last client */
};

static struct stampede st;

static int sleep_1ms_job(void *arg)
{
    struct timespec ts = { 0, 1000000 };

    (void)arg;
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
    return 0;
}

/* The leader's work: fetch through the pool, fill the cache. */
static int fetch(void *arg, void *out, size_t out_size)
{
    long key = (long)(intptr_t)arg, val;
    int rc;

    st.fetches++;
    rc = ferry_to_thread(st.pool, sleep_1ms_job, NULL);
    if (rc)
        return rc;
    val = key * 7 + 1;
    st.cache[key] = val;
    st.have[key] = true;
    memcpy(out, &val, out_size);
    return 0;
}

static int client_task(void *arg)
{
    long key = (long)(intptr_t)arg % ST_KEYS, val = -1;

    if (st.have[key]) {
        val = st.cache[key];
    } else if (ferry_flight_do(&st.flight, &key, sizeof key, fetch,
                               (void *)(intptr_t)key, &val, sizeof val) < 0) {
        val = -1;
    }
    if (val != key * 7 + 1)
        st.bad++;
    if (++st.finished == st.n)
        ferry_event_set(&st.all_done);
    return 0;
}

static int w_stampede(void *arg)
{
    char extra[48];
    int64_t t0;
    int rc;

    (void)arg;
    st.n = 10000;
    st.lazy = getenv("FERRY_BENCH_LAZY") != NULL;
    st.pool = pool_start();
    t0 = start_clock();
    for (long i = 0; i < st.n; i++) {
        /* Eager: a client runs as soon as it is spawned, so once its key is
         * cached it ends at once and the next client reuses its stack.
         * FERRY_BENCH_LAZY=1 spawns them the default way (all 10,000 are
         * alive at once, each with a stack page of its own). */
        ferry_task_opts o = { .flags = st.lazy ? 0 : FERRY_SPAWN_EAGER };

        if ((rc = ferry_task_spawn(NULL, NULL, client_task, (void *)(intptr_t)i, &o)))
            die("ferry_task_spawn", rc);
    }
    if ((rc = ferry_event_wait(&st.all_done)))
        die("ferry_event_wait", rc);
    /* Extras are numbers (the peers' median.py reads them as such). */
    snprintf(extra, sizeof extra, "fetches=%ld eager=%d", st.fetches, !st.lazy);
    rc = report("stampede", st.n, secs_since(t0), !st.bad && st.fetches == ST_KEYS, extra);
    ferry_flight_destroy(&st.flight);
    ferry_pool_free(st.pool);
    return rc;
}

/* ---- threadsafe_post --------------------------------------------------- */

struct post {
    ferry_loop *loop;
    long n;
    long counter;           /* loop thread */
    long failed;            /* poster thread: posts refused */
    int64_t t0, t1;         /* first post (poster), last callback (loop) */
    ferry_event done;       /* set by the n-th callback */
};

static struct post ps;

static void incr_cb(void *arg)
{
    (void)arg;
    if (++ps.counter == ps.n) {
        ps.t1 = ferry_now();
        ferry_event_set(&ps.done);
    }
}

static void *poster_main(void *arg)
{
    (void)arg;
    ps.t0 = start_clock();
    for (long i = 0; i < ps.n; i++)
        if (ferry_loop_call_soon_threadsafe(ps.loop, incr_cb, NULL))
            ps.failed++;
    return NULL;
}

static int w_threadsafe_post(void *arg)
{
    pthread_t thr;
    int rc;

    (void)arg;
    ps.loop = ferry_loop_current();
    ps.n = 1000000;
    if ((rc = pthread_create(&thr, NULL, poster_main, NULL)))
        die("pthread_create", rc);
    /* Every post is either counted or failed; a failure leaves the event
     * unset, so poll for that case instead of waiting forever. */
    for (;;) {
        ferry_scope sc;
        ferry_scope_enter(&sc, ferry_now() + FERRY_SEC(1), 0);
        rc = ferry_event_wait(&ps.done);
        ferry_scope_exit(&sc);
        if (rc == 0 || (rc == -ETIMEDOUT && ps.failed && ps.counter + ps.failed >= ps.n))
            break;
        if (rc != -ETIMEDOUT)
            die("ferry_event_wait", rc);
    }
    pthread_join(thr, NULL);
    if (!ps.t1)
        ps.t1 = ferry_now();
    return report("threadsafe_post", ps.n, (double)(ps.t1 - ps.t0) * 1e-9,
                  ps.counter == ps.n && !ps.failed, NULL);
}

/* ---- offload_rtt, offload_throughput ---------------------------------- */

static int w_offload_rtt(void *arg)
{
    const long n = 100000;
    ferry_pool *pool = pool_start();
    long done = 0;
    int64_t t0;
    int rc;

    (void)arg;
    t0 = start_clock();
    for (long i = 0; i < n; i++) {
        if ((rc = ferry_to_thread(pool, noop_job, NULL)))
            die("ferry_to_thread", rc);
        done++;
    }
    rc = report("offload_rtt", n, secs_since(t0), done == n && atomic_load(&ran) == n, NULL);
    ferry_pool_free(pool);
    return rc;
}

struct offl {
    ferry_pool *pool;
    long per;               /* calls per task */
};

static int offload_task(void *arg)
{
    struct offl *o = arg;
    int c = 0;

    for (long i = 0; i < o->per; i++)
        if (ferry_to_thread(o->pool, noop_job, NULL) == 0)
            c++;
    return c;
}

static int w_offload_throughput(void *arg)
{
    enum { TASKS = 1000, PER = 100 };
    static ferry_task *t[TASKS];
    struct offl o = { .per = PER };
    long done = 0;
    int64_t t0;
    int rc;

    (void)arg;
    o.pool = pool_start();
    t0 = start_clock();
    for (int i = 0; i < TASKS; i++)
        t[i] = spawn(offload_task, &o);
    for (int i = 0; i < TASKS; i++)
        done += join(t[i]);
    rc = report("offload_throughput", (long)TASKS * PER, secs_since(t0),
                done == (long)TASKS * PER && atomic_load(&ran) == (long)TASKS * PER, NULL);
    ferry_pool_free(o.pool);
    return rc;
}

/* ---- cross-loop calls (a runtime of two loops) -------------------------- */

static int xl_noop(void *arg, void **result)
{
    (void)arg;
    (void)result;
    return 0;
}

/* One caller: n calls to loop 1 in a row; the number that returned 0 with
 * fn's 0. */
static long xl_calls(long n, unsigned flags)
{
    long ok = 0;
    int fn_status;

    for (long i = 0; i < n; i++)
        if (ferry_runtime_call(NULL, 1, xl_noop, NULL, flags, &fn_status, NULL) == 0 &&
            fn_status == 0)
            ok++;
    return ok;
}

static int xl_seq(const char *name, unsigned flags)
{
    const long n = 200000;
    int64_t t0;
    long ok;

    xl_calls(1000, flags);        /* warm: stacks, the inboxes' buffers */
    t0 = start_clock();
    ok = xl_calls(n, flags);
    return report(name, n, secs_since(t0), ok == n, NULL);
}

static int w_xloop_call(void *arg)
{
    (void)arg;
    return xl_seq("xloop_call", 0);
}

static int w_xloop_call_cb(void *arg)
{
    (void)arg;
    return xl_seq("xloop_call_cb", FERRY_CALL_CALLBACK);
}

struct xl_batch { long per; unsigned flags; };

static int xl_batch_task(void *arg)
{
    struct xl_batch *b = arg;

    return (int)(xl_calls(b->per, b->flags) == b->per);
}

static int xl_batch(const char *name, unsigned flags)
{
    enum { TASKS = 64 };
    static ferry_task *t[TASKS];
    struct xl_batch b = { .per = 1000000 / TASKS, .flags = flags };
    long good = 0;
    int64_t t0;

    xl_calls(1000, flags);
    t0 = start_clock();
    for (int i = 0; i < TASKS; i++)
        t[i] = spawn(xl_batch_task, &b);
    for (int i = 0; i < TASKS; i++)
        good += join(t[i]);
    return report(name, (long)TASKS * b.per, secs_since(t0), good == TASKS, NULL);
}

static int w_xloop_call_batch(void *arg)
{
    (void)arg;
    return xl_batch("xloop_call_batch", FERRY_CALL_CALLBACK);
}

static int w_xloop_call_batch_task(void *arg)
{
    (void)arg;
    return xl_batch("xloop_call_batch_task", 0);
}

/* ---- echo servers (network workloads) ------------------------------------ */

#define ECHO_BUF (64 * 1024)

static ferry_listener *echo_listener;

/* --work K: the tcp_rpc workload's cost of a request (see the top).  The
 * result goes to a sink of each thread's, so the rounds cannot be left
 * out and no two loops write one word. */
static long echo_work;
static _Thread_local volatile uint64_t work_sink;

static void work_charge(const char *p, size_t n)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;

    for (size_t i = 0; i < n; i++)
        x = (x ^ (unsigned char)p[i]) * 0x100000001b3ull;
    for (long r = 0; r < echo_work; r++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    work_sink ^= x;
}

/* Echo on one stream until its end: read what is there (straight into the
 * task's buffer: it is as large as the stream's), write it back. */
static void echo_stream(ferry_stream *s)
{
    char *buf = malloc(ECHO_BUF);
    size_t n;

    while (buf && ferry_stream_read(s, buf, ECHO_BUF, &n) == 0 && n > 0) {
        if (echo_work)
            work_charge(buf, n);
        if (ferry_stream_write(s, buf, n, NULL) != 0)
            break;
    }
    free(buf);
}

/* One connection of the single-loop server. */
static int echo_conn(void *arg)
{
    ferry_stream *s = arg;

    echo_stream(s);
    ferry_stream_close(s);
    return 0;
}

/* What a connection's task does in the bufferevent variant.  The task
 * waits on an event that the bufferevent's callbacks set; it reads by
 * copying out of the input evbuffer and writes by copying into the output
 * one, as a stream API on top of bufferevent would, and waits while more
 * than 1 MiB is queued for writing (the peers' libevent server's
 * watermarks). */
struct bev_conn {
    struct bufferevent *bev;
    ferry_event         ready;    /* set by every callback */
    bool                done;     /* end of stream or error */
};

#define BEV_HIGH (1u << 20)
#define BEV_LOW  (BEV_HIGH / 2)

static void bev_wake(struct bufferevent *bev, void *arg)
{
    (void)bev;
    ferry_event_set(&((struct bev_conn *)arg)->ready);
}

static void bev_event(struct bufferevent *bev, short what, void *arg)
{
    struct bev_conn *c = arg;

    (void)bev;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        c->done = true;
    ferry_event_set(&c->ready);
}

static int echo_bev_conn(void *arg)
{
    struct bev_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(c->bev), *out = bufferevent_get_output(c->bev);
    char *buf = malloc(ECHO_BUF);
    int n;

    while (buf) {
        if (evbuffer_get_length(in)) {
            n = evbuffer_remove(in, buf, ECHO_BUF);
            if (n <= 0 || bufferevent_write(c->bev, buf, (size_t)n) != 0)
                break;
            if (evbuffer_get_length(out) > BEV_HIGH) {
                bufferevent_setwatermark(c->bev, EV_WRITE, BEV_LOW, 0);
                while (!c->done && evbuffer_get_length(out) > BEV_LOW) {
                    ferry_event_clear(&c->ready);
                    if (ferry_event_wait(&c->ready) != 0)
                        goto out;
                }
                bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
            }
            continue;
        }
        if (c->done)
            break;
        ferry_event_clear(&c->ready);
        if (ferry_event_wait(&c->ready) != 0)
            break;
    }
out:
    free(buf);
    bufferevent_free(c->bev);
    ferry_event_destroy(&c->ready);
    free(c);
    return 0;
}

static int echo_acceptor(void *arg)
{
    bool bev = arg != NULL;

    for (;;) {
        ferry_stream *s;
        int rc = ferry_listener_accept(echo_listener, &s, NULL);

        if (rc == -ECANCELED || rc == -EBADF)
            return 0;
        if (rc == -EMFILE || rc == -ENFILE) {
            ferry_sleep(FERRY_MSEC(10));
            continue;
        }
        if (rc) {
            fprintf(stderr, "ferry-bench: accept: %s\n", strerror(-rc));
            continue;
        }
        if (bev) {
            /* Take the accepted descriptor over: the stream gives up a dup
             * of it, the bufferevent owns that. */
            struct bev_conn *c = calloc(1, sizeof *c);
            int fd = dup(ferry_stream_fd(s));
            ferry_stream_close(s);
            if (!c || fd < 0 || !(c->bev = bufferevent_socket_new(ferry_loop_base(ferry_loop_current()),
                                                                  fd, BEV_OPT_CLOSE_ON_FREE))) {
                if (fd >= 0)
                    close(fd);
                free(c);
                continue;
            }
            ferry_event_init(&c->ready);
            bufferevent_setcb(c->bev, bev_wake, bev_wake, bev_event, c);
            bufferevent_enable(c->bev, EV_READ | EV_WRITE);
            if ((rc = ferry_task_spawn(NULL, NULL, echo_bev_conn, c, NULL)) != 0) {
                bufferevent_free(c->bev);
                free(c);
            }
            continue;
        }
        if ((rc = ferry_task_spawn(NULL, NULL, echo_conn, s, NULL)) != 0)
            ferry_stream_close(s);
    }
}

/* Say on stderr how the loop's streams do their I/O, and why not with
 * io_uring where FERRY_IO=uring asked for it: bench/run-uring.sh reads it
 * to keep a server that fell back out of the io_uring rows. */
static void print_io_backend(void)
{
#ifdef FERRY_HAVE_URING
    ferry_loop_stats ls;

    if (ferry_loop_stats_get(ferry_loop_current(), &ls) == 0 && ls.io_backend)
        fprintf(stderr, "ferry-bench: io backend %s%s%s\n", ls.io_backend,
                ls.io_fallback ? ", fallback: " : "", ls.io_fallback ? ls.io_fallback : "");
#else
    const char *io = getenv("FERRY_IO");

    fprintf(stderr, "ferry-bench: io backend epoll%s\n",
            io && strcmp(io, "uring") == 0 ? ", fallback: built without io_uring" : "");
#endif
}

/* Serve until SIGTERM or SIGINT; then stop the loop (freeing it ends the
 * connections' tasks). */
static int echo_main(void *arg)
{
    static const int stop[] = { SIGTERM, SIGINT };
    const char *const *a = arg;
    ferry_sigsub *sub;
    ferry_task *acc;
    int rc, sig;

    if ((rc = ferry_sigsub_new(&sub, NULL, stop, 2)))
        die("ferry_sigsub_new", rc);
    if ((rc = ferry_tcp_listen(&echo_listener, NULL, "127.0.0.1", atoi(a[0]), NULL)))
        die("ferry_tcp_listen", rc);
    fprintf(stderr, "ferry-bench: echo server%s on 127.0.0.1:%d\n", a[1] ? " (bufferevent)" : "",
            ferry_listener_port(echo_listener));
    print_io_backend();
    acc = spawn(echo_acceptor, (void *)(uintptr_t)(a[1] != NULL));
    ferry_sigsub_recv(sub, &sig);
    ferry_task_cancel(acc);
    join(acc);
    ferry_listener_close(echo_listener);
    ferry_sigsub_free(sub);
    ferry_loop_stop(ferry_loop_current());
    return 0;
}

/* The experiment knob FERRY_BENCH_IO=libevent (io/stream.c). */
extern bool ferry__io_use_libevent;

static int run_echo(const char *port, bool bev)
{
    const char *args[2] = { port, bev ? "bev" : NULL };
    ferry_loop *loop;
    ferry_task *t;
    int rc, status = 0;

    if (atoi(port) <= 0 || atoi(port) > 65535) {
        fprintf(stderr, "ferry-bench: --echo-server PORT: bad port '%s'\n", port);
        return 2;
    }
    if (getenv("FERRY_BENCH_IO") && strcmp(getenv("FERRY_BENCH_IO"), "libevent") == 0)
        ferry__io_use_libevent = true;
    if ((rc = ferry_loop_new(&loop, NULL)))
        die("ferry_loop_new", rc);
    if ((rc = ferry_task_spawn(&t, loop, echo_main, args, &(ferry_task_opts){ .name = "main" })))
        die("ferry_task_spawn", rc);
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        if ((rc = ferry_loop_run(loop, FERRY_RUN_DEFAULT)))
            die("ferry_loop_run", rc);
    ferry_loop_free(loop);
    return status ? 1 : 0;
}

/* ---- the echo server on N loops ------------------------------------------ */

/* One connection of the runtime's server (ferry closes the stream). */
static int echo_rt_conn(ferry_stream *s, void *arg)
{
    (void)arg;
    echo_stream(s);
    return 0;
}

struct echo_rt {
    ferry_runtime_listener *l;
};

static int echo_rt_serve(void *arg)
{
    struct echo_rt *e = arg;

    return ferry_runtime_listener_serve(e->l, echo_rt_conn, NULL);
}

/* Loop 0's main: serve on every loop until SIGTERM or SIGINT. */
static int echo_rt_main(void *arg)
{
    static const int stop[] = { SIGTERM, SIGINT };
    ferry_sigsub *sub;
    ferry_task *t;
    int rc, sig;

    if ((rc = ferry_sigsub_new(&sub, NULL, stop, 2)))
        die("ferry_sigsub_new", rc);
    t = spawn(echo_rt_serve, arg);
    ferry_sigsub_recv(sub, &sig);
    ferry_task_cancel(t);
    join(t);
    ferry_sigsub_free(sub);
    return 0;
}

static int run_echo_loops(const char *port, unsigned loops, const char *spread)
{
    ferry_runtime_opts o = { .loops = loops };
    ferry_runtime_listen_opts lo = {0};
    struct echo_rt e;
    ferry_runtime *rt;
    int rc, status = 0;

    if (atoi(port) <= 0 || atoi(port) > 65535 || loops == 0) {
        fprintf(stderr, "ferry-bench: --echo-server PORT --loops N: bad port or N\n");
        return 2;
    }
    if (spread && strcmp(spread, "balanced") == 0)
        lo.mode = FERRY_SPREAD_BALANCED;
    else if (spread && strcmp(spread, "reuseport") != 0) {
        fprintf(stderr, "ferry-bench: --spread reuseport|balanced\n");
        return 2;
    }
    if ((rc = ferry_runtime_new(&rt, &o)))
        die("ferry_runtime_new", rc);
    if ((rc = ferry_runtime_listen(&e.l, rt, "127.0.0.1", atoi(port), &lo)))
        die("ferry_runtime_listen", rc);
    fprintf(stderr, "ferry-bench: echo server on 127.0.0.1:%d, %u loop(s), %s, work %ld\n",
            ferry_runtime_listener_port(e.l), loops,
            lo.mode == FERRY_SPREAD_BALANCED ? "balanced" : "reuseport", echo_work);
    if ((rc = ferry_runtime_run(rt, echo_rt_main, &e, &status)))
        die("ferry_runtime_run", rc);
    ferry_runtime_listener_free(e.l);
    ferry_runtime_free(rt);
    return status ? 1 : 0;
}

/* ---- spread_balanced, spread_reuseport ------------------------------------- */

#define SPREAD_LOOPS 8
#define SPREAD_CONNS 64

struct spread {
    ferry_runtime_listener *l;
    int                     port;
    atomic_int              served;
    atomic_bool             counted;   /* the main task has read the loads */
    int                     fds[SPREAD_CONNS];
    int                     made;
};

static int spread_conn(ferry_stream *s, void *arg)
{
    struct spread *sp = arg;
    char b;
    size_t n;

    atomic_fetch_add(&sp->served, 1);
    while (ferry_stream_read(s, &b, 1, &n) == 0 && n > 0)
        ;
    return 0;
}

static int spread_serve(void *arg)
{
    struct spread *sp = arg;

    return ferry_runtime_listener_serve(sp->l, spread_conn, sp);
}

/* The client: open every connection, keep them until counted. */
static void *spread_client(void *arg)
{
    struct spread *sp = arg;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)sp->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

    for (int i = 0; i < SPREAD_CONNS; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            if (fd >= 0)
                close(fd);
            break;
        }
        sp->fds[sp->made++] = fd;
    }
    while (!atomic_load(&sp->counted))
        usleep(1000);
    for (int i = 0; i < sp->made; i++)
        close(sp->fds[i]);
    return NULL;
}

static int spread_run(const char *name, int mode)
{
    ferry_runtime_listen_opts lo = { .mode = mode };
    static struct spread sp;
    char extra[96];
    int64_t lo_n = INT64_MAX, hi_n = 0;
    ferry_task *t;
    pthread_t th;
    int64_t t0;
    int rc;

    if ((rc = ferry_runtime_listen(&sp.l, NULL, "127.0.0.1", 0, &lo)))
        die("ferry_runtime_listen", rc);
    sp.port = ferry_runtime_listener_port(sp.l);
    t = spawn(spread_serve, &sp);
    t0 = start_clock();
    if (pthread_create(&th, NULL, spread_client, &sp))
        die("pthread_create", EAGAIN);
    while (atomic_load(&sp.served) < SPREAD_CONNS)
        ferry_sleep(FERRY_MSEC(1));
    for (unsigned i = 0; i < SPREAD_LOOPS; i++) {
        int64_t k = ferry_runtime_load(NULL, i);

        lo_n = k < lo_n ? k : lo_n;
        hi_n = k > hi_n ? k : hi_n;
    }
    atomic_store(&sp.counted, true);
    ferry_task_cancel(t);
    join(t);
    pthread_join(th, NULL);
    ferry_runtime_listener_free(sp.l);
    snprintf(extra, sizeof extra, "loops=%d max_per_loop=%" PRId64 " min_per_loop=%" PRId64,
             SPREAD_LOOPS, hi_n, lo_n);
    return report(name, SPREAD_CONNS, secs_since(t0), sp.made == SPREAD_CONNS, extra);
}

static int w_spread_balanced(void *arg)
{
    (void)arg;
    return spread_run("spread_balanced", FERRY_SPREAD_BALANCED);
}

static int w_spread_reuseport(void *arg)
{
    (void)arg;
    return spread_run("spread_reuseport", FERRY_SPREAD_REUSEPORT);
}

/* ---- driver ------------------------------------------------------------ */

static const struct workload {
    const char   *name;
    ferry_task_fn fn;
    bool          dflt;     /* in the set run with no argument */
    unsigned      loops;    /* 0: one loop; else a runtime of this many */
} workloads[] = {
    { "switch",             w_switch,             true,  0 },
    { "spawn",              w_spawn,              true,  0 },
    { "idle_tasks",         w_idle_tasks,         true,  0 },
    { "lock_contention",    w_lock_contention,    true,  0 },
    { "queue_pipeline",     w_queue_pipeline,     true,  0 },
    { "stampede",           w_stampede,           true,  0 },
    { "threadsafe_post",    w_threadsafe_post,    true,  0 },
    { "offload_rtt",        w_offload_rtt,        true,  0 },
    { "offload_throughput", w_offload_throughput, true,  0 },
    { "idle_1m",            w_idle_1m,            false, 0 },
    { "xloop_call",            w_xloop_call,            false, 2 },
    { "xloop_call_cb",         w_xloop_call_cb,         false, 2 },
    { "xloop_call_batch",      w_xloop_call_batch,      false, 2 },
    { "xloop_call_batch_task", w_xloop_call_batch_task, false, 2 },
    { "spread_balanced",       w_spread_balanced,       false, SPREAD_LOOPS },
    { "spread_reuseport",      w_spread_reuseport,      false, SPREAD_LOOPS },
};
#define NWORKLOADS (sizeof workloads / sizeof workloads[0])

static const struct workload *find(const char *name)
{
    if (strcmp(name, "--million-idle") == 0)
        name = "idle_1m";
    for (size_t i = 0; i < NWORKLOADS; i++)
        if (strcmp(workloads[i].name, name) == 0)
            return &workloads[i];
    return NULL;
}

/* Run one workload in this process, as the main task of a fresh loop with
 * default settings (ferry_run(), unrolled so that the experiment knob
 * FERRY_BENCH_STACK_CACHE=N can set ferry_loop_opts.stack_cache).
 * Returns 0 if its check passed. */
static int run_here(const struct workload *w)
{
    ferry_loop_opts o = {0};
    const char *e = getenv("FERRY_BENCH_STACK_CACHE");
    ferry_loop *loop;
    ferry_task *t;
    int rc, status = 0;

    if (e && *e)
        o.stack_cache = strtoul(e, NULL, 10);
    if (w->loops) {
        /* The main task on loop 0 of a runtime. */
        ferry_runtime_opts ro = { .loops = w->loops, .loop = o };
        ferry_runtime *rt;

        e = getenv("FERRY_BENCH_PIN");
        ro.pin = e && *e == '1';
        if ((rc = ferry_runtime_new(&rt, &ro)))
            die("ferry_runtime_new", rc);
        if ((rc = ferry_runtime_run(rt, w->fn, NULL, &status)))
            die("ferry_runtime_run", rc);
        ferry_runtime_free(rt);
        if (status < 0)
            die(w->name, status);
        return status;
    }
    if ((rc = ferry_loop_new(&loop, &o)))
        die("ferry_loop_new", rc);
    if ((rc = ferry_task_spawn(&t, loop, w->fn, NULL, &(ferry_task_opts){ .name = "main" })))
        die("ferry_task_spawn", rc);
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        if ((rc = ferry_loop_run(loop, FERRY_RUN_DEFAULT)))
            die("ferry_loop_run", rc);
    ferry_loop_free(loop);
    if (status < 0)
        die(w->name, status);
    return status;
}

/* Run one workload in a fresh process (fork + exec of this program). */
static int run_child(const char *self, const struct workload *w)
{
    int status;
    pid_t pid;

    fflush(stdout);
    pid = fork();
    if (pid < 0)
        die("fork", errno);
    if (pid == 0) {
        execl(self, self, w->name, (char *)NULL);
        fprintf(stderr, "ferry-bench: exec %s: %s\n", self, strerror(errno));
        _exit(2);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            die("waitpid", errno);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFSIGNALED(status))
        fprintf(stderr, "ferry-bench: %s: killed by signal %d\n", w->name, WTERMSIG(status));
    else
        fprintf(stderr, "ferry-bench: %s: exit status %d\n", w->name, WEXITSTATUS(status));
    return 1;
}

int main(int argc, char **argv)
{
    const char *self = "/proc/self/exe";
    int fail = 0;

    if (argc >= 3 && strcmp(argv[1], "--echo-server") == 0) {
        unsigned loops = 0;
        const char *spread = NULL;

        for (int i = 3; i < argc; i += 2) {
            if (i + 1 >= argc)
                break;
            if (strcmp(argv[i], "--loops") == 0)
                loops = (unsigned)strtoul(argv[i + 1], NULL, 10);
            else if (strcmp(argv[i], "--work") == 0)
                echo_work = strtol(argv[i + 1], NULL, 10);
            else if (strcmp(argv[i], "--spread") == 0)
                spread = argv[i + 1];
            else
                break;
        }
        if ((argc - 3) % 2 || echo_work < 0) {
            fprintf(stderr, "ferry-bench: --echo-server PORT [--loops N] [--work K] "
                    "[--spread reuseport|balanced]\n");
            return 2;
        }
        if (loops)
            return run_echo_loops(argv[2], loops, spread);
        return run_echo(argv[2], false);
    }
    if (argc == 3 && strcmp(argv[1], "--echo-server-bev") == 0)
        return run_echo(argv[2], true);
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < NWORKLOADS; i++)
            printf("%s%s\n", workloads[i].name, workloads[i].dflt ? "" : " (not in the default set)");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!find(argv[i])) {
            fprintf(stderr, "ferry-bench: unknown workload '%s' (try --list)\n", argv[i]);
            return 2;
        }
    }
    if (argc == 2)
        return run_here(find(argv[1])) ? 1 : 0;
    if (argc > 2) {
        for (int i = 1; i < argc; i++)
            fail |= run_child(self, find(argv[i]));
        return fail;
    }
    for (size_t i = 0; i < NWORKLOADS; i++)
        if (workloads[i].dflt)
            fail |= run_child(self, &workloads[i]);
    return fail;
}
