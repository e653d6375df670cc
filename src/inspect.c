/* inspect.c - looking into a loop: ferry_loop_dump() for people, and
 * what the loop still holds for a test's teardown.
 * Loop thread only.
 */
#include "loop_only.h"

#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "loop_int.h"
#include "loop_new.h"
#include "log.h"

static const char *const state_names[] = { "ready", "running", "waiting", "done" };

/* Frames printed per task at most: enough for any real call chain, and a
 * bound on a walk through a chain that is not one. */
#define MAX_FRAMES 64

/*
 * One frame: the return address `pc`, named after the symbol that holds it
 * if the object exports one (a program's own functions need -rdynamic),
 * else as an offset in its object, for addr2line.  Returns false if `pc`
 * is in no loaded object: then it was no return address, and the walk
 * stops.
 */
static bool print_frame(FILE *out, unsigned n, uintptr_t pc)
{
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    /* pc - 1: the call, which may be the last instruction of its function. */
    uintptr_t at = pc - 1;
    const char *obj;

    if (!dladdr1((void *)at, &info, (void **)&sym, RTLD_DL_SYMENT) || !info.dli_fname) {
        fprintf(out, "      #%u 0x%016llx ?\n", n, (unsigned long long)pc);
        return false;
    }
    obj = strrchr(info.dli_fname, '/');
    obj = obj ? obj + 1 : info.dli_fname;
    /* The nearest exported symbol below pc names it only if pc lies inside
     * it: the library exports its public functions alone. */
    if (info.dli_sname && info.dli_saddr && sym && at < (uintptr_t)info.dli_saddr + sym->st_size)
        fprintf(out, "      #%u 0x%016llx %s+0x%llx (%s)\n", n, (unsigned long long)pc,
                info.dli_sname, (unsigned long long)(pc - (uintptr_t)info.dli_saddr), obj);
    else
        fprintf(out, "      #%u 0x%016llx (%s+0x%llx)\n", n, (unsigned long long)pc, obj,
                (unsigned long long)(pc - (uintptr_t)info.dli_fbase));
    return true;
}

/*
 * Where a suspended task's saved context puts its stack pointer, the
 * address its switch returns to, and its frame pointer; false where this
 * build does not know (another architecture or context switch).
 */
static bool saved_frame(const ferry_task *t, uintptr_t *sp, uintptr_t *pc, uintptr_t *fp)
{
#if defined(FERRY_CTX_ASM) && defined(__x86_64__)
    /* switch_x86_64.S: r15 r14 r13 r12 rbx rbp, then the return address. */
    const uintptr_t *s = t->ctx.sp;

    *sp = (uintptr_t)s;
    if (*sp < (uintptr_t)t->lo || *sp + 7 * sizeof *s > (uintptr_t)t->hi)
        return false;
    *fp = s[5];
    *pc = s[6];
    return true;
#elif defined(FERRY_CTX_ASM) && defined(__aarch64__)
    /* switch_aarch64.S: x19..x28, then x29 (fp) and x30 (lr) at 80 and 88. */
    const uintptr_t *s = t->ctx.sp;

    *sp = (uintptr_t)s;
    if (*sp < (uintptr_t)t->lo || *sp + 22 * sizeof *s > (uintptr_t)t->hi)
        return false;
    *fp = s[10];
    *pc = s[11];
    return true;
#elif defined(FERRY_CTX_UCONTEXT) && defined(__x86_64__)
    const greg_t *g = t->ctx.uc.uc_mcontext.gregs;

    *sp = (uintptr_t)g[REG_RSP];
    *fp = (uintptr_t)g[REG_RBP];
    *pc = (uintptr_t)g[REG_RIP];
    return *sp >= (uintptr_t)t->lo && *sp < (uintptr_t)t->hi;
#else
    (void)t;
    (void)sp;
    (void)pc;
    (void)fp;
    return false;
#endif
}

/*
 * The frames of a suspended task, innermost first, from its saved context
 * along the chain of frame pointers.  Every frame pointer is checked
 * before it is read: inside the task's stack, above the previous one, and
 * aligned, so that a function built without frame pointers (whose
 * register then holds anything) ends the walk instead of sending it
 * elsewhere; the chain ends at the zero the task's first frame starts
 * with.
 */
static void dump_frames(FILE *out, const ferry_task *t)
{
    uintptr_t sp, pc, fp, lo, hi = (uintptr_t)t->hi;
    unsigned n;

    if (!saved_frame(t, &sp, &pc, &fp)) {
        fprintf(out, "      (frames: not available with this build's context switch)\n");
        return;
    }
    if (!print_frame(out, 0, pc))
        return;
#if defined(FERRY_FRAME_POINTERS)
    lo = sp;
    for (n = 1; n < MAX_FRAMES; n++) {
        const uintptr_t *f = (const uintptr_t *)fp;

        if (fp < lo || fp > hi - 2 * sizeof *f || (fp & (sizeof *f - 1)))
            break;
        pc = f[1];
        if (!pc || !print_frame(out, n, pc))
            break;
        lo = fp + 2 * sizeof *f;
        fp = f[0];
    }
#else
    (void)lo;
    (void)hi;
    (void)n;
    (void)fp;
    fprintf(out, "      (further frames: ferry was built without frame pointers, "
                 "FERRY_FRAME_POINTERS=OFF)\n");
#endif
}

int ferry_loop_dump(ferry_loop *loop, FILE *out)
{
    struct ferry__link *l;
    int rc = ferry__loop_arg(&loop), n = 0;

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
            fprintf(out, " on %s %p", t->waiter->what ? t->waiter->what : "?", t->waiter->obj);
        if (t->timer.linked)
            fprintf(out, ", wakes in %.3f ms",
                    (double)(t->timer.key - ferry__loop_now(loop)) / 1e6);
        if (t->cancelled)
            fprintf(out, ", cancelled");
        if (t->group)
            fprintf(out, ", in group %p", (void *)t->group);
        fprintf(out, ", stack used %zu of %zu KiB\n", (ferry__stack_used(t) + 1023) / 1024,
                (size_t)((char *)t->hi - (char *)t->lo) / 1024);
        if (t->started && t->state != FERRY_TASK_RUNNING && t->state != FERRY_TASK_DONE)
            dump_frames(out, t);
        n++;
    }
    ferry__lock_dump_broken(loop, out);
    return n;
}


int ferry__loop_leftovers(ferry_loop *loop, struct ferry__leftovers *out)
{
    struct ferry__link *l;
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    if (!out)
        return -EINVAL;
    out->tasks = loop->live;
    out->callbacks = 0;
    ferry__list_foreach(l, &loop->runq) {
        if (ferry__container_of(l, struct ferry__runnable, link)->kind != FERRY__RUN_TASK)
            out->callbacks++;
    }
    out->timers = loop->timers.count;
    out->posts = loop->hooks.pending && loop->hooks.pending(loop->hooks.ctx);
    return 0;
}

size_t ferry__loop_log_alive(ferry_loop *loop, const char *who)
{
    struct ferry__link *l;
    size_t n = 0;

    ferry__list_foreach(l, &loop->tasks) {
        ferry_task *t = ferry__container_of(l, ferry_task, all);

        if (t->state == FERRY_TASK_DONE)
            continue;
        ferry__log(FERRY_LOG_WARN, "%s: task #%llu '%s' (%s%s%s) still alive; cancelling it", who,
                   (unsigned long long)t->id, t->name, state_names[t->state],
                   t->state == FERRY_TASK_WAITING && t->waiter && t->waiter->what ? " on " : "",
                   t->state == FERRY_TASK_WAITING && t->waiter && t->waiter->what ? t->waiter->what
                                                                                  : "");
        n++;
    }
    return n;
}
