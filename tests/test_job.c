/* test_job.c - ferry/job.h: jobs that cancellation reaches, the interrupt
 * hook, statuses apart from ferry's, the wide result, withdrawable
 * submissions. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>
#include <criterion/criterion.h>
#include "testutil.h"
#include "ferry/job.h"

/* ---- a job that waits to be cancelled ----------------------------------- */

/* What a job and its hook saw, recorded for the main stack to assert on. */
struct seen {
    atomic_int entered;       /* the job started */
    atomic_int saw_cancel;    /* ferry_job_cancelled() turned true inside the job */
    atomic_int hook_calls;    /* times the hook ran */
    atomic_int in_hook;       /* the hook is running now */
    atomic_int job_ended;     /* fn returned */
    int64_t    deadline;      /* ferry_job_deadline() inside the job */
    int        spin_us;       /* hammer: how long the job runs */
};

/* Some hook is running now (any job's). */
static atomic_int hook_active;

static void hook(void *arg)
{
    struct seen *s = arg;
    int64_t end = ferry_now() + FERRY_USEC(200);

    atomic_fetch_add(&hook_active, 1);
    atomic_fetch_add(&s->in_hook, 1);
    /* Long enough for a job that ends meanwhile to find the hook running. */
    while (ferry_now() < end)
        ;
    atomic_fetch_add(&s->hook_calls, 1);
    atomic_fetch_sub(&s->in_hook, 1);
    atomic_fetch_sub(&hook_active, 1);
}

/* Waits (at most 10 s) until told it is cancelled; returns -ECANCELED then,
 * as a wrapper would map its API's "interrupted", else 1. */
static int wait_cancel_job(void *arg, void **result)
{
    struct seen *s = arg;
    int64_t end = ferry_now() + FERRY_SEC(10);

    s->deadline = ferry_job_deadline();
    atomic_store(&s->entered, 1);
    while (!ferry_job_cancelled() && ferry_now() < end)
        usleep(100);
    atomic_store(&s->saw_cancel, ferry_job_cancelled());
    *result = s;
    return ferry_job_cancelled() ? -ECANCELED : 1;
}

/* As wait_cancel_job, but waits for the hook itself: a job that only
 * polls ferry_job_cancelled() may see its deadline pass and return before
 * the loop's timer fires, and then no hook is due. */
static int wait_hook_job(void *arg, void **result)
{
    struct seen *s = arg;
    int64_t end = ferry_now() + FERRY_SEC(10);

    (void)result;
    s->deadline = ferry_job_deadline();
    atomic_store(&s->entered, 1);
    while (!atomic_load(&s->hook_calls) && ferry_now() < end)
        usleep(100);
    atomic_store(&s->saw_cancel, ferry_job_cancelled());
    return ferry_job_cancelled() ? -ECANCELED : 1;
}

struct call {
    ferry_pool *p;
    struct seen s;
    ferry_job job;
    int rc, status;
    void *result;
    int64_t scope_deadline;   /* 0: no scope */
    int hook_calls_at_return, in_hook_at_return;
    int probe_rc;             /* a job queued behind this one */
};

static int call_task(void *arg)
{
    struct call *c = arg;
    ferry_scope sc;

    if (c->scope_deadline) {
        ferry_scope_enter(&sc, c->scope_deadline, 0);
        c->rc = ferry_to_thread_ex(c->p, &c->job, &c->status, &c->result);
        ferry_scope_exit(&sc);
    } else {
        c->rc = ferry_to_thread_ex(c->p, &c->job, &c->status, &c->result);
    }
    c->hook_calls_at_return = atomic_load(&c->s.hook_calls);
    c->in_hook_at_return = atomic_load(&c->s.in_hook);
    return 0;
}

/* Queued behind a job whose hook may come: its pool thread must not
 * start it while that hook runs (the hook would reach the wrong job, as
 * sqlite3_interrupt() on a connection the thread keeps would). */
static atomic_int probe_saw_hook, probes;

static int probe_job(void *arg)
{
    (void)arg;
    if (atomic_load(&hook_active))
        atomic_fetch_add(&probe_saw_hook, 1);
    atomic_fetch_add(&probes, 1);
    return 0;
}

static int noop(void *arg)
{
    (void)arg;
    return 0;
}

/* One thread, FIFO: once a job queued now has run, so has every job
 * queued before it (ferry_pool_free() would drop them). */
static int drain(ferry_pool *p)
{
    return ferry_to_thread(p, noop, NULL);
}

static int cancel_running_main(void *arg)
{
    struct call *c = arg;
    ferry_task *t;

    ferry_task_spawn(&t, NULL, call_task, c, NULL);
    tu_task_wait_flag(&c->s.entered);
    c->probe_rc = ferry_pool_submit(c->p, probe_job, NULL, NULL, NULL, NULL);
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    return drain(c->p);
}

Test(job, cancel_while_running_calls_the_hook_once_and_the_job_sees_it,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct call c = {0};

    cr_assert_eq(ferry_pool_new(&c.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    c.job = (ferry_job){ .fn = wait_cancel_job, .arg = &c.s, .interrupt = hook };
    c.status = 12345;
    cr_assert_eq(tu_run(cancel_running_main, &c), 0);
    ferry_pool_free(c.p);     /* waits for the probe */
    cr_assert_eq(c.probe_rc, 0);
    cr_assert_eq(atomic_load(&probes), 1);
    cr_assert_eq(atomic_load(&probe_saw_hook), 0,
                 "the pool thread started the next job while the hook ran");
    cr_assert_eq(c.rc, 0, "the job ran: ferry's status is 0, got %d", c.rc);
    cr_assert_eq(c.status, -ECANCELED, "the job's own status comes back: %d", c.status);
    cr_assert_eq(c.result, &c.s, "the job's result comes back");
    cr_assert_eq(atomic_load(&c.s.saw_cancel), 1);
    cr_assert_eq(c.hook_calls_at_return, 1, "hook calls: %d", c.hook_calls_at_return);
    cr_assert_eq(atomic_load(&c.s.hook_calls), 1);
    cr_assert_eq(c.s.deadline, FERRY_NEVER);
}

Test(job, deadline_while_running_calls_the_hook_and_is_read_back,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct call c = {0};
    ferry_pool *p;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    /* A machine too busy to start the job before its deadline removes it
     * from the queue instead (-ETIMEDOUT, never ran): try again with a
     * longer one. */
    for (int64_t ms = 50; ms <= 6400; ms *= 2) {
        c = (struct call){ .p = p };
        c.job = (ferry_job){ .fn = wait_hook_job, .arg = &c.s, .interrupt = hook };
        c.scope_deadline = ferry_now() + tu_ms(ms);
        cr_assert_eq(tu_run(call_task, &c), 0);
        if (atomic_load(&c.s.entered))
            break;
        cr_assert_eq(c.rc, -ETIMEDOUT, "never ran: rc %d", c.rc);
    }
    ferry_pool_free(p);
    cr_assert_eq(atomic_load(&c.s.entered), 1, "the job never started in time");
    cr_assert_eq(c.rc, 0, "rc %d", c.rc);
    cr_assert_eq(c.status, -ECANCELED);
    cr_assert_eq(c.s.deadline, c.scope_deadline, "the job reads the caller's deadline");
    cr_assert_eq(atomic_load(&c.s.saw_cancel), 1);
    cr_assert_eq(atomic_load(&c.s.hook_calls), 1);
}

/* A job with no hook still learns of the deadline by asking, also before
 * the loop has noticed it: here the loop thread is kept busy from before
 * the deadline until the job has looked. */
struct past {
    atomic_int entered, looked, returned;
    int        saw;          /* ferry_job_cancelled() just past the deadline */
    int        rc, status;
    int64_t    ms;           /* the deadline, from the call */
};

static int past_deadline_job(void *arg, void **result)
{
    struct past *p = arg;
    int64_t d = ferry_job_deadline();

    (void)result;
    atomic_store(&p->entered, 1);
    while (d != FERRY_NEVER && ferry_now() <= d + FERRY_MSEC(1))
        usleep(100);
    p->saw = d == FERRY_NEVER ? -2 : ferry_job_cancelled();   /* -2: no deadline read */
    atomic_store(&p->looked, 1);
    return 0;
}

static int past_deadline_task(void *arg)
{
    struct past *p = arg;
    ferry_scope sc;
    ferry_job job = { .fn = past_deadline_job, .arg = p };

    ferry_scope_enter(&sc, ferry_now() + p->ms, 0);
    p->rc = ferry_to_thread_ex(NULL, &job, &p->status, NULL);
    ferry_scope_exit(&sc);
    atomic_store(&p->returned, 1);
    return 0;
}

static int past_deadline_main(void *arg)
{
    struct past *p = arg;
    ferry_task *t;

    ferry_task_spawn(&t, NULL, past_deadline_task, p, NULL);
    while (!atomic_load(&p->entered) && !atomic_load(&p->returned))
        ferry_sleep(FERRY_USEC(200));
    if (atomic_load(&p->entered))
        tu_spin_until(&p->looked); /* the loop thread blocked: no timer fires */
    ferry_task_join(t, NULL);
    return 0;
}

Test(job, cancelled_is_true_once_the_deadline_passed,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct past p;

    /* As above: a job that could not start before its deadline never
     * runs; try again with a longer one. */
    for (int64_t ms = 50; ms <= 6400; ms *= 2) {
        p = (struct past){ .saw = -1, .ms = tu_ms(ms) };
        cr_assert_eq(tu_run(past_deadline_main, &p), 0);
        if (atomic_load(&p.entered))
            break;
        cr_assert_eq(p.rc, -ETIMEDOUT, "never ran: rc %d", p.rc);
    }
    cr_assert_eq(atomic_load(&p.entered), 1, "the job never started in time");
    cr_assert_eq(p.rc, 0, "rc %d", p.rc);
    cr_assert_eq(p.saw, 1, "ferry_job_cancelled() after the deadline: %d", p.saw);
}

/* ---- the job's wake descriptor ------------------------------------------ */

struct fdjob {
    atomic_int entered;
    int        late;          /* ask for the descriptor only once cancelled */
    int        fd, polled, revents_before;
};

/* Waits in poll() on the wake descriptor alone, for at most 10 s. */
static int fd_job(void *arg, void **result)
{
    struct fdjob *f = arg;
    struct pollfd p = { .events = POLLIN };
    int64_t end = ferry_now() + FERRY_SEC(10);

    (void)result;
    if (!f->late) {
        f->fd = ferry_job_cancel_fd();
        atomic_store(&f->entered, 1);
    } else {
        atomic_store(&f->entered, 1);
        while (!ferry_job_cancelled() && ferry_now() < end)
            usleep(100);
        f->fd = ferry_job_cancel_fd();
    }
    if (f->fd < 0)
        return f->fd;
    if (ferry_job_cancel_fd() != f->fd)
        return -EEXIST;
    p.fd = f->fd;
    f->polled = poll(&p, 1, f->late ? 0 : 10000);
    return p.revents & POLLIN ? -ECANCELED : 1;
}

struct fdcall {
    struct fdjob f;
    int rc, status;
};

static int fd_task(void *arg)
{
    struct fdcall *c = arg;
    ferry_job job = { .fn = fd_job, .arg = &c->f };

    c->rc = ferry_to_thread_ex(NULL, &job, &c->status, NULL);
    return 0;
}

static int fd_main(void *arg)
{
    struct fdcall *c = arg;
    ferry_task *t;

    ferry_task_spawn(&t, NULL, fd_task, c, NULL);
    tu_task_wait_flag(&c->f.entered);
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    return 0;
}

static void fd_case(int late)
{
    struct fdcall c = { .f = { .late = late, .fd = -1 } };

    cr_assert_eq(tu_run(fd_main, &c), 0);
    cr_assert_eq(c.rc, 0, "rc %d", c.rc);
    cr_assert_geq(c.f.fd, 0, "ferry_job_cancel_fd() %d", c.f.fd);
    cr_assert_eq(c.f.polled, 1, "poll() returned %d", c.f.polled);
    cr_assert_eq(c.status, -ECANCELED, "the descriptor was readable: %d", c.status);
    cr_assert_eq(fcntl(c.f.fd, F_GETFD), -1, "closed after the job");
}

Test(job, cancel_fd_becomes_readable_on_cancel,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    fd_case(0);
}

Test(job, cancel_fd_asked_for_after_the_cancel_is_readable_at_once,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    fd_case(1);
}

/* ---- the race between the hook and the job's end ------------------------ */

static int spin_job(void *arg, void **result)
{
    struct seen *s = arg;
    int64_t end = ferry_now() + FERRY_USEC(s->spin_us);

    (void)result;
    atomic_store(&s->entered, 1);
    while (ferry_now() < end && !ferry_job_cancelled())
        ;
    atomic_store(&s->saw_cancel, ferry_job_cancelled());
    atomic_store(&s->job_ended, 1);
    return 7;
}

struct hammer {
    ferry_pool *p;
    int iters;
    int bad_calls, bad_in_hook, bad_seen_no_hook, bad_rc, bad_late;
    int hooked, not_hooked, never_ran, probes;
};

static int hammer_main(void *arg)
{
    struct hammer *h = arg;
    unsigned seed = 12345;

    for (int i = 0; i < h->iters; i++) {
        struct call *c = calloc(1, sizeof *c);
        ferry_task *t;
        int late;

        if (!c)
            return -ENOMEM;
        c->p = h->p;
        c->rc = INT_MIN;               /* stays so if the task was cancelled before it ran */
        c->s.spin_us = (int)(rand_r(&seed) % 40);
        c->job = (ferry_job){ .fn = spin_job, .arg = &c->s, .interrupt = hook };
        ferry_task_spawn(&t, NULL, call_task, c, NULL);
        while (!atomic_load(&c->s.entered) && rand_r(&seed) % 4)
            ferry_sleep(FERRY_USEC(rand_r(&seed) % 30));
        if (atomic_load(&c->s.entered) &&
            ferry_pool_submit(h->p, probe_job, NULL, NULL, NULL, NULL) == 0)
            h->probes++;
        ferry_task_cancel(t);
        ferry_task_join(t, NULL);
        if (c->hook_calls_at_return > 1)
            h->bad_calls++;
        if (c->in_hook_at_return)
            h->bad_in_hook++;
        /* The job saw the cancellation only through the state that the
         * hook's caller sets: then the hook ran. */
        if (atomic_load(&c->s.saw_cancel) && c->hook_calls_at_return != 1)
            h->bad_seen_no_hook++;
        if (c->rc != 0 && c->rc != -ECANCELED && c->rc != INT_MIN)
            h->bad_rc++;
        if (c->rc == 0 && c->status != 7)
            h->bad_rc++;

        if (c->hook_calls_at_return)
            h->hooked++;
        else if (c->rc == 0)
            h->not_hooked++;           /* ran, and ended before the cancel came */
        else
            h->never_ran++;
        /* After the call returned nothing may touch the job's state: a
         * late hook would count here, and ASan would see it use `c`
         * after the free below. */
        ferry_yield();
        late = atomic_load(&c->s.hook_calls) != c->hook_calls_at_return;
        h->bad_late += late;
        free(c);
    }
    return drain(h->p);
}

Test(job, hook_runs_at_most_once_never_after_the_job_ended,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    struct hammer h = { .iters = 3000 };
    const char *scale = getenv("FERRY_STRESS_SCALE");

    if (scale && atof(scale) > 0 && atof(scale) < 1)
        h.iters = (int)(h.iters * atof(scale)) + 100;
    cr_assert_eq(ferry_pool_new(&h.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(hammer_main, &h), 0);
    ferry_pool_free(h.p);    /* waits for the probes */
    cr_assert_eq(atomic_load(&probes), h.probes);
    cr_assert_eq(atomic_load(&probe_saw_hook), 0, "a job started while the previous "
                 "job's hook ran: %d times", atomic_load(&probe_saw_hook));
    cr_assert_eq(h.bad_calls, 0, "hook ran twice: %d", h.bad_calls);
    cr_assert_eq(h.bad_in_hook, 0, "call returned while the hook ran: %d", h.bad_in_hook);
    cr_assert_eq(h.bad_seen_no_hook, 0, "cancelled without the hook: %d", h.bad_seen_no_hook);
    cr_assert_eq(h.bad_rc, 0);
    cr_assert_eq(h.bad_late, 0, "hook ran after the call returned: %d", h.bad_late);
    cr_log_info("hooked %d, ended first %d, never ran %d, probes %d", h.hooked, h.not_hooked, h.never_ran, h.probes);
}

/* ---- queued, ended first, statuses ---------------------------------------- */

static atomic_int gate, gate_entered, ran_queued;

static int gate_job(void *arg, void **result)
{
    (void)arg;
    (void)result;
    atomic_store(&gate_entered, 1);
    tu_spin_until(&gate);
    return 3;
}

static int queued_job(void *arg, void **result)
{
    (void)arg;
    (void)result;
    atomic_store(&ran_queued, 1);
    return 4;
}

struct queued {
    ferry_pool *p;
    struct call blocker, victim;
};

static int queued_main(void *arg)
{
    struct queued *q = arg;
    ferry_task *b, *v;

    ferry_task_spawn(&b, NULL, call_task, &q->blocker, NULL);
    tu_task_wait_flag(&gate_entered);
    ferry_task_spawn(&v, NULL, call_task, &q->victim, NULL);
    for (int i = 0; i < 5; i++)
        ferry_yield();
    ferry_task_cancel(v);
    ferry_task_join(v, NULL);
    atomic_store(&gate, 1);
    ferry_task_join(b, NULL);
    return 0;
}

Test(job, cancel_while_queued_never_runs_and_calls_no_hook,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct queued q = {0};

    cr_assert_eq(ferry_pool_new(&q.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    q.blocker.p = q.victim.p = q.p;
    q.blocker.job = (ferry_job){ .fn = gate_job, .arg = &q.blocker.s, .interrupt = hook };
    q.victim.job = (ferry_job){ .fn = queued_job, .arg = &q.victim.s, .interrupt = hook };
    q.victim.status = 12345;
    cr_assert_eq(tu_run(queued_main, &q), 0);
    ferry_pool_free(q.p);
    cr_assert_eq(q.victim.rc, -ECANCELED, "rc %d", q.victim.rc);
    cr_assert_eq(q.victim.status, 12345, "*job_status untouched when fn never ran");
    cr_assert_eq(atomic_load(&ran_queued), 0);
    cr_assert_eq(atomic_load(&q.victim.s.hook_calls), 0);
    cr_assert_eq(q.blocker.rc, 0);
    cr_assert_eq(q.blocker.status, 3);
    cr_assert_eq(atomic_load(&q.blocker.s.hook_calls), 0);
}

/* A job that returns -ECANCELED and a result of its own, uncancelled. */
static int own_ecanceled_job(void *arg, void **result)
{
    *result = (void *)((uintptr_t)arg + 1);
    return -ECANCELED;
}

static int own_status_task(void *arg)
{
    struct call *c = arg;

    c->rc = ferry_to_thread_ex(c->p, &c->job, &c->status, &c->result);
    return 0;
}

Test(job, job_returning_ecanceled_is_not_a_cancellation_and_the_wide_result_comes_back,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct call c = {0};

    c.job = (ferry_job){ .fn = own_ecanceled_job, .arg = (void *)(uintptr_t)0xfeedface0000 };
    cr_assert_eq(tu_run(own_status_task, &c), 0);
    cr_assert_eq(c.rc, 0, "ferry's status: %d", c.rc);
    cr_assert_eq(c.status, -ECANCELED, "the job's status: %d", c.status);
    cr_assert_eq((uintptr_t)c.result, (uintptr_t)0xfeedface0001);
}

/* The job ends first; the task is cancelled afterwards: no hook. */
static atomic_int qgate;

static int quick_job(void *arg, void **result)
{
    struct seen *s = arg;

    (void)result;
    atomic_store(&s->entered, 1);
    tu_spin_until(&qgate);
    atomic_store(&s->job_ended, 1);
    return 5;
}

static int ended_first_main(void *arg)
{
    struct call *c = arg;
    ferry_task *t;

    ferry_task_spawn(&t, NULL, call_task, c, NULL);
    tu_task_wait_flag(&c->s.entered);
    /* Block the loop thread from here on, so that the job's completion
     * stays in the inbox: the cancellation then interrupts a task whose
     * job has ended but whose end it has not been told. */
    atomic_store(&qgate, 1);
    tu_spin_until(&c->s.job_ended);
    usleep(2000);
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    return 0;
}

Test(job, hook_not_called_when_the_job_ended_first,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct call c = {0};

    cr_assert_eq(ferry_pool_new(&c.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    c.job = (ferry_job){ .fn = quick_job, .arg = &c.s, .interrupt = hook };
    cr_assert_eq(tu_run(ended_first_main, &c), 0);
    ferry_pool_free(c.p);
    cr_assert_eq(c.rc, 0);
    cr_assert_eq(c.status, 5);
    cr_assert_eq(atomic_load(&c.s.hook_calls), 0);
}

static int plain_job(void *arg)
{
    int *out = arg;

    out[0] = ferry_job_cancelled();
    out[1] = ferry_job_deadline() == FERRY_NEVER;
    return 0;
}

static int nothing_job(void *arg, void **result)
{
    (void)arg;
    (void)result;
    return 0;
}

static int bad_input_task(void *arg)
{
    int *rcs = arg;
    int st;
    ferry_job nofn = { .fn = NULL };
    ferry_job ok = { .fn = nothing_job };

    rcs[0] = ferry_to_thread_ex(NULL, NULL, &st, NULL);
    rcs[1] = ferry_to_thread_ex(NULL, &nofn, &st, NULL);
    rcs[2] = ferry_to_thread_ex(NULL, &ok, NULL, NULL);
    rcs[3] = ferry_to_thread_ex(NULL, &ok, &st, NULL);   /* result optional */
    return 0;
}

Test(job, bad_input_and_outside_a_job,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    int rcs[4] = {1, 1, 1, 1}, seen[2] = {-1, -1}, st;
    ferry_job ok = { .fn = nothing_job };

    cr_assert_eq(tu_run(bad_input_task, rcs), 0);
    cr_assert_eq(rcs[0], -EINVAL);
    cr_assert_eq(rcs[1], -EINVAL);
    cr_assert_eq(rcs[2], -EINVAL);
    cr_assert_eq(rcs[3], 0);
    cr_assert_eq(ferry_to_thread_ex(NULL, &ok, &st, NULL), -EPERM);
    cr_assert(!ferry_job_cancelled());
    cr_assert_eq(ferry_job_deadline(), FERRY_NEVER);
    cr_assert_eq(ferry_job_cancel_fd(), -EPERM);
    /* A plain ferry_to_thread job is no ex job. */
    cr_assert_eq(ferry_pool_submit(NULL, plain_job, seen, NULL, NULL, NULL), 0);
    for (int i = 0; i < 5000 && seen[1] == -1; i++)
        usleep(1000);
    cr_assert_eq(seen[0], 0);
    cr_assert_eq(seen[1], 1);
}

/* ---- withdrawing a submitted job ------------------------------------------ */

static atomic_int tgate, tgate_entered, t_fn_runs, t_done_calls, t_done_status;

static int t_gate_job(void *arg)
{
    (void)arg;
    atomic_store(&tgate_entered, 1);
    tu_spin_until(&tgate);
    return 0;
}

static int t_job(void *arg)
{
    (void)arg;
    atomic_fetch_add(&t_fn_runs, 1);
    return 9;
}

static int t_done(void *arg, int status)
{
    (void)arg;
    atomic_store(&t_done_status, status);
    atomic_fetch_add(&t_done_calls, 1);
    return 0;
}

Test(job, withdraw_in_each_state,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_pool *p;
    ferry_ticket *running, *queued, *done;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(ferry_pool_submit_ticket(p, t_gate_job, NULL, NULL, NULL, NULL, &running), 0);
    tu_spin_until(&tgate_entered);
    /* On tu_loop: the withdrawal must also let go of the loop. */
    cr_assert_eq(ferry_pool_submit_ticket(p, t_job, NULL, tu_loop, t_done, NULL, &queued), 0);
    cr_assert_eq(ferry_ticket_withdraw(running), -EBUSY);
    cr_assert_eq(ferry_ticket_withdraw(queued), 0);
    cr_assert_eq(ferry_ticket_withdraw(queued), -EALREADY, "twice");
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.queued, 0);
    cr_assert_eq(st.cancelled, 1);
    atomic_store(&tgate, 1);
    cr_assert_eq(ferry_pool_submit_ticket(p, t_job, NULL, tu_loop, t_done, NULL, &done), 0);
    /* Runs until nothing keeps tu_loop: only `done`'s completion does. */
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(atomic_load(&t_fn_runs), 1, "the withdrawn job never ran");
    cr_assert_eq(atomic_load(&t_done_calls), 1, "done only for the job that ran");
    cr_assert_eq(atomic_load(&t_done_status), 9);
    cr_assert_eq(ferry_ticket_withdraw(done), -EALREADY);
    cr_assert_eq(ferry_ticket_withdraw(NULL), -EINVAL);
    ferry_ticket_free(running);
    ferry_ticket_free(queued);
    ferry_ticket_free(done);
    ferry_ticket_free(NULL);
    ferry_pool_free(p);
}

Test(job, ticket_outlives_its_job_and_its_pool,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_pool *p;
    ferry_ticket *blocker, *dropped, *bad = (ferry_ticket *)&bad;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(ferry_pool_submit_ticket(p, NULL, NULL, NULL, NULL, NULL, &bad), -EINVAL);
    cr_assert_null(bad, "*out is NULL on an error");
    cr_assert_eq(ferry_pool_submit_ticket(p, t_job, NULL, NULL, NULL, NULL, NULL), -EINVAL);
    atomic_store(&tgate, 1);
    cr_assert_eq(ferry_pool_submit_ticket(p, t_gate_job, NULL, NULL, NULL, NULL, &blocker), 0);
    cr_assert_eq(ferry_pool_submit_ticket(p, t_job, NULL, NULL, t_done, NULL, &dropped), 0);
    ferry_pool_free(p);   /* `dropped` ran, or was dropped with -ECANCELED */
    cr_assert_eq(atomic_load(&t_done_calls), 1);
    cr_assert_eq(ferry_ticket_withdraw(dropped), -EALREADY);
    cr_assert_eq(ferry_ticket_withdraw(blocker), -EALREADY);
    ferry_ticket_free(dropped);
    ferry_ticket_free(blocker);
}

/* ---- CPU-bound work that cannot be interrupted (docs/wrapping.md) -------- */

/* A password hash stands for work with no way to stop it from outside:
 * abandoned, it keeps its pool thread until it ends.  Two ways to keep a
 * pool from filling up with work nobody waits for any more. */
enum { HASH_CHUNKS = 20000 };

struct hash_job {
    atomic_int entered;       /* the job started */
    atomic_int chunks;        /* chunks done */
    atomic_int release;       /* ends the bounded test's jobs */
    atomic_int running;       /* jobs running now */
    atomic_int most;          /* the most that ran at once */
    atomic_int runs;          /* jobs started */
};

/* One chunk of the hash: short enough that stopping between two is
 * prompt, long enough to be work. */
static void hash_chunk(void)
{
    volatile uint64_t h = 1469598103934665603ull;

    for (int i = 0; i < 2000; i++)
        h = (h ^ (uint64_t)i) * 1099511628211ull;
}

/* Split into chunks: between two, the job asks whether its caller is
 * still there, and reports that it stopped in its own status. */
static int chunked_hash(void *arg, void **result)
{
    struct hash_job *h = arg;

    (void)result;
    atomic_store(&h->entered, 1);
    for (int i = 0; i < HASH_CHUNKS; i++) {
        if (ferry_job_cancelled())
            return -ECANCELED;
        hash_chunk();
        atomic_fetch_add(&h->chunks, 1);
        if (i == 0)
            usleep(1000);    /* time for the test to cancel its caller */
    }
    return 0;
}

struct hash_call {
    ferry_pool      *pool;
    struct hash_job *h;
    int              rc;
    int              job_status;
};

static int chunked_hash_task(void *arg)
{
    struct hash_call *c = arg;
    ferry_job job = { .fn = chunked_hash, .arg = c->h };

    c->rc = ferry_to_thread_ex(c->pool, &job, &c->job_status, NULL);
    return 0;
}

static int seven_job(void *arg)
{
    (void)arg;
    return 7;
}

static int chunked_main(void *arg)
{
    struct hash_call *c = arg;
    ferry_task *t;
    int rc;

    c->rc = c->job_status = 1;
    if (ferry_task_spawn(&t, NULL, chunked_hash_task, c, NULL))
        return -1;
    rc = tu_task_wait_flag(&c->h->entered);
    if (rc)
        return rc;
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    /* The pool's only thread is free again. */
    return ferry_to_thread(c->pool, seven_job, NULL);
}

Test(job, a_cpu_bound_job_in_chunks_stops_at_the_next_chunk_and_frees_its_thread,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct hash_job h = {0};
    struct hash_call c = { .h = &h };

    cr_assert_eq(ferry_pool_new(&c.pool, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(chunked_main, &c), 7);
    cr_assert_eq(c.rc, 0, "the job ran: %d", c.rc);
    cr_assert_eq(c.job_status, -ECANCELED, "the job reported that it stopped: %d", c.job_status);
    cr_assert_lt(atomic_load(&h.chunks), HASH_CHUNKS, "the job did all its chunks");
    ferry_pool_free(c.pool);
}

/* Whole, waited for, at most `permits` at once: the wait for a permit is
 * where callers queue, and leaving it costs nothing. */
static int whole_hash(void *arg)
{
    struct hash_job *h = arg;
    int now = atomic_fetch_add(&h->running, 1) + 1;

    atomic_fetch_add(&h->runs, 1);
    for (int most = atomic_load(&h->most); now > most &&
         !atomic_compare_exchange_weak(&h->most, &most, now);)
        ;
    atomic_store(&h->entered, 1);
    while (!atomic_load(&h->release))
        usleep(200);
    hash_chunk();
    atomic_fetch_sub(&h->running, 1);
    return 0;
}

struct bounded {
    ferry_pool      *pool;
    ferry_sem        permits;
    struct hash_job *h;
    int              rc[4];
};

static int bounded_hash(ferry_pool *pool, ferry_sem *permits, struct hash_job *h)
{
    int rc = ferry_sem_acquire(permits);

    if (rc)
        return rc;                /* never started: nothing to wait for */
    rc = ferry_to_thread(pool, whole_hash, h);
    ferry_sem_release(permits);
    return rc;
}

static struct bounded *bd;

static int bounded_task(void *arg)
{
    int i = (int)(intptr_t)arg;

    bd->rc[i] = bounded_hash(bd->pool, &bd->permits, bd->h);
    return 0;
}

static int bounded_main(void *arg)
{
    ferry_task *t[4];
    int rc;

    (void)arg;
    for (int i = 0; i < 4; i++)
        if (ferry_task_spawn(&t[i], NULL, bounded_task, (void *)(intptr_t)i, NULL))
            return -1;
    rc = tu_task_wait_flag(&bd->h->entered);
    if (rc)
        return rc;
    for (int i = 1; i < 4; i++)         /* they wait for a permit */
        ferry_task_cancel(t[i]);
    for (int i = 1; i < 4; i++)
        ferry_task_join(t[i], NULL);
    atomic_store(&bd->h->release, 1);
    ferry_task_join(t[0], NULL);
    return 0;
}

Test(job, a_semaphore_around_to_thread_bounds_the_jobs_and_callers_leave_its_queue_for_free,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct hash_job h = {0};
    struct bounded b = { .h = &h };

    bd = &b;
    cr_assert_eq(ferry_pool_new(&b.pool, &(ferry_pool_opts){ .threads = 4 }), 0);
    cr_assert_eq(ferry_sem_init(&b.permits, 1, 0), 0);
    cr_assert_eq(tu_run(bounded_main, NULL), 0);
    cr_assert_eq(b.rc[0], 0);
    for (int i = 1; i < 4; i++)
        cr_assert_eq(b.rc[i], -ECANCELED, "caller %d: %d", i, b.rc[i]);
    cr_assert_eq(atomic_load(&h.runs), 1, "a cancelled caller's job ran");
    cr_assert_eq(atomic_load(&h.most), 1);
    cr_assert_eq(ferry_sem_destroy(&b.permits), 0);
    ferry_pool_free(b.pool);
}
