/* job.c - jobs that cancellation reaches: ferry_to_thread_ex(), the
 * job's view of its caller (ferry_job_cancelled, ferry_job_deadline), and
 * the interrupt hook.
 * The task's loop thread and the pool thread that runs the job.
 *
 * A ferry_to_thread_ex() job is an ordinary task job (to_thread.c) whose
 * fn is ferry__job_trampoline() and whose arg is a struct xjob on the
 * task's stack, so the pool's hot path knows nothing of it and
 * ferry_to_thread() pays nothing for it.  The one place that does know is
 * the cold path of an interrupted task (offload_interrupted), which calls
 * ferry__job_interrupt() for a job that has left the queue.
 *
 * One atomic state word per job orders the job's start and end against
 * the interrupt (the .NET CancellationTokenRegistration rule):
 *
 *   QUEUED  --worker starts fn--------------------> RUNNING
 *   QUEUED  --loop: interrupted before the start--> INTERRUPTED (fn never runs)
 *   RUNNING --worker: fn returned-----------------> DONE
 *   RUNNING --loop: interrupted-------------------> INTERRUPTING
 *   INTERRUPTING --loop: the hook returned--------> INTERRUPTED
 *
 * Each arrow is a compare-and-swap by the one side named, so the hook runs
 * only if the loop's swap from RUNNING won, that is before fn returned,
 * and at most once.  A worker whose swap from RUNNING lost (fn returned
 * while the hook may still run) waits for INTERRUPTED before it reports
 * the job's end: once the task learns that the job ended, the hook has
 * returned, so nothing it uses (a connection, the job's arg) is touched
 * after the call returns.  Only the pool thread waits, never the loop.
 * The same handshake covers ferry_job_cancel_fd(): the loop writes it
 * only while INTERRUPTING, so the pool thread may close it after.
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>

#include "pool_int.h"
#include "wakefd.h"

enum { X_QUEUED, X_RUNNING, X_INTERRUPTING, X_INTERRUPTED, X_DONE };

/* A ferry_to_thread_ex() job's state, on the waiting task's stack. */
struct xjob {
    atomic_int state;                 /* X_*, see above */
    int why;                          /* loop: -ECANCELED or -ETIMEDOUT; written before
                                       * the swap that publishes it */
    ferry_job_run_fn fn;              /* set once, by the task */
    void *arg;                        /* set once */
    ferry_job_interrupt_fn interrupt; /* set once; may be NULL */
    int64_t deadline;                 /* set once: the task's deadline at the call, on
                                       * the real clock (the job's thread's) */
    int status;                       /* pool thread: fn's status, read by the task
                                       * after the completion */
    bool ran;                         /* pool thread: fn ran to its end */
    void *result;                     /* pool thread: what fn stored */
    struct ferry__wakefd wake;        /* pool thread: ferry_job_cancel_fd()'s pair, made
                                       * on demand, closed when fn returned */
    atomic_int wake_wfd;              /* wake.wfd once made, else -1; read by the loop
                                       * while INTERRUPTING */
};

/* The job the calling pool thread runs now, or NULL. */
static _Thread_local struct xjob *cur_job;

/* ---- pool thread -------------------------------------------------------- */

int ferry__job_trampoline(void *arg)
{
    struct xjob *x = arg;
    struct xjob *outer = cur_job;
    int s = X_QUEUED;

    if (!atomic_compare_exchange_strong(&x->state, &s, X_RUNNING))
        return x->why; /* interrupted before it started: never runs */
    cur_job = x;
    x->result = NULL;
    x->status = x->fn(x->arg, &x->result);
    x->ran = true;
    cur_job = outer;
    s = X_RUNNING;
    if (!atomic_compare_exchange_strong(&x->state, &s, X_DONE)) {
        /* The loop is interrupting the job: its hook may be running.  Let
         * it return before the end goes back to the task. */
        while (atomic_load(&x->state) != X_INTERRUPTED)
            sched_yield();
    }
    /* The loop writes the wake descriptor only while INTERRUPTING. */
    if (x->wake.rfd >= 0)
        ferry__wakefd_close(&x->wake);
    return 0;
}

bool ferry_job_cancelled(void)
{
    struct xjob *x = cur_job;
    int s;

    if (!x)
        return false;
    s = atomic_load_explicit(&x->state, memory_order_acquire);
    if (s == X_INTERRUPTING || s == X_INTERRUPTED)
        return true;
    /* The loop may not have noticed the deadline yet (it is busy, or its
     * timer has not fired): the job need not wait for it. */
    return x->deadline != FERRY_NEVER && ferry__now_real() >= x->deadline;
}

int ferry_job_cancel_fd(void)
{
    struct xjob *x = cur_job;
    int rc, s;

    if (!x)
        return -EPERM;
    if (x->wake.rfd >= 0)
        return x->wake.rfd;
    rc = ferry__wakefd_open(&x->wake);
    if (rc)
        return rc;
    /* Publish, then look: the loop marks the job, then looks for the
     * descriptor, so at least one of the two sees the other and writes. */
    atomic_store(&x->wake_wfd, x->wake.wfd);
    s = atomic_load(&x->state);
    if (s == X_INTERRUPTING || s == X_INTERRUPTED)
        ferry__wakefd_write(x->wake.wfd);
    return x->wake.rfd;
}

int64_t ferry_job_deadline(void)
{
    struct xjob *x = cur_job;

    return x ? x->deadline : FERRY_NEVER;
}

/* ---- loop thread -------------------------------------------------------- */

void ferry__job_interrupt(void *arg, int why)
{
    struct xjob *x = arg;
    int s = X_QUEUED, wfd;

    x->why = why;
    if (atomic_compare_exchange_strong(&x->state, &s, X_INTERRUPTED))
        return; /* taken by a worker, not started: it never will */
    if (s != X_RUNNING || !atomic_compare_exchange_strong(&x->state, &s, X_INTERRUPTING))
        return; /* fn returned already: no hook after the end */
    if (x->interrupt)
        x->interrupt(x->arg);
    wfd = atomic_load(&x->wake_wfd);
    if (wfd >= 0)
        ferry__wakefd_write(wfd);
    atomic_store_explicit(&x->state, X_INTERRUPTED, memory_order_release);
}

int ferry_to_thread_ex(ferry_pool *p, const ferry_job *job, int *job_status, void **result)
{
    struct ferry_task *self;
    struct xjob x;
    int rc;

    if (!job || !job->fn || !job_status)
        return -EINVAL;
    if (ferry__enter_task(&self))
        return -EPERM;
    atomic_init(&x.state, X_QUEUED);
    x.why = -ECANCELED;
    x.fn = job->fn;
    x.arg = job->arg;
    x.interrupt = job->interrupt;
    /* The job's thread reads the real clock.  Under a virtual clock the
     * loop's time stands still while the job runs (the task's wait holds
     * it), so the job gets the time that was left at the call, in real
     * time. */
    x.deadline = ferry__deadline_to_real(ferry__task_deadline(self));
    x.status = 0;
    x.ran = false;
    x.result = NULL;
    x.wake.rfd = x.wake.wfd = -1;
    atomic_init(&x.wake_wfd, -1);
    rc = ferry_to_thread(p, ferry__job_trampoline, &x);
    if (!x.ran)
        return rc ? rc : -ECANCELED;
    *job_status = x.status;
    if (result)
        *result = x.result;
    return 0;
}
