/* overflow.c - the stack-overflow reporter: a SIGSEGV handler, on an
 * alternate signal stack, that names the task whose stack overflowed.
 * Loop thread only (the handler runs on the faulting thread).
 *
 * It reports a fault in the running task's guard region, and a fault near
 * a stack pointer that has left the task's stack downwards: the latter
 * catches the stacks without a guard (an infinite recursion there runs
 * through the stacks below until something faults) and frames that jumped
 * the region.  Both the handler and the alternate stack are installed only
 * where the application has none.
 */
#include "loop_only.h"

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include "loop_int.h"

/* How far below the stack pointer a fault still counts as the stack's: a
 * push or call writes just below it, a leaf function's red zone is 128
 * bytes, an aarch64 frame record is stored up to 512 bytes below. */
#define FERRY__SP_REACH ((size_t)4096)

bool ferry__stack_overflowed(const ferry_task *t, const void *addr, const void *sp)
{
    uintptr_t a = (uintptr_t)addr, p = (uintptr_t)sp, lo = (uintptr_t)t->lo;

    if (a >= (uintptr_t)ferry__stack_base(&t->stk) && a < lo)
        return true;
    /* The stack pointer is below the stack only if the task ran off it; the
     * fault near it rules out a fault elsewhere (a signal handler on the
     * alternate stack, say). */
    return p && p < lo && a < lo && a + FERRY__SP_REACH >= p;
}

/* The stack pointer of the interrupted context, NULL where unknown. */
static const void *context_sp(const void *uc)
{
#if defined(__x86_64__)
    return (const void *)(uintptr_t)((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    return (const void *)(uintptr_t)((const ucontext_t *)uc)->uc_mcontext.sp;
#else
    (void)uc;
    return NULL;
#endif
}

static void write_str(const char *s)
{
    ssize_t r = write(STDERR_FILENO, s, strlen(s));
    (void)r;
}

static void segv_handler(int sig, siginfo_t *si, void *uc)
{
    ferry_task *t = ferry__tls_task;

    if (t && ferry__stack_overflowed(t, si->si_addr, context_sp(uc))) {
        write_str("ferry: stack overflow in task '");
        write_str(t->name);
        write_str("'; raise ferry_task_opts.stack_size\n");
    }
    /* Fall back to the default action: the fault repeats and kills us. */
    signal(sig, SIG_DFL);
}

/*
 * The loops of this thread: the handler runs on the thread's alternate
 * signal stack (an overflowed stack has no room for it), which is the
 * memory of one of them if none was installed when the first was made.
 * A loop being freed whose memory is installed hands the job to another
 * loop of the list, and the last one out removes it.
 */
static __thread struct ferry__link alt_loops __attribute__((tls_model("initial-exec")));

static void altstack_set(void *mem)
{
    stack_t ss;

    memset(&ss, 0, sizeof ss);
    ss.ss_sp = mem;
    ss.ss_size = FERRY__ALTSTACK_SIZE;
    ss.ss_flags = mem ? 0 : SS_DISABLE;
    sigaltstack(&ss, NULL);
}

int ferry__overflow_init(ferry_loop *loop)
{
    loop->altstack = ferry__malloc(FERRY__ALTSTACK_SIZE);
    return loop->altstack ? 0 : -ENOMEM;
}

void ferry__overflow_setup(ferry_loop *loop)
{
    struct sigaction old, sa;
    stack_t ss;

    ferry__list_push_back(&alt_loops, &loop->alt_link);
    if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_DISABLE))
        altstack_set(loop->altstack);
    if (sigaction(SIGSEGV, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
        old.sa_handler == SIG_DFL) {
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = segv_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
    }
}

void ferry__overflow_teardown(ferry_loop *loop)
{
    struct ferry__link *next;
    stack_t ss;

    if (ferry__link_linked(&loop->alt_link)) {
        ferry__list_remove(&loop->alt_link);
        /* An alternate stack the application installed stays. */
        if (sigaltstack(NULL, &ss) == 0 && !(ss.ss_flags & SS_DISABLE) &&
            ss.ss_sp == loop->altstack) {
            next = ferry__list_first(&alt_loops);
            altstack_set(next ? ferry__container_of(next, ferry_loop, alt_link)->altstack : NULL);
        }
    }
    ferry__free(loop->altstack);
    loop->altstack = NULL;
}
