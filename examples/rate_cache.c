/* rate_cache.c - the stampede-proof cache: check, lock, check again.
 *
 * The seed (asyncio):
 *
 *     async def get_rate(currency: str) -> Rate:
 *         if currency in _cache:
 *             return _cache[currency]
 *         async with _lock:
 *             if currency not in _cache:          # re-check under the lock
 *                 _cache[currency] = await fetch_rate(currency)
 *         return _cache[currency]
 *
 * Without the lock, ten concurrent requests on an empty cache make ten
 * fetches.  The first check keeps the hot path free of waiting; the second
 * closes the race.  One lock for the whole cache makes EUR wait for USD;
 * ferry_keylock gives each currency its own lock and frees it when unused.
 * fetch_rate() stands in for a 50 ms network call (a ferry_sleep()).
 */
#include <stdio.h>
#include <string.h>

#include "examples.h"

#define FETCH_MS 50

/* ---- a tiny cache: currency -> rate ------------------------------------ */

struct entry {
    char   currency[4];
    double rate;
};
static struct entry cache[8];
static int cached;
static int fetches;

static bool cache_get(const char *currency, double *out)
{
    for (int i = 0; i < cached; i++)
        if (strcmp(cache[i].currency, currency) == 0) {
            *out = cache[i].rate;
            return true;
        }
    return false;
}

static void cache_put(const char *currency, double rate)
{
    if (cached < 8) {
        snprintf(cache[cached].currency, sizeof cache[cached].currency, "%s", currency);
        cache[cached++].rate = rate;
    }
}

static void cache_clear(void)
{
    cached = 0;
    fetches = 0;
}

/* The slow source: a network call in real life. */
static int fetch_rate(const char *currency, double *out)
{
    int rc = ferry_sleep(FERRY_MSEC(FETCH_MS));
    if (rc)
        return rc;
    fetches++;
    *out = strcmp(currency, "USD") == 0 ? 92.5 : 99.8;
    return 0;
}

/* ---- three versions of get_rate ---------------------------------------- */

/* Check, suspend, act: every task that checked before the first fetch
 * ended fetches too. */
static int get_rate_naive(const char *currency, double *out)
{
    if (cache_get(currency, out))
        return 0;
    int rc = fetch_rate(currency, out);
    if (rc == 0)
        cache_put(currency, *out);
    return rc;
}

static ferry_lock cache_lock = FERRY_LOCK_INIT;

static int get_rate(const char *currency, double *out)
{
    if (cache_get(currency, out))               /* hot path: no lock, no switch */
        return 0;
    int rc = ferry_lock_acquire(&cache_lock);   /* async with _lock: */
    if (rc)
        return rc;
    if (!cache_get(currency, out)) {            /* re-check under the lock */
        rc = fetch_rate(currency, out);
        if (rc == 0)
            cache_put(currency, *out);
    }
    ferry_lock_release(&cache_lock);
    return rc;
}

static ferry_keylock key_locks = FERRY_KEYLOCK_INIT;

/* The same with one lock per currency. */
static int get_rate_per_key(const char *currency, double *out)
{
    if (cache_get(currency, out))
        return 0;
    int rc = ferry_keylock_acquire(&key_locks, currency, strlen(currency));
    if (rc)
        return rc;
    if (!cache_get(currency, out)) {
        rc = fetch_rate(currency, out);
        if (rc == 0)
            cache_put(currency, *out);
    }
    ferry_keylock_release(&key_locks, currency, strlen(currency));
    return rc;
}

/* ---- driving them ------------------------------------------------------ */

typedef int (*get_fn)(const char *currency, double *out);

struct request {
    get_fn      get;
    const char *currency;
};

static int request_task(void *arg)
{
    struct request *r = arg;
    double rate;
    return r->get(r->currency, &rate);
}

/* n concurrent requests, alternating over `currencies`; returns the
 * elapsed milliseconds, or -1 on a failure. */
static double run_requests(get_fn get, int n, const char **currencies, int ncur)
{
    struct request reqs[16];
    ferry_group group;
    int64_t t0 = ferry_now();

    ferry_group_init(&group);
    for (int i = 0; i < n; i++) {
        reqs[i] = (struct request){ get, currencies[i % ncur] };
        if (ferry_group_spawn(&group, request_task, &reqs[i], NULL))
            return -1;
    }
    if (ferry_group_wait(&group))
        return -1;
    return ms_since(t0);
}

static int main_task(void *arg)
{
    const char *usd[] = { "USD" }, *both[] = { "USD", "EUR" };
    int bad = 0;

    cache_clear();
    bad |= run_requests(get_rate_naive, 10, usd, 1) < 0;
    int naive = fetches;
    printf("  no lock:             10 concurrent requests for USD -> %d fetches\n", naive);

    cache_clear();
    bad |= run_requests(get_rate, 10, usd, 1) < 0;
    int locked = fetches;
    printf("  double-checked lock: 10 concurrent requests for USD -> %d fetch\n", locked);

    /* The hot path: a cached rate costs no lock and no task switch. */
    ferry_loop_stats before, after;
    ferry_loop_stats_get(ferry_loop_current(), &before);
    double rate;
    for (int i = 0; i < 1000; i++)
        bad |= get_rate("USD", &rate);
    ferry_loop_stats_get(ferry_loop_current(), &after);
    printf("  cached:              1000 lookups -> %d fetches, %llu task switches\n",
           fetches - locked, (unsigned long long)(after.steps - before.steps));

    cache_clear();
    double one_lock = run_requests(get_rate, 10, both, 2);
    int one_lock_fetches = fetches;
    cache_clear();
    double per_key = run_requests(get_rate_per_key, 10, both, 2);
    int per_key_fetches = fetches;
    printf("  one lock for the cache:  USD+EUR, 10 requests: %d fetches, %3.0f ms (EUR waited for USD)\n",
           one_lock_fetches, one_lock);
    printf("  a lock per key:          USD+EUR, 10 requests: %d fetches, %3.0f ms (side by side), "
           "%zu key locks left\n", per_key_fetches, per_key, ferry_keylock_count(&key_locks));

    return bad || naive != 10 || locked != 1 || after.steps != before.steps ||
           one_lock_fetches != 2 || per_key_fetches != 2 || per_key >= one_lock ||
           ferry_keylock_count(&key_locks) != 0;
}

int ex_rate_cache(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_rate_cache();
}
#endif
