/* test_redis_sem.c - ferry_redis_sem (redis.h): the semaphore and lock
 * across processes, against a real redis-server started by each test:
 * FIFO grants, fencing tokens that only grow, a cancelled or timed-out
 * acquire that leaves no waiter on the server, a lease lost and reported,
 * a holder killed with SIGKILL whose permit comes back after its lease,
 * 8 processes of 4 tasks that never exceed a limit of 5 (peak measured on
 * the server), and the wake channel: a release wakes a waiter of another
 * connection or process whose polls are too rare to end the test in time,
 * a lost or refused channel falls back to polling, a resubscription finds
 * a grant whose wake was lost.  The processes are tests/redis_worker.c,
 * spawned.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "ferry/redis.h"
#define REDIS_SUITE test_redis_sem
#include "redis_fixture.h"
#include "testutil.h"

extern char **environ;

#define T(name) \
    Test(redis_sem, name, .init = redis_setup, .fini = redis_teardown, .timeout = 30.)

static const ferry_redis_sem_opts fast = {
    .lease = FERRY_SEC(5), .poll_min = FERRY_MSEC(2), .poll_max = FERRY_MSEC(20),
};

static int g_rc[16];
static int64_t g_val[16];
static struct tu_order g_order;
static int64_t g_fences[16];
static int g_nfences;

static int connect_srv(ferry_redis **r)
{
    return ferry_redis_connect(r, "127.0.0.1", g_srv.port, NULL);
}

/* Wait until the sorted set `key` holds `n` members (the waiters queued on
 * the server), asking through `r`; at most 10 s. */
static int wait_zcard(ferry_redis *r, const char *key, long long n)
{
    for (int i = 0; i < 1000; i++) {
        redisReply *rep;
        int rc = ferry_redis_command(r, &rep, "ZCARD %s", key);
        bool done;

        if (rc)
            return rc;
        done = rep->type == REDIS_REPLY_INTEGER && rep->integer == n;
        ferry_redis_reply_free(rep);
        if (done)
            return 0;
        ferry_sleep(FERRY_MSEC(10));
    }
    return -ETIMEDOUT;
}

/* ---- FIFO and fences in one process --------------------------------------- */

static ferry_redis *g_r;
static ferry_redis_sem *g_s;

static int fifo_task(void *arg)
{
    ferry_redis_permit *p;
    int rc = ferry_redis_sem_acquire(g_s, &p);

    if (rc)
        return rc;
    tu_order_add(&g_order, (int)(intptr_t)arg);
    g_fences[g_nfences++] = ferry_redis_permit_fence(p);
    ferry_sleep(FERRY_MSEC(2));
    return ferry_redis_permit_release(p);
}

static int fifo_main(void *arg)
{
    ferry_redis_permit *p;
    ferry_task *t[6];

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    if (g_rc[0])
        return 0;
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "fifo", &fast);
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[1] || g_rc[2])
        return 0;
    g_fences[g_nfences++] = ferry_redis_permit_fence(p);
    /* Each waiter queues (its first poll answered) before the next starts. */
    for (int i = 0; i < 6; i++) {
        t[i] = tu_spawn(fifo_task, (void *)(intptr_t)i);
        g_rc[6] |= wait_zcard(g_r, "{fifo}:queue", i + 1);
    }
    g_val[0] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {fifo}:queue");
    g_rc[3] = ferry_redis_permit_release(p);
    for (int i = 0; i < 6; i++)
        g_rc[4] |= tu_join(t[i]);
    g_rc[5] = ferry_redis_sem_free(g_s);
    ferry_redis_close(g_r);
    return 0;
}

T(lock_grants_in_arrival_order_with_growing_fences)
{
    cr_assert_eq(tu_run(fifo_main, NULL), 0);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_eq(g_val[0], 6, "waiters queued on the server: %lld", (long long)g_val[0]);
    cr_assert_eq(g_order.n, 6);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(g_order.who[i], i, "grant %d went to waiter %d", i, g_order.who[i]);
    cr_assert_eq(g_nfences, 7);
    for (int i = 1; i < g_nfences; i++)
        cr_assert_gt(g_fences[i], g_fences[i - 1], "fence %d: %lld after %lld", i,
                     (long long)g_fences[i], (long long)g_fences[i - 1]);
}

/* ---- FIFO across connections (as across processes) ---------------------- */

static ferry_redis_sem *g_sb, *g_sc;

static int conn_waiter(void *arg)
{
    ferry_redis_sem *s = arg;
    ferry_redis_permit *p;
    int rc = ferry_redis_sem_acquire(s, &p);

    if (rc)
        return rc;
    tu_order_add(&g_order, s == g_sb ? 1 : 2);
    ferry_sleep(FERRY_MSEC(5));
    return ferry_redis_permit_release(p);
}

static int across_main(void *arg)
{
    ferry_redis *ra, *rb, *rc_;
    ferry_redis_sem *sa;
    ferry_redis_permit *p;
    ferry_task *tb, *tc;
    /* C polls often, B seldom: B still goes first, having come first. */
    ferry_redis_sem_opts slow = { .lease = FERRY_SEC(5), .poll_min = FERRY_MSEC(50),
                                  .poll_max = FERRY_MSEC(50) };

    (void)arg;
    g_rc[0] = connect_srv(&ra) | connect_srv(&rb) | connect_srv(&rc_);
    g_rc[1] = ferry_redis_lock_new(&sa, ra, "across", &fast) |
              ferry_redis_lock_new(&g_sb, rb, "across", &slow) |
              ferry_redis_lock_new(&g_sc, rc_, "across", &fast);
    g_rc[2] = ferry_redis_sem_acquire(sa, &p);
    tb = tu_spawn(conn_waiter, g_sb);
    g_rc[5] = wait_zcard(ra, "{across}:queue", 1);
    tc = tu_spawn(conn_waiter, g_sc);
    g_rc[5] |= wait_zcard(ra, "{across}:queue", 2);
    g_rc[3] = ferry_redis_permit_release(p);
    g_rc[4] = tu_join(tb) | tu_join(tc);
    ferry_redis_sem_free(sa);
    ferry_redis_sem_free(g_sb);
    ferry_redis_sem_free(g_sc);
    ferry_redis_close(ra);
    ferry_redis_close(rb);
    ferry_redis_close(rc_);
    return 0;
}

T(fifo_across_connections)
{
    cr_assert_eq(tu_run(across_main, NULL), 0);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_eq(g_order.n, 2);
    cr_assert_eq(g_order.who[0], 1, "the later waiter (polling more often) went first");
    cr_assert_eq(g_order.who[1], 2);
}

/* ---- a cancelled or timed-out acquire leaves nothing behind -------------- */

static int waiter_task(void *arg)
{
    ferry_redis_permit *p = NULL;
    int64_t deadline = *(int64_t *)arg;
    ferry_scope sc;
    int rc;

    ferry_scope_enter(&sc, deadline, 0);
    rc = ferry_redis_sem_acquire(g_s, &p);
    ferry_scope_exit(&sc);
    if (rc == 0)
        ferry_redis_permit_release(p);
    return rc;
}

static int gone_main(void *arg)
{
    ferry_redis *holder_conn;
    ferry_redis_sem *hs;
    ferry_redis_permit *p;
    redisReply *rep = NULL;
    int64_t never = FERRY_NEVER, soon;
    ferry_task *t;

    (void)arg;
    g_rc[0] = connect_srv(&holder_conn) | connect_srv(&g_r);
    g_rc[1] = ferry_redis_lock_new(&hs, holder_conn, "gone", &fast) |
              ferry_redis_lock_new(&g_s, g_r, "gone", &fast);
    g_rc[2] = ferry_redis_sem_acquire(hs, &p);
    /* Cancelled while waiting. */
    t = tu_spawn(waiter_task, &never);
    wait_zcard(g_r, "{gone}:queue", 1);
    g_val[0] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {gone}:queue");
    ferry_task_cancel(t);
    g_rc[3] = tu_join(t);
    /* The removal went on g_r before this. */
    g_rc[4] = ferry_redis_command(g_r, &rep, "PING");
    ferry_redis_reply_free(rep);
    g_val[1] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {gone}:queue");
    g_val[2] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {gone}:alive");
    /* Timed out while waiting. */
    soon = ferry_now() + FERRY_MSEC(30);
    t = tu_spawn(waiter_task, &soon);
    g_rc[5] = tu_join(t);
    g_rc[6] = ferry_redis_command(g_r, &rep, "PING");
    ferry_redis_reply_free(rep);
    g_val[3] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {gone}:queue");
    g_val[4] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {gone}:alive");
    g_val[5] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {gone}:holders");
    ferry_redis_permit_release(p);
    ferry_redis_sem_free(hs);
    ferry_redis_sem_free(g_s);
    ferry_redis_close(holder_conn);
    ferry_redis_close(g_r);
    return 0;
}

T(cancelled_acquire_leaves_no_waiter)
{
    cr_assert_eq(tu_run(gone_main, NULL), 0);
    cr_assert_eq(g_rc[0] | g_rc[1] | g_rc[2], 0);
    cr_assert_eq(g_val[0], 1, "the waiter was queued on the server");
    cr_assert_eq(g_rc[3], -ECANCELED, "%d", g_rc[3]);
    cr_assert_eq(g_rc[4], 0);
    cr_assert_eq(g_val[1], 0, "queue after the cancel: %lld", (long long)g_val[1]);
    cr_assert_eq(g_val[2], 0, "heartbeats after the cancel: %lld", (long long)g_val[2]);
    cr_assert_eq(g_rc[5], -ETIMEDOUT, "%d", g_rc[5]);
    cr_assert_eq(g_rc[6], 0);
    cr_assert_eq(g_val[3], 0, "queue after the timeout: %lld", (long long)g_val[3]);
    cr_assert_eq(g_val[4], 0, "heartbeats after the timeout: %lld", (long long)g_val[4]);
    cr_assert_eq(g_val[5], 1, "only the holder holds");
}

/* ---- a lease lost is reported -------------------------------------------- */

static int lost_main(void *arg)
{
    /* Slow builds stall the loop longer: the lease grows with them. */
    ferry_redis_sem_opts o = { .lease = tu_ms(400) };
    ferry_redis_permit *p;
    redisReply *rep = NULL;

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "lost", &o);
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[0] | g_rc[1] | g_rc[2])
        return 0;
    /* Renewals keep it past several leases.  A lease long against the
     * renewal period keeps a loaded machine's scheduling stalls from
     * losing it. */
    ferry_sleep(tu_ms(1000));
    g_val[0] = ferry_redis_permit_held(p);
    g_val[1] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {lost}:holders");
    /* Taken away on the server: the next renewal finds out. */
    g_rc[3] = ferry_redis_command(g_r, &rep, "DEL {lost}:holders");
    ferry_redis_reply_free(rep);
    ferry_sleep(tu_ms(400));
    g_val[2] = ferry_redis_permit_held(p);
    g_rc[4] = ferry_redis_permit_release(p);
    g_rc[5] = ferry_redis_sem_free(g_s);
    ferry_redis_close(g_r);
    return 0;
}

T(lost_lease_is_reported)
{
    cr_assert_eq(tu_run(lost_main, NULL), 0);
    cr_assert_eq(g_rc[0] | g_rc[1] | g_rc[2], 0);
    cr_assert(g_val[0], "held after two and a half leases' time");
    cr_assert_eq(g_val[1], 1, "still the holder on the server");
    cr_assert_not(g_val[2], "the renewal found the lease gone");
    cr_assert_eq(g_rc[4], -ESTALE, "%d", g_rc[4]);
    cr_assert_eq(g_rc[5], 0);
}

/* ---- other processes ----------------------------------------------------- */

/* Start tests/redis_worker.c with `argv`; with out_fd, its stdout is a
 * pipe whose reading end goes to *out_fd; with in_fd >= 0, its stdin is
 * in_fd.  The pid, or -1 (fit for a task: no cr_assert). */
static pid_t start_worker_in(char *const argv[], int *out_fd, int in_fd)
{
    posix_spawn_file_actions_t fa;
    int fds[2] = { -1, -1 };
    pid_t pid;

    if (out_fd != NULL && pipe(fds) != 0)
        return -1;
    posix_spawn_file_actions_init(&fa);
    if (out_fd != NULL) {
        posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
        posix_spawn_file_actions_addclose(&fa, fds[0]);
    }
    if (in_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
    if (posix_spawn(&pid, REDIS_WORKER, &fa, NULL, argv, environ) != 0)
        pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    if (out_fd != NULL) {
        close(fds[1]);
        if (pid < 0)
            close(fds[0]);
        else
            *out_fd = fds[0];
    }
    return pid;
}

static pid_t start_worker(char *const argv[], int *out_fd)
{
    return start_worker_in(argv, out_fd, -1);
}

static pid_t spawn_worker(char *const argv[], int *out_fd)
{
    pid_t pid = start_worker(argv, out_fd);

    cr_assert_gt(pid, 0, "could not start %s", REDIS_WORKER);
    return pid;
}

static int64_t g_child_fence;

static int after_kill_main(void *arg)
{
    ferry_redis_sem_opts o = { .lease = FERRY_MSEC(500) };
    ferry_redis_permit *p;
    ferry_scope sc;

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "killed", &o);
    ferry_scope_enter(&sc, ferry_now() + FERRY_SEC(10), 0);
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    ferry_scope_exit(&sc);
    if (g_rc[2] == 0) {
        g_val[0] = ferry_redis_permit_fence(p);
        ferry_redis_permit_release(p);
    }
    ferry_redis_sem_free(g_s);
    ferry_redis_close(g_r);
    return 0;
}

T(killed_holder_gives_permit_back_after_lease)
{
    char port[16], line[64] = "";
    char *argv[] = { "redis_worker", "hold", port, "killed", "500", NULL };
    int fd, status;
    ssize_t n;
    pid_t pid;

    snprintf(port, sizeof(port), "%d", g_srv.port);
    pid = spawn_worker(argv, &fd);
    n = read(fd, line, sizeof(line) - 1);
    close(fd);
    cr_assert_gt(n, 0, "the holder printed no fence");
    g_child_fence = strtoll(line, NULL, 10);
    /* Renewed while it lives: held after more than two leases. */
    usleep(1200 * 1000);
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "ZCARD {killed}:holders"), 1,
                 "the holder's lease was renewed");
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    cr_assert_eq(tu_run(after_kill_main, NULL), 0);
    cr_assert_eq(g_rc[0] | g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0, "acquire after the holder died: %d", g_rc[2]);
    cr_assert_gt(g_val[0], g_child_fence, "fence %lld after the dead holder's %lld",
                 (long long)g_val[0], (long long)g_child_fence);
}

T(eight_processes_respect_a_limit_of_five)
{
    char port[16];
    char *argv[] = { "redis_worker", "limit", port, "uploads", "5", "4", "3", "20", NULL };
    pid_t pids[8];
    int go[2], status;

    snprintf(port, sizeof(port), "%d", g_srv.port);
    /* The workers start together when `go` is closed: started one after
     * the other, a slow spawn (valgrind) let each finish its 4 tasks
     * before the next began, and the peak was 4. */
    /* Close-on-exec: only the stdin copy may reach a worker, or none
     * would ever see the end. */
    cr_assert_eq(pipe2(go, O_CLOEXEC), 0);
    for (int i = 0; i < 8; i++) {
        pids[i] = start_worker_in(argv, NULL, go[0]);
        cr_assert_gt(pids[i], 0, "could not start %s", REDIS_WORKER);
    }
    close(go[0]);
    close(go[1]);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker %d failed: %#x", i,
                  status);
    }
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "GET {uploads}:cur"), 1,
                 "everyone counted out (a string of length 1: \"0\")");
    char peak[16];
    tu_redis_query(&g_srv, peak, sizeof(peak), "GET {uploads}:peak");
    cr_assert_str_eq(peak, "5", "peak concurrency on the server: %s", peak);
}

/* ---- the script cache emptied (as by a server restart) ------------------- */

static int flushed_main(void *arg)
{
    ferry_redis_permit *p;
    redisReply *rep = NULL;

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "flushed", &fast);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[2] == 0)
        ferry_redis_permit_release(p);
    g_rc[3] = ferry_redis_command(g_r, &rep, "SCRIPT FLUSH");
    ferry_redis_reply_free(rep);
    g_rc[4] = ferry_redis_sem_acquire(g_s, &p);
    /* Flushed while held: the release, sent by its SHA1, goes again as
     * EVAL; two PINGs later it has run. */
    g_rc[7] = ferry_redis_command(g_r, &rep, "SCRIPT FLUSH");
    ferry_redis_reply_free(rep);
    if (g_rc[4] == 0)
        g_rc[5] = ferry_redis_permit_release(p);
    for (int i = 0; i < 2; i++) {
        g_rc[8] |= ferry_redis_command(g_r, &rep, "PING");
        ferry_redis_reply_free(rep);
    }
    g_val[0] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {flushed}:holders");
    g_rc[6] = ferry_redis_sem_free(g_s);
    ferry_redis_close(g_r);
    return 0;
}

T(acquire_reloads_a_flushed_script)
{
    cr_assert_eq(tu_run(flushed_main, NULL), 0);
    for (int i = 0; i < 9; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_eq(g_val[0], 0, "the release ran after the flush: %lld holders",
                 (long long)g_val[0]);
}

/* ---- a release wakes the waiters of other connections and processes ----- */

/*
 * Polls too rare to matter: a waiter polling every 600 s can be granted
 * within these tests' 20 s timeout (scaled by the slow builds' time
 * factor, at most 120 s) only by the wake that a release sends it, so a
 * test that ends at all shows that the wake came.
 */
#define TW(name) \
    Test(redis_sem, name, .init = redis_setup, .fini = redis_teardown, .timeout = 20.)

static const ferry_redis_sem_opts rare = {
    .poll_min = FERRY_SEC(600), .poll_max = FERRY_SEC(600),
};

/* Wait until `n` wake channels are subscribed on the server; at most 10 s. */
static int wait_channels(ferry_redis *r, long long n)
{
    for (int i = 0; i < 1000; i++) {
        redisReply *rep;
        int rc = ferry_redis_command(r, &rep, "PUBSUB CHANNELS ferry-wake:*");
        bool done;

        if (rc)
            return rc;
        done = rep->type == REDIS_REPLY_ARRAY && (long long)rep->elements == n;
        ferry_redis_reply_free(rep);
        if (done)
            return 0;
        ferry_sleep(FERRY_MSEC(10));
    }
    return -ETIMEDOUT;
}

/* One command whose reply must be an OK status or an integer. */
static int command_ok(ferry_redis *r, const char *cmd)
{
    redisReply *rep;
    int rc = ferry_redis_command(r, &rep, cmd);

    if (rc)
        return rc;
    if (rep->type != REDIS_REPLY_STATUS && rep->type != REDIS_REPLY_INTEGER)
        rc = -EPROTO;
    ferry_redis_reply_free(rep);
    return rc;
}

static int woken_fifo_main(void *arg)
{
    ferry_redis *ra, *rb, *rc_;
    ferry_redis_sem *sa;
    ferry_redis_permit *p;
    ferry_task *tb, *tc;

    (void)arg;
    g_rc[0] = connect_srv(&ra) | connect_srv(&rb) | connect_srv(&rc_);
    g_rc[1] = ferry_redis_lock_new(&sa, ra, "woken", &fast) |
              ferry_redis_lock_new(&g_sb, rb, "woken", &rare) |
              ferry_redis_lock_new(&g_sc, rc_, "woken", &rare);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(sa, &p);
    tb = tu_spawn(conn_waiter, g_sb);
    g_rc[5] = wait_zcard(ra, "{woken}:queue", 1);
    tc = tu_spawn(conn_waiter, g_sc);
    g_rc[5] |= wait_zcard(ra, "{woken}:queue", 2);
    /* B is woken by this release, C by B's. */
    g_rc[3] = ferry_redis_permit_release(p);
    g_rc[4] = tu_join(tb) | tu_join(tc);
    ferry_redis_sem_free(sa);
    ferry_redis_sem_free(g_sb);
    ferry_redis_sem_free(g_sc);
    ferry_redis_close(ra);
    ferry_redis_close(rb);
    ferry_redis_close(rc_);
    return 0;
}

TW(release_wakes_waiters_of_other_connections_in_arrival_order)
{
    cr_assert_eq(tu_run(woken_fifo_main, NULL), 0);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_eq(g_order.n, 2);
    cr_assert_eq(g_order.who[0], 1, "the first waiter was granted first");
    cr_assert_eq(g_order.who[1], 2);
}

static pid_t g_pid;
static int g_fd = -1;

/* Holds the lock while a waiter in another process (600 s polls) queues,
 * then releases it. */
static int xproc_main(void *arg)
{
    char **argv = arg;
    ferry_redis_permit *p;

    g_rc[0] = connect_srv(&g_r);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "xproc", &fast);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[2])
        return 0;
    g_val[0] = ferry_redis_permit_fence(p);
    g_pid = start_worker(argv, &g_fd);
    g_rc[3] = g_pid > 0 ? wait_zcard(g_r, "{xproc}:queue", 1) : -ECHILD;
    g_rc[4] = ferry_redis_permit_release(p);
    g_rc[5] = ferry_redis_sem_free(g_s);
    ferry_redis_close(g_r);
    return 0;
}

TW(release_in_one_process_wakes_a_waiter_in_another)
{
    char port[16], line[64] = "";
    char *argv[] = { "redis_worker", "acquire", port, "xproc", "600000", NULL };
    ssize_t n;
    int status;

    snprintf(port, sizeof(port), "%d", g_srv.port);
    cr_assert_eq(tu_run(xproc_main, argv), 0);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    n = read(g_fd, line, sizeof(line) - 1);
    close(g_fd);
    cr_assert_eq(waitpid(g_pid, &status, 0), g_pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the waiter failed: %#x", status);
    cr_assert_gt(n, 0, "the waiter printed no fence");
    cr_assert_gt(strtoll(line, NULL, 10), g_val[0], "fence %s after the holder's %lld", line,
                 (long long)g_val[0]);
}

/* ---- leases still run out, for holders and for waiters ------------------- */

static const ferry_redis_sem_opts fallback = {
    .poll_min = FERRY_MSEC(20), .poll_max = FERRY_MSEC(200),
};

static int lone_waiter(void *arg)
{
    ferry_redis_permit *p;
    int rc = ferry_redis_sem_acquire(arg, &p);

    if (rc)
        return rc;
    g_val[1] = ferry_redis_permit_fence(p);
    return ferry_redis_permit_release(p);
}

/* A holder process renews a 2 s lease; this waits for the lock, and the
 * holder is killed meanwhile. */
static int killed_while_waiting_main(void *arg)
{
    ferry_task *t;

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "kw", &fallback);
    if (g_rc[0] | g_rc[1])
        return 0;
    t = tu_spawn(lone_waiter, g_s);
    g_rc[2] = wait_zcard(g_r, "{kw}:queue", 1);
    kill(g_pid, SIGKILL);
    g_rc[3] = tu_join(t);
    g_rc[4] = ferry_redis_sem_free(g_s);
    ferry_redis_close(g_r);
    return 0;
}

T(lease_of_a_killed_holder_goes_to_the_waiting_task)
{
    char port[16], line[64] = "";
    /* A lease long enough that a holder process stalled by a loaded
     * machine still renews it in time. */
    char *argv[] = { "redis_worker", "hold", port, "kw", "2000", NULL };
    int fd, status;
    ssize_t n;

    snprintf(port, sizeof(port), "%d", g_srv.port);
    g_pid = spawn_worker(argv, &fd);
    n = read(fd, line, sizeof(line) - 1);
    close(fd);
    cr_assert_gt(n, 0, "the holder printed no fence");
    cr_assert_eq(tu_run(killed_while_waiting_main, NULL), 0);
    waitpid(g_pid, &status, 0);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_gt(g_val[1], strtoll(line, NULL, 10), "fence %lld after the dead holder's %s",
                 (long long)g_val[1], line);
}

/* A waiter process queues first and is killed; the release that follows
 * must still reach the live waiter behind it. */
static int dead_waiter_main(void *arg)
{
    char **argv = arg;
    ferry_redis *rb;
    ferry_redis_sem *sb;
    ferry_redis_permit *p;
    ferry_task *t;
    int status;

    g_rc[0] = connect_srv(&g_r) | connect_srv(&rb);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "dw", &fast) |
              ferry_redis_lock_new(&sb, rb, "dw", &fallback);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[2])
        return 0;
    g_pid = start_worker(argv, NULL);
    g_rc[3] = g_pid > 0 ? wait_zcard(g_r, "{dw}:queue", 1) : -ECHILD;
    t = tu_spawn(lone_waiter, sb);
    g_rc[3] |= wait_zcard(g_r, "{dw}:queue", 2);
    kill(g_pid, SIGKILL);
    waitpid(g_pid, &status, 0);
    g_rc[4] = ferry_redis_permit_release(p);
    g_rc[5] = tu_join(t);
    g_rc[6] = ferry_redis_sem_free(g_s) | ferry_redis_sem_free(sb);
    ferry_redis_close(g_r);
    ferry_redis_close(rb);
    return 0;
}

T(killed_waiter_does_not_keep_the_permit)
{
    char port[16];
    char *argv[] = { "redis_worker", "acquire", port, "dw", "100", NULL };

    snprintf(port, sizeof(port), "%d", g_srv.port);
    cr_assert_eq(tu_run(dead_waiter_main, argv), 0);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_gt(g_val[1], 0);
}

/* ---- the wake connection lost -------------------------------------------- */

/*
 * The waiter on rb waits with its wake channel subscribed; then SUBSCRIBE
 * is refused (ACL) and the subscriber connections are killed, so the wake
 * that the release sends is lost.  `allow_again`: SUBSCRIBE is allowed again
 * after the release, and the new subscription must find the grant;
 * otherwise the waiter's polling must.
 */
static int lost_wake_main(void *arg)
{
    bool allow_again = arg != NULL;
    ferry_redis *rb;
    ferry_redis_sem *sb;
    ferry_redis_permit *p;
    ferry_task *t;

    g_rc[0] = connect_srv(&g_r) | connect_srv(&rb);
    /* Polled every 600 s while the wake path is up; every 20 ms, doubling,
     * once it is lost (unless a resubscription is to be tested). */
    ferry_redis_sem_opts o = { .poll_min = allow_again ? FERRY_SEC(600) : FERRY_MSEC(20),
                               .poll_max = FERRY_SEC(600) };
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "lw", &fast) |
              ferry_redis_lock_new(&sb, rb, "lw", &o);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[2])
        return 0;
    t = tu_spawn(lone_waiter, sb);
    g_rc[3] = wait_zcard(g_r, "{lw}:queue", 1) | wait_channels(g_r, 1);
    g_rc[4] = command_ok(g_r, "ACL SETUSER default -subscribe") |
              command_ok(g_r, "CLIENT KILL TYPE pubsub") | wait_channels(g_r, 0);
    g_rc[5] = ferry_redis_permit_release(p);
    if (allow_again)
        g_rc[6] = command_ok(g_r, "ACL SETUSER default +subscribe");
    g_rc[7] = tu_join(t);
    /* Still refused: the grant came by polling. */
    g_val[0] = tu_redis_query(&g_srv, NULL, 0, "PUBSUB CHANNELS ferry-wake:*");
    g_rc[8] = ferry_redis_sem_free(g_s) | ferry_redis_sem_free(sb);
    ferry_redis_close(g_r);
    ferry_redis_close(rb);
    return 0;
}

TW(lost_wake_connection_falls_back_to_polling)
{
    cr_assert_eq(tu_run(lost_wake_main, NULL), 0);
    for (int i = 0; i < 9; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_gt(g_val[1], 0);
    cr_assert_eq(g_val[0], 0, "no wake channel was subscribed when the grant came");
}

TW(resubscription_finds_a_wake_lost_meanwhile)
{
    cr_assert_eq(tu_run(lost_wake_main, (void *)1), 0);
    for (int i = 0; i < 9; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_gt(g_val[1], 0);
}

/* ---- FIFO with waiters that only poll ------------------------------------ */

static int mixed_main(void *arg)
{
    ferry_redis_sem_opts polling = { .poll_min = FERRY_MSEC(200), .poll_max = FERRY_MSEC(200),
                                     .poll_only = true };
    ferry_redis *ra, *rb, *rc_;
    ferry_redis_sem *sa;
    ferry_redis_permit *p;
    ferry_task *tb, *tc;

    (void)arg;
    g_rc[0] = connect_srv(&ra) | connect_srv(&rb) | connect_srv(&rc_);
    g_rc[1] = ferry_redis_lock_new(&sa, ra, "mixed", &fast) |
              ferry_redis_lock_new(&g_sb, rb, "mixed", &polling) |
              ferry_redis_lock_new(&g_sc, rc_, "mixed", &rare);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(sa, &p);
    tb = tu_spawn(conn_waiter, g_sb);
    g_rc[5] = wait_zcard(ra, "{mixed}:queue", 1);
    tc = tu_spawn(conn_waiter, g_sc);
    g_rc[5] |= wait_zcard(ra, "{mixed}:queue", 2) | wait_channels(ra, 1);
    /* B, first, learns of its grant by polling; C, woken at once by
     * every release, must still come after it. */
    g_rc[3] = ferry_redis_permit_release(p);
    g_rc[4] = tu_join(tb) | tu_join(tc);
    ferry_redis_sem_free(sa);
    ferry_redis_sem_free(g_sb);
    ferry_redis_sem_free(g_sc);
    ferry_redis_close(ra);
    ferry_redis_close(rb);
    ferry_redis_close(rc_);
    return 0;
}

TW(a_woken_waiter_does_not_pass_an_earlier_one_that_only_polls)
{
    cr_assert_eq(tu_run(mixed_main, NULL), 0);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_eq(g_order.n, 2);
    cr_assert_eq(g_order.who[0], 1, "the earlier, polling waiter was granted first");
    cr_assert_eq(g_order.who[1], 2);
}

/* ---- a grant by another's release: a short lease, renewed early --------- */

static int pushed_holder(void *arg)
{
    ferry_redis_permit *p;
    int rc = ferry_redis_sem_acquire(arg, &p);

    if (rc)
        return rc;
    /* Past three times the heartbeat's 800 ms that the grant's lease
     * began with: only a renewal keeps it. */
    ferry_sleep(FERRY_MSEC(2500));
    g_val[1] = ferry_redis_permit_held(p);
    g_val[2] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {pushed}:holders");
    return ferry_redis_permit_release(p);
}

static int pushed_main(void *arg)
{
    ferry_redis_sem_opts heartbeat = { .poll_min = FERRY_MSEC(400), .poll_max = FERRY_MSEC(400),
                                       .waiter_ttl = FERRY_MSEC(800) };
    ferry_redis *rb;
    ferry_redis_sem *sb;
    ferry_redis_permit *p;
    ferry_task *t;

    (void)arg;
    g_rc[0] = connect_srv(&g_r) | connect_srv(&rb);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "pushed", &fast) |
              ferry_redis_lock_new(&sb, rb, "pushed", &heartbeat);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[2])
        return 0;
    t = tu_spawn(pushed_holder, sb);
    g_rc[3] = wait_zcard(g_r, "{pushed}:queue", 1) | wait_channels(g_r, 1);
    g_rc[4] = ferry_redis_permit_release(p);
    g_rc[5] = tu_join(t);
    g_rc[6] = ferry_redis_sem_free(g_s) | ferry_redis_sem_free(sb);
    ferry_redis_close(g_r);
    ferry_redis_close(rb);
    return 0;
}

T(a_permit_granted_by_a_release_keeps_its_lease)
{
    cr_assert_eq(tu_run(pushed_main, NULL), 0);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert(g_val[1], "held after three of the grant's first leases");
    cr_assert_eq(g_val[2], 1, "still the holder on the server");
}

/* ---- a waiter cancelled while its grant is on its way --------------------- */

static int cancel_race_main(void *arg)
{
    ferry_redis *rb, *rc_;
    ferry_redis_permit *p;
    ferry_task *tb, *tc;

    (void)arg;
    g_rc[0] = connect_srv(&g_r) | connect_srv(&rb) | connect_srv(&rc_);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "race", &fast) |
              ferry_redis_lock_new(&g_sb, rb, "race", &rare) |
              ferry_redis_lock_new(&g_sc, rc_, "race", &rare);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[2])
        return 0;
    tb = tu_spawn(conn_waiter, g_sb);
    g_rc[3] = wait_zcard(g_r, "{race}:queue", 1);
    tc = tu_spawn(conn_waiter, g_sc);
    g_rc[3] |= wait_zcard(g_r, "{race}:queue", 2) | wait_channels(g_r, 2);
    /* The release grants B on the server; B is cancelled before it hears
     * of it, so its own release must hand the permit on to C. */
    g_rc[4] = ferry_redis_permit_release(p);
    ferry_task_cancel(tb);
    g_rc[5] = tu_join(tb);
    g_rc[6] = tu_join(tc);
    g_val[0] = tu_redis_query(&g_srv, NULL, 0, "ZCARD {race}:holders");
    g_rc[7] = ferry_redis_sem_free(g_s) | ferry_redis_sem_free(g_sb) |
              ferry_redis_sem_free(g_sc);
    ferry_redis_close(g_r);
    ferry_redis_close(rb);
    ferry_redis_close(rc_);
    return 0;
}

TW(a_waiter_cancelled_before_hearing_of_its_grant_passes_it_on)
{
    cr_assert_eq(tu_run(cancel_race_main, NULL), 0);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_eq(g_rc[5], -ECANCELED, "the cancelled waiter: %d", g_rc[5]);
    cr_assert_eq(g_rc[6], 0, "the next waiter: %d", g_rc[6]);
    cr_assert_eq(g_rc[7], 0);
    cr_assert_eq(g_order.n, 1);
    cr_assert_eq(g_order.who[0], 2, "only the next waiter held the lock");
    cr_assert_eq(g_val[0], 0, "nothing held at the end");
}

/* ---- a server that refuses the scripts' PUBLISH --------------------------- */

static int publish_refused_main(void *arg)
{
    ferry_redis_sem_opts held_long = { .lease = FERRY_SEC(600) };
    ferry_redis *rb;
    ferry_redis_sem *sb;
    ferry_redis_permit *p;
    ferry_task *t;

    (void)arg;
    g_rc[0] = connect_srv(&g_r) | connect_srv(&rb);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "nopub", &held_long) |
              ferry_redis_lock_new(&sb, rb, "nopub", &fallback);
    if (g_rc[0] | g_rc[1])
        return 0;
    g_rc[2] = ferry_redis_sem_acquire(g_s, &p);
    if (g_rc[2])
        return 0;
    t = tu_spawn(lone_waiter, sb);
    g_rc[3] = wait_zcard(g_r, "{nopub}:queue", 1) | wait_channels(g_r, 1) |
              command_ok(g_r, "ACL SETUSER default -publish");
    /* The release's script cannot tell the waiter; it must still run
     * (else the permit stays held for its 600 s lease), and the waiter's
     * heartbeat poll finds the grant. */
    g_rc[4] = ferry_redis_permit_release(p);
    g_rc[5] = tu_join(t);
    g_rc[6] = ferry_redis_sem_free(g_s) | ferry_redis_sem_free(sb);
    ferry_redis_close(g_r);
    ferry_redis_close(rb);
    return 0;
}

TW(a_refused_publish_leaves_the_waiter_to_its_polls)
{
    cr_assert_eq(tu_run(publish_refused_main, NULL), 0);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(g_rc[i], 0, "step %d: %d", i, g_rc[i]);
    cr_assert_gt(g_val[1], 0);
}

static char g_str[32];

/* A poll that finds a lease run out hands the permit to the waiter before
 * it, whose wake the server refuses: the poll must still answer. */
static int refused_in_acquire_main(void *arg)
{
    static const char *const setup[] = {
        "ACL SETUSER default -publish",
        "ZADD {nopub2}:holders 1 gone",                  /* a lease long run out */
        "ZADD {nopub2}:queue 1 wother:1",                /* a live waiter, first */
        "ZADD {nopub2}:alive 99999999999999 wother:1",
        "SET {nopub2}:ticket 1",
    };
    ferry_redis_permit *p = NULL;
    ferry_scope sc;

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    g_rc[1] = ferry_redis_lock_new(&g_s, g_r, "nopub2", &fast);
    if (g_rc[0] | g_rc[1])
        return 0;
    for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++)
        g_rc[2] |= command_ok(g_r, setup[i]);
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(300), 0);
    g_rc[3] = ferry_redis_sem_acquire(g_s, &p);
    ferry_scope_exit(&sc);
    tu_redis_query(&g_srv, g_str, sizeof(g_str), "HGET {nopub2}:fences wother:1");
    g_rc[4] = ferry_redis_sem_free(g_s);
    ferry_redis_close(g_r);
    return 0;
}

T(a_refused_publish_does_not_fail_the_poll_that_grants)
{
    cr_assert_eq(tu_run(refused_in_acquire_main, NULL), 0);
    cr_assert_eq(g_rc[0] | g_rc[1] | g_rc[2], 0);
    cr_assert_eq(g_rc[3], -ETIMEDOUT, "the acquire behind the granted waiter: %d", g_rc[3]);
    cr_assert_eq(g_rc[4], 0);
    cr_assert_str_eq(g_str, "1", "the waiter before it was granted the first fence: \"%s\"", g_str);
}
