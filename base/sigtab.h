/* sigtab.h - POSIX signals for the whole process: one handler, a counter
 * of deliveries per signal, and the table of listeners it wakes (a slot
 * each: a wake descriptor and a mask of signals).  base/sigtab.c has the
 * rules; a loop's side of it is io/sigport.c.
 * Thread: any.
 */
#ifndef FERRY_BASE_SIGTAB_H
#define FERRY_BASE_SIGTAB_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Signal numbers are 1..FERRY__NSIG-1; signal s is bit s-1 of a mask. */
#define FERRY__NSIG 65
_Static_assert(NSIG <= FERRY__NSIG, "a signal mask is one 64-bit word");

static inline uint64_t ferry__sig_bit(int signum)
{
    return (uint64_t)1 << (signum - 1);
}

/* True for a number a subscription accepts (see ferry/signal.h); the C
 * library's own signals pass here and are refused by sigaction(). */
static inline bool ferry__sig_valid(int signum)
{
    return signum > 0 && signum < NSIG && signum != SIGKILL && signum != SIGSTOP &&
           signum != SIGSEGV && signum != SIGBUS && signum != SIGFPE && signum != SIGILL;
}

/* A slot for a listener whose wake descriptor is `wfd` (listening for no
 * signal yet).  Returns: the slot's index; -ENOMEM. */
long ferry__sigtab_join(int wfd);

/* Give slot `slot` back.  On return no handler writes its descriptor any
 * more, so the caller may close it. */
void ferry__sigtab_leave(size_t slot);

/* Slot `slot` listens for `signum` (valid) from now on; the first listener
 * of the process installs the handler.  *seen is the signal's count from
 * before the handler or the slot's bit was set: what came later is the
 * listener's.  Returns: 0; -EINVAL (sigaction() refused the number; nothing
 * changed). */
int ferry__sigtab_listen(size_t slot, int signum, uint64_t *seen /* OUT */);

/* Slot `slot` stops listening for `signum`.  If it was the process's last
 * listener, the old disposition is put back and the signal raised once
 * more on this thread when `unread` (a delivery was counted and never
 * received) or when it came after `seen` (the listener's last look). */
void ferry__sigtab_unlisten(size_t slot, int signum, uint64_t seen, bool unread);

/* Deliveries of `signum` since the process began.  No system call. */
uint64_t ferry__sigtab_count(int signum);

#endif /* FERRY_BASE_SIGTAB_H */
