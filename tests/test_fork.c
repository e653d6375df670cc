/* test_fork.c - the fork policy of docs/fork.md: a forked child's use of an
 * inherited loop fails cleanly (-EPERM), the parent's loop goes on, and
 * fork+exec / posix_spawn from a task works.
 *
 * A child reports through its exit status: 0 if every check held, else the
 * number (1..100) of the first check that failed.  Two tests look inside
 * (src/loop_int.h): they write into the loop's fork mark what a forked
 * child reads there, and take the mark away as a kernel without
 * MADV_WIPEONFORK leaves it.
 */
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/bridge.h"
#include "loop_int.h"

extern char **environ;

#define T(name) Test(fork, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

static void noop_cb(void *arg)
{
    (void)arg;
}

static int noop_task(void *arg)
{
    (void)arg;
    return 0;
}

static ferry_sem fork_sem;   /* bound to tu_loop before the fork */
static ferry_inbox *fork_ib; /* tu_loop's inbox, taken before the fork */
static ferry_pool *fork_pool;/* made before the fork */

/* The calls of ferry/bridge.h that reach the inherited loop from the
 * thread side: each refuses (-ESHUTDOWN: the copy never runs), none posts
 * into the copy.  The waits have a timeout only so that a post accepted
 * by mistake fails the check instead of hanging. */
static int child_thread_side_checks(ferry_loop *loop)
{
    ferry_inbox *ib = NULL;
    ferry_future *f = NULL;
    int st = 0;

    if (ferry_loop_stop_threadsafe(loop) != -ESHUTDOWN)
        return 14;
    if (ferry_inbox_post(fork_ib, noop_cb, NULL) != -ESHUTDOWN)
        return 15;           /* an inbox taken before the fork */
    if (ferry_inbox_get(&ib, loop) != -ESHUTDOWN || ib)
        return 16;
    if (ferry_loop_run_sync(loop, noop_task, NULL, tu_ms(100), &st) != -ESHUTDOWN)
        return 17;
    if (ferry_loop_run_task_sync(loop, noop_task, NULL, tu_ms(100), &st) != -ESHUTDOWN)
        return 18;
    if (ferry_loop_spawn_threadsafe(loop, noop_task, NULL, NULL, &f) != -ESHUTDOWN || f)
        return 19;
    if (ferry_loop_call_threadsafe(loop, noop_task, NULL, &f) != -ESHUTDOWN || f)
        return 20;
    if (ferry_pool_submit(fork_pool, noop_task, NULL, loop, NULL, NULL) != -ESHUTDOWN)
        return 21;
    return 0;
}

/* Every loop-side call the child makes on the inherited loop; returns 0 or
 * the number of the first check that failed. */
static int child_checks(ferry_loop *loop)
{
    ferry_timer *tm;

    if (ferry_loop_is_current(loop))
        return 1;
    if (ferry_loop_run(loop, FERRY_RUN_ONCE) != -EPERM)
        return 2;
    if (ferry_call_soon(loop, noop_cb, NULL) != -EPERM)
        return 3;
    if (ferry_call_later(loop, 0, noop_cb, NULL, &tm) != -EPERM)
        return 4;
    if (ferry_task_spawn(NULL, loop, noop_task, NULL, NULL) != -EPERM)
        return 5;
    if (ferry_loop_stop(loop) != -EPERM)
        return 6;
    if (ferry_loop_ref(loop) != -EPERM)
        return 7;
    if (ferry_sem_try_acquire(&fork_sem) != -EPERM)
        return 8;
    if (ferry_sem_release(&fork_sem) != -EPERM)
        return 9;
    if (ferry_loop_base(loop) != NULL)
        return 10;
    if (ferry_task_current() != NULL)
        return 11;
    if (ferry_yield() != -EPERM)
        return 12;
    ferry_loop_free(loop);   /* must do nothing, not free the parent's state */
    if (ferry_loop_call_soon_threadsafe(loop, noop_cb, NULL) != -ESHUTDOWN)
        return 13;           /* accepted a post that can never run */
    return child_thread_side_checks(loop);
}

static int wait_child(pid_t pid)
{
    int st = 0;

    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

static int ran;

static int count_task(void *arg)
{
    (void)arg;
    ran++;
    return 0;
}

static void before_fork(void)
{
    /* Bind the semaphore to the loop, from the loop thread. */
    ferry_sem_init(&fork_sem, 1, 0);
    cr_assert_eq(ferry_sem_try_acquire(&fork_sem), 0);
    cr_assert_eq(ferry_sem_release(&fork_sem), 0);
    cr_assert_eq(ferry_inbox_get(&fork_ib, tu_loop), 0);
    cr_assert_eq(ferry_pool_new(&fork_pool, &(ferry_pool_opts){ .threads = 1 }), 0);
}

static void after_fork(void)
{
    ferry_inbox_unref(fork_ib);
    ferry_pool_free(fork_pool);
}

T(child_use_of_inherited_loop_fails_with_eperm)
{
    pid_t pid;
    int st;

    before_fork();
    pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0)
        _exit(child_checks(tu_loop));
    st = wait_child(pid);
    cr_assert(WIFEXITED(st), "child did not exit normally (status %#x)", st);
    cr_assert_eq(WEXITSTATUS(st), 0, "child check %d failed", WEXITSTATUS(st));

    /* The parent's loop is untouched. */
    cr_assert(ferry_loop_is_current(tu_loop));
    cr_assert_eq(ferry_task_spawn(NULL, tu_loop, count_task, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ran, 1);
    cr_assert_eq(ferry_sem_try_acquire(&fork_sem), 0);
    cr_assert_eq(ferry_sem_release(&fork_sem), 0);
    cr_assert_eq(ferry_sem_destroy(&fork_sem), 0);
    /* The parent's inbox still takes posts. */
    cr_assert_eq(ferry_inbox_post(fork_ib, noop_cb, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    after_fork();
}

/* fork() from inside a task: the child runs on the task's stack and must
 * not reach the parent's scheduler. */
static int fork_in_task_main(void *arg)
{
    int *child_status = arg;
    pid_t pid = fork();

    if (pid < 0)
        return -errno;
    if (pid == 0)
        _exit(child_checks(ferry_loop_current()));
    *child_status = wait_child(pid);   /* short: the child only checks and exits */
    return ferry_yield();              /* the parent's task still runs normally */
}

T(fork_inside_a_task_child_cannot_run_the_loop)
{
    int st = -1;

    before_fork();
    cr_assert_eq(tu_run(fork_in_task_main, &st), 0);
    cr_assert(WIFEXITED(st), "child did not exit normally (status %#x)", st);
    cr_assert_eq(WEXITSTATUS(st), 0, "child check %d failed", WEXITSTATUS(st));
    cr_assert_eq(ferry_sem_destroy(&fork_sem), 0);
    after_fork();
}

/* waitpid() on a pool thread, so that the loop keeps running: the job
 * then also waits until a sibling task of the waiting one has ticked a few
 * times, which it can only do if the loop runs meanwhile (a bounded wait:
 * a loop blocked by the job fails the test here, not by its timeout). */
struct reap {
    pid_t pid;
    int   status;
};

static atomic_int ticks;

static int reap_job(void *arg)
{
    struct reap *r = arg;
    int64_t until = ferry_now() + tu_ms(5000);

    while (waitpid(r->pid, &r->status, 0) < 0)
        if (errno != EINTR)
            return -errno;
    while (atomic_load(&ticks) < 3) {
        if (ferry_now() > until)
            return -ETIMEDOUT;
        usleep(1000);
    }
    return 0;
}

static int ticker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100000 && ferry_sleep(FERRY_MSEC(1)) == 0; i++)
        atomic_fetch_add(&ticks, 1);
    return 0;
}

static int spawn_true_main(void *arg)
{
    int mode = *(int *)arg, rc;
    struct reap r = { 0, -1 };
    char *argv[] = { "true", NULL };
    ferry_task *tick;

    /* A sibling that must keep running while we wait for the child. */
    rc = ferry_task_spawn(&tick, NULL, ticker, NULL, NULL);
    if (rc)
        return rc;
    if (mode == 0) {
        rc = posix_spawn(&r.pid, "/bin/true", NULL, NULL, argv, environ);
        if (rc)
            return -rc;
    } else {
        r.pid = fork();
        if (r.pid < 0)
            return -errno;
        if (r.pid == 0) {
            execv("/bin/true", argv);
            _exit(127);
        }
    }
    rc = ferry_to_thread(NULL, reap_job, &r);
    ferry_task_cancel(tick);
    ferry_task_join(tick, NULL);
    if (rc)
        return rc;
    if (!WIFEXITED(r.status))
        return -1000;
    return WEXITSTATUS(r.status);
}

T(posix_spawn_from_a_task_and_reap_on_a_pool_thread)
{
    int mode = 0;

    cr_assert_eq(tu_run(spawn_true_main, &mode), 0);
    cr_assert_geq(atomic_load(&ticks), 3);
}

T(fork_exec_from_a_task_and_reap_on_a_pool_thread)
{
    int mode = 1;

    cr_assert_eq(tu_run(spawn_true_main, &mode), 0);
    cr_assert_geq(atomic_load(&ticks), 3);
}

/* ---- what a forked child sees in the fork mark ------------------------------- */

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
    cr_assert_eq(tu_run(noop_task, NULL), 0);
}

T(a_loop_without_a_fork_mark_works)
{
    /* A kernel that refuses MADV_WIPEONFORK leaves the mark NULL. */
    const volatile unsigned char *saved = tu_loop->fork_mark;
    bool current;
    int rc;

    tu_loop->fork_mark = NULL;
    current = ferry_loop_is_current(tu_loop);
    rc = tu_run(noop_task, NULL);
    tu_loop->fork_mark = saved;
    cr_assert(current);
    cr_assert_eq(rc, 0);
}
