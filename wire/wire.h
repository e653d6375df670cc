/* wire.h - what the files of wire/ share: the one-time process setup and
 * the event_base a loop runs on.
 * Thread: any.
 */
#ifndef FERRY_WIRE_H
#define FERRY_WIRE_H

struct event_base;

/* One-time process setup for threads: libevent's lock callbacks (ferry's
 * own, so that a base without a lock can be told) and the fork handler.
 * Done when the program starts, and again (a no-op) before a loop makes
 * its event_base. */
void ferry__process_init(void);

/* A new event_base for a loop that owns it, with the lock that other
 * threads' wakeups need and the epoll backend.  Returns: 0 and *out;
 * -ENOMEM (no base; libevent could not give it its lock or condition and
 * went on without; or an allocation of its epoll backend failed and it
 * fell back to poll or select). */
int ferry__base_new(struct event_base **out /* OUT */);

/* Check an application's event_base before a loop attaches to it.
 * Returns: 0; -EINVAL (the base has no lock: it was made before ferry
 * installed libevent's thread callbacks, or with EVENT_BASE_FLAG_NOLOCK;
 * wakeups from other threads would never reach it). */
int ferry__base_check(struct event_base *base);

#endif /* FERRY_WIRE_H */
