/* fuzz.h - schedule fuzzing's settings (FERRY_FUZZ, a loop's options) and
 * the random delays it adds on threads.
 * Thread: any.
 *
 * A loop draws its fuzzing choices from its own generator (base/rand.h),
 * seeded here; the delays of threads come from one generator per thread,
 * seeded from the same seed and the thread's number, so they vary with
 * the seed but do not replay (threads' timing never does).
 */
#ifndef FERRY_BASE_FUZZ_H
#define FERRY_BASE_FUZZ_H

#include <stdbool.h>
#include <stdint.h>

/* The probability used when none is given: one chance in ten. */
#define FERRY__FUZZ_PROB_DEFAULT 0.1

/* Fuzzing's settings: the seed (never 0) and the probability of a
 * spurious suspension or a delay, as a fraction of 2^32. */
struct ferry__fuzz {
    uint64_t seed;
    uint32_t p;
    double prob; /* p as given, for messages */
};

/* FERRY_FUZZ=seed[,p]: true and *out set if it is set to a valid value;
 * false if it is unset, empty, "0" or "off".  An invalid value is logged
 * once and reads as unset. */
bool ferry__fuzz_env(struct ferry__fuzz *out /* OUT */);

/* A probability in [0, 1] as a fraction of 2^32 (1 gives the largest). */
uint32_t ferry__fuzz_prob(double p);

/* The seed of the process's next fuzzed loop, and its number (0 for the
 * first): the given seed for loop 0, a mix of the seed and the number for
 * the others, so that a program with several loops replays loop by loop
 * when it makes them in the same order. */
uint64_t ferry__fuzz_loop_seed(uint64_t seed, unsigned *nth /* OUT */);

/* Start the threads' delays with these settings (the first call wins;
 * later calls do nothing). */
void ferry__fuzz_threads_start(const struct ferry__fuzz *f);

/* On a thread of the bridge (a pool worker, a poster): once the threads'
 * delays are started, sleep a random while (1 microsecond to about 2
 * milliseconds) with their probability; otherwise return at once. */
void ferry__fuzz_delay(void);

#endif /* FERRY_BASE_FUZZ_H */
