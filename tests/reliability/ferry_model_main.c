/* ferry_model_main.c - ferry-model: run many random sequences through the
 * model-based tester (model.h) and report every failing one.
 *
 *   ferry-model [--offload] [--seqs N] [--seed S] [--ops M] [--replay SEQSEED]
 *               [--bytes FILE] [--save DIR] [--write-corpus DIR] [-v]
 *
 * --seqs N     sequences to check (default 100000; 0 is refused)
 * --seed S     run seed (default 1); sequence i uses model_seq_seed(S, i)
 * --ops M      at most M operations per sequence (default and max 200)
 * --replay X   run only the sequence with seed X (as printed on failure)
 * --bytes F    run only the sequence stored in file F (a regression)
 * --save DIR   write each failing sequence's bytes to DIR/fail-<seed>: the
 *              seed names a sequence of today's generator only, the bytes
 *              replay it for good (tests/reliability/corpus/regress-*)
 * -v           print the operation trace (with --replay or --bytes)
 * --offload    check the offload mode instead (model_offload.c: to_thread
 *              and to_thread_abandon with cancellation, on a pool of 1-3
 *              threads); its sequences are slower (every job is a real
 *              thread handoff), so CI runs fewer of them
 * --write-corpus DIR   write the bytes of the first --seqs sequences as
 *              files DIR/seq-<seed> (the fuzz target's seed corpus), and
 *              check them
 *
 * A failing sequence may leave tasks that never end on its loop: the loop
 * is put aside (never run or freed again) and the next sequence gets a new
 * one.  In the offload mode a job that does not settle may also leave pool
 * threads blocked: the run stops there.
 *
 * Prints "model: N sequences checked, F failed" last; exits 1 if F > 0 or
 * the run stopped early, 2 on bad usage.  A program of its own, not a
 * Criterion test, so without the shared teardown of testutil.c: each
 * sequence is checked against the model at every step and at its end (no
 * waiter left that could proceed, no callback run after its sequence);
 * test_model_regress replays single sequences under the shared teardown.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

/* Loops of failed sequences, kept reachable (a leak checker need not
 * report them) and never used again.  Past this many, the run stops. */
#define MAX_BROKEN 32
static ferry_loop *broken[MAX_BROKEN + 1];
static int nbroken;

static void usage(void)
{
    fprintf(stderr, "usage: ferry-model [--offload] [--seqs N] [--seed S] [--ops M] "
            "[--replay SEQSEED | --bytes FILE] [--save DIR] [--write-corpus DIR] [-v]\n");
    exit(2);
}

static int write_file(const char *path, const uint8_t *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(buf, 1, n, f) == n;

    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok)
        fprintf(stderr, "ferry-model: cannot write %s\n", path);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    uint64_t nseqs = 100000, run_seed = 1, replay = 0, failed = 0, checked = 0, i;
    bool have_replay = false, verbose = false, offload = false, stopped = false;
    const char *corpus = NULL, *bytes_file = NULL, *save = NULL;
    unsigned max_ops = MODEL_MAX_OPS;
    uint8_t buf[MODEL_MAX_BYTES];
    ferry_loop *loop;
    model_report rep;
    struct timespec t0, t1;
    int a;

    for (a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--seqs") && a + 1 < argc)
            nseqs = strtoull(argv[++a], NULL, 0);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc)
            run_seed = strtoull(argv[++a], NULL, 0);
        else if (!strcmp(argv[a], "--ops") && a + 1 < argc)
            max_ops = (unsigned)strtoul(argv[++a], NULL, 0);
        else if (!strcmp(argv[a], "--replay") && a + 1 < argc) {
            replay = strtoull(argv[++a], NULL, 0);
            have_replay = true;
        } else if (!strcmp(argv[a], "--bytes") && a + 1 < argc)
            bytes_file = argv[++a];
        else if (!strcmp(argv[a], "--save") && a + 1 < argc)
            save = argv[++a];
        else if (!strcmp(argv[a], "--write-corpus") && a + 1 < argc)
            corpus = argv[++a];
        else if (!strcmp(argv[a], "--offload"))
            offload = true;
        else if (!strcmp(argv[a], "-v"))
            verbose = true;
        else
            usage();
    }
    if (have_replay || bytes_file)
        nseqs = 1;
    if (nseqs == 0) {
        /* A run that checks nothing must not pass. */
        fprintf(stderr, "ferry-model: refusing to check 0 sequences\n");
        return 2;
    }
    if (max_ops == 0 || max_ops > MODEL_MAX_OPS)
        max_ops = MODEL_MAX_OPS;
    if (model_loop_new(&loop)) {
        fprintf(stderr, "ferry-model: cannot make a loop\n");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (i = 0; i < nseqs; i++) {
        uint64_t seed = have_replay ? replay : model_seq_seed(run_seed, i);
        size_t n;

        if (bytes_file) {
            FILE *f = fopen(bytes_file, "rb");
            if (!f) {
                fprintf(stderr, "ferry-model: cannot read %s\n", bytes_file);
                return 2;
            }
            n = fread(buf, 1, sizeof buf, f);
            fclose(f);
        } else {
            n = model_seed_bytes(seed, buf, MODEL_HDR_BYTES + max_ops * MODEL_OP_BYTES);
        }
        if (corpus) {
            char path[4096];
            snprintf(path, sizeof path, "%s/seq-%016" PRIx64, corpus, seed);
            if (write_file(path, buf, n))
                return 2;
        }

        checked++;
        if ((offload ? model_offload_check_bytes : model_check_bytes)(loop, buf, n,
                verbose ? stdout : NULL, &rep)) {
            failed++;
            if (bytes_file)
                printf("model: FAILED %s at op %d: %s\n", bytes_file, rep.op_index, rep.msg);
            else
                printf("model: FAILED seed 0x%016" PRIx64 " (sequence %" PRIu64 ") at op %d: %s\n",
                       seed, i, rep.op_index, rep.msg);
            if (!bytes_file)
                printf("model:   replay with: ferry-model%s --replay 0x%016" PRIx64 " -v\n",
                       offload ? " --offload" : "", seed);
            if (save && !bytes_file) {
                char path[4096];
                snprintf(path, sizeof path, "%s/fail-%016" PRIx64, save, seed);
                if (write_file(path, buf, n) == 0)
                    printf("model:   its bytes: %s (ferry-model%s --bytes %s -v)\n", path,
                           offload ? " --offload" : "", path);
            }
            fflush(stdout);
            if (offload && rep.stuck) {
                printf("model: a job did not settle; pool threads may be blocked for good: "
                       "stopping\n");
                stopped = true;
                break;
            }
            /* Its loop may hold tasks that never end: never run or free it
             * again. */
            broken[nbroken++] = loop;
            loop = NULL;
            if (i + 1 == nseqs)
                break;
            if (nbroken > MAX_BROKEN) {
                printf("model: %d failed sequences: stopping\n", nbroken);
                stopped = true;
                break;
            }
            if (model_loop_new(&loop)) {
                fprintf(stderr, "ferry-model: cannot make a loop\n");
                return 2;
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ferry_loop_free(loop);
    if (offload)
        model_offload_stats_print(stdout);
    if (getenv("FERRY_MODEL_STATS"))
        model_hist_print(stderr);
    if (model_stray_callbacks()) {
        printf("model: FAILED: %lu timer or posted callbacks ran after their sequence\n",
               model_stray_callbacks());
        failed++;
    }
    fprintf(stderr, "model: %.1f s\n",
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    printf("model%s: %" PRIu64 " sequences checked, %" PRIu64 " failed%s\n",
           offload ? " (offload)" : "", checked, failed, stopped ? " (stopped early)" : "");
    return failed || stopped ? 1 : 0;
}
