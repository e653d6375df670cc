/* pool_sink.c - the end of a pool's job going back to whoever waits for
 * it: the task (through its wake), the submitter's completion callback (on
 * its loop, or on the pool thread), or the abandon variant's cleanup; and
 * the sink, which takes the finished task jobs of one loop in one go.
 * Pool threads, and the loop thread that runs a posted sink.
 *
 * pool_int.h has the map of the pool's files and the rules they share.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "pool_int.h"

/* The end of a submitted job: its completion callback, then the job and
 * its reference on the pool go.  On the job's loop if it named one (see
 * submit_done_on_loop()), else on the pool thread. */
static void submit_done(struct job *j)
{
    struct ferry_pool *p = j->pool;
    int rc = j->sub.done ? j->sub.done(j->sub.done_arg, j->status) : 0;

    if (rc) {
        atomic_fetch_add(&p->callback_errors, 1);
        ferry__log(FERRY_LOG_WARN,
                   "pool: a job's completion callback failed (%d); "
                   "later jobs are not affected",
                   rc);
    }
    if (!j->sub.ticket || atomic_fetch_sub_explicit(&j->sub.refs, 1, memory_order_acq_rel) == 1)
        ferry__free(j);
    ferry__pool_unref(p);
}

/* Runs on the loop: the completion of a submitted job. */
static void submit_done_on_loop(struct ferry__cnode *n)
{
    submit_done(ferry__container_of(n, struct job, sub.cn));
}

/* Deliver a job's end (fn's status, or why it never ran).  No lock held.
 * After this the job may be gone (a task's stack frame). */
void ferry__pool_finish(struct job *j, int status)
{
    j->status = status;
    if (j->kind == KIND_TASK) {
        ferry__task_wake_fire(&j->tw, status);
        return;
    }
    if (j->ib) {
        j->sub.cn.fn = submit_done_on_loop;
        ferry__inbox_complete_reserved(j->ib, &j->sub.cn);
        return;
    }
    submit_done(j);
}

/* Runs on the loop: take the sink's jobs and wake their tasks. */
static void sink_run(struct ferry__cnode *n)
{
    struct ferry_pool *p = ferry__container_of(n, struct ferry_pool, sink.cn);
    struct sink *s = &p->sink;
    struct ferry__link local, *l;
    struct job **v;
    size_t cnt;
    unsigned a;

    pthread_mutex_lock(&p->mu);
    a = s->fill;
    v = s->slot[a];
    cnt = s->n;
    s->taken[a] = true;
    s->fill = a ^ 1;
    s->n = 0;
    ferry__list_move(&local, &s->more);
    s->posted = false;
    ferry__pool_completions_taken_locked(p);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < cnt; i++) {
        struct job *j = v[i];

        /* The jobs ahead: the line a worker wrote (status) and the two
         * lines of the wake; nearer, the task each wake makes ready (its
         * pointer is in a line fetched four jobs ago). */
        if (i + 8 < cnt) {
            __builtin_prefetch(v[i + 8], 0);
            __builtin_prefetch(&v[i + 8]->tw.w, 1);
            __builtin_prefetch(&v[i + 8]->tw.delivered, 1);
        }
        if (i + 4 < cnt)
            __builtin_prefetch(v[i + 4]->tw.w.task, 1);
        ferry__task_wake_deliver(&j->tw, j->status); /* wakes the task now */
    }
    while ((l = ferry__list_pop_front(&local)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        ferry__task_wake_deliver(&j->tw, j->status);
    }
    pthread_mutex_lock(&p->mu);
    s->taken[a] = false;
    pthread_mutex_unlock(&p->mu);
    ferry__pool_unref(p);
}

int ferry__pool_book_locked(struct ferry_pool *p, struct job *j, int status,
                            struct ferry_inbox **ib)
{
    struct sink *s = &p->sink;

    p->running--;
    p->completed++;
    if (j->abandoned) {
        p->nabandoned--;
        return RET_CLEANUP;
    }
    j->state = JOB_FINISHED;
    j->status = status;
    if (j->kind != KIND_TASK)
        return RET_FINISH;
    if (!s->posted && !s->n && ferry__list_empty(&s->more))
        s->ib = j->ib; /* idle: serve this inbox */
    else if (s->ib != j->ib)
        return RET_FINISH; /* busy with another loop */
    if (s->n < SINK_SLOTS && !s->taken[s->fill])
        s->slot[s->fill][s->n++] = j;
    else
        ferry__list_push_back(&s->more, &j->link);
    if (s->posted)
        return RET_NONE;
    s->posted = true;
    *ib = s->ib;
    return RET_POST;
}

/* Carry out what ferry__pool_book_locked() asked for.  No lock held. */
void ferry__pool_after_book(struct ferry_pool *p, struct job *j, int status, int what,
                            struct ferry_inbox *ib)
{
    switch (what) {
    case RET_POST:
        ferry__pool_ref(p); /* dropped by sink_run */
        p->sink.cn.fn = sink_run;
        ferry__inbox_complete(ib, &p->sink.cn);
        break;
    case RET_FINISH:
        ferry__pool_finish(j, status);
        break;
    case RET_CLEANUP:
        if (j->cleanup)
            j->cleanup(j->arg, status);
        ferry__free(j);
        break;
    default:
        break;
    }
}
