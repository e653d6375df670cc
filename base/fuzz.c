/* fuzz.c - schedule fuzzing's settings and the threads' random delays
 * (fuzz.h).
 * Thread: any.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fuzz.h"
#include "log.h"
#include "rand.h"

/* Loops made with fuzzing on, in the order they were made. */
static atomic_uint loops_made;

/* The threads' delays: off until started, then the settings never change. */
static atomic_bool threads_on;
static uint64_t threads_seed;
static uint32_t threads_p;
static atomic_uint threads_numbered;

/* Each thread's generator, seeded on its first delay. */
static __thread uint64_t thread_rng;
static __thread bool thread_seeded;

uint32_t ferry__fuzz_prob(double p)
{
    if (!(p > 0))
        return 0;
    if (p >= 1)
        return UINT32_MAX;
    return (uint32_t)(p * 4294967296.0);
}

bool ferry__fuzz_env(struct ferry__fuzz *out)
{
    static atomic_bool warned;
    const char *s = getenv("FERRY_FUZZ");
    unsigned long long seed;
    double p = FERRY__FUZZ_PROB_DEFAULT;
    char *end;

    if (!s || !*s || strcmp(s, "0") == 0 || strcmp(s, "off") == 0)
        return false;
    errno = 0;
    seed = strtoull(s, &end, 10);
    if (errno || end == s || seed == 0 || *s == '-')
        goto bad;
    if (*end == ',') {
        const char *ps = end + 1;

        p = strtod(ps, &end);
        if (end == ps || !(p >= 0 && p <= 1))
            goto bad;
    }
    if (*end)
        goto bad;
    out->seed = seed;
    out->p = ferry__fuzz_prob(p);
    out->prob = p;
    return true;

bad:
    if (!atomic_exchange(&warned, true))
        ferry__log(FERRY_LOG_WARN,
                   "FERRY_FUZZ=%s ignored: expected SEED or SEED,P "
                   "(SEED 1 to 2^64-1, P from 0 to 1)",
                   s);
    return false;
}

uint64_t ferry__fuzz_loop_seed(uint64_t seed, unsigned *nth)
{
    unsigned n = atomic_fetch_add_explicit(&loops_made, 1, memory_order_relaxed);
    uint64_t s = seed ^ ((uint64_t)n << 32);

    *nth = n;
    return n == 0 ? seed : ferry__rand_next(&s);
}

void ferry__fuzz_threads_start(const struct ferry__fuzz *f)
{
    static atomic_bool claimed;

    if (atomic_exchange(&claimed, true))
        return;
    threads_seed = f->seed;
    threads_p = f->p;
    /* Release: a thread that sees the flag sees the settings. */
    atomic_store_explicit(&threads_on, true, memory_order_release);
}

void ferry__fuzz_delay(void)
{
    struct timespec ts;
    uint64_t r;
    unsigned shift;

    if (__builtin_expect(!atomic_load_explicit(&threads_on, memory_order_acquire), 1))
        return;
    if (!thread_seeded) {
        unsigned n = atomic_fetch_add_explicit(&threads_numbered, 1, memory_order_relaxed);

        thread_rng = threads_seed ^ ((uint64_t)(n + 1) * 0xd1342543de82ef95u);
        thread_seeded = true;
    }
    r = ferry__rand_next(&thread_rng);
    if ((uint32_t)r >= threads_p)
        return;
    /* Spread over orders of magnitude: 1 microsecond up to about 2 ms, as
     * likely short as long, so that both near races and late completions
     * come up. */
    shift = (unsigned)((r >> 32) % 12);
    ts.tv_sec = 0;
    ts.tv_nsec = (long)(1000u << shift) + (long)((r >> 48) % 1000u);
    nanosleep(&ts, NULL);
}
