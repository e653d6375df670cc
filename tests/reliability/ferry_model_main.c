/* ferry_model_main.c - ferry-model: run many random sequences through the
 * model-based tester (model.h) and report every failing seed.
 *
 *   ferry-model [--seqs N] [--seed S] [--ops M] [--replay SEQSEED] [-v]
 *
 * --seqs N     sequences to check (default 100000)
 * --seed S     run seed (default 1); sequence i uses model_seq_seed(S, i)
 * --ops M      at most M operations per sequence (default and max 200)
 * --replay X   run only the sequence with seed X (as printed on failure)
 * -v           print the operation trace (with --replay)
 * --offload   check the offload mode instead (model_offload.c: to_thread and
 *              to_thread_abandon with cancellation, on a pool of 1-3
 *              threads); its sequences are slower (every job is a real
 *              thread handoff), so CI runs fewer of them
 * --write-corpus DIR   write the bytes of the first --seqs sequences as
 *              files DIR/seq-<seed> (the fuzz target's seed corpus), and
 *              check them
 *
 * Prints "model: N sequences checked, F failed" last; exits 1 if F > 0.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

static void usage(void)
{
    fprintf(stderr, "usage: ferry-model [--offload] [--seqs N] [--seed S] [--ops M] [--replay SEQSEED] [-v]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    uint64_t nseqs = 100000, run_seed = 1, replay = 0, failed = 0, i;
    bool have_replay = false, verbose = false, offload = false;
    const char *corpus = NULL;
    unsigned max_ops = MODEL_MAX_OPS;
    uint8_t buf[MODEL_HDR_BYTES + MODEL_MAX_OPS * MODEL_OP_BYTES];
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
        } else if (!strcmp(argv[a], "--write-corpus") && a + 1 < argc)
            corpus = argv[++a];
        else if (!strcmp(argv[a], "--offload"))
            offload = true;
        else if (!strcmp(argv[a], "-v"))
            verbose = true;
        else
            usage();
    }
    if (max_ops == 0 || max_ops > MODEL_MAX_OPS)
        max_ops = MODEL_MAX_OPS;
    if (model_loop_new(&loop)) {
        fprintf(stderr, "ferry-model: cannot make a loop\n");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (have_replay)
        nseqs = 1;
    for (i = 0; i < nseqs; i++) {
        uint64_t seed = have_replay ? replay : model_seq_seed(run_seed, i);
        size_t n = model_seed_bytes(seed, buf, MODEL_HDR_BYTES + max_ops * MODEL_OP_BYTES);

        if (corpus) {
            char path[4096];
            FILE *f;
            snprintf(path, sizeof path, "%s/seq-%016" PRIx64, corpus, seed);
            if (!(f = fopen(path, "wb")) || fwrite(buf, 1, n, f) != n) {
                fprintf(stderr, "ferry-model: cannot write %s\n", path);
                return 2;
            }
            fclose(f);
        }

        if ((offload ? model_offload_check_bytes : model_check_bytes)(loop, buf, n,
                verbose ? stdout : NULL, &rep)) {
            failed++;
            printf("model: FAILED seed 0x%016" PRIx64 " at op %d: %s\n", seed, rep.op_index,
                   rep.msg);
            printf("model:   replay with: ferry-model%s --replay 0x%016" PRIx64 " -v\n",
                   offload ? " --offload" : "", seed);
            fflush(stdout);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ferry_loop_free(loop);
    if (offload)
        model_offload_stats_print(stdout);
    if (getenv("FERRY_MODEL_STATS"))
        model_hist_print(stderr);
    fprintf(stderr, "model: %.1f s\n",
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    printf("model%s: %" PRIu64 " sequences checked, %" PRIu64 " failed\n",
           offload ? " (offload)" : "", nseqs, failed);
    return failed ? 1 : 0;
}
