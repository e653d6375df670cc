/* tls_bench.c - TLS on ferry streams against libevent's bufferevent_openssl
 * (the choice docs/tls.md explains), in one process over loopback TCP.
 *
 *   ferry-tls-bench [-r RUNS] [-n ROUND_TRIPS] [-c CONNS] [-b BYTES]
 *                   [-C CIPHERSUITE] [-s SYSTEM] [WORKLOAD...]
 *
 * Each run does every workload (default: tls_echo tls_bulk) with both
 * systems (-s ferry or -s libevent-openssl: only that one, for a profiler),
 * one after the other, ferry first in odd runs and libevent first
 * in even ones, so that a drift of the machine's load spreads over both.
 * Each system's server and clients share one thread and one loop: system
 * ferry is a ferry loop with a task per connection on ferry_tls_server()
 * and ferry_tls_client() streams; system libevent-openssl is an event_base
 * with bufferevent_openssl_socket_new() bufferevents and callbacks (the
 * textbook echo: the read callback moves the input to the output).
 *
 *   tls_echo  CONNS (50) connections each send a 64-byte slice of a
 *             pattern and wait for its echo before sending the next, all
 *             at once; n = round trips in total (100,000).  Extras:
 *             conns=, p50_us=, p99_us= (round-trip latency).
 *   tls_bulk  one connection writes BYTES (64 MiB) of the pattern, 64 KiB
 *             at a time, as fast as TLS takes it, while reading the echo
 *             back; n = bytes one way.  Extra: mb_per_s= (10^6 bytes/s).
 *
 * Both sides use TLS 1.3 only with one cipher suite (-C, default
 * TLS_AES_128_GCM_SHA256), a P-256 certificate for localhost signed by a
 * CA made at start (tests/tls_certs.c), and a client that verifies the
 * chain and the name.  Handshakes and the closing are outside the timed
 * part, which runs from the moment every connection has finished its
 * handshake until the last echoed byte came back.  Extras tls= and
 * cipher= are what the handshakes negotiated, load1= the load average
 * when the run began.  check=ok needs every echoed byte equal to the
 * pattern, no connection error on either side, and every handshake on
 * the requested suite.  rss_kb is the peak of the whole process so far
 * (both systems run in it).
 *
 * stdout: a BENCH line per workload, system and run, then the medians
 * and the ratios ferry / libevent-openssl as a markdown table.  Exit
 * status: 0 if every check was ok, 1 otherwise, 2 on usage errors.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <ferry/ferry.h>

#include "tls_certs.h"

#define SYS_FERRY "ferry"
#define SYS_LEV   "libevent-openssl"
#define MSG       64                  /* tls_echo's message */
#define CHUNK     (64 * 1024)         /* tls_bulk's writes and every read buffer */
#define PERIOD    65521               /* the pattern's period: a prime */
#define HIGH_WATER (1u << 20)         /* libevent server: stop reading above */
#define LOW_WATER  (HIGH_WATER / 2)   /* ... until the output drains to this */
#define BULK_QUEUE (256 * 1024)       /* libevent bulk client: output kept to */
#define MAX_RUNS  99

/* ---- common ------------------------------------------------------------ */

static unsigned char pattern[PERIOD + CHUNK];

/* Settings from the command line. */
static int  conns = 50;
static long round_trips = 100000;
static long bulk_bytes = 64L * 1024 * 1024;
static const char *suite = "TLS_AES_128_GCM_SHA256";
static struct tc_files certs;

/* What one workload run of one system found. */
struct result {
    long   done;         /* round trips, or bytes echoed back */
    long   bad;          /* reads that did not match the pattern */
    long   errors;       /* connections that ended in an error */
    double secs;
    float *lat;          /* tls_echo: latency of each round trip, us */
};

/* The handshakes of the current run, seen by info_cb(). */
static char hs_cipher[64], hs_version[16];
static bool hs_mixed;    /* a handshake agreed on another suite or version */

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The process's CPU time when the timed part began and ended: both
 * systems run in this one thread, so it is what a round trip or a byte
 * cost, whatever share of the machine the process got. */
static int64_t cpu0, cpu1;

static int64_t cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t clock_start(void)
{
    cpu0 = cpu_ns();
    return now_ns();
}

static int64_t clock_stop(void)
{
    cpu1 = cpu_ns();
    return now_ns();
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "ferry-tls-bench: %s: %s\n", what, why);
    exit(1);
}

static void make_pattern(void)
{
    for (size_t i = 0; i < sizeof pattern; i++) {
        uint32_t x = (uint32_t)(i % PERIOD);

        pattern[i] = (unsigned char)((x * 40503u + (x >> 7) * 977u) >> 5);
    }
}

/* The pattern offset of message `r` of connection `c` (tls_echo). */
static size_t msg_off(int c, long r)
{
    return (size_t)(((long)c * 7919 + r * MSG) % PERIOD);
}

/* Compare what came back at stream offset `pos` with the pattern. */
static bool bulk_ok(const unsigned char *buf, size_t len, long pos)
{
    return memcmp(buf, pattern + pos % PERIOD, len) == 0;
}

/* Every handshake of both systems ends here (SSL_CTX_set_info_callback):
 * keep the suite and the version, and notice one that differs. */
static void info_cb(const SSL *ssl, int where, int ret)
{
    const char *c, *v;

    (void)ret;
    if (!(where & SSL_CB_HANDSHAKE_DONE))
        return;
    c = SSL_get_cipher_name(ssl);
    v = SSL_get_version(ssl);
    if (!hs_cipher[0]) {
        snprintf(hs_cipher, sizeof hs_cipher, "%s", c);
        snprintf(hs_version, sizeof hs_version, "%s", v);
    } else if (strcmp(hs_cipher, c) != 0 || strcmp(hs_version, v) != 0) {
        hs_mixed = true;
    }
}

/* TLS 1.3 only, with the one suite, on either system's SSL_CTX. */
static void tune_ctx(SSL_CTX *ctx)
{
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(ctx, suite))
        die("SSL_CTX", "cannot set TLS 1.3 with that cipher suite");
    SSL_CTX_set_info_callback(ctx, info_cb);
}

static double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");

    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;

    return (x > y) - (x < y);
}

static long peak_rss_kb(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* ---- ferry: tasks on TLS streams ---------------------------------------- */

static struct {
    ferry_tls_ctx *srv, *cli;
    int            port;
    ferry_listener *l;
    bool           bulk;
    ferry_event    start;     /* set when every client has done its handshake */
    int            arrived;   /* clients past their handshake (or failed) */
    int            finished;  /* clients done with their round trips */
    int64_t        t0, t1;
    struct result *res;
} F;

/* A client's handshake is over (rc 0) or failed: the last one starts the
 * clock and the others; the rest wait for it. */
static void f_arrive(int rc)
{
    if (rc)
        F.res->errors++;
    if (++F.arrived == (F.bulk ? 1 : conns)) {
        F.t0 = clock_start();
        ferry_event_set(&F.start);
    } else if (rc == 0) {
        ferry_event_wait(&F.start);
    }
}

static void f_error(const char *who, int rc, ferry_stream *s)
{
    const char *why = s ? ferry_tls_last_error(s) : NULL;

    F.res->errors++;
    fprintf(stderr, "ferry-tls-bench: ferry %s: %s%s%s\n", who, strerror(-rc),
            why && *why ? ": " : "", why && *why ? why : "");
}

/* One server connection: read what comes, write it back, until the
 * client's close_notify; then answer with ours. */
static int f_server_conn(void *arg)
{
    ferry_stream *s = arg, *tls;
    unsigned char *buf = malloc(CHUNK);
    size_t n = 0;
    int rc = buf ? ferry_tls_server(&tls, s, F.srv) : -ENOMEM;

    while (rc == 0 && (rc = ferry_stream_read(tls, buf, CHUNK, &n)) == 0 && n > 0)
        rc = ferry_stream_write(tls, buf, n, NULL);
    if (rc)
        f_error("server", rc, s);
    else
        ferry_stream_shutdown(tls);
    ferry_stream_close(s);
    free(buf);
    return 0;
}

/* Accept until main closes the listener; the connections are children of
 * this task's group, so joining it means every one has ended. */
static int f_acceptor(void *arg)
{
    ferry_group g;
    ferry_stream *s;

    (void)arg;
    ferry_group_init(&g);
    while (ferry_listener_accept(F.l, &s, NULL) == 0)
        if (ferry_group_spawn(&g, f_server_conn, s, NULL) != 0) {
            f_error("spawn", -ENOMEM, NULL);
            ferry_stream_close(s);
        }
    ferry_group_wait(&g);
    return 0;
}

/* After the timed part: close_notify, then wait for the server's. */
static void f_close(ferry_stream *s, ferry_stream *tls)
{
    unsigned char b[MSG];
    size_t n;
    int rc = ferry_stream_shutdown(tls);

    if (rc == 0 && (rc = ferry_stream_read(tls, b, sizeof b, &n)) == 0 && n != 0)
        rc = -EPROTO;
    if (rc)
        f_error("client close", rc, tls);
    ferry_stream_close(s);
}

static int f_echo_client(void *arg)
{
    int id = (int)(intptr_t)arg;
    long rounds = round_trips / conns;
    unsigned char buf[MSG];
    ferry_stream *s, *tls = NULL;
    int rc = ferry_tcp_connect(&s, "127.0.0.1", F.port, NULL);

    if (rc) {
        f_error("connect", rc, NULL);
        f_arrive(-1);
        return 0;
    }
    rc = ferry_tls_client(&tls, s, F.cli, "localhost");
    if (rc)
        f_error("client handshake", rc, s);
    f_arrive(rc ? -1 : 0);
    for (long r = 0; rc == 0 && r < rounds; r++) {
        size_t off = msg_off(id, r);
        int64_t t = now_ns();

        rc = ferry_stream_write(tls, pattern + off, MSG, NULL);
        if (rc == 0)
            rc = ferry_stream_read_exactly(tls, buf, MSG, NULL);
        if (rc) {
            f_error("client", rc, s);
            break;
        }
        F.res->lat[F.res->done++] = (float)((double)(now_ns() - t) * 1e-3);
        if (memcmp(buf, pattern + off, MSG) != 0)
            F.res->bad++;
    }
    if (++F.finished == conns)
        F.t1 = clock_stop();
    if (rc == 0)
        f_close(s, tls);
    else
        ferry_stream_close(s);
    return 0;
}

/* tls_bulk's reader: the echo back, against the pattern. */
static int f_bulk_reader(void *arg)
{
    ferry_stream *tls = arg;
    unsigned char *buf = malloc(CHUNK);
    size_t n;
    int rc = buf ? 0 : -ENOMEM;

    while (rc == 0 && F.res->done < bulk_bytes) {
        size_t want = (size_t)(bulk_bytes - F.res->done) < CHUNK
                          ? (size_t)(bulk_bytes - F.res->done) : CHUNK;

        rc = ferry_stream_read(tls, buf, want, &n);
        if (rc == 0 && n == 0)
            rc = -ENODATA;
        if (rc == 0) {
            if (!bulk_ok(buf, n, F.res->done))
                F.res->bad++;
            F.res->done += (long)n;
        }
    }
    F.t1 = clock_stop();
    if (rc == 0 && (rc = ferry_stream_read(tls, buf, CHUNK, &n)) == 0 && n != 0)
        rc = -EPROTO;    /* bytes beyond what was sent */
    if (rc)
        f_error("bulk reader", rc, tls);
    free(buf);
    return 0;
}

static int f_bulk_client(void *arg)
{
    ferry_stream *s, *tls = NULL;
    ferry_group g;
    int rc = ferry_tcp_connect(&s, "127.0.0.1", F.port, NULL);

    (void)arg;
    if (rc) {
        f_error("connect", rc, NULL);
        f_arrive(-1);
        return 0;
    }
    rc = ferry_tls_client(&tls, s, F.cli, "localhost");
    if (rc)
        f_error("client handshake", rc, s);
    f_arrive(rc ? -1 : 0);
    if (rc) {
        ferry_stream_close(s);
        return 0;
    }
    ferry_group_init(&g);
    if (ferry_group_spawn(&g, f_bulk_reader, tls, NULL) != 0)
        f_error("spawn", -ENOMEM, NULL);
    for (long off = 0; rc == 0 && off < bulk_bytes; off += CHUNK) {
        size_t len = bulk_bytes - off < CHUNK ? (size_t)(bulk_bytes - off) : CHUNK;

        rc = ferry_stream_write(tls, pattern + off % PERIOD, len, NULL);
    }
    if (rc)
        f_error("bulk writer", rc, s);
    else if ((rc = ferry_stream_shutdown(tls)) != 0)    /* close_notify */
        f_error("bulk shutdown", rc, s);
    ferry_group_wait(&g);
    ferry_stream_close(s);
    return 0;
}

static int f_main(void *arg)
{
    ferry_task *acceptor;
    ferry_group g;
    int rc;

    (void)arg;
    if ((rc = ferry_tcp_listen(&F.l, NULL, "127.0.0.1", 0, NULL)) != 0)
        die("ferry_tcp_listen", strerror(-rc));
    F.port = ferry_listener_port(F.l);
    ferry_event_init(&F.start);
    if ((rc = ferry_task_spawn(&acceptor, NULL, f_acceptor, NULL, NULL)) != 0)
        die("ferry_task_spawn", strerror(-rc));
    ferry_group_init(&g);
    for (int i = 0; i < (F.bulk ? 1 : conns); i++)
        if ((rc = ferry_group_spawn(&g, F.bulk ? f_bulk_client : f_echo_client,
                                    (void *)(intptr_t)i, NULL)) != 0)
            die("ferry_group_spawn", strerror(-rc));
    ferry_group_wait(&g);
    ferry_listener_close(F.l);
    ferry_task_join(acceptor, NULL);
    ferry_event_destroy(&F.start);
    return 0;
}

static void run_ferry(bool bulk, struct result *res)
{
    int rc;

    F.bulk = bulk;
    F.res = res;
    F.arrived = F.finished = 0;
    F.t0 = F.t1 = 0;
    if ((rc = ferry_run(f_main, NULL)) != 0)
        die("ferry_run", strerror(-rc));
    res->secs = (double)(F.t1 - F.t0) * 1e-9;
}

/* ---- libevent: bufferevent_openssl and callbacks ------------------------ */

struct lconn {
    struct bufferevent *bev;
    int     id;
    long    round;      /* tls_echo: messages echoed so far */
    int64_t sent_at;    /* tls_echo: when the current message was written */
    long    queued;     /* tls_bulk: bytes handed to the bufferevent */
    bool    up;         /* the handshake completed */
};

static struct {
    SSL_CTX *srv, *cli;
    struct event_base *base;
    struct evconnlistener *l;
    bool           bulk;
    int            accepted;
    int            arrived, finished;
    struct lconn  *c;
    int64_t        t0, t1;
    struct result *res;
    unsigned char  buf[CHUNK];
} L;

static void l_error(const char *who, struct bufferevent *bev, short what)
{
    unsigned long e = bufferevent_get_openssl_error(bev);
    char why[256] = "";

    if (e)
        ERR_error_string_n(e, why, sizeof why);
    else if (what & BEV_EVENT_ERROR)
        snprintf(why, sizeof why, "%s", strerror(EVUTIL_SOCKET_ERROR()));
    else
        snprintf(why, sizeof why, "end of stream");
    L.res->errors++;
    fprintf(stderr, "ferry-tls-bench: libevent %s: %s\n", who, why);
}

/* Send close_notify (bufferevent_free() does not), then free. */
static void l_close(struct bufferevent *bev)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);

    if (ssl)
        SSL_shutdown(ssl);
    bufferevent_free(bev);
}

/* ---- server: the echo, with a bound on the output ---- */

static void l_srv_read(struct bufferevent *bev, void *arg);
static void l_srv_event(struct bufferevent *bev, short what, void *arg);

/* Called (only while paused) once the output has drained to LOW_WATER. */
static void l_srv_write(struct bufferevent *bev, void *arg)
{
    (void)arg;
    bufferevent_setcb(bev, l_srv_read, NULL, l_srv_event, NULL);
    bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
    bufferevent_enable(bev, EV_READ);
}

static void l_srv_read(struct bufferevent *bev, void *arg)
{
    struct evbuffer *out = bufferevent_get_output(bev);

    (void)arg;
    evbuffer_add_buffer(out, bufferevent_get_input(bev));
    if (evbuffer_get_length(out) > HIGH_WATER) {
        bufferevent_disable(bev, EV_READ);
        bufferevent_setwatermark(bev, EV_WRITE, LOW_WATER, 0);
        bufferevent_setcb(bev, l_srv_read, l_srv_write, l_srv_event, NULL);
    }
}

/* The client's close_notify is EOF, and then the server sends its own. */
static void l_srv_event(struct bufferevent *bev, short what, void *arg)
{
    (void)arg;
    if (what & BEV_EVENT_ERROR)
        l_error("server", bev, what);
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        l_close(bev);
}

static void l_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                     int socklen, void *arg)
{
    int one = 1;
    SSL *ssl = SSL_new(L.srv);
    struct bufferevent *bev;

    (void)sa;
    (void)socklen;
    (void)arg;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    bev = ssl ? bufferevent_openssl_socket_new(evconnlistener_get_base(l), fd, ssl,
                                               BUFFEREVENT_SSL_ACCEPTING,
                                               BEV_OPT_CLOSE_ON_FREE)
              : NULL;
    if (!bev) {
        SSL_free(ssl);
        evutil_closesocket(fd);
        L.res->errors++;
        return;
    }
    bufferevent_setcb(bev, l_srv_read, NULL, l_srv_event, NULL);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    if (++L.accepted == (L.bulk ? 1 : conns)) {
        evconnlistener_free(L.l);
        L.l = NULL;
    }
}

/* ---- clients ---- */

static void l_echo_send(struct lconn *c)
{
    c->sent_at = now_ns();
    bufferevent_write(c->bev, pattern + msg_off(c->id, c->round), MSG);
}

/* Keep the bulk client's output at BULK_QUEUE bytes, by reference to the
 * pattern (no copy into the evbuffer). */
static void l_bulk_fill(struct lconn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);

    while (c->queued < bulk_bytes && evbuffer_get_length(out) < BULK_QUEUE) {
        size_t len = bulk_bytes - c->queued < CHUNK ? (size_t)(bulk_bytes - c->queued) : CHUNK;

        evbuffer_add_reference(out, pattern + c->queued % PERIOD, len, NULL, NULL);
        c->queued += (long)len;
    }
}

static void l_finish(struct lconn *c)
{
    if (++L.finished == (L.bulk ? 1 : conns))
        L.t1 = clock_stop();
    l_close(c->bev);
    c->bev = NULL;
}

static void l_cli_read(struct bufferevent *bev, void *arg)
{
    struct lconn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    if (L.bulk) {
        int n;

        while ((n = evbuffer_remove(in, L.buf, CHUNK)) > 0) {
            if (L.res->done + n > bulk_bytes || !bulk_ok(L.buf, (size_t)n, L.res->done))
                L.res->bad++;
            L.res->done += n;
        }
        if (L.res->done >= bulk_bytes)
            l_finish(c);
        return;
    }
    while (evbuffer_get_length(in) >= MSG) {
        evbuffer_remove(in, L.buf, MSG);
        L.res->lat[L.res->done++] = (float)((double)(now_ns() - c->sent_at) * 1e-3);
        if (memcmp(L.buf, pattern + msg_off(c->id, c->round), MSG) != 0)
            L.res->bad++;
        if (++c->round == round_trips / conns) {
            l_finish(c);
            return;
        }
        l_echo_send(c);
    }
}

static void l_cli_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    if (L.bulk)
        l_bulk_fill(arg);
}

/* A handshake is over: the last client starts the clock and the sends. */
static void l_arrive(void)
{
    if (++L.arrived != (L.bulk ? 1 : conns))
        return;
    L.t0 = clock_start();
    for (int i = 0; i < (L.bulk ? 1 : conns); i++) {
        if (!L.c[i].up)
            continue;
        if (L.bulk)
            l_bulk_fill(&L.c[i]);
        else
            l_echo_send(&L.c[i]);
    }
}

static void l_cli_event(struct bufferevent *bev, short what, void *arg)
{
    struct lconn *c = arg;

    if (what & BEV_EVENT_CONNECTED) {
        c->up = true;
        l_arrive();
        return;
    }
    l_error("client", bev, what);
    if (!c->up)
        l_arrive();
    else if (++L.finished == (L.bulk ? 1 : conns))
        L.t1 = clock_stop();
    bufferevent_free(bev);
    c->bev = NULL;
}

static void l_connect(struct lconn *c, const struct sockaddr_in *sin)
{
    int one = 1;
    SSL *ssl = SSL_new(L.cli);

    if (!ssl || !SSL_set_tlsext_host_name(ssl, "localhost") || !SSL_set1_host(ssl, "localhost"))
        die("SSL_new", "client");
    c->bev = bufferevent_openssl_socket_new(L.base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                            BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev)
        die("bufferevent_openssl_socket_new", "client");
    bufferevent_setcb(c->bev, l_cli_read, l_cli_write, l_cli_event, c);
    if (L.bulk)
        bufferevent_setwatermark(c->bev, EV_WRITE, BULK_QUEUE / 2, 0);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(c->bev, (const struct sockaddr *)sin, sizeof *sin) != 0)
        die("bufferevent_socket_connect", strerror(errno));
    setsockopt(bufferevent_getfd(c->bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void run_libevent(bool bulk, struct result *res)
{
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof sin;
    int n = bulk ? 1 : conns;

    L.bulk = bulk;
    L.res = res;
    L.accepted = L.arrived = L.finished = 0;
    L.t0 = L.t1 = 0;
    L.base = event_base_new();
    L.c = calloc((size_t)n, sizeof *L.c);
    if (!L.base || !L.c)
        die("event_base_new", "out of memory");
    L.l = evconnlistener_new_bind(L.base, l_accept, NULL, LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE,
                                  -1, (struct sockaddr *)&sin, sizeof sin);
    if (!L.l || getsockname(evconnlistener_get_fd(L.l), (struct sockaddr *)&sin, &len) != 0)
        die("evconnlistener_new_bind", strerror(errno));
    for (int i = 0; i < n; i++) {
        L.c[i].id = i;
        l_connect(&L.c[i], &sin);
    }
    event_base_dispatch(L.base);
    if (L.l)
        evconnlistener_free(L.l);
    for (int i = 0; i < n; i++)
        if (L.c[i].bev)
            bufferevent_free(L.c[i].bev);
    free(L.c);
    event_base_free(L.base);
    res->secs = (double)(L.t1 - L.t0) * 1e-9;
}

/* ---- runs, lines, medians ---------------------------------------------- */

static const char *const workloads[] = { "tls_echo", "tls_bulk" };
static const char *const systems[] = { SYS_FERRY, SYS_LEV };

/* One BENCH line's figures, kept for the medians. */
struct figures {
    double ops_per_s, p50, p99, mb_per_s, cpu_ns_per_op, load;
};

static struct figures fig[2][2][MAX_RUNS];    /* [workload][system][run] */

/* Run one workload on one system and print its line; returns true if ok. */
static bool run_one(int w, int sys, int run)
{
    bool bulk = w == 1;
    long n = bulk ? bulk_bytes : round_trips / conns * conns;
    struct result res = { 0 };
    struct figures *f = &fig[w][sys][run];
    char extra[256];
    bool ok;

    f->load = load1();
    if (!bulk && !(res.lat = malloc((size_t)n * sizeof *res.lat)))
        die("malloc", "latencies");
    hs_cipher[0] = hs_version[0] = '\0';
    hs_mixed = false;
    cpu0 = cpu1 = 0;
    alarm(300);    /* a hang ends the process rather than the machine's patience */
    if (sys == 0)
        run_ferry(bulk, &res);
    else
        run_libevent(bulk, &res);
    alarm(0);
    ok = res.done == n && res.bad == 0 && res.errors == 0 && !hs_mixed &&
         strcmp(hs_cipher, suite) == 0 && strcmp(hs_version, "TLSv1.3") == 0 && res.secs > 0;
    f->ops_per_s = res.secs > 0 ? (double)res.done / res.secs : 0;
    f->cpu_ns_per_op = res.done ? (double)(cpu1 - cpu0) / (double)res.done : 0;
    if (bulk) {
        f->mb_per_s = f->ops_per_s * 1e-6;
        snprintf(extra, sizeof extra, "mb_per_s=%.1f", f->mb_per_s);
    } else {
        qsort(res.lat, (size_t)res.done, sizeof *res.lat, cmp_float);
        f->p50 = res.done ? res.lat[(size_t)(0.50 * (double)(res.done - 1))] : 0;
        f->p99 = res.done ? res.lat[(size_t)(0.99 * (double)(res.done - 1))] : 0;
        snprintf(extra, sizeof extra, "conns=%d p50_us=%.1f p99_us=%.1f", conns, f->p50, f->p99);
    }
    printf("BENCH workload=%s system=%s n=%ld seconds=%.6f ns_per_op=%.2f ops_per_s=%.0f "
           "rss_kb=%ld check=%s %s cpu_ns_per_op=%.2f tls=%s cipher=%s load1=%.2f run=%d\n",
           workloads[w], systems[sys], n, res.secs, res.done ? res.secs * 1e9 / (double)res.done : 0,
           f->ops_per_s, peak_rss_kb(), ok ? "ok" : "FAIL", extra, f->cpu_ns_per_op,
           hs_version[0] ? hs_version : "none", hs_cipher[0] ? hs_cipher : "none", f->load,
           run + 1);
    if (!ok)
        fprintf(stderr, "ferry-tls-bench: %s %s: %ld of %ld, %ld bad reads, %ld errors%s\n",
                workloads[w], systems[sys], res.done, n, res.bad, res.errors,
                hs_mixed ? ", mixed suites" : "");
    fflush(stdout);
    free(res.lat);
    return ok;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The median of field `off` of fig[w][sys][0..runs). */
static double median(int w, int sys, int runs, size_t off)
{
    double v[MAX_RUNS];

    for (int i = 0; i < runs; i++)
        memcpy(&v[i], (const char *)&fig[w][sys][i] + off, sizeof v[i]);
    qsort(v, (size_t)runs, sizeof *v, cmp_double);
    return runs % 2 ? v[runs / 2] : (v[runs / 2 - 1] + v[runs / 2]) / 2;
}

static void print_medians(const bool *want, int runs)
{
    double lo = 1e9, hi = -1;

    for (int w = 0; w < 2; w++)
        for (int s = 0; s < 2; s++)
            for (int i = 0; want[w] && i < runs; i++) {
                lo = fig[w][s][i].load < lo ? fig[w][s][i].load : lo;
                hi = fig[w][s][i].load > hi ? fig[w][s][i].load : hi;
            }
    printf("\nMedians of %d run%s, load average (1 min) %.2f to %.2f:\n\n", runs,
           runs == 1 ? "" : "s", lo, hi);
    if (want[0]) {
        double r[2], p50[2], p99[2], cpu[2];

        printf("| tls_echo (%d connections, %d-byte ping-pong) | round trips/s | p50 us | p99 us "
               "| CPU us per round trip |\n|---|---|---|---|---|\n", conns, MSG);
        for (int s = 0; s < 2; s++) {
            r[s] = median(0, s, runs, offsetof(struct figures, ops_per_s));
            p50[s] = median(0, s, runs, offsetof(struct figures, p50));
            p99[s] = median(0, s, runs, offsetof(struct figures, p99));
            cpu[s] = median(0, s, runs, offsetof(struct figures, cpu_ns_per_op));
            printf("| %s | %.0f | %.1f | %.1f | %.1f |\n", systems[s], r[s], p50[s], p99[s],
                   cpu[s] * 1e-3);
        }
        printf("| ferry / libevent-openssl | %.2fx | %.2fx | %.2fx | %.2fx |\n\n", r[0] / r[1],
               p50[0] / p50[1], p99[0] / p99[1], cpu[0] / cpu[1]);
    }
    if (want[1]) {
        double m[2], cpu[2];

        printf("| tls_bulk (one connection, %ld MiB each way) | MB/s | CPU ns per byte |\n"
               "|---|---|---|\n", bulk_bytes >> 20);
        for (int s = 0; s < 2; s++) {
            m[s] = median(1, s, runs, offsetof(struct figures, mb_per_s));
            cpu[s] = median(1, s, runs, offsetof(struct figures, cpu_ns_per_op));
            printf("| %s | %.1f | %.2f |\n", systems[s], m[s], cpu[s]);
        }
        printf("| ferry / libevent-openssl | %.2fx | %.2fx |\n", m[0] / m[1], cpu[0] / cpu[1]);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: ferry-tls-bench [-r RUNS] [-n ROUND_TRIPS] [-c CONNS] [-b BYTES] "
                    "[-C CIPHERSUITE] [-s ferry|libevent-openssl] [tls_echo] [tls_bulk]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    bool want[2] = { false, false }, all_ok = true;
    int only = -1;    /* -s: the one system to run */
    int runs = 5, opt, rc;
    SSL_CTX *sc, *cc;

    while ((opt = getopt(argc, argv, "r:n:c:b:C:s:h")) != -1) {
        switch (opt) {
        case 'r': runs = atoi(optarg); break;
        case 'n': round_trips = atol(optarg); break;
        case 'c': conns = atoi(optarg); break;
        case 'b': bulk_bytes = atol(optarg); break;
        case 'C': suite = optarg; break;
        case 's':
            only = strcmp(optarg, SYS_FERRY) == 0 ? 0 : strcmp(optarg, SYS_LEV) == 0 ? 1 : -2;
            if (only < 0)
                usage();
            break;
        default: usage();
        }
    }
    if (runs < 1 || runs > MAX_RUNS || conns < 1 || round_trips < conns || bulk_bytes < 1)
        usage();
    for (int i = optind; i < argc; i++) {
        int w = strcmp(argv[i], "tls_echo") == 0 ? 0 : strcmp(argv[i], "tls_bulk") == 0 ? 1 : -1;

        if (w < 0)
            usage();
        want[w] = true;
    }
    if (optind == argc)
        want[0] = want[1] = true;

    /* OpenSSL writes libevent's sockets itself, without MSG_NOSIGNAL: a
     * close_notify sent to a peer that has gone must not end the process. */
    signal(SIGPIPE, SIG_IGN);
    make_pattern();
    if (tc_files_make(&certs) != 0)
        return 1;
    /* ferry's contexts, and the same settings on libevent's. */
    if ((rc = ferry_tls_ctx_new(&F.srv, FERRY_TLS_SERVER, 0)) != 0 ||
        (rc = ferry_tls_ctx_load_cert(F.srv, certs.server, certs.server_key)) != 0 ||
        (rc = ferry_tls_ctx_new(&F.cli, FERRY_TLS_CLIENT, 0)) != 0 ||
        (rc = ferry_tls_ctx_load_ca(F.cli, certs.ca, NULL)) != 0)
        die("ferry_tls_ctx", strerror(-rc));
    tune_ctx(ferry_tls_ctx_openssl(F.srv));
    tune_ctx(ferry_tls_ctx_openssl(F.cli));
    sc = L.srv = SSL_CTX_new(TLS_server_method());
    cc = L.cli = SSL_CTX_new(TLS_client_method());
    if (!sc || !cc || SSL_CTX_use_certificate_chain_file(sc, certs.server) != 1 ||
        SSL_CTX_use_PrivateKey_file(sc, certs.server_key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_load_verify_locations(cc, certs.ca, NULL) != 1)
        die("SSL_CTX", "libevent's contexts");
    SSL_CTX_set_options(sc, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_options(cc, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_verify(cc, SSL_VERIFY_PEER, NULL);
    tune_ctx(sc);
    tune_ctx(cc);
    tc_files_remove(&certs);

    for (int run = 0; run < runs; run++)
        for (int w = 0; w < 2; w++)
            for (int k = 0; want[w] && k < 2; k++) {
                int sys = run % 2 ? 1 - k : k;

                if (only >= 0 && sys != only)
                    continue;
                fprintf(stderr, "ferry-tls-bench: run %d/%d %s %s (load %.2f)\n", run + 1, runs,
                        workloads[w], systems[sys], load1());
                all_ok &= run_one(w, sys, run);
            }
    if (only < 0)
        print_medians(want, runs);
    ferry_tls_ctx_free(F.srv);
    ferry_tls_ctx_free(F.cli);
    SSL_CTX_free(sc);
    SSL_CTX_free(cc);
    return all_ok ? 0 : 1;
}
