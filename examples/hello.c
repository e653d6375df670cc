/* hello.c - the smallest ferry program: three tasks sleep at the same time.
 *
 * ferry_run() is asyncio.run(): it makes a loop, runs the main task until it
 * ends, and cleans up.  Each ferry_sleep() suspends its task, not the
 * thread, so the three sleeps overlap and the whole takes about as long as
 * the longest one.
 */
#include <stdio.h>

#include "ferry/ferry.h"

int ex_hello(void);

struct nap {
    const char *name;
    int         ms;
};

static int sleeper(void *arg)
{
    struct nap *nap = arg;
    int64_t t0 = ferry_now();
    int rc = ferry_sleep(FERRY_MSEC(nap->ms));         /* a suspension point */

    printf("  %-6s slept %3d ms, woke after %5.1f ms\n", nap->name, nap->ms,
           (double)(ferry_now() - t0) / 1e6);
    return rc;
}

static int main_task(void *arg)
{
    struct nap naps[] = { { "slow", 300 }, { "fast", 100 }, { "medium", 200 } };
    ferry_task *tasks[3];
    int64_t t0 = ferry_now();
    int rc, status, failed = 0;

    for (int i = 0; i < 3; i++) {
        rc = ferry_task_spawn(&tasks[i], NULL, sleeper, &naps[i], NULL);
        if (rc)
            return rc;
    }
    for (int i = 0; i < 3; i++) {
        rc = ferry_task_join(tasks[i], &status);   /* waits; returns the task's status */
        if (rc || status)
            failed++;
    }
    double total = (double)(ferry_now() - t0) / 1e6;
    printf("  3 tasks, 600 ms of sleep in total, took %.0f ms: %s\n", total,
           total < 450 ? "they slept concurrently" : "NOT concurrent");
    return failed || total >= 450;
}

int ex_hello(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_hello();
}
#endif
