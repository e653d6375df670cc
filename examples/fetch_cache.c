/* fetch_cache.c - a service that fetches from an upstream over HTTP with a
 * deadline and caches the answers, with singleflight in front of the
 * fetch so that a burst of requests for one key makes one upstream call.
 *
 * The asyncio shape it mirrors:
 *
 *     async def get(key):
 *         if key in cache: return cache[key]
 *         async with asyncio.timeout(0.2):
 *             body = await flight.do(key, lambda: http.get(UPSTREAM + key))
 *         cache[key] = body
 *         return body
 *
 * The upstream runs in this program too, on the same loop (a few lines of
 * HTTP on ferry's streams): it answers /item/NAME after a delay that the
 * name chooses ("slow" takes a second) and counts the requests it served.
 * 50 requests for "apple" arrive at once: one upstream fetch.  Then 20 for
 * "slow": one fetch, which the deadline ends, every caller told
 * -ETIMEDOUT at 200 ms instead of waiting a second, and nothing cached.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/curl.h"
#include "ferry/ferry.h"

#define DEADLINE_MS 200

/* ---- the upstream ----------------------------------------------------- */

static int upstream_port;
static int upstream_served;
static ferry_event upstream_stop;    /* set when the program ends */

/* The upstream's work: a delay, cut short when the program ends. */
static void upstream_delay(int64_t d)
{
    ferry_scope sc;

    ferry_scope_enter(&sc, ferry_now() + d, 0);
    ferry_event_wait(&upstream_stop);
    ferry_scope_exit(&sc);
}

static int upstream_conn(void *arg)
{
    ferry_stream *s = arg;
    char req[2048], resp[512], body[160];
    size_t n;

    while (ferry_stream_read_until(s, "\r\n\r\n", 4, req, sizeof req - 1, &n) == 0) {
        char path[128] = "";

        req[n] = '\0';
        sscanf(req, "GET %127s", path);
        upstream_delay(strstr(path, "slow") ? FERRY_SEC(1) : FERRY_MSEC(30));
        upstream_served++;
        snprintf(body, sizeof body, "value of %s", path + 6);
        n = (size_t)snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s",
                             strlen(body), body);
        if (ferry_stream_write(s, resp, n, NULL) != 0)
            break;
    }
    ferry_stream_close(s);
    return 0;
}

static int upstream(void *arg)
{
    ferry_listener *l = arg;
    ferry_group conns;
    ferry_stream *s;

    /* Its connections are its children: cancelling it ends them too. */
    ferry_group_init(&conns);
    while (ferry_listener_accept(l, &s, NULL) == 0)
        if (ferry_group_spawn(&conns, upstream_conn, s, NULL) != 0)
            ferry_stream_close(s);
    ferry_group_wait(&conns);
    return 0;
}

/* ---- the service: cache, singleflight, deadline ------------------------ */

struct entry {
    char  key[32];
    char *value;
};
static struct entry cache[16];
static int ncache;
static ferry_flight flight = FERRY_FLIGHT_INIT;

/* The shared fetch: runs in the leader's task, under its deadline.  Its
 * result is a heap string every caller of that flight receives. */
static int fetch(void *arg, void *out, size_t out_size)
{
    const char *key = arg;
    ferry_curl_result res;
    CURLcode code;
    char url[128];
    int rc;

    (void)out_size;
    snprintf(url, sizeof url, "http://127.0.0.1:%d/item/%s", upstream_port, key);
    rc = ferry_curl_get(url, &res, &code);
    if (rc == -EIO)
        fprintf(stderr, "fetch %s: %s\n", key, curl_easy_strerror(code));
    if (rc)
        return rc;
    if (res.status != 200) {
        ferry_curl_result_release(&res);
        return -EPROTO;
    }
    *(char **)out = res.body;   /* ownership goes to the cache */
    return 0;
}

static int get(const char *key, const char **value)
{
    ferry_scope sc;
    char *fetched = NULL;
    int rc;

    for (int i = 0; i < ncache; i++)
        if (strcmp(cache[i].key, key) == 0) {
            *value = cache[i].value;
            return 0;
        }
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(DEADLINE_MS), 0);
    rc = ferry_flight_do(&flight, key, strlen(key), fetch, (void *)key, &fetched, sizeof fetched);
    ferry_scope_exit(&sc);
    if (rc)
        return rc;
    /* Every caller of the flight gets the same pointer: the first to come
     * back stores it, the others find it stored. */
    for (int i = 0; i < ncache; i++)
        if (cache[i].value == fetched) {
            *value = fetched;
            return 0;
        }
    if (ncache < 16) {
        snprintf(cache[ncache].key, sizeof cache[ncache].key, "%s", key);
        cache[ncache++].value = fetched;
    }
    *value = fetched;
    return 0;
}

/* ---- clients --------------------------------------------------------- */

static int ok, timedout, wrong;

static int client(void *arg)
{
    const char *key = arg;
    const char *v;
    char want[64];
    int rc = get(key, &v);

    snprintf(want, sizeof want, "value of %s", key);
    if (rc == 0 && strcmp(v, want) == 0)
        ok++;
    else if (rc == -ETIMEDOUT)
        timedout++;
    else
        wrong++;
    return 0;
}

static int burst(const char *key, int n)
{
    ferry_task *t[64];
    int64_t t0 = ferry_now();

    for (int i = 0; i < n; i++)
        ferry_task_spawn(&t[i], NULL, client, (void *)key, NULL);
    for (int i = 0; i < n; i++)
        ferry_task_join(t[i], NULL);
    return (int)((ferry_now() - t0) / 1000000);
}

static int service(void *arg)
{
    ferry_listener *l;
    ferry_task *up;
    int ms, fail = 0;

    (void)arg;
    ferry_event_init(&upstream_stop);
    if (ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL) != 0)
        return 1;
    upstream_port = ferry_listener_port(l);
    ferry_task_spawn(&up, NULL, upstream, l, NULL);

    ms = burst("apple", 50);
    printf("50 requests for apple: %d ok, %d upstream fetch(es), %d ms\n", ok, upstream_served, ms);
    fail |= ok != 50 || upstream_served != 1;

    ok = 0;
    ms = burst("apple", 50);
    printf("50 more, from the cache: %d ok, %d upstream fetch(es) in all, %d ms\n", ok,
           upstream_served, ms);
    fail |= ok != 50 || upstream_served != 1;

    ok = 0;
    ms = burst("slow", 20);
    printf("20 requests for slow (upstream takes 1 s, deadline %d ms): %d timed out, %d ok, %d ms\n",
           DEADLINE_MS, timedout, ok, ms);
    fail |= timedout != 20 || ms > 900;
    fail |= wrong != 0;

    /* Stop the upstream: answers still being delayed go out at once, and
     * cancelling the upstream task ends its connections. */
    ferry_event_set(&upstream_stop);
    ferry_task_cancel(up);
    ferry_task_join(up, NULL);
    ferry_listener_close(l);
    for (int i = 0; i < ncache; i++)
        free(cache[i].value);
    ferry_flight_destroy(&flight);
    printf("%s\n", fail ? "FAILED" : "ok");
    return fail;
}

int main(void)
{
    return ferry_run(service, NULL) == 0 ? 0 : 1;
}
