/* test_chan.c - the mixed channel (bridge.h: ferry_chan), between threads
 * and tasks: order through a small buffer, try and blocking calls with
 * their timeouts, -EDEADLK for a blocking call on the loop's thread,
 * cancellation and deadlines in tasks, close waking every waiter while the
 * items left can still be received, a woken receiver cancelled before it
 * ran passing the wake on, bad arguments and allocation failure.
 *
 * No cr_assert inside task bodies: they record, the test body asserts
 * after the loop returned.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry/bridge.h"
#include "ferry/select.h"

/* Tests on tu_loop, and tests that need no loop. */
#define T(name) Test(chan, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
#define TL(name) Test(chan, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 30.)

/* ---- order, try calls, close ------------------------------------------------ */

TL(try_operations_and_bounds)
{
    ferry_chan *ch;
    void *v;
    cr_assert_eq(ferry_chan_new(&ch, 0), -EINVAL);
    cr_assert_eq(ferry_chan_new(&ch, 2), 0);
    cr_assert_eq(ferry_chan_try_recv(ch, &v), -EAGAIN);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)1), 0);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)2), 0);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)3), -EAGAIN);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)3, FERRY_MSEC(5)), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_len(ch), 2);
    cr_assert_eq(ferry_chan_try_recv(ch, &v), 0);
    cr_assert_eq(v, (void *)1);
    cr_assert_eq(ferry_chan_close(ch), 0);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)4), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &v, FERRY_NEVER), 0);   /* drains */
    cr_assert_eq(v, (void *)2);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &v, FERRY_NEVER), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_send(ch, NULL), -EPERM);                  /* not a task */
    ferry_chan_free(ch);
}

struct cx { ferry_chan *ch; int n; long sum; int count; int rc; };

static void *cx_thread_sender(void *arg)
{
    struct cx *c = arg;
    for (intptr_t i = 1; i <= c->n; i++)
        if (ferry_chan_send_blocking(c->ch, (void *)i, FERRY_NEVER))
            return (void *)1;
    return NULL;
}

static int cx_task_recv(void *arg)
{
    struct cx *c = arg;
    void *v;
    for (int i = 0; i < c->n; i++) {
        c->rc = ferry_chan_recv(c->ch, &v);
        if (c->rc)
            return c->rc;
        if ((intptr_t)v != i + 1)
            return -1000 - i;          /* FIFO */
        c->sum += (intptr_t)v;
        c->count++;
    }
    return 0;
}

T(thread_sends_task_receives_in_order_through_a_small_buffer)
{
    struct cx c = { .n = 5000 };
    void *bad;
    pthread_t t;

    cr_assert_eq(ferry_chan_new(&c.ch, 4), 0);
    t = tu_start_thread(cx_thread_sender, &c);
    cr_assert_eq(tu_run(cx_task_recv, &c), 0);
    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(c.count, 5000);
    cr_assert_eq(c.sum, 5000L * 5001 / 2);
    ferry_chan_free(c.ch);
}

/* Close wakes a receiving task, a receiving thread and a sending task. */
struct cl { ferry_chan *full, *empty; int rc_trecv, rc_tsend; atomic_int rc_threcv; };

static int cl_recv(void *arg) { struct cl *c = arg; void *v; c->rc_trecv = ferry_chan_recv(c->empty, &v); return 0; }
static int cl_send(void *arg) { struct cl *c = arg; c->rc_tsend = ferry_chan_send(c->full, (void *)2); return 0; }
static void *cl_thread(void *arg)
{
    struct cl *c = arg;
    void *v;
    atomic_store(&c->rc_threcv, ferry_chan_recv_blocking(c->empty, &v, FERRY_NEVER));
    return NULL;
}

static int cl_main(void *arg)
{
    struct cl *c = arg;
    ferry_task *a, *b;
    pthread_t t;
    pthread_create(&t, NULL, cl_thread, c);
    ferry_task_spawn(&a, NULL, cl_recv, c, NULL);
    ferry_task_spawn(&b, NULL, cl_send, c, NULL);
    for (int i = 0; i < 5; i++)
        ferry_yield();
    ferry_sleep(FERRY_MSEC(5));   /* let the thread block */
    ferry_chan_close(c->empty);
    ferry_chan_close(c->full);
    ferry_task_join(a, NULL);
    ferry_task_join(b, NULL);
    pthread_join(t, NULL);
    return 0;
}

T(close_wakes_every_waiter)
{
    struct cl c = { .rc_threcv = 1 };
    void *v;
    cr_assert_eq(ferry_chan_new(&c.full, 1), 0);
    cr_assert_eq(ferry_chan_new(&c.empty, 1), 0);
    cr_assert_eq(ferry_chan_try_send(c.full, (void *)1), 0);
    cr_assert_eq(tu_run(cl_main, &c), 0);
    cr_assert_eq(c.rc_trecv, -ESHUTDOWN);
    cr_assert_eq(c.rc_tsend, -ESHUTDOWN);
    cr_assert_eq(atomic_load(&c.rc_threcv), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_try_recv(c.full, &v), 0);   /* the item is not lost */
    cr_assert_eq(v, (void *)1);
    ferry_chan_free(c.full);
    ferry_chan_free(c.empty);
}

/* A receiver woken by a send and cancelled before it runs passes the wake
 * on: the other receiver gets the item (no swallowed wakeup). */
struct pw { ferry_chan *ch; ferry_task *a, *b; int rc_a, rc_b; void *got_b; };
static struct pw *pw_cur;

static int pw_a(void *arg) { struct pw *p = arg; void *v; p->rc_a = ferry_chan_recv(p->ch, &v); return 0; }
static int pw_b(void *arg) { struct pw *p = arg; p->rc_b = ferry_chan_recv(p->ch, &p->got_b); return 0; }

static void pw_cancel_a(void *arg) { (void)arg; ferry_task_cancel(pw_cur->a); }

static void *pw_thread(void *arg)
{
    struct pw *p = arg;
    /* Both land in one drain: the wake of a (a completion), then the
     * cancel of a (a post). */
    ferry_chan_try_send(p->ch, (void *)77);
    ferry_loop_call_soon_threadsafe(tu_loop, pw_cancel_a, NULL);
    return NULL;
}

static void pw_block(void *arg)
{
    pthread_t t;
    pthread_create(&t, NULL, pw_thread, arg);
    pthread_join(t, NULL);
}

static int pw_main(void *arg)
{
    struct pw *p = arg;
    ferry_task_spawn(&p->a, NULL, pw_a, p, NULL);
    ferry_yield();
    ferry_task_spawn(&p->b, NULL, pw_b, p, NULL);
    ferry_yield();
    ferry_yield();
    ferry_call_soon(tu_loop, pw_block, p);
    ferry_task_join(p->a, NULL);
    ferry_task_join(p->b, NULL);
    return 0;
}

T(cancelled_woken_receiver_passes_the_wake_on)
{
    struct pw p = {0};
    pw_cur = &p;
    cr_assert_eq(ferry_chan_new(&p.ch, 1), 0);
    cr_assert_eq(tu_run(pw_main, &p), 0);
    cr_assert_eq(p.rc_a, -ECANCELED);
    cr_assert_eq(p.rc_b, 0);
    cr_assert_eq(p.got_b, (void *)77);
    cr_assert_eq(ferry_chan_len(p.ch), 0);
    ferry_chan_free(p.ch);
}
/* ---- bad arguments, timeouts, the loop's thread, close -------------------- */

TL(bad_arguments_are_einval_and_new_without_memory_is_enomem)
{
    ferry_chan *ch = NULL;
    void *it;
    int rc = -1;

    cr_assert_eq(ferry_chan_new(NULL, 1), -EINVAL);
    cr_assert_eq(ferry_chan_new(&ch, 0), -EINVAL);
    cr_assert_eq(ferry_chan_new(&ch, SIZE_MAX), -EINVAL);
    cr_assert_eq(ferry_chan_close(NULL), -EINVAL);
    cr_assert_eq(ferry_chan_try_send(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_try_recv(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_send_blocking(NULL, &it, 0), -EINVAL);
    cr_assert_eq(ferry_chan_recv_blocking(NULL, &it, 0), -EINVAL);
    cr_assert_eq(ferry_chan_send(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_recv(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_len(NULL), 0);
    ferry_chan_free(NULL);
    for (unsigned long n = 1; n < 20; n++) {
        ferry__fault_arm(n, false);
        rc = ferry_chan_new(&ch, 4);
        ferry__fault_reset();
        if (rc == 0)
            break;
        cr_assert_eq(rc, -ENOMEM);
        cr_assert_null(ch);
    }
    cr_assert_eq(rc, 0);
    cr_assert_eq(ferry_chan_try_recv(ch, NULL), -EINVAL);
    cr_assert_eq(ferry_chan_recv_blocking(ch, NULL, 0), -EINVAL);
    cr_assert_eq(ferry_chan_recv(ch, NULL), -EINVAL);
    ferry_chan_free(ch);
    cr_assert_eq(tu_leaks(), 0);
}

/* A zero timeout means "do not wait": the blocking calls answer as the
 * try-calls do (-EAGAIN), and only a positive timeout that passes is
 * -ETIMEDOUT. */
TL(thread_side_timeouts_then_close_drains_and_refuses)
{
    ferry_chan *ch;
    void *it = NULL;

    cr_assert_eq(ferry_chan_new(&ch, 1), 0);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, 0), -EAGAIN);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, FERRY_MSEC(1)), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_try_recv(ch, &it), -EAGAIN);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)1, FERRY_MSEC(1)), 0);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)2, 0), -EAGAIN);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)2, FERRY_MSEC(1)), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)2), -EAGAIN);
    cr_assert_eq(ferry_chan_len(ch), 1);
    cr_assert_eq(ferry_chan_close(ch), 0);
    cr_assert_eq(ferry_chan_close(ch), 0);          /* idempotent */
    cr_assert_eq(ferry_chan_try_send(ch, (void *)3), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)3, FERRY_NEVER), -ESHUTDOWN);
    /* Receives drain what is left, then -ESHUTDOWN. */
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, FERRY_NEVER), 0);
    cr_assert_eq(it, (void *)1);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, FERRY_NEVER), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_try_recv(ch, &it), -ESHUTDOWN);
    ferry_chan_free(ch);
}

/* A thread blocked in send is woken by a task's receive; one blocked in
 * receive is woken by close.  On the loop's thread a blocking call with a
 * timeout is -EDEADLK; with 0 it is allowed.  Outside a task the
 * suspending calls are -EPERM; a cancelled task gets -ECANCELED, a passed
 * deadline -ETIMEDOUT. */
static ferry_chan *tch;
static int chan_rcs[10];
static void *chan_items[2];
static void *blocked_sender(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)ferry_chan_send_blocking(tch, (void *)22, FERRY_NEVER);
}

static int chan_main(void *arg)
{
    ferry_scope sc;
    ferry_task *self = ferry_task_current();
    void *it;
    (void)arg;

    chan_rcs[0] = ferry_chan_send_blocking(tch, (void *)1, FERRY_MSEC(1));
    chan_rcs[1] = ferry_chan_recv_blocking(tch, &it, FERRY_MSEC(1));
    chan_rcs[2] = ferry_chan_recv_blocking(tch, &it, 0);    /* full: takes 11 */
    chan_items[0] = it;
    chan_rcs[3] = ferry_chan_recv(tch, &chan_items[1]);     /* waits for the thread's 22 */
    ferry_scope_enter(&sc, ferry_now() - 1, 0);
    chan_rcs[4] = ferry_chan_recv(tch, &it);                /* empty, deadline passed */
    ferry_scope_exit(&sc);
    ferry_task_cancel(self);
    chan_rcs[5] = ferry_chan_send(tch, (void *)3);          /* cancelled: not queued */
    return 0;
}

T(blocking_calls_on_the_loop_thread_are_edeadlk_and_task_calls_see_cancel_and_deadline)
{
    void *it, *res;
    pthread_t t;

    cr_assert_eq(ferry_chan_new(&tch, 1), 0);
    cr_assert_eq(ferry_chan_send(tch, (void *)1), -EPERM);
    cr_assert_eq(ferry_chan_recv(tch, &it), -EPERM);
    cr_assert_eq(ferry_chan_try_send(tch, (void *)11), 0);
    t = tu_start_thread(blocked_sender, NULL);
    cr_assert_eq(tu_run(chan_main, NULL), 0);
    pthread_join(t, &res);
    cr_assert_eq((intptr_t)res, 0);
    cr_assert_eq(chan_rcs[0], -EDEADLK);
    cr_assert_eq(chan_rcs[1], -EDEADLK);
    cr_assert_eq(chan_rcs[2], 0);
    cr_assert_eq(chan_items[0], (void *)11);
    cr_assert_eq(chan_rcs[3], 0);
    cr_assert_eq(chan_items[1], (void *)22);
    cr_assert_eq(chan_rcs[4], -ETIMEDOUT);
    cr_assert_eq(chan_rcs[5], -ECANCELED);
    cr_assert_eq(ferry_chan_len(tch), 0);
    ferry_chan_free(tch);
}

static void *blocked_receiver(void *arg)
{
    void *it;
    (void)arg;
    return (void *)(intptr_t)ferry_chan_recv_blocking(tch, &it, FERRY_NEVER);
}

static int closer_task_rc = 1;
static int closer_task(void *arg)
{
    (void)arg;
    closer_task_rc = ferry_chan_send(tch, (void *)1);   /* parks: full */
    return 0;
}

T(close_wakes_a_blocked_thread_and_a_parked_task)
{
    void *res;
    pthread_t t;
    ferry_chan *full;

    cr_assert_eq(ferry_chan_new(&tch, 1), 0);
    t = tu_start_thread(blocked_receiver, NULL);
    usleep(1000);
    cr_assert_eq(ferry_chan_close(tch), 0);
    pthread_join(t, &res);
    cr_assert_eq((intptr_t)res, -ESHUTDOWN);
    ferry_chan_free(tch);

    cr_assert_eq(ferry_chan_new(&full, 1), 0);
    tch = full;
    cr_assert_eq(ferry_chan_try_send(tch, (void *)9), 0);
    cr_assert_eq(ferry_task_spawn(NULL, tu_loop, closer_task, NULL, NULL), 0);
    for (int i = 0; i < 3; i++)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(closer_task_rc, 1);                     /* parked */
    cr_assert_eq(ferry_chan_close(tch), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(closer_task_rc, -ESHUTDOWN);
    ferry_chan_free(tch);
}

/* ---- Elements of any size ------------------------------------------------ */

struct rec { long a; int b; char tag[12]; };

static ferry_chan *ech;
static struct rec erec[6];
static int erc[8];

static void *elem_thread_sender(void *arg)
{
    (void)arg;
    for (int i = 0; i < 4; i++) {
        struct rec r = { .a = 1000 + i, .b = -i };

        snprintf(r.tag, sizeof r.tag, "rec %d", i);
        if (ferry_chan_send_elem_blocking(ech, &r, FERRY_NEVER))
            return (void *)1;
    }
    return NULL;
}

static int elem_main(void *arg)
{
    struct rec r = { .a = 77, .b = 7, .tag = "select" };
    ferry_case c[1];
    int n = 0;

    (void)arg;
    for (int i = 0; i < 4; i++)
        erc[n++] = ferry_chan_recv_elem(ech, &erec[i]);
    /* A select's send case copies the element `buf` points to, its
     * receive case copies into `buf`. */
    c[0] = FERRY_CASE_SEND_INIT(ech, &r);
    erc[n++] = ferry_select(c, 1, 0);
    c[0] = FERRY_CASE_RECV_INIT(ech, &erec[4]);
    erc[n++] = ferry_select(c, 1, 0);
    return n;
}

/* A channel of 24-byte records: a thread sends, a task receives, in
 * order and whole; the pointer calls refuse it; select copies elements. */
T(elements_of_any_size_go_through_whole_and_in_order)
{
    struct rec r = { .a = 5 }, out = { 0 };
    void *p = NULL;
    pthread_t t;

    cr_assert_eq(ferry_chan_new_elem(&ech, 2, 0), -EINVAL);
    cr_assert_eq(ferry_chan_new_elem(&ech, SIZE_MAX / 2, 4), -EINVAL);
    cr_assert_eq(ferry_chan_new_elem(&ech, 2, sizeof(struct rec)), 0);
    cr_assert_eq(ferry_chan_try_send(ech, (void *)1), -EINVAL);
    cr_assert_eq(ferry_chan_try_recv(ech, &p), -EINVAL);
    cr_assert_eq(ferry_chan_send_blocking(ech, (void *)1, 0), -EINVAL);
    cr_assert_eq(ferry_chan_try_send_elem(ech, NULL), -EINVAL);
    cr_assert_eq(ferry_chan_try_recv_elem(ech, &out), -EAGAIN);
    cr_assert_eq(ferry_chan_recv_elem_blocking(ech, &out, 0), -EAGAIN);
    t = tu_start_thread(elem_thread_sender, NULL);
    cr_assert_eq(tu_run(elem_main, NULL), 6);
    pthread_join(t, &p);
    cr_assert_null(p);
    for (int i = 0; i < 4; i++) {
        char want[12];

        snprintf(want, sizeof want, "rec %d", i);
        cr_assert_eq(erc[i], 0);
        cr_assert_eq(erec[i].a, 1000 + i);
        cr_assert_eq(erec[i].b, -i);
        cr_assert_str_eq(erec[i].tag, want);
    }
    cr_assert_eq(erc[4], 0);
    cr_assert_eq(erc[5], 0);
    cr_assert_eq(erec[4].a, 77);
    cr_assert_str_eq(erec[4].tag, "select");
    cr_assert_eq(ferry_chan_try_send_elem(ech, &r), 0);
    cr_assert_eq(ferry_chan_try_send_elem(ech, &r), 0);
    cr_assert_eq(ferry_chan_send_elem_blocking(ech, &r, 0), -EAGAIN);
    cr_assert_eq(ferry_chan_try_recv_elem(ech, &out), 0);
    cr_assert_eq(out.a, 5);
    ferry_chan_free(ech);
}

/* ---- select cases that wait, element bad arguments, a send's deadline ---- */

static ferry_chan *sch[3];
static int src[12];
static void *sgot;

/* A select whose only case is a send on a full channel, or a receive on an
 * empty one: it parks on the channel's node. */
static int sel_send_0(void *arg)
{
    ferry_case c[1] = { FERRY_CASE_SEND_INIT(sch[(intptr_t)arg], (void *)(intptr_t)0x5) };
    int rc = ferry_select(c, 1, 0);

    return rc == 0 ? c[0].result : 1000 + rc;
}

static int sel_recv_2(void *arg)
{
    ferry_case c[1] = { FERRY_CASE_RECV_INIT(sch[2], &sgot) };
    int rc;

    (void)arg;
    rc = ferry_select(c, 1, 0);
    return rc == 0 ? c[0].result : 1000 + rc;
}

static int sel_wait_main(void *arg)
{
    ferry_task *a, *b, *r;
    void *it = NULL;

    (void)arg;
    a = tu_spawn(sel_send_0, (void *)(intptr_t)0);
    b = tu_spawn(sel_send_0, (void *)(intptr_t)1);
    r = tu_spawn(sel_recv_2, NULL);
    tu_settle();
    /* Room in sch[0]: the parked send case puts its item. */
    src[0] = ferry_chan_try_recv(sch[0], &it);
    src[1] = (int)(intptr_t)it;
    src[2] = tu_join(a);
    src[3] = ferry_chan_try_recv(sch[0], &it);
    src[4] = (int)(intptr_t)it;
    /* Close: the parked send case and the parked receive case are
     * performed with -ESHUTDOWN. */
    ferry_chan_close(sch[1]);
    ferry_chan_close(sch[2]);
    src[5] = tu_join(b);
    src[6] = tu_join(r);
    src[7] = (int)ferry_chan_len(sch[1]);
    return 0;
}

T(select_cases_parked_on_a_channel_are_performed_by_room_and_by_close)
{
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ferry_chan_new(&sch[i], 1), 0);
    cr_assert_eq(ferry_chan_try_send(sch[0], (void *)(intptr_t)0x1), 0);
    cr_assert_eq(ferry_chan_try_send(sch[1], (void *)(intptr_t)0x2), 0);
    cr_assert_eq(tu_run(sel_wait_main, NULL), 0);
    cr_assert_eq(src[0], 0);
    cr_assert_eq(src[1], 0x1);
    cr_assert_eq(src[2], 0);               /* the send case, result 0 */
    cr_assert_eq(src[3], 0);
    cr_assert_eq(src[4], 0x5);             /* its item went in */
    cr_assert_eq(src[5], -ESHUTDOWN);
    cr_assert_eq(src[6], -ESHUTDOWN);
    cr_assert_null(sgot);
    cr_assert_eq(src[7], 1);               /* the item left is not lost */
    for (int i = 0; i < 3; i++)
        ferry_chan_free(sch[i]);
}

static int elem_bad_main(void *arg)
{
    ferry_case c[1] = { FERRY_CASE_SEND_INIT(sch[0], NULL) };
    ferry_scope sc;
    struct rec r = { .a = 1 };

    (void)arg;
    /* A send case of an element channel without the element. */
    src[0] = ferry_select(c, 1, 0);
    src[1] = ferry_chan_send_elem(sch[0], NULL);
    src[2] = ferry_chan_send_elem(sch[0], &r);           /* fills it */
    /* Full, and the scope's deadline passes while the send is parked. */
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(2), 0);
    src[3] = ferry_chan_send_elem(sch[0], &r);
    ferry_scope_exit(&sc);
    src[4] = (int)ferry_chan_len(sch[0]);
    return 0;
}

T(element_sends_without_an_element_are_einval_and_a_parked_send_times_out)
{
    struct rec r = { .a = 1 };

    cr_assert_eq(ferry_chan_new_elem(&sch[0], 1, sizeof(struct rec)), 0);
    cr_assert_eq(ferry_chan_send_elem_blocking(NULL, &r, 0), -EINVAL);
    cr_assert_eq(ferry_chan_send_elem_blocking(sch[0], NULL, 0), -EINVAL);
    cr_assert_eq(ferry_chan_send_elem(sch[0], NULL), -EINVAL);
    cr_assert_eq(tu_run(elem_bad_main, NULL), 0);
    cr_assert_eq(src[0], -EINVAL);
    cr_assert_eq(src[1], -EINVAL);
    cr_assert_eq(src[2], 0);
    cr_assert_eq(src[3], -ETIMEDOUT);
    cr_assert_eq(src[4], 1);
    ferry_chan_free(sch[0]);
}

/* A select whose receive case was woken by a send and that is cancelled
 * before it ran hands the wake on: it performs nothing (-ECANCELED), and a
 * plain receiver waiting behind it gets the item. */
static int ps_select(void *arg)
{
    struct pw *p = arg;
    void *v = NULL;
    ferry_case c[1] = { FERRY_CASE_RECV_INIT(p->ch, &v) };

    p->rc_a = ferry_select(c, 1, 0);
    return 0;
}

static int ps_main(void *arg)
{
    struct pw *p = arg;

    ferry_task_spawn(&p->a, NULL, ps_select, p, NULL);
    ferry_yield();
    ferry_task_spawn(&p->b, NULL, pw_b, p, NULL);
    ferry_yield();
    ferry_yield();
    ferry_call_soon(tu_loop, pw_block, p);
    ferry_task_join(p->a, NULL);
    ferry_task_join(p->b, NULL);
    return 0;
}

T(cancelled_woken_select_passes_the_wake_on)
{
    struct pw p = {0};

    pw_cur = &p;
    cr_assert_eq(ferry_chan_new(&p.ch, 1), 0);
    cr_assert_eq(tu_run(ps_main, &p), 0);
    cr_assert_eq(p.rc_a, -ECANCELED);
    cr_assert_eq(p.rc_b, 0);
    cr_assert_eq(p.got_b, (void *)77);
    cr_assert_eq(ferry_chan_len(p.ch), 0);
    ferry_chan_free(p.ch);
}
