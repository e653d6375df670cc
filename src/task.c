/* task.c - spawning, running, ending and joining tasks; yield, sleep,
 * waiting for a file descriptor or a signal; ferry_run(); the task dump.
 * Loop thread only.
 */
#include "loop_only.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop_int.h"
#include "sig_int.h"
#include "switch.h"
#include "sanitize.h"

static const char *const state_names[] = { "ready", "running", "waiting", "done" };

void ferry__task_ready_kick(ferry_loop *loop)
{
    if (!loop->in_run && !loop->kick_pending) {
        loop->kick_pending = true;
        event_active(loop->kick_ev, EV_READ, 0);
    }
}

void ferry__canary_dead(ferry_task *t)
{
    ferry__log(FERRY_LOG_ERROR, "stack overflow in task '%s' (canary overwritten)", t->name);
    abort();
}

void ferry__fiber_create(ferry_task *t)
{
#ifdef FERRY_TSAN_ON
    if (!t->tsan_fiber) {
        t->tsan_fiber = __tsan_create_fiber(0);
        __tsan_set_fiber_name(t->tsan_fiber, t->name);
    }
#else
    (void)t;
#endif
}

void ferry__fiber_destroy(ferry_task *t)
{
#ifdef FERRY_TSAN_ON
    if (t->tsan_fiber) {
        __tsan_destroy_fiber(t->tsan_fiber);
        t->tsan_fiber = NULL;
    }
#else
    (void)t;
#endif
}

ferry_loop *ferry__task_loop(const ferry_task *t)
{
    return t->loop;
}

static void task_finish(ferry_task *t, int status)
{
    ferry_loop *loop = t->loop;

    t->status = status;
    t->state = FERRY_TASK_DONE;
    if (__builtin_expect(t->locks != 0, 0))
        ferry__task_locks_died(t);      /* locks it still holds break */
    ferry__waitq_grant_all(&t->joiners, 0);
    ferry__list_remove(&t->all);
    loop->live--;
    if (t->group)
        ferry__group_child_done(t);
}

static void task_entry(void *arg)
{
    ferry_task *t = arg;

    ferry__switch_arrived(t->loop, t);
    task_finish(t, t->fn(t->arg));
    ferry__switch_to_sched(t->loop, t, true);
    abort();   /* a finished task is never resumed */
}

void ferry__task_resume(ferry_task *t)
{
    ferry_loop *loop = t->loop;

    if (!t->started) {
        t->started = true;
        if (t->cancelled) {
            /* Cancelled before its first run: the body never runs. */
            task_finish(t, -ECANCELED);
            ferry__task_release(t);
            return;
        }
    }
    t->state = FERRY_TASK_RUNNING;
    loop->current = t;
    ferry__switch_to_task(loop, t);
    t = loop->current;
    loop->current = NULL;
    if (t->state == FERRY_TASK_DONE)
        ferry__task_release(t);
}

void ferry__task_release(ferry_task *t)
{
    ferry_loop *loop = t->loop;

    if (t->state != FERRY_TASK_DONE || t->handle)
        return;
    if (loop->current == t)
        return;   /* still on its stack: the scheduler releases it */
    ferry__fiber_destroy(t);
    ferry__stack_put(loop, &t->stk);
}

/* Every field of struct ferry_task, and its one padding (checked where the
 * layout is known: LP64 with the assembly switch):
 * adding a field breaks this, and ferry_task_spawn() must then initialise
 * the new one. */
#if defined(FERRY_CTX_ASM) && defined(__LP64__)
_Static_assert(offsetof(ferry_task, status) == 64,
               "what a switch reads fills the first cache line of struct ferry_task");
_Static_assert(sizeof(ferry_task) ==
               sizeof(struct ferry__stack) + sizeof(struct ferry__runnable) +
               sizeof(ferry__ctx) + 3 * sizeof(void *) /* loop fn arg */ +
               2 * sizeof(int) + 4 /* locks status state started cancelled handle */ +
               4 /* the padding after status */ +
               2 * sizeof(void *) /* waiter scope */ + sizeof(struct ferry__hnode) +
               sizeof(struct ferry__waitq) + sizeof(struct ferry__link) /* all */ +
               sizeof(void *) /* group */ + sizeof(struct ferry__link) +
               4 * sizeof(void *) /* lo hi asan_fake tsan_fiber */ +
               sizeof(uint64_t) + 32 /* id name */,
               "a field was added to struct ferry_task: initialise it in ferry_task_spawn()");
#endif

/*
 * FERRY_SPAWN_EAGER from the running task: `t` goes first in the current
 * turn, the spawner to the back of the run queue (as in ferry_yield()), and
 * the spawner leaves, so that `t` runs now, straight from here unless the
 * switch has to go through the scheduler.  `t` cannot have been cancelled
 * yet (nobody else has run since it was made), so it is marked started
 * here: the handover only takes started tasks.
 */
static void spawn_eager(ferry_loop *loop, ferry_task *t, ferry_task *self)
{
    t->started = true;
    t->state = FERRY_TASK_READY;
    ferry__list_push_front(loop->turn, &t->run.link);
    self->state = FERRY_TASK_READY;
    ferry__list_push_back(&loop->runq, &self->run.link);
    if (__builtin_expect(!loop->in_run, 0))
        ferry__task_ready_kick(loop);
    ferry__switch_away(loop, self);
}

int ferry__task_spawn(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg,
                      const ferry_task_opts *opts, ferry_group *group)
{
    struct ferry__stack *s;
    ferry_task *t;
    size_t size, len;
    int rc;

    if (out)
        *out = NULL;
    if (!loop)
        loop = ferry__loop_tls();
    if (!loop)
        return -EPERM;
    rc = ferry__loop_check(loop);
    if (rc)
        return rc;
    if (!fn)
        return -EINVAL;
    if (loop->closing)
        return -ESHUTDOWN;
    size = opts && opts->stack_size ? opts->stack_size : 0;
    if (size && (size < FERRY_STACK_MIN || size > ((size_t)1 << 30)))
        return -EINVAL;
    if (opts && (opts->flags & ~FERRY_SPAWN_EAGER))
        return -EINVAL;
    rc = ferry__stack_get(loop, size, &s);
    if (rc)
        return rc;
    t = ferry__stack_task(s);
    /* Everything but the stack header starts fresh, field by field: one
     * memset() of the whole struct compiles to `rep stos`, whose start-up
     * cost was 15% of a spawn.  The assertion below fails when a field is
     * added, so that it is initialised here too. */
    memset(&t->run, 0, sizeof t->run);
    t->status = 0;
    t->state = 0;
    t->started = false;
    t->cancelled = false;
    t->waiter = NULL;
    t->scope = NULL;
    memset(&t->timer, 0, sizeof t->timer);
    ferry__link_init(&t->joiners.head);
    ferry__link_init(&t->all);
    t->locks = 0;
    t->group = NULL;
    ferry__link_init(&t->group_link);
    t->asan_fake = NULL;
    t->tsan_fiber = NULL;
    t->run.kind = FERRY__RUN_TASK;
    t->loop = loop;
    t->fn = fn;
    t->arg = arg;
    t->handle = out != NULL;
    t->id = ++loop->next_id;
    /* Copied by hand: snprintf() would cost a third of a spawn. */
    if (opts && opts->name) {
        len = strnlen(opts->name, sizeof t->name - 1);
        memcpy(t->name, opts->name, len);
        t->name[len] = '\0';
    } else {
        memcpy(t->name, "task", sizeof "task");
    }
    t->lo = ferry__stack_lo(s);
    t->hi = (char *)t;
    t->timer.fire = NULL;
    if (s->guard == FERRY__GUARD_NONE)
        *(uint64_t *)t->lo = FERRY__CANARY;
    ferry__ctx_make(&t->ctx, t->lo, (size_t)((char *)t->hi - (char *)t->lo), task_entry, t);
    ferry__fiber_create(t);
    ferry__list_push_back(&loop->tasks, &t->all);
    loop->live++;
    if (out)
        *out = t;
    if (group) {
        /* Before it can run: an eager task may end right away. */
        t->group = group;
        ferry__list_push_back(&group->children, &t->group_link);
        group->live++;
    }
    if (opts && (opts->flags & FERRY_SPAWN_EAGER)) {
        /* Only a task of this loop, running now, can step aside (not a
         * callback, even one of another loop that a task runs nested). */
        ferry_task *self = ferry__self();

        if (self && self->loop == loop && loop->current == self && loop->turn) {
            spawn_eager(loop, t, self);
            return 0;
        }
    }
    ferry__task_ready(t);
    return 0;
}

int ferry_task_spawn(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg,
                     const ferry_task_opts *opts)
{
    return ferry__task_spawn(out, loop, fn, arg, opts, NULL);
}

int ferry_task_join(ferry_task *t, int *status)
{
    struct ferry__waiter w;
    ferry_task *self;
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (t->loop != self->loop)
        return -EPERM;
    if (t == self)
        return -EDEADLK;
    if (!t->handle)
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    while (t->state != FERRY_TASK_DONE) {
        ferry__waiter_init(&w, self, "join", t);
        rc = ferry__wait(&t->joiners, &w, FERRY_NEVER);
        if (rc)
            return rc;
    }
    if (status)
        *status = t->status;
    t->handle = false;
    ferry__task_release(t);
    return 0;
}

int ferry_task_try_join(ferry_task *t, int *status)
{
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__loop_check(t->loop);
    if (rc)
        return rc;
    if (!t->handle)
        return -EINVAL;
    if (t->state != FERRY_TASK_DONE)
        return -EAGAIN;
    if (status)
        *status = t->status;
    t->handle = false;
    ferry__task_release(t);
    return 0;
}

int ferry_task_detach(ferry_task *t)
{
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__loop_check(t->loop);
    if (rc)
        return rc;
    if (!t->handle)
        return -EINVAL;
    t->handle = false;
    ferry__task_release(t);
    return 0;
}

int ferry_task_cancel(ferry_task *t)
{
    struct ferry__waiter *w;
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__loop_check(t->loop);
    if (rc)
        return rc;
    if (t->state == FERRY_TASK_DONE)
        return 0;
    t->cancelled = true;
    w = t->waiter;
    if (t->state == FERRY_TASK_WAITING && w && w->state == FERRY__W_WAITING &&
        !ferry__task_shielded(t)) {
        if (ferry__link_linked(&w->link))
            ferry__list_remove(&w->link);
        w->state = FERRY__W_CANCELLED;
        ferry__task_ready(t);
    }
    return 0;
}

ferry_task *ferry_task_current(void)
{
    ferry_loop *loop = ferry__loop_tls();
    return loop && ferry_loop_is_current(loop) ? loop->current : NULL;
}

const char *ferry_task_name(const ferry_task *t)
{
    return t ? t->name : "(null)";
}

enum ferry_task_state ferry_task_state(const ferry_task *t)
{
    return (enum ferry_task_state)t->state;
}

bool ferry_task_cancelled(const ferry_task *t)
{
    return t && t->cancelled;
}

/* ferry_yield() when another runnable exists: queue the task at the back
 * and switch away.  Out of line, so that the path without a switch saves
 * no registers. */
static __attribute__((noinline)) int yield_switch(ferry_loop *loop, ferry_task *self)
{
    self->state = FERRY_TASK_READY;
    ferry__list_push_back(&loop->runq, &self->run.link);
    if (__builtin_expect(!loop->in_run, 0))
        ferry__task_ready_kick(loop);
    ferry__switch_away(loop, self);
    return 0;
}

int ferry_yield(void)
{
    ferry_task *self = ferry__self();
    ferry_loop *loop;
    int rc;

    if (__builtin_expect(!self, 0))
        return -EPERM;
    if (__builtin_expect(self->cancelled || self->scope, 0)) {
        rc = ferry__check(self);
        if (rc)
            return rc;
    }
    loop = self->loop;
    if (loop->turn && ferry__list_empty_linked(loop->turn) &&
        ferry__list_empty_linked(&loop->runq) &&
        loop->since_poll < loop->hand_limit && !loop->one_turn) {
        /* Nothing else is ready: the next turn would hold only this task,
         * so it begins here and the task goes on, as the scheduler or
         * ferry__switch_away() would do after queueing it, under the same
         * conditions (no detector timing steps, no stop, no poll due). */
        ferry__canary_check(loop, self);
        loop->stats.turns++;
        loop->stats.steps++;
        loop->stats.handoffs++;
        loop->since_poll++;
        return 0;
    }
    return yield_switch(loop, self);
}

int ferry_sleep_until(int64_t deadline)
{
    struct ferry__waiter w;
    ferry_task *self;
    int rc = ferry__enter_task_inline(&self);

    if (rc)
        return rc;
    if (deadline <= ferry_now())
        return ferry_yield();
    ferry__waiter_init(&w, self, "sleep", NULL);
    rc = ferry__wait(NULL, &w, deadline);
    return rc == 1 ? 0 : rc;
}

int ferry_sleep(int64_t duration)
{
    int64_t now = ferry_now();

    if (duration > INT64_MAX - now)
        return ferry_sleep_until(FERRY_NEVER - 1);
    return ferry_sleep_until(now + duration);
}

static void io_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__waiter *w = arg;

    (void)fd;
    w->n = (uint64_t)(((what & EV_READ) ? FERRY_READ : 0) |
                      ((what & EV_WRITE) ? FERRY_WRITE : 0) |
                      ((what & EV_SIGNAL) ? 1 : 0));
    ferry__grant(w, 0);
}

int ferry_wait_fd(int fd, int events, int *revents)
{
    struct ferry__waiter w;
    struct event ev;
    ferry_task *self;
    short what = 0;
    int rc = ferry__enter_task_inline(&self);

    if (rc)
        return rc;
    if (fd < 0 || !events || (events & ~(FERRY_READ | FERRY_WRITE)))
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (events & FERRY_READ)
        what |= EV_READ;
    if (events & FERRY_WRITE)
        what |= EV_WRITE;
    ferry__waiter_init(&w, self, events & FERRY_WRITE ? "fd write" : "fd read",
                       (const void *)(intptr_t)fd);
    if (event_assign(&ev, self->loop->base, fd, what, io_cb, &w) != 0)
        return -EINVAL;
    if (event_add(&ev, NULL) != 0)
        return -ENOMEM;
    rc = ferry__wait(NULL, &w, FERRY_NEVER);
    event_del(&ev);
    if (rc == 0 && revents)
        *revents = (int)w.n;
    return rc;
}

/* A subscription that lives for one wait (ferry/signal.h has the rules):
 * every loop waiting for the signal gets its own count of each delivery. */
int ferry_wait_signal(int signum)
{
    ferry_sigsub *sub;
    ferry_task *self;
    int rc = ferry__enter_task_inline(&self), got;

    if (rc)
        return rc;
    if (!ferry__sig_valid(signum))
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    rc = ferry_sigsub_new(&sub, self->loop, &signum, 1);
    if (rc)
        return rc;
    rc = ferry_sigsub_recv(sub, &got);
    /* Received: more deliveries during the wait merge into this one.  Not
     * received: one that came is raised again for the old disposition. */
    ferry__sigsub_release(sub, rc == 0);
    return rc;
}

int ferry_loop_dump(ferry_loop *loop, FILE *out)
{
    struct ferry__link *l;
    int rc = ferry__loop_check(loop), n = 0;

    if (rc)
        return rc;
    if (!out)
        return -EINVAL;
    fprintf(out, "ferry: %zu live task(s)\n", loop->live);
    ferry__list_foreach(l, &loop->tasks) {
        ferry_task *t = ferry__container_of(l, ferry_task, all);
        fprintf(out, "  task #%llu '%s' %s", (unsigned long long)t->id, t->name,
                state_names[t->state]);
        if (t->state == FERRY_TASK_WAITING && t->waiter)
            fprintf(out, " on %s %p", t->waiter->what ? t->waiter->what : "?",
                    t->waiter->obj);
        if (t->timer.linked)
            fprintf(out, ", wakes in %.3f ms",
                    (double)(t->timer.key - ferry_now()) / 1e6);
        if (t->cancelled)
            fprintf(out, ", cancelled");
        if (t->group)
            fprintf(out, ", in group %p", (void *)t->group);
        fprintf(out, ", stack used %zu of %zu KiB\n", (ferry__stack_used(t) + 1023) / 1024,
                (size_t)((char *)t->hi - (char *)t->lo) / 1024);
        n++;
    }
    ferry__lock_dump_broken(loop, out);
    return n;
}
