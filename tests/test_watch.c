/* test_watch.c - the kit for callback-style libraries (ferry/watch.h),
 * shown on "pecho", a small library made here in the style of libcurl's
 * multi_socket API: it echoes a message through a pipe, says through a
 * socket callback which ends of the pipe it wants watched, asks for a
 * zero timeout when a job starts (as curl does), and counts the times it
 * is entered from inside its own callbacks (curl answers that with
 * CURLM_RECURSIVE_API_CALL).
 *
 * No cr_assert inside task bodies: tasks record what they saw, and the
 * test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "ferry/watch.h"
#include "testutil.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 10.)

/* ---- pecho: the library ------------------------------------------------ */

enum { PE_IN = 1, PE_OUT = 2, PE_REMOVE = 4 };

struct pecho {
    void (*sock_cb)(struct pecho *p, int fd, int what); /* interest */
    void (*timer_cb)(struct pecho *p, long ms);         /* -1: clear */
    void  *ud;                                          /* the adapter's */
    int    in_api;       /* inside pecho_action() */
    int    recursions;   /* pecho_action() entered from inside itself */
    int    timeouts;     /* timeout actions seen */
    int    rfd, wfd;     /* the pipe, -1 once closed */
    const char *msg;     /* what to echo */
    size_t len, wrote, got;
    char   buf[64];      /* what came back */
    bool   done;         /* echoed */
};

static int pecho_start(struct pecho *p, const char *msg)
{
    int fds[2];

    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
        return -errno;
    p->rfd = fds[0];
    p->wfd = fds[1];
    p->msg = msg;
    p->len = strlen(msg);
    p->wrote = p->got = 0;
    p->done = false;
    p->in_api++;
    p->sock_cb(p, p->wfd, PE_OUT);
    p->sock_cb(p, p->rfd, PE_IN);
    p->timer_cb(p, 0);
    p->in_api--;
    return 0;
}

/* fd -1: the timeout. */
static void pecho_action(struct pecho *p, int fd, int events)
{
    if (p->in_api)
        p->recursions++;
    p->in_api++;
    if (fd < 0)
        p->timeouts++;
    if (fd >= 0 && fd == p->wfd && (events & PE_OUT)) {
        ssize_t n = write(p->wfd, p->msg + p->wrote, p->len - p->wrote);
        if (n > 0)
            p->wrote += (size_t)n;
        if (p->wrote == p->len) {
            p->sock_cb(p, p->wfd, PE_REMOVE);   /* tell first, then close */
            close(p->wfd);
            p->wfd = -1;
        }
    } else if (fd >= 0 && fd == p->rfd && (events & PE_IN)) {
        ssize_t n = read(p->rfd, p->buf + p->got, sizeof p->buf - 1 - p->got);
        if (n > 0)
            p->got += (size_t)n;
        if (p->got == p->len) {
            p->buf[p->got] = '\0';
            p->sock_cb(p, p->rfd, PE_REMOVE);
            close(p->rfd);
            p->rfd = -1;
            p->done = true;
        }
    }
    p->in_api--;
}

/* ---- the adapter: pecho on the kit ----------------------------------- */

struct adapter {
    struct pecho    p;
    ferry_watch    *w;
    ferry_watch_op *op;    /* the job a task waits for, or NULL */
};

static void a_sock(struct pecho *p, int fd, int what)
{
    struct adapter *a = p->ud;

    if (what & PE_REMOVE)
        ferry_watch_fd_remove(a->w, fd);
    else
        ferry_watch_fd(a->w, fd, (what & PE_IN ? FERRY_READ : 0) | (what & PE_OUT ? FERRY_WRITE : 0));
}

static void a_timer(struct pecho *p, long ms)
{
    ferry_watch_timer(((struct adapter *)p->ud)->w, ms < 0 ? -1 : FERRY_MSEC(ms));
}

static void a_check_done(struct adapter *a)
{
    if (a->p.done && a->op) {
        ferry_watch_op_done(a->op, 0);
        a->op = NULL;
    }
}

static void a_ready(ferry_watch *w, int fd, int events, void *arg)
{
    struct adapter *a = arg;

    pecho_action(&a->p, fd, (events & FERRY_READ ? PE_IN : 0) | (events & FERRY_WRITE ? PE_OUT : 0));
    a_check_done(a);
}

static void a_timeout(ferry_watch *w, void *arg)
{
    pecho_action(&((struct adapter *)arg)->p, -1, 0);
    a_check_done(arg);
}

static const ferry_watch_ops a_ops = { .ready = a_ready, .timeout = a_timeout };

static int a_init(struct adapter *a)
{
    memset(a, 0, sizeof *a);
    a->p.sock_cb = a_sock;
    a->p.timer_cb = a_timer;
    a->p.ud = a;
    a->p.rfd = a->p.wfd = -1;
    return ferry_watch_new(&a->w, ferry_loop_current(), NULL, &a_ops, a);
}

/* The task side: start a job and suspend until it is done. */
static int a_echo(struct adapter *a, const char *msg)
{
    ferry_watch_op op = FERRY_WATCH_OP_INIT;
    int rc = pecho_start(&a->p, msg);

    if (rc)
        return rc;
    a->op = &op;
    rc = ferry_watch_op_wait(&op);
    a->op = NULL;
    return rc;
}

/* ---- tests ------------------------------------------------------------ */

struct echo_res {
    int rc1, rc2, recursions, timeouts, fds_after;
    int rfd1, rfd2;
    char buf1[64], buf2[64];
};

static int echo_main(void *arg)
{
    struct echo_res *r = arg;
    struct adapter a;
    ferry_watch_stats st;

    if (a_init(&a) != 0)
        return -1;
    r->rc1 = a_echo(&a, "hello through the kit");
    r->rfd1 = a.p.rfd;   /* -1: closed */
    memcpy(r->buf1, a.p.buf, sizeof r->buf1);
    /* The second job's pipe gets the numbers the first one closed. */
    r->rc2 = a_echo(&a, "again, same numbers");
    memcpy(r->buf2, a.p.buf, sizeof r->buf2);
    r->recursions = a.p.recursions;
    r->timeouts = a.p.timeouts;
    ferry_watch_stats_get(a.w, &st);
    r->fds_after = (int)st.fds;
    ferry_watch_free(a.w);
    return 0;
}

T(watch, echo_completes_without_reentering_the_library)
{
    struct echo_res r;

    memset(&r, 0, sizeof r);
    cr_assert_eq(tu_run(echo_main, &r), 0);
    cr_assert_eq(r.rc1, 0);
    cr_assert_str_eq(r.buf1, "hello through the kit");
    cr_assert_eq(r.rc2, 0);
    cr_assert_str_eq(r.buf2, "again, same numbers");
    /* The zero timeout asked for from inside pecho_start() ran later. */
    cr_assert_geq(r.timeouts, 2);
    cr_assert_eq(r.recursions, 0, "the library was entered from its own callback");
    cr_assert_eq(r.fds_after, 0);
}

/* A library that keeps an idle descriptor watched (curl 8.9 did, #14280):
 * the read end of a pipe whose writer is gone is readable forever, and
 * the driver reads nothing from it. */
struct idle_res { uint64_t calls, calls_to_park, parks; int rc; unsigned parked_after_restate; };

static int idle_calls;
static void idle_ready(ferry_watch *w, int fd, int events, void *arg) { idle_calls++; }
static void idle_timeout(ferry_watch *w, void *arg) {}
static const ferry_watch_ops idle_ops = { .ready = idle_ready, .timeout = idle_timeout };

static int idle_main(void *arg)
{
    struct idle_res *r = arg;
    ferry_watch *w;
    ferry_watch_stats st;
    int fds[2];

    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
        return -1;
    close(fds[1]);
    r->rc = ferry_watch_new(&w, ferry_loop_current(), NULL, &idle_ops, NULL);
    if (r->rc)
        return 0;
    ferry_watch_fd(w, fds[0], FERRY_READ);
    /* Until it is parked: a loop that spins on it never gets there. */
    for (int64_t end = ferry_now() + tu_ms(2000); ferry_now() < end;) {
        ferry_watch_stats_get(w, &st);
        if (st.parks)
            break;
        ferry_sleep(FERRY_MSEC(1));
    }
    ferry_watch_stats_get(w, &st);
    r->parks = st.parks;
    r->calls_to_park = st.ready_calls;
    /* Then 200 ms of it: the back-off's few wake-ups. */
    ferry_sleep(FERRY_MSEC(200));
    ferry_watch_stats_get(w, &st);
    r->calls = st.ready_calls - r->calls_to_park;
    /* Stating the interest again wakes it from parking. */
    ferry_watch_fd(w, fds[0], FERRY_READ);
    ferry_watch_stats_get(w, &st);
    r->parked_after_restate = st.parked;
    ferry_watch_fd_remove(w, fds[0]);
    close(fds[0]);
    ferry_watch_free(w);
    return 0;
}

T(watch, idle_descriptor_is_parked_not_spun)
{
    struct idle_res r;

    memset(&r, 0, sizeof r);
    cr_assert_eq(tu_run(idle_main, &r), 0);
    cr_assert_eq(r.rc, 0);
    cr_log_info("ready calls until parked: %llu; over the next 200 ms: %llu (parks %llu)",
                (unsigned long long)r.calls_to_park, (unsigned long long)r.calls,
                (unsigned long long)r.parks);
    cr_assert_geq(r.parks, 1, "never parked: %llu wake-ups", (unsigned long long)r.calls_to_park);
    /* A spinning watch wakes the loop on every poll; the back-off only a
     * few times. */
    cr_assert_lt(r.calls, 100, "%llu wake-ups in 200 ms of idle", (unsigned long long)r.calls);
    cr_assert_eq(r.parked_after_restate, 0);
}

/* Cancellation and deadlines end a wait at once; completion before the
 * task ran counts as completion. */
struct op_res { int cancelled, timedout, done_then_cancelled; int64_t waited; };
static ferry_watch_op g_op;

static int op_waiter(void *arg)
{
    *(int *)arg = ferry_watch_op_wait(&g_op);
    return 0;
}

static int op_main(void *arg)
{
    struct op_res *r = arg;
    ferry_scope sc;
    ferry_task *t;
    int64_t t0;

    ferry_watch_op_init(&g_op);
    t = tu_spawn(op_waiter, &r->cancelled);
    tu_settle();
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);

    t0 = ferry_now();
    ferry_scope_enter(&sc, t0 + FERRY_MSEC(20), 0);
    r->timedout = ferry_watch_op_wait(&g_op);
    ferry_scope_exit(&sc);
    r->waited = ferry_now() - t0;

    t = tu_spawn(op_waiter, &r->done_then_cancelled);
    tu_settle();
    ferry_watch_op_done(&g_op, 7);
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    return 0;
}

T(watch, op_wait_ends_at_once_on_cancel_and_deadline)
{
    struct op_res r;

    cr_assert_eq(tu_run(op_main, &r), 0);
    cr_assert_eq(r.cancelled, -ECANCELED);
    cr_assert_eq(r.timedout, -ETIMEDOUT);
    cr_assert_lt(r.waited, FERRY_MSEC(1000));
    cr_assert_eq(r.done_then_cancelled, 0);
    cr_assert_eq(ferry_watch_op_result(&g_op), 7);
}

/* A watch found by key, freed from inside its own op, and one left to
 * the loop's teardown. */
static int key_a, key_b, torn_down, after_free_calls;
static void kf_ready(ferry_watch *w, int fd, int events, void *arg)
{
    after_free_calls++;
    ferry_watch_free(w);           /* from inside: freed when this returns */
    ferry_watch_timer(w, 0);       /* still safe to call here: ignored */
}
static void kf_timeout(ferry_watch *w, void *arg) { after_free_calls += 100; }
static void kf_teardown(ferry_watch *w, void *arg) { torn_down++; }
static const ferry_watch_ops kf_ops = { .ready = kf_ready, .timeout = kf_timeout,
                                        .teardown = kf_teardown };

struct key_res { int rc_dup, found, busy_outside; };

static int key_main(void *arg)
{
    struct key_res *r = arg;
    ferry_watch *a, *b, *dup;
    int fds[2];

    ferry_watch_new(&a, ferry_loop_current(), &key_a, &kf_ops, NULL);
    ferry_watch_new(&b, ferry_loop_current(), &key_b, &kf_ops, NULL);
    r->rc_dup = ferry_watch_new(&dup, ferry_loop_current(), &key_a, &kf_ops, NULL);
    r->found = ferry_watch_get(ferry_loop_current(), &key_a) == a;
    r->busy_outside = ferry_watch_busy(a);
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
        return -1;
    ferry_watch_fd(a, fds[1], FERRY_WRITE);
    ferry_sleep(FERRY_MSEC(20));
    close(fds[0]);
    close(fds[1]);
    (void)b;  /* left alive: the loop's teardown frees it */
    return 0;
}

T(watch, free_from_inside_an_op_and_at_loop_teardown)
{
    struct key_res r;

    cr_assert_eq(tu_run(key_main, &r), 0);
    cr_assert_eq(r.rc_dup, -EEXIST);
    cr_assert(r.found);
    cr_assert(!r.busy_outside);
    cr_assert_eq(after_free_calls, 1);
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    cr_assert_eq(torn_down, 1);
}

/* Refusals: bad arguments change nothing; a task-only call outside a
 * task says so. */
static int refuse_main(void *arg)
{
    int *rc = arg;
    ferry_watch *w = NULL;
    ferry_watch_stats st;
    ferry_watch_ops half = { .ready = idle_ready };

    rc[0] = ferry_watch_new(NULL, ferry_loop_current(), NULL, &idle_ops, NULL);
    rc[1] = ferry_watch_new(&w, ferry_loop_current(), NULL, &half, NULL);
    rc[2] = ferry_watch_new(&w, ferry_loop_current(), NULL, NULL, NULL);
    if (ferry_watch_new(&w, ferry_loop_current(), NULL, &idle_ops, &key_a) != 0)
        return -1;
    rc[3] = ferry_watch_fd(w, -1, FERRY_READ);
    rc[4] = ferry_watch_fd(w, 0, 8);
    rc[5] = ferry_watch_fd(NULL, 0, FERRY_READ);
    rc[6] = ferry_watch_fd_remove(w, -1);
    rc[7] = ferry_watch_timer(NULL, 0);
    rc[8] = ferry_watch_stats_get(w, NULL);
    rc[9] = ferry_watch_op_wait(NULL);
    rc[10] = ferry_watch_fd_remove(w, 12345) == 0 && ferry_watch_loop(w) == ferry_loop_current() &&
             ferry_watch_arg(w) == &key_a && ferry_watch_get(ferry_loop_current(), NULL) == NULL &&
             ferry_watch_loop(NULL) == NULL && ferry_watch_arg(NULL) == NULL &&
             !ferry_watch_busy(NULL) && !ferry_watch_op_is_done(NULL) &&
             ferry_watch_op_result(NULL) == 0 && ferry_watch_stats_get(w, &st) == 0 ? 0 : -1;
    ferry_watch_progress(NULL);
    ferry_watch_op_done(NULL, 1);
    ferry_watch_free(NULL);
    /* A timer set and replaced, then the watch freed with it pending. */
    ferry_watch_timer(w, FERRY_SEC(10));
    ferry_watch_timer(w, FERRY_SEC(20));
    ferry_watch_free(w);
    return 0;
}

T(watch, refusals_change_nothing)
{
    int rc[11];
    ferry_watch_op op = FERRY_WATCH_OP_INIT;

    cr_assert_eq(tu_run(refuse_main, rc), 0);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(rc[i], -EINVAL, "call %d: %d", i, rc[i]);
    cr_assert_eq(rc[10], 0);
    cr_assert_eq(ferry_watch_op_wait(&op), -EPERM);
}

/* A library that, inside the op delivering its descriptor, removes it,
 * closes it and registers a new one under the same number (curl reuses
 * numbers after REMOVE, #9799): the new registration is a fresh one,
 * watched for what the library now asks, and nothing of the old one's
 * delivery reaches it. */
struct reuse_lib {
    ferry_watch *w;
    int fd, other, swaps, new_ready, old_ready, before;
    uint64_t parks_at_swap, parks_at_new;   /* the watch's parks then */
};

static void reuse_ready(ferry_watch *w, int fd, int events, void *arg)
{
    struct reuse_lib *l = arg;
    int p[2];

    if (l->swaps > 0) {
        ferry_watch_stats st;

        ferry_watch_stats_get(w, &st);
        if ((events & FERRY_READ) && l->new_ready++ == 0)
            l->parks_at_new = st.parks;
        if (!(events & FERRY_READ))
            l->old_ready++;
        return;
    }
    /* Ignored long enough for the watch to measure the deliveries (the
     * spinning check), then replaced during a measured one. */
    if (++l->before < 65)
        return;
    l->swaps++;
    {
        ferry_watch_stats st;

        ferry_watch_stats_get(w, &st);
        l->parks_at_swap = st.parks;
    }
    /* The old descriptor was a pipe's write end watched for writing. */
    ferry_watch_fd_remove(w, fd);
    close(fd);
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0)
        return;
    /* The new one, under the same number: a read end with data waiting. */
    if (p[0] != fd) {
        dup2(p[0], fd);
        close(p[0]);
    }
    if (write(p[1], "x", 1) != 1)
        return;
    l->other = p[1];
    ferry_watch_fd(w, fd, FERRY_READ);
}

static const ferry_watch_ops reuse_ops = { .ready = reuse_ready, .timeout = idle_timeout };

static int reuse_main(void *arg)
{
    struct reuse_lib *l = arg;
    ferry_watch_stats st;
    int p[2];

    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0)
        return -1;
    l->fd = p[1];
    l->other = p[0];
    if (ferry_watch_new(&l->w, ferry_loop_current(), NULL, &reuse_ops, l) != 0)
        return -1;
    ferry_watch_fd(l->w, l->fd, FERRY_WRITE);
    for (int64_t end = ferry_now() + tu_ms(2000); ferry_now() < end && l->new_ready == 0;)
        ferry_sleep(FERRY_MSEC(1));
    close(l->other);        /* the first pipe's read end */
    ferry_watch_stats_get(l->w, &st);
    ferry_watch_fd_remove(l->w, l->fd);
    close(l->fd);
    ferry_watch_free(l->w);
    return (int)st.fds;
}

T(watch, descriptor_replaced_inside_its_own_delivery)
{
    struct reuse_lib l;

    memset(&l, 0, sizeof l);
    cr_assert_eq(tu_run(reuse_main, &l), 1);
    cr_assert_eq(l.swaps, 1);
    cr_assert_geq(l.new_ready, 1, "the new registration was never delivered");
    cr_assert_eq(l.old_ready, 0, "the old registration's writability reached the new one");
    /* The old registration's spinning check must not have been applied
     * to the new one, which had not been delivered yet. */
    cr_assert_eq(l.parks_at_new, l.parks_at_swap, "the new registration was parked for the old one");
}
