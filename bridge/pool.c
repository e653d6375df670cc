/* pool.c - thread pools: to_thread for tasks, submit for plain threads.
 *
 * A pool is a fixed set of threads and a bounded FIFO of jobs under one
 * mutex.  A task's job lives on the task's stack (ferry_to_thread
 * allocates nothing); its completion goes back through the loop's inbox as
 * a completion node inside the job, which cannot fail.  A task that waits
 * for queue room waits on a node of its own in `roomq`.
 *
 * Job states (under mu): QUEUED (in `queue`) -> RUNNING (a worker took it)
 * -> FINISHED (fn returned, or the pool was freed while it was queued; the
 * completion is posted).  A task interrupted while its job is QUEUED
 * removes it: it never runs.  RUNNING: the task waits, shielded, or (abandon
 * variant, heap job) marks it abandoned and leaves; the worker then runs
 * the cleanup and frees it.  FINISHED: the completion is on its way; the
 * task waits for it (ferry__xwake_settle) so the worker's write into the
 * task's stack has landed before the frame goes away.
 *
 * The pool memory is reference-counted: its creator, every to_thread call
 * in progress and every submitted job whose completion has not run yet
 * hold one, so nothing touches a freed pool after ferry_pool_free().
 *
 * Lock order: pool.mu -> inbox.mu (bridge_int.h).  Callbacks (fn, done,
 * cleanup) always run with no lock held.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "bridge_int.h"

enum { JOB_QUEUED = 1, JOB_RUNNING, JOB_FINISHED };
enum { KIND_TASK = 1, KIND_SUBMIT };

struct job {
    struct ferry__link  link;      /* mu: in pool->queue while QUEUED */
    ferry_job_fn        fn;        /* the blocking call */
    void               *arg;       /* its argument (the caller's) */
    int                 kind;      /* KIND_TASK or KIND_SUBMIT */
    int                 state;     /* mu: JOB_* */
    int                 status;    /* fn's status; written before the completion is posted */
    bool                heap;      /* allocated by ferry (abandon variant, submit) */
    bool                abandoned; /* mu: the task left; the worker cleans up */
    ferry_job_cleanup   cleanup;   /* abandon variant: receives the late status */
    struct ferry__xwake xw;        /* KIND_TASK: wakes the waiting task */
    struct ferry__cnode cn;        /* KIND_SUBMIT with a loop: runs `done` there */
    struct ferry_inbox *ib;        /* KIND_SUBMIT: the loop's inbox, or NULL */
    ferry_job_done      done;      /* KIND_SUBMIT: completion callback, or NULL */
    void               *done_arg;  /* its argument */
    struct ferry_pool  *pool;      /* KIND_SUBMIT: holds a pool reference */
};

/* A task waiting for room in the queue. */
struct room_waiter {
    struct ferry__link  link;      /* mu: in pool->roomq until woken */
    struct ferry__xwake xw;        /* the waiting task */
};

struct ferry_pool {
    pthread_mutex_t     mu;        /* guards the fields marked "mu" */
    pthread_cond_t      work;      /* idle workers wait here */
    pthread_cond_t      room;      /* threads in ferry_pool_submit wait for room */
    struct ferry__link  queue;     /* mu: struct job, FIFO */
    struct ferry__link  roomq;     /* mu: struct room_waiter, FIFO */
    size_t              nqueued;   /* mu: jobs in queue */
    size_t              capacity;  /* set once */
    unsigned            nthreads;  /* set once: threads started */
    unsigned            nidle;     /* mu: workers waiting on `work` */
    unsigned            nblocked;  /* mu: workers blocked calling into a loop */
    unsigned            room_threads; /* mu: threads waiting on `room` */
    size_t              running;   /* mu: jobs running, abandoned ones included */
    size_t              nabandoned;/* mu: of those, abandoned */
    uint64_t            completed; /* mu */
    uint64_t            cancelled; /* mu */
    atomic_ulong        callback_errors; /* completions that returned non-zero */
    bool                stopping;  /* mu: ferry_pool_free() began */
    bool                spinner;   /* mu: a worker spins for work, not yet claimed by a job */
    atomic_size_t       qhint;     /* nqueued, published for the spinner */
    atomic_uint         refs;      /* creator + calls in progress + pending completions */
    pthread_t          *threads;   /* set once */
};

/* The pool whose worker is the calling thread, or NULL. */
static _Thread_local struct ferry_pool *tls_pool;

static pthread_mutex_t default_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ferry_pool *_Atomic default_pool;

/* ==== any thread ======================================================= */

static void pool_ref(struct ferry_pool *p)
{
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}

static void pool_unref(struct ferry_pool *p)
{
    if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->room);
    pthread_mutex_destroy(&p->mu);
    ferry__free(p->threads);
    ferry__free(p);
}

/* A slot of the queue freed up: wake one thread and one task waiting for
 * room.  Requires mu.  A woken waiter that does not use the room passes
 * the wake on by calling this again. */
static void room_kick_locked(struct ferry_pool *p)
{
    struct ferry__link *l;

    if (p->room_threads)
        pthread_cond_signal(&p->room);
    if ((l = ferry__list_pop_front(&p->roomq)) != NULL) {
        struct room_waiter *rw = ferry__container_of(l, struct room_waiter, link);
        ferry__xwake_fire(&rw->xw, 0);
    }
}

/* Runs on the loop: the completion of a submitted job. */
static void submit_done_on_loop(struct ferry__cnode *n)
{
    struct job *j = ferry__container_of(n, struct job, cn);
    struct ferry_pool *p = j->pool;
    int rc = j->done ? j->done(j->done_arg, j->status) : 0;

    if (rc) {
        atomic_fetch_add(&p->callback_errors, 1);
        ferry__log(FERRY_LOG_WARN, "pool: a job's completion callback failed (%d); "
                   "later jobs are not affected", rc);
    }
    ferry__free(j);
    pool_unref(p);
}

/* Deliver a job's end (fn's status, or -ECANCELED).  No lock held.  After
 * this the job may be gone (a task's stack frame). */
static void finish(struct job *j, int status)
{
    j->status = status;
    if (j->kind == KIND_TASK) {
        ferry__xwake_fire(&j->xw, status);
        return;
    }
    if (j->ib) {
        j->cn.fn = submit_done_on_loop;
        ferry__inbox_complete_reserved(j->ib, &j->cn);
        return;
    }
    {
        struct ferry_pool *p = j->pool;
        int rc = j->done ? j->done(j->done_arg, status) : 0;
        if (rc) {
            atomic_fetch_add(&p->callback_errors, 1);
            ferry__log(FERRY_LOG_WARN, "pool: a job's completion callback failed (%d); "
                       "later jobs are not affected", rc);
        }
        ferry__free(j);
        pool_unref(p);
    }
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *worker_main(void *arg)
{
    struct ferry_pool *p = arg;
    struct ferry__link *l;
    struct job *j;
    bool spun = false;
    int status;

    tls_pool = p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while ((l = ferry__list_pop_front(&p->queue)) == NULL) {
            if (p->stopping)
                goto out;
            if (!p->spinner && !spun) {
                /* One worker polls briefly before sleeping: a task that
                 * resubmits right after its completion then costs no
                 * futex wake.  Bounded (about 50 us). */
                p->spinner = true;
                pthread_mutex_unlock(&p->mu);
                for (int i = 0; i < 2000 && !atomic_load_explicit(&p->qhint, memory_order_relaxed); i++)
                    cpu_relax();
                pthread_mutex_lock(&p->mu);
                p->spinner = false;
                spun = true;
                continue;
            }
            p->nidle++;
            pthread_cond_wait(&p->work, &p->mu);
            p->nidle--;
        }
        spun = false;
        j = ferry__container_of(l, struct job, link);
        p->nqueued--;
        atomic_store_explicit(&p->qhint, p->nqueued, memory_order_relaxed);
        p->running++;
        j->state = JOB_RUNNING;
        room_kick_locked(p);
        pthread_mutex_unlock(&p->mu);

        status = j->fn(j->arg);

        pthread_mutex_lock(&p->mu);
        p->running--;
        p->completed++;
        if (j->abandoned) {
            p->nabandoned--;
            pthread_mutex_unlock(&p->mu);
            if (j->cleanup)
                j->cleanup(j->arg, status);
            ferry__free(j);
        } else {
            j->state = JOB_FINISHED;
            pthread_mutex_unlock(&p->mu);
            finish(j, status);
        }
        pthread_mutex_lock(&p->mu);
    }
out:
    pthread_mutex_unlock(&p->mu);
    tls_pool = NULL;
    return NULL;
}

static unsigned default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned dflt = n > 4 ? (unsigned)n : 4;

    return ferry__env_unsigned("FERRY_POOL_SIZE", dflt);
}

/* Stop and join the first `n` threads of a pool being torn down. */
static void stop_threads(struct ferry_pool *p, unsigned n)
{
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < n; i++)
        pthread_join(p->threads[i], NULL);
}

int ferry_pool_new(ferry_pool **out, const ferry_pool_opts *opts)
{
    ferry_pool_opts o = {0};
    struct ferry_pool *p;
    pthread_attr_t attr;
    unsigned i;
    int rc = -ENOMEM;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (opts)
        o = *opts;
    if (o.threads > 4096)
        return -EINVAL;
    ferry__threads_init();
    p = ferry__calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->nthreads = o.threads ? o.threads : default_threads();
    p->capacity = o.capacity ? o.capacity : 4096;
    atomic_init(&p->refs, 1);
    atomic_init(&p->callback_errors, 0);
    atomic_init(&p->qhint, 0);
    p->threads = ferry__calloc(p->nthreads, sizeof *p->threads);
    if (!p->threads)
        goto err_free;
    if (pthread_mutex_init(&p->mu, NULL))
        goto err_free;
    if (ferry__cond_init(&p->room))
        goto err_mutex;
    if (pthread_cond_init(&p->work, NULL))
        goto err_room;
    if (pthread_attr_init(&attr))
        goto err_work;
    if (o.stack_size && pthread_attr_setstacksize(&attr, o.stack_size)) {
        rc = -EINVAL;
        goto err_attr;
    }
    for (i = 0; i < p->nthreads; i++) {
        if (ferry__fault_point("pthread_create") ||
            pthread_create(&p->threads[i], &attr, worker_main, p) != 0) {
            stop_threads(p, i);
            goto err_attr;
        }
    }
    pthread_attr_destroy(&attr);
    *out = p;
    return 0;

err_attr:
    pthread_attr_destroy(&attr);
err_work:
    pthread_cond_destroy(&p->work);
err_room:
    pthread_cond_destroy(&p->room);
err_mutex:
    pthread_mutex_destroy(&p->mu);
err_free:
    ferry__free(p->threads);
    ferry__free(p);
    return rc;
}

void ferry_pool_free(ferry_pool *p)
{
    struct ferry__link dropped = {0}, *l;

    if (!p || p == atomic_load(&default_pool) || p == tls_pool)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    /* Queued jobs never run: each is completed with -ECANCELED. */
    while ((l = ferry__list_pop_front(&p->queue)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        p->nqueued--;
        p->cancelled++;
        j->state = JOB_FINISHED;
        ferry__list_push_back(&dropped, &j->link);
    }
    /* Tasks waiting for room: refused. */
    while ((l = ferry__list_pop_front(&p->roomq)) != NULL) {
        struct room_waiter *rw = ferry__container_of(l, struct room_waiter, link);
        ferry__xwake_fire(&rw->xw, -ESHUTDOWN);
    }
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->mu);
    while ((l = ferry__list_pop_front(&dropped)) != NULL)
        finish(ferry__container_of(l, struct job, link), -ECANCELED);
    /* Running jobs (abandoned ones too) end; then the threads exit. */
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pool_unref(p);
}

ferry_pool *ferry_pool_default(void)
{
    struct ferry_pool *p = atomic_load_explicit(&default_pool, memory_order_acquire);

    if (p)
        return p;
    pthread_mutex_lock(&default_mu);
    p = atomic_load_explicit(&default_pool, memory_order_relaxed);
    if (!p && ferry_pool_new(&p, NULL) == 0)
        atomic_store_explicit(&default_pool, p, memory_order_release);
    pthread_mutex_unlock(&default_mu);
    return p;
}

int ferry_pool_stats_get(ferry_pool *p, ferry_pool_stats *out)
{
    if (!out)
        return -EINVAL;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    pthread_mutex_lock(&p->mu);
    out->threads = p->nthreads;
    out->capacity = p->capacity;
    out->queued = p->nqueued;
    out->running = p->running;
    out->abandoned = p->nabandoned;
    out->completed = p->completed;
    out->cancelled = p->cancelled;
    pthread_mutex_unlock(&p->mu);
    out->callback_errors = atomic_load(&p->callback_errors);
    return 0;
}

/* Queue a job.  Requires mu; checked for room and state by the caller. */
static void enqueue_locked(struct ferry_pool *p, struct job *j)
{
    j->state = JOB_QUEUED;
    j->abandoned = false;
    ferry__list_push_back(&p->queue, &j->link);
    p->nqueued++;
    atomic_store_explicit(&p->qhint, p->nqueued, memory_order_relaxed);
    /* A spinning worker takes this job: claim it, so that the next job
     * signals a sleeping worker instead of counting on the same spinner. */
    if (p->spinner)
        p->spinner = false;
    else if (p->nidle)
        pthread_cond_signal(&p->work);
}

/* Requires mu: why a job could not be queued now, or 0. */
static int refuse_locked(struct ferry_pool *p)
{
    if (p->stopping)
        return -ESHUTDOWN;
    if (p->nblocked >= p->nthreads)
        return -EDEADLK;
    return 0;
}

int ferry_pool_submit(ferry_pool *p, ferry_job_fn fn, void *arg,
                      ferry_loop *loop, ferry_job_done done, void *done_arg)
{
    struct ferry_inbox *ib = NULL;
    struct job *j;
    int rc;

    if (!fn)
        return -EINVAL;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    if (loop && !(ib = ferry__inbox_of(loop)))
        return -ESHUTDOWN;
    j = ferry__calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    j->kind = KIND_SUBMIT;
    j->heap = true;
    j->fn = fn;
    j->arg = arg;
    j->ib = ib;
    j->done = done;
    j->done_arg = done_arg;
    j->pool = p;
    if (ib && (rc = ferry__inbox_reserve(ib)) != 0) {
        ferry__free(j);
        return rc;
    }
    pool_ref(p);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        rc = refuse_locked(p);
        if (rc || p->nqueued < p->capacity)
            break;
        if (ferry_loop_current()) {
            rc = -EAGAIN;    /* blocking would stall a loop */
            break;
        }
        p->room_threads++;
        pthread_cond_wait(&p->room, &p->mu);
        p->room_threads--;
    }
    if (!rc)
        enqueue_locked(p, j);
    else if (p->nqueued < p->capacity && p->room_threads)
        pthread_cond_signal(&p->room);   /* pass a wake we may have taken on */
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        if (ib)
            ferry__inbox_unreserve(ib);
        ferry__free(j);
        pool_unref(p);
    }
    return rc;
}

/* ==== loop thread (tasks) ============================================== */

/* Wait in a task until the queue has room.  Requires mu; returns with mu
 * held.  Returns 0 (room now) or why not. */
static int wait_room_locked(struct ferry_pool *p)
{
    struct room_waiter rw;
    bool fired;
    int rc;

    for (;;) {
        rc = refuse_locked(p);
        if (rc || p->nqueued < p->capacity)
            return rc;
        rc = ferry__xwake_init(&rw.xw, "pool room", p);
        if (rc)
            return rc;
        ferry__link_init(&rw.link);
        ferry__list_push_back(&p->roomq, &rw.link);
        pthread_mutex_unlock(&p->mu);
        rc = ferry__xwake_wait(&rw.xw);
        pthread_mutex_lock(&p->mu);
        fired = !ferry__link_linked(&rw.link);
        if (!fired) {
            ferry__list_remove(&rw.link);
        } else if (!rw.xw.delivered) {
            pthread_mutex_unlock(&p->mu);
            ferry__xwake_settle(&rw.xw);
            pthread_mutex_lock(&p->mu);
        }
        if (rc == -ECANCELED || rc == -ETIMEDOUT) {
            if (fired && p->nqueued < p->capacity)
                room_kick_locked(p);   /* pass the unused wake on */
            return rc;
        }
    }
}

static int offload(struct ferry_pool *p, struct job *j, bool *abandoned)
{
    int rc;

    *abandoned = false;
    rc = ferry__xwake_init(&j->xw, "to_thread", p);
    if (rc)
        return rc;
    ferry__link_init(&j->link);
    pthread_mutex_lock(&p->mu);
    rc = wait_room_locked(p);
    if (rc) {
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    enqueue_locked(p, j);
    pthread_mutex_unlock(&p->mu);

    rc = ferry__xwake_wait(&j->xw);
    if (j->xw.delivered)
        return j->xw.result;          /* fn's status, or -ECANCELED (pool freed) */
    /* Interrupted: cancelled or a deadline passed. */
    pthread_mutex_lock(&p->mu);
    if (j->state == JOB_QUEUED) {
        ferry__list_remove(&j->link);
        p->nqueued--;
        p->cancelled++;
        room_kick_locked(p);
        pthread_mutex_unlock(&p->mu);
        return rc;                    /* never ran */
    }
    if (j->state == JOB_RUNNING && j->heap) {
        j->abandoned = true;
        *abandoned = true;
        p->nabandoned++;
        pthread_mutex_unlock(&p->mu);
        return rc;                    /* the worker cleans up and frees j */
    }
    pthread_mutex_unlock(&p->mu);
    ferry__xwake_settle(&j->xw);      /* running (waited for) or finished */
    return j->xw.result;
}

int ferry_to_thread(ferry_pool *p, ferry_job_fn fn, void *arg)
{
    struct job j = {0};
    bool abandoned;
    int rc;

    if (!fn)
        return -EINVAL;
    if (!ferry_task_current())
        return -EPERM;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    j.kind = KIND_TASK;
    j.fn = fn;
    j.arg = arg;
    pool_ref(p);
    rc = offload(p, &j, &abandoned);
    pool_unref(p);
    return rc;
}

int ferry_to_thread_abandon(ferry_pool *p, ferry_job_fn fn, void *arg,
                            ferry_job_cleanup cleanup)
{
    struct job *j;
    bool abandoned;
    int rc;

    if (!fn)
        return -EINVAL;
    if (!ferry_task_current())
        return -EPERM;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    j = ferry__calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    j->kind = KIND_TASK;
    j->heap = true;
    j->fn = fn;
    j->arg = arg;
    j->cleanup = cleanup;
    pool_ref(p);
    rc = offload(p, j, &abandoned);
    if (!abandoned)
        ferry__free(j);
    pool_unref(p);
    return rc;
}

/* ==== pool threads calling into loops ================================== */

void ferry__pool_block_enter(void)
{
    struct ferry_pool *p = tls_pool;
    struct ferry__link dropped = {0}, *l;
    size_t stuck = 0;

    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->nblocked++;
    if (p->nblocked >= p->nthreads) {
        /* No thread is left to start a queued job until a loop call
         * returns, and that call may be waiting for one of them (Trio
         * #810): fail them with a clear error instead of hanging. */
        while ((l = ferry__list_pop_front(&p->queue)) != NULL) {
            struct job *j = ferry__container_of(l, struct job, link);
            p->nqueued--;
            p->cancelled++;
            j->state = JOB_FINISHED;
            ferry__list_push_back(&dropped, &j->link);
            stuck++;
        }
        atomic_store_explicit(&p->qhint, 0, memory_order_relaxed);
        if (stuck)
            room_kick_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
    while ((l = ferry__list_pop_front(&dropped)) != NULL)
        finish(ferry__container_of(l, struct job, link), -EDEADLK);
    if (stuck)
        ferry__log(FERRY_LOG_WARN, "pool: all %u threads wait on a loop; %zu queued "
                   "job(s) failed with -EDEADLK", p->nthreads, stuck);
}

void ferry__pool_block_exit(void)
{
    struct ferry_pool *p = tls_pool;

    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->nblocked--;
    pthread_mutex_unlock(&p->mu);
}
