/* ferry/sim.h - a simulated network inside one loop, for deterministic
 * tests of services and their clients.
 *
 * Hosts have names; a service listens on a host's port and its clients
 * connect from other hosts.  Both sides get ordinary streams (ferry/stream.h),
 * so the code that reads and writes them is the code a real service runs.
 * Every segment (connection set-up, bytes written, end of stream) reaches
 * the other side after the link's latency plus a jitter drawn from the
 * simulation's seed, as a timer of the loop: with the loop's virtual
 * clock (ferry_loop_opts.virtual_clock) simulated time costs nothing.
 * With the same seed and the same program, every delivery happens in the
 * same order at the same time (ferry_sim_trace() shows them).
 *
 * Faults on command: a partition between two sets of hosts (bytes across
 * it are held, and reset the connection once the partition has lasted the
 * stall time), its healing, the reset of one connection, a crashed host.
 * Faults at random: resets of connections drawn from the seed
 * (ferry_sim_opts.reset_every).
 * docs/simulation.md says what is not simulated yet.
 *
 * Everything here belongs to one loop and runs on that loop's thread.
 */
#ifndef FERRY_SIM_H
#define FERRY_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/loop.h"
#include "ferry/stream.h"

typedef struct ferry_sim ferry_sim;
typedef struct ferry_sim_host ferry_sim_host;
typedef struct ferry_sim_listener ferry_sim_listener;

/* Settings of a simulation; all-zero (or NULL) gives the defaults. */
typedef struct ferry_sim_opts {
    /* One-way delay of a link, in nanoseconds (0: 1 ms). */
    int64_t latency;
    /* Each segment takes up to this many nanoseconds more, drawn from the
     * seed (0: none). */
    int64_t jitter;
    /* How long a partition holds bytes before the connections that have
     * bytes held across it are reset, in nanoseconds (0: 10 s). */
    int64_t stall;
    /* Random faults from the seed: while connections are open, reset one
     * of them, drawn from the seed, at intervals drawn from the seed
     * between 0 and twice this many nanoseconds (0: no random faults). */
    int64_t reset_every;
} ferry_sim_opts;

/*
 * Make a simulation on `loop` (NULL: the current loop) whose random
 * choices come from `seed`.
 * Thread: loop.  Suspends: no.  Owns: the caller; free with ferry_sim_free()
 * before the loop is freed.
 * Returns: 0; -ENOMEM; -EINVAL (out NULL, a negative setting); -EPERM.
 */
int ferry_sim_new(ferry_sim **out /* OUT */, ferry_loop *loop, uint64_t seed,
                  const ferry_sim_opts *opts);

/*
 * Free the simulation, its hosts and listeners, the connections not yet
 * accepted and every segment on its way.  Streams already handed out stay
 * the caller's to close; they report -ECONNRESET from then on.  No task
 * may be inside a call of this header on it.
 * Thread: loop.  Suspends: no.
 */
void ferry_sim_free(ferry_sim *sim);

/*
 * The host named `name`, made at the first call with that name.  The host
 * lives as long as the simulation.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -ENOMEM (no host made); -EINVAL (NULL, empty name).
 */
int ferry_sim_find_host(ferry_sim *sim, const char *name, ferry_sim_host **out /* OUT */);

/*
 * Give the link between hosts `a` and `b` (both ways) its own latency and
 * jitter instead of the simulation's, for segments sent from now on.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -ENOMEM; -EINVAL (NULL, a negative value, latency 0).
 */
int ferry_sim_link(ferry_sim *sim, ferry_sim_host *a, ferry_sim_host *b, int64_t latency,
                   int64_t jitter);

/*
 * Listen on `port` of `host`.
 * Thread: loop.  Suspends: no.  Owns: the caller; close with
 * ferry_sim_listener_close() (or ferry_sim_free() closes it).
 * Returns: 0; -ENOMEM; -EADDRINUSE; -EINVAL (NULL, port outside 1..65535).
 */
int ferry_sim_listen(ferry_sim *sim, ferry_sim_host *host, int port,
                     ferry_sim_listener **out /* OUT */);

/*
 * Wait for a connection to the listener and take it.
 * Thread: loop, in a task.  Suspends: yes.  Owns: the stream is the
 * caller's (ferry_stream_close()).
 * Returns: 0; -ECANCELED, -ETIMEDOUT (nothing taken); -EBADF (the listener
 * was closed); -EINVAL; -EPERM.
 */
int ferry_sim_accept(ferry_sim_listener *l, ferry_stream **out /* OUT */);

/*
 * Close the listener: tasks in ferry_sim_accept() get -EBADF and the
 * connections not yet accepted are reset.
 * Thread: loop.  Suspends: no.
 */
void ferry_sim_listener_close(ferry_sim_listener *l);

/*
 * Connect from host `from` to `port` of host `to`: one round trip, or
 * longer if a partition holds the set-up.
 * Thread: loop, in a task.  Suspends: yes.  Owns: the stream is the
 * caller's (ferry_stream_close()).
 * Returns: 0; -ECONNREFUSED (nobody listens, or `to` crashed);
 * -ETIMEDOUT (a partition held the set-up for the stall time, or a
 * deadline); -ECANCELED; -ENOMEM; -EINVAL; -EPERM.
 */
int ferry_sim_connect(ferry_sim *sim, ferry_sim_host *from, ferry_sim_host *to, int port,
                      ferry_stream **out /* OUT */);

/*
 * Cut every link between a host of `a` and a host of `b` (hosts in
 * neither set keep their links) until ferry_sim_heal().  Segments across
 * the cut are held; once the partition has lasted the stall time, a
 * connection with bytes held across it is reset (-ETIMEDOUT to a task
 * connecting, -ECONNRESET to readers and writers).  One partition at a
 * time: a new one replaces the last, healing it first.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -EINVAL (NULL, a host in both sets).
 */
int ferry_sim_partition(ferry_sim *sim, ferry_sim_host *const *a, size_t na,
                        ferry_sim_host *const *b, size_t nb);

/*
 * End the partition: the held segments go on their way, in the order
 * they were sent, each after a new latency.
 * Thread: loop.  Suspends: no.
 */
void ferry_sim_heal(ferry_sim *sim);

/*
 * Reset the connection of stream `s`, made by this simulation: both ends
 * at once drop what they have not read and report -ECONNRESET.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -EINVAL (not a simulated stream, or NULL); -EBADF (closed).
 */
int ferry_sim_reset(ferry_stream *s);

/*
 * Crash `host`: every connection with an end on it is reset, and
 * connections to it are refused until ferry_sim_restart().  The host's
 * tasks are not touched (docs/simulation.md).
 * Thread: loop.  Suspends: no.
 */
void ferry_sim_crash(ferry_sim *sim, ferry_sim_host *host);

/* Let a crashed host take connections again.  Thread: loop.  Suspends: no. */
void ferry_sim_restart(ferry_sim *sim, ferry_sim_host *host);

/*
 * The trace of every delivery and fault so far, one line each: the time
 * since the simulation was made, the connection's number, the hosts and
 * what happened.  Same seed, same program: same trace, byte for byte.
 * Thread: loop.  Suspends: no.
 * Returns: the text (NUL-terminated, valid until the next call into the
 * simulation) and its length in *len; NULL if memory ran out while it
 * was written (the trace is then incomplete).
 */
const char *ferry_sim_trace(const ferry_sim *sim, size_t *len /* OUT, optional */);

#endif /* FERRY_SIM_H */
