/* sig_int.h - signals between io/signal.c (subscriptions, waiting) and
 * io/sigport.c (the loop's port on the process's signal table,
 * base/sigtab.c).
 * Loop thread only.
 */
#ifndef FERRY_SIG_INT_H
#define FERRY_SIG_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry_int.h"
#include "ferry/signal.h"
#include "sigtab.h"
#include "wakefd.h"

struct event;

/*
 * A loop's signal state, made by its first subscription: a part of the
 * loop (sigport.c), freed by ferry_loop_free() (ferry__signal_loop_free()).
 */
struct ferry__sigport {
    struct ferry__loop_part part; /* in the loop's parts */
    /* io/signal.c */
    struct ferry__link subs; /* the loop's live ferry_sigsubs */
    /* io/sigport.c */
    ferry_loop *loop;           /* the loop it belongs to */
    struct event *ev;           /* EV_READ|EV_PERSIST on fd.rfd, added
                                              * while `total` > 0 */
    struct ferry__wakefd fd;    /* what the handler writes (fd.wfd) */
    size_t slot;                /* its slot in the process table */
    size_t total;               /* subscriptions x signals: sum of refs */
    uint64_t mask;              /* signals with refs > 0 */
    unsigned refs[FERRY__NSIG]; /* subscriptions per signal */
    uint64_t seen[FERRY__NSIG]; /* the signal's counter as far as it
                                              * has been handed to subscriptions */
    /* io/signal.c: ferry_loop_dump_on_signal(): the signal (0: none),
     * where the dump goes (a stream on a duplicate of the caller's
     * descriptor), and whether a dump is queued as a callback already. */
    int dump_signum;
    FILE *dump_file;
    bool dump_queued;
};

/* ---- io/sigport.c --------------------------------------------------------- */

/*
 * One more subscription of `loop` to `signum` (valid): the first one of the
 * loop makes its port, the first one of the process installs the handler.
 * Returns: 0; -ENOMEM; -EINVAL (sigaction() refused the number).  On error
 * nothing changed, except that the port may stay (freed with the loop).
 */
int ferry__sig_add(ferry_loop *loop, int signum);

/* The loop's port, or NULL if it has none yet. */
struct ferry__sigport *ferry__sigport_of(const ferry_loop *loop);

/*
 * One subscription of `loop` to `signum` fewer.  When the loop's last one
 * goes and no loop of the process is left subscribed, the old disposition
 * is put back, and the signal is raised once more on this thread if
 * `unread` (a subscription counted a delivery it never received) or if
 * deliveries came after the loop last collected.
 */
void ferry__sig_del(ferry_loop *loop, int signum, bool unread);

/* Hand every delivery counted since the last call to the loop's
 * subscriptions (ferry__sig_deliver() per signal).  No system call. */
void ferry__sig_collect(ferry_loop *loop);

/* ferry_loop_free(): the loop has a port and no subscription left; close
 * the port (after it left the table, so no handler writes the closed
 * descriptor) and take it out of the loop's parts. */
void ferry__sig_port_free(struct ferry__sigport *port);

/* ---- io/signal.c --------------------------------------------------------- */

/* `n` deliveries of `signum` for every subscription of `loop` to it. */
void ferry__sig_deliver(ferry_loop *loop, int signum, uint64_t n);

/* ferry_loop_free(), once every task has ended (the port's part's free
 * hook): end every subscription of the loop (they stay allocated for
 * ferry_sigsub_free(), which then only frees them) and free its port. */
void ferry__signal_loop_free(struct ferry__sigport *port);

/* A loop starts: FERRY_DUMP_SIGNAL in the environment turns
 * ferry_loop_dump_on_signal() on for it, to stderr. */
void ferry__signal_loop_start(ferry_loop *loop);

/*
 * ferry_sigsub_free() with a choice, for ferry_wait_signal(): `merge`
 * drops the deliveries the subscription counted and did not receive (they
 * came while its one wait lasted) instead of raising them again.
 */
int ferry__sigsub_release(ferry_sigsub *sub, bool merge);

/*
 * For a select over several primitives: a task waits for a subscription
 * by putting a waiter on ferry__sigsub_waitq(sub) with ferry__wait().
 * A waiter granted there holds the promise of one delivery; it must either
 * claim it (ferry__sigsub_claim(), which writes the signal number) or, if
 * it takes another case or was cancelled, give it back
 * (ferry__sigsub_unclaim(), which passes it on to the next waiter).
 * ferry__sigsub_try() is ferry_sigsub_try_recv() without the checks.
 */
struct ferry__waitq *ferry__sigsub_waitq(ferry_sigsub *sub);
int ferry__sigsub_try(ferry_sigsub *sub, int *signum);
void ferry__sigsub_claim(ferry_sigsub *sub, int *signum);
void ferry__sigsub_unclaim(ferry_sigsub *sub);

#endif /* FERRY_SIG_INT_H */
