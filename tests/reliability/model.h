/* model.h - ferry's model-based random tester (issue 6).
 *
 * One byte string is one sequence of operations.  model.c decodes it into
 * driver operations (spawn an actor task, give it a command, cancel it,
 * make its deadline pass, let the loop run one round or until nothing can
 * run, finish a singleflight call) and runs them twice at once:
 *
 *   - on a REAL loop: the driver is itself a task; every actor is a task
 *     that parks between commands and calls the real primitives;
 *   - on a sequential reference MODEL: a plain C simulation of the same
 *     tasks, wait queues and FIFO run queue, written from the contracts in
 *     include/ferry/{sync,queue,flight,task}.h.
 *
 * After every operation the two are compared (each command's return code
 * and value, task states, the run queue in order, lock owners, permits,
 * queue counters, flight and per-key lock tables), and invariants that do
 * not depend on the model are checked on the real objects: holders never
 * exceed capacity, permits and items are conserved, FIFO order, one call
 * in flight per singleflight key, and quiescence (when nothing can run, no
 * waiter is blocked whose wake condition holds).
 *
 * Determinism: no wall clock.  A deadline is a scope whose deadline is
 * already past ("past"), or one far in the future that the driver makes
 * pass at a chosen step ("expire": it moves the scope's deadline into the
 * past and fires the task's timer node exactly as the loop's timer poll
 * would).  The same bytes always give the same run.
 */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/ferry.h"

/* Most operations decoded from one byte string. */
#define MODEL_MAX_OPS 200
/* Bytes per operation, and bytes of the per-sequence header. */
#define MODEL_OP_BYTES 6
#define MODEL_HDR_BYTES 2

typedef struct model_report {
    int    failed;        /* 0: every check passed */
    int    op_index;      /* operation at which it failed (-1: setup/teardown) */
    char   msg[512];      /* what failed */
    size_t ops_run;       /* operations executed */
} model_report;

/*
 * Run the sequence encoded in `bytes` on `loop` (a loop of this thread that
 * is not running: this call runs it) and check it.  `trace`, if not NULL,
 * receives one line per operation and per completed command.
 * Returns 0 if every check passed, else 1 with `rep` filled in.
 */
int model_check_bytes(ferry_loop *loop, const uint8_t *bytes, size_t len,
                      FILE *trace, model_report *rep);

/* The bytes of sequence `seed` (at most MODEL_HDR_BYTES + MODEL_MAX_OPS *
 * MODEL_OP_BYTES of them, written to `buf`); returns how many. */
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

/* A loop configured for the model (its own options: io polled rarely). */
int model_loop_new(ferry_loop **out);

#endif /* FERRY_MODEL_H */
