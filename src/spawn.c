/* spawn.c - making a task: ferry_task_spawn(), and ferry_group_spawn()'s
 * way in (ferry__task_spawn()).
 * Loop thread only.
 *
 * A task lives at the top of its stack (stack.c hands out a stack with the
 * task structure's room reserved), so a spawn is a stack from the loop's
 * cache, the structure's fields set one by one, and a place at the back of
 * the run queue, or, with FERRY_SPAWN_EAGER, the front of the running turn.
 */
#include "loop_only.h"

#include <string.h>

#include "loop_int.h"
#include "switch.h"

/* Every field of struct ferry_task, and its one padding (checked where the
 * layout is known: LP64 with the assembly switch):
 * adding a field breaks this, and ferry_task_spawn() must then initialise
 * the new one. */
#if defined(FERRY_CTX_ASM) && defined(__LP64__)
_Static_assert(offsetof(ferry_task, status) == 64,
               "what a switch reads fills the first cache line of struct ferry_task");
_Static_assert(sizeof(ferry_task) ==
                   sizeof(struct ferry__stack) + sizeof(struct ferry__runnable) +
                       sizeof(ferry__ctx) + 3 * sizeof(void *) /* loop fn arg */ + 2 * sizeof(int) +
                       4 /* locks status state started cancelled handle */ + 1 /* gflags */ +
                       3 /* the padding after it */ + 2 * sizeof(void *) /* waiter scope */ +
                       sizeof(struct ferry__hnode) + sizeof(struct ferry__waitq) +
                       sizeof(struct ferry__link) /* all */ + sizeof(void *) /* group */ +
                       sizeof(struct ferry__link) +
                       4 * sizeof(void *) /* lo hi asan_fake tsan_fiber */ + sizeof(uint64_t) +
                       32 /* id name */ + sizeof(void *) /* locals */,
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
        ferry__loop_kick(loop);
    ferry__switch_away(loop, self);
}

/* The loop a spawn goes to, and whether it may: the checks made before
 * anything is.  Returns: 0 and *loop; -EPERM; -EINVAL; -ESHUTDOWN. */
static inline int spawn_check(ferry_loop **loop, ferry_task_fn fn, const ferry_task_opts *opts)
{
    size_t size = opts && opts->stack_size ? opts->stack_size : 0;
    int rc;

    rc = ferry__loop_arg(loop);
    if (rc)
        return rc;
    if (!fn)
        return -EINVAL;
    if ((*loop)->closing)
        return -ESHUTDOWN;
    if (size && (size < FERRY_STACK_MIN || size > ((size_t)1 << 30)))
        return -EINVAL;
    if (opts && (opts->flags & ~FERRY_SPAWN_EAGER))
        return -EINVAL;
    return 0;
}

/* The task's name, copied by hand: snprintf() would be a large part of a
 * spawn. */
static inline void name_set(ferry_task *t, const ferry_task_opts *opts)
{
    size_t len;

    if (opts && opts->name) {
        len = strnlen(opts->name, sizeof t->name - 1);
        memcpy(t->name, opts->name, len);
        t->name[len] = '\0';
    } else {
        memcpy(t->name, "task", sizeof "task");
    }
}

/*
 * The task on stack `s`, ready to be started: everything but the stack
 * header starts fresh, field by field (one memset() of the whole struct
 * compiles to `rep stos`, whose start-up cost is a large part of a spawn).
 * The assertions above fail when a field is added, so that it is
 * initialised here too.
 */
static inline ferry_task *task_init(struct ferry__stack *s, ferry_loop *loop, ferry_task_fn fn,
                                    void *arg, const ferry_task_opts *opts, bool handle)
{
    ferry_task *t = ferry__stack_task(s);

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
    t->gflags = 0;
    ferry__link_init(&t->group_link);
    t->asan_fake = NULL;
    t->tsan_fiber = NULL;
    t->run.kind = FERRY__RUN_TASK;
    t->loop = loop;
    t->fn = fn;
    t->arg = arg;
    t->handle = handle;
    t->id = ++loop->next_id;
    name_set(t, opts);
    t->lo = ferry__stack_lo(s);
    t->hi = (char *)t;
    t->timer.fire = NULL;
    if (s->guard == FERRY__GUARD_NONE)
        *(uint64_t *)t->lo = FERRY__CANARY;
    ferry__ctx_make(&t->ctx, t->lo, (size_t)((char *)t->hi - (char *)t->lo), ferry__task_entry, t);
    ferry__fiber_create(t);
    return t;
}

/* ferry__task_spawn(), with `key` (if not NULL) set to `value` in the
 * new task's values.  Inlined into both callers: the plain spawn, a hot
 * path, pays nothing for the key. */
static inline __attribute__((always_inline)) int
spawn(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg, const ferry_task_opts *opts,
      ferry_group *group, unsigned gflags, const ferry_task_key *key, void *value)
{
    struct ferry__stack *s;
    ferry_task *t;
    int rc;

    struct ferry__local *locals = NULL;
    ferry_task *self;

    if (out)
        *out = NULL;
    rc = spawn_check(&loop, fn, opts);
    if (rc)
        return rc;
    /* A task of the same loop hands its inherited values down. */
    self = ferry__self();
    if (__builtin_expect(self && self->locals && self->loop == loop, 0)) {
        rc = ferry__locals_inherit(self, &locals);
        if (rc)
            return rc;
    }
    if (key) {
        rc = ferry__locals_put(&locals, key, value);
        if (rc) {
            ferry__locals_free(locals);
            return rc;
        }
    }
    rc = ferry__stack_get(loop, opts && opts->stack_size ? opts->stack_size : 0, &s);
    if (rc) {
        ferry__locals_free(locals);
        return rc;
    }
    t = task_init(s, loop, fn, arg, opts, out != NULL);
    t->locals = locals;
    ferry__list_push_back(&loop->tasks, &t->all);
    loop->live++;
    if (out)
        *out = t;
    if (group) {
        /* Before it can run: an eager task may end right away. */
        t->group = group;
        t->gflags = (uint8_t)gflags;
        ferry__list_push_back(&group->children, &t->group_link);
        group->live++;
    }
    if (opts && (opts->flags & FERRY_SPAWN_EAGER)) {
        /* Only a task of this loop, running now, can step aside (not a
         * callback, even one of another loop that a task runs nested). */
        if (self && self->loop == loop && loop->current == self && loop->turn) {
            spawn_eager(loop, t, self);
            return 0;
        }
    }
    ferry__task_ready(t);
    return 0;
}

int ferry__task_spawn(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg,
                      const ferry_task_opts *opts, ferry_group *group, unsigned gflags)
{
    return spawn(out, loop, fn, arg, opts, group, gflags, NULL, NULL);
}

int ferry__task_spawn_with(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg,
                           const ferry_task_opts *opts, const ferry_task_key *key, void *value)
{
    return spawn(out, loop, fn, arg, opts, NULL, 0, key, value);
}

int ferry_task_spawn(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg,
                     const ferry_task_opts *opts)
{
    return ferry__task_spawn(out, loop, fn, arg, opts, NULL, 0);
}

int ferry__task_spawn_always(ferry_loop *loop, ferry_task_fn fn, void *arg,
                             const ferry_task_opts *opts)
{
    ferry_task *t;
    int rc = ferry__task_spawn(&t, loop, fn, arg, opts, NULL, 0);

    if (rc)
        return rc;
    /* Ready, not yet run: nothing has looked at the flag. */
    t->gflags |= FERRY__TASK_BODY_ALWAYS;
    t->handle = false;
    return 0;
}
