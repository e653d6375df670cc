/* loop_new.c - making a loop and freeing it (loop_new.h: wire/ calls
 * these for ferry_loop_new() and ferry_loop_free()).
 * Loop thread only.
 */
#include "loop_only.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "loop_int.h"
#include "loop_new.h"

int ferry__loop_opts_check(const ferry_loop_opts *opts)
{
    size_t ssz = opts && opts->stack_size ? opts->stack_size : FERRY_STACK_DEFAULT;

    if (ssz < FERRY_STACK_MIN || ssz > ((size_t)1 << 30))
        return -EINVAL;
    if (opts && opts->virtual_clock && opts->base)
        return -EINVAL; /* only ferry_loop_run() makes the jumps */
    if (opts && !(opts->fuzz_prob <= 1))
        return -EINVAL;
    if (ferry__tls_loop && ferry__tls_loop->current)
        return -EPERM; /* not from inside a task */
    return 0;
}

/*
 * Schedule fuzzing from FERRY_FUZZ, else from the options: the loop's
 * generator is seeded from the fuzzing seed (so that select's choices
 * replay too), the threads' delays start, and the seed is logged with what
 * replays it.
 */
/* What the seed replays, for the log line: docs/fuzzing.md, "What
 * replays", says it at length. */
#define REPLAYS \
    "the loop's choices and when the pool jobs its tasks wait for " \
    "come back; not when other threads post"

static void fuzz_init(ferry_loop *loop, const ferry_loop_opts *o)
{
    struct ferry__fuzz f;
    char prob[32] = "";
    unsigned nth = 0;

    if (ferry__fuzz_env(&f)) {
        /* One seed for the process: each loop draws from its own mix. */
        loop->rng = ferry__fuzz_loop_seed(f.seed, &nth);
    } else {
        if (!o->fuzz_seed)
            return;
        f.seed = o->fuzz_seed;
        f.prob = o->fuzz_prob == 0 ? FERRY__FUZZ_PROB_DEFAULT : o->fuzz_prob < 0 ? 0 : o->fuzz_prob;
        f.p = ferry__fuzz_prob(f.prob);
        loop->rng = f.seed;
    }
    loop->fuzz = true;
    loop->fuzz_p = f.p;
    loop->deliver_rng = loop->rng ^ 0x5851f42d4c957f2du;
    ferry__fuzz_threads_start(&f);
    if (f.prob != FERRY__FUZZ_PROB_DEFAULT)
        snprintf(prob, sizeof prob, ",%g", f.prob);
    if (nth == 0)
        ferry__log(FERRY_LOG_WARN,
                   "schedule fuzzing on, seed %llu (FERRY_FUZZ=%llu%s replays " REPLAYS ")",
                   (unsigned long long)f.seed, (unsigned long long)f.seed, prob);
    else
        ferry__log(FERRY_LOG_WARN,
                   "schedule fuzzing on, seed %llu, loop %u of the process "
                   "(FERRY_FUZZ=%llu%s replays " REPLAYS ")",
                   (unsigned long long)f.seed, nth + 1, (unsigned long long)f.seed, prob);
}

/* The loop's settings, from the (checked) options and the environment. */
static void settings_init(ferry_loop *loop, const ferry_loop_opts *o)
{
    const char *g = getenv("FERRY_STACK_GUARD");

    loop->stack_size = ferry__stack_map_size(o->stack_size ? o->stack_size : FERRY_STACK_DEFAULT);
    loop->stack_cache = o->stack_cache ? o->stack_cache : 1024;
    loop->io_interval = o->io_interval ? o->io_interval : 128;
    /* FERRY_STACK_GUARD=mprotect|none forces an older kernel's fallbacks
     * (for tests); the default probes MADV_GUARD_INSTALL first. */
    if (g && strcmp(g, "mprotect") == 0)
        loop->guard_mode = FERRY__GUARD_MPROTECT;
    else if (g && strcmp(g, "none") == 0)
        loop->guard_forced_none = true;
#ifndef NDEBUG
    loop->slow_ns = FERRY_MSEC(100);
#endif
    if (o->virtual_clock) {
        /* Starting at the real time keeps deadlines that code computes
         * from either clock in the same range. */
        loop->vclock = true;
        loop->vnow = ferry__now_real();
        ferry__clock_set_source(ferry__vclock_source);
    }
    /* Different loops, and runs, draw different choices; nothing depends
     * on the seed being secret. */
    loop->rng = (uint64_t)ferry_now() ^ (uint64_t)(uintptr_t)loop;
    fuzz_init(loop, o);
    ferry__loop_hand_update(loop);
}

/* The loop's events on its base: kick_ev, which runs turns inside someone
 * else's dispatch, and the timer tick.  Returns: 0; -ENOMEM; -EMFILE,
 * -ENFILE. */
static int events_new(ferry_loop *loop)
{
    int rc = ferry__sched_init(loop);

    if (rc)
        return rc;
    rc = ferry__timers_init(loop);
    if (rc)
        ferry__sched_fini(loop);
    return rc;
}

static void events_free(ferry_loop *loop)
{
    ferry__timers_fini(loop);
    ferry__sched_fini(loop);
}

int ferry__loop_create(ferry_loop **out, const ferry_loop_opts *opts, struct event_base *base,
                       bool own_base)
{
    ferry_loop_opts o = { 0 };
    ferry_loop *loop;
    int rc;

    if (opts)
        o = *opts;
    loop = ferry__calloc(1, sizeof *loop);
    if (!loop)
        return -ENOMEM;
    loop->owner = &ferry__tls_token;
    loop->base = base;
    loop->own_base = own_base;
    ferry__list_init_linked(&loop->runq); /* for ferry__task_ready() */
    ferry__fork_mark_setup(loop);
    settings_init(loop, &o);
    rc = events_new(loop);
    if (rc)
        goto err_free_loop;
    rc = ferry__overflow_init(loop);
    if (rc)
        goto err_free_events;
    *out = loop;
    return 0;

err_free_events:
    events_free(loop);
err_free_loop:
    ferry__fork_mark_teardown(loop);
    ferry__free(loop);
    return rc;
}

void ferry__loop_discard(ferry_loop *loop)
{
    ferry__overflow_teardown(loop);
    events_free(loop);
    ferry__fork_mark_teardown(loop);
    ferry__free(loop);
}

void ferry__loop_start(ferry_loop *loop, const struct ferry__loop_hooks *hooks)
{
    loop->hooks = *hooks;
    ferry__overflow_setup(loop);
    ferry__loops_add(&loop->live_entry, loop);
    if (!ferry__tls_loop)
        ferry__tls_loop = loop;
}

/* The bridge closes: every accepted post runs, later ones are refused.
 * Its hooks are not called again; the context stays (loop_port.h). */
static void hooks_close(ferry_loop *loop)
{
    void (*close_fn)(void *ctx) = loop->hooks.close;

    loop->hooks.pending = NULL;
    loop->hooks.flush = NULL;
    loop->hooks.close = NULL;
    loop->hooks.fuzz_deliver = NULL;
    if (close_fn)
        close_fn(loop->hooks.ctx);
}

void ferry__loop_free(ferry_loop *loop)
{
    ferry_task *prev_task;
    ferry_loop *prev;

    if (!loop || ferry__loop_check(loop) || loop->in_run || loop->in_turn)
        return;
    prev = ferry__tls_loop;
    prev_task = ferry__tls_task;
    ferry__tls_loop = loop;
    ferry__tls_task = NULL;
    loop->closing = true;
    loop->in_run = true;
    ferry__sched_end_tasks(loop);
    hooks_close(loop);
    /* What the accepted posts made ready. */
    ferry__sched_run_ready(loop);
    /* The I/O parts (streams and listeners left open, signal
     * subscriptions, the resolver) end here, before the event_base their
     * descriptors are on. */
    ferry__loop_parts_free(loop);
    loop->in_run = false;
    ferry__stack_drain(loop);
    ferry__overflow_teardown(loop);
    events_free(loop);
    if (loop->own_base)
        event_base_free(loop->base);
    ferry__tls_loop = (prev == loop) ? NULL : prev;
    ferry__tls_task = prev_task;
    ferry__fork_mark_teardown(loop);
    ferry__loops_remove(&loop->live_entry);
    ferry__free(loop->fuzz_buf);
    ferry__free(loop);
}

#if defined(FERRY_GDB_SCRIPT)
/*
 * The gdb extension (tools/gdb/ferry_gdb.py), whole, in a
 * .debug_gdb_scripts entry: gdb runs it when it loads a program linked
 * with the static library, if its auto-load safe-path allows the
 * program's path (docs/debugging.md).  In this file because every program
 * that makes a loop links it.  The section is not loaded at run time and
 * strip removes it; the shared library has it removed at build time and
 * gets the extension from gdb's auto-load directory instead.  Entry kind 4
 * is an inline Python script: its first line names it, and entries of the
 * same name are loaded once.
 */
__asm__(".pushsection .debug_gdb_scripts, \"MS\", %progbits, 1\n"
        ".byte 4\n"
        ".ascii \"ferry_gdb.py\\n\"\n"
        ".incbin \"" FERRY_GDB_SCRIPT "\"\n"
        ".byte 0\n"
        ".popsection\n");
#endif
