/* sim_int.h - what the two files of the simulated network share: its
 * structures, the segments and ends (sim.c) that the calls of ferry/sim.h
 * (sim_net.c) make, send and reset.
 * Loop thread only.
 */
#ifndef FERRY_SIM_INT_H
#define FERRY_SIM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loop_int.h"
#include "stream_int.h"
#include "ferry/sim.h"

enum seg_kind { SEG_SYN, SEG_SYNACK, SEG_REFUSED, SEG_DATA, SEG_FIN, SEG_RST };

struct sim_end;

/* One segment on its way, held by a partition, or queued at its end. */
struct sim_seg {
    struct ferry__hnode node;  /* in the loop's timers while on its way */
    struct ferry__link link;   /* in sim->segs, sim->held or to->inq */
    struct ferry_sim *sim;     /* the simulation */
    struct sim_end *to;        /* receiving end, NULL once it is gone */
    struct sim_end *back;      /* SYN: the connecting end, or NULL */
    struct sim_end *from;      /* the sending end, NULL once it is gone */
    ferry_sim_host *src, *dst; /* hosts it goes from and to */
    uint64_t conn;             /* connection number, for the trace */
    enum seg_kind kind;        /* what it carries */
    bool doomed;               /* lost until the stall time: resets its connection */
    size_t len;                /* DATA: bytes in data[] */
    size_t off;                /* DATA at an end: bytes already read */
    char data[];               /* DATA: the bytes */
};

/* One end of a connection: the transport state of its stream. */
struct sim_end {
    struct ferry_sim *sim;       /* NULL once the simulation is freed */
    ferry_stream *s;             /* the stream it belongs to */
    struct sim_end *peer;        /* the other end, NULL once it is gone */
    ferry_sim_host *host;        /* where this end is */
    ferry_sim_host *peer_host;   /* where the other end is (or was) */
    struct ferry__link link;     /* in sim->ends */
    struct ferry__link plink;    /* in a listener's pending list */
    struct ferry__link inq;      /* delivered DATA segments not yet read */
    struct sim_seg *fin;         /* the FIN, kept ready until it is sent */
    struct ferry__waiter *connw; /* the task connecting, or NULL */
    int64_t tx_last;             /* latest arrival scheduled from here */
    size_t inflight;             /* bytes sent from here, not yet arrived */
    uint64_t conn;               /* connection number */
    int err;                     /* -ECONNRESET, -ETIMEDOUT once reset */
    bool fin_in;                 /* the peer's FIN arrived */
    bool fin_out;                /* this end shut its direction down */
};

struct ferry_sim_host {
    struct ferry__link link; /* in sim->hosts */
    struct ferry_sim *sim;   /* the simulation it is part of */
    uint32_t addr;           /* its address, 10.0.0.0 plus this */
    int side;                /* 1 or 2: its set in the partition, 0 none */
    bool crashed;            /* connections to it are refused */
    int (*boot_fn)(void *);  /* its boot task (ferry_sim_boot()), or NULL */
    void *boot_arg;          /* the boot task's argument */
    char name[];             /* its name */
};

/* A link between two hosts: settings of its own (ferry_sim_link()), or
 * only the time its two ways are busy until (with a bandwidth). */
struct sim_link {
    struct ferry__link link; /* in sim->links */
    ferry_sim_host *a, *b;   /* its two hosts */
    bool own;                /* latency and jitter are its own */
    int64_t latency, jitter; /* its settings, if own */
    int64_t busy[2];         /* a to b, b to a: busy until then */
};

struct ferry_sim_listener {
    struct ferry__link link;    /* in sim->listeners while open */
    struct ferry_sim *sim;      /* the simulation */
    ferry_sim_host *host;       /* where it listens */
    int port;                   /* on which port */
    bool closed;                /* closed: freed when nobody is inside */
    bool down;                  /* taken down by a crash: takes nothing */
    bool owned;                 /* a ferry_listener wraps it: freed only
                                 * once its owner closes it too */
    unsigned inside;            /* tasks inside ferry_sim_accept() */
    struct ferry__link pending; /* server ends not yet accepted */
    struct ferry__waitq q;      /* tasks accepting */
};

struct ferry_sim {
    struct ferry__loop_part part;   /* in the loop's parts: how its tasks' calls find it */
    ferry_loop *loop;               /* the loop it runs on */
    uint64_t seed;                  /* the seed it was made with */
    uint32_t nhosts;                /* hosts made so far */
    int next_port;                  /* where the search for a free port starts */
    uint64_t rng;                   /* the generator's state, from the seed */
    int64_t start;                  /* the loop's time when made */
    int64_t latency, jitter;        /* the links' default settings */
    int64_t stall;                  /* how long a partition holds bytes */
    int64_t bandwidth;              /* bytes per second each way of a link, or 0 */
    size_t window;                  /* bytes of one direction on their way at most */
    uint32_t loss_ppm;              /* segments lost, per million */
    uint64_t conns;                 /* connections made so far */
    bool parted;                    /* a partition is in place */
    bool stalled;                   /* it has lasted the stall time */
    struct ferry__hnode stall_node; /* fires when the partition stalls */
    int64_t reset_every;            /* mean time between random resets, or 0 */
    struct ferry__hnode chaos_node; /* the next random reset */
    int64_t partition_every;        /* mean time between random partitions, or 0 */
    int64_t partition_for;          /* their mean length */
    struct ferry__hnode part_node;  /* the next random partition, or its heal */
    bool part_random;               /* the partition in place is random: part_node heals it */
    int64_t crash_every;            /* mean time between random crashes, or 0 */
    int64_t crash_for;              /* their mean length */
    struct ferry__hnode crash_node; /* the next random crash, or its restart */
    ferry_sim_host *crash_down;     /* the host crashed at random, or NULL */
    struct ferry__link hosts;       /* ferry_sim_host */
    struct ferry__link links;       /* struct sim_link */
    struct ferry__link listeners;   /* open listeners */
    struct ferry__link ends;        /* every end */
    struct ferry__link segs;        /* segments on their way */
    struct ferry__link held;        /* segments held by the partition */
    char *trace;                    /* the trace, NUL-terminated */
    size_t tlen, tcap;              /* its length and room */
    bool trace_lost;                /* an append ran out of memory */
};

/* The loop part a simulation is (sim_host.c). */
extern const struct ferry__part_ops ferry__sim_part_ops;

/* The transport of a simulated stream. */
extern const struct ferry__stream_io ferry__sim_io;

/* Append a line to the trace (printf-style); running out of memory marks
 * the trace lost. */
void ferry__sim_trace(struct ferry_sim *sim, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A segment with room for `len` bytes, its timer ready; NULL: no memory. */
struct sim_seg *ferry__sim_seg_new(struct ferry_sim *sim, size_t len);

/* Put segment `g` on its way; `from`, the sending end (NULL for none),
 * keeps its direction in order. */
void ferry__sim_seg_send(struct sim_seg *g, struct sim_end *from);

/* Reset one end with `err`: drop what it has not read, wake its tasks. */
void ferry__sim_end_reset(struct sim_end *e, int err);

/* Reset both ends of e's connection, tracing `why`. */
void ferry__sim_conn_reset(struct sim_end *e, int err, const char *why);

/* A new end on `host` for connection `conn`, with its stream and its FIN.
 * Returns: 0; -ENOMEM. */
int ferry__sim_end_new(struct ferry_sim *sim, ferry_sim_host *host, uint64_t conn,
                       struct sim_end **out);

/* The link between a and b, made if there is none.  Returns: 0; -ENOMEM. */
int ferry__sim_link_get(struct ferry_sim *sim, ferry_sim_host *a, ferry_sim_host *b,
                        struct sim_link **out);

/* The open listener on `port` of `h`, or NULL. */
struct ferry_sim_listener *ferry__sim_find_listener(struct ferry_sim *sim, const ferry_sim_host *h,
                                                    int port);

/* Arm the next random reset if random faults are on, connections are
 * open and none is armed yet. */
void ferry__sim_chaos_arm(struct ferry_sim *sim);

/* Free a listener closed by its simulation once nobody is inside and
 * its owner is done with it. */
void ferry__sim_listener_put(struct ferry_sim_listener *li);

/* Cancel every task of `host` (sim_host.c). */
void ferry__sim_host_cancel(struct ferry_sim *sim, const ferry_sim_host *host);

/* Some connection is open and not reset. */
bool ferry__sim_any_live(struct ferry_sim *sim);

/* The partition ends (by command or at random): held segments go on. */
void ferry__sim_heal_now(struct ferry_sim *sim);

/* The hosts' sides are set: the partition is in place, traced with `why`
 * ("" on command), its stall timer armed. */
void ferry__sim_parted(struct ferry_sim *sim, const char *why);

/* A partition or heal on command replaces a random partition: its heal
 * is not due any more (sim_fault.c). */
void ferry__sim_part_forget(struct ferry_sim *sim);

/* Arm the random faults that can hit something now and are not armed. */
void ferry__sim_faults_arm(struct ferry_sim *sim);

/* `h` has tasks (sim_host.c). */
bool ferry__sim_host_busy(struct ferry_sim *sim, const ferry_sim_host *h);

/* The timer of a partition that has lasted the stall time. */
void ferry__sim_stall_fire(struct ferry__hnode *n);

#endif /* FERRY_SIM_INT_H */
