/* loop.c - ferry_loop_new() and ferry_loop_free() as the user sees them,
 * and ferry_run(): the one place that puts a loop (src/) and its bridge
 * (bridge/) together.
 * Loop thread (the thread that makes the loop).
 *
 * Making a loop: check the options (src/), set the process up for threads
 * and make or check the event_base (process.c), make the loop on it
 * (src/), attach the inbox that other threads post through, with room for
 * the pools' per-loop list of jobs and the loop's place in a runtime
 * (bridge/), and start the loop with the
 * hooks by which it reaches them.  Freeing goes the other way: the loop
 * ends its tasks, closes the inbox through its hook, then frees itself and
 * its base.
 */
#include <errno.h>
#include <stddef.h>

#include <event2/event.h>

#include "runtime_int.h"
#include "sig_int.h"
#include "env.h"
#include "loop_new.h"
#include "loops.h"
#include "wire.h"

/* The base the loop runs on: the application's, checked, or a new one the
 * loop will own.  Returns: 0; -EINVAL; -ENOMEM. */
static int base_get(const ferry_loop_opts *opts, struct event_base **base, bool *own)
{
    *own = !(opts && opts->base);
    if (!*own) {
        *base = opts->base;
        return ferry__base_check(*base);
    }
    return ferry__base_new(base);
}

int ferry_loop_new(ferry_loop **out, const ferry_loop_opts *opts)
{
    struct ferry__loop_hooks hooks;
    struct event_base *base;
    struct ferry_inbox *ib;
    ferry_loop *loop;
    bool own;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = ferry__loop_opts_check(opts);
    if (rc)
        return rc;
    ferry__process_init();
    /* Before anything is made: other threads wake the loop through the
     * base, which needs its lock for that. */
    rc = base_get(opts, &base, &own);
    if (rc)
        return rc;
    rc = ferry__loop_create(&loop, opts, base, own);
    if (rc)
        goto err_free_base;
    rc = ferry__inbox_new(&ib, loop, base, own, ferry__inbox_room());
    if (rc)
        goto err_discard_loop;
    hooks.ctx = ib;
    hooks.pending = ferry__inbox_pending;
    hooks.flush = ferry__pool_handover;
    hooks.close = ferry__inbox_close;
    hooks.getaddrinfo = ferry__gai_on_pool;
    hooks.chan = &ferry__chan_sel_ext;
    hooks.future = &ferry__future_sel_ext;
    hooks.fuzz_deliver = ferry__inbox_fuzz_deliver;
    ferry__loop_start(loop, &hooks);
    ferry__signal_loop_start(loop);
    *out = loop;
    return 0;

err_discard_loop:
    ferry__loop_discard(loop);
err_free_base:
    if (own)
        event_base_free(base);
    return rc;
}

void ferry_loop_free(ferry_loop *loop)
{
    ferry__loop_free(loop);
}

/* The main task of ferry_run(): fn, then stop the loop, so that
 * ferry_run() sees at once that main is done even if other tasks run on. */
struct run_main {
    ferry_task_fn fn; /* the user's main */
    void *arg;        /* its argument */
    ferry_loop *loop; /* the loop to stop */
};

static int run_main(void *arg)
{
    struct run_main *m = arg;
    int status = m->fn(m->arg);

    ferry_loop_stop(m->loop);
    return status;
}

/*
 * asyncio.run(): once the main task is done, the tasks still alive are
 * named in the log, then cancelled and waited for (ferry_loop_free() does
 * both), and the default pool is shut down when no loop is left in the
 * process (another thread's loop may still be using it).
 */
int ferry_run(ferry_task_fn fn, void *arg)
{
    struct run_main m = { .fn = fn, .arg = arg };
    ferry_loop_opts opts = { .virtual_clock = ferry__env_unsigned("FERRY_VIRTUAL_CLOCK", 0) != 0 };
    ferry_loop *loop;
    ferry_task *t;
    int rc, status = 0;

    if (!fn)
        return -EINVAL;
    rc = ferry_loop_new(&loop, &opts);
    if (rc)
        return rc;
    m.loop = loop;
    rc = ferry_task_spawn(&t, loop, run_main, &m, &(ferry_task_opts){ .name = "main" });
    if (rc) {
        ferry_loop_free(loop);
        return rc;
    }
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    ferry__loop_log_alive(loop, "ferry_run: the main task returned");
    ferry_loop_free(loop);
    if (ferry__loops_none())
        ferry_pool_default_shutdown(FERRY_POOL_FREE_LEAVE_ABANDONED);
    return status;
}
