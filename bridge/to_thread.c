/* to_thread.c - the task side of the pools: ferry_to_thread(), its
 * abandon variant, and the hand-over of the jobs a turn offloaded.
 * Loop thread.
 *
 * pool_int.h has the map of the pool's files and the rules they share.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "pool_int.h"

/*
 * Jobs that tasks of one loop offloaded during the current turn, not yet
 * handed to their pools: a callback that runs after the turn
 * (ferry_call_soon) queues them all with one lock per pool.  One per loop,
 * in its inbox's extension room (ferry__inbox_ext(); all-zero is empty).
 * Loop thread only.
 */
struct loop_jobs {
    struct ferry__link jobs; /* struct job, FIFO */
    struct ferry_pool *pool; /* the pool of every job in `jobs`, or NULL if they
                                    * go to different pools */
    size_t n;                /* jobs in `jobs` */
    uint64_t gen;            /* hand-overs so far */
    uint64_t t;              /* when the first job came (ferry__pool_ticks()) */
    bool scheduled;          /* the flush callback is scheduled */
};

const size_t ferry__to_thread_room = sizeof(struct loop_jobs);

/* Append the nodes of the non-empty list `from` to the tail of `to` in
 * O(1); `from` is left as it was and must not be used as a list again. */
static void list_splice_tail(struct ferry__link *to, struct ferry__link *from)
{
    struct ferry__link *first = from->next, *last = from->prev;

    if (to->next == NULL)
        to->next = to->prev = to; /* a {0} head: link the sentinel */
    first->prev = to->prev;
    to->prev->next = first;
    last->next = to;
    to->prev = last;
}

/* The loop's list of jobs to hand over, in its inbox's extension room. */
static inline struct loop_jobs *jobs_of(struct ferry_inbox *ib)
{
    return ferry__inbox_ext(ib);
}

/* give_up for the loop's wait: the job has not been taken in time. */
static bool job_not_taken(void *arg, int64_t waited)
{
    struct ferry_pool *p = arg;

    return waited >= LSPIN_TAKE_NS && atomic_load_explicit(&p->wake.qhint, memory_order_relaxed);
}

/* A turn that offloads this many jobs hands them over at once, not at its
 * end: a worker that ran out of jobs meanwhile would go to sleep, and
 * waking it costs more than the lock taken here. */
#define HANDOVER_BATCH 64

/*
 * Hand the jobs that tasks of this loop offloaded during the last turn to
 * their pools: one lock and one wake decision per run of jobs for the same
 * pool.  A job that cannot be queued (pool stopping, every thread blocked)
 * completes at once with the reason; one that finds the queue full waits
 * for room in `overq`.  Then, if a spinning worker took the jobs and the
 * loop has nothing else to do, wait for the completion here (see
 * LSPIN_MAX_NS) if `may_wait`.  jobs_flush() runs it as a callback of the
 * loop after the turn; defer_job() in the middle of a turn that offloads
 * HANDOVER_BATCH jobs (may_wait false: a task is running).
 */
static void jobs_handover(struct ferry_inbox *ib, bool may_wait)
{
    struct loop_jobs *q = jobs_of(ib);
    struct ferry__link local, failed = { 0 }, *l;
    struct ferry_pool *spin_pool = NULL, *one = q->pool;
    int64_t budget = 0, spun;
    size_t n = q->n;

    if (!n)
        return;
    q->gen++; /* nothing on the list is pending any more */
    ferry__list_move(&local, &q->jobs);
    q->pool = NULL;
    q->n = 0;
    l = NULL;
    if (one && n) {
        /* The common case: every job for one pool, room for all.  The jobs
         * were made QUEUED when they were put on the list; hand the list
         * over whole, without touching them again. */
        pthread_mutex_lock(&one->mu);
        if (!ferry__pool_refuse_locked(one) && one->capacity - one->nqueued >= n &&
            one->nqueued <= one->capacity && ferry__list_empty(&one->overq)) {
            list_splice_tail(&one->queue, &local);
            one->nqueued += n;
            spun = ferry__pool_flushed_locked(one, n);
            if (spun) {
                spin_pool = one;
                budget = spun;
            }
        } else {
            l = ferry__list_pop_front(&local);
        }
        pthread_mutex_unlock(&one->mu);
    } else {
        l = ferry__list_pop_front(&local);
    }
    /* Otherwise one job at a time, one lock per run of jobs for a pool. */
    while (l) {
        struct job *j = ferry__container_of(l, struct job, link);
        struct ferry_pool *p = j->pool;
        size_t added = 0;

        pthread_mutex_lock(&p->mu);
        do {
            int rc = ferry__pool_refuse_locked(p);

            if (rc) {
                j->state = JOB_FINISHED;
                j->status = rc;
                ferry__list_push_back(&failed, &j->link);
            } else if (p->nqueued < p->capacity && ferry__list_empty(&p->overq)) {
                ferry__pool_queue_locked(p, j, j->enq);
                added++;
            } else {
                j->state = JOB_QUEUED;
                j->over = true;
                ferry__list_push_back(&p->overq, &j->link);
            }
            l = ferry__list_pop_front(&local);
            j = l ? ferry__container_of(l, struct job, link) : NULL;
        } while (j && j->pool == p);
        if (added) {
            spun = ferry__pool_flushed_locked(p, added);
            if (spun) {
                spin_pool = p;
                budget = spun;
            }
        }
        pthread_mutex_unlock(&p->mu);
    }
    while ((l = ferry__list_pop_front(&failed)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        ferry__task_wake_fire(&j->tw, j->status); /* on the loop: wakes the task now */
    }
    if (spin_pool && may_wait && ferry__inbox_loop_idle(ib, budget)) {
        int r = ferry__inbox_spin(ib, budget, job_not_taken, spin_pool);

        ferry__pool_loop_spun(spin_pool, r, budget);
    }
}

static void jobs_flush(void *arg)
{
    struct ferry_inbox *ib = arg;

    jobs_of(ib)->scheduled = false;
    jobs_handover(ib, true);
}

/* The flush callback stays scheduled: it finds the list empty, or hands
 * over what later turns add to it. */
void ferry__pool_handover(void *ctx)
{
    jobs_handover(ctx, false);
}

/* True while a task's job is on its loop's list.  Thread: loop. */
static bool job_pending(const struct job *j)
{
    return j->gen && j->gen == jobs_of(j->tw.ib)->gen + 1;
}

/* Put a task's job on its loop's list for the flush after this turn, made
 * QUEUED already (the flush may hand the list over without touching it).
 * Returns 0, or -ENOMEM if the flush could not be scheduled (nothing
 * done: the caller queues the job itself). */
static int defer_job(struct ferry_pool *p, struct job *j)
{
    struct loop_jobs *q = jobs_of(j->tw.ib);

    if (!q->scheduled) {
        if (ferry_call_soon(ferry__inbox_loop(j->tw.ib), jobs_flush, j->tw.ib) != 0)
            return -ENOMEM;
        q->scheduled = true;
        q->t = ferry__pool_ticks();
    }
    if (!q->n)
        q->pool = p;
    else if (q->pool != p)
        q->pool = NULL;
    q->n++;
    j->pool = p;
    j->gen = q->gen + 1;
    j->state = JOB_QUEUED;
    j->abandoned = false;
    j->over = false;
    j->enq = q->t;
    ferry__list_push_back(&q->jobs, &j->link);
    if (q->n >= HANDOVER_BATCH)
        jobs_handover(j->tw.ib, false); /* keep the workers fed during a long turn */
    return 0;
}

/* Wait in a task until the queue has room.  Requires mu; returns with mu
 * held.  Returns 0 (room now) or why not.  Only the fallback path (the
 * flush could not be scheduled) comes here. */
static int wait_room_locked(struct ferry_pool *p)
{
    struct room_waiter rw;
    bool fired;
    int rc;

    for (;;) {
        rc = ferry__pool_refuse_locked(p);
        if (rc || (p->nqueued < p->capacity && ferry__list_empty(&p->overq)))
            return rc;
        rc = ferry__task_wake_init(&rw.tw, "pool room", p);
        if (rc)
            return rc;
        rw.tw.hold = true;
        ferry__link_init(&rw.link);
        ferry__list_push_back(&p->roomq, &rw.link);
        pthread_mutex_unlock(&p->mu);
        rc = ferry__task_wake_wait(&rw.tw);
        pthread_mutex_lock(&p->mu);
        fired = !ferry__link_linked(&rw.link);
        if (!fired) {
            ferry__list_remove(&rw.link);
        } else if (!rw.tw.delivered) {
            pthread_mutex_unlock(&p->mu);
            ferry__task_wake_settle(&rw.tw);
            pthread_mutex_lock(&p->mu);
        }
        if (rc == -ECANCELED || rc == -ETIMEDOUT) {
            if (fired && p->nqueued < p->capacity)
                ferry__pool_room_kick_locked(p); /* pass the unused wake on */
            return rc;
        }
    }
}

/* The job could not go on the loop's list (no flush could be scheduled):
 * queue it now, waiting for room here if need be.  Out of line, as
 * offload_interrupted(): the hot path's frame holds only the job. */
static __attribute__((noinline)) int offload_direct(struct ferry_pool *p, struct job *j)
{
    int rc;

    pthread_mutex_lock(&p->mu);
    rc = wait_room_locked(p);
    if (!rc)
        ferry__pool_enqueue_locked(p, j);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The task was interrupted (cancelled, or a deadline passed) with status
 * `rc` while its job was somewhere between the loop's list and its
 * completion: take the job back if it has not started, else abandon it
 * (heap job) or wait for it. */
static __attribute__((noinline)) int offload_interrupted(struct ferry_pool *p, struct job *j,
                                                         int rc, bool *abandoned)
{
    if (job_pending(j)) {
        /* Still on this loop's list: never handed over. */
        ferry__list_remove(&j->link);
        jobs_of(j->tw.ib)->n--;
        j->gen = 0;
        pthread_mutex_lock(&p->mu);
        p->cancelled++;
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    if (j->state == JOB_QUEUED) {
        ferry__list_remove(&j->link);
        if (j->over) {
            j->over = false;
        } else {
            p->nqueued--;
            ferry__pool_unqueued_locked(p);
            ferry__pool_room_kick_locked(p);
        }
        p->cancelled++;
        pthread_mutex_unlock(&p->mu);
        return rc; /* never ran */
    }
    if (j->state == JOB_RUNNING && j->heap) {
        j->abandoned = true;
        *abandoned = true;
        p->nabandoned++;
        if (p->stopping)
            pthread_cond_broadcast(&p->gone); /* a leaving free waits for one fewer */
        pthread_mutex_unlock(&p->mu);
        return rc; /* the worker cleans up and frees j */
    }
    pthread_mutex_unlock(&p->mu);
    if (j->fn == ferry__job_trampoline)
        ferry__job_interrupt(j->arg, rc); /* reaches the job if it runs */
    ferry__task_wake_settle(&j->tw);      /* running (waited for) or finished */
    return j->tw.result;
}

static int offload(struct ferry_pool *p, struct job *j, struct ferry_task *self, bool *abandoned)
{
    int rc;

    *abandoned = false;
    rc = ferry__task_wake_init_self(&j->tw, self, "to_thread", p);
    if (rc)
        return rc;
    j->tw.hold = true;
    j->ib = j->tw.ib;
    ferry__link_init(&j->link);
    j->pool = p;
    if (defer_job(p, j) != 0 && (rc = offload_direct(p, j)) != 0)
        return rc;
    rc = ferry__task_wake_wait(&j->tw);
    if (j->tw.delivered)
        return j->tw.result; /* fn's status, or why it never ran */
    return offload_interrupted(p, j, rc, abandoned);
}

/* Fill in a task's job (not its wake, which offload() sets up).  Field by
 * field: zeroing the whole struct would be a large part of a round trip's
 * time on the loop thread. */
static void job_init_task(struct job *j, ferry_job_fn fn, void *arg, bool heap,
                          ferry_job_cleanup cleanup)
{
    j->fn = fn;
    j->arg = arg;
    j->kind = KIND_TASK;
    j->state = 0;
    j->status = 0;
    j->heap = heap;
    j->abandoned = false;
    j->over = false;
    j->gen = 0;
    j->enq = 0;
    j->cleanup = cleanup;
    j->ib = NULL;
    j->pool = NULL;
}

int ferry_to_thread(ferry_pool *p, ferry_job_fn fn, void *arg)
{
    struct ferry_task *self;
    _Alignas(64) struct job j;
    bool abandoned;
    int rc;

    if (!fn)
        return -EINVAL;
    if (ferry__enter_task(&self))
        return -EPERM;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    job_init_task(&j, fn, arg, false, NULL);
    ferry__pool_ref(p);
    rc = offload(p, &j, self, &abandoned);
    ferry__pool_unref(p);
    return rc;
}

int ferry_to_thread_abandon(ferry_pool *p, ferry_job_fn fn, void *arg, ferry_job_cleanup cleanup)
{
    struct ferry_task *self;
    struct job *j;
    bool abandoned;
    int rc;

    if (!fn)
        return -EINVAL;
    if (ferry__enter_task(&self))
        return -EPERM;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    j = ferry__malloc(sizeof *j);
    if (!j)
        return -ENOMEM;
    job_init_task(j, fn, arg, true, cleanup);
    j->dropped = false;
    ferry__pool_ref(p);
    rc = offload(p, j, self, &abandoned);
    /* Interrupted before fn started (still pending or queued), or dropped
     * from the queue by ferry_pool_free(): fn never runs, so the cleanup
     * gets arg now.  After -ECANCELED or -ETIMEDOUT the caller thus never
     * owns arg again, whether fn ran or not. */
    if (!abandoned && (rc == -ECANCELED || rc == -ETIMEDOUT) && cleanup &&
        (j->dropped || (j->state != JOB_RUNNING && j->state != JOB_FINISHED)))
        cleanup(arg, rc);
    if (!abandoned)
        ferry__free(j);
    ferry__pool_unref(p);
    return rc;
}
