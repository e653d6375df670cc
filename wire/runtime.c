/* runtime.c - a runtime of N loops (ferry/runtime.h): making the loops and
 * their threads, running main on loop 0, stopping, ending every loop
 * together; ferry_run_loops(); running a function on every loop; the
 * statistics and dumps of every loop.
 * Thread: loop 0's (the thread that made the runtime) for the lifecycle;
 * each loop's own thread for what runs on it.
 *
 * The loops are made one after the other, loop 0 on the caller's thread,
 * loop i on a thread of its own that makes it, reports, and then runs it
 * until the runtime ends: in order, so that a fuzzing seed from the
 * environment gives each loop the same seed from run to run
 * (base/fuzz.c numbers loops in the order they are made).  The end is
 * ferry_loop_free() on every loop at once: loop 0's on the caller's
 * thread, the others' on their threads once their run returns.  At once,
 * because a task cancelled on one loop may wait for a call to another,
 * whose task must end first.
 *
 * Lock order: ferry_runtime.mu is a leaf.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "env.h"
#include "loop_new.h"
#include "loops.h"
#include "runtime_int.h"

/* ---- CPUs ----------------------------------------------------------------- */

/* The i-th CPU (counted modulo their number) of `set`. */
static int cpu_nth(const cpu_set_t *set, unsigned i)
{
    int count = CPU_COUNT(set), cpu;

    i %= (unsigned)count;
    for (cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, set) && i-- == 0)
            return cpu;
    return 0;
}

/* Pin the calling thread to the index-th CPU of the runtime's mask.
 * Returns 0 or -EINVAL (refused). */
static int pin_self(struct ferry_runtime *rt, unsigned index)
{
    cpu_set_t one;

    CPU_ZERO(&one);
    CPU_SET(cpu_nth(&rt->cpus, index), &one);
    return pthread_setaffinity_np(pthread_self(), sizeof one, &one) ? -EINVAL : 0;
}

/* ---- making and ending the loops -------------------------------------------- */

/* Loop i's options: the runtime's, with a fuzzing seed of its own. */
static void loop_opts(const struct ferry_runtime *rt, unsigned index, ferry_loop_opts *o)
{
    *o = rt->opts.loop;
    if (o->fuzz_seed && index) {
        o->fuzz_seed ^= (uint64_t)index * 0x9e3779b97f4a7c15ULL;
        if (!o->fuzz_seed)
            o->fuzz_seed = index;
    }
}

/* Make loop `index` on the calling thread and give it its place in the
 * runtime.  Returns 0; as ferry_loop_new(). */
static int loop_make(struct ferry_runtime *rt, unsigned index)
{
    struct ferry__rt_slot *s = rt->slots[index];
    struct ferry__loop_rt *place;
    ferry_loop_opts o;
    ferry_loop *loop;
    int rc;

    loop_opts(rt, index, &o);
    rc = ferry_loop_new(&loop, &o);
    if (rc)
        return rc;
    rc = ferry_inbox_get(&s->ib, loop); /* a new loop's inbox is open */
    if (rc) {
        ferry_loop_free(loop);
        return rc;
    }
    place = ferry__loop_rt(loop);
    place->rt = rt;
    place->index = index;
    s->loop = loop;
    return 0;
}

/* The stop node of a slot: make the loop's run return (on its thread). */
static void slot_stop(struct ferry__cnode *n)
{
    struct ferry__rt_slot *s = ferry__container_of(n, struct ferry__rt_slot, stop_node);

    ferry_loop_stop(s->loop);
}

/* Tell the maker that loop `index`'s thread is ready (rc 0) or failed. */
static void thread_report(struct ferry_runtime *rt, int rc)
{
    pthread_mutex_lock(&rt->mu);
    rt->ready++;
    if (rc && !rt->failed)
        rt->failed = rc;
    pthread_cond_signal(&rt->cv);
    pthread_mutex_unlock(&rt->mu);
}

static void *loop_thread(void *arg)
{
    struct ferry__rt_thread *t = arg;
    struct ferry_runtime *rt = t->rt;
    ferry_loop *loop;
    char name[16];
    int rc = 0;

    snprintf(name, sizeof name, "ferry-loop-%u", t->index);
    pthread_setname_np(pthread_self(), name);
    if (rt->opts.pin)
        rc = pin_self(rt, t->index);
    if (!rc)
        rc = loop_make(rt, t->index);
    thread_report(rt, rc);
    if (rc)
        return NULL;
    loop = rt->slots[t->index]->loop;
    /* Until ferry_runtime_free(): a task may stop the loop's run too. */
    while (!atomic_load(&rt->ending))
        ferry_loop_run(loop, FERRY_RUN_FOREVER);
    if (rt->log_alive)
        ferry__loop_log_alive(loop, "ferry_run_loops: the main task returned");
    ferry_loop_free(loop);
    return NULL;
}

/* Start loop `index`'s thread and wait until it has made its loop.
 * Returns 0; -ENOMEM (no thread); the thread's error. */
static int thread_start(struct ferry_runtime *rt, unsigned index)
{
    struct ferry__rt_thread *t = &rt->threads[index];
    int rc;

    t->rt = rt;
    t->index = index;
    if (pthread_create(&t->th, NULL, loop_thread, t))
        return -ENOMEM;
    rt->started++;
    pthread_mutex_lock(&rt->mu);
    while (rt->ready < rt->started)
        pthread_cond_wait(&rt->cv, &rt->mu);
    rc = rt->failed;
    pthread_mutex_unlock(&rt->mu);
    return rc;
}

/*
 * End every loop made so far, all at once: each cancels its tasks, waits
 * for them and is freed (loop 0 here, the others on their threads); then
 * join the threads.  The threads' inboxes stay referenced by the slots, so
 * a post to a loop that has closed is refused, never a use of freed memory.
 */
static void rt_end(struct ferry_runtime *rt)
{
    ferry_loop *loop0 = rt->slots[0]->loop;
    unsigned i;

    atomic_store(&rt->ending, true);
    for (i = 1; i <= rt->started; i++) {
        struct ferry__rt_slot *s = rt->slots[i];

        if (s->ib) {
            s->stop_node.fn = slot_stop;
            ferry__inbox_post_node(s->ib, &s->stop_node); /* refused: closed already */
        }
    }
    if (loop0) {
        if (rt->log_alive)
            ferry__loop_log_alive(loop0, "ferry_run_loops: the main task returned");
        ferry_loop_free(loop0);
    }
    for (i = 1; i <= rt->started; i++)
        pthread_join(rt->threads[i].th, NULL);
}

/* Free the memory of a runtime whose loops have all ended (or were never
 * made), and give loop 0's thread its mask back. */
static void rt_destroy(struct ferry_runtime *rt)
{
    unsigned i;

    for (i = 0; i < rt->n && rt->slots; i++) {
        if (!rt->slots[i])
            continue;
        ferry_inbox_unref(rt->slots[i]->ib);
        ferry__free(rt->slots[i]->lanes);
        ferry__free(rt->slots[i]);
    }
    if (rt->pinned)
        pthread_setaffinity_np(pthread_self(), sizeof rt->saved, &rt->saved);
    pthread_cond_destroy(&rt->cv);
    pthread_mutex_destroy(&rt->mu);
    ferry__free(rt->threads);
    ferry__free(rt->slots);
    ferry__free(rt);
}

/* The number of loops: the options', FERRY_LOOPS (1 to 4096; another
 * value is ignored), or the CPUs of `cpus`. */
static unsigned loops_wanted(const ferry_runtime_opts *o, const cpu_set_t *cpus)
{
    if (o->loops)
        return o->loops;
    return ferry__env_unsigned("FERRY_LOOPS", (unsigned)CPU_COUNT(cpus));
}

/* The runtime's memory, all-zero but for what is set once: no loop, no
 * thread.  Returns 0; -ENOMEM (nothing left). */
static int rt_alloc(struct ferry_runtime **out, unsigned n)
{
    struct ferry_runtime *rt = ferry__calloc(1, sizeof *rt);
    unsigned i;

    if (!rt)
        return -ENOMEM;
    rt->n = n;
    rt->slots = ferry__calloc(n, sizeof *rt->slots);
    rt->threads = ferry__calloc(n, sizeof *rt->threads);
    if (!rt->slots || !rt->threads)
        goto err;
    for (i = 0; i < n; i++) {
        rt->slots[i] = ferry__calloc(1, sizeof *rt->slots[i]);
        if (!rt->slots[i])
            goto err;
        rt->slots[i]->lanes = ferry__calloc(n, sizeof *rt->slots[i]->lanes);
        if (!rt->slots[i]->lanes)
            goto err;
        atomic_init(&rt->slots[i]->load, 0);
    }
    if (pthread_mutex_init(&rt->mu, NULL))
        goto err;
    if (ferry__cond_init(&rt->cv)) {
        pthread_mutex_destroy(&rt->mu);
        goto err;
    }
    atomic_init(&rt->ending, false);
    atomic_init(&rt->stopped, false);
    *out = rt;
    return 0;

err:
    for (i = 0; i < n && rt->slots; i++) {
        if (rt->slots[i])
            ferry__free(rt->slots[i]->lanes);
        ferry__free(rt->slots[i]);
    }
    ferry__free(rt->threads);
    ferry__free(rt->slots);
    ferry__free(rt);
    return -ENOMEM;
}

int ferry_runtime_new(ferry_runtime **out, const ferry_runtime_opts *opts)
{
    ferry_runtime_opts o = { 0 };
    struct ferry_runtime *rt;
    cpu_set_t cpus;
    unsigned n, i;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (opts)
        o = *opts;
    if (o.loop.base)
        return -EINVAL;
    if (ferry_task_current())
        return -EPERM;
    CPU_ZERO(&cpus);
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) == 0)
        CPU_SET(0, &cpus);
    n = loops_wanted(&o, &cpus);
    if (n == 0 || n > FERRY_RUNTIME_MAX_LOOPS)
        return -EINVAL;
    rc = rt_alloc(&rt, n);
    if (rc)
        return rc;
    o.loops = n;
    rt->opts = o;
    rt->cap = o.call_cap ? o.call_cap : 128;
    rt->cpus = cpus;
    if (o.pin) {
        if (pthread_getaffinity_np(pthread_self(), sizeof rt->saved, &rt->saved) != 0) {
            rc = -EINVAL;
            goto err;
        }
        rc = pin_self(rt, 0);
        if (rc)
            goto err;
        rt->pinned = true;
    }
    rc = loop_make(rt, 0);
    if (rc)
        goto err;
    for (i = 1; i < n; i++) {
        rc = thread_start(rt, i);
        if (rc)
            goto err_end;
    }
    *out = rt;
    return 0;

err_end:
    rt_end(rt);
err:
    rt_destroy(rt);
    return rc;
}

/* ---- running main on loop 0 ------------------------------------------------ */

/* The main task of ferry_runtime_run(): main, then stop loop 0's run, so
 * that the run returns at once even while other tasks of loop 0 go on. */
struct run_main {
    ferry_task_fn fn; /* the user's main */
    void *arg;        /* its argument */
    ferry_loop *loop; /* loop 0 */
};

static int run_main(void *arg)
{
    struct run_main *m = arg;
    int status = m->fn(m->arg);

    ferry_loop_stop(m->loop);
    return status;
}

/* True on loop 0's thread, outside a task and outside ferry_runtime_run(). */
static bool on_loop0_outside(const struct ferry_runtime *rt)
{
    return ferry_loop_is_current(rt->slots[0]->loop) && !ferry_task_current() && !rt->in_run;
}

int ferry_runtime_run(ferry_runtime *rt, ferry_task_fn main, void *arg, int *status)
{
    struct run_main m = { .fn = main, .arg = arg };
    ferry_task *t;
    int rc, st = 0;

    if (!rt || !main)
        return -EINVAL;
    if (!on_loop0_outside(rt))
        return -EPERM;
    m.loop = rt->slots[0]->loop;
    /* Inside a callback of loop 0 the loop cannot be run: say so before
     * anything is started. */
    rc = ferry_loop_run(m.loop, FERRY_RUN_ONCE);
    if (rc)
        return rc;
    if (atomic_load(&rt->stopped))
        return -ESHUTDOWN;
    rc = ferry_task_spawn(&t, m.loop, run_main, &m, &(ferry_task_opts){ .name = "main" });
    if (rc)
        return rc;
    rt->main = t;
    rt->in_run = true;
    /* A stop whose request ran before main existed. */
    if (atomic_load(&rt->stopped))
        ferry_task_cancel(t);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(m.loop, FERRY_RUN_DEFAULT);
    rt->main = NULL;
    rt->in_run = false;
    if (status)
        *status = st;
    return 0;
}

/* The stop request, on loop 0's thread. */
static void stop_main(struct ferry__cnode *n)
{
    struct ferry_runtime *rt = ferry__container_of(n, struct ferry_runtime, stop_node);

    if (rt->main)
        ferry_task_cancel(rt->main);
}

int ferry_runtime_stop(ferry_runtime *rt)
{
    if (!rt)
        return -EINVAL;
    if (atomic_exchange(&rt->stopped, true))
        return 0;
    rt->stop_node.fn = stop_main;
    /* Refused once loop 0 has closed: nothing runs there to stop. */
    ferry__inbox_post_node(rt->slots[0]->ib, &rt->stop_node);
    return 0;
}

void ferry_runtime_free(ferry_runtime *rt)
{
    if (!rt)
        return;
    if (!on_loop0_outside(rt)) {
        ferry__log(FERRY_LOG_ERROR, "ferry_runtime_free: not on the thread of loop 0, or "
                                    "inside a task or a run: nothing freed");
        return;
    }
    rt_end(rt);
    rt_destroy(rt);
}

int ferry_run_loops(unsigned loops, ferry_task_fn main, void *arg)
{
    ferry_runtime_opts o = {
        .loops = loops,
        .loop.virtual_clock = ferry__env_unsigned("FERRY_VIRTUAL_CLOCK", 0) != 0,
    };
    ferry_runtime *rt;
    int rc, status = 0;

    if (!main)
        return -EINVAL;
    rc = ferry_runtime_new(&rt, &o);
    if (rc)
        return rc;
    rc = ferry_runtime_run(rt, main, arg, &status);
    rt->log_alive = true;
    ferry_runtime_free(rt);
    if (ferry__loops_none())
        ferry_pool_default_shutdown(FERRY_POOL_FREE_LEAVE_ABANDONED);
    return rc ? rc : status;
}

/* ---- fn on every loop --------------------------------------------------------- */

struct on_all {
    struct ferry_runtime *rt;
    ferry_task_fn fn;
    void *arg;
    int *st; /* one status per loop */
};

/* One child of the group, on the caller's loop: the call to one loop. */
struct on_all_child {
    struct on_all *all;
    unsigned index;
};

static int on_all_run(void *arg, void **result)
{
    struct on_all *a = arg;

    (void)result;
    return a->fn(a->arg);
}

static int on_all_child(void *arg)
{
    struct on_all_child *ch = arg;
    int st, rc;

    rc = ferry_runtime_call(ch->all->rt, ch->index, on_all_run, ch->all, 0, &st, NULL);
    if (rc)
        return rc; /* fails the group: the others are cancelled */
    ch->all->st[ch->index] = st;
    return 0;
}

int ferry_runtime_on_all(ferry_runtime *rt, ferry_task_fn fn, void *arg, int *statuses)
{
    static const ferry_task_opts child_opts = { .name = "on_all" };
    struct on_all_child *ch;
    struct on_all a;
    ferry_group g;
    unsigned i;
    int rc, grc;

    rt = ferry__rt_resolve(rt);
    if (!ferry_task_current() || !rt || ferry_runtime_index(rt, NULL) < 0)
        return -EPERM;
    if (!fn)
        return -EINVAL;
    ch = ferry__malloc(rt->n * (sizeof *ch + sizeof *a.st));
    if (!ch)
        return -ENOMEM;
    a.rt = rt;
    a.fn = fn;
    a.arg = arg;
    a.st = (int *)(void *)(ch + rt->n);
    rc = ferry_group_init(&g);
    for (i = 0; !rc && i < rt->n; i++) {
        ch[i].all = &a;
        ch[i].index = i;
        rc = ferry_group_spawn(&g, on_all_child, &ch[i], &child_opts);
        if (rc)
            ferry_group_cancel(&g);
    }
    grc = ferry_group_wait(&g);
    if (!rc)
        rc = grc;
    if (!rc && statuses)
        memcpy(statuses, a.st, rt->n * sizeof *a.st);
    ferry__free(ch);
    return rc;
}

/* ---- statistics and dumps ----------------------------------------------------- */

/*
 * Run fn(arg) as a plain callback on loop `index`: through a call from a
 * task, else (loop 0's thread outside a task) at once on loop 0 and with
 * ferry_loop_run_sync() on the others.  Returns fn's status, or the
 * call's error.  fn is told its loop (struct loop_req), not left to find
 * it: loop 0's thread may have other loops, and any of them may be its
 * current one.
 */
struct on_loop {
    ferry_call_fn fn;
    void *arg;
};

/* What the callbacks below get: the loop they run on, and theirs. */
struct loop_req {
    struct ferry_runtime *rt;
    unsigned index;
    void *out;
};

static int on_loop_sync(void *arg)
{
    struct on_loop *l = arg;
    void *res = NULL;

    return l->fn(l->arg, &res);
}

static int on_loop(struct ferry_runtime *rt, unsigned index, bool in_task, ferry_call_fn fn,
                   void *out)
{
    struct loop_req req = { .rt = rt, .index = index, .out = out };
    struct on_loop l = { .fn = fn, .arg = &req };
    void *res = NULL;
    int rc, st = 0;

    if (in_task)
        rc = ferry_runtime_call(rt, index, fn, &req, FERRY_CALL_CALLBACK, &st, NULL);
    else if (index == 0)
        return fn(&req, &res);
    else
        rc = ferry_loop_run_sync(rt->slots[index]->loop, on_loop_sync, &l, FERRY_NEVER, &st);
    return rc ? rc : st;
}

/* Who may read every loop: a task of the runtime, or loop 0's thread
 * outside a task and a run.  Returns 0 and *rtp, *in_task; -EPERM. */
static int reader_check(struct ferry_runtime **rtp, bool *in_task)
{
    struct ferry_runtime *rt = ferry__rt_resolve(*rtp);

    if (!rt)
        return -EPERM;
    *rtp = rt;
    *in_task = ferry_task_current() != NULL;
    if (*in_task)
        return ferry_runtime_index(rt, NULL) < 0 ? -EPERM : 0;
    return on_loop0_outside(rt) ? 0 : -EPERM;
}

/* On the loop whose counters are wanted: copy them into req->out. */
static int stats_copy(void *arg, void **result)
{
    struct loop_req *req = arg;
    ferry_runtime_stats *out = req->out;
    struct ferry__rt_slot *s = req->rt->slots[req->index];

    (void)result;
    ferry_loop_stats_get(s->loop, &out->loop);
    out->calls_out = s->calls_out;
    out->calls_in = s->calls_in;
    out->calls_inline = s->calls_inline;
    out->call_waits = s->call_waits;
    out->load = atomic_load_explicit(&s->load, memory_order_relaxed);
    return 0;
}

static void stats_add(ferry_runtime_stats *sum, const ferry_runtime_stats *one)
{
    sum->loop.turns += one->loop.turns;
    sum->loop.steps += one->loop.steps;
    sum->loop.polls += one->loop.polls;
    sum->loop.slow_steps += one->loop.slow_steps;
    sum->loop.live_tasks += one->loop.live_tasks;
    sum->loop.stacks_cached += one->loop.stacks_cached;
    sum->loop.handoffs += one->loop.handoffs;
    sum->loop.io_submits += one->loop.io_submits;
    sum->loop.io_completions += one->loop.io_completions;
    sum->loop.io_buf_empty += one->loop.io_buf_empty;
    if (!sum->loop.io_backend || (one->loop.io_backend && one->loop.io_fallback)) {
        /* A fallback on any loop shows in the sum. */
        sum->loop.io_backend = one->loop.io_backend;
        sum->loop.io_fallback = one->loop.io_fallback;
        sum->loop.io_fallback_err = one->loop.io_fallback_err;
    }
    sum->calls_out += one->calls_out;
    sum->calls_in += one->calls_in;
    sum->calls_inline += one->calls_inline;
    sum->call_waits += one->call_waits;
    sum->load += one->load;
}

int ferry_runtime_stats_get(ferry_runtime *rt, int index, ferry_runtime_stats *out)
{
    ferry_runtime_stats one;
    bool in_task;
    unsigned i;
    int rc;

    if (!out)
        return -EINVAL;
    rc = reader_check(&rt, &in_task);
    if (rc)
        return rc;
    if (index != FERRY_RUNTIME_ALL && (index < 0 || (unsigned)index >= rt->n))
        return -EINVAL;
    if (index != FERRY_RUNTIME_ALL)
        return on_loop(rt, (unsigned)index, in_task, stats_copy, out);
    memset(out, 0, sizeof *out);
    for (i = 0; i < rt->n; i++) {
        rc = on_loop(rt, i, in_task, stats_copy, &one);
        if (rc)
            return rc;
        stats_add(out, &one);
    }
    return 0;
}

static int dump_one(void *arg, void **result)
{
    struct loop_req *req = arg;

    (void)result;
    fprintf(req->out, "ferry: loop %u of %u\n", req->index, req->rt->n);
    return ferry_loop_dump(req->rt->slots[req->index]->loop, req->out);
}

int ferry_runtime_dump(ferry_runtime *rt, int index, FILE *out)
{
    bool in_task;
    unsigned i, first, last;
    int rc, total = 0;

    if (!out)
        return -EINVAL;
    rc = reader_check(&rt, &in_task);
    if (rc)
        return rc;
    if (index != FERRY_RUNTIME_ALL && (index < 0 || (unsigned)index >= rt->n))
        return -EINVAL;
    first = index == FERRY_RUNTIME_ALL ? 0 : (unsigned)index;
    last = index == FERRY_RUNTIME_ALL ? rt->n - 1 : (unsigned)index;
    for (i = first; i <= last; i++) {
        rc = on_loop(rt, i, in_task, dump_one, out);
        if (rc < 0)
            return rc;
        total += rc;
    }
    if (index == FERRY_RUNTIME_ALL)
        fprintf(out, "ferry: runtime of %u loops: %d live task(s)\n", rt->n, total);
    return total;
}
