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
 * Faults at random, drawn from the seed: resets, loss, partitions and
 * crashes (ferry_sim_opts).  A host's tasks (ferry_sim_spawn()) use the
 * ordinary calls of ferry/stream.h and ferry/resolve.h, which the
 * simulation answers.
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
    /* Bandwidth of every link, each way, in bytes per second (0:
     * unlimited): a segment occupies its link for len / bandwidth after
     * the one before it. */
    int64_t bandwidth;
    /* The most bytes of one direction of a connection on their way at once
     * (0: 64 KiB): a write that would pass it waits for room, as a writer
     * waits for a full socket buffer. */
    size_t window;
    /* Loss, in parts per million of segments: a lost segment is sent again
     * after a retransmission timeout (200 ms, doubling at each loss in a
     * row), so its connection stalls; once its losses in a row have lasted
     * the stall time, the connection is reset.  0: no loss. */
    uint32_t loss_ppm;
    /* Random partitions: at intervals drawn between 0 and twice this many
     * nanoseconds, a partition between two sets of hosts drawn from the
     * seed, healed after a time drawn between 0 and twice partition_for
     * (0: 1 s).  0: none. */
    int64_t partition_every;
    int64_t partition_for;
    /* Random crashes: at intervals drawn between 0 and twice this many
     * nanoseconds, a host that has tasks (ferry_sim_spawn(),
     * ferry_sim_boot()) drawn from the seed crashes, and is restarted
     * after a time drawn between 0 and twice crash_for (0: 1 s).  0: none. */
    int64_t crash_every;
    int64_t crash_for;
} ferry_sim_opts;

/*
 * Make a simulation on `loop` (NULL: the current loop) whose random
 * choices come from `seed`.  Seed 0 takes the seed from the environment:
 * FERRY_FUZZ's seed (what ferry-fuzz sets, so that one number replays the
 * schedule and the network), else FERRY_SIM_SEED, else 1; the seed used is
 * logged with the variable that replays it, and ferry_sim_seed() returns it.
 * Thread: loop.  Suspends: no.  Owns: the caller; free with ferry_sim_free()
 * before the loop is freed (a loop freed first frees it, its streams
 * reporting -ECONNRESET).
 * Returns: 0; -ENOMEM; -EINVAL (out NULL, a negative setting); -EBUSY
 * (the loop has a simulation: one a loop, which its hosts' tasks find);
 * -EPERM.
 */
int ferry_sim_new(ferry_sim **out /* OUT */, ferry_loop *loop, uint64_t seed,
                  const ferry_sim_opts *opts);

/* Thread: any.  Suspends: no.
 * Returns: the seed the simulation draws from (0 for NULL). */
uint64_t ferry_sim_seed(const ferry_sim *sim);

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

/* Thread: loop.  Suspends: no.
 * Returns: the host's name (NULL for NULL). */
const char *ferry_sim_host_name(const ferry_sim_host *host);

/*
 * Run fn(arg) as a task of `host`.  A task of a host reaches the network
 * through ferry's ordinary calls, as the host: ferry_tcp_listen() listens
 * on the host (whatever local address it names; port 0 picks a free one),
 * ferry_listener_accept(), ferry_listener_port() and
 * ferry_listener_close() work on that listener, ferry_tcp_connect()
 * connects from the host, and ferry_getaddrinfo() answers the
 * simulation's host names with their addresses (10.0.0.1 for the first
 * host made, and so on, or those addresses written out) and
 * FERRY_EAI_NONAME for other names and addresses: a host's task does not
 * reach the real network (Unix sockets excepted).  The streams and
 * listeners are simulated (ferry_stream_fd() and ferry_listener_fd() are
 * -ENOTSOCK); everything else a service does is unchanged.  Tasks a task
 * of a host spawns belong to the host too.  A task that is not a host's
 * uses the real network, on the same loop.
 * Thread: loop.  Suspends: no.  Owns: *out as ferry_task_spawn()'s.
 * Returns: as ferry_task_spawn(); -EINVAL (NULL host or fn); -EHOSTDOWN
 * (the host crashed and is not restarted yet).
 */
int ferry_sim_spawn(ferry_sim_host *host, ferry_task **out /* OUT, optional */,
                    int (*fn)(void *), void *arg);

/*
 * Make fn(arg) the host's boot task: it runs now, as by ferry_sim_spawn()
 * (not joinable), and again at each ferry_sim_restart() after a crash.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -ENOMEM; -EINVAL (NULL); -EBUSY (the host has a boot task).
 */
int ferry_sim_boot(ferry_sim_host *host, int (*fn)(void *), void *arg);

/* Thread: any.  Suspends: no.
 * Returns: the host of the calling task, or NULL (not a host's task, or
 * another thread). */
ferry_sim_host *ferry_sim_current_host(void);

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
 * -ETIMEDOUT (a partition or losses held the set-up for the stall time,
 * or a deadline); -ECANCELED; -ENOMEM; -EINVAL; -EPERM.
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
 * Crash `host`: every task of the host is cancelled (each sees
 * -ECANCELED at its next wait and unwinds), every connection with an end
 * on it is reset, its listeners stop taking connections (their ports are
 * free again; accept returns -EBADF until the owner closes them), and
 * connections to it are refused until ferry_sim_restart().  A crashed
 * host's new tasks are refused (ferry_sim_spawn(): -EHOSTDOWN).
 * Thread: loop.  Suspends: no.
 */
void ferry_sim_crash(ferry_sim *sim, ferry_sim_host *host);

/* Let a crashed host take connections again, and run its boot task
 * (ferry_sim_boot()) again.  Thread: loop.  Suspends: no. */
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
