/* model_offload.c - the model-based tester's offload mode (to_thread and
 * to_thread_abandon with cancellation): ferry-model --offload.
 *
 * A sequence runs on a real loop and a small real pool (1 to 3 threads)
 * and, step by step, on a sequential reference model of that pool written
 * from include/ferry/bridge.h: a FIFO queue, at most `threads` jobs
 * running, cancellation of a queued job (never runs, -ECANCELED),
 * cancellation of a running job (ferry_to_thread: keeps waiting and
 * returns fn's status; ferry_to_thread_abandon: -ECANCELED at once, the
 * job keeps its thread and cleanup gets the late status).
 *
 * Determinism without a wall clock: every job blocks on its own semaphore
 * until the driver releases it, so the driver decides which jobs are
 * running, which are queued and when each ends.  After each operation the
 * driver waits until the real side has settled (it polls with a 10 s
 * watchdog, never a timing assertion; what does not settle stops the run,
 * since a task or a pool thread may then wait for good) and compares:
 *   - which jobs have started, which waiting tasks have returned and with
 *     what code, how many times each cleanup ran and with what status;
 *   - the pool's stats: queued, running, abandoned, completed, cancelled;
 * and checks invariants that do not depend on the model: no job runs
 * twice, the pool never runs more jobs at once than its size, and at the
 * end every job either ran exactly once or never ran and its waiter got
 * -ECANCELED.
 *
 * Operations (6 bytes each, as model.h; header byte 1 gives the pool
 * size): submit (to_thread or to_thread_abandon, a status), release a
 * running job, cancel a waiting task, let the loop turn.
 */
#include <errno.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "model.h"

#define MAXJ 24

enum { MJ_NONE = 0, MJ_QUEUED, MJ_RUNNING, MJ_DONE, MJ_CANCELLED };

struct ojob {
    /* real side: written by the pool thread (atomics) or the task */
    sem_t       go;            /* the driver posts it to let fn return */
    atomic_int  started;       /* fn entered */
    atomic_int  runs;          /* times fn entered */
    atomic_int  cleanups;      /* times cleanup ran */
    atomic_int  cleanup_status;
    ferry_task *task;
    bool        task_done;
    int         task_rc;
    bool        released;      /* the driver posted `go` */
    /* the job */
    bool        abandon;       /* submitted with ferry_to_thread_abandon */
    int         status;        /* what fn returns */
    /* model */
    int         mst;           /* MJ_* */
    bool        mstarted;
    bool        mabandoned;    /* cancelled while running, abandon kind */
    bool        mtask_done;
    int         mrc;
    int         mcleanups;
};

struct oseq {
    ferry_loop  *loop;
    ferry_pool  *pool;
    unsigned     threads;
    struct ojob  j[MAXJ];
    int          nj;
    /* model */
    int          mqueue[MAXJ];
    int          mqh, mqn;
    unsigned     mrunning, mabandoned;
    uint64_t     mcompleted, mcancelled;
    /* reporting */
    FILE        *trace;
    model_report *rep;
    int          opi;
    bool         failed;
    bool         stuck;        /* something did not settle */
    bool         selftest;     /* FERRY_MODEL_SELFTEST=stuck: one job is never let go */
};

static struct oseq *ocur;
static unsigned n_release_seq;   /* releases in this sequence (the self-test) */
/* Pools of stuck sequences: never freed (a thread may be blocked in them
 * for good), kept reachable. */
static ferry_pool *stuck_pools[8];
static unsigned nstuck_pools;
/* What the sequences exercised (printed by ferry-model --offload). */
static unsigned long n_submit[2], n_release, n_cancel_queued, n_cancel_running[2];
static atomic_int inflight, max_inflight;

static void ofail(struct oseq *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ofail(struct oseq *s, const char *fmt, ...)
{
    va_list ap;

    if (s->failed)
        return;
    s->failed = true;
    s->rep->failed = 1;
    s->rep->op_index = s->opi;
    va_start(ap, fmt);
    vsnprintf(s->rep->msg, sizeof s->rep->msg, fmt, ap);
    va_end(ap);
}

/* ---- the real side ----------------------------------------------------- */

static int job_fn(void *arg)
{
    struct ojob *j = arg;
    int n = atomic_fetch_add(&inflight, 1) + 1, m = atomic_load(&max_inflight);

    while (n > m && !atomic_compare_exchange_weak(&max_inflight, &m, n))
        ;
    atomic_fetch_add(&j->runs, 1);
    atomic_store(&j->started, 1);
    while (sem_wait(&j->go) != 0 && errno == EINTR)
        ;
    atomic_fetch_sub(&inflight, 1);
    return j->status;
}

static void job_cleanup(void *arg, int status)
{
    struct ojob *j = arg;

    atomic_store(&j->cleanup_status, status);
    atomic_fetch_add(&j->cleanups, 1);
}

static int waiter_main(void *arg)
{
    struct ojob *j = arg;
    struct oseq *s = ocur;

    j->task_rc = j->abandon ? ferry_to_thread_abandon(s->pool, job_fn, j, job_cleanup)
                            : ferry_to_thread(s->pool, job_fn, j);
    j->task_done = true;
    return 0;
}

/* ---- the model --------------------------------------------------------- */

static void m_task_ends(struct ojob *j, int rc)
{
    j->mtask_done = true;
    j->mrc = rc;
}

/* Start queued jobs while a thread is free (FIFO). */
static void m_start(struct oseq *s)
{
    while (s->mrunning < s->threads && s->mqn) {
        struct ojob *j = &s->j[s->mqueue[s->mqh]];
        s->mqh = (s->mqh + 1) % MAXJ;
        s->mqn--;
        j->mst = MJ_RUNNING;
        j->mstarted = true;
        s->mrunning++;
    }
}

static void m_submit(struct oseq *s, int id)
{
    s->j[id].mst = MJ_QUEUED;
    s->mqueue[(s->mqh + s->mqn) % MAXJ] = id;
    s->mqn++;
    m_start(s);
}

static void m_release(struct oseq *s, int id)
{
    struct ojob *j = &s->j[id];

    j->mst = MJ_DONE;
    s->mrunning--;
    s->mcompleted++;
    if (j->mabandoned) {
        s->mabandoned--;
        j->mcleanups++;          /* the late status goes to cleanup */
    } else {
        m_task_ends(j, j->status);
    }
    m_start(s);
}

static void m_cancel(struct oseq *s, int id)
{
    struct ojob *j = &s->j[id];

    if (j->mst == MJ_QUEUED) {
        /* Removed from the queue: never runs. */
        int k, n = 0, q[MAXJ];
        for (k = 0; k < s->mqn; k++) {
            int x = s->mqueue[(s->mqh + k) % MAXJ];
            if (x != id)
                q[n++] = x;
        }
        s->mqh = 0;
        s->mqn = n;
        memcpy(s->mqueue, q, sizeof(int) * (size_t)n);
        j->mst = MJ_CANCELLED;
        s->mcancelled++;
        if (j->abandon)
            j->mcleanups++;      /* abandon variant: cleanup gets arg at once */
        m_task_ends(j, -ECANCELED);
    } else if (j->mst == MJ_RUNNING && j->abandon && !j->mabandoned) {
        j->mabandoned = true;
        s->mabandoned++;
        m_task_ends(j, -ECANCELED);
    }
    /* Running, plain to_thread: the call keeps waiting for fn. */
}

/* ---- comparing ---------------------------------------------------------- */

/* Empty if the real side matches the model, else what differs. */
static bool differs(struct oseq *s, char *why, size_t n)
{
    ferry_pool_stats st;
    int i;

    for (i = 0; i < s->nj; i++) {
        struct ojob *j = &s->j[i];
        if ((atomic_load(&j->started) != 0) != j->mstarted) {
            snprintf(why, n, "job %d: started %d, model %d", i, atomic_load(&j->started),
                     j->mstarted);
            return true;
        }
        if (j->task_done != j->mtask_done) {
            snprintf(why, n, "job %d: waiter returned %d (rc %d), model %d (rc %d)", i,
                     j->task_done, j->task_rc, j->mtask_done, j->mrc);
            return true;
        }
        if (atomic_load(&j->cleanups) != j->mcleanups) {
            snprintf(why, n, "job %d: cleanup ran %d times, model %d", i,
                     atomic_load(&j->cleanups), j->mcleanups);
            return true;
        }
    }
    if (ferry_pool_stats_get(s->pool, &st) != 0) {
        snprintf(why, n, "pool stats failed");
        return true;
    }
    if (st.queued != (size_t)s->mqn || st.running != s->mrunning ||
        st.abandoned != s->mabandoned || st.completed != s->mcompleted ||
        st.cancelled != s->mcancelled) {
        snprintf(why, n, "pool stats queued %zu running %zu abandoned %zu completed %llu "
                 "cancelled %llu; model %d %u %u %llu %llu", st.queued, st.running,
                 st.abandoned, (unsigned long long)st.completed,
                 (unsigned long long)st.cancelled, s->mqn, s->mrunning, s->mabandoned,
                 (unsigned long long)s->mcompleted, (unsigned long long)s->mcancelled);
        return true;
    }
    return false;
}

/* Wait until the real side matches the model (a watchdog, not a timing
 * check), then check the values and the invariants.  What does not settle
 * in 10 s may never: a task or a pool thread may wait for good, so the
 * sequence is marked stuck and the run stops there (ferry-model). */
static void settle(struct oseq *s)
{
    int64_t give_up = ferry_now() + FERRY_SEC(10);
    char why[256];
    int i;

    if (s->stuck)
        return;
    while (differs(s, why, sizeof why)) {
        if (ferry_now() > give_up) {
            ofail(s, "did not settle: %s", why);
            s->stuck = true;
            return;
        }
        ferry_sleep(FERRY_USEC(20));
    }
    for (i = 0; i < s->nj; i++) {
        struct ojob *j = &s->j[i];
        if (j->task_done && j->task_rc != j->mrc)
            ofail(s, "job %d: waiter got %d, model %d", i, j->task_rc, j->mrc);
        if (atomic_load(&j->runs) > 1)
            ofail(s, "job %d ran %d times", i, atomic_load(&j->runs));
        if (j->mcleanups && atomic_load(&j->cleanup_status) !=
                                (j->mst == MJ_CANCELLED ? -ECANCELED : j->status))
            ofail(s, "job %d: cleanup got %d, fn returned %d", i,
                  atomic_load(&j->cleanup_status), j->status);
    }
    if ((unsigned)atomic_load(&max_inflight) > s->threads)
        ofail(s, "%d jobs ran at once in a pool of %u", atomic_load(&max_inflight), s->threads);
}

/* ---- operations ---------------------------------------------------------- */

/* The n-th (mod count) job in state `st`, or -1. */
static int pick(struct oseq *s, int sel, bool (*pred)(const struct ojob *))
{
    int c = 0, i;

    for (i = 0; i < s->nj; i++)
        c += pred(&s->j[i]);
    if (!c)
        return -1;
    sel %= c;
    for (i = 0; i < s->nj; i++)
        if (pred(&s->j[i]) && sel-- == 0)
            return i;
    return -1;
}

static bool p_running(const struct ojob *j) { return j->mst == MJ_RUNNING; }
static bool p_waiting(const struct ojob *j) { return !j->mtask_done; }

static void op_submit(struct oseq *s, bool abandon, int status)
{
    struct ojob *j = &s->j[s->nj];
    int id = s->nj++;

    j->abandon = abandon;
    j->status = status;
    n_submit[abandon]++;
    if (ferry_task_spawn(&j->task, s->loop, waiter_main, j, NULL) != 0) {
        ofail(s, "spawn failed");
        return;
    }
    if (s->trace)
        fprintf(s->trace, "op %d: submit job %d (%s, status %d)\n", s->opi, id,
                abandon ? "abandon" : "to_thread", status);
    m_submit(s, id);
}

static void op_release(struct oseq *s, int id)
{
    if (s->trace)
        fprintf(s->trace, "op %d: release job %d\n", s->opi, id);
    s->j[id].released = true;
    n_release++;
    /* The self-test of the stop: the first job released is not let go. */
    if (s->selftest && n_release_seq++ == 0)
        ;
    else
        sem_post(&s->j[id].go);
    m_release(s, id);
}

static void op_cancel(struct oseq *s, int id)
{
    if (s->trace)
        fprintf(s->trace, "op %d: cancel the waiter of job %d (model state %d)\n", s->opi, id,
                s->j[id].mst);
    if (s->j[id].mst == MJ_QUEUED)
        n_cancel_queued++;
    else if (s->j[id].mst == MJ_RUNNING)
        n_cancel_running[s->j[id].abandon]++;
    ferry_task_cancel(s->j[id].task);
    m_cancel(s, id);
}

/* Release everything; every job still queued runs and ends; then check
 * the accounting of each job. */
static void teardown(struct oseq *s)
{
    int i;

    s->opi = -1;
    if (s->stuck) {
        /* Let every job go, but wait for no task: one may never end. */
        for (i = 0; i < s->nj; i++)
            if (!s->j[i].released) {
                sem_post(&s->j[i].go);
                s->j[i].released = true;
            }
        return;
    }
    while (!s->failed) {
        int id = pick(s, 0, p_running);
        if (id < 0)
            break;
        op_release(s, id);
        settle(s);
    }
    for (i = 0; i < s->nj; i++) {
        struct ojob *j = &s->j[i];
        if (!j->released && !s->failed && j->mst != MJ_CANCELLED)
            ofail(s, "job %d neither released nor cancelled at the end", i);
        if (!j->released) {
            sem_post(&j->go);              /* never strand a pool thread */
            j->released = true;
        }
    }
    for (i = 0; i < s->nj; i++) {
        struct ojob *j = &s->j[i];
        int runs = atomic_load(&j->runs);
        if (j->task)
            ferry_task_join(j->task, NULL);
        if (s->failed)
            continue;
        /* Ran exactly once, or never ran and its waiter got -ECANCELED. */
        if (runs == 1) {
            int want = j->mabandoned ? -ECANCELED : j->status;
            if (j->task_rc != want)
                ofail(s, "job %d ran; waiter got %d, want %d", i, j->task_rc, want);
            if (atomic_load(&j->cleanups) != (j->mabandoned ? 1 : 0))
                ofail(s, "job %d: cleanup ran %d times", i, atomic_load(&j->cleanups));
        } else if (runs == 0) {
            if (j->task_rc != -ECANCELED)
                ofail(s, "job %d never ran; waiter got %d", i, j->task_rc);
            if (atomic_load(&j->cleanups) != (j->abandon ? 1 : 0))
                ofail(s, "job %d never ran; cleanup ran %d times", i,
                      atomic_load(&j->cleanups));
        } else {
            ofail(s, "job %d ran %d times", i, runs);
        }
    }
}

struct orun { struct oseq *s; const uint8_t *bytes; size_t len; };

static int offload_driver(void *arg)
{
    struct orun *r = arg;
    struct oseq *s = r->s;
    size_t pos;

    for (pos = MODEL_HDR_BYTES; pos + MODEL_OP_BYTES <= r->len && !s->failed;
         pos += MODEL_OP_BYTES) {
        const uint8_t *o = r->bytes + pos;
        unsigned k = o[0] % 100;
        int id;

        s->rep->ops_run++;
        if (k < 35 && s->nj < MAXJ) {
            op_submit(s, o[1] & 1, o[2] % 101);
        } else if (k < 70) {
            if ((id = pick(s, o[1], p_running)) >= 0)
                op_release(s, id);
        } else if (k < 90) {
            if ((id = pick(s, o[1], p_waiting)) >= 0)
                op_cancel(s, id);
        } else {
            for (int i = 0; i < 1 + o[1] % 4; i++)
                ferry_yield();
        }
        settle(s);
        s->opi++;
    }
    teardown(s);
    /* Return from ferry_loop_run() even if some task never ends. */
    ferry_loop_stop(s->loop);
    return 0;
}

int model_offload_check_bytes(ferry_loop *loop, const uint8_t *bytes, size_t len,
                              FILE *trace, model_report *rep)
{
    static struct oseq seq;
    struct oseq *s = &seq;
    struct orun r = { s, bytes, len };
    ferry_task *drv;
    int i, rc;

    memset(rep, 0, sizeof *rep);
    memset(s, 0, sizeof *s);
    s->loop = loop;
    s->trace = trace;
    s->rep = rep;
    s->threads = 1 + (len > 1 ? bytes[1] % 3 : 0);
    s->selftest = getenv("FERRY_MODEL_SELFTEST") &&
                  !strcmp(getenv("FERRY_MODEL_SELFTEST"), "stuck");
    n_release_seq = 0;
    atomic_store(&inflight, 0);
    atomic_store(&max_inflight, 0);
    for (i = 0; i < MAXJ; i++)
        sem_init(&s->j[i].go, 0, 0);
    if (ferry_pool_new(&s->pool, &(ferry_pool_opts){ .threads = s->threads,
                                                     .capacity = 64 }) != 0) {
        snprintf(rep->msg, sizeof rep->msg, "cannot make a pool");
        rep->failed = 1;
        return 1;
    }
    if (trace)
        fprintf(trace, "offload: pool of %u threads\n", s->threads);
    ocur = s;
    rc = ferry_task_spawn(&drv, loop, offload_driver, &r, &(ferry_task_opts){ .name = "driver" });
    if (rc == 0) {
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
        if (ferry_task_try_join(drv, NULL) != 0)
            ofail(s, "the driver did not finish");
    } else {
        ofail(s, "cannot spawn the driver: %d", rc);
    }
    rep->stuck = s->stuck;
    if (s->stuck && nstuck_pools < sizeof stuck_pools / sizeof stuck_pools[0]) {
        /* A pool thread may wait in a job for good: neither free the pool
         * (that joins its threads) nor destroy the semaphores. */
        stuck_pools[nstuck_pools++] = s->pool;
        ocur = NULL;
        return 1;
    }
    ferry_pool_free(s->pool);
    for (i = 0; i < MAXJ; i++)
        sem_destroy(&s->j[i].go);
    ocur = NULL;
    return s->failed ? 1 : 0;
}

void model_offload_stats_print(FILE *out)
{
    fprintf(out, "model (offload): submitted %lu to_thread + %lu abandon, released %lu, "
            "cancelled %lu queued, %lu running (to_thread), %lu running (abandon)\n",
            n_submit[0], n_submit[1], n_release, n_cancel_queued, n_cancel_running[0],
            n_cancel_running[1]);
}
