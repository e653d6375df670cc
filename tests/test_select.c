/* test_select.c - ferry_select(): every case kind alone and mixed, the fair
 * and the priority choice, disabled cases, no effect on the cases that were
 * not performed (also under cancellation, deadlines and two grants in one
 * turn), bad input.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "fault.h"
#include "testutil.h"
#include "stream_int.h"

/* FERRY_TEST_IO_LIBEVENT=1 (a second ctest run): streams registered
 * through libevent instead of the loop's epoll set. */
__attribute__((constructor)) static void io_path(void)
{
    if (getenv("FERRY_TEST_IO_LIBEVENT"))
        ferry__io_use_libevent = true;
}

#define T(name) \
    Test(select, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 20.)

static ferry_task *spawn(ferry_task_fn fn, void *arg)
{
    ferry_task *t = NULL;

    if (ferry_task_spawn(&t, NULL, fn, arg, NULL) != 0)
        return NULL;
    return t;
}

static int join(ferry_task *t)
{
    int st = -99999;

    if (t == NULL || ferry_task_join(t, &st) != 0)
        return -99998;
    return st;
}

static void settle(void)
{
    for (int i = 0; i < 8; i++)
        ferry_yield();
}

static ferry_queue g_q[4];
static ferry_event g_ev;
static int g_rc[8];
static int g_val[8];
static int g_item;

static void queues_init(size_t cap)
{
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ferry_queue_init(&g_q[i], sizeof(int), cap, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(ferry_event_init(&g_ev), 0);
}

static void queues_destroy(void)
{
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ferry_queue_destroy(&g_q[i]), 0);
    cr_assert_eq(ferry_event_destroy(&g_ev), 0);
}

/* ---- each kind alone ------------------------------------------------------ */

static int put_later(void *arg)
{
    int v = (int)(intptr_t)arg;

    settle();
    return ferry_queue_put(&g_q[0], &v);
}

static int get_alone_main(void *arg)
{
    ferry_case c[1] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item) };
    ferry_task *t = spawn(put_later, (void *)(intptr_t)42);

    (void)arg;
    g_rc[0] = ferry_select(c, 1, 0);       /* waits: the put comes later */
    g_rc[1] = c[0].result;
    g_rc[2] = join(t);
    return 0;
}

T(queue_get_waits_and_copies_the_element)
{
    queues_init(0);
    cr_assert_eq(tu_run(get_alone_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_item, 42);
    cr_assert_eq(ferry_queue_size(&g_q[0]), 0);
    queues_destroy();
}

static int get_later(void *arg)
{
    (void)arg;
    settle();
    return ferry_queue_get(&g_q[0], &g_val[0]);
}

static int put_alone_main(void *arg)
{
    int one = 1, two = 2;
    ferry_case c[1] = { FERRY_CASE_PUT_INIT(&g_q[0], &two) };
    ferry_task *t;

    (void)arg;
    ferry_queue_put(&g_q[0], &one);        /* capacity 1: full */
    t = spawn(get_later, NULL);
    g_rc[0] = ferry_select(c, 1, 0);
    g_rc[1] = c[0].result;
    g_rc[2] = join(t);
    g_rc[3] = ferry_queue_try_get(&g_q[0], &g_val[1]);
    return 0;
}

T(queue_put_waits_for_room_and_copies_the_element_in)
{
    queues_init(1);
    cr_assert_eq(tu_run(put_alone_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_val[0], 1);
    cr_assert_eq(g_val[1], 2);
    queues_destroy();
}

static int set_later(void *arg)
{
    (void)arg;
    settle();
    return ferry_event_set(&g_ev);
}

static int event_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item), FERRY_CASE_EVENT_INIT(&g_ev) };
    ferry_task *t = spawn(set_later, NULL);

    (void)arg;
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = c[1].result;
    g_rc[2] = join(t);
    /* Set: ready at once, and not consumed. */
    g_rc[3] = ferry_select(c, 2, 0);
    g_rc[4] = ferry_event_is_set(&g_ev);
    return 0;
}

T(event_case_reports_the_set_and_consumes_nothing)
{
    queues_init(0);
    cr_assert_eq(tu_run(event_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 1);
    cr_assert_eq(g_rc[4], 1);
    queues_destroy();
}

static int pipe_fds[2];

static int write_later(void *arg)
{
    (void)arg;
    settle();
    return write(pipe_fds[1], "x", 1) == 1 ? 0 : -1;
}

static int fd_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_EVENT_INIT(&g_ev), FERRY_CASE_FD_INIT(pipe_fds[0], FERRY_READ) };
    ferry_task *t = spawn(write_later, NULL);

    (void)arg;
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = c[1].result;
    g_rc[2] = c[1].value;
    g_rc[3] = join(t);
    /* Readable already: pass 1 finds it without waiting. */
    g_rc[4] = ferry_select(c, 2, FERRY_SELECT_TRY);
    g_rc[5] = c[1].value;
    return 0;
}

T(fd_case_waits_for_readable)
{
    queues_init(0);
    cr_assert_eq(pipe(pipe_fds), 0);
    cr_assert_eq(tu_run(fd_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], FERRY_READ);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_rc[4], 1);
    cr_assert_eq(g_rc[5], FERRY_READ);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    queues_destroy();
}

static ferry_stream *g_stream;
static int sock_fds[2];

static int sock_write_later(void *arg)
{
    (void)arg;
    settle();
    return write(sock_fds[1], "hello", 5) == 5 ? 0 : -1;
}

static int stream_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_EVENT_INIT(&g_ev), FERRY_CASE_STREAM_INIT(NULL, FERRY_READ) };
    ferry_task *t;
    char buf[8];
    size_t n = 0;

    (void)arg;
    if (ferry_stream_open(&g_stream, tu_loop, sock_fds[0], NULL) != 0)
        return -1;
    c[1].obj = g_stream;
    t = spawn(sock_write_later, NULL);
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = c[1].result;
    g_rc[2] = join(t);
    /* The case only reported: the bytes are still there to read. */
    g_rc[3] = ferry_stream_read(g_stream, buf, sizeof buf, &n);
    g_rc[4] = (int)n;
    /* Nothing more to read: the case waits, and the event wins. */
    ferry_event_set(&g_ev);
    g_rc[5] = ferry_select(c, 2, 0);
    return ferry_stream_close(g_stream);
}

T(stream_case_waits_for_bytes_and_consumes_none)
{
    queues_init(0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sock_fds), 0);
    cr_assert_eq(tu_run(stream_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_rc[4], 5);
    cr_assert_eq(g_rc[5], 0);
    close(sock_fds[1]);
    queues_destroy();
}

static int child_fn(void *arg)
{
    (void)arg;
    settle();
    return 7;
}

static int join_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_EVENT_INIT(&g_ev), FERRY_CASE_JOIN_INIT(NULL) };

    (void)arg;
    c[1].obj = spawn(child_fn, NULL);
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = c[1].result;
    g_rc[2] = c[1].value;
    return 0;
}

T(join_case_joins_the_task_and_reports_its_status)
{
    queues_init(0);
    /* The loop's teardown fails the test if the handle was not released. */
    cr_assert_eq(tu_run(join_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 7);
    queues_destroy();
}

static ferry_sigsub *g_sub;

static int raise_later(void *arg)
{
    (void)arg;
    settle();
    return raise(SIGUSR1);
}

static int signal_main(void *arg)
{
    int sig = SIGUSR1;
    ferry_case c[2] = { FERRY_CASE_EVENT_INIT(&g_ev), FERRY_CASE_SIGNAL_INIT(NULL) };
    ferry_task *t;

    (void)arg;
    if (ferry_sigsub_new(&g_sub, tu_loop, &sig, 1) != 0)
        return -1;
    c[1].obj = g_sub;
    t = spawn(raise_later, NULL);
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = c[1].result;
    g_rc[2] = c[1].value;
    g_rc[3] = join(t);
    g_rc[4] = ferry_sigsub_try_recv(g_sub, &sig);   /* received once only */
    return ferry_sigsub_free(g_sub);
}

T(signal_case_receives_one_delivery)
{
    queues_init(0);
    cr_assert_eq(tu_run(signal_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], SIGUSR1);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_rc[4], -EAGAIN);
    queues_destroy();
}

static int deadline_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item),
                        FERRY_CASE_DEADLINE_INIT(ferry_now() + tu_ms(20)) };
    ferry_scope s;

    (void)arg;
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = ferry_now() >= c[1].at;
    /* A scope's deadline ends the whole select instead. */
    c[1].at = ferry_now() + tu_ms(10000);
    ferry_scope_enter(&s, ferry_now() + tu_ms(20), 0);
    g_rc[2] = ferry_select(c, 2, 0);
    g_rc[3] = ferry_scope_exit(&s);
    return 0;
}

T(deadline_case_fires_and_a_scope_deadline_ends_the_select)
{
    queues_init(0);
    cr_assert_eq(tu_run(deadline_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 1);
    cr_assert_eq(g_rc[2], -ETIMEDOUT);
    cr_assert_eq(g_rc[3], -ETIMEDOUT);
    queues_destroy();
}

/* Cases already possible when the select is called are performed without
 * waiting: a task that has ended, a delivery counted before, a time that
 * has passed.  Each select lists the ready case after an empty queue. */
static int seven(void *arg)
{
    (void)arg;
    return 7;
}

static int ready_main(void *arg)
{
    int sig = SIGUSR1;
    ferry_case c[2] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item), { .kind = FERRY_CASE_NONE } };
    ferry_task *t = spawn(seven, NULL);

    (void)arg;
    settle();                                        /* t has ended */
    c[1] = FERRY_CASE_JOIN_INIT(t);
    g_rc[0] = ferry_select(c, 2, FERRY_SELECT_TRY);
    g_val[0] = c[1].value;
    if (ferry_sigsub_new(&g_sub, tu_loop, &sig, 1) != 0)
        return -1;
    raise(SIGUSR1);                                  /* counted, no task waits */
    settle();
    c[1] = FERRY_CASE_SIGNAL_INIT(g_sub);
    g_rc[1] = ferry_select(c, 2, FERRY_SELECT_TRY);
    g_val[1] = c[1].value;
    g_rc[2] = ferry_sigsub_try_recv(g_sub, &sig);    /* taken once */
    c[1] = FERRY_CASE_DEADLINE_INIT(ferry_now() - 1);
    g_rc[3] = ferry_select(c, 2, FERRY_SELECT_TRY);
    return ferry_sigsub_free(g_sub);
}

T(cases_ready_at_the_call_are_performed_without_waiting)
{
    queues_init(0);
    cr_assert_eq(tu_run(ready_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1, "join of an ended task: %d", g_rc[0]);
    cr_assert_eq(g_val[0], 7);
    cr_assert_eq(g_rc[1], 1, "a counted signal: %d", g_rc[1]);
    cr_assert_eq(g_val[1], SIGUSR1);
    cr_assert_eq(g_rc[2], -EAGAIN);
    cr_assert_eq(g_rc[3], 1, "a deadline in the past: %d", g_rc[3]);
    queues_destroy();
}

/* ---- the choice ----------------------------------------------------------- */

static int g_hits[4];

static int fair_main(void *arg)
{
    unsigned flags = (unsigned)(uintptr_t)arg;
    int v = 0, out;

    for (int round = 0; round < 400; round++) {
        ferry_case c[4];
        int k;

        /* Cases 1..3 ready; case 0 empty, so it is never chosen. */
        for (int i = 1; i < 4; i++)
            if (ferry_queue_size(&g_q[i]) == 0)
                ferry_queue_put(&g_q[i], &v);
        for (int i = 0; i < 4; i++)
            c[i] = FERRY_CASE_GET_INIT(&g_q[i], &out);
        k = ferry_select(c, 4, flags);
        if (k < 0 || k > 3)
            return k;
        g_hits[k]++;
    }
    return 0;
}

T(several_ready_cases_are_chosen_uniformly)
{
    queues_init(0);
    cr_assert_eq(tu_run(fair_main, (void *)(uintptr_t)0), 0);
    cr_log_info("hits: %d %d %d %d", g_hits[0], g_hits[1], g_hits[2], g_hits[3]);
    cr_assert_eq(g_hits[0], 0);
    /* Expected 133 each; below 80 is more than six standard deviations. */
    for (int i = 1; i < 4; i++)
        cr_assert_gt(g_hits[i], 80, "case %d chosen %d times of 400", i, g_hits[i]);
    for (int i = 1; i < 4; i++)
        ferry_queue_try_get(&g_q[i], &g_item);
    queues_destroy();
}

T(priority_flag_always_takes_the_first_ready_case)
{
    queues_init(0);
    cr_assert_eq(tu_run(fair_main, (void *)(uintptr_t)FERRY_SELECT_PRIORITY), 0);
    cr_assert_eq(g_hits[0], 0);
    cr_assert_eq(g_hits[1], 400);
    for (int i = 1; i < 4; i++)
        ferry_queue_try_get(&g_q[i], &g_item);
    queues_destroy();
}

static int disabled_main(void *arg)
{
    int v = 5;
    ferry_case c[5] = {
        FERRY_CASE_GET_INIT(&g_q[0], &g_item),
        FERRY_CASE_GET_INIT(NULL, &g_item),
        FERRY_CASE_FD_INIT(-1, FERRY_READ),
        FERRY_CASE_EVENT_INIT(&g_ev),
        { .kind = FERRY_CASE_NONE },
    };

    (void)arg;
    ferry_queue_put(&g_q[0], &v);
    ferry_event_set(&g_ev);
    c[0].flags = FERRY_CASE_OFF;
    c[3].flags = FERRY_CASE_OFF;
    g_rc[0] = ferry_select(c, 5, FERRY_SELECT_TRY);   /* nothing enabled is ready */
    c[3].flags = 0;
    g_rc[1] = ferry_select(c, 5, 0);                  /* switched on again */
    g_rc[2] = (int)ferry_queue_size(&g_q[0]);
    return 0;
}

T(disabled_cases_are_skipped)
{
    queues_init(0);
    cr_assert_eq(tu_run(disabled_main, NULL), 0);
    cr_assert_eq(g_rc[0], -EAGAIN);
    cr_assert_eq(g_rc[1], 3);
    cr_assert_eq(g_rc[2], 1);
    ferry_queue_try_get(&g_q[0], &g_item);
    queues_destroy();
}

/* ---- the cases that were not performed ------------------------------------ */

static int put_both(void *arg)
{
    int a = 1, b = 2;

    (void)arg;
    settle();
    /* Both in one turn: the select's two cases are granted one after
     * the other before it runs. */
    ferry_queue_put(&g_q[0], &a);
    ferry_queue_put(&g_q[1], &b);
    return 0;
}

static int plain_get(void *arg)
{
    int i = (int)(intptr_t)arg;

    return ferry_queue_get(&g_q[1], &g_val[i]);
}

static int two_grants_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item), FERRY_CASE_GET_INIT(&g_q[1], &g_item) };
    ferry_task *p, *g;

    (void)arg;
    p = spawn(put_both, NULL);
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = g_item;
    g_rc[2] = (int)ferry_queue_size(&g_q[0]);
    g_rc[3] = (int)ferry_queue_size(&g_q[1]);
    g_rc[4] = join(p);
    /* The element left in q1 is free for anyone. */
    g = spawn(plain_get, (void *)(intptr_t)2);
    g_rc[5] = join(g);
    return 0;
}

T(a_second_grant_in_the_same_turn_goes_to_nobody_else_but_stays)
{
    queues_init(0);
    cr_assert_eq(tu_run(two_grants_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "select returned %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 1);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 1, "q1 holds %d", g_rc[3]);
    cr_assert_eq(g_rc[4], 0);
    cr_assert_eq(g_rc[5], 0);
    cr_assert_eq(g_val[2], 2);
    queues_destroy();
}

static ferry_task *g_selector;

static int selector(void *arg)
{
    ferry_case c[3] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item), FERRY_CASE_GET_INIT(&g_q[1], &g_item),
                        FERRY_CASE_SIGNAL_INIT(g_sub) };

    (void)arg;
    g_item = -1;
    return ferry_select(c, g_sub ? 3 : 2, 0);
}

/* arg: 0 put then cancel, 1 cancel then put, in one turn. */
static int cancel_main(void *arg)
{
    int order = (int)(intptr_t)arg, v = 9, sig = SIGUSR2;
    ferry_task *g;

    if (ferry_sigsub_new(&g_sub, tu_loop, &sig, 1) != 0)
        return -1;
    g_selector = spawn(selector, NULL);
    settle();
    if (order == 0) {
        ferry_queue_put(&g_q[1], &v);
        raise(SIGUSR2);
        ferry_task_cancel(g_selector);
    } else {
        ferry_task_cancel(g_selector);
        ferry_queue_put(&g_q[1], &v);
        raise(SIGUSR2);
    }
    g_rc[0] = join(g_selector);
    g_rc[1] = g_item;
    g_rc[2] = (int)ferry_queue_size(&g_q[1]);
    /* The element is not held back by a reservation. */
    g = spawn(plain_get, (void *)(intptr_t)3);
    g_rc[3] = join(g);
    g_rc[4] = ferry_sigsub_try_recv(g_sub, &sig);
    ferry_sigsub_free(g_sub);
    g_sub = NULL;
    return 0;
}

static void check_cancel(int order)
{
    queues_init(0);
    cr_assert_eq(tu_run(cancel_main, (void *)(intptr_t)order), 0);
    cr_assert_eq(g_rc[0], -ECANCELED, "select returned %d", g_rc[0]);
    cr_assert_eq(g_rc[1], -1, "an element was taken: %d", g_rc[1]);
    cr_assert_eq(g_rc[2], 1);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_val[3], 9);
    cr_assert_eq(g_rc[4], 0, "the delivery was lost: %d", g_rc[4]);
    queues_destroy();
}

T(granted_then_cancelled_hands_the_grant_back)
{
    check_cancel(0);
}

T(cancelled_then_granted_hands_the_grant_back)
{
    check_cancel(1);
}

static int put_selector(void *arg)
{
    int v = 77;
    ferry_case c[2] = { FERRY_CASE_PUT_INIT(&g_q[0], &v), FERRY_CASE_EVENT_INIT(&g_ev) };

    (void)arg;
    return ferry_select(c, 2, 0);
}

static int put_cancel_main(void *arg)
{
    int one = 1, out = 0;
    ferry_task *t;

    (void)arg;
    ferry_queue_put(&g_q[0], &one);       /* capacity 1: full */
    t = spawn(put_selector, NULL);
    settle();
    ferry_queue_get(&g_q[0], &out);        /* the slot is promised to the select */
    ferry_task_cancel(t);
    g_rc[0] = join(t);
    g_rc[1] = (int)ferry_queue_size(&g_q[0]);
    g_rc[2] = ferry_queue_try_put(&g_q[0], &one);   /* the slot is free again */
    return 0;
}

T(cancelled_put_inserts_nothing_and_frees_its_slot)
{
    queues_init(1);
    cr_assert_eq(tu_run(put_cancel_main, NULL), 0);
    cr_assert_eq(g_rc[0], -ECANCELED);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0);
    ferry_queue_try_get(&g_q[0], &g_item);
    queues_destroy();
}

static int shutdown_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item), FERRY_CASE_EVENT_INIT(&g_ev) };

    (void)arg;
    ferry_queue_shutdown(&g_q[0], false);
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = c[0].result;
    return 0;
}

T(a_shut_down_queue_is_a_ready_case_with_its_error)
{
    queues_init(0);
    cr_assert_eq(tu_run(shutdown_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], -ESHUTDOWN);
    queues_destroy();
}

/* ---- bad input ------------------------------------------------------------ */

static int bad_main(void *arg)
{
    ferry_case c[FERRY_SELECT_MAX + 1];
    ferry_case one = FERRY_CASE_GET_INIT(&g_q[0], NULL);

    (void)arg;
    memset(c, 0, sizeof c);
    g_rc[0] = ferry_select(NULL, 1, 0);
    g_rc[1] = ferry_select(c, FERRY_SELECT_MAX + 1, 0);
    g_rc[2] = ferry_select(c, 1, 0x80);
    c[0].kind = 99;
    g_rc[3] = ferry_select(c, 1, 0);
    g_rc[4] = ferry_select(&one, 1, 0);
    one = FERRY_CASE_JOIN_INIT(ferry_task_current());
    g_rc[5] = ferry_select(&one, 1, 0);
    one = FERRY_CASE_FD_INIT(0, 0);
    g_rc[6] = ferry_select(&one, 1, 0);
    return 0;
}

T(bad_input)
{
    ferry_case c = FERRY_CASE_EVENT_INIT(&g_ev);

    queues_init(0);
    cr_assert_eq(ferry_select(&c, 1, 0), -EPERM);
    cr_assert_eq(tu_run(bad_main, NULL), 0);
    cr_assert_eq(g_rc[0], -EINVAL);
    cr_assert_eq(g_rc[1], -EINVAL);
    cr_assert_eq(g_rc[2], -EINVAL);
    cr_assert_eq(g_rc[3], -EINVAL);
    cr_assert_eq(g_rc[4], -EINVAL);
    cr_assert_eq(g_rc[5], -EDEADLK);
    cr_assert_eq(g_rc[6], -EINVAL);
    queues_destroy();
}

/* Two cases waiting on one stream: the readiness wake grants the first,
 * whose grant unlinks the second from the same wait queue. */
static int same_stream_main(void *arg)
{
    ferry_case c[3] = { FERRY_CASE_STREAM_INIT(NULL, FERRY_READ), FERRY_CASE_EVENT_INIT(&g_ev),
                        FERRY_CASE_STREAM_INIT(NULL, FERRY_READ) };
    ferry_task *t;
    char buf[8];
    size_t n = 0;

    (void)arg;
    if (ferry_stream_open(&g_stream, tu_loop, sock_fds[0], NULL) != 0)
        return -1;
    c[0].obj = c[2].obj = g_stream;
    t = spawn(sock_write_later, NULL);
    g_rc[0] = ferry_select(c, 3, 0);
    g_rc[1] = join(t);
    g_rc[2] = ferry_stream_read(g_stream, buf, sizeof buf, &n);
    g_rc[3] = (int)n;
    return ferry_stream_close(g_stream);
}

T(two_cases_on_one_stream)
{
    queues_init(0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sock_fds), 0);
    cr_assert_eq(tu_run(same_stream_main, NULL), 0);
    cr_assert(g_rc[0] == 0 || g_rc[0] == 2, "select returned %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 5);
    close(sock_fds[1]);
    queues_destroy();
}

/* ---- channel cases ---------------------------------------------------------- */

static ferry_chan *g_ch;
static atomic_int g_go;

static void *thread_send(void *arg)
{
    tu_spin_until(&g_go);
    ferry_chan_send_blocking(g_ch, arg, -1);
    return NULL;
}

static int chan_recv_main(void *arg)
{
    void *got = NULL;
    ferry_case c[2] = { FERRY_CASE_EVENT_INIT(&g_ev), FERRY_CASE_RECV_INIT(g_ch, &got) };
    pthread_t th = tu_start_thread(thread_send, (void *)(intptr_t)0x55);

    (void)arg;
    atomic_store(&g_go, 1);
    g_rc[0] = ferry_select(c, 2, 0);      /* woken from the thread */
    g_rc[1] = c[1].result;
    g_rc[2] = (int)(intptr_t)got;
    pthread_join(th, NULL);
    /* A send case: room, so performed at once. */
    c[1] = FERRY_CASE_SEND_INIT(g_ch, (void *)(intptr_t)0x66);
    g_rc[3] = ferry_select(c, 2, 0);
    g_rc[4] = ferry_chan_try_recv(g_ch, &got);
    g_rc[5] = (int)(intptr_t)got;
    return 0;
}

T(chan_recv_case_is_woken_by_a_thread_and_send_case_sends)
{
    queues_init(0);
    cr_assert_eq(ferry_chan_new(&g_ch, 1), 0);
    cr_assert_eq(tu_run(chan_recv_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0x55);
    cr_assert_eq(g_rc[3], 1);
    cr_assert_eq(g_rc[4], 0);
    cr_assert_eq(g_rc[5], 0x66);
    ferry_chan_free(g_ch);
    queues_destroy();
}

static int chan_lose_main(void *arg)
{
    void *got = NULL;
    ferry_case c[2] = { FERRY_CASE_GET_INIT(&g_q[0], &g_item), FERRY_CASE_RECV_INIT(g_ch, &got) };
    ferry_task *t = spawn(put_later, (void *)(intptr_t)3);

    (void)arg;
    /* The queue wins; the channel case took nothing, and a send from a
     * thread afterwards stays in the channel. */
    g_rc[0] = ferry_select(c, 2, 0);
    g_rc[1] = join(t);
    if (ferry_chan_send_blocking(g_ch, (void *)(intptr_t)0x77, 0) != 0)
        return -1;
    g_rc[2] = (int)ferry_chan_len(g_ch);
    g_rc[3] = got == NULL;
    /* Now the channel case wins at once; the empty queue is untouched. */
    g_rc[4] = ferry_select(c, 2, 0);
    g_rc[5] = (int)(intptr_t)got;
    return 0;
}

T(chan_case_that_lost_takes_nothing)
{
    queues_init(0);
    cr_assert_eq(ferry_chan_new(&g_ch, 1), 0);
    cr_assert_eq(tu_run(chan_lose_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_item, 3);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 1);
    cr_assert_eq(g_rc[3], 1);
    cr_assert_eq(g_rc[4], 1);
    cr_assert_eq(g_rc[5], 0x77);
    ferry_chan_free(g_ch);
    queues_destroy();
}

/* A wake that reaches a select whose other case wins in the same turn is
 * passed on: a plain receiver waiting behind it gets the item. */
static int chan_selector(void *arg)
{
    void *got = NULL;
    ferry_case c[2] = { FERRY_CASE_RECV_INIT(g_ch, &got), FERRY_CASE_EVENT_INIT(&g_ev) };

    (void)arg;
    return ferry_select(c, 2, 0);
}

static int chan_receiver(void *arg)
{
    void *got = NULL;
    int rc;

    (void)arg;
    rc = ferry_chan_recv(g_ch, &got);
    return rc ? rc : (int)(intptr_t)got;
}

static int chan_pass_main(void *arg)
{
    ferry_task *s, *r;

    (void)arg;
    s = spawn(chan_selector, NULL);
    settle();                     /* the selector parks first */
    r = spawn(chan_receiver, NULL);
    settle();
    /* Same thread, same turn: the send wakes the selector's node, then
     * the event wins before the selector runs. */
    ferry_event_set(&g_ev);
    ferry_chan_try_send(g_ch, (void *)(intptr_t)0x99);
    g_rc[0] = join(s);
    g_rc[1] = join(r);
    return 0;
}

T(chan_wake_reaching_a_select_that_took_another_case_is_passed_on)
{
    queues_init(0);
    cr_assert_eq(ferry_chan_new(&g_ch, 1), 0);
    cr_assert_eq(tu_run(chan_pass_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], 0x99);
    ferry_chan_free(g_ch);
    queues_destroy();
}

/* ---- a channel wake on its way while the select unwinds --------------------- */

/* These tests need the inbox to stay undrained while tasks take turns: the
 * loop polls (and so drains what threads posted) only when nothing is
 * ready, never every few steps. */
static void polls_when_idle_setup(void)
{
    ferry_loop_opts o = { .io_interval = 1u << 30 };

    tu_alloc_setup();
    cr_assert_eq(ferry_loop_new(&tu_loop, &o), 0);
    ferry_loop_set_slow_threshold(tu_loop, 0);
}

#define T_IDLE_POLL(name) \
    Test(select, name, .init = polls_when_idle_setup, .fini = tu_loop_teardown, .timeout = 20.)

static ferry_chan *g_ch2;

/* A thread's send, done while the loop's thread waits for it: the wake of
 * the task it pops stays in the inbox until the loop next polls. */
static void *thread_try_send(void *arg)
{
    return (void *)(intptr_t)ferry_chan_send_blocking(g_ch, arg, 0);
}

/* A select that never returns cannot be reported from the loop: the test
 * process ends with a message instead of hanging until its timeout. */
static int join_or_die(ferry_task *t, const char *what)
{
    ferry_scope sc;
    int st = -99999, rc;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(5000), 0);
    rc = ferry_task_join(t, &st);
    ferry_scope_exit(&sc);
    if (rc == -ETIMEDOUT) {
        fprintf(stderr, "%s: has not returned 5 s later\n", what);
        fflush(stderr);
        _exit(3);
    }
    return rc ? -99998 : st;
}

/* The other case of a select whose channel case a thread's wake took out,
 * made ready while the select unwinds and waits for that wake. */
enum { OTHER_GET, OTHER_PUT, OTHER_EVENT, OTHER_JOIN, OTHER_SIGNAL };

static ferry_event g_ev2;
static ferry_task *g_target;      /* OTHER_JOIN: the task the case joins */

static int end_on_ev2(void *arg)
{
    (void)arg;
    ferry_event_wait(&g_ev2);
    return 5;
}

static int sel_chan_and_other(void *arg)
{
    static const int one = 1;
    int kind = (int)(intptr_t)arg;
    void *got = NULL;
    ferry_case c[2] = { FERRY_CASE_RECV_INIT(g_ch, &got), FERRY_CASE_JOIN_INIT(g_target) };

    if (kind == OTHER_GET)
        c[1] = FERRY_CASE_GET_INIT(&g_q[0], &g_item);
    else if (kind == OTHER_PUT)
        c[1] = FERRY_CASE_PUT_INIT(&g_q[1], &one);
    else if (kind == OTHER_EVENT)
        c[1] = FERRY_CASE_EVENT_INIT(&g_ev);
    else if (kind == OTHER_SIGNAL)
        c[1] = FERRY_CASE_SIGNAL_INIT(g_sub);
    g_rc[1] = ferry_select(c, 2, 0);
    g_rc[2] = got != NULL;
    return 0;
}

static int wake_on_its_way_other_main(void *arg)
{
    int kind = (int)(intptr_t)arg, v = 7, sig = SIGUSR1;
    ferry_task *s;
    void *got = NULL;

    g_target = kind == OTHER_JOIN ? spawn(end_on_ev2, NULL) : NULL;
    if (kind == OTHER_SIGNAL && ferry_sigsub_new(&g_sub, tu_loop, &sig, 1) != 0)
        return -1;
    if (kind == OTHER_PUT && ferry_queue_put(&g_q[1], &v) != 0)    /* full */
        return -1;
    s = spawn(sel_chan_and_other, arg);
    settle();                                /* parked on both cases */
    g_rc[0] = (int)(intptr_t)tu_on_thread(thread_try_send, (void *)(intptr_t)0x55);
    ferry_task_cancel(s);
    ferry_yield();          /* s unwinds: its channel wake is still on its way */
    switch (kind) {         /* meanwhile its other case becomes ready */
    case OTHER_GET:
        g_rc[3] = ferry_queue_put(&g_q[0], &v);
        break;
    case OTHER_PUT:
        g_rc[3] = ferry_queue_get(&g_q[1], &g_val[1]);
        break;
    case OTHER_EVENT:
        g_rc[3] = ferry_event_set(&g_ev);
        break;
    case OTHER_JOIN:
        g_rc[3] = ferry_event_set(&g_ev2);
        ferry_yield();      /* the target ends */
        break;
    default:
        g_rc[3] = raise(SIGUSR1);   /* the loop sees it at its next poll */
        break;
    }
    g_rc[4] = join_or_die(s, "select cancelled while its channel wake was on its way");
    /* What the other case would have taken is still there. */
    switch (kind) {
    case OTHER_GET:
        g_rc[5] = ferry_queue_try_get(&g_q[0], &g_val[0]) == 0 && g_val[0] == 7;
        break;
    case OTHER_PUT:
        g_rc[5] = ferry_queue_size(&g_q[1]) == 0;
        break;
    case OTHER_EVENT:
        g_rc[5] = ferry_event_is_set(&g_ev);
        break;
    case OTHER_JOIN:
        g_rc[5] = join(g_target) == 5;
        break;
    default:
        g_rc[5] = ferry_sigsub_try_recv(g_sub, &sig) == 0 && sig == SIGUSR1;
        ferry_sigsub_free(g_sub);
        g_sub = NULL;
        break;
    }
    g_rc[6] = ferry_chan_try_recv(g_ch, &got) == 0 && got == (void *)(intptr_t)0x55;
    return 0;
}

/* Cancelled while a thread's wake of its channel case travels through the
 * inbox, a select waits for that wake before it frees the case.  Its other
 * case becoming ready meanwhile neither keeps it from returning -ECANCELED
 * nor is taken: a queue's element or room, an event, a task to join, a
 * signal's delivery (which reaches the loop at the same poll as the
 * wake). */
static void wake_on_its_way_other(int kind)
{
    queues_init(1);
    cr_assert_eq(ferry_event_init(&g_ev2), 0);
    cr_assert_eq(ferry_chan_new(&g_ch, 1), 0);
    cr_assert_eq(tu_run(wake_on_its_way_other_main, (void *)(intptr_t)kind), 0);
    cr_assert_eq(g_rc[0], 0, "the thread's send: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], -ECANCELED, "select returned %d", g_rc[1]);
    cr_assert_eq(g_rc[2], 0, "the channel case received");
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_rc[4], 0);
    cr_assert(g_rc[5], "the other case took what it would have taken");
    cr_assert(g_rc[6], "the thread's item is not in the channel");
    ferry_chan_free(g_ch);
    cr_assert_eq(ferry_event_destroy(&g_ev2), 0);
    queues_destroy();
}

T_IDLE_POLL(cancelled_with_a_chan_wake_on_its_way_leaves_a_queue_element_alone)
{
    wake_on_its_way_other(OTHER_GET);
}

T_IDLE_POLL(cancelled_with_a_chan_wake_on_its_way_leaves_queue_room_alone)
{
    wake_on_its_way_other(OTHER_PUT);
}

T_IDLE_POLL(cancelled_with_a_chan_wake_on_its_way_leaves_an_event_alone)
{
    wake_on_its_way_other(OTHER_EVENT);
}

T_IDLE_POLL(cancelled_with_a_chan_wake_on_its_way_leaves_a_task_to_join_alone)
{
    wake_on_its_way_other(OTHER_JOIN);
}

T_IDLE_POLL(cancelled_with_a_chan_wake_on_its_way_leaves_a_signal_delivery_alone)
{
    wake_on_its_way_other(OTHER_SIGNAL);
}

static int sel_two_chans(void *arg)
{
    void *got = NULL, *got2 = NULL;
    ferry_case c[2] = { FERRY_CASE_RECV_INIT(g_ch, &got), FERRY_CASE_RECV_INIT(g_ch2, &got2) };

    (void)arg;
    g_rc[1] = ferry_select(c, 2, 0);
    g_rc[2] = got != NULL || got2 != NULL;
    return 0;
}

static int recv_ch2(void *arg)
{
    void *got = NULL;
    int rc;

    (void)arg;
    rc = ferry_chan_recv(g_ch2, &got);
    return rc ? rc : (int)(intptr_t)got;
}

static int wake_on_its_way_chan_main(void *arg)
{
    ferry_task *s, *r;

    (void)arg;
    s = spawn(sel_two_chans, NULL);
    settle();
    r = spawn(recv_ch2, NULL);              /* waits behind the select */
    settle();
    g_rc[0] = (int)(intptr_t)tu_on_thread(thread_try_send, (void *)(intptr_t)0x55);
    ferry_task_cancel(s);
    ferry_yield();          /* s unwinds: its first channel's wake is on its way */
    g_rc[3] = ferry_chan_try_send(g_ch2, (void *)(intptr_t)0x66);
    g_rc[4] = join_or_die(s, "select cancelled while its channel wake was on its way");
    g_rc[5] = join_or_die(r, "receiver behind the cancelled select");
    g_rc[6] = (int)ferry_chan_len(g_ch);
    return 0;
}

/* The same with a second channel case, woken on the loop's thread while
 * the first one's wake travels: the select returns -ECANCELED and that
 * wake reaches the receiver waiting behind it. */
T_IDLE_POLL(cancelled_with_a_chan_wake_on_its_way_passes_the_other_chans_wake_on)
{
    queues_init(0);
    cr_assert_eq(ferry_chan_new(&g_ch, 1), 0);
    cr_assert_eq(ferry_chan_new(&g_ch2, 1), 0);
    cr_assert_eq(tu_run(wake_on_its_way_chan_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "the thread's send: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], -ECANCELED, "select returned %d", g_rc[1]);
    cr_assert_eq(g_rc[2], 0, "a channel case received");
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_rc[4], 0);
    cr_assert_eq(g_rc[5], 0x66, "the receiver got %d", g_rc[5]);
    cr_assert_eq(g_rc[6], 1, "the thread's item is not in the channel");
    ferry_chan_free(g_ch2);
    ferry_chan_free(g_ch);
    queues_destroy();
}

/* ---- allocation failures ---------------------------------------------------- */

__attribute__((constructor)) static void route_libevent(void)
{
    tu_libevent_fault_hook(NULL);
}

static int g_bad, g_fhits[2], g_runs[2];

/* Arm the cases that allocate (a channel's node, an fd's event), fail the
 * nth allocation point: -ENOMEM with nothing left registered, or the
 * deadline case. */
static int fault_main(void *arg)
{
    void *got = NULL;
    ferry_case c[3] = { FERRY_CASE_RECV_INIT(g_ch, &got), FERRY_CASE_FD_INIT(pipe_fds[0], FERRY_READ),
                        FERRY_CASE_DEADLINE_INIT(0) };

    (void)arg;
    for (int persist = 0; persist < 2; persist++) {
        for (unsigned long nth = 1; nth < 12; nth++) {
            long live = ferry__alloc_live();
            int rc;
            unsigned long hits;

            c[2].at = ferry_now() + tu_ms(1);
            ferry__fault_arm(nth, persist);
            rc = ferry_select(c, 3, 0);
            hits = ferry__fault_hits();
            ferry__fault_reset();
            g_runs[persist]++;
            if (hits) {
                g_fhits[persist]++;
                if (rc != -ENOMEM && rc != 2)
                    g_bad++;
            } else if (rc != 2) {
                g_bad++;
            }
            if (ferry__alloc_live() != live || got != NULL)
                g_bad++;
        }
    }
    return 0;
}

T(allocation_failures_leave_nothing_registered)
{
    queues_init(0);
    cr_assert_eq(pipe(pipe_fds), 0);
    cr_assert_eq(ferry_chan_new(&g_ch, 1), 0);
    cr_assert_eq(tu_run(fault_main, NULL), 0);
    cr_assert_eq(g_bad, 0);
    cr_assert_gt(g_fhits[0], 0);
    cr_assert_gt(g_fhits[1], 0);
    cr_assert_eq(ferry_chan_len(g_ch), 0);
    ferry_chan_free(g_ch);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    queues_destroy();
}

/* Writable: a fresh socket has room, so both the fd and the stream case
 * are ready at once and report FERRY_WRITE; a full pipe is not writable. */
static int writable_main(void *arg)
{
    ferry_case c[2] = { FERRY_CASE_EVENT_INIT(&g_ev), FERRY_CASE_STREAM_INIT(NULL, FERRY_WRITE) };
    ferry_case f[2] = { FERRY_CASE_EVENT_INIT(&g_ev), FERRY_CASE_FD_INIT(pipe_fds[1], FERRY_WRITE) };
    char junk[4096] = { 0 };

    (void)arg;
    if (ferry_stream_open(&g_stream, tu_loop, sock_fds[0], NULL) != 0)
        return -1;
    c[1].obj = g_stream;
    g_rc[0] = ferry_select(c, 2, FERRY_SELECT_TRY);
    g_rc[1] = c[1].value;
    g_rc[2] = ferry_select(f, 2, FERRY_SELECT_TRY);
    g_rc[3] = f[1].value;
    while (write(pipe_fds[1], junk, sizeof junk) > 0)
        ;
    g_rc[4] = ferry_select(f, 2, FERRY_SELECT_TRY);
    return ferry_stream_close(g_stream);
}

T(writable_cases)
{
    queues_init(0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sock_fds), 0);
    cr_assert_eq(pipe2(pipe_fds, O_NONBLOCK), 0);
    cr_assert_eq(tu_run(writable_main, NULL), 0);
    cr_assert_eq(g_rc[0], 1);
    cr_assert_eq(g_rc[1], FERRY_WRITE);
    cr_assert_eq(g_rc[2], 1);
    cr_assert_eq(g_rc[3], FERRY_WRITE);
    cr_assert_eq(g_rc[4], -EAGAIN);
    close(sock_fds[1]);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    queues_destroy();
}

/* ---- a stream case for both directions, a descriptor that is not open, an
 * fd case for both directions waiting next to a disabled case ------------- */

static int pipe2_fds[2];

static int pipe_write_later(void *arg)
{
    (void)arg;
    settle();
    return write(pipe2_fds[1], "x", 1) == 1 ? 0 : -1;
}

static int fd_more_main(void *arg)
{
    int closed_fd = (int)(intptr_t)arg;
    ferry_case c[2];
    ferry_task *t;

    if (ferry_stream_open(&g_stream, tu_loop, sock_fds[0], NULL) != 0)
        return -1;
    /* A stream case waits for one direction only. */
    c[0] = FERRY_CASE_STREAM_INIT(g_stream, FERRY_READ | FERRY_WRITE);
    g_rc[0] = ferry_select(c, 1, 0);
    /* A descriptor that is not open is a ready case with -EBADF. */
    c[0] = FERRY_CASE_FD_INIT(closed_fd, FERRY_READ);
    g_rc[1] = ferry_select(c, 1, 0);
    g_rc[2] = c[0].result;
    /* The read end of a pipe never becomes writable: the case waits for
     * both directions, and reports the one that came.  The disabled case
     * next to it is skipped while the select waits. */
    c[0] = FERRY_CASE_EVENT_INIT(&g_ev);
    c[0].flags = FERRY_CASE_OFF;
    c[1] = FERRY_CASE_FD_INIT(pipe2_fds[0], FERRY_READ | FERRY_WRITE);
    ferry_event_set(&g_ev);
    t = spawn(pipe_write_later, NULL);
    g_rc[3] = ferry_select(c, 2, 0);
    g_rc[4] = c[1].result;
    g_rc[5] = c[1].value;
    g_rc[6] = join(t);
    return ferry_stream_close(g_stream);
}

T(fd_and_stream_cases_for_both_directions_and_a_descriptor_not_open)
{
    int closed_fd;

    queues_init(0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sock_fds), 0);
    cr_assert_eq(pipe(pipe2_fds), 0);
    /* A descriptor number that no file holds, high enough that no
     * descriptor the test opens meanwhile takes it. */
    closed_fd = 900;
    cr_assert_eq(fcntl(closed_fd, F_GETFD), -1);
    cr_assert_eq(errno, EBADF);
    cr_assert_eq(tu_run(fd_more_main, (void *)(intptr_t)closed_fd), 0);
    cr_assert_eq(g_rc[0], -EINVAL);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], -EBADF);
    cr_assert_eq(g_rc[3], 1);
    cr_assert_eq(g_rc[4], 0);
    cr_assert_eq(g_rc[5], FERRY_READ);
    cr_assert_eq(g_rc[6], 0);
    close(sock_fds[1]);
    close(pipe2_fds[0]);
    close(pipe2_fds[1]);
    queues_destroy();
}

/* ---- a stream case that is ready at once: bytes already buffered, the
 * peer's end, the peer's reset; a stream closed under a waiting case ------ */

static ferry_stream *g_st[4];

static int close_stream_later(void *arg)
{
    (void)arg;
    settle();
    return ferry_stream_close(g_st[3]);
}

static int stream_ready_main(void *arg)
{
    int *fds = arg;    /* four socketpairs, [2 * i] is stream i's end */
    ferry_case c[1];
    char buf[8];
    size_t n = 99;
    ferry_task *t;

    (void)arg;
    for (int i = 0; i < 4; i++)
        if (ferry_stream_open(&g_st[i], tu_loop, fds[2 * i], NULL) != 0)
            return -1;
    /* 0: a line read leaves "cd" in the stream's buffer. */
    if (write(fds[1], "ab\ncd", 5) != 5 ||
        ferry_stream_read_until(g_st[0], "\n", 1, buf, sizeof buf, &n) != 0)
        return -2;
    c[0] = FERRY_CASE_STREAM_INIT(g_st[0], FERRY_READ);
    g_rc[0] = ferry_select(c, 1, 0);
    g_val[0] = c[0].value;
    /* 1: the peer has gone without a byte: the end is ready to read. */
    close(fds[3]);
    c[0] = FERRY_CASE_STREAM_INIT(g_st[1], FERRY_READ);
    g_rc[1] = ferry_select(c, 1, 0);
    g_val[1] = c[0].value;
    g_rc[2] = ferry_stream_read(g_st[1], buf, sizeof buf, &n);
    g_val[2] = (int)n;
    /* 2: the peer closed with our bytes unread: a reset, ready to read. */
    if (write(fds[4], "zz", 2) != 2)
        return -3;
    close(fds[5]);
    c[0] = FERRY_CASE_STREAM_INIT(g_st[2], FERRY_READ);
    g_rc[3] = ferry_select(c, 1, 0);
    g_val[3] = c[0].value;
    g_rc[4] = ferry_stream_read(g_st[2], buf, sizeof buf, &n);
    /* 3: closed while the case waits: performed with -EBADF. */
    t = spawn(close_stream_later, NULL);
    c[0] = FERRY_CASE_STREAM_INIT(g_st[3], FERRY_READ);
    g_rc[5] = ferry_select(c, 1, 0);
    g_val[5] = c[0].result;
    g_rc[6] = join(t);
    for (int i = 0; i < 3; i++)
        ferry_stream_close(g_st[i]);
    return 0;
}

T(stream_cases_ready_at_once_and_a_stream_closed_under_a_waiting_case)
{
    int fds[8];

    queues_init(0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, &fds[2 * i]), 0);
    cr_assert_eq(tu_run(stream_ready_main, fds), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_val[0], FERRY_READ);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_val[1], FERRY_READ);
    cr_assert_eq(g_rc[2], 0);              /* the end: 0 bytes */
    cr_assert_eq(g_val[2], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_val[3], FERRY_READ);
    cr_assert_eq(g_rc[4], -ECONNRESET, "read after the reset: %d", g_rc[4]);
    cr_assert_eq(g_rc[5], 0);
    cr_assert_eq(g_val[5], -EBADF);
    cr_assert_eq(g_rc[6], 0);
    close(fds[1]);
    close(fds[7]);
    queues_destroy();
}

/* ---- objects of another loop ---------------------------------------------- */

static ferry_event g_fev = FERRY_EVENT_INIT;
static ferry_task *g_ftask;
static atomic_int g_fready, g_fdone;
static int g_frc[3];

static int foreign_loop_main(void *arg)
{
    (void)arg;
    g_frc[0] = ferry_event_set(&g_fev);            /* binds it to this loop */
    g_frc[1] = ferry_task_spawn(&g_ftask, NULL, tu_ret42, NULL, NULL);
    ferry_yield();
    atomic_store(&g_fready, 1);
    tu_task_wait_flag(&g_fdone);
    g_frc[2] = tu_join(g_ftask);
    return 0;
}

static void *foreign_loop_thread(void *arg)
{
    ferry_loop *loop2;

    (void)arg;
    if (ferry_loop_new(&loop2, NULL) != 0) {
        atomic_store(&g_fready, -1);
        return NULL;
    }
    tu_run_on(loop2, foreign_loop_main, NULL);
    ferry_event_destroy(&g_fev);
    ferry_loop_free(loop2);
    return NULL;
}

static int foreign_select_main(void *arg)
{
    ferry_case c[1];

    (void)arg;
    c[0] = FERRY_CASE_EVENT_INIT(&g_fev);
    g_rc[0] = ferry_select(c, 1, 0);
    c[0] = FERRY_CASE_JOIN_INIT(g_ftask);
    g_rc[1] = ferry_select(c, 1, FERRY_SELECT_TRY);
    return 0;
}

/* An event bound to another loop, a task of another loop: -EPERM, and
 * nothing performed (the other loop's task is still joinable there). */
T(objects_of_another_loop_are_eperm)
{
    pthread_t th = tu_start_thread(foreign_loop_thread, NULL);

    while (atomic_load(&g_fready) == 0)
        usleep(200);
    cr_assert_eq(atomic_load(&g_fready), 1);
    cr_assert_eq(tu_run(foreign_select_main, NULL), 0);
    atomic_store(&g_fdone, 1);
    pthread_join(th, NULL);
    cr_assert_eq(g_frc[0], 0);
    cr_assert_eq(g_frc[1], 0);
    cr_assert_eq(g_rc[0], -EPERM);
    cr_assert_eq(g_rc[1], -EPERM);
    cr_assert_eq(g_frc[2], 42);
}
