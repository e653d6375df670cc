/* model.h - ferry's model-based random tester.
 *
 * One byte string is one sequence of operations.  model_ops.c decodes it into
 * driver operations (spawn an actor task, give it a command, cancel it,
 * make its deadline pass, let the loop run one round or until nothing can
 * run, finish a singleflight call, make or cancel a timer, post callbacks
 * from another thread, have a thread send to or receive from a channel,
 * wait for the loop to poll) and runs them twice at once:
 *
 *   - on a REAL loop: the driver is itself a task; every actor is a task
 *     that parks between commands and calls the real primitives, sleeps,
 *     or spawns children into, waits for and cancels task groups;
 *   - on a sequential reference MODEL: a plain C simulation of the same
 *     tasks, wait queues, groups, timers and FIFO run queue, written from
 *     the contracts in include/ferry/{sync,queue,flight,task,loop,select,bridge}.h
 *     (the channel as bridge/chan.c implements it: a wake is a hint).
 *
 * After every operation the two are compared (each command's return code
 * and value, task states, the run queue in order, lock owners, permits,
 * queue counters, flight and per-key lock tables, groups, which timers and
 * posts ran and what their callbacks did), and invariants that do not
 * depend on the model are checked on the real objects: holders never
 * exceed capacity, permits and items are conserved, FIFO order, one call
 * in flight per singleflight key, a group counts its children, and
 * quiescence (when nothing can run, no waiter is blocked whose wake
 * condition holds).
 *
 * The clock: a deadline of a command is a scope whose deadline is already
 * past ("past"), or one far in the future that the driver makes pass at a
 * chosen step ("expire").  The loop polls timers and the thread inbox only
 * when nothing is ready, that is only in the driver's wait: timers are due
 * at once or an hour away, and short sleeps all end by the end of that
 * wait.  What the clock still decides (whether a short sleep found its
 * deadline already past, where in a wait a sleep ends) is read from the
 * real side and changes nothing else.  The same bytes always give the same
 * run.
 *
 * Byte format.  Byte 0 is the format: MODEL_FMT_V1 (1) is the original
 * operation mix, kept so that stored sequences keep their meaning; any
 * other value is format 2, which adds timers, posts, waits, sleeps and
 * groups; MODEL_FMT_V3 (3) is format 2 plus ferry_select() over the
 * queue's get and put and the event (in listed order, so that the model
 * can tell which case is performed); MODEL_FMT_V4 (4) adds two channels
 * (ferry_chan) that tasks send to and receive from, that selects wait on
 * beside the queue and the event, and that a plain thread sends to,
 * receives from and closes: the thread runs one operation at a time
 * while the loop waits for it, and the wakes it sends reach the tasks
 * through the loop's inbox at the driver's next wait, so that
 * cancellations and deadlines land while they are on their way.  Bytes 1
 * and 2 configure the semaphore, the queue and the channels' capacity.
 * Then MODEL_OP_BYTES per operation.  A new operation mix is a new format.
 */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/ferry.h"

/* Most operations decoded from one byte string. */
#define MODEL_MAX_OPS 200
/* Bytes per operation, and bytes of the per-sequence header (the format
 * byte and two configuration bytes). */
#define MODEL_OP_BYTES 6
#define MODEL_HDR_BYTES 3
#define MODEL_MAX_BYTES (MODEL_HDR_BYTES + MODEL_MAX_OPS * MODEL_OP_BYTES)

/* Formats (byte 0). */
#define MODEL_FMT_V1 1
#define MODEL_FMT_V2 2
#define MODEL_FMT_V3 3
#define MODEL_FMT_V4 4

typedef struct model_report {
    int    failed;        /* 0: every check passed */
    int    op_index;      /* operation at which it failed (-1: setup/teardown) */
    char   msg[512];      /* what failed */
    size_t ops_run;       /* operations executed */
    bool   stuck;         /* something never settled: tasks or threads may be
                           * blocked for good; use a fresh loop (and in the
                           * offload mode, stop) */
} model_report;

/*
 * Run the sequence encoded in `bytes` on `loop` (a loop of this thread that
 * is not running: this call runs it) and check it.  `trace`, if not NULL,
 * receives one line per operation and per completed command.
 * Returns 0 if every check passed, else 1 with `rep` filled in.  After a
 * failure the loop may hold tasks that never end: do not run another
 * sequence on it or free it (ferry_loop_free would wait for them); put it
 * aside and make a new one.
 */
int model_check_bytes(ferry_loop *loop, const uint8_t *bytes, size_t len,
                      FILE *trace, model_report *rep);

/* The bytes of random sequence `seed`, in the current format (at most
 * MODEL_MAX_BYTES of them, written to `buf`); returns how many.  The
 * generator may change: keep a failing sequence as its bytes. */
size_t model_seed_bytes(uint64_t seed, uint8_t *buf, size_t cap);

/* Seed of the i-th sequence of a run started with `run_seed`. */
uint64_t model_seq_seed(uint64_t run_seed, uint64_t i);

/* Print how often each command returned each code (coverage of outcomes). */
void model_hist_print(FILE *out);

/*
 * The offload mode (model_offload.c, ferry-model --offload): the same byte
 * format drives ferry_to_thread / ferry_to_thread_abandon on a small pool
 * whose jobs block until the driver releases them, with cancellation while
 * queued and while running, checked against a reference model of the pool.
 * Returns 0 if every check passed, else 1 with `rep` filled in.
 */
int model_offload_check_bytes(ferry_loop *loop, const uint8_t *bytes, size_t len,
                              FILE *trace, model_report *rep);
/* Print what the offload sequences exercised (operation counts). */
void model_offload_stats_print(FILE *out);

/* A loop configured for the model (io and timers polled only when
 * nothing is ready; the blocked-loop detector off). */
int model_loop_new(ferry_loop **out);

/* Callbacks (timers, posts) that ran after their sequence had ended:
 * should stay 0. */
unsigned long model_stray_callbacks(void);

#endif /* FERRY_MODEL_H */
