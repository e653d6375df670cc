/* test_signal.c - signal subscriptions (ferry/signal.h) and
 * ferry_wait_signal(): deliveries kept while nobody waits, counted, seen by
 * every loop, never taken by pool threads; all-or-nothing receives; the
 * disposition put back; bad input.
 *
 * Every receive that a broken implementation could leave hanging runs
 * under a deadline scope, so the test reports -ETIMEDOUT instead of hitting
 * the runner's timeout.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>
#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"

#define T(name) Test(signal, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

static const int usr1[] = { SIGUSR1 };

/* libevent's allocations go through the fault hook too, so that a test can
 * fail the registration of a wait. */
__attribute__((constructor)) static void route_libevent(void)
{
    tu_libevent_fault_hook(NULL);
}

/* ---- helpers --------------------------------------------------------------- */

/* Runs of the application's own handler, per signal. */
static volatile sig_atomic_t app_hits[NSIG];

static void app_handler(int signum)
{
    app_hits[signum]++;
}

static void set_disposition(int signum, void (*handler)(int))
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(signum, &sa, NULL), 0);
}

static void (*disposition(int signum))(int)
{
    struct sigaction sa;

    cr_assert_eq(sigaction(signum, NULL, &sa), 0);
    return sa.sa_handler;
}

/* ferry_sigsub_recv() under a deadline of `ms` (scaled). */
static int recv_within(ferry_sigsub *sub, int *signum, int64_t ms)
{
    ferry_scope s;
    int rc;

    ferry_scope_enter(&s, ferry_now() + tu_ms(ms), 0);
    rc = ferry_sigsub_recv(sub, signum);
    ferry_scope_exit(&s);
    return rc;
}

/* Receives `n` deliveries of `sub`, each under a deadline. */
struct rx {
    ferry_sigsub *sub;
    int           n;
    int64_t       ms;     /* deadline of each receive; 0: 2 s */
    int           rc[8];
    int           sig[8];
};

static int recv_n_task(void *arg)
{
    struct rx *r = arg;

    for (int i = 0; i < r->n; i++)
        r->rc[i] = recv_within(r->sub, &r->sig[i], r->ms ? r->ms : 2000);
    return 0;
}

static ferry_sigsub *new_sub(ferry_loop *loop, const int *signums, size_t n)
{
    ferry_sigsub *sub = NULL;

    cr_assert_eq(ferry_sigsub_new(&sub, loop, signums, n), 0);
    cr_assert_not_null(sub);
    return sub;
}

/* ---- kept, counted, ordered ------------------------------------------------- */

T(a_signal_raised_while_nobody_waits_is_received_later)
{
    ferry_sigsub *sub;
    struct rx r = { .n = 1 };
    int signum;

    /* The default action of SIGUSR1 ends the process: the subscription
     * must keep the delivery instead. */
    set_disposition(SIGUSR1, SIG_DFL);
    sub = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(raise(SIGUSR1), 0);
    r.sub = sub;
    cr_assert_eq(tu_run(recv_n_task, &r), 0);
    cr_assert_eq(r.rc[0], 0, "receive returned %d", r.rc[0]);
    cr_assert_eq(r.sig[0], SIGUSR1);
    cr_assert_eq(ferry_sigsub_try_recv(sub, &signum), -EAGAIN);
    cr_assert_eq(ferry_sigsub_free(sub), 0);
    cr_assert_eq(disposition(SIGUSR1), SIG_DFL);
}

T(three_signals_raised_before_a_receive_are_received_three_times)
{
    ferry_sigsub *sub;
    struct rx r = { .n = 3 };
    int signum;

    set_disposition(SIGUSR1, SIG_DFL);
    sub = new_sub(tu_loop, usr1, 1);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(raise(SIGUSR1), 0);
    r.sub = sub;
    cr_assert_eq(tu_run(recv_n_task, &r), 0);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r.rc[i], 0, "receive %d returned %d", i, r.rc[i]);
        cr_assert_eq(r.sig[i], SIGUSR1);
    }
    cr_assert_eq(ferry_sigsub_try_recv(sub, &signum), -EAGAIN, "a fourth delivery appeared");
    cr_assert_eq(ferry_sigsub_free(sub), 0);
}

T(signals_come_in_the_order_seen_and_a_flood_does_not_hold_others_back)
{
    static const int both[] = { SIGUSR2, SIGUSR1, SIGUSR2 };   /* a repeat is allowed */
    static const int hup[] = { SIGHUP };
    ferry_sigsub *sub, *other;
    int got[6], n = 0, signum;

    set_disposition(SIGHUP, SIG_IGN);
    sub = new_sub(tu_loop, both, 3);
    other = new_sub(tu_loop, hup, 1);
    /* Seen at different times: SIGUSR2 first (a look of the loop in
     * between, through the other subscription), then SIGUSR1. */
    raise(SIGUSR2);
    cr_assert_eq(ferry_sigsub_try_recv(other, &signum), -EAGAIN);
    raise(SIGUSR1);
    while (n < 6 && ferry_sigsub_try_recv(sub, &signum) == 0)
        got[n++] = signum;
    cr_assert_eq(n, 2);
    cr_assert_eq(got[0], SIGUSR2);
    cr_assert_eq(got[1], SIGUSR1);
    /* Seen together: lowest number first; three of SIGUSR1 take turns with
     * the one SIGUSR2. */
    raise(SIGUSR2);
    for (int i = 0; i < 3; i++)
        raise(SIGUSR1);
    n = 0;
    while (n < 6 && ferry_sigsub_try_recv(sub, &signum) == 0)
        got[n++] = signum;
    cr_assert_eq(n, 4);
    cr_assert_eq(got[0], SIGUSR1);
    cr_assert_eq(got[1], SIGUSR2);
    cr_assert_eq(got[2], SIGUSR1);
    cr_assert_eq(got[3], SIGUSR1);
    cr_assert_eq(ferry_sigsub_free(other), 0);
    cr_assert_eq(ferry_sigsub_free(sub), 0);
}

T(every_subscription_of_one_loop_sees_each_delivery)
{
    ferry_sigsub *a, *b;
    int sa = 0, sb = 0;

    a = new_sub(tu_loop, usr1, 1);
    b = new_sub(tu_loop, usr1, 1);
    raise(SIGUSR1);
    cr_assert_eq(ferry_sigsub_try_recv(a, &sa), 0);
    cr_assert_eq(ferry_sigsub_try_recv(b, &sb), 0);
    cr_assert_eq(sa, SIGUSR1);
    cr_assert_eq(sb, SIGUSR1);
    cr_assert_eq(ferry_sigsub_try_recv(a, &sa), -EAGAIN);
    cr_assert_eq(ferry_sigsub_try_recv(b, &sb), -EAGAIN);
    /* A subscription made after a delivery does not get it. */
    raise(SIGUSR1);
    ferry_sigsub_free(b);
    b = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(ferry_sigsub_try_recv(b, &sb), -EAGAIN);
    cr_assert_eq(ferry_sigsub_try_recv(a, &sa), 0);
    cr_assert_eq(ferry_sigsub_free(a), 0);
    cr_assert_eq(ferry_sigsub_free(b), 0);
}

/* ---- several loops, several threads -------------------------------------------- */

struct peer {
    atomic_int ready;    /* subscribed (or waiting in ferry_wait_signal) */
    int        rc;       /* the receive's result */
    int        sig;      /* what it received */
};

static void *sigsub_peer(void *arg)
{
    struct peer *p = arg;
    ferry_loop *loop;
    ferry_sigsub *sub;
    ferry_task *t;
    struct rx r = { .n = 1 };
    int st;

    p->rc = ferry_loop_new(&loop, NULL);
    if (p->rc) {
        atomic_store(&p->ready, 1);
        return NULL;
    }
    p->rc = ferry_sigsub_new(&sub, loop, usr1, 1);
    atomic_store(&p->ready, 1);
    if (p->rc == 0) {
        r.sub = sub;
        r.rc[0] = -12345;
        ferry_task_spawn(&t, loop, recv_n_task, &r, NULL);
        while (ferry_task_try_join(t, &st) == -EAGAIN)
            ferry_loop_run(loop, FERRY_RUN_DEFAULT);
        p->rc = r.rc[0];
        p->sig = r.sig[0];
        ferry_sigsub_free(sub);
    }
    ferry_loop_free(loop);
    return NULL;
}

T(two_loops_on_two_threads_both_see_one_kill)
{
    struct peer a = { .rc = -1 }, b = { .rc = -1 };
    pthread_t ta, tb;

    set_disposition(SIGUSR1, SIG_DFL);
    ta = tu_start_thread(sigsub_peer, &a);
    tb = tu_start_thread(sigsub_peer, &b);
    tu_spin_until(&a.ready);
    tu_spin_until(&b.ready);
    cr_assert_eq(kill(getpid(), SIGUSR1), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(a.rc, 0, "loop A: %d", a.rc);
    cr_assert_eq(b.rc, 0, "loop B: %d", b.rc);
    cr_assert_eq(a.sig, SIGUSR1);
    cr_assert_eq(b.sig, SIGUSR1);
    cr_assert_eq(disposition(SIGUSR1), SIG_DFL);
}

/* ferry_wait_signal() under a deadline, so a loop that is never woken
 * reports -ETIMEDOUT instead of hanging. */
static int wait_signal_task(void *arg)
{
    struct peer *p = arg;
    ferry_scope s;

    ferry_scope_enter(&s, ferry_now() + tu_ms(2000), 0);
    p->rc = ferry_wait_signal(SIGUSR1);
    ferry_scope_exit(&s);
    return 0;
}

/* Spawned after wait_signal_task: runs once that one waits. */
static int ready_task(void *arg)
{
    struct peer *p = arg;

    atomic_store(&p->ready, 1);
    return 0;
}

static void *wait_signal_peer(void *arg)
{
    struct peer *p = arg;
    ferry_loop *loop;

    if (ferry_loop_new(&loop, NULL) != 0) {
        atomic_store(&p->ready, 1);
        return NULL;
    }
    ferry_task_spawn(NULL, loop, wait_signal_task, p, NULL);
    ferry_task_spawn(NULL, loop, ready_task, p, NULL);
    ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    ferry_loop_free(loop);
    return NULL;
}

T(wait_signal_on_two_loops_wakes_both)
{
    struct peer a = { .rc = -1 }, b = { .rc = -1 };
    pthread_t ta, tb;

    set_disposition(SIGUSR1, app_handler);
    ta = tu_start_thread(wait_signal_peer, &a);
    tb = tu_start_thread(wait_signal_peer, &b);
    tu_spin_until(&a.ready);
    tu_spin_until(&b.ready);
    cr_assert_eq(kill(getpid(), SIGUSR1), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    fprintf(stderr, "wait_signal on two loops, one kill(): loop A %d, loop B %d\n", a.rc, b.rc);
    cr_assert_eq(a.rc, 0, "loop A: %d", a.rc);
    cr_assert_eq(b.rc, 0, "loop B: %d", b.rc);
    cr_assert_eq(app_hits[SIGUSR1], 0, "the delivery also reached the old handler");
    cr_assert_eq(disposition(SIGUSR1), app_handler);
}

/* ---- pool threads ------------------------------------------------------------ */

struct job {
    int  blocked;        /* SIGUSR1 and SIGTERM blocked, SIGSEGV not */
    int  kill_rc;
    int  hits_after;     /* app_hits[SIGUSR2] right after raise() */
    int  pending;        /* SIGUSR2 pending on the job's thread after raise() */
    int  taken;          /* sigtimedwait() took it back */
};

static int mask_and_kill_job(void *arg)
{
    struct job *j = arg;
    sigset_t cur;

    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    j->blocked = sigismember(&cur, SIGUSR1) == 1 && sigismember(&cur, SIGTERM) == 1 &&
                 sigismember(&cur, SIGSEGV) == 0;
    j->kill_rc = kill(getpid(), SIGUSR1);
    return 0;
}

struct pool_rx {
    ferry_pool   *pool;
    ferry_sigsub *sub;
    struct job    job;
    int           job_rc;
    int           rc;
    int           sig;
};

static int offload_kill_task(void *arg)
{
    struct pool_rx *p = arg;

    p->job_rc = ferry_to_thread(p->pool, mask_and_kill_job, &p->job);
    p->rc = recv_within(p->sub, &p->sig, 2000);
    return 0;
}

T(pool_threads_never_take_a_signal_and_a_kill_from_a_job_reaches_the_loop)
{
    struct pool_rx p = { .rc = -1 };

    set_disposition(SIGUSR1, SIG_DFL);
    cr_assert_eq(ferry_pool_new(&p.pool, &(ferry_pool_opts){ .threads = 1 }), 0);
    p.sub = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(tu_run(offload_kill_task, &p), 0);
    cr_assert_eq(p.job_rc, 0);
    cr_assert(p.job.blocked, "a pool thread does not block SIGUSR1 and SIGTERM (or blocks SIGSEGV)");
    cr_assert_eq(p.job.kill_rc, 0);
    cr_assert_eq(p.rc, 0, "the loop did not receive the job's kill(): %d", p.rc);
    cr_assert_eq(p.sig, SIGUSR1);
    cr_assert_eq(ferry_sigsub_free(p.sub), 0);
    ferry_pool_free(p.pool);
}

static int raise_job(void *arg)
{
    struct job *j = arg;
    sigset_t set, only;
    struct timespec zero = { 0, 0 };

    raise(SIGUSR2);
    j->hits_after = app_hits[SIGUSR2];
    sigpending(&set);
    j->pending = sigismember(&set, SIGUSR2) == 1;
    sigemptyset(&only);
    sigaddset(&only, SIGUSR2);
    j->taken = sigtimedwait(&only, NULL, &zero) == SIGUSR2;
    return 0;
}

static int offload_raise_task(void *arg)
{
    struct pool_rx *p = arg;

    p->job_rc = ferry_to_thread(p->pool, raise_job, &p->job);
    return 0;
}

T(raise_in_a_job_is_not_handled_on_the_pool_thread)
{
    struct pool_rx p = { .rc = -1 };

    /* raise() targets the calling thread.  On a pool thread the signal
     * stays pending there: no handler runs on it. */
    set_disposition(SIGUSR2, app_handler);
    cr_assert_eq(ferry_pool_new(&p.pool, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(offload_raise_task, &p), 0);
    cr_assert_eq(p.job_rc, 0);
    cr_assert_eq(p.job.hits_after, 0, "the handler ran on the pool thread");
    cr_assert(p.job.pending, "SIGUSR2 is not pending on the pool thread");
    cr_assert(p.job.taken);
    ferry_pool_free(p.pool);
    cr_assert_eq(app_hits[SIGUSR2], 0);
}

/* ---- a second SIGTERM ------------------------------------------------------------ */

struct term {
    ferry_sigsub *sub;
    int rc1, sig1, rc2, sig2;
};

static int sigterm_service_task(void *arg)
{
    struct term *t = arg;

    t->rc1 = recv_within(t->sub, &t->sig1, 2000);
    /* Handling the first SIGTERM (draining): no task waits for signals
     * while a second one arrives. */
    raise(SIGTERM);
    ferry_sleep(tu_ms(5));
    t->rc2 = recv_within(t->sub, &t->sig2, 2000);
    return 0;
}

T(a_second_sigterm_while_the_first_is_handled_is_counted_not_fatal)
{
    static const int term[] = { SIGTERM };
    struct term t = { .rc1 = -1, .rc2 = -1 };
    int signum;

    set_disposition(SIGTERM, SIG_DFL);
    t.sub = new_sub(tu_loop, term, 1);
    raise(SIGTERM);
    cr_assert_eq(tu_run(sigterm_service_task, &t), 0);
    cr_assert_eq(t.rc1, 0);
    cr_assert_eq(t.sig1, SIGTERM);
    cr_assert_eq(t.rc2, 0, "the second SIGTERM was not received: %d", t.rc2);
    cr_assert_eq(t.sig2, SIGTERM);
    cr_assert_eq(ferry_sigsub_try_recv(t.sub, &signum), -EAGAIN);
    cr_assert_eq(ferry_sigsub_free(t.sub), 0);
    cr_assert_eq(disposition(SIGTERM), SIG_DFL);
}

/* ---- cancellation and deadlines ------------------------------------------------------ */

static struct {
    ferry_sigsub *sub;
    int rc[2], sig[2], try1, try2, try3, sig2;
} cx;

static int waiter_task(void *arg)
{
    int i = (int)(intptr_t)arg;

    cx.rc[i] = recv_within(cx.sub, &cx.sig[i], 2000);
    return 0;
}

/* A waiter is promised the delivery, then cancelled before it runs. */
static int cancel_after_grant_task(void *arg)
{
    ferry_task *w;
    int x;

    (void)arg;
    ferry_task_spawn(&w, NULL, waiter_task, (void *)0, NULL);
    ferry_yield();                                 /* it waits now */
    raise(SIGUSR1);
    cx.try1 = ferry_sigsub_try_recv(cx.sub, &x);   /* the loop looks: promised to w */
    ferry_task_cancel(w);
    ferry_task_join(w, NULL);
    cx.try2 = ferry_sigsub_try_recv(cx.sub, &cx.sig2);
    cx.try3 = ferry_sigsub_try_recv(cx.sub, &x);
    return 0;
}

T(a_receive_cancelled_after_the_delivery_was_promised_takes_nothing)
{
    set_disposition(SIGUSR1, SIG_DFL);
    memset(&cx, 0, sizeof cx);
    cx.sub = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(tu_run(cancel_after_grant_task, NULL), 0);
    cr_assert_eq(cx.rc[0], -ECANCELED);
    cr_assert_eq(cx.try1, -EAGAIN, "the promised delivery was not held for the waiter");
    cr_assert_eq(cx.try2, 0, "the cancelled waiter took the delivery");
    cr_assert_eq(cx.sig2, SIGUSR1);
    cr_assert_eq(cx.try3, -EAGAIN);
    cr_assert_eq(ferry_sigsub_free(cx.sub), 0);
}

/* Two waiters; the first is promised the delivery and cancelled: it goes
 * to the second. */
static int pass_on_task(void *arg)
{
    ferry_task *w0, *w1;
    int x;

    (void)arg;
    ferry_task_spawn(&w0, NULL, waiter_task, (void *)0, NULL);
    ferry_task_spawn(&w1, NULL, waiter_task, (void *)1, NULL);
    ferry_yield();
    raise(SIGUSR1);
    cx.try1 = ferry_sigsub_try_recv(cx.sub, &x);
    ferry_task_cancel(w0);
    ferry_task_join(w0, NULL);
    ferry_task_join(w1, NULL);
    cx.try2 = ferry_sigsub_try_recv(cx.sub, &x);
    return 0;
}

T(a_cancelled_waiter_passes_its_delivery_to_the_next)
{
    set_disposition(SIGUSR1, SIG_DFL);
    memset(&cx, 0, sizeof cx);
    cx.sub = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(tu_run(pass_on_task, NULL), 0);
    cr_assert_eq(cx.try1, -EAGAIN);
    cr_assert_eq(cx.rc[0], -ECANCELED);
    cr_assert_eq(cx.rc[1], 0, "the second waiter got %d", cx.rc[1]);
    cr_assert_eq(cx.sig[1], SIGUSR1);
    cr_assert_eq(cx.try2, -EAGAIN, "received twice");
    cr_assert_eq(ferry_sigsub_free(cx.sub), 0);
}

static int cancel_waiting_task(void *arg)
{
    ferry_task *w;
    int x;

    (void)arg;
    ferry_task_spawn(&w, NULL, waiter_task, (void *)0, NULL);
    ferry_yield();
    ferry_task_cancel(w);
    ferry_task_join(w, NULL);
    raise(SIGUSR1);
    /* A cancelled task's receive takes nothing, even with one pending. */
    ferry_task_cancel(ferry_task_current());
    cx.rc[1] = ferry_sigsub_recv(cx.sub, &x);
    cx.try2 = ferry_sigsub_try_recv(cx.sub, &cx.sig2);
    return 0;
}

T(a_receive_cancelled_while_waiting_and_one_that_times_out_take_nothing)
{
    struct rx r = { .n = 1, .ms = 20 };
    int signum;

    set_disposition(SIGUSR1, SIG_DFL);
    memset(&cx, 0, sizeof cx);
    cx.sub = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(tu_run(cancel_waiting_task, NULL), 0);
    cr_assert_eq(cx.rc[0], -ECANCELED);
    cr_assert_eq(cx.rc[1], -ECANCELED);
    cr_assert_eq(cx.try2, 0);
    cr_assert_eq(cx.sig2, SIGUSR1);
    /* A deadline: nothing comes within it. */
    r.sub = cx.sub;
    cr_assert_eq(tu_run(recv_n_task, &r), 0);
    cr_assert_eq(r.rc[0], -ETIMEDOUT);
    raise(SIGUSR1);
    cr_assert_eq(ferry_sigsub_try_recv(cx.sub, &signum), 0);
    cr_assert_eq(signum, SIGUSR1);
    cr_assert_eq(ferry_sigsub_free(cx.sub), 0);
}

/* ---- bad input and the wrong thread ------------------------------------------------------ */

static int bad_in_task(void *arg)
{
    int *rc = arg, x;

    rc[0] = ferry_wait_signal(SIGSEGV);
    rc[1] = ferry_wait_signal(SIGKILL);
    rc[2] = ferry_wait_signal(0);
    rc[3] = ferry_sigsub_recv(NULL, &x);
    rc[4] = ferry_sigsub_recv(cx.sub, NULL);
    return 0;
}

static int other_loop_recv_task(void *arg)
{
    int x;

    *(int *)arg = ferry_sigsub_recv(cx.sub, &x);
    return 0;
}

struct wrong_thread {
    ferry_sigsub *sub;
    int new_rc, new_null_rc, try_rc, free_rc, recv_rc;
};

static void *wrong_thread_fn(void *arg)
{
    struct wrong_thread *w = arg;
    ferry_sigsub *s = NULL;
    int x;

    w->new_rc = ferry_sigsub_new(&s, tu_loop, usr1, 1);
    w->new_null_rc = ferry_sigsub_new(&s, NULL, usr1, 1);   /* no loop on this thread */
    w->try_rc = ferry_sigsub_try_recv(w->sub, &x);
    w->recv_rc = ferry_sigsub_recv(w->sub, &x);
    w->free_rc = ferry_sigsub_free(w->sub);
    return NULL;
}

T(bad_input_and_the_wrong_thread_are_refused)
{
    static const int refused[] = { SIGKILL, SIGSTOP, 0, NSIG, -1, SIGSEGV, SIGBUS, SIGFPE, SIGILL };
    struct wrong_thread w;
    ferry_sigsub *sub = (ferry_sigsub *)&w;
    ferry_loop *other;
    ferry_task *t;
    int rc[5], x, st;

    set_disposition(SIGUSR1, app_handler);
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int one[] = { SIGUSR1, refused[i] };
        cr_assert_eq(ferry_sigsub_new(&sub, tu_loop, &refused[i], 1), -EINVAL,
                     "signal %d accepted", refused[i]);
        cr_assert_null(sub);
        cr_assert_eq(ferry_sigsub_new(&sub, tu_loop, one, 2), -EINVAL);
    }
    /* A number the C library keeps for itself: sigaction() refuses it
     * after SIGUSR1 was subscribed, which is undone. */
    {
        int one[] = { SIGUSR1, SIGRTMIN - 1 };
        cr_assert_eq(ferry_sigsub_new(&sub, tu_loop, one, 2), -EINVAL);
        cr_assert_eq(ferry_sigsub_new(&sub, tu_loop, &one[1], 1), -EINVAL);
        cr_assert_null(sub);
    }
    cr_assert_eq(disposition(SIGUSR1), app_handler, "a refused subscription changed SIGUSR1");
    cr_assert_eq(ferry_sigsub_new(NULL, tu_loop, usr1, 1), -EINVAL);
    cr_assert_eq(ferry_sigsub_new(&sub, tu_loop, NULL, 1), -EINVAL);
    cr_assert_eq(ferry_sigsub_new(&sub, tu_loop, usr1, 0), -EINVAL);
    cr_assert_eq(ferry_sigsub_try_recv(NULL, &x), -EINVAL);
    cr_assert_eq(ferry_sigsub_free(NULL), 0);

    memset(&cx, 0, sizeof cx);
    cx.sub = new_sub(NULL, usr1, 1);               /* NULL: this thread's loop */
    cr_assert_eq(ferry_sigsub_try_recv(cx.sub, NULL), -EINVAL);
    cr_assert_eq(ferry_sigsub_recv(cx.sub, &x), -EPERM, "a receive outside a task");
    cr_assert_eq(tu_run(bad_in_task, rc), 0);
    cr_assert_eq(rc[0], -EINVAL);
    cr_assert_eq(rc[1], -EINVAL);
    cr_assert_eq(rc[2], -EINVAL);
    cr_assert_eq(rc[3], -EINVAL);
    cr_assert_eq(rc[4], -EINVAL);

    /* A task of another loop (same thread). */
    cr_assert_eq(ferry_loop_new(&other, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&t, other, other_loop_recv_task, &rc[0], NULL), 0);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(other, FERRY_RUN_DEFAULT);
    cr_assert_eq(rc[0], -EPERM);
    ferry_loop_free(other);

    memset(&w, 0, sizeof w);
    w.sub = cx.sub;
    pthread_join(tu_start_thread(wrong_thread_fn, &w), NULL);
    cr_assert_eq(w.new_rc, -EPERM);
    cr_assert_eq(w.new_null_rc, -EINVAL);
    cr_assert_eq(w.try_rc, -EPERM);
    cr_assert_eq(w.recv_rc, -EPERM);
    cr_assert_eq(w.free_rc, -EPERM);
    cr_assert_eq(ferry_sigsub_free(cx.sub), 0);
    cr_assert_eq(disposition(SIGUSR1), app_handler);
}

/* ---- the disposition ----------------------------------------------------------------------- */

T(the_last_subscription_to_go_puts_the_old_disposition_back)
{
    ferry_loop *other;
    ferry_sigsub *a, *b, *c;

    set_disposition(SIGUSR1, app_handler);
    a = new_sub(tu_loop, usr1, 1);
    b = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(ferry_loop_new(&other, NULL), 0);
    c = new_sub(other, usr1, 1);
    cr_assert_neq(disposition(SIGUSR1), app_handler);
    cr_assert_eq(ferry_sigsub_free(a), 0);
    cr_assert_neq(disposition(SIGUSR1), app_handler);
    cr_assert_eq(ferry_sigsub_free(c), 0);
    cr_assert_neq(disposition(SIGUSR1), app_handler, "another loop's free took it back");
    cr_assert_eq(ferry_sigsub_free(b), 0);
    cr_assert_eq(disposition(SIGUSR1), app_handler);
    cr_assert_eq(app_hits[SIGUSR1], 0);

    set_disposition(SIGUSR1, SIG_IGN);
    a = new_sub(other, usr1, 1);
    cr_assert_eq(ferry_sigsub_free(a), 0);
    cr_assert_eq(disposition(SIGUSR1), SIG_IGN);
    ferry_loop_free(other);
}

T(deliveries_left_unreceived_by_the_last_subscription_are_raised_again)
{
    ferry_loop *other;
    ferry_sigsub *a, *b;
    int signum;

    set_disposition(SIGUSR1, app_handler);
    /* Two unreceived deliveries: raised again once, for the old handler. */
    a = new_sub(tu_loop, usr1, 1);
    raise(SIGUSR1);
    raise(SIGUSR1);
    cr_assert_eq(app_hits[SIGUSR1], 0);
    cr_assert_eq(ferry_sigsub_free(a), 0);
    cr_assert_eq(app_hits[SIGUSR1], 1);

    /* Received: nothing to raise. */
    a = new_sub(tu_loop, usr1, 1);
    raise(SIGUSR1);
    cr_assert_eq(ferry_sigsub_try_recv(a, &signum), 0);
    cr_assert_eq(ferry_sigsub_free(a), 0);
    cr_assert_eq(app_hits[SIGUSR1], 1);

    /* Only the last subscription to go raises it: the other one had it. */
    cr_assert_eq(ferry_loop_new(&other, NULL), 0);
    a = new_sub(tu_loop, usr1, 1);
    b = new_sub(other, usr1, 1);
    raise(SIGUSR1);
    cr_assert_eq(ferry_sigsub_free(a), 0);
    cr_assert_eq(app_hits[SIGUSR1], 1);
    cr_assert_eq(ferry_sigsub_free(b), 0);
    cr_assert_eq(app_hits[SIGUSR1], 2);
    ferry_loop_free(other);
}

static int waits_then_frees_task(void *arg)
{
    (void)arg;
    cx.rc[0] = recv_within(cx.sub, &cx.sig[0], 2000);
    cx.try3 = ferry_sigsub_free(cx.sub);
    return 0;
}

static int busy_free_task(void *arg)
{
    ferry_task *w;
    int x;

    (void)arg;
    ferry_task_spawn(&w, NULL, waits_then_frees_task, NULL, NULL);
    ferry_yield();
    cx.try1 = ferry_sigsub_free(cx.sub);      /* a task waits */
    raise(SIGUSR1);
    ferry_sigsub_try_recv(cx.sub, &x);         /* promised to the waiter, not run yet */
    cx.try2 = ferry_sigsub_free(cx.sub);
    return ferry_task_join(w, NULL);
}

T(a_subscription_a_task_waits_on_cannot_be_freed)
{
    set_disposition(SIGUSR1, SIG_DFL);
    memset(&cx, 0, sizeof cx);
    cx.sub = new_sub(tu_loop, usr1, 1);
    cr_assert_eq(tu_run(busy_free_task, NULL), 0);
    cr_assert_eq(cx.try1, -EBUSY);
    cr_assert_eq(cx.try2, -EBUSY, "freed while a woken waiter had not run");
    cr_assert_eq(cx.rc[0], 0);
    cr_assert_eq(cx.sig[0], SIGUSR1);
    cr_assert_eq(cx.try3, 0);
    cr_assert_eq(disposition(SIGUSR1), SIG_DFL);
}

/* ---- ferry_wait_signal ------------------------------------------------------------------- */

static int wait_once_task(void *arg)
{
    (void)arg;
    cx.rc[0] = ferry_wait_signal(SIGUSR1);
    return 0;
}

/* Raises twice while the waiter waits. */
static int merge_task(void *arg)
{
    ferry_task *w;

    (void)arg;
    ferry_task_spawn(&w, NULL, wait_once_task, NULL, NULL);
    ferry_yield();
    raise(SIGUSR1);
    raise(SIGUSR1);
    return ferry_task_join(w, NULL);
}

/* The waiter is promised a delivery (the loop looks through another
 * subscription), then cancelled. */
static int wait_cancel_task(void *arg)
{
    static const int usr2[] = { SIGUSR2 };
    ferry_sigsub *other;
    ferry_task *w;
    int x;

    (void)arg;
    ferry_task_spawn(&w, NULL, wait_once_task, NULL, NULL);
    ferry_yield();
    raise(SIGUSR1);
    if (ferry_sigsub_new(&other, NULL, usr2, 1) != 0)
        return -1;
    ferry_sigsub_try_recv(other, &x);
    ferry_task_cancel(w);
    ferry_task_join(w, NULL);
    return ferry_sigsub_free(other);
}

static void raise_usr1_cb(void *arg)
{
    (void)arg;
    raise(SIGUSR1);
}

T(wait_signal_merges_deliveries_during_its_wait_and_hands_back_an_unreceived_one)
{
    set_disposition(SIGUSR1, app_handler);
    memset(&cx, 0, sizeof cx);
    cr_assert_eq(tu_run(merge_task, NULL), 0);
    cr_assert_eq(cx.rc[0], 0);
    cr_assert_eq(app_hits[SIGUSR1], 0, "a delivery during the wait reached the old handler");
    cr_assert_eq(disposition(SIGUSR1), app_handler);

    /* Between waits the old disposition acts. */
    raise(SIGUSR1);
    cr_assert_eq(app_hits[SIGUSR1], 1);

    memset(&cx, 0, sizeof cx);
    cr_assert_eq(tu_run(wait_cancel_task, NULL), 0);
    cr_assert_eq(cx.rc[0], -ECANCELED);
    cr_assert_eq(app_hits[SIGUSR1], 2, "the delivery a cancelled wait did not take was lost");

    /* Still woken by a delivery from a callback. */
    memset(&cx, 0, sizeof cx);
    ferry_call_later(tu_loop, tu_ms(5), raise_usr1_cb, NULL, NULL);
    cr_assert_eq(tu_run(wait_once_task, NULL), 0);
    cr_assert_eq(cx.rc[0], 0);
    cr_assert_eq(app_hits[SIGUSR1], 2);
}

static int sig_main(void *arg)
{
    (void)arg;
    return ferry_wait_signal(SIGUSR1);
}

static void raise_usr1(void *arg)
{
    (void)arg;
    raise(SIGUSR1);
}

/* SIGUSR1's default action ends the process: the wait handles it. */
T(wait_signal_wakes_on_delivery)
{
    ferry_call_later(tu_loop, tu_ms(5), raise_usr1, NULL, NULL);
    cr_assert_eq(tu_run(sig_main, NULL), 0);
}

static int wait_rc[7];

static int wait_errors_task(void *arg)
{
    (void)arg;
    wait_rc[0] = ferry_wait_signal(0);
    wait_rc[1] = ferry_wait_signal(NSIG);
    wait_rc[2] = ferry_wait_signal(SIGKILL);       /* cannot be caught */
    wait_rc[3] = ferry_wait_signal(SIGSTOP);
    /* libevent cannot allocate the registration. */
    ferry__fault_arm(1, true);
    wait_rc[4] = ferry_wait_signal(SIGUSR2);
    ferry__fault_reset();
    ferry_task_cancel(ferry_task_current());
    wait_rc[5] = ferry_wait_signal(SIGUSR1);       /* cancelled: at once */
    return 0;
}

T(wait_signal_errors_wait_for_nothing)
{
    cr_assert_eq(tu_run(wait_errors_task, NULL), 0);
    cr_assert_eq(wait_rc[0], -EINVAL, "signal 0: %d", wait_rc[0]);
    cr_assert_eq(wait_rc[1], -EINVAL, "NSIG: %d", wait_rc[1]);
    cr_assert_eq(wait_rc[2], -EINVAL, "SIGKILL: %d", wait_rc[2]);
    cr_assert_eq(wait_rc[3], -EINVAL, "SIGSTOP: %d", wait_rc[3]);
    cr_assert_eq(wait_rc[4], -ENOMEM);
    cr_assert_eq(wait_rc[5], -ECANCELED);
}

/* ---- loops that end -------------------------------------------------------------------- */

T(freeing_the_loop_ends_its_subscriptions)
{
    ferry_loop *other;
    ferry_sigsub *sub;
    int signum;

    set_disposition(SIGUSR1, app_handler);
    cr_assert_eq(ferry_loop_new(&other, NULL), 0);
    sub = new_sub(other, usr1, 1);
    raise(SIGUSR1);
    ferry_loop_free(other);
    cr_assert_eq(disposition(SIGUSR1), app_handler);
    cr_assert_eq(app_hits[SIGUSR1], 1, "the unreceived delivery was not raised again");
    cr_assert_eq(ferry_sigsub_try_recv(sub, &signum), -EPERM);
    cr_assert_eq(ferry_sigsub_recv(sub, &signum), -EPERM);
    cr_assert_eq(ferry_sigsub_free(sub), 0);
}

static int attached_recv_task(void *arg)
{
    ferry_sigsub *sub;

    (void)arg;
    cx.rc[1] = ferry_sigsub_new(&sub, NULL, usr1, 1);
    if (cx.rc[1])
        return 0;
    cx.rc[0] = recv_within(sub, &cx.sig[0], 2000);
    cx.try1 = ferry_sigsub_free(sub);
    return 0;
}

static void app_raise_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    raise(SIGUSR1);
}

Test(signal, a_loop_attached_to_an_application_base_receives_and_lets_it_end,
     .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct event_base *base = event_base_new();
    struct timeval tv = { 0, 5000 };
    ferry_loop *loop;
    struct event *ev;

    cr_assert_not_null(base);
    set_disposition(SIGUSR1, SIG_DFL);
    memset(&cx, 0, sizeof cx);
    cr_assert_eq(ferry_loop_new(&loop, &(ferry_loop_opts){ .base = base }), 0);
    ev = evtimer_new(base, app_raise_cb, NULL);
    event_add(ev, &tv);
    cr_assert_eq(ferry_task_spawn(NULL, loop, attached_recv_task, NULL, NULL), 0);
    /* Returns once nothing is registered: the subscription's eventfd is
     * not watched once the subscription is gone. */
    event_base_dispatch(base);
    cr_assert_eq(cx.rc[1], 0);
    cr_assert_eq(cx.rc[0], 0, "receive on an attached loop: %d", cx.rc[0]);
    cr_assert_eq(cx.sig[0], SIGUSR1);
    cr_assert_eq(cx.try1, 0);
    event_free(ev);
    ferry_loop_free(loop);
    event_base_free(base);
    cr_assert_eq(disposition(SIGUSR1), SIG_DFL);
}

T(many_loops_on_one_thread_each_see_each_delivery)
{
    enum { N = 9 };     /* more than the process table first holds */
    ferry_loop *loops[N];
    ferry_sigsub *subs[N];
    int signum;

    set_disposition(SIGUSR1, SIG_DFL);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(ferry_loop_new(&loops[i], NULL), 0);
        subs[i] = new_sub(loops[i], usr1, 1);
    }
    raise(SIGUSR1);
    raise(SIGUSR1);
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 2; k++) {
            signum = 0;
            cr_assert_eq(ferry_sigsub_try_recv(subs[i], &signum), 0, "loop %d, delivery %d", i, k);
            cr_assert_eq(signum, SIGUSR1);
        }
        cr_assert_eq(ferry_sigsub_try_recv(subs[i], &signum), -EAGAIN);
    }
    /* Slots given back in the middle are taken again. */
    for (int i = 2; i < 5; i++) {
        cr_assert_eq(ferry_sigsub_free(subs[i]), 0);
        ferry_loop_free(loops[i]);
        cr_assert_eq(ferry_loop_new(&loops[i], NULL), 0);
        subs[i] = new_sub(loops[i], usr1, 1);
    }
    raise(SIGUSR1);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(ferry_sigsub_try_recv(subs[i], &signum), 0, "loop %d", i);
        cr_assert_eq(ferry_sigsub_try_recv(subs[i], &signum), -EAGAIN);
        cr_assert_eq(ferry_sigsub_free(subs[i]), 0);
        ferry_loop_free(loops[i]);
    }
    cr_assert_eq(disposition(SIGUSR1), SIG_DFL);
}

T(a_forked_child_cannot_use_an_inherited_subscription)
{
    ferry_sigsub *sub;
    int status = -1, signum;
    pid_t pid;

    set_disposition(SIGUSR1, SIG_DFL);
    sub = new_sub(tu_loop, usr1, 1);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int code = 0;
        if (ferry_sigsub_try_recv(sub, &signum) != -EPERM)
            code |= 1;
        if (ferry_sigsub_free(sub) != -EPERM)
            code |= 2;
        /* The inherited handler counts it in the child only (it may
         * wake the parent's loop, which then finds nothing new). */
        raise(SIGUSR1);
        _exit(code);
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died of signal %d", WTERMSIG(status));
    cr_assert_eq(WEXITSTATUS(status), 0, "child checks failed: %d", WEXITSTATUS(status));
    ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(ferry_sigsub_try_recv(sub, &signum), -EAGAIN, "the child's delivery reached the parent");
    cr_assert_eq(ferry_sigsub_free(sub), 0);
}
