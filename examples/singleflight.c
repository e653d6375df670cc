/* singleflight.c - one fetch per key however many tasks ask: the seed's
 * dict of in-flight Futures, as ferry_flight.
 *
 * The seed (asyncio, abridged):
 *
 *     if currency in _inflight:
 *         return await _inflight[currency]       # wait for the leader
 *     fut = loop.create_future(); _inflight[currency] = fut
 *     try:
 *         rate = await fetch_rate(currency); fut.set_result(rate)
 *     finally:
 *         _inflight.pop(currency, None)          # no leak
 *
 * ferry_flight_do() is all of that in one call: the first caller for a key
 * runs the function, the others wait and get a copy of its result, the
 * entry goes away when the call ends.  The seed's caveat, "if the leader is
 * cancelled, the waiters should retry themselves", is built in: a waiter
 * becomes the new leader.
 *
 * Last, the cache the fetches fill: 10,000 lookups that all hit it, each in
 * a task of its own.  Spawned the default way they are all alive at once,
 * each holding a stack; spawned with FERRY_SPAWN_EAGER each one runs at
 * once, ends, and gives its stack to the next.
 */
#include <stdio.h>
#include <string.h>

#include "examples.h"

#define REQUESTS 10000
#define KEYS     10
#define FETCH_MS 20

static ferry_flight inflight = FERRY_FLIGHT_INIT;
static int fetch_started, fetch_done;
static int answered, wrong;
static double cache[KEYS];          /* filled by the fetches */
static size_t max_alive;

/* The shared work: runs in the leader's task. */
static int fetch_rate(void *arg, void *out, size_t out_size)
{
    int key = *(int *)arg;
    fetch_started++;
    int rc = ferry_sleep(FERRY_MSEC(FETCH_MS));    /* the network call */
    if (rc)
        return rc;                                 /* cancelled: nothing shared */
    fetch_done++;
    *(double *)out = cache[key] = 90.0 + key;
    return 0;
}

static int get_rate(int key, double *rate)
{
    char name[16];
    int len = snprintf(name, sizeof name, "CUR%d", key);
    return ferry_flight_do(&inflight, name, (size_t)len, fetch_rate, &key,
                           rate, sizeof *rate);
}

static int request(void *arg)
{
    int key = (int)(intptr_t)arg;
    double rate = 0;
    int rc = get_rate(key, &rate);
    if (rc == 0) {
        answered++;
        if (rate != 90.0 + key)
            wrong++;
    }
    return rc;
}

/* A lookup that finds the rate in the cache. */
static int cached_lookup(void *arg)
{
    int key = (int)(intptr_t)arg;
    ferry_loop_stats stats;

    if (ferry_loop_stats_get(ferry_loop_current(), &stats) == 0 && stats.live_tasks > max_alive)
        max_alive = stats.live_tasks;
    if (cache[key] == 90.0 + key)
        answered++;
    return 0;
}

/* 10,000 cached lookups in tasks of their own; returns the most tasks
 * alive at once (this one included). */
static size_t lookups(unsigned flags)
{
    ferry_group group;
    ferry_task_opts opts = { .flags = flags };

    answered = 0;
    max_alive = 0;
    ferry_group_init(&group);
    for (int i = 0; i < REQUESTS; i++)
        if (ferry_group_spawn(&group, cached_lookup, (void *)(intptr_t)(i % KEYS), &opts))
            return 0;
    if (ferry_group_wait(&group) || answered != REQUESTS)
        return 0;
    return max_alive;
}

static int main_task(void *arg)
{
    ferry_group group;
    int64_t t0 = ferry_now();
    int bad = 0;

    /* 10,000 concurrent requests over 10 keys. */
    ferry_group_init(&group);
    for (int i = 0; i < REQUESTS; i++)
        bad |= ferry_group_spawn(&group, request, (void *)(intptr_t)(i % KEYS), NULL) != 0;
    bad |= ferry_group_wait(&group) != 0;
    printf("  %d requests over %d keys: %d fetches, %d answers (%d wrong), %.0f ms, "
           "%zu entries left\n", REQUESTS, KEYS, fetch_done, answered, wrong, ms_since(t0),
           ferry_flight_count(&inflight));
    bad |= fetch_done != KEYS || answered != REQUESTS || wrong != 0 ||
           ferry_flight_count(&inflight) != 0;

    /* The leader is cancelled in the middle of its fetch. */
    ferry_task *leader;
    fetch_started = fetch_done = answered = 0;
    ferry_group_init(&group);
    ferry_task_spawn(&leader, NULL, request, (void *)(intptr_t)3, &(ferry_task_opts){ .name = "leader" });
    ferry_yield();                                 /* the leader starts its fetch */
    for (int i = 0; i < 5; i++)
        bad |= ferry_group_spawn(&group, request, (void *)(intptr_t)3, NULL) != 0;
    ferry_sleep(FERRY_MSEC(FETCH_MS / 2));
    ferry_task_cancel(leader);
    int leader_status = 0;
    ferry_task_join(leader, &leader_status);
    bad |= ferry_group_wait(&group) != 0;
    printf("  leader cancelled mid-fetch: it got %s, its 5 waiters got %d answers "
           "from a new leader (%d fetches started, %d finished)\n",
           errname(leader_status), answered, fetch_started, fetch_done);
    bad |= leader_status != -ECANCELED || answered != 5 || fetch_started != 2 || fetch_done != 1;

    /* Cache hits: the default spawn against FERRY_SPAWN_EAGER. */
    size_t lazy = lookups(0), eager = lookups(FERRY_SPAWN_EAGER);
    printf("  %d cached lookups, a task each: at most %zu tasks alive spawned eagerly, "
           "%zu spawned the default way\n", REQUESTS, eager, lazy);
    bad |= lazy != REQUESTS + 1 || eager != 2;
    return bad;
}

int ex_singleflight(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_singleflight();
}
#endif
