/* pool.c - the pool object: making and freeing a pool, the default pool,
 * its statistics, and ferry_pool_submit() from any thread.
 * Any thread.
 *
 * pool_int.h has the map of the pool's files and the rules they share.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "pool_int.h"

static pthread_mutex_t default_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ferry_pool *_Atomic default_pool;

void ferry__pool_unref(struct ferry_pool *p)
{
    if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&p->gone);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->check);
    pthread_cond_destroy(&p->room);
    pthread_mutex_destroy(&p->mu);
    ferry__free(p->threads);
    ferry__free(p);
}

/* A slot of the queue freed up: move waiting task jobs in, then wake one
 * thread and one task waiting for room if room is left.  Requires mu.  A
 * woken waiter that does not use the room passes the wake on by calling
 * this again. */
void ferry__pool_room_kick_locked(struct ferry_pool *p)
{
    struct ferry__link *l;

    while (p->nqueued < p->capacity && (l = ferry__list_pop_front(&p->overq)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        ferry__pool_queue_locked(p, j, ferry__pool_ticks());
    }
    if (p->nqueued >= p->capacity)
        return;
    if (p->room_threads)
        pthread_cond_signal(&p->room);
    if ((l = ferry__list_pop_front(&p->roomq)) != NULL) {
        struct room_waiter *rw = ferry__container_of(l, struct room_waiter, link);
        ferry__task_wake_fire(&rw->tw, 0);
    }
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
    pthread_cond_broadcast(&p->check);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < n; i++)
        pthread_join(p->threads[i], NULL);
}

/*
 * The pool's mutex.  Its holders keep it for a few dozen instructions, a
 * worker once per job and a loop once per batch, so on more than one CPU
 * it spins briefly before it sleeps (glibc's adaptive type): a plain mutex
 * sleeps at the first contention, and the unlock then pays a futex wake.
 */
static int pool_mutex_init(pthread_mutex_t *mu, bool spin)
{
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_t a;
    int rc;

    if (spin) {
        if (pthread_mutexattr_init(&a))
            return -1;
        rc = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
        if (rc == 0)
            rc = pthread_mutex_init(mu, &a);
        pthread_mutexattr_destroy(&a);
        return rc;
    }
#else
    (void)spin;
#endif
    return pthread_mutex_init(mu, NULL);
}

int ferry_pool_new(ferry_pool **out, const ferry_pool_opts *opts)
{
    ferry_pool_opts o = { 0 };
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
    p = ferry__calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->nthreads = o.threads ? o.threads : default_threads();
    p->capacity = o.capacity ? o.capacity : 4096;
    ferry__pool_policy_init(p);
    atomic_init(&p->refs, 1);
    atomic_init(&p->callback_errors, 0);
    /* The threads, then a flag per thread: one allocation. */
    p->threads = ferry__calloc(p->nthreads, sizeof *p->threads + sizeof *p->exited);
    if (!p->threads)
        goto err_free;
    p->exited = (bool *)(p->threads + p->nthreads);
    if (pool_mutex_init(&p->mu, p->wake.multicpu))
        goto err_free;
    if (ferry__cond_init(&p->room))
        goto err_mutex;
    if (pthread_cond_init(&p->work, NULL))
        goto err_room;
    if (ferry__cond_init(&p->check))
        goto err_work;
    if (pthread_cond_init(&p->gone, NULL))
        goto err_check;
    if (pthread_attr_init(&attr))
        goto err_gone;
    if (o.stack_size && pthread_attr_setstacksize(&attr, o.stack_size)) {
        rc = -EINVAL;
        goto err_attr;
    }
    for (i = 0; i < p->nthreads; i++) {
        if (ferry__fault_point("pthread_create") ||
            ferry__thread_create_nosig(&p->threads[i], &attr, ferry__pool_worker_main, p) != 0) {
            stop_threads(p, i);
            goto err_attr;
        }
        p->alive++; /* before the pool is anyone else's: no lock needed */
    }
    pthread_attr_destroy(&attr);
    *out = p;
    return 0;

err_attr:
    pthread_attr_destroy(&attr);
err_gone:
    pthread_cond_destroy(&p->gone);
err_check:
    pthread_cond_destroy(&p->check);
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

/* Take every job out of the queue and the overflow list, to be completed
 * with `status` (never run; the overflow ones with -ESHUTDOWN: they were
 * never queued).  Requires mu.  Returns how many. */
size_t ferry__pool_drop_queued_locked(struct ferry_pool *p, struct ferry__link *dropped, int status)
{
    struct ferry__link *l;
    size_t n = 0;

    while ((l = ferry__list_pop_front(&p->queue)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        p->nqueued--;
        p->cancelled++;
        j->state = JOB_FINISHED;
        j->dropped = true;
        j->status = status;
        ferry__list_push_back(dropped, &j->link);
        n++;
    }
    while ((l = ferry__list_pop_front(&p->overq)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        j->state = JOB_FINISHED;
        j->dropped = true;
        j->status = status == -ECANCELED ? -ESHUTDOWN : status;
        ferry__list_push_back(dropped, &j->link);
        n++;
    }
    ferry__pool_unqueued_locked(p);
    return n;
}

/* ferry_pool_free() of a pool the caller may free (not the default pool
 * while it is the default, not from one of its threads).  With `leave`,
 * each worker holds a reference from here on and detaches itself as it
 * leaves; the caller waits only until every worker not running an
 * abandoned job has left. */
static void pool_free(struct ferry_pool *p, bool leave)
{
    struct ferry__link dropped = { 0 }, *l;

    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    p->leave = leave;
    /* Queued jobs never run: each is completed with -ECANCELED. */
    ferry__pool_drop_queued_locked(p, &dropped, -ECANCELED);
    /* Tasks waiting for room: refused. */
    while ((l = ferry__list_pop_front(&p->roomq)) != NULL) {
        struct room_waiter *rw = ferry__container_of(l, struct room_waiter, link);
        ferry__task_wake_fire(&rw->tw, -ESHUTDOWN);
    }
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->check);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->mu);
    while ((l = ferry__list_pop_front(&dropped)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        ferry__pool_finish(j, j->status);
    }
    if (leave) {
        /* Wait until only the workers running abandoned jobs are left; join
         * the others.  The ones left finish their jobs, run the cleanups and
         * exit detached; a reference each keeps the memory until then. */
        pthread_mutex_lock(&p->mu);
        while (p->alive > p->nabandoned)
            pthread_cond_wait(&p->gone, &p->mu);
        p->released = true;
        atomic_fetch_add_explicit(&p->refs, p->alive, memory_order_relaxed);
        pthread_mutex_unlock(&p->mu);
        /* Set once under mu, read after it: these threads have left. */
        for (unsigned i = 0; i < p->nthreads; i++)
            if (p->exited[i])
                pthread_join(p->threads[i], NULL);
        ferry__pool_unref(p);
        return;
    }
    /* Running jobs (abandoned ones too) end; then the threads exit.  A
     * posted sink keeps the memory until its loop has run it. */
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    ferry__pool_unref(p);
}

void ferry_pool_free(ferry_pool *p)
{
    ferry_pool_free_ex(p, 0);
}

int ferry_pool_free_ex(ferry_pool *p, unsigned flags)
{
    if (flags & ~FERRY_POOL_FREE_LEAVE_ABANDONED)
        return -EINVAL;
    if (!p || p == atomic_load(&default_pool) || p == ferry__pool_tls)
        return 0;
    pool_free(p, flags & FERRY_POOL_FREE_LEAVE_ABANDONED);
    return 0;
}

/*
 * The default pool stops being the default under default_mu, so a caller
 * of ferry_pool_default() from now on starts a new one; then it is freed
 * as any pool is.  Callers must not hold its pointer across this call
 * (ferry/bridge.h says so).
 */
int ferry_pool_default_shutdown(unsigned flags)
{
    struct ferry_pool *p;

    if (flags & ~FERRY_POOL_FREE_LEAVE_ABANDONED)
        return -EINVAL;
    pthread_mutex_lock(&default_mu);
    p = atomic_load_explicit(&default_pool, memory_order_relaxed);
    if (p && p == ferry__pool_tls) {
        pthread_mutex_unlock(&default_mu);
        return -EDEADLK;
    }
    atomic_store_explicit(&default_pool, NULL, memory_order_release);
    pthread_mutex_unlock(&default_mu);
    if (!p)
        return 0;
    ferry__alloc_resident(-2);
    pool_free(p, flags & FERRY_POOL_FREE_LEAVE_ABANDONED);
    return 0;
}

ferry_pool *ferry_pool_default(void)
{
    struct ferry_pool *p = atomic_load_explicit(&default_pool, memory_order_acquire);

    if (p)
        return p;
    pthread_mutex_lock(&default_mu);
    p = atomic_load_explicit(&default_pool, memory_order_relaxed);
    if (!p && ferry_pool_new(&p, NULL) == 0) {
        /* Kept until ferry_pool_default_shutdown() (ferry_run() calls it),
         * or for the life of the process: its two allocations (the pool and
         * its thread array, which ferry__pool_unref() frees) are not a leak
         * of the loop that started it. */
        ferry__alloc_resident(2);
        atomic_store_explicit(&default_pool, p, memory_order_release);
    }
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
    out->stalled = p->stalled;
    pthread_mutex_unlock(&p->mu);
    out->callback_errors = atomic_load(&p->callback_errors);
    return 0;
}

/* Queue a heap job for a plain thread (ferry_pool_submit and its ticket
 * variant).  With `ticket`, the job starts with a second reference, the
 * ticket's, and the ticket holds a reference on the pool.  Returns 0 and
 * the job in *out, or an error with nothing queued. */
static int submit(ferry_pool *p, ferry_job_fn fn, void *arg, ferry_loop *loop, ferry_job_done done,
                  void *done_arg, bool ticket, struct job **out)
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
    j->sub.done = done;
    j->sub.done_arg = done_arg;
    j->sub.ticket = ticket;
    atomic_init(&j->sub.refs, ticket ? 2 : 1);
    j->pool = p;
    if (ib && (rc = ferry__inbox_reserve(ib)) != 0) {
        ferry__free(j);
        return rc;
    }
    ferry__pool_ref(p);
    if (ticket)
        ferry__pool_ref(p);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        rc = ferry__pool_refuse_locked(p);
        if (rc || (p->nqueued < p->capacity && ferry__list_empty(&p->overq)))
            break;
        if (ferry_loop_current()) {
            rc = -EAGAIN; /* blocking would stall a loop */
            break;
        }
        p->room_threads++;
        pthread_cond_wait(&p->room, &p->mu);
        p->room_threads--;
    }
    if (!rc)
        ferry__pool_enqueue_locked(p, j);
    else if (p->nqueued < p->capacity && p->room_threads)
        pthread_cond_signal(&p->room); /* pass a wake we may have taken on */
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        if (ib)
            ferry__inbox_unreserve(ib);
        ferry__free(j);
        ferry__pool_unref(p);
        if (ticket)
            ferry__pool_unref(p);
        return rc;
    }
    *out = j;
    return 0;
}

int ferry_pool_submit(ferry_pool *p, ferry_job_fn fn, void *arg, ferry_loop *loop,
                      ferry_job_done done, void *done_arg)
{
    struct job *j;

    return submit(p, fn, arg, loop, done, done_arg, false, &j);
}

/* ---- tickets ------------------------------------------------------------ */

/* A ticket is the submitted job itself: the job's memory stays until both
 * the ticket and the completion have let go of it (sub.refs), and the
 * ticket's reference on the pool keeps the mutex that guards the job's
 * state. */
int ferry_pool_submit_ticket(ferry_pool *p, ferry_job_fn fn, void *arg, ferry_loop *loop,
                             ferry_job_done done, void *done_arg, ferry_ticket **out)
{
    struct job *j;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = submit(p, fn, arg, loop, done, done_arg, true, &j);
    if (!rc)
        *out = (ferry_ticket *)j;
    return rc;
}

int ferry_ticket_withdraw(ferry_ticket *t)
{
    struct job *j = (struct job *)t;
    struct ferry_pool *p;
    int rc;

    if (!j)
        return -EINVAL;
    p = j->pool;
    pthread_mutex_lock(&p->mu);
    if (j->state == JOB_QUEUED) {
        /* Submitted jobs never wait in overq: their threads wait for room. */
        ferry__list_remove(&j->link);
        p->nqueued--;
        ferry__pool_unqueued_locked(p);
        p->cancelled++;
        j->state = JOB_FINISHED;
        j->dropped = true;
        ferry__pool_room_kick_locked(p);
        rc = 0;
    } else {
        rc = j->state == JOB_RUNNING ? -EBUSY : -EALREADY;
    }
    pthread_mutex_unlock(&p->mu);
    if (rc)
        return rc;
    /* What the completion would have let go of: the loop's reservation,
     * the job's reference on the pool, its own reference on the job (the
     * ticket's keeps it). */
    if (j->ib)
        ferry__inbox_unreserve(j->ib);
    atomic_fetch_sub_explicit(&j->sub.refs, 1, memory_order_acq_rel);
    ferry__pool_unref(p);
    return 0;
}

void ferry_ticket_free(ferry_ticket *t)
{
    struct job *j = (struct job *)t;
    struct ferry_pool *p;

    if (!j)
        return;
    p = j->pool;
    if (atomic_fetch_sub_explicit(&j->sub.refs, 1, memory_order_acq_rel) == 1)
        ferry__free(j);
    ferry__pool_unref(p);
}
