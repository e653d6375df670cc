/* test_cover_core.c - the error returns and rare paths of the loop, tasks,
 * scopes, groups and stacks (issue 6: every error-return branch reached),
 * each checked for what it returns and what it leaves behind.
 *
 * A few tests look inside (src/loop_int.h) where the public API cannot make
 * the situation happen on this machine: what a forked child reads in the
 * fork mark, a task's canary word, the kind of guard a stack got.
 * Assertions stay on the main stack (TESTING.md): task bodies record.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <event2/event.h>
#include <criterion/criterion.h>
#include <malloc.h>

#include "testutil.h"
#include "fault.h"
#include "loop_int.h"

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define COV_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
#define COV_TSAN 1
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#define T(name) Test(cover_core, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
/* Tests that make their own loops. */
#define TL(name, ...) Test(cover_core, name, .timeout = 60., ##__VA_ARGS__)

/* libevent's allocations go through the fault hook too, so that a test can
 * fail them (as tests/fault_sites.c does). */
__attribute__((constructor)) static void route_libevent(void)
{
    tu_libevent_fault_hook(NULL);
}

/* ---- helpers ----------------------------------------------------------- */

static int order[16], norder;

static void push_order(void *arg)
{
    if (norder < 16)
        order[norder++] = (int)(intptr_t)arg;
}

static void set_flag(void *arg)
{
    *(int *)arg += 1;
}

static void noop_cb(void *arg)
{
    (void)arg;
}

static int ret0(void *arg)
{
    (void)arg;
    return 0;
}

static int sleep_long(void *arg)
{
    (void)arg;
    return ferry_sleep(FERRY_SEC(100));
}

/* Spawn fn(arg) on `loop` and run the loop until it has ended. */
static int run_on(ferry_loop *loop, ferry_task_fn fn, void *arg)
{
    ferry_task *t;
    int st = -12345;

    if (ferry_task_spawn(&t, loop, fn, arg, &(ferry_task_opts){ .name = "main" }))
        return -99999;
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    return st;
}

/* stderr into a temporary file, for the messages ferry writes there. */
static FILE *cap_file;
static int cap_saved = -1;

static void stderr_capture(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    cr_assert_not_null(cap_file);
    cap_saved = dup(STDERR_FILENO);
    dup2(fileno(cap_file), STDERR_FILENO);
}

static const char *stderr_release(void)
{
    static char buf[8192];
    ssize_t n;

    fflush(stderr);
    dup2(cap_saved, STDERR_FILENO);
    close(cap_saved);
    n = pread(fileno(cap_file), buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    fclose(cap_file);
    cap_file = NULL;
    return buf;
}

static int count_str(const char *hay, const char *needle)
{
    int n = 0;

    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static char logged[512];
static int nlogged;

static void capture_log(int level, const char *msg, void *ctx)
{
    (void)level; (void)ctx;
    nlogged++;
    snprintf(logged, sizeof logged, "%s", msg);
}

/* ---- arguments ----------------------------------------------------------- */

T(null_and_out_of_range_arguments_are_einval_and_change_nothing)
{
    ferry_loop_stats st;
    ferry_loop *l2 = (ferry_loop *)&st;
    ferry_task *t = (ferry_task *)&st;
    ferry_scope s;
    ferry_group g;

    cr_assert_eq(ferry_loop_run(NULL, FERRY_RUN_DEFAULT), -EINVAL);
    cr_assert_eq(ferry_loop_stop(NULL), -EINVAL);
    cr_assert_eq(ferry_loop_ref(NULL), -EINVAL);
    cr_assert_eq(ferry_loop_unref(NULL), -EINVAL);
    cr_assert_eq(ferry_loop_set_slow_threshold(NULL, 0), -EINVAL);
    cr_assert_eq(ferry_loop_stats_get(NULL, &st), -EINVAL);
    cr_assert_eq(ferry_loop_stats_get(tu_loop, NULL), -EINVAL);
    cr_assert_null(ferry_loop_base(NULL));
    cr_assert_not(ferry_loop_is_current(NULL));
    cr_assert_eq(ferry_call_soon(NULL, noop_cb, NULL), -EINVAL);
    cr_assert_eq(ferry_call_soon(tu_loop, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_call_later(NULL, 0, noop_cb, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_call_later(tu_loop, 0, NULL, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_dump(NULL, stderr), -EINVAL);
    cr_assert_eq(ferry_loop_dump(tu_loop, NULL), -EINVAL);
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
    cr_assert_eq(ferry_group_spawn(NULL, ret0, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_group_spawn(&g, ret0, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_group_wait(NULL), -EINVAL);
    cr_assert_eq(ferry_group_wait(&g), -EINVAL);
    cr_assert_eq(ferry_group_cancel(NULL), -EINVAL);
    cr_assert_eq(ferry_group_cancel(&g), -EINVAL);
    cr_assert_eq(ferry_loop_new(&l2, &(ferry_loop_opts){ .stack_size = ((size_t)1 << 30) + 1 }),
                 -EINVAL);
    cr_assert_null(l2);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, ret0, NULL,
                                  &(ferry_task_opts){ .stack_size = ((size_t)1 << 30) + 1 }),
                 -EINVAL);
    cr_assert_null(t);
    ferry_loop_free(NULL);
    /* The loop is as it was: no task, and it still runs one. */
    {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        cr_assert_eq(ferry_loop_dump(tu_loop, f), 0);
        fclose(f);
        cr_assert(strstr(buf, "ferry: 0 live task(s)"), "dump was: %s", buf);
        free(buf);
    }
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.live_tasks, 0);
    cr_assert_eq(tu_run(ret0, NULL), 0);
}

T(task_only_calls_outside_a_task_are_eperm)
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
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, ret0, NULL, NULL), 0);
    cr_assert_str_eq(ferry_task_name(t), "task");   /* the default name */
    cr_assert_not(ferry_task_cancelled(t));
    cr_assert_eq(ferry_task_join(t, &st), -EPERM);   /* joining suspends: tasks only */
    cr_assert_eq(ferry_task_try_join(t, &st), -EAGAIN);
    cr_assert_eq(st, -1);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, NULL), 0);   /* the status is optional */
}

/* ---- from another thread ------------------------------------------------- */

struct foreign {
    ferry_loop  *loop;
    ferry_task  *task;
    ferry_timer *timer;
    ferry_group *group;
    ferry_sem   *unbound;
    int          rc[20];
    int          nrc;
    void        *p[3];
};

static void *foreign_thread(void *arg)
{
    struct foreign *f = arg;
    ferry_loop_stats st;
    FILE *null = fopen("/dev/null", "w");
    int i = 0;

    f->rc[i++] = ferry_loop_ref(f->loop);
    f->rc[i++] = ferry_loop_unref(f->loop);
    f->rc[i++] = ferry_loop_set_slow_threshold(f->loop, 0);
    f->rc[i++] = ferry_loop_stats_get(f->loop, &st);
    f->rc[i++] = ferry_timer_cancel(f->timer);
    f->rc[i++] = ferry_task_try_join(f->task, NULL);
    f->rc[i++] = ferry_task_detach(f->task);
    f->rc[i++] = ferry_task_cancel(f->task);
    f->rc[i++] = ferry_loop_dump(f->loop, null);
    f->rc[i++] = ferry_task_spawn(NULL, NULL, ret0, NULL, NULL);   /* no loop on this thread */
    f->rc[i++] = ferry_task_spawn(NULL, f->loop, ret0, NULL, NULL);
    f->rc[i++] = ferry_group_cancel(f->group);
    f->rc[i++] = ferry_sem_try_acquire(f->unbound);   /* no loop here to bind to */
    f->rc[i++] = ferry_yield();                       /* no loop, no task */
    f->nrc = i;
    f->p[0] = ferry_loop_base(f->loop);
    f->p[1] = ferry_loop_current();
    f->p[2] = ferry_task_current();
    ferry_loop_free(f->loop);     /* not its thread: does nothing */
    fclose(null);
    return NULL;
}

static ferry_group fg;
static ferry_event fg_go;
static int fg_status = 1;

static int foreign_owner(void *arg)
{
    (void)arg;
    ferry_group_init(&fg);
    ferry_group_spawn(&fg, sleep_long, NULL, NULL);
    ferry_event_wait(&fg_go);
    fg_status = ferry_group_wait(&fg);
    return 0;
}

T(loop_calls_from_a_foreign_thread_are_eperm_and_change_nothing)
{
    static ferry_sem unbound;
    struct foreign f = { .loop = tu_loop, .group = &fg, .unbound = &unbound };
    ferry_task *owner;
    pthread_t th;
    int fired = 0, st = 1;

    cr_assert_eq(ferry_call_later(tu_loop, FERRY_SEC(100), set_flag, &fired, &f.timer), 0);
    cr_assert_eq(ferry_task_spawn(&f.task, tu_loop, sleep_long, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&owner, tu_loop, foreign_owner, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);   /* both wait now */
    cr_assert_eq(pthread_create(&th, NULL, foreign_thread, &f), 0);
    pthread_join(th, NULL);
    cr_assert_eq(f.nrc, 14);
    for (int i = 0; i < f.nrc; i++)
        cr_assert_eq(f.rc[i], -EPERM, "call %d returned %d", i, f.rc[i]);
    cr_assert_null(f.p[0]);
    cr_assert_null(f.p[1]);
    cr_assert_null(f.p[2]);
    /* Nothing changed: the task still sleeps, uncancelled, with its handle. */
    cr_assert_eq(ferry_task_state(f.task), FERRY_TASK_WAITING);
    cr_assert_not(ferry_task_cancelled(f.task));
    cr_assert_eq(ferry_sem_value(&unbound), 0);
    /* The loop's thread may cancel a group outside any task. */
    cr_assert_eq(ferry_group_cancel(&fg), 0);
    cr_assert_eq(ferry_event_set(&fg_go), 0);
    cr_assert_eq(ferry_timer_cancel(f.timer), 0);
    cr_assert_eq(ferry_task_cancel(f.task), 0);
    cr_assert(ferry_task_cancelled(f.task));
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(f.task, &st), 0);
    cr_assert_eq(st, -ECANCELED);
    cr_assert_eq(ferry_task_try_join(owner, NULL), 0);
    cr_assert_eq(fg_status, 0, "cancelled children are not failures");
    cr_assert_eq(fired, 0);
}

/* ---- a forked copy of the loop (docs/fork.md) ---------------------------- */

T(a_forked_copy_of_the_loop_refuses_every_call)
{
    volatile unsigned char *mark = (volatile unsigned char *)(uintptr_t)tu_loop->fork_mark;
    ferry_sem sem = FERRY_SEM_INIT(1), unbound = FERRY_SEM_INIT(1);
    bool current, copy, copy_null;
    void *task;
    int rc[5];

    cr_assert_not_null(mark, "MADV_WIPEONFORK refused (kernel before 4.14?)");
    cr_assert_eq(ferry_sem_try_acquire(&sem), 0);   /* binds it to tu_loop */
    /* What a child forked from this process reads there (MADV_WIPEONFORK). */
    *mark = 0;
    current = ferry_loop_is_current(tu_loop);
    copy = ferry__loop_is_fork_copy(tu_loop);
    copy_null = ferry__loop_is_fork_copy(NULL);
    task = ferry_task_current();
    rc[0] = ferry_call_soon(tu_loop, noop_cb, NULL);
    rc[1] = ferry_sem_release(&sem);
    rc[2] = ferry_sem_try_acquire(&unbound);
    rc[3] = ferry_yield();
    rc[4] = ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    ferry_loop_free(tu_loop);    /* the child must not free the parent's state */
    *mark = 1;
    cr_assert_not(current);
    cr_assert(copy);
    cr_assert_not(copy_null);
    cr_assert_null(task);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(rc[i], -EPERM, "call %d returned %d", i, rc[i]);
    /* The parent's loop is untouched. */
    cr_assert(ferry_loop_is_current(tu_loop));
    cr_assert_not(ferry__loop_is_fork_copy(tu_loop));
    cr_assert_eq(ferry_sem_value(&sem), 0);
    cr_assert_eq(ferry_sem_release(&sem), 0);
    cr_assert_eq(ferry_sem_value(&unbound), 1);
    cr_assert_eq(tu_run(ret0, NULL), 0);
}

T(a_loop_without_a_fork_mark_works)
{
    /* A kernel that refuses MADV_WIPEONFORK leaves the mark NULL. */
    const volatile unsigned char *saved = tu_loop->fork_mark;
    bool current;
    int rc;

    tu_loop->fork_mark = NULL;
    current = ferry_loop_is_current(tu_loop);
    rc = tu_run(ret0, NULL);
    tu_loop->fork_mark = saved;
    cr_assert(current);
    cr_assert_eq(rc, 0);
}

/* ---- timers -------------------------------------------------------------- */

T(call_later_clamps_a_negative_delay_and_saturates_a_huge_one)
{
    ferry_timer *far;
    int near = 0, farr = 0;

    cr_assert_eq(ferry_call_later(tu_loop, -FERRY_SEC(5), set_flag, &near, NULL), 0);
    cr_assert_eq(ferry_call_later(tu_loop, INT64_MAX, set_flag, &farr, &far), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_assert_eq(near, 1, "a negative delay fires in the next turn");
    cr_assert_eq(farr, 0);
    cr_assert_eq(ferry_timer_cancel(far), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);   /* nothing left */
    cr_assert_eq(farr, 0);
}

static ferry_loop *cl;
static ferry_timer *pending_tm;
static int tm_ran, canceller_rc = 1;

static void canceller(void *arg)
{
    (void)arg;
    canceller_rc = ferry_timer_cancel(pending_tm);
}

static void arm_and_queue(void *arg)
{
    (void)arg;
    /* Due now: the poll after this turn moves it to the run queue, behind
     * the canceller. */
    ferry_call_later(cl, 0, set_flag, &tm_ran, &pending_tm);
    ferry_call_soon(cl, canceller, NULL);
}

TL(cancel_of_a_fired_timer_whose_callback_has_not_run_yet)
{
    ferry_loop_stats st;

    cr_assert_eq(ferry_loop_new(&cl, &(ferry_loop_opts){ .io_interval = 1 }), 0);
    cr_assert_eq(ferry_call_soon(cl, arm_and_queue, NULL), 0);
    cr_assert_eq(ferry_loop_run(cl, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(canceller_rc, 0);
    cr_assert_eq(tm_ran, 0, "a cancelled timer's callback ran");
    cr_assert_eq(ferry_loop_stats_get(cl, &st), 0);
    cr_assert_eq(st.steps, 2, "only arm_and_queue and the canceller ran");
    ferry_loop_free(cl);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- turns, stop, references -------------------------------------------- */

static void stopper(void *arg)
{
    push_order(arg);
    ferry_loop_stop(tu_loop);
}

T(stop_inside_a_turn_keeps_the_rest_of_the_turn_in_order)
{
    ferry_call_soon(tu_loop, push_order, (void *)1);
    ferry_call_soon(tu_loop, stopper, (void *)2);
    ferry_call_soon(tu_loop, push_order, (void *)3);
    ferry_call_soon(tu_loop, push_order, (void *)4);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 2);
    ferry_call_soon(tu_loop, push_order, (void *)5);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(order[i], i + 1);
}

static void unref_from_libevent(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    *(int *)arg = ferry_loop_unref(tu_loop) == 0 ? 1 : -1;
}

T(ref_keeps_an_idle_loop_running_until_unref)
{
    struct timeval tv = { 0, 2000 };
    struct event *ev;
    int done = 0;

    cr_assert_eq(ferry_loop_ref(tu_loop), 0);
    /* No task, callback or timer of ferry's: only the reference and an
     * event of the application's in the loop's base. */
    ev = evtimer_new(ferry_loop_base(tu_loop), unref_from_libevent, &done);
    cr_assert_not_null(ev);
    evtimer_add(ev, &tv);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(done, 1);
    event_free(ev);
}

T(a_post_from_the_loop_thread_keeps_default_run_going_until_it_ran)
{
    int ran = 0;

    cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, set_flag, &ran), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ran, 1);
}

static int reent[6];

static void reenter_cb(void *arg)
{
    (void)arg;
    reent[0] = ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    ferry_loop_free(tu_loop);            /* inside its own turn: ignored */
    reent[1] = ferry_call_soon(tu_loop, push_order, (void *)7);
}

static int reenter_task(void *arg)
{
    ferry_loop *l2 = (ferry_loop *)&reent;

    (void)arg;
    reent[2] = ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    reent[3] = ferry_loop_new(&l2, NULL);
    reent[4] = l2 == NULL;
    reent[5] = ferry_run(ret0, NULL);
    return 0;
}

T(running_making_or_freeing_a_loop_from_inside_it_is_refused)
{
    cr_assert_eq(ferry_call_soon(tu_loop, reenter_cb, NULL), 0);
    cr_assert_eq(tu_run(reenter_task, NULL), 0);
    cr_assert_eq(reent[0], -EPERM);
    cr_assert_eq(reent[1], 0, "the loop was freed from its own callback");
    cr_assert_eq(reent[2], -EPERM);
    cr_assert_eq(reent[3], -EPERM);
    cr_assert_eq(reent[4], 1);
    cr_assert_eq(reent[5], -EPERM);
    cr_assert_eq(norder, 1);
    cr_assert_eq(order[0], 7);
}

/* ---- two loops on one thread --------------------------------------------- */

static ferry_group xg;
static ferry_event xg_go;
static int xg_status = 1;
static ferry_task *xg_task_a;
static int cross_rc[3];

static int owner_on_a(void *arg)
{
    (void)arg;
    ferry_group_init(&xg);
    ferry_event_wait(&xg_go);
    xg_status = ferry_group_wait(&xg);
    return 0;
}

static int task_on_b(void *arg)
{
    (void)arg;
    cross_rc[0] = ferry_group_spawn(&xg, ret0, NULL, NULL);   /* a group of loop a */
    cross_rc[1] = ferry_task_join(xg_task_a, NULL);          /* a task of loop a */
    cross_rc[2] = ferry_event_set(&xg_go);                   /* bound to loop a */
    return 0;
}

TL(two_loops_on_one_thread_keep_their_tasks_and_primitives_apart)
{
    ferry_loop *a, *b;

    cr_assert_eq(ferry_loop_new(&a, NULL), 0);
    cr_assert_eq(ferry_loop_new(&b, NULL), 0);
    cr_assert_eq(ferry_loop_current(), a, "the first loop made on a thread is its current one");
    cr_assert_eq(ferry_task_spawn(&xg_task_a, a, owner_on_a, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(a, FERRY_RUN_ONCE), 0);     /* the owner waits */
    cr_assert_eq(run_on(b, task_on_b, NULL), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(cross_rc[i], -EPERM, "call %d returned %d", i, cross_rc[i]);
    cr_assert_eq(ferry_loop_current(), a);
    cr_assert_eq(ferry_event_set(&xg_go), 0);
    cr_assert_eq(ferry_loop_run(a, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(xg_task_a, NULL), 0);
    cr_assert_eq(xg_status, 0);
    ferry_event_destroy(&xg_go);
    /* Freeing the current loop leaves the thread without one until the
     * other runs. */
    ferry_loop_free(a);
    cr_assert_null(ferry_loop_current());
    cr_assert_eq(run_on(b, ret0, NULL), 0);
    cr_assert_eq(ferry_loop_current(), b);
    ferry_loop_free(b);
    cr_assert_null(ferry_loop_current());
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- fd and signal waits -------------------------------------------------- */

static int wait_rc[9];

static int wait_errors_task(void *arg)
{
    int file_fd = *(int *)arg, p[2];

    wait_rc[0] = ferry_wait_signal(NSIG);
    wait_rc[1] = ferry_wait_signal(SIGKILL);       /* cannot be caught */
    wait_rc[8] = ferry_wait_signal(SIGSTOP);
    wait_rc[2] = ferry_wait_fd(0, 4, NULL);        /* unknown event bit */
    wait_rc[3] = ferry_wait_fd(file_fd, FERRY_READ, NULL);   /* epoll refuses files */
    /* libevent cannot allocate the registration. */
    if (pipe(p) == 0) {
        ferry__fault_arm(1, true);
        wait_rc[4] = ferry_wait_fd(p[0], FERRY_READ, NULL);
        wait_rc[5] = ferry_wait_signal(SIGUSR2);
        ferry__fault_reset();
        close(p[0]);
        close(p[1]);
    }
    ferry_task_cancel(ferry_task_current());
    wait_rc[6] = ferry_wait_signal(SIGUSR1);       /* cancelled: at once */
    wait_rc[7] = ferry_wait_fd(0, FERRY_READ, NULL);
    return ferry_sleep(INT64_MAX);                 /* longer than the clock: also at once */
}

T(wait_fd_and_wait_signal_errors_wait_for_nothing)
{
    FILE *f = tmpfile();
    int fd;

    cr_assert_not_null(f);
    fd = fileno(f);
    cr_assert_eq(tu_run(wait_errors_task, &fd), -ECANCELED);
    fclose(f);
    cr_assert_eq(wait_rc[0], -EINVAL);
    cr_assert_eq(wait_rc[1], -EINVAL, "SIGKILL: %d", wait_rc[1]);
    cr_assert_eq(wait_rc[8], -EINVAL, "SIGSTOP: %d", wait_rc[8]);
    cr_assert_eq(wait_rc[2], -EINVAL);
    cr_assert_eq(wait_rc[3], -ENOMEM, "a regular file: %d", wait_rc[3]);
    cr_assert_eq(wait_rc[4], -ENOMEM);
    cr_assert_eq(wait_rc[5], -ENOMEM);
    cr_assert_eq(wait_rc[6], -ECANCELED);
    cr_assert_eq(wait_rc[7], -ECANCELED);
}

/* ---- ferry_run and ferry_loop_new under allocation failure ------------- */

static int ret42(void *arg)
{
    (void)arg;
    return 42;
}

TL(ferry_run_returns_enomem_when_the_loop_or_the_task_cannot_be_made)
{
    unsigned long n, hits;
    int rc, enomem = 0;

    cr_assert_eq(ferry_run(ret42, NULL), 42);    /* one-time setup done */
    for (n = 1; n < 1000; n++) {
        ferry__fault_arm(n, false);
        rc = ferry_run(ret42, NULL);
        hits = ferry__fault_hits();
        ferry__fault_reset();
        if (hits == 0) {
            cr_assert_eq(rc, 42);
            break;
        }
        cr_assert(rc == -ENOMEM || rc == 42, "point %lu: %d", n, rc);
        enomem += rc == -ENOMEM;
    }
    cr_assert_lt(n, 1000);
    cr_assert_gt(enomem, 2);
    cr_assert_eq(tu_leaks(), 0);
}

TL(loop_new_on_an_attached_base_undoes_everything_on_failure)
{
    struct event_base *base;
    ferry_loop *l;
    unsigned long n, hits;
    int rc, enomem = 0;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);   /* one-time setup done */
    ferry_loop_free(l);
    base = event_base_new();
    cr_assert_not_null(base);
    for (n = 1; n < 1000; n++) {
        ferry__fault_arm(n, false);
        l = (ferry_loop *)&n;
        rc = ferry_loop_new(&l, &(ferry_loop_opts){ .base = base });
        hits = ferry__fault_hits();
        ferry__fault_reset();
        if (rc == 0) {
            cr_assert_eq(ferry_loop_base(l), base);
            cr_assert_eq(run_on(l, ret42, NULL), 42);
            ferry_loop_free(l);
            if (hits == 0)
                break;
        } else {
            cr_assert_eq(rc, -ENOMEM, "point %lu: %d", n, rc);
            cr_assert_null(l);
            enomem++;
        }
        /* The application's base is intact and still dispatches. */
        cr_assert_eq(event_base_loop(base, EVLOOP_NONBLOCK), 1);
    }
    cr_assert_lt(n, 1000);
    cr_assert_gt(enomem, 2);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- the dump ------------------------------------------------------------- */

static char *dump_buf;
static size_t dump_len;
static int dump_n, stubborn_sleep_rc = 1;

static int shielded_sleeper(void *arg)
{
    ferry_scope s;

    (void)arg;
    ferry_scope_enter(&s, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    stubborn_sleep_rc = ferry_sleep(FERRY_MSEC(20));
    ferry_scope_exit(&s);
    return ferry_yield();          /* the held-back cancellation arrives */
}

static int dump_main(void *arg)
{
    ferry_task *fresh, *stubborn;
    ferry_group g;
    FILE *f;
    int st = 1;

    (void)arg;
    ferry_group_init(&g);
    ferry_group_spawn(&g, sleep_long, NULL, &(ferry_task_opts){ .name = "grouped" });
    ferry_task_spawn(&stubborn, NULL, shielded_sleeper, NULL,
                     &(ferry_task_opts){ .name = "stubborn" });
    ferry_yield();                         /* both wait now */
    ferry_task_cancel(stubborn);           /* shielded: still waiting */
    ferry_task_spawn(&fresh, NULL, ret0, NULL, &(ferry_task_opts){ .name = "fresh" });
    f = open_memstream(&dump_buf, &dump_len);
    dump_n = ferry_loop_dump(tu_loop, f);
    fclose(f);
    ferry_group_cancel(&g);
    ferry_group_wait(&g);
    ferry_task_join(fresh, NULL);
    ferry_task_join(stubborn, &st);
    return st;
}

/* The dump's line of the task named `name`, or "" */
static const char *dump_line(const char *name, char *line, size_t size)
{
    const char *p = strstr(dump_buf, name), *s, *e;

    if (!p)
        return "";
    for (s = p; s > dump_buf && s[-1] != '\n'; s--)
        ;
    e = strchr(p, '\n');
    if (!e)
        e = p + strlen(p);
    snprintf(line, size, "%.*s", (int)(e - s), s);
    return line;
}

T(dump_shows_every_state_wait_timer_cancellation_and_group)
{
    char l[256];

    cr_assert_eq(tu_run(dump_main, NULL), -ECANCELED);
    cr_assert_eq(stubborn_sleep_rc, 0, "a shielded sleep was cut short");
    cr_assert_eq(dump_n, 4, "dump: %s", dump_buf);
    cr_assert(strstr(dump_buf, "4 live task(s)"), "%s", dump_buf);
    cr_assert(strstr(dump_line("'main'", l, sizeof l), "running"), "%s", dump_buf);
    cr_assert(strstr(dump_line("'fresh'", l, sizeof l), "ready"), "%s", dump_buf);
    dump_line("'grouped'", l, sizeof l);
    cr_assert(strstr(l, "waiting on sleep") && strstr(l, "wakes in") && strstr(l, "in group"),
              "%s", dump_buf);
    cr_assert_null(strstr(l, "cancelled"), "%s", dump_buf);
    dump_line("'stubborn'", l, sizeof l);
    cr_assert(strstr(l, "waiting on sleep") && strstr(l, ", cancelled"), "%s", dump_buf);
    cr_assert_null(strstr(l, "in group"), "%s", dump_buf);
    free(dump_buf);
}

/* ---- join and detach misuse -------------------------------------------- */

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
    ferry_task_spawn(&u, NULL, ret42, NULL, NULL);
    ferry_task_cancel(ferry_task_current());
    join_rc[3] = ferry_task_join(u, &st);       /* cancelled: at once, the handle stays ours */
    join_rc[4] = ferry_task_try_join(u, &st);   /* u has not run */
    ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    join_rc[5] = ferry_task_join(u, &st);
    ferry_scope_exit(&shield);
    return st;
}

T(join_and_detach_misuse_is_refused_and_keeps_the_handle)
{
    cr_assert_eq(tu_run(join_misuse_main, NULL), 42);
    cr_assert_eq(join_rc[0], -EINVAL, "join of a detached task");
    cr_assert_eq(join_rc[1], -EINVAL, "try_join of a detached task");
    cr_assert_eq(join_rc[2], -EINVAL, "detach twice");
    cr_assert_eq(join_rc[3], -ECANCELED);
    cr_assert_eq(join_rc[4], -EAGAIN);
    cr_assert_eq(join_rc[5], 0);
}

/* ---- groups ---------------------------------------------------------------- */

static ferry_group cb_group;
static int cb_rc[3] = { 1, 1, 1 }, non_owner_rc = 1, closed_rc = 1, bad_spawn_rc = 1, empty_rc = 1;

static void group_from_callback(void *arg)
{
    (void)arg;
    cb_rc[0] = ferry_group_spawn(&cb_group, ret0, NULL, NULL);
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
    closed_rc = ferry_group_spawn(&cb_group, ret0, NULL, NULL);
    ferry_group_init(&g2);
    bad_spawn_rc = ferry_group_spawn(&g2, NULL, NULL, NULL);
    ferry_group_cancel(&g2);                    /* no children: nothing to do */
    empty_rc = ferry_group_wait(&g2);
    return rc;
}

T(group_misuse_from_callbacks_and_non_owners_is_refused)
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
    failing_spawn_rc = ferry_group_spawn(&g, ret0, NULL, NULL);
    return ferry_group_wait(&g);
}

T(group_keeps_its_first_failure_and_refuses_spawns_while_failing)
{
    /* The first failure (-ECANCELED returned by a child nobody cancelled)
     * stays the status; the sibling's later -7 does not replace it. */
    cr_assert_eq(tu_run(group_fail_main, NULL), -ECANCELED);
    cr_assert_eq(failing_spawn_rc, -ESHUTDOWN);
}

/* ---- scopes ------------------------------------------------------------------ */

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

T(yield_inside_a_deadline_that_has_not_passed_returns_0)
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

T(a_sleep_that_ends_with_its_scope_deadline_reports_the_deadline)
{
    cr_assert_eq(tu_run(sleep_to_the_scope_deadline, NULL), -ETIMEDOUT);
    cr_assert_eq(sleep_rc, -ETIMEDOUT);
    cr_assert(sleep_fired);
}

static int a_steps, b_steps;

static int stop_then_yield(void *arg)
{
    (void)arg;
    for (int i = 0; i < 5; i++) {
        if (++a_steps == 3)
            ferry_loop_stop(tu_loop);
        ferry_yield();
    }
    return 0;
}

static int count_yields(void *arg)
{
    (void)arg;
    for (int i = 0; i < 5; i++) {
        b_steps++;
        ferry_yield();
    }
    return 0;
}

T(stop_from_a_task_takes_effect_at_its_next_switch_even_with_handover)
{
    ferry_task *a, *b;

    cr_assert_eq(ferry_task_spawn(&a, tu_loop, stop_then_yield, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&b, tu_loop, count_yields, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    /* The yield after the stop went back to the scheduler instead of
     * handing over to b. */
    cr_assert_eq(a_steps, 3);
    cr_assert_eq(b_steps, 2);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(a, NULL), 0);
    cr_assert_eq(ferry_task_try_join(b, NULL), 0);
    cr_assert_eq(a_steps, 5);
    cr_assert_eq(b_steps, 5);
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

TL(a_grant_that_comes_before_the_deadline_timer_is_polled_wins)
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

/* ---- freeing a loop ---------------------------------------------------------- */

static ferry_loop *fl;
static int free_rc[3] = { 1, 1, 1 }, stubborn_rc = 1, pending_cb_ran, dropped_ran;

static int closing_task(void *arg)
{
    int rc = ferry_sleep(FERRY_SEC(100));    /* cancelled by ferry_loop_free() */

    (void)arg;
    free_rc[0] = rc;
    free_rc[1] = ferry_task_spawn(NULL, NULL, ret0, NULL, NULL);
    free_rc[2] = ferry_loop_stop(fl);         /* does not cut the free short */
    return rc;
}

static int stubborn_task(void *arg)
{
    ferry_scope s;

    (void)arg;
    ferry_scope_enter(&s, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    stubborn_rc = ferry_sleep(FERRY_MSEC(5));
    ferry_scope_exit(&s);
    return 0;
}

TL(free_waits_for_shielded_tasks_runs_callbacks_refuses_spawns_drops_timers)
{
    cr_assert_eq(ferry_loop_new(&fl, &(ferry_loop_opts){ .io_interval = 1 }), 0);
    cr_assert_eq(ferry_task_spawn(NULL, fl, closing_task, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, fl, stubborn_task, NULL, NULL), 0);
    cr_assert_eq(ferry_call_later(fl, FERRY_SEC(100), set_flag, &dropped_ran, NULL), 0);
    cr_assert_eq(ferry_loop_run(fl, FERRY_RUN_ONCE), 0);     /* both wait */
    cr_assert_eq(ferry_call_soon(fl, set_flag, &pending_cb_ran), 0);
    ferry_loop_free(fl);
    cr_assert_eq(free_rc[0], -ECANCELED);
    cr_assert_eq(free_rc[1], -ESHUTDOWN, "spawn into a closing loop: %d", free_rc[1]);
    cr_assert_eq(free_rc[2], 0);
    cr_assert_eq(stubborn_rc, 0, "the shielded sleep was cut short");
    cr_assert_eq(pending_cb_ran, 1);
    cr_assert_eq(dropped_ran, 0, "a timer fired during free");
    cr_assert_eq(tu_leaks(), 0);
}

static int post_ran, chain_ran;

static void chain_cb(void *arg)
{
    post_ran++;
    ferry_call_soon(arg, set_flag, &chain_ran);
}

TL(free_of_an_idle_loop_runs_accepted_posts_and_what_they_schedule)
{
    ferry_loop *l;
    int dropped = 0, soon = 0;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(l, chain_cb, l), 0);
    cr_assert_eq(ferry_call_later(l, 0, set_flag, &dropped, NULL), 0);
    cr_assert_eq(ferry_call_soon(l, set_flag, &soon), 0);
    ferry_loop_free(l);
    cr_assert_eq(soon, 1, "an accepted callback did not run");
    cr_assert_eq(post_ran, 1);
    cr_assert_eq(chain_ran, 1);
    cr_assert_eq(dropped, 0, "timers that never fired are dropped");
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- the blocked-loop detector on callbacks ---------------------------- */

static void slow_cb(void *arg)
{
    (void)arg;
    usleep(2000);
}

T(slow_callback_is_reported_as_a_callback)
{
    ferry_loop_stats st;

    ferry_set_log(capture_log, NULL);
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, 1), 0);   /* 1 ns */
    ferry_call_soon(tu_loop, slow_cb, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    ferry_set_log(NULL, NULL);
    cr_assert_eq(nlogged, 1);
    cr_assert(strstr(logged, "by a callback"), "log was: %s", logged);
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.slow_steps, 1);
}

T(default_log_writes_a_warning_line_on_stderr)
{
    const char *out;

    ferry_set_log(NULL, NULL);
    ferry_loop_set_slow_threshold(tu_loop, 1);
    ferry_call_soon(tu_loop, slow_cb, NULL);
    stderr_capture();
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    out = stderr_release();
    cr_assert(strstr(out, "ferry: warning: loop blocked for"), "stderr was: %s", out);
}

/* ---- an application's event_base ------------------------------------- */

static int attached_yields;

static int yielder(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20; i++) {
        if (ferry_yield())
            return -1;
        attached_yields++;
    }
    return 0;
}

TL(attached_loop_runs_a_bounded_number_of_steps_per_kick)
{
    struct event_base *base = event_base_new();
    ferry_loop_stats st;
    ferry_task *t[3];
    ferry_loop *l;
    int status;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .base = base, .io_interval = 2 }), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ferry_task_spawn(&t[i], l, yielder, NULL, NULL), 0);
    cr_assert_eq(event_base_dispatch(base), 1, "dispatch ended with events left");
    cr_assert_eq(attached_yields, 60);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ferry_task_try_join(t[i], &status), 0);
        cr_assert_eq(status, 0);
    }
    cr_assert_eq(ferry_loop_stats_get(l, &st), 0);
    cr_assert_geq(st.steps, 63);
    ferry_loop_free(l);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}

TL(attached_loop_run_directly_ignores_its_pending_kick_and_a_stale_tick)
{
    struct event_base *base = event_base_new();
    ferry_timer *tm;
    ferry_loop *l;
    int ran = 0, fired = 0;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .base = base }), 0);
    /* Outside ferry_loop_run, a callback activates the kick event. */
    cr_assert_eq(ferry_call_soon(l, set_flag, &ran), 0);
    /* ferry_loop_run() runs it and then polls the base, where the kick is
     * still active: it must not run a turn inside the turn. */
    cr_assert_eq(ferry_loop_run(l, FERRY_RUN_ONCE), 0);
    cr_assert_eq(ran, 1);
    cr_assert_eq(event_base_loop(base, EVLOOP_NONBLOCK), 1);
    cr_assert_eq(ran, 1);
    /* A timer cancelled after it armed the base's tick: the tick fires,
     * finds nothing and disarms, and the application's dispatch ends. */
    cr_assert_eq(ferry_call_later(l, FERRY_MSEC(1), set_flag, &fired, &tm), 0);
    cr_assert_eq(ferry_timer_cancel(tm), 0);
    cr_assert_eq(event_base_dispatch(base), 1);
    cr_assert_eq(fired, 0);
    ferry_loop_free(l);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}

static ferry_loop *att;
static int att_rc[2] = { 1, 1 };

static void reenter_attached(void *arg)
{
    att_rc[0] = ferry_loop_run(att, FERRY_RUN_ONCE);   /* inside a turn of the dispatch */
    ferry_loop_free(att);                              /* ignored */
    att_rc[1] = ferry_call_soon(att, set_flag, arg);
}

TL(attached_loop_refuses_run_and_free_from_its_own_callbacks)
{
    struct event_base *base = event_base_new();
    ferry_loop *first;
    int later = 0;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&first, NULL), 0);
    cr_assert_eq(ferry_loop_new(&att, &(ferry_loop_opts){ .base = base }), 0);
    ferry_loop_free(first);
    cr_assert_null(ferry_loop_current(), "the thread has no current loop now");
    cr_assert_eq(ferry_call_soon(att, reenter_attached, &later), 0);
    cr_assert_eq(event_base_dispatch(base), 1);
    cr_assert_eq(att_rc[0], -EPERM);
    cr_assert_eq(att_rc[1], 0, "the loop was freed from its own callback");
    cr_assert_eq(later, 1);
    cr_assert_eq(ferry_loop_current(), att, "the dispatch made it current");
    ferry_loop_free(att);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- stacks: guards, canary, reporter, altstack ------------------------ */

static int guard_kind[2] = { -1, -1 }, canary_ok[2];

static int note_guard(void *arg)
{
    ferry_task *self = ferry_task_current();
    int i = (int)(intptr_t)arg;

    guard_kind[i] = self->stk.guard;
    for (int k = 0; k < 5; k++)
        ferry_yield();          /* the two tasks hand over to each other */
    canary_ok[i] = *(uint64_t *)self->lo == FERRY__CANARY;
    return 0;
}

TL(stack_guard_none_puts_a_canary_that_survives_switches)
{
    ferry_loop *l;
    ferry_task *t[2];
    int st;

    cr_assert_eq(setenv("FERRY_STACK_GUARD", "none", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    unsetenv("FERRY_STACK_GUARD");
    ferry_loop_set_slow_threshold(l, 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ferry_task_spawn(&t[i], l, note_guard, (void *)(intptr_t)i, NULL), 0);
    cr_assert_eq(ferry_loop_run(l, FERRY_RUN_DEFAULT), 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ferry_task_try_join(t[i], &st), 0);
        cr_assert_eq(st, 0);
        cr_assert_eq(guard_kind[i], FERRY__GUARD_NONE);
        cr_assert(canary_ok[i]);
    }
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

TL(stack_guard_with_an_unknown_value_probes_as_usual)
{
    ferry_loop *l;

    cr_assert_eq(setenv("FERRY_STACK_GUARD", "bogus", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    unsetenv("FERRY_STACK_GUARD");
    cr_assert_eq(run_on(l, note_guard, (void *)0), 0);
    cr_assert_neq(guard_kind[0], FERRY__GUARD_NONE);
    ferry_loop_free(l);
}

TL(mprotect_guards_stop_at_their_budget_then_stacks_get_a_canary)
{
    enum { CAP = 40000 };
    ferry_task *t, *first = NULL;
    ferry_loop *l;
    size_t guarded = 0;
    int kind = -1, first_kind, st;

#ifdef COV_TSAN
    cr_skip_test("16,385 TSan fibers: TSan runs out of trace memory");
#endif
    if (RUNNING_ON_VALGRIND)
        cr_skip_test("32,768 mappings: more segments than valgrind tracks");
    cr_assert_eq(setenv("FERRY_STACK_GUARD", "mprotect", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    unsetenv("FERRY_STACK_GUARD");
    cr_assert_eq(ferry_task_spawn(&first, l, ret42, NULL, NULL), 0);
    first_kind = first->stk.guard;
    /* Detached tasks that never run: ferry_loop_free() ends them. */
    for (int i = 0; i < CAP; i++) {
        cr_assert_eq(ferry_task_spawn(&t, l, ret0, NULL, NULL), 0);
        kind = t->stk.guard;
        ferry_task_detach(t);
        if (kind != FERRY__GUARD_MPROTECT)
            break;
        guarded++;
    }
    cr_assert_eq(first_kind, FERRY__GUARD_MPROTECT);
    cr_assert_eq(kind, FERRY__GUARD_NONE, "no budget after %zu stacks", guarded);
    cr_assert_eq(l->mprotect_live, guarded + 1);
    /* An unguarded task still runs, with its canary. */
    cr_assert_eq(ferry_loop_run(l, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(first, &st), 0);
    cr_assert_eq(st, 42);
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

/* Stacks beyond the cache.  A loop keeping 8 free stacks runs 200 tasks
 * (four slabs of 64 slots; the main task holds slot 0 of the first).  When
 * the loop next waits, the three slabs with nothing live are unmapped
 * whole; the first slab's free stacks above the cache give their pages
 * back once they have been above it for 100 ms, least recently freed
 * first; the slots are reused afterwards. */
enum { TRIM_N = 200, TRIM_CACHE = 8 };
static void *trim_top[TRIM_N];
static int trim_ran;
static size_t trim_nfree[4], trim_slabs[4], trim_resident[2];

static int note_top_and_yield(void *arg)
{
    ferry_task *self = ferry_task_current();

    trim_top[(intptr_t)arg] = ferry__stack_base(&self->stk) + self->stk.size - 4096;
    ferry_yield();
    trim_ran++;
    return 0;
}

static size_t count_slabs(ferry_loop *l)
{
    struct ferry__link *p;
    size_t n = 0;

    ferry__list_foreach(p, &l->slabs)
        n++;
    return n;
}

static bool page_resident(void *page)
{
    unsigned char v = 0;

    return mincore(page, 4096, &v) == 0 && (v & 1);
}

static int spawn_and_join(int n)
{
    ferry_task *t[TRIM_N];
    int rc = 0;

    for (int i = 0; i < n; i++)
        if (ferry_task_spawn(&t[i], NULL, note_top_and_yield, (void *)(intptr_t)i, NULL))
            return -1;
    for (int i = 0; i < n; i++)
        if (ferry_task_join(t[i], NULL))
            rc = -1;
    return rc;
}

static int trim_main(void *arg)
{
    ferry_loop *l = arg;

    if (spawn_and_join(TRIM_N))
        return -1;
    trim_nfree[0] = l->stack_nfree;
    trim_slabs[0] = count_slabs(l);
    /* The loop waits (long enough that it does, also under valgrind): the
     * slabs with nothing live go. */
    ferry_sleep(FERRY_MSEC(50));
    trim_nfree[1] = l->stack_nfree;
    trim_slabs[1] = count_slabs(l);
    /* The rest is above the cache for more than 100 ms at the poll before
     * the second wait. */
    ferry_sleep(FERRY_MSEC(150));
    ferry_sleep(FERRY_MSEC(1));
    trim_nfree[2] = l->stack_nfree;
    trim_slabs[2] = count_slabs(l);
    trim_resident[0] = page_resident(trim_top[0]);    /* freed first: given back */
    trim_resident[1] = page_resident(trim_top[62]);   /* freed last in the slab: kept */
    if (spawn_and_join(100))                          /* cold slots come back */
        return -1;
    trim_nfree[3] = l->stack_nfree;
    trim_slabs[3] = count_slabs(l);
    return 0;
}

TL(free_stacks_beyond_the_cache_go_back_in_whole_slabs_then_page_by_page)
{
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .stack_cache = TRIM_CACHE }), 0);
    ferry_loop_set_slow_threshold(l, 0);
    cr_assert_eq(run_on(l, trim_main, l), 0);
    cr_assert_eq(trim_ran, TRIM_N + 100);
    cr_assert_eq(trim_nfree[0], TRIM_N);
    cr_assert_eq(trim_slabs[0], 4);
    cr_assert_eq(trim_nfree[1], 63, "%zu", trim_nfree[1]);
    cr_assert_eq(trim_slabs[1], 1);
    cr_assert_eq(trim_nfree[2], TRIM_CACHE, "%zu", trim_nfree[2]);
    cr_assert_eq(trim_slabs[2], 1);
    if (!RUNNING_ON_VALGRIND) {
        cr_assert_not(trim_resident[0], "a trimmed stack kept its pages");
        cr_assert(trim_resident[1], "a cached stack lost its pages");
    }
    cr_assert_eq(trim_slabs[3], 2, "%zu", trim_slabs[3]);
    /* The 100 stacks just used are all free again; none trimmed yet. */
    cr_assert_eq(trim_nfree[3], 100, "%zu", trim_nfree[3]);
    cr_assert_eq(l->mprotect_live, 0);
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

/* The hand-over (switch.h): a turn of more tasks than io_interval is
 * handed from task to task all the way through, because the scheduler
 * polls only between turns.  (It once stopped handing over after
 * io_interval steps and sent the rest of the turn through the scheduler.)
 * While the blocked-loop detector times steps, no step skips the
 * scheduler.  The same holds in ASan and TSan builds: the hand-over is
 * annotated for them, not compiled out. */
enum { HAND_N = 300, HAND_ROUNDS = 3 };

static int hand_yielder(void *arg)
{
    (void)arg;
    for (int i = 0; i < HAND_ROUNDS; i++)
        if (ferry_yield())
            return -1;
    return 0;
}

static int hand_main(void *arg)
{
    ferry_task *t[HAND_N];
    int rc = 0;

    (void)arg;
    for (int i = 0; i < HAND_N; i++)
        if (ferry_task_spawn(&t[i], NULL, hand_yielder, NULL, NULL))
            return -1;
    for (int i = 0; i < HAND_N; i++)
        if (ferry_task_join(t[i], NULL))
            rc = -1;
    return rc;
}

static uint64_t handoffs_of_run(int64_t slow)
{
    ferry_loop_stats st;
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(ferry_loop_set_slow_threshold(l, slow), 0);
    cr_assert_eq(run_on(l, hand_main, NULL), 0);
    cr_assert_eq(ferry_loop_stats_get(l, &st), 0);
    cr_assert_geq(st.steps, (uint64_t)HAND_N * (HAND_ROUNDS + 1));
    ferry_loop_free(l);
    return st.handoffs;
}

TL(a_turn_longer_than_io_interval_is_handed_over_all_the_way)
{
    uint64_t fast = handoffs_of_run(0), timed = handoffs_of_run(FERRY_SEC(10));

    /* A task's first step (which starts it) and its last (after which it
     * ends) go through the scheduler; the HAND_ROUNDS - 1 steps between
     * are handed over, but for the first step of each turn. */
    cr_assert_geq(fast, (uint64_t)(HAND_N - 1) * (HAND_ROUNDS - 1),
                  "%" PRIu64 " of %d steps handed over", fast, HAND_N * (HAND_ROUNDS - 1));
    cr_assert_eq(timed, 0, "%" PRIu64 " steps skipped the detector", timed);
    cr_assert_eq(tu_leaks(), 0);
}

/* Stack colouring (loop_int.h): the task structures of one slab's slots
 * sit at different offsets within a page, one cache line apart, so that
 * their hot lines do not all share the same cache sets.  The base computed
 * back from a coloured header is still the slot's (page-aligned) base, and
 * a stack with a mapping of its own is not coloured. */
enum { COLOR_N = FERRY__STACK_COLORS - 1 };   /* slots 1..31: the main task holds slot 0 */
static uintptr_t color_off[COLOR_N];
static bool color_base_aligned[COLOR_N];
static size_t color_room[COLOR_N];
static uintptr_t color_single_off;

static int note_color(void *arg)
{
    ferry_task *self = ferry_task_current();
    intptr_t i = (intptr_t)arg;
    char *base = ferry__stack_base(&self->stk);

    if (i < 0) {
        color_single_off = ((uintptr_t)self + FERRY__TASK_ROOM) % 4096;
    } else {
        color_off[i] = (uintptr_t)self % 4096;
        color_base_aligned[i] = (uintptr_t)base % 4096 == 0 &&
                                (char *)self->lo == base + FERRY__GUARD_SIZE;
        color_room[i] = (size_t)((char *)self->hi - (char *)self->lo);
    }
    return 0;
}

static int color_main(void *arg)
{
    ferry_task *t[COLOR_N], *single;
    int rc = 0;

    (void)arg;
    for (int i = 0; i < COLOR_N; i++)
        if (ferry_task_spawn(&t[i], NULL, note_color, (void *)(intptr_t)i, NULL))
            return -1;
    if (ferry_task_spawn(&single, NULL, note_color, (void *)(intptr_t)-1,
                         &(ferry_task_opts){ .stack_size = 2 * FERRY_STACK_DEFAULT }))
        return -1;
    for (int i = 0; i < COLOR_N; i++)
        if (ferry_task_join(t[i], NULL))
            rc = -1;
    if (ferry_task_join(single, NULL))
        rc = -1;
    return rc;
}

TL(stacks_of_a_slab_are_coloured_one_cache_line_apart)
{
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(run_on(l, color_main, NULL), 0);
    for (int i = 0; i < COLOR_N; i++) {
        cr_assert(color_base_aligned[i], "slot %d: the base computed from the header is off", i + 1);
        cr_assert_eq(color_off[i] % 64, 0);
        cr_assert_geq(color_room[i], FERRY_STACK_DEFAULT - FERRY__TASK_ROOM - 64 * (COLOR_N + 1) + 64);
        for (int k = 0; k < i; k++)
            cr_assert_neq(color_off[i], color_off[k], "slots %d and %d share an offset", k + 1, i + 1);
    }
    cr_assert_eq(color_single_off, 0, "a stack of its own is coloured");
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

/* The canary: a task that overwrote the bottom of its stack is stopped when
 * it switches out.  ferry logs and aborts; the SIGABRT handler checks the
 * line written on stderr and exits with 42 (so the coverage data is
 * written; a test process killed by a signal writes none). */
static void canary_abort_handler(int sig)
{
    char buf[1024] = { 0 };
    ssize_t n;
    int code = 43;

    (void)sig;
    n = pread(fileno(cap_file), buf, sizeof buf - 1, 0);
    if (n > 0 && strstr(buf, "ferry: error: stack overflow in task 'smasher' (canary overwritten)"))
        code = 42;
#ifdef COV_ASAN
    /* LeakSanitizer at exit() would scan the main thread's stack from here,
     * the task's stack, miss the runner's allocations and report them. */
    _exit(code);
#else
    exit(code);
#endif
}

static int smash_and_sleep(void *arg)
{
    (void)arg;
    *(volatile uint64_t *)ferry_task_current()->lo = 0;   /* what a deep recursion does */
    ferry_sleep(FERRY_MSEC(1));
    return 0;
}

static int smash_and_yield(void *arg)
{
    (void)arg;
    ferry_yield();                      /* the partner has started too */
    *(volatile uint64_t *)ferry_task_current()->lo = 0;
    ferry_yield();                      /* hands over to the partner */
    return 0;
}

static int partner(void *arg)
{
    (void)arg;
    for (int i = 0; i < 10; i++)
        ferry_yield();
    return 0;
}

static void canary_run(ferry_task_fn smasher, bool with_partner)
{
    ferry_loop *l;

    cr_assert_eq(setenv("FERRY_STACK_GUARD", "none", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    ferry_loop_set_slow_threshold(l, 0);
    ferry_set_log(NULL, NULL);          /* the default: stderr */
    cr_assert_eq(ferry_task_spawn(NULL, l, smasher, NULL,
                                  &(ferry_task_opts){ .name = "smasher" }), 0);
    if (with_partner)
        cr_assert_eq(ferry_task_spawn(NULL, l, partner, NULL, NULL), 0);
    signal(SIGABRT, canary_abort_handler);
    stderr_capture();
    ferry_loop_run(l, FERRY_RUN_DEFAULT);
    stderr_release();
    cr_assert_fail("the overwritten canary went unnoticed");
}

TL(canary_overwritten_is_caught_when_the_task_goes_back_to_the_scheduler, .exit_code = 42)
{
    canary_run(smash_and_sleep, false);
}

TL(canary_overwritten_is_caught_when_the_task_hands_over, .exit_code = 42)
{
    canary_run(smash_and_yield, true);
}

/* The overflow reporter, driven by a SIGSEGV sent to this thread with a
 * chosen fault address (rt_tgsigqueueinfo) while the stack pointer is in
 * the task's stack: only an address in the running task's guard region is
 * reported.  The reporter then restores the default
 * action; a queued signal is not repeated, so the process goes on. */
static void segv_to_self(const void *addr)
{
    siginfo_t si;

    memset(&si, 0, sizeof si);
    si.si_signo = SIGSEGV;
    si.si_code = SEGV_MAPERR;
    si.si_addr = (void *)addr;
    syscall(SYS_rt_tgsigqueueinfo, getpid(), (pid_t)syscall(SYS_gettid), SIGSEGV, &si);
}

/* Where segv_task says the fault was. */
enum { AT_LOW, AT_STACK, AT_GUARD };

static int segv_task(void *arg)
{
    ferry_task *self = ferry_task_current();
    const char *base = ferry__stack_base(&self->stk);

    switch ((int)(intptr_t)arg) {
    case AT_LOW:                /* far below the stack: a NULL dereference */
        segv_to_self((const void *)16);
        break;
    case AT_STACK:              /* inside the usable stack */
        segv_to_self((const char *)self->lo + 2 * ferry__page_size());
        break;
    default:                    /* the guard region */
        segv_to_self(base + 8);
        break;
    }
    return 0;
}

static bool segv_default(void)
{
    struct sigaction sa;

    sigaction(SIGSEGV, NULL, &sa);
    return !(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_DFL;
}

TL(overflow_reporter_names_the_task_only_for_its_guard_page)
{
#if defined(COV_ASAN) || defined(COV_TSAN)
    cr_skip_test("the sanitizer owns SIGSEGV");
#else
    ferry_loop *l;
    const char *out;
    bool dfl[5];
    int k = 0;

    if (RUNNING_ON_VALGRIND)
        cr_skip_test("valgrind delivers a queued SIGSEGV its own way");
    cr_assert(segv_default());
    stderr_capture();
    /* The reporter stays installed after its loop is gone: no loop. */
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    ferry_loop_free(l);
    segv_to_self((const void *)16);
    dfl[k++] = segv_default();
    /* A loop, no task. */
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    segv_to_self((const void *)16);
    dfl[k++] = segv_default();
    ferry_loop_free(l);
    /* A task, each place; every new loop installs the reporter again. */
    for (int at = AT_LOW; at <= AT_GUARD; at++) {
        cr_assert_eq(ferry_loop_new(&l, NULL), 0);
        cr_assert_eq(run_on(l, segv_task, (void *)(intptr_t)at), 0);
        dfl[k++] = segv_default();
        ferry_loop_free(l);
    }
    out = stderr_release();
    for (int i = 0; i < k; i++)
        cr_assert(dfl[i], "the reporter did not restore the default action (%d)", i);
    cr_assert(strstr(out, "ferry: stack overflow in task 'main'; raise ferry_task_opts.stack_size"),
              "stderr was: %s", out);
    cr_assert_eq(count_str(out, "stack overflow"), 1, "stderr was: %s", out);
#endif
}

static void app_segv(int sig)
{
    (void)sig;
}

TL(loop_leaves_an_application_sigsegv_handler_in_place)
{
#if defined(COV_ASAN) || defined(COV_TSAN)
    cr_skip_test("the sanitizer owns SIGSEGV");
#else
    struct sigaction sa;
    ferry_loop *l;

    signal(SIGSEGV, app_segv);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(sigaction(SIGSEGV, NULL, &sa), 0);
    cr_assert_not(sa.sa_flags & SA_SIGINFO);
    cr_assert_eq(sa.sa_handler, app_segv);
    cr_assert_eq(run_on(l, ret42, NULL), 42);
    ferry_loop_free(l);
    signal(SIGSEGV, SIG_DFL);
#endif
}

/* Address space so short that no new mapping fits, while malloc is fed
 * from a heap grown beforehand: the loop is made without its fork mark
 * (optional), and a spawn that needs a new stack mapping fails cleanly. */
static long vm_size_kib(void)
{
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");

    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

TL(no_address_space_left_no_fork_mark_and_spawn_enomem)
{
#if defined(COV_ASAN) || defined(COV_TSAN)
    cr_skip_test("the sanitizer's allocator maps memory of its own");
#else
    struct rlimit old, low;
    ferry_loop *l;
    ferry_task *t = (ferry_task *)&old;
    bool no_mark = false, current = false;
    int rc_new, rc_spawn = 1, rc_after;
    void *warm;

    if (RUNNING_ON_VALGRIND)
        cr_skip_test("valgrind manages the address space itself");
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);   /* one-time setup done */
    ferry_loop_free(l);
    /* Keep 8 MiB of free heap for malloc: no trimming, no mmap'd chunks. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    warm = malloc(8 << 20);
    cr_assert_not_null(warm);
    memset(warm, 1, 8 << 20);
    free(warm);
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)vm_size_kib() * 1024;
    cr_assert_eq(setrlimit(RLIMIT_AS, &low), 0);
    rc_new = ferry_loop_new(&l, NULL);
    if (rc_new == 0) {
        no_mark = l->fork_mark == NULL;
        current = ferry_loop_is_current(l);
        rc_spawn = ferry_task_spawn(&t, l, ret42, NULL, NULL);
    }
    setrlimit(RLIMIT_AS, &old);
    cr_assert_eq(rc_new, 0, "loop_new without address space: %d", rc_new);
    cr_assert_eq(rc_spawn, -ENOMEM, "spawn without address space: %d", rc_spawn);
    cr_assert(no_mark, "the fork mark was mapped");
    cr_assert(current);
    cr_assert_null(t);
    /* With its address space back, the same loop spawns and runs. */
    rc_after = run_on(l, ret42, NULL);
    cr_assert_eq(rc_after, 42);
    ferry_loop_free(l);
#endif
}

TL(freeing_loops_leaves_an_alternate_signal_stack_they_did_not_install)
{
    static char mine[FERRY__ALTSTACK_SIZE];
    ferry_loop *a, *b;
    stack_t before, ss, set;
    void *a_stack;

    cr_assert_eq(sigaltstack(NULL, &before), 0);
    cr_assert_eq(ferry_loop_new(&a, NULL), 0);
    cr_assert_eq(sigaltstack(NULL, &ss), 0);
    cr_assert_not(ss.ss_flags & SS_DISABLE);
    if (!(before.ss_flags & SS_DISABLE))
        cr_assert_eq(ss.ss_sp, before.ss_sp, "replaced an existing altstack");
    a_stack = ss.ss_sp;
    /* A second loop on the thread finds it and keeps it. */
    cr_assert_eq(ferry_loop_new(&b, NULL), 0);
    ferry_loop_free(b);
    cr_assert_eq(sigaltstack(NULL, &ss), 0);
    cr_assert_not(ss.ss_flags & SS_DISABLE);
    cr_assert_eq(ss.ss_sp, a_stack);
    /* The application installs its own: freeing `a` leaves it. */
    set.ss_sp = mine;
    set.ss_size = sizeof mine;
    set.ss_flags = 0;
    cr_assert_eq(sigaltstack(&set, NULL), 0);
    ferry_loop_free(a);
    cr_assert_eq(sigaltstack(NULL, &ss), 0);
    cr_assert_eq(ss.ss_sp, (void *)mine);
    cr_assert_not(ss.ss_flags & SS_DISABLE);
    if (before.ss_flags & SS_DISABLE) {
        set.ss_flags = SS_DISABLE;
        sigaltstack(&set, NULL);
    } else {
        sigaltstack(&before, NULL);
    }
    cr_assert_eq(tu_leaks(), 0);
}
