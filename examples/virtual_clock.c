/* virtual_clock.c - testing timeouts without waiting for them.
 *
 * The asyncio way is a test loop whose clock the test drives (Trio's
 * MockClock(autojump_threshold=0), Tokio's time::pause()):
 *
 *     async def fetch_with_retry():
 *         for attempt in range(1, 7):
 *             if await try_fetch():
 *                 return attempt
 *             await asyncio.sleep(2 ** (attempt - 1))
 *
 *     async def request_that_hangs(sock):
 *         async with asyncio.timeout(3600):
 *             await loop.sock_recv(sock, 1)
 *
 * A loop made with ferry_loop_opts.virtual_clock keeps its own time: when
 * every task waits for a deadline and nothing is on its way from another
 * thread, the time jumps to the next deadline.  The retries below back off
 * for 31 s in all and the hanging request gives up after an hour, and the
 * whole takes a few milliseconds, with the same timestamps every run.
 */
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "examples.h"

static int64_t t_start;

static double at(void)
{
    return (double)(ferry_now() - t_start) / 1e9;
}

/* The service fails the first five calls. */
static int try_fetch(int attempt)
{
    return attempt >= 6 ? 0 : -ECONNREFUSED;
}

static int fetch_with_retry(void)
{
    int64_t backoff = FERRY_SEC(1);

    for (int attempt = 1; attempt <= 6; attempt++) {
        int rc = try_fetch(attempt);

        if (rc == 0) {
            printf("  +%8.3f s  attempt %d: ok\n", at(), attempt);
            return attempt;
        }
        printf("  +%8.3f s  attempt %d: %s, retry in %lld s\n", at(), attempt,
               rc == -ECONNREFUSED ? "-ECONNREFUSED" : errname(rc),
               (long long)(backoff / FERRY_SEC(1)));
        rc = ferry_sleep(backoff);
        if (rc)
            return rc;
        backoff *= 2;
    }
    return -ETIMEDOUT;
}

/* A read from a peer that never writes, under a one-hour deadline. */
static int request_that_hangs(int fd)
{
    ferry_scope scope;
    int rc;

    ferry_scope_enter(&scope, ferry_now() + FERRY_SEC(3600), 0);
    rc = ferry_wait_fd(fd, FERRY_READ, NULL);
    ferry_scope_exit(&scope);
    return rc;
}

static int main_task(void *arg)
{
    int *sv = arg;
    double t0;
    int rc;

    t_start = ferry_now();
    printf("retry with exponential backoff:\n");
    rc = fetch_with_retry();
    if (rc != 6)
        return 1;
    printf("a request whose peer never answers, with a one-hour deadline:\n");
    t0 = at();
    rc = request_that_hangs(sv[0]);
    printf("  +%8.3f s  -> +%.3f s: %s\n", t0, at(), errname(rc));
    return rc == -ETIMEDOUT && at() == t0 + 3600.0 ? 0 : 1;
}

int main(void)
{
    ferry_loop *loop;
    ferry_task *t;
    int sv[2], status = 1, rc;
    struct timespec r0, r1;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &r0);
    rc = ferry_loop_new(&loop, &(ferry_loop_opts){ .virtual_clock = true });
    if (rc)
        return 1;
    rc = ferry_task_spawn(&t, loop, main_task, sv, &(ferry_task_opts){ .name = "main" });
    if (rc == 0) {
        while (ferry_task_try_join(t, &status) == -EAGAIN)
            ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    }
    /* ferry_now() is still the loop's time here: the loop is the current
     * one on this thread until it is freed.  Real time is read directly. */
    clock_gettime(CLOCK_MONOTONIC, &r1);
    printf("%.0f s of virtual time in %.0f ms of real time\n", at(),
           (double)(r1.tv_sec - r0.tv_sec) * 1e3 + (double)(r1.tv_nsec - r0.tv_nsec) / 1e6);
    ferry_loop_free(loop);
    close(sv[0]);
    close(sv[1]);
    return rc || status ? 1 : 0;
}
