/* demo.c - ferry-demo: a tour of the scenarios of examples/, each run for
 * real, with what it measured.  Every example is also a program of its own
 * (build/examples/<name>), and its source starts with the asyncio code it
 * translates.
 */
#include <stdio.h>

#include "examples.h"

struct stop {
    const char *name;         /* the example's file, without .c */
    const char *title;        /* what it shows */
    int (*run)(void);
};

static const struct stop tour[] = {
    { "hello",         "tasks sleep concurrently on one thread",                 ex_hello },
    { "race_lock",     "check, suspend, act: a race in one thread, and the lock", ex_race_lock },
    { "rate_cache",    "cache stampede: double-checked lock, a lock per key",    ex_rate_cache },
    { "singleflight",  "one fetch per key for 10,000 concurrent requests",       ex_singleflight },
    { "upload_limit",  "a semaphore limits blocking uploads on a thread pool",   ex_upload_limit },
    { "poll_stop",     "a poll loop stopped by an event, with a timed pause",    ex_poll_stop },
    { "pipeline",      "producer/consumers over a bounded queue, join, shutdown", ex_pipeline },
    { "actor",         "one task owns the state, others send it commands",       ex_actor },
    { "condition",     "a condition with a predicate: waiting for a batch",      ex_condition },
    { "cancel",        "cancellation, shields, nested deadlines, task groups",   ex_cancel },
    { "blocking_call", "a blocking C call on the pool keeps the loop alive",     ex_blocking_call },
    { "from_thread",   "threads calling into the loop: posts, tasks, futures",   ex_from_thread },
    { "mixed_channel", "threads and tasks on one bounded channel",               ex_mixed_channel },
};

int main(void)
{
    int n = (int)(sizeof tour / sizeof tour[0]), failed = 0;
    int64_t t_all = ferry_now();

    printf("ferry-demo: %d scenarios from examples/, each measured as it runs\n", n);
    for (int i = 0; i < n; i++) {
        printf("\n[%2d/%d] %s - %s\n", i + 1, n, tour[i].name, tour[i].title);
        fflush(stdout);
        int64_t t0 = ferry_now();
        int rc = tour[i].run();
        fflush(stdout);
        printf("  -> %s in %.0f ms\n", rc == 0 ? "ok" : "FAILED", ms_since(t0));
        failed += rc != 0;
    }
    printf("\n%d of %d scenarios behaved as described, %d failed, %.1f s in total\n",
           n - failed, n, failed, ms_since(t_all) / 1000);
    printf("Source of each: examples/<name>.c; the HTTP service: examples/http_service.c\n");
    return failed ? 1 : 0;
}
