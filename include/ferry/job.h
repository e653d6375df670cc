/* ferry/job.h - pool jobs that cancellation reaches, and statuses that
 * cannot be confused.
 *
 * ferry_to_thread() (ferry/bridge.h) waits, shielded, for a job that has
 * started: the job never learns that its caller gave up.  The calls here
 * add what a wrapper of a blocking C API needs:
 *
 *   - ferry_to_thread_ex() runs a job described by a ferry_job and hands
 *     back the job's own status and a pointer-wide result apart from
 *     ferry's status, so a job that returns -ECANCELED is never taken for
 *     a cancellation;
 *   - inside such a job, ferry_job_cancelled() and ferry_job_deadline()
 *     tell the job that its caller was cancelled or what its deadline is
 *     (to pass to the blocking API's own timeout);
 *   - the job's interrupt hook is called once when the waiting task is
 *     cancelled or its deadline passes while the job runs, to make the
 *     blocking call return early (sqlite3_interrupt(), pthread_kill() of
 *     the job's thread), and ferry_job_cancel_fd() becomes readable then,
 *     for a job that waits in poll();
 *   - a job submitted from a plain thread with a ticket can be withdrawn
 *     while it is still queued.
 *
 * How to choose between these, ferry_to_thread() and
 * ferry_to_thread_abandon() for a given API: docs/wrapping.md.
 */
#ifndef FERRY_JOB_H
#define FERRY_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/bridge.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Jobs that learn of their caller's cancellation -------------------- */

/*
 * The blocking call of a ferry_job.  Runs on a pool thread.  Its return
 * value is the job's own status, which ferry never interprets; *result
 * (NULL when fn starts) is a result wider than an int, handed back to the
 * caller as it is.
 */
typedef int (*ferry_job_run_fn)(void *arg, void **result /* OUT */);

/*
 * Makes the job's blocking call return early.  It must be short and must
 * not block: it runs on the loop thread of the waiting task (see
 * ferry_to_thread_ex()), while the job runs on its pool thread.
 */
typedef void (*ferry_job_interrupt_fn)(void *arg);

/* What to run.  The caller's: ferry copies what it needs at the call. */
typedef struct ferry_job {
    ferry_job_run_fn       fn;        /* the blocking call; required */
    void                  *arg;       /* passed to fn and to interrupt */
    ferry_job_interrupt_fn interrupt; /* NULL: no hook; the job may still ask
                                       * ferry_job_cancelled() */
} ferry_job;

/*
 * Run job->fn on a thread of `pool` (NULL: the default pool) and suspend
 * the calling task until it ends, as ferry_to_thread() does, with two
 * differences.
 *
 * Cancellation reaches the job.  If the task is cancelled or a deadline
 * of its scopes passes while the job is queued, the job is removed and
 * never runs.  If it happens while the job runs, ferry marks the job
 * cancelled (ferry_job_cancelled() returns true from then on), calls
 * job->interrupt(job->arg) once, on the task's loop thread, and keeps
 * waiting, shielded, until fn returns: `arg` is never used after the call
 * returns.  The hook is never called before fn started nor after it
 * returned, and never while the job's end is being reported: a job that
 * returns while its hook runs waits on its pool thread for the hook to
 * return before its end is reported.  The loop never waits for the job.
 * A job that returns because it was interrupted says so in its own status
 * (e.g. -ECANCELED); the task's cancellation is then reported by its next
 * suspension point, as after ferry_to_thread().
 *
 * The job's status and result come back apart from ferry's: the call
 * returns 0 exactly when fn ran to its end, and then *job_status is fn's
 * return value and *result (if not NULL) what fn stored.  Any other return
 * means fn never ran.
 *
 * Allocates nothing: the job's state lives on the task's stack.  The
 * added cost over ferry_to_thread() is one indirect call and two atomic
 * operations per job; ferry_to_thread() itself pays nothing for them.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (fn ran; *job_status and *result set); -ECANCELED,
 * -ETIMEDOUT (fn never ran: the task was cancelled or its deadline passed
 * before fn started, or the pool was freed while the job was queued);
 * -ESHUTDOWN, -EDEADLK, -ENOMEM (as ferry_to_thread(); fn never ran);
 * -EPERM; -EINVAL (job, job->fn or job_status NULL).  *job_status and
 * *result are left alone unless the call returns 0.
 * Owns: job->arg stays the caller's; it must outlive the call.
 */
int ferry_to_thread_ex(ferry_pool *pool, const ferry_job *job,
                       int *job_status /* OUT */, void **result /* OUT, optional */);

/*
 * Inside a job run by ferry_to_thread_ex(): true once the waiting task
 * was cancelled or its deadline (ferry_job_deadline()) has passed.  A
 * progress callback of the blocking API polls it: an interrupt hook that
 * came just before the blocking call started may have had nothing to
 * interrupt (sqlite3_interrupt() is a no-op while no statement runs), but
 * this keeps returning true.
 * Thread: a pool thread running such a job; anywhere else it returns
 * false.  Suspends: no.
 * Returns: true if the job should stop; false otherwise.
 */
bool ferry_job_cancelled(void);

/*
 * Inside a job run by ferry_to_thread_ex(): a descriptor that becomes
 * readable when the waiting task is cancelled or its deadline passes
 * while the job runs (when the interrupt hook is called; no hook is
 * needed), for a job that waits in poll() on its own descriptor and this
 * one.  Made on the first call (later calls return the same one; it is
 * already readable if the interruption came first) and closed by ferry
 * when fn returns: do not read, write or close it.  A deadline that passes
 * while the loop is busy makes it readable only once the loop notices;
 * give poll() the deadline as its timeout as well.
 * Thread: a pool thread running such a job.  Suspends: no.
 * Returns: the descriptor; -EMFILE, -ENFILE, -ENOMEM (none could be
 * made); -EPERM (outside such a job).
 */
int ferry_job_cancel_fd(void);

/*
 * Inside a job run by ferry_to_thread_ex(): the earliest deadline of the
 * waiting task's scopes when it made the call, absolute on ferry_now()'s
 * clock on the pool thread (the real one), to pass to the blocking API's
 * own timeout.  If the task's loop has a virtual clock, it is the time the
 * task had left, counted in real time from the call (the loop's time
 * stands still while the job runs).
 * Thread: a pool thread running such a job.  Suspends: no.
 * Returns: the deadline; FERRY_NEVER if there is none, or outside such a
 * job.
 */
int64_t ferry_job_deadline(void);

/* ---- Submitted jobs that can be withdrawn ------------------------------ */

/*
 * A handle on a job queued by ferry_pool_submit_ticket().  It stays valid
 * until ferry_ticket_free(), whether the job ran, was withdrawn or was
 * dropped by ferry_pool_free().
 */
typedef struct ferry_ticket ferry_ticket;

/*
 * Exactly ferry_pool_submit(), and on success a ticket for the job.
 * Thread: any.  Suspends: no (blocks a thread while the queue is full).
 * Returns: as ferry_pool_submit(); -EINVAL also if `out` is NULL.  On an
 * error *out is NULL, nothing was queued and done is not called.
 * Owns: the caller owns *out; give it back with ferry_ticket_free().  The
 * ticket keeps the pool's memory (not its threads) until then.
 */
int ferry_pool_submit_ticket(ferry_pool *pool, ferry_job_fn fn, void *arg,
                             ferry_loop *loop, ferry_job_done done, void *done_arg,
                             ferry_ticket **out /* OUT */);

/*
 * Withdraw the ticket's job if it is still queued: it never runs and its
 * done is not called (the caller knows at once, and may free done_arg).
 * Thread: any.  Suspends: no.
 * Returns: 0 (withdrawn: fn and done never run); -EBUSY (fn is running:
 * done will be called); -EALREADY (fn ended, or the job was withdrawn or
 * dropped by ferry_pool_free() already: done has been or will be called
 * exactly as without the ticket); -EINVAL (NULL).
 */
int ferry_ticket_withdraw(ferry_ticket *ticket);

/* Give the ticket back; the job is not affected.  NULL is ignored.
 * Thread: any. */
void ferry_ticket_free(ferry_ticket *ticket);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_JOB_H */
