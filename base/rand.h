/* rand.h - a small pseudo-random generator for the loop's choices.
 * Thread: any (the state is the caller's).
 *
 * splitmix64: one 64-bit word of state, any seed is good, and a stream is
 * fully given by its seed, so a choice made from it can be replayed.  Not
 * for anything that must be unpredictable.
 */
#ifndef FERRY_BASE_RAND_H
#define FERRY_BASE_RAND_H

#include <stdint.h>

/* The next number of the stream whose state is *s. */
static inline uint64_t ferry__rand_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* A number in [0, n), n > 0, from the stream *s.  The multiply-shift
 * mapping's bias is below n / 2^32, far below anything a test of fairness
 * could see. */
static inline uint32_t ferry__rand_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(((ferry__rand_next(s) >> 32) * (uint64_t)n) >> 32);
}

#endif /* FERRY_BASE_RAND_H */
