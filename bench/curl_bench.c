/* curl_bench.c - HTTP GETs through libcurl: N requests over C concurrent
 * transfers against a local server (bench/run-curl.sh starts
 * tests/http_server), one system per run:
 *
 *   ferry    one ferry loop, C tasks each performing its easy handle with
 *            ferry_curl_perform() (one multi handle, shared connections)
 *   threads  C threads, each with its easy handle and curl_easy_perform()
 *            (curl's blocking API; each handle keeps its own connection)
 *
 * Prints one line: system, requests, concurrency, seconds, requests/s,
 * p50 and p99 latency in microseconds, errors.
 *
 *   ferry-curl-bench ferry|threads URL [requests [concurrency]]
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry/curl.h"
#include "ferry/ferry.h"

static const char *url;
static long total = 10000;
static int conc = 100;
static atomic_long next_req;     /* requests handed out */
static atomic_long errors;
static int64_t *lat;             /* per request, ns */

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static size_t sink(char *d, size_t s, size_t n, void *arg)
{
    (void)d;
    (void)arg;
    return s * n;
}

static CURL *easy_new(void)
{
    CURL *e = curl_easy_init();

    if (!e)
        return NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    return e;
}

/* ---- ferry ------------------------------------------------------------ */

static int ferry_worker(void *arg)
{
    CURL *e = easy_new();
    long i;

    (void)arg;
    if (!e)
        return -ENOMEM;
    while ((i = atomic_fetch_add(&next_req, 1)) < total) {
        int64_t t0 = now_ns();
        long code = 0;

        if (ferry_curl_perform(e, NULL) != 0 ||
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK || code != 200)
            atomic_fetch_add(&errors, 1);
        lat[i] = now_ns() - t0;
    }
    curl_easy_cleanup(e);
    return 0;
}

static int ferry_main(void *arg)
{
    ferry_task **t = calloc((size_t)conc, sizeof *t);
    CURLM *m;

    (void)arg;
    if (!t || ferry_curl_multi(ferry_loop_current(), &m) != 0)
        return 1;
    /* As many connections as transfers, kept between them. */
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)conc);
    for (int i = 0; i < conc; i++)
        ferry_task_spawn(&t[i], NULL, ferry_worker, NULL, NULL);
    for (int i = 0; i < conc; i++)
        ferry_task_join(t[i], NULL);
    free(t);
    return 0;
}

/* ---- threads ---------------------------------------------------------- */

static void *thread_worker(void *arg)
{
    CURL *e = easy_new();
    long i;

    (void)arg;
    if (!e)
        return NULL;
    while ((i = atomic_fetch_add(&next_req, 1)) < total) {
        int64_t t0 = now_ns();
        long code = 0;

        if (curl_easy_perform(e) != CURLE_OK ||
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK || code != 200)
            atomic_fetch_add(&errors, 1);
        lat[i] = now_ns() - t0;
    }
    curl_easy_cleanup(e);
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int64_t t0, t1;
    int rc = 0;

    if (argc < 3) {
        fprintf(stderr, "usage: %s ferry|threads URL [requests [concurrency]]\n", argv[0]);
        return 2;
    }
    url = argv[2];
    if (argc > 3)
        total = atol(argv[3]);
    if (argc > 4)
        conc = atoi(argv[4]);
    lat = calloc((size_t)total, sizeof *lat);
    if (!lat || total <= 0 || conc <= 0)
        return 2;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    t0 = now_ns();
    if (strcmp(argv[1], "ferry") == 0) {
        rc = ferry_run(ferry_main, NULL);
    } else if (strcmp(argv[1], "threads") == 0) {
        pthread_t *th = calloc((size_t)conc, sizeof *th);

        for (int i = 0; th && i < conc; i++)
            pthread_create(&th[i], NULL, thread_worker, NULL);
        for (int i = 0; th && i < conc; i++)
            pthread_join(th[i], NULL);
        free(th);
    } else {
        return 2;
    }
    t1 = now_ns();
    qsort(lat, (size_t)total, sizeof *lat, cmp64);
    printf("%s requests=%ld concurrency=%d seconds=%.3f rps=%.0f p50_us=%.0f p99_us=%.0f errors=%ld\n",
           argv[1], total, conc, (double)(t1 - t0) / 1e9, (double)total / ((double)(t1 - t0) / 1e9),
           (double)lat[total / 2] / 1e3, (double)lat[total * 99 / 100] / 1e3,
           atomic_load(&errors));
    free(lat);
    curl_global_cleanup();
    return rc ? 1 : 0;
}
