/* test_task.c - ferry/task.h: tasks (spawn, join, detach, cancel, yield,
 * sleep), deadline and shield scopes, task groups.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

/* Tests that make their own loops. */
#define TL(suite, name) Test(suite, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 60.)

/* ---- sleep order ---------------------------------------------------- */

#define NSLEEP 10000
static int64_t deadlines[NSLEEP];
static int wake_order[NSLEEP];
static bool late[NSLEEP];
static int nwaiting, nwoken, nlate;
static ferry_event sleepers_go;

/* Every sleeper waits on the event until all have started; the deadline is
 * then taken from the moment each one is resumed, at least 50 ms ahead, so
 * that however long spawning and resuming ten thousand tasks takes, each
 * goes to sleep before its deadline.  The 200 ms spread is far wider than
 * the time between two resumptions, so the deadlines come in random order
 * and the timers, not the order the tasks were resumed in, decide the
 * wake-up order. */
static int sleep_one(void *arg)
{
    int i = (int)(intptr_t)arg;
    int64_t now;
    int rc;

    nwaiting++;
    rc = ferry_event_wait(&sleepers_go);
    if (rc)
        return rc;
    now = ferry_now();
    deadlines[i] = now + tu_ms(50) + (int64_t)(rand() % 200000) * 1000;
    /* Only a stall of 50 ms between the two clock readings can make a
     * deadline pass before the sleep starts; such a task would only yield
     * and say nothing about the order, so it is left out of the check. */
    if (ferry_now() >= deadlines[i]) {
        late[i] = true;
        nlate++;
    }
    rc = ferry_sleep_until(deadlines[i]);
    if (rc == 0 && !late[i])
        wake_order[nwoken++] = i;
    return rc;
}

T(task, ten_thousand_sleepers_wake_in_deadline_order)
{
    for (int i = 0; i < NSLEEP; i++)
        cr_assert_eq(ferry_task_spawn(NULL, tu_loop, sleep_one, (void *)(intptr_t)i, NULL), 0);
    while (nwaiting < NSLEEP)
        cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    srand(1234);
    cr_assert_eq(ferry_event_set(&sleepers_go), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(nwoken + nlate, NSLEEP);
    cr_assert_gt(nwoken, NSLEEP / 2, "only %d of %d tasks were asleep", nwoken, NSLEEP);
    for (int i = 1; i < nwoken; i++)
        cr_assert(deadlines[wake_order[i - 1]] <= deadlines[wake_order[i]],
                  "task %d (deadline %lld) woke before %d (deadline %lld)",
                  wake_order[i - 1], (long long)deadlines[wake_order[i - 1]],
                  wake_order[i], (long long)deadlines[wake_order[i]]);
}

/* ---- join, spawn ------------------------------------------------------ */

static int ret_arg_plus_one(void *arg)
{
    return (int)(intptr_t)arg + 1;
}

static int join_finished_main(void *arg)
{
    ferry_task *t;
    int st = 0, rc;

    rc = ferry_task_spawn(&t, NULL, ret_arg_plus_one, (void *)41, NULL);
    if (rc)
        return rc;
    for (int i = 0; i < 3; i++)
        ferry_yield();
    if (ferry_task_state(t) != FERRY_TASK_DONE)
        return -1000;
    rc = ferry_task_join(t, &st);
    return rc ? rc : st;
}

T(task, join_of_a_finished_task_returns_its_status)
{
    cr_assert_eq(tu_run(join_finished_main, NULL), 42);
}

static int join_self_main(void *arg)
{
    return ferry_task_join(ferry_task_current(), NULL);
}

T(task, join_self_is_edeadlk)
{
    /* The handle belongs to tu_run, which still gets it back afterwards. */
    cr_assert_eq(tu_run(join_self_main, NULL), -EDEADLK);
}

static int spawned_from_cb;
static ferry_task *cb_task;

static int mark_cb_task(void *arg)
{
    spawned_from_cb = 7;
    return 0;
}

static void spawn_from_callback(void *arg)
{
    cr_expect_eq(ferry_task_spawn(&cb_task, tu_loop, mark_cb_task, NULL, NULL), 0);
}

T(task, spawn_from_a_callback)
{
    int st = -1;
    cr_assert_eq(ferry_call_soon(tu_loop, spawn_from_callback, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(spawned_from_cb, 7);
    cr_assert_eq(ferry_task_try_join(cb_task, &st), 0);
    cr_assert_eq(st, 0);
}

/* A program spawns its first tasks on the loop's thread before the loop
 * runs: they wait for the run and then start in spawn order, with `loop`
 * given or NULL (the thread's loop); another thread is refused. */
static int early_order[4];
static int early_n;

static int early_task(void *arg)
{
    early_order[early_n++] = (int)(intptr_t)arg;
    return (int)(intptr_t)arg;
}

static void *spawn_from_other_thread(void *arg)
{
    ferry_task *t = NULL;

    return (void *)(intptr_t)ferry_task_spawn(&t, arg, early_task, (void *)9, NULL);
}

T(task, spawn_before_the_loop_runs_starts_with_the_run)
{
    ferry_task *a, *b;
    ferry_task_opts eager = { .flags = FERRY_SPAWN_EAGER };
    int st = 0;
    void *res;
    pthread_t th;

    cr_assert_eq(ferry_task_spawn(&a, tu_loop, early_task, (void *)1, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&b, NULL, early_task, (void *)2, &eager), 0);
    cr_assert_eq(ferry_task_spawn(NULL, NULL, early_task, (void *)3, NULL), 0);
    cr_assert_eq(early_n, 0, "a task ran before the loop did");
    cr_assert_eq(pthread_create(&th, NULL, spawn_from_other_thread, tu_loop), 0);
    pthread_join(th, &res);
    cr_assert_eq((intptr_t)res, -EPERM);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(early_n, 3);
    cr_assert_eq(early_order[0], 1);
    cr_assert_eq(early_order[1], 2);
    cr_assert_eq(early_order[2], 3);
    cr_assert_eq(ferry_task_join(a, &st), -EPERM);   /* not in a task */
    cr_assert_eq(ferry_task_try_join(a, &st), 0);
    cr_assert_eq(st, 1);
    cr_assert_eq(ferry_task_try_join(b, &st), 0);
    cr_assert_eq(st, 2);
}

static int spawn_chain(void *arg)
{
    int depth = (int)(intptr_t)arg, st = 0;
    ferry_task *t;

    if (depth == 0)
        return 1;
    if (ferry_task_spawn(&t, NULL, spawn_chain, (void *)(intptr_t)(depth - 1), NULL))
        return -1;
    if (ferry_task_join(t, &st))
        return -1;
    return st + 1;
}

T(task, spawn_from_a_task_nested)
{
    cr_assert_eq(tu_run(spawn_chain, (void *)50), 51);
}

/* ---- FERRY_SPAWN_EAGER ------------------------------------------------- */

static char ev_log[64];
static int ev_n;
static void *eager_local_addr[4];

static void ev_mark(char c)
{
    if (ev_n < (int)sizeof ev_log - 1)
        ev_log[ev_n++] = c;
}

static const ferry_task_opts eager_opts = { .name = "eager", .flags = FERRY_SPAWN_EAGER };

/* Ends without suspending; records where its stack is. */
static int eager_quick(void *arg)
{
    /* The frame address, not a local's: ASan may move locals to a fake stack. */
    eager_local_addr[(intptr_t)arg] = __builtin_frame_address(0);
    ev_mark('q');
    return 5;
}

/* Suspends once in the middle. */
static int eager_yielder(void *arg)
{
    (void)arg;
    ev_mark('a');
    ferry_yield();
    ev_mark('b');
    return 0;
}

static int eager_other(void *arg)
{
    (void)arg;
    ev_mark('o');
    return 0;
}

static int eager_order_main(void *arg)
{
    ferry_task *t;
    int st = -1, rc;

    (void)arg;
    /* Ready before the eager spawn: it runs before the spawner continues. */
    if ((rc = ferry_task_spawn(NULL, NULL, eager_other, NULL, NULL)))
        return rc;
    ev_mark('1');
    if ((rc = ferry_task_spawn(NULL, NULL, eager_yielder, NULL, &eager_opts)))
        return rc;
    ev_mark('2');
    if ((rc = ferry_task_spawn(&t, NULL, eager_quick, (void *)0, &eager_opts)))
        return rc;
    ev_mark('3');
    /* It ended before the spawn returned: the join does not wait. */
    if (ferry_task_state(t) != FERRY_TASK_DONE)
        return -1000;
    if ((rc = ferry_task_join(t, &st)))
        return rc;
    return st;
}

T(task, eager_spawn_runs_the_task_first_and_the_spawner_in_a_later_turn)
{
    cr_assert_eq(tu_run(eager_order_main, NULL), 5);
    ev_log[ev_n] = '\0';
    /* 1: the spawner; a: the eager task, up to its yield; o: the task that
     * was ready before; 2: the spawner, in the next turn; q: the second
     * eager task, which goes first in that turn, ahead of the yielder's b;
     * 3: the spawner, in the turn after. */
    cr_assert_str_eq(ev_log, "1ao2qb3", "order was %s", ev_log);
}

static int eager_reuse_main(void *arg)
{
    (void)arg;
    for (intptr_t i = 0; i < 4; i++) {
        int rc = ferry_task_spawn(NULL, NULL, eager_quick, (void *)i, &eager_opts);
        if (rc)
            return rc;
    }
    return 0;
}

T(task, eager_tasks_that_end_at_once_reuse_one_stack)
{
    cr_assert_eq(tu_run(eager_reuse_main, NULL), 0);
    cr_assert_str_eq((ev_log[ev_n] = '\0', ev_log), "qqqq");
    /* Each detached task ended and gave its stack back before the next
     * spawn took one: all four ran at the same address. */
    for (int i = 1; i < 4; i++)
        cr_assert_eq(eager_local_addr[i], eager_local_addr[0]);
}

static void eager_from_callback(void *arg)
{
    (void)arg;
    cr_expect_eq(ferry_task_spawn(NULL, tu_loop, eager_quick, (void *)0, &eager_opts), 0);
    ev_mark('c');
}

T(task, eager_spawn_from_a_callback_runs_later)
{
    cr_assert_eq(ferry_call_soon(tu_loop, eager_from_callback, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    ev_log[ev_n] = '\0';
    cr_assert_str_eq(ev_log, "cq");
}

static int eager_cancelled_main(void *arg)
{
    ferry_task *t;
    int rc, st = -1;

    (void)arg;
    ferry_task_cancel(ferry_task_current());
    /* Not a cancellation point: the task is made and runs. */
    if ((rc = ferry_task_spawn(&t, NULL, eager_quick, (void *)0, &eager_opts)))
        return 1000 + rc;
    if (ferry_task_state(t) != FERRY_TASK_DONE || ferry_task_try_join(t, &st) || st != 5)
        return -1000;
    /* The next suspension point reports the cancellation. */
    return ferry_yield();
}

T(task, eager_spawn_by_a_cancelled_task_still_spawns)
{
    cr_assert_eq(tu_run(eager_cancelled_main, NULL), -ECANCELED);
}

static int eager_fail(void *arg)
{
    (void)arg;
    return -EIO;
}

static int eager_zero(void *arg)
{
    (void)arg;
    ev_mark('z');
    return 0;
}

static int eager_group_main(void *arg)
{
    ferry_group g;
    int rc;

    (void)arg;
    ferry_group_init(&g);
    for (intptr_t i = 0; i < 3; i++)
        if ((rc = ferry_group_spawn(&g, eager_zero, (void *)i, &eager_opts)))
            return 1000 + rc;
    /* Children that ended inside the spawn were counted in and out. */
    if ((rc = ferry_group_wait(&g)))
        return 2000 + rc;
    ferry_group_init(&g);
    if ((rc = ferry_group_spawn(&g, eager_fail, NULL, &eager_opts)))
        return 3000 + rc;
    /* The failure was recorded before the spawn returned. */
    if (ferry_group_spawn(&g, eager_quick, (void *)3, &eager_opts) != -ESHUTDOWN)
        return -4000;
    return ferry_group_wait(&g);
}

T(task, eager_children_of_a_group_are_counted_before_they_run)
{
    cr_assert_eq(tu_run(eager_group_main, NULL), -EIO);
    ev_log[ev_n] = '\0';
    cr_assert_str_eq(ev_log, "zzz");
}

T(task, spawn_with_an_unknown_flag_is_einval)
{
    ferry_task_opts o = { .flags = 0x80 };

    cr_assert_eq(ferry_task_spawn(NULL, tu_loop, eager_quick, NULL, &o), -EINVAL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ev_n, 0);
}

/* ---- cancellation ------------------------------------------------------ */

static int body_ran;

static int set_body_ran(void *arg)
{
    body_ran = 1;
    return 0;
}

static int cancel_before_first_run_main(void *arg)
{
    ferry_task *t;
    int st = 0, rc;

    if ((rc = ferry_task_spawn(&t, NULL, set_body_ran, NULL, NULL)))
        return rc;
    ferry_task_cancel(t);
    rc = ferry_task_join(t, &st);
    return rc ? rc : st;
}

T(task, cancel_before_first_run_never_runs_the_body)
{
    cr_assert_eq(tu_run(cancel_before_first_run_main, NULL), -ECANCELED);
    cr_assert_eq(body_ran, 0);
}

static int sleep_long(void *arg)
{
    return ferry_sleep(FERRY_SEC(60));
}

/* The sleeper's deadline, shorter than the test's timeout so that a
 * cancel that does not wake the sleeper is seen by the test, not by the
 * runner's kill. */
static int64_t sleep_deadline;

static int sleep_until_deadline(void *arg)
{
    return ferry_sleep_until(sleep_deadline);
}

/* Sleeps until just before the sleeper's deadline: its timer fires first,
 * so it has finished by the time a sleep that only its deadline ends is
 * over, however slow the machine is. */
static int witness_sleep(void *arg)
{
    return ferry_sleep_until(sleep_deadline - 1);
}

static int cancel_during_sleep_main(void *arg)
{
    ferry_task *t, *w;
    int st = 0, rc;

    sleep_deadline = ferry_now() + tu_ms(4000);
    if ((rc = ferry_task_spawn(&w, NULL, witness_sleep, NULL, NULL)))
        return rc;
    if ((rc = ferry_task_spawn(&t, NULL, sleep_until_deadline, NULL, NULL)))
        return rc;
    ferry_sleep(tu_ms(5));
    ferry_task_cancel(t);
    rc = ferry_task_join(t, &st);
    /* The cancel ended the sleep, not its deadline. */
    if (ferry_task_state(w) == FERRY_TASK_DONE)
        rc = -1000;
    ferry_task_cancel(w);
    ferry_task_join(w, NULL);
    return rc ? rc : st;
}

T(task, cancel_during_sleep_returns_ecanceled)
{
    cr_assert_eq(tu_run(cancel_during_sleep_main, NULL), -ECANCELED);
}

static ferry_task *joiner_target;
static int joiner_rc = 1;

static int join_target(void *arg)
{
    joiner_rc = ferry_task_join(joiner_target, NULL);
    return joiner_rc;
}

static int cancel_during_join_main(void *arg)
{
    ferry_task *j;
    int st = 0, rc;

    if ((rc = ferry_task_spawn(&joiner_target, NULL, sleep_long, NULL, NULL)))
        return rc;
    if ((rc = ferry_task_spawn(&j, NULL, join_target, NULL, NULL)))
        return rc;
    ferry_sleep(tu_ms(2));
    ferry_task_cancel(j);
    ferry_task_join(j, &st);
    /* The joiner was interrupted: the handle is still ours to use. */
    if (ferry_task_state(joiner_target) == FERRY_TASK_DONE)
        return -1000;
    ferry_task_cancel(joiner_target);
    rc = ferry_task_join(joiner_target, NULL);
    return rc ? rc : st;
}

T(task, cancel_during_join_leaves_the_handle_usable)
{
    cr_assert_eq(tu_run(cancel_during_join_main, NULL), -ECANCELED);
    cr_assert_eq(joiner_rc, -ECANCELED);
}

static int rc_seq[4];

static int ignore_one_cancel(void *arg)
{
    rc_seq[0] = ferry_sleep(FERRY_SEC(60));   /* -ECANCELED, ignored */
    rc_seq[1] = ferry_yield();                /* again */
    rc_seq[2] = ferry_sleep(tu_ms(1));        /* and again */
    return 5;
}

static int level_triggered_main(void *arg)
{
    ferry_task *t;
    int st = 0;

    ferry_task_spawn(&t, NULL, ignore_one_cancel, NULL, NULL);
    ferry_yield();
    ferry_task_cancel(t);
    ferry_task_join(t, &st);
    return st;
}

T(task, cancellation_is_level_triggered)
{
    cr_assert_eq(tu_run(level_triggered_main, NULL), 5);
    cr_assert_eq(rc_seq[0], -ECANCELED);
    cr_assert_eq(rc_seq[1], -ECANCELED);
    cr_assert_eq(rc_seq[2], -ECANCELED);
}

/* ---- calls outside a task, join and detach misuse ------------------- */

T(task, calls_that_need_a_task_are_eperm_outside_one)
{
    ferry_scope s;
    ferry_group g;
    ferry_task *t;
    int st = -1;

    cr_assert_eq(ferry_scope_enter(&s, FERRY_NEVER, 0), -EPERM);
    cr_assert_eq(ferry_scope_exit(&s), -EPERM);
    cr_assert_eq(ferry_group_init(&g), -EPERM);
    cr_assert_eq(ferry_wait_signal(SIGUSR1), -EPERM);
    cr_assert_eq(ferry_sleep_until(0), -EPERM);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, tu_ret0, NULL, NULL), 0);
    cr_assert_str_eq(ferry_task_name(t), "task");   /* the default name */
    cr_assert_not(ferry_task_cancelled(t));
    cr_assert_eq(ferry_task_join(t, &st), -EPERM);   /* joining suspends: tasks only */
    cr_assert_eq(ferry_task_try_join(t, &st), -EAGAIN);
    cr_assert_eq(st, -1);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, NULL), 0);   /* the status is optional */
}

static int join_rc[6];

static int join_misuse_main(void *arg)
{
    ferry_task *t, *u;
    ferry_scope shield;
    int st = 1;

    (void)arg;
    ferry_task_spawn(&t, NULL, sleep_long, NULL, NULL);
    ferry_task_detach(t);                       /* t lives on, detached */
    join_rc[0] = ferry_task_join(t, NULL);
    join_rc[1] = ferry_task_try_join(t, NULL);
    join_rc[2] = ferry_task_detach(t);
    ferry_task_cancel(t);                       /* t ends on its own; not touched again */
    ferry_task_spawn(&u, NULL, tu_ret42, NULL, NULL);
    ferry_task_cancel(ferry_task_current());
    join_rc[3] = ferry_task_join(u, &st);       /* cancelled: at once, the handle stays ours */
    join_rc[4] = ferry_task_try_join(u, &st);   /* u has not run */
    ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    join_rc[5] = ferry_task_join(u, &st);
    ferry_scope_exit(&shield);
    return st;
}

T(task, join_and_detach_misuse_is_refused_and_keeps_the_handle)
{
    cr_assert_eq(tu_run(join_misuse_main, NULL), 42);
    cr_assert_eq(join_rc[0], -EINVAL, "join of a detached task");
    cr_assert_eq(join_rc[1], -EINVAL, "try_join of a detached task");
    cr_assert_eq(join_rc[2], -EINVAL, "detach twice");
    cr_assert_eq(join_rc[3], -ECANCELED);
    cr_assert_eq(join_rc[4], -EAGAIN);
    cr_assert_eq(join_rc[5], 0);
}

/* ---- scopes: shields and deadlines -------------------------------------- */

static int shield_rc[3];

static int shielded_body(void *arg)
{
    ferry_scope s;

    ferry_scope_enter(&s, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    shield_rc[0] = ferry_sleep(tu_ms(20));     /* cancel arrives meanwhile */
    shield_rc[1] = ferry_scope_exit(&s);
    shield_rc[2] = ferry_yield();              /* now it lands */
    return 0;
}

static int shield_main(void *arg)
{
    ferry_task *t;

    ferry_task_spawn(&t, NULL, shielded_body, NULL, NULL);
    ferry_sleep(tu_ms(2));
    ferry_task_cancel(t);
    return ferry_task_join(t, NULL);
}

T(scope, shield_defers_cancellation_until_the_scope_ends)
{
    cr_assert_eq(tu_run(shield_main, NULL), 0);
    cr_assert_eq(shield_rc[0], 0, "sleep inside the shield was interrupted: %d", shield_rc[0]);
    cr_assert_eq(shield_rc[1], 0);
    cr_assert_eq(shield_rc[2], -ECANCELED);
}

/* ---- deadlines --------------------------------------------------------- */

static int nested_rc[6];

static int nested_inner_fires(void *arg)
{
    ferry_scope outer, inner;

    ferry_scope_enter(&outer, ferry_now() + tu_ms(500), 0);
    ferry_scope_enter(&inner, ferry_now() + tu_ms(10), 0);
    nested_rc[0] = ferry_sleep(FERRY_SEC(5));
    nested_rc[1] = ferry_scope_exit(&inner);
    nested_rc[2] = ferry_sleep(tu_ms(1));       /* outer still fine */
    nested_rc[3] = ferry_scope_exit(&outer);
    nested_rc[4] = ferry_scope_fired(&inner);
    nested_rc[5] = ferry_scope_fired(&outer);
    return 0;
}

T(scope, nested_deadline_inner_fires)
{
    tu_run(nested_inner_fires, NULL);
    cr_assert_eq(nested_rc[0], -ETIMEDOUT);
    cr_assert_eq(nested_rc[1], -ETIMEDOUT);
    cr_assert_eq(nested_rc[2], 0);
    cr_assert_eq(nested_rc[3], 0);
    cr_assert(nested_rc[4]);
    cr_assert(!nested_rc[5]);
}

static int nested_outer_fires(void *arg)
{
    ferry_scope outer, inner;

    ferry_scope_enter(&outer, ferry_now() + tu_ms(10), 0);
    ferry_scope_enter(&inner, ferry_now() + tu_ms(500), 0);
    nested_rc[0] = ferry_sleep(FERRY_SEC(5));
    nested_rc[1] = ferry_scope_exit(&inner);
    nested_rc[2] = ferry_yield();               /* still inside outer: expired */
    nested_rc[3] = ferry_scope_exit(&outer);
    nested_rc[4] = ferry_scope_fired(&inner);
    nested_rc[5] = ferry_scope_fired(&outer);
    return 0;
}

T(scope, nested_deadline_outer_fires)
{
    tu_run(nested_outer_fires, NULL);
    cr_assert_eq(nested_rc[0], -ETIMEDOUT);
    cr_assert_eq(nested_rc[1], 0);
    cr_assert_eq(nested_rc[2], -ETIMEDOUT);
    cr_assert_eq(nested_rc[3], -ETIMEDOUT);
    cr_assert(!nested_rc[4]);
    cr_assert(nested_rc[5]);
}

static int shield_with_deadline(void *arg)
{
    ferry_scope outer, sh;

    ferry_scope_enter(&outer, ferry_now() + tu_ms(1), 0);
    ferry_scope_enter(&sh, ferry_now() + tu_ms(30), FERRY_SCOPE_SHIELD);
    nested_rc[0] = ferry_sleep(tu_ms(10));      /* outer expired, shielded */
    nested_rc[1] = ferry_sleep(FERRY_SEC(5));   /* own deadline fires */
    nested_rc[2] = ferry_scope_exit(&sh);
    nested_rc[3] = ferry_yield();
    nested_rc[4] = ferry_scope_exit(&outer);
    return 0;
}

T(scope, shield_blocks_outer_deadline_but_not_its_own)
{
    tu_run(shield_with_deadline, NULL);
    cr_assert_eq(nested_rc[0], 0);
    cr_assert_eq(nested_rc[1], -ETIMEDOUT);
    cr_assert_eq(nested_rc[2], -ETIMEDOUT);
    cr_assert_eq(nested_rc[3], -ETIMEDOUT);
    cr_assert_eq(nested_rc[4], -ETIMEDOUT);
}

static int scope_misuse(void *arg)
{
    ferry_scope a, b;

    ferry_scope_enter(&a, FERRY_NEVER, 0);
    ferry_scope_enter(&b, FERRY_NEVER, 0);
    nested_rc[0] = ferry_scope_exit(&a);        /* not innermost */
    nested_rc[1] = ferry_scope_enter(&b, FERRY_NEVER, 99);
    ferry_scope_exit(&b);
    ferry_scope_exit(&a);
    return 0;
}

T(scope, misuse_is_einval)
{
    tu_run(scope_misuse, NULL);
    cr_assert_eq(nested_rc[0], -EINVAL);
    cr_assert_eq(nested_rc[1], -EINVAL);
}

static int scope_rc[2] = { 1, 1 };

static int yield_in_scope(void *arg)
{
    ferry_scope s;

    (void)arg;
    ferry_scope_enter(&s, ferry_now() + FERRY_SEC(100), 0);
    scope_rc[0] = ferry_yield();
    scope_rc[1] = ferry_scope_exit(&s);
    return 0;
}

T(scope, yield_inside_a_deadline_that_has_not_passed_returns_0)
{
    cr_assert_eq(tu_run(yield_in_scope, NULL), 0);
    cr_assert_eq(scope_rc[0], 0);
    cr_assert_eq(scope_rc[1], 0);
}

static int sleep_rc = 1;
static bool sleep_fired;

static int sleep_to_the_scope_deadline(void *arg)
{
    int64_t d = ferry_now() + FERRY_MSEC(2);
    ferry_scope s;

    (void)arg;
    ferry_scope_enter(&s, d, 0);
    sleep_rc = ferry_sleep_until(d);    /* the sleep and the scope end together */
    sleep_fired = ferry_scope_fired(&s);
    return ferry_scope_exit(&s);
}

T(scope, a_sleep_that_ends_with_its_scope_deadline_reports_the_deadline)
{
    cr_assert_eq(tu_run(sleep_to_the_scope_deadline, NULL), -ETIMEDOUT);
    cr_assert_eq(sleep_rc, -ETIMEDOUT);
    cr_assert(sleep_fired);
}

static ferry_event race_ev;
static int race_rc = 1;
static bool race_fired = true;

static int deadline_waiter(void *arg)
{
    int64_t *deadline = arg;
    ferry_scope s;

    /* Set here, just before the wait, so that a slow build (valgrind)
     * does not pass it before the wait begins. */
    *deadline = ferry_now() + tu_ms(20);
    ferry_scope_enter(&s, *deadline, 0);
    race_rc = ferry_event_wait(&race_ev);
    race_fired = ferry_scope_fired(&s);
    ferry_scope_exit(&s);
    return 0;
}

static int late_setter(void *arg)
{
    const int64_t *deadline = arg;

    ferry_yield();                      /* the waiter waits */
    while (ferry_now() <= *deadline)    /* past its deadline, without a poll */
        ;
    return ferry_event_set(&race_ev);
}

TL(scope, a_grant_that_comes_before_the_deadline_timer_is_polled_wins)
{
    ferry_loop *l;
    ferry_task *w, *s;
    int64_t deadline = 0;
    int st = 1;

    /* io_interval 1: timers are polled after every turn, so the expired
     * deadline is found after the setter's turn, with the waiter granted
     * but not yet run. */
    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .io_interval = 1 }), 0);
    ferry_loop_set_slow_threshold(l, 0);
    cr_assert_eq(ferry_task_spawn(&w, l, deadline_waiter, &deadline, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&s, l, late_setter, &deadline, NULL), 0);
    cr_assert_eq(ferry_loop_run(l, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(s, &st), 0);
    cr_assert_eq(st, 0);
    cr_assert_eq(ferry_task_try_join(w, NULL), 0);
    cr_assert_eq(race_rc, 0, "granted, yet the wait returned %d", race_rc);
    cr_assert_not(race_fired);
    ferry_event_destroy(&race_ev);
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- groups ------------------------------------------------------------ */

static int sibling_cleanups;

static int long_sibling(void *arg)
{
    int rc = ferry_sleep(FERRY_SEC(60));
    sibling_cleanups++;       /* runs after the cancel: cleanup happened */
    return rc;
}

static int failing_child(void *arg)
{
    ferry_sleep(tu_ms(5));
    return -EIO;
}

static int group_main(void *arg)
{
    ferry_group g;

    ferry_group_init(&g);
    for (int i = 0; i < 5; i++)
        ferry_group_spawn(&g, long_sibling, NULL, NULL);
    ferry_group_spawn(&g, failing_child, NULL, NULL);
    return ferry_group_wait(&g);
}

T(group, failure_cancels_siblings_and_waits_for_them)
{
    cr_assert_eq(tu_run(group_main, NULL), -EIO);
    cr_assert_eq(sibling_cleanups, 5);
}

static int ok_child(void *arg)
{
    ferry_sleep(tu_ms((intptr_t)arg));
    sibling_cleanups++;
    return 0;
}

static int group_ok_main(void *arg)
{
    ferry_group g;

    ferry_group_init(&g);
    for (int i = 0; i < 10; i++)
        ferry_group_spawn(&g, ok_child, (void *)(intptr_t)(i % 3), NULL);
    return ferry_group_wait(&g);
}

T(group, waits_for_all_children)
{
    cr_assert_eq(tu_run(group_ok_main, NULL), 0);
    cr_assert_eq(sibling_cleanups, 10);
}

static ferry_task *group_owner;

static int group_owner_body(void *arg)
{
    ferry_group g;
    int rc;

    ferry_group_init(&g);
    for (int i = 0; i < 3; i++)
        ferry_group_spawn(&g, long_sibling, NULL, NULL);
    rc = ferry_group_wait(&g);
    nested_rc[0] = ferry_group_spawn(&g, ok_child, NULL, NULL);
    return rc;
}

static int group_owner_cancel_main(void *arg)
{
    int st = 0;

    ferry_task_spawn(&group_owner, NULL, group_owner_body, NULL, NULL);
    ferry_sleep(tu_ms(3));
    ferry_task_cancel(group_owner);
    ferry_task_join(group_owner, &st);
    return st;
}

T(group, cancelled_owner_still_waits_for_children)
{
    cr_assert_eq(tu_run(group_owner_cancel_main, NULL), -ECANCELED);
    cr_assert_eq(sibling_cleanups, 3, "no child may outlive its group");
    cr_assert_eq(nested_rc[0], -ESHUTDOWN);
}

static ferry_group cb_group;
static int cb_rc[3] = { 1, 1, 1 }, non_owner_rc = 1, closed_rc = 1, bad_spawn_rc = 1, empty_rc = 1;

static void group_from_callback(void *arg)
{
    (void)arg;
    cb_rc[0] = ferry_group_spawn(&cb_group, tu_ret0, NULL, NULL);
    cb_rc[1] = ferry_group_wait(&cb_group);
    cb_rc[2] = ferry_group_cancel(&cb_group);   /* allowed outside tasks */
}

static int child_waits_on_group(void *arg)
{
    non_owner_rc = ferry_group_wait(arg);
    return 0;
}

static int group_misuse_main(void *arg)
{
    ferry_group g2;
    int rc;

    (void)arg;
    ferry_group_init(&cb_group);
    ferry_group_spawn(&cb_group, child_waits_on_group, &cb_group, NULL);
    ferry_group_spawn(&cb_group, sleep_long, NULL, NULL);
    ferry_call_soon(tu_loop, group_from_callback, NULL);
    ferry_yield();
    rc = ferry_group_wait(&cb_group);
    closed_rc = ferry_group_spawn(&cb_group, tu_ret0, NULL, NULL);
    ferry_group_init(&g2);
    bad_spawn_rc = ferry_group_spawn(&g2, NULL, NULL, NULL);
    ferry_group_cancel(&g2);                    /* no children: nothing to do */
    empty_rc = ferry_group_wait(&g2);
    return rc;
}

T(group, misuse_from_callbacks_and_non_owners_is_refused)
{
    cr_assert_eq(tu_run(group_misuse_main, NULL), 0, "cancelled children are not failures");
    cr_assert_eq(cb_rc[0], -EPERM);
    cr_assert_eq(cb_rc[1], -EPERM);
    cr_assert_eq(cb_rc[2], 0);
    cr_assert_eq(non_owner_rc, -EPERM);
    cr_assert_eq(closed_rc, -ESHUTDOWN);
    cr_assert_eq(bad_spawn_rc, -EINVAL);
    cr_assert_eq(empty_rc, 0);
}

static int ret_ecanceled(void *arg)
{
    (void)arg;
    return -ECANCELED;       /* not cancelled: this is a failure */
}

static int fail_when_cancelled(void *arg)
{
    (void)arg;
    return ferry_sleep(FERRY_SEC(100)) == -ECANCELED ? -7 : -8;
}

static int failing_spawn_rc = 1;

static int group_fail_main(void *arg)
{
    ferry_group g;

    (void)arg;
    ferry_group_init(&g);
    ferry_group_spawn(&g, fail_when_cancelled, NULL, NULL);
    ferry_group_spawn(&g, ret_ecanceled, NULL, NULL);
    ferry_yield();                      /* both ran: the group is failing */
    failing_spawn_rc = ferry_group_spawn(&g, tu_ret0, NULL, NULL);
    return ferry_group_wait(&g);
}

T(group, keeps_its_first_failure_and_refuses_spawns_while_failing)
{
    /* The first failure (-ECANCELED returned by a child nobody cancelled)
     * stays the status; the sibling's later -7 does not replace it. */
    cr_assert_eq(tu_run(group_fail_main, NULL), -ECANCELED);
    cr_assert_eq(failing_spawn_rc, -ESHUTDOWN);
}

/* ---- wrong thread --------------------------------------------------- */

/* ---- Groups that fit servers ----------------------------------------- */

/* A server's connections: children spawned with FERRY_GROUP_ISOLATE fail
 * on their own; the failure is counted with the first status, no sibling
 * is cancelled and the group's status stays 0. */
static int iso_rc[8];
static int conn_done, conn_cancelled;

static int conn_fails(void *arg)
{
    ferry_sleep(tu_ms(1));
    return (int)(intptr_t)arg;
}

static int conn_serves(void *arg)
{
    int rc = ferry_sleep(tu_ms(20));

    (void)arg;
    if (rc == -ECANCELED)
        conn_cancelled++;
    else
        conn_done++;
    return rc;
}

static int iso_main(void *arg)
{
    ferry_group g;
    int first = 1;

    (void)arg;
    ferry_group_init(&g);
    iso_rc[0] = ferry_group_spawn_ex(&g, NULL, conn_serves, NULL, NULL, FERRY_GROUP_ISOLATE);
    iso_rc[1] = ferry_group_spawn_ex(&g, NULL, conn_fails, (void *)-5, NULL, FERRY_GROUP_ISOLATE);
    iso_rc[2] = ferry_group_spawn_ex(&g, NULL, conn_serves, NULL, NULL, 0);
    iso_rc[3] = ferry_group_spawn_ex(&g, NULL, conn_fails, (void *)-6, NULL, FERRY_GROUP_ISOLATE);
    iso_rc[4] = ferry_group_spawn_ex(&g, NULL, conn_serves, NULL, NULL, 0x80);  /* unknown flag */
    iso_rc[5] = ferry_group_wait(&g);
    iso_rc[6] = (int)ferry_group_failures(&g, &first);
    iso_rc[7] = first;
    return 0;
}

T(group, isolated_failures_are_counted_and_cancel_no_sibling)
{
    cr_assert_eq(tu_run(iso_main, NULL), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(iso_rc[i], 0, "spawn %d: %d", i, iso_rc[i]);
    cr_assert_eq(iso_rc[4], -EINVAL);
    cr_assert_eq(iso_rc[5], 0, "the group's status: %d", iso_rc[5]);
    cr_assert_eq(conn_cancelled, 0);
    cr_assert_eq(conn_done, 2);
    cr_assert_eq(iso_rc[6], 2);
    cr_assert_eq(iso_rc[7], -5);
    cr_assert_eq(ferry_group_failures(NULL, NULL), 0);
}

/* ferry_group_spawn_ex() with `out`: a handle joinable before the child
 * ends, one detached while it runs, and one of an eager child that ended
 * at once, joined after the group's wait.  The teardown finds no stack
 * left. */
static int gh_rc[10];

static int yield_then(void *arg)
{
    ferry_yield();
    return (int)(intptr_t)arg;
}

static int gh_main(void *arg)
{
    ferry_task_opts eager = { .flags = FERRY_SPAWN_EAGER };
    ferry_task *a, *b, *c;
    ferry_group g;
    int st = 0;

    (void)arg;
    ferry_group_init(&g);
    /* Isolated: their statuses (not 0) must not cancel each other. */
    gh_rc[0] = ferry_group_spawn_ex(&g, &a, yield_then, (void *)42, NULL, FERRY_GROUP_ISOLATE);
    gh_rc[1] = ferry_group_spawn_ex(&g, &b, yield_then, (void *)7, NULL, FERRY_GROUP_ISOLATE);
    gh_rc[2] = ferry_group_spawn_ex(&g, &c, tu_ret42, NULL, &eager, FERRY_GROUP_ISOLATE);
    gh_rc[3] = ferry_task_detach(b);
    gh_rc[4] = ferry_task_join(a, &st);
    gh_rc[5] = st;
    gh_rc[6] = ferry_group_wait(&g);
    gh_rc[7] = ferry_task_try_join(c, &st);
    gh_rc[8] = st;
    gh_rc[9] = ferry_task_detach(b);     /* given back already */
    return 0;
}

T(group, spawn_ex_gives_a_handle_to_join_or_detach)
{
    cr_assert_eq(tu_run(gh_main, NULL), 0);
    cr_assert_eq(gh_rc[0], 0);
    cr_assert_eq(gh_rc[1], 0);
    cr_assert_eq(gh_rc[2], 0);
    cr_assert_eq(gh_rc[3], 0);
    cr_assert_eq(gh_rc[4], 0);
    cr_assert_eq(gh_rc[5], 42);
    cr_assert_eq(gh_rc[6], 0);
    cr_assert_eq(gh_rc[7], 0);
    cr_assert_eq(gh_rc[8], 42);
    cr_assert_eq(gh_rc[9], -EINVAL);
}

/* Trio's nursery.start_soon() from a child: an acceptor task (not the
 * owner) spawns connections into the open group while the owner waits;
 * the wait covers them. */
static ferry_group acc_group;
static int acc_spawned, acc_served;

static int acc_conn(void *arg)
{
    (void)arg;
    ferry_sleep(tu_ms(2));
    acc_served++;
    return 0;
}

static int acceptor(void *arg)
{
    (void)arg;
    for (int i = 0; i < 3; i++) {
        ferry_yield();
        if (ferry_group_spawn_ex(&acc_group, NULL, acc_conn, NULL, NULL, FERRY_GROUP_ISOLATE) == 0)
            acc_spawned++;
    }
    return 0;
}

static int acc_main(void *arg)
{
    (void)arg;
    ferry_group_init(&acc_group);
    ferry_group_spawn(&acc_group, acceptor, NULL, NULL);
    return ferry_group_wait(&acc_group);
}

T(group, a_child_spawns_into_the_open_group_and_the_wait_covers_it)
{
    cr_assert_eq(tu_run(acc_main, NULL), 0);
    cr_assert_eq(acc_spawned, 3);
    cr_assert_eq(acc_served, 3, "the wait returned before the connections ended");
}

static void *foreign_thread(void *arg)
{
    int *rcs = arg;
    ferry_task *t = NULL;

    rcs[0] = ferry_task_spawn(&t, tu_loop, ret_arg_plus_one, NULL, NULL);
    rcs[1] = ferry_call_soon(tu_loop, (ferry_cb)free, NULL);
    rcs[2] = ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    rcs[3] = ferry_yield();
    rcs[4] = ferry_sleep(1);
    rcs[5] = ferry_loop_stop(tu_loop);
    rcs[6] = ferry_call_later(tu_loop, 1, (ferry_cb)free, NULL, NULL);
    return NULL;
}

T(task, loop_calls_from_another_thread_are_eperm)
{
    int rcs[7];

    tu_on_thread(foreign_thread, rcs);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(rcs[i], -EPERM, "call %d returned %d", i, rcs[i]);
}

T(task, suspension_points_outside_a_task_are_eperm)
{
    cr_assert_eq(ferry_yield(), -EPERM);
    cr_assert_eq(ferry_sleep(1), -EPERM);
    cr_assert_eq(ferry_wait_fd(0, FERRY_READ, NULL), -EPERM);
    cr_assert_null(ferry_task_current());
}

/* ---- bad input ---------------------------------------------------------- */

T(task, null_and_out_of_range_arguments_are_einval_and_change_nothing)
{
    ferry_loop_stats st;
    ferry_task *t = (ferry_task *)&st;
    ferry_scope s;
    ferry_group g;

    cr_assert_eq(ferry_task_try_join(NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_task_detach(NULL), -EINVAL);
    cr_assert_str_eq(ferry_task_name(NULL), "(null)");
    cr_assert_not(ferry_task_cancelled(NULL));
    cr_assert_eq(ferry_scope_enter(NULL, FERRY_NEVER, 0), -EINVAL);
    cr_assert_eq(ferry_scope_enter(&s, FERRY_NEVER, 0x80), -EINVAL);
    cr_assert_eq(ferry_scope_exit(NULL), -EINVAL);
    cr_assert_not(ferry_scope_fired(NULL));
    memset(&g, 0, sizeof g);     /* never initialised: no owner */
    cr_assert_eq(ferry_group_init(NULL), -EINVAL);
    cr_assert_eq(ferry_group_spawn(NULL, tu_ret0, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_group_spawn(&g, tu_ret0, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_group_wait(NULL), -EINVAL);
    cr_assert_eq(ferry_group_wait(&g), -EINVAL);
    cr_assert_eq(ferry_group_cancel(NULL), -EINVAL);
    cr_assert_eq(ferry_group_cancel(&g), -EINVAL);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, tu_ret0, NULL,
                                  &(ferry_task_opts){ .stack_size = ((size_t)1 << 30) + 1 }),
                 -EINVAL);
    cr_assert_null(t);
    /* No task was made, and the loop still runs one. */
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.live_tasks, 0);
    cr_assert_eq(tu_run(tu_ret0, NULL), 0);
}

T(task, bad_input_is_einval)
{
    ferry_task *t;
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, NULL, NULL, NULL), -EINVAL);
    cr_assert_null(t);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, ret_arg_plus_one, NULL,
                                  &(ferry_task_opts){ .stack_size = 100 }), -EINVAL);
    cr_assert_eq(ferry_task_cancel(NULL), -EINVAL);
    cr_assert_eq(ferry_task_join(NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_run(tu_loop, 77), -EINVAL);
    cr_assert_eq(ferry_loop_new(NULL, NULL), -EINVAL);
    ferry_loop *l = tu_loop;
    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .stack_size = 10 }), -EINVAL);
    cr_assert_null(l);
}


/* ---- Task-local values ---------------------------------------------------- */

struct tl_val {
    int id;        /* which value */
    int refs;      /* held by tasks */
};

static int tl_destroyed[8];
static int tl_ndestroyed;

static void tl_destroy(void *v)
{
    struct tl_val *val = v;

    if (--val->refs == 0 && tl_ndestroyed < 8)
        tl_destroyed[tl_ndestroyed++] = val->id;
}

static void *tl_ref(void *v)
{
    ((struct tl_val *)v)->refs++;
    return v;
}

static const ferry_task_key tl_own = { .destructor = tl_destroy };
static const ferry_task_key tl_inh = { .destructor = tl_destroy, .inherit = tl_ref };
static const ferry_task_key tl_plain;     /* all-zero: no destructor, not inherited */

static struct tl_val tl_vals[4];
static void *tl_seen[8];
static int tl_rc[8];

static int tl_child(void *arg)
{
    int i = (int)(intptr_t)arg;

    tl_seen[2 * i] = ferry_task_local_get(&tl_own);
    tl_seen[2 * i + 1] = ferry_task_local_get(&tl_inh);
    ferry_yield();
    return 0;
}

static int tl_setter(void *arg)
{
    struct tl_val *v = arg;

    v->refs = 1;
    if (ferry_task_local_set(&tl_own, v) != 0)
        return -1;
    ferry_yield();                  /* the other setter runs here */
    return ferry_task_local_get(&tl_own) == v ? 0 : -2;
}

static int tl_main(void *arg)
{
    ferry_task *a, *b, *c;
    int st1 = -1, st2 = -1, n = 0;

    (void)arg;
    /* Two tasks, two values: each sees its own; each is destroyed when its
     * task ends, before the join returns. */
    ferry_task_spawn(&a, NULL, tl_setter, &tl_vals[0], NULL);
    ferry_task_spawn(&b, NULL, tl_setter, &tl_vals[1], NULL);
    ferry_task_join(a, &st1);
    ferry_task_join(b, &st2);
    tl_rc[n++] = st1;
    tl_rc[n++] = st2;
    tl_rc[n++] = tl_ndestroyed;                 /* 2 */
    /* The main task's values: one inherited, one not, one plain. */
    tl_vals[2].refs = 1;
    tl_vals[3].refs = 1;
    tl_rc[n++] = ferry_task_local_set(&tl_own, &tl_vals[2]);
    tl_rc[n++] = ferry_task_local_set(&tl_inh, &tl_vals[3]);
    tl_rc[n++] = ferry_task_local_set(&tl_plain, &tl_vals[0]);
    ferry_task_spawn(&c, NULL, tl_child, (void *)0, NULL);
    ferry_task_join(c, NULL);
    tl_rc[n++] = tl_vals[3].refs;               /* 1: the child's copy is gone */
    tl_rc[n++] = ferry_task_local_get(&tl_plain) == &tl_vals[0] ? 0 : -1;
    return n;
}

Test(task_local, values_are_per_task_inherited_by_key_and_destroyed_at_the_end,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    for (int i = 0; i < 4; i++)
        tl_vals[i].id = i;
    cr_assert_eq(tu_run(tl_main, NULL), 8);
    cr_assert_eq(tl_rc[0], 0, "a setter saw another task's value: %d", tl_rc[0]);
    cr_assert_eq(tl_rc[1], 0, "a setter saw another task's value: %d", tl_rc[1]);
    cr_assert_eq(tl_rc[2], 2, "destroyed by the joins: %d", tl_rc[2]);
    cr_assert_eq(tl_rc[3], 0);
    cr_assert_eq(tl_rc[4], 0);
    cr_assert_eq(tl_rc[5], 0);
    cr_assert_null(tl_seen[0], "a key without inherit was inherited");
    cr_assert_eq(tl_seen[1], &tl_vals[3]);
    cr_assert_eq(tl_rc[6], 1, "the child's inherited reference: %d", tl_rc[6]);
    cr_assert_eq(tl_rc[7], 0);
    /* The main task's own values went with it. */
    cr_assert_eq(tl_ndestroyed, 4);
    cr_assert_eq(tl_destroyed[0], 0);
    cr_assert_eq(tl_destroyed[1], 1);
    cr_assert_eq(tl_vals[2].refs, 0);
    cr_assert_eq(tl_vals[3].refs, 0);
    /* Outside a task. */
    cr_assert_null(ferry_task_local_get(&tl_own));
    cr_assert_eq(ferry_task_local_set(&tl_own, &tl_vals[0]), -EPERM);
    cr_assert_eq(ferry_task_local_set(NULL, &tl_vals[0]), -EINVAL);
}

/* ---- the dump's frames ---------------------------------------------- */

static ferry_event dump_go;
static int dump_waited = -1;

/* Exported (the test program is linked with -rdynamic) and not inlined, so
 * that the dump can name it; the store after the wait keeps the wait from
 * being a tail call. */
__attribute__((noinline)) void dump_frames_waiting_here(void);
__attribute__((noinline)) void dump_frames_waiting_here(void)
{
    dump_waited = ferry_event_wait(&dump_go);
}

static int dump_waiter(void *arg)
{
    (void)arg;
    dump_frames_waiting_here();
    return 0;
}

static char *dump_buf;
static int dump_printed = -1;

/* Dumps the loop while a task waits inside dump_frames_waiting_here(). */
static int dump_with_waiter(void *arg)
{
    ferry_task *t;
    size_t len = 0;
    FILE *f;

    (void)arg;
    if (ferry_task_spawn(&t, NULL, dump_waiter, NULL, NULL))
        return -1;
    ferry_yield();
    f = open_memstream(&dump_buf, &len);
    if (f) {
        dump_printed = ferry_loop_dump(ferry_loop_current(), f);
        fclose(f);
    }
    ferry_event_set(&dump_go);
    return ferry_task_join(t, NULL);
}

T(task, dump_prints_the_frames_of_a_waiting_task)
{
    cr_assert_eq(tu_run(dump_with_waiter, NULL), 0);
    cr_assert_eq(dump_printed, 2);
    cr_assert(dump_buf != NULL);
    cr_expect_eq(dump_waited, 0);
    cr_expect(strstr(dump_buf, "dump_frames_waiting_here+0x") != NULL, "dump:\n%s", dump_buf);
    cr_expect(strstr(dump_buf, "      #0 0x") != NULL, "dump:\n%s", dump_buf);
    free(dump_buf);
}
