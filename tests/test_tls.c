/* test_tls.c - TLS over streams (ferry/tls.h): handshakes over a socketpair
 * and over TCP loopback, data both ways through the line reader across
 * record boundaries, backpressure, verification (wrong host, untrusted
 * authority, the system's store by default), SNI, cancellation and
 * deadlines in the handshake and in reads, closing while a task waits,
 * a peer that ends without close_notify, bad input, another loop,
 * allocation failures (ferry's and OpenSSL's), the in-place form under a
 * flood of failed handshakes, and records that came with the last
 * handshake flight.
 *
 * The certificates are made at run time (tls_certs.c).  Client and server
 * are tasks of one loop, except where a peer must act while the loop is
 * held inside a transport call: that peer runs a loop on a thread.  Every
 * wait that a broken stream could leave hanging runs under a deadline
 * scope.  No cr_assert inside task bodies (see testutil.h).
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/ssl.h>
#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry/tls.h"
#include "stream_int.h"
#include "tls_certs.h"

/* ---- OpenSSL's allocations, countable and failable ------------------------ */

static unsigned long ossl_count;   /* allocations since ossl_arm() */
static unsigned long ossl_fail_at; /* 0: none fails; else this one and later */
static bool ossl_armed;

static void *ossl_malloc(size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    if (ossl_armed && ++ossl_count >= ossl_fail_at)
        return NULL;
    return malloc(n);
}

static void *ossl_realloc(void *p, size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    if (ossl_armed && ++ossl_count >= ossl_fail_at)
        return NULL;
    return realloc(p, n);
}

static void ossl_free(void *p, const char *file, int line)
{
    (void)file;
    (void)line;
    free(p);
}

/* Before OpenSSL's first allocation; ferry's allocator counted too. */
__attribute__((constructor)) static void hooks(void)
{
    CRYPTO_set_mem_functions(ossl_malloc, ossl_realloc, ossl_free);
    ferry__alloc_count_on();
    if (getenv("FERRY_TEST_IO_LIBEVENT"))
        ferry__io_use_libevent = true;
}

/* ---- fixtures ---------------------------------------------------------------- */

static struct tc_files F;
static ferry_tls_ctx *SRV;    /* server: localhost, signed by the test CA */
static ferry_tls_ctx *CLI;    /* client trusting the test CA */

static void setup(void)
{
    tu_loop_setup();
    cr_assert_eq(tc_files_make(&F), 0);
    cr_assert_eq(ferry_tls_ctx_new(&SRV, FERRY_TLS_SERVER, 0), 0);
    cr_assert_eq(ferry_tls_ctx_load_cert(SRV, F.server, F.server_key), 0);
    cr_assert_eq(ferry_tls_ctx_new(&CLI, FERRY_TLS_CLIENT, 0), 0);
    cr_assert_eq(ferry_tls_ctx_load_ca(CLI, F.ca, NULL), 0);
}

/* The end of every test body: the contexts are ferry's allocations, which
 * the loop's teardown counts. */
static void done(void)
{
    ferry_tls_ctx_free(SRV);
    ferry_tls_ctx_free(CLI);
    SRV = CLI = NULL;
    tc_files_remove(&F);
}

static void teardown(void)
{
    done();
    tu_loop_teardown();
}

/* The suite runs on the io_uring backend too (ctest test_tls_uring). */
static bool on_uring(void)
{
    const char *io = getenv("FERRY_IO");

    return io && strcmp(io, "uring") == 0;
}

#define T(name) Test(tls, name, .init = setup, .fini = teardown, .timeout = 60.)

static int sp[2];
static ferry_stream *A, *B;   /* A: the client's end, B: the server's */

static void pair(void)
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    cr_assert_eq(ferry_stream_open(&A, tu_loop, sp[0], NULL), 0);
    cr_assert_eq(ferry_stream_open(&B, tu_loop, sp[1], NULL), 0);
}

/* A handshake run as a task. */
struct hs {
    ferry_stream  *s;
    ferry_tls_ctx *ctx;
    const char    *host;     /* client: the name checked */
    bool           server;
    int64_t        ms;       /* a deadline for it, 0 for none */
    int            rc;
    ferry_stream  *out;
    char           why[200];
    char           sni[64];
    char           version[16];
};

static int hs_task(void *arg)
{
    struct hs *h = arg;
    ferry_scope sc;
    const char *p;

    ferry_scope_enter(&sc, h->ms ? ferry_now() + tu_ms(h->ms) : FERRY_NEVER, 0);
    h->rc = h->server ? ferry_tls_server(&h->out, h->s, h->ctx)
                      : ferry_tls_client(&h->out, h->s, h->ctx, h->host);
    ferry_scope_exit(&sc);
    if ((p = ferry_tls_last_error(h->s)) != NULL)
        snprintf(h->why, sizeof h->why, "%s", p);
    if (h->rc == 0 && (p = ferry_tls_server_name(h->s)) != NULL)
        snprintf(h->sni, sizeof h->sni, "%s", p);
    if (h->rc == 0 && (p = ferry_tls_version(h->s)) != NULL)
        snprintf(h->version, sizeof h->version, "%s", p);
    return 0;
}

/* Both handshakes at once, from a task: the server's in a task of its own. */
static void handshake_both(struct hs *c, struct hs *s)
{
    ferry_task *t;

    s->server = true;
    if (ferry_task_spawn(&t, NULL, hs_task, s, NULL) != 0) {
        s->rc = c->rc = -999;
        return;
    }
    hs_task(c);
    ferry_task_join(t, NULL);
}

/* The usual pair of handshakes over A and B, run on the main stack. */
static struct hs HC, HS;

static int both_task(void *arg)
{
    (void)arg;
    handshake_both(&HC, &HS);
    return 0;
}

static void connect_ab(ferry_tls_ctx *cli, const char *host, ferry_tls_ctx *srv)
{
    memset(&HC, 0, sizeof HC);
    memset(&HS, 0, sizeof HS);
    HC = (struct hs){ .s = A, .ctx = cli, .host = host, .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = srv, .ms = 10000 };
    tu_run(both_task, NULL);
}

static void close_ab(void)
{
    cr_assert_eq(ferry_stream_close(A), 0);
    cr_assert_eq(ferry_stream_close(B), 0);
}

/* ---- handshakes and data ------------------------------------------------------ */

/* A conversation: the client sends lines in pieces, the server answers each
 * line, both read with the line reader. */
struct talk {
    int  rc[8];
    char got[4][64];
    char reply[64];
};

static int talk_server(void *arg)
{
    struct talk *k = arg;
    char line[64];
    size_t n;

    for (int i = 0; i < 2; i++) {
        k->rc[i] = ferry_stream_read_until(B, "\n", 1, line, sizeof line - 1, &n);
        line[n] = 0;
        snprintf(k->got[i], sizeof k->got[i], "%s", line);
    }
    k->rc[2] = ferry_stream_write(B, "ok: 2 lines\n", 12, NULL);
    return 0;
}

static int talk_task(void *arg)
{
    struct talk *k = arg;
    ferry_task *t;
    ferry_scope sc;
    size_t n;

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc)
        return 0;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(10000), 0);
    ferry_task_spawn(&t, NULL, talk_server, k, NULL);
    /* Each write is a record of its own: lines cross records. */
    k->rc[3] = ferry_stream_write(A, "hel", 3, NULL);
    k->rc[4] = ferry_stream_write(A, "lo\nwor", 6, NULL);
    k->rc[5] = ferry_stream_write(A, "ld\n", 3, NULL);
    k->rc[6] = ferry_stream_read_until(A, "\n", 1, k->reply, sizeof k->reply - 1, &n);
    k->reply[n] = 0;
    ferry_task_join(t, NULL);
    ferry_scope_exit(&sc);
    return 0;
}

T(handshake_and_lines_over_a_socketpair)
{
    struct talk k;

    memset(&k, 0, sizeof k);
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(talk_task, &k);
    cr_assert_eq(HC.rc, 0, "client: %d (%s)", HC.rc, HC.why);
    cr_assert_eq(HS.rc, 0, "server: %d (%s)", HS.rc, HS.why);
    cr_assert_eq(HC.out, A, "the stream is converted in place");
    cr_assert_eq(HS.out, B);
    cr_assert_str_eq(HS.sni, "localhost", "the server saw SNI '%s'", HS.sni);
    cr_assert_str_eq(HC.version, "TLSv1.3");
    for (int i = 0; i < 7; i++)
        cr_assert_eq(k.rc[i], 0, "call %d: %d", i, k.rc[i]);
    cr_assert_str_eq(k.got[0], "hello\n");
    cr_assert_str_eq(k.got[1], "world\n");
    cr_assert_str_eq(k.reply, "ok: 2 lines\n");
    close_ab();
    done();
}

/* TCP loopback: by name (SNI sent) and by address (no SNI, the address is
 * checked against the certificate's IP addresses). */
struct tcp {
    const char *host;
    int         rc[6];
    char        sni[64];
    bool        sni_null;
    char        echo[16];
};

static int tcp_task(void *arg)
{
    struct tcp *k = arg;
    ferry_listener *l;
    ferry_stream *c = NULL, *s = NULL;
    ferry_scope sc;
    size_t n;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(10000), 0);
    k->rc[0] = ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL);
    if (k->rc[0])
        goto out;
    k->rc[1] = ferry_tcp_connect(&c, "127.0.0.1", ferry_listener_port(l), NULL);
    k->rc[2] = ferry_listener_accept(l, &s, NULL);
    ferry_listener_close(l);
    if (k->rc[1] || k->rc[2])
        goto out;
    HC = (struct hs){ .s = c, .ctx = CLI, .host = k->host, .ms = 10000 };
    HS = (struct hs){ .s = s, .ctx = SRV, .ms = 10000 };
    handshake_both(&HC, &HS);
    k->sni_null = ferry_tls_server_name(s) == NULL;
    k->rc[3] = ferry_stream_write(c, "ping\n", 5, NULL);
    k->rc[4] = ferry_stream_read_until(s, "\n", 1, k->echo, sizeof k->echo - 1, &n);
    k->echo[n] = 0;
out:
    ferry_scope_exit(&sc);
    if (c)
        ferry_stream_close(c);
    if (s)
        ferry_stream_close(s);
    return 0;
}

T(handshake_over_tcp_loopback_by_name_and_by_address)
{
    struct tcp k;

    memset(&k, 0, sizeof k);
    k.host = "localhost";
    tu_run(tcp_task, &k);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(k.rc[i], 0, "call %d: %d", i, k.rc[i]);
    cr_assert_eq(HC.rc, 0, "by name: %d (%s)", HC.rc, HC.why);
    cr_assert_str_eq(HS.sni, "localhost");
    cr_assert_str_eq(k.echo, "ping\n");

    memset(&k, 0, sizeof k);
    k.host = "127.0.0.1";
    tu_run(tcp_task, &k);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(k.rc[i], 0, "call %d: %d", i, k.rc[i]);
    cr_assert_eq(HC.rc, 0, "by address: %d (%s)", HC.rc, HC.why);
    cr_assert(k.sni_null, "no SNI for an address");
    cr_assert_str_eq(k.echo, "ping\n");
    done();
}

/* ---- large transfers -------------------------------------------------------------- */

#define BIG ((size_t)6 * 1024 * 1024)

static unsigned char pattern(size_t i)
{
    return (unsigned char)(i * 7 + i / 251);
}

struct bulk {
    unsigned char *src;
    int    wrc;
    size_t written;
    bool   writer_done;
    bool   done_before_read;   /* the writer finished before anyone read */
    int    rrc;
    size_t got;
    size_t bad_at;            /* first wrong byte + 1, 0 if none */
    int    lrc;              /* the long line, read with room for it */
    int    lrc2;             /* read first with too little room */
    int    lwrc;             /* its write */
    size_t line_len;
    char  *line;
};

static int line_writer(void *arg)
{
    struct bulk *b = arg;

    b->lwrc = ferry_stream_write(A, b->line, 100000, NULL);
    return 0;
}

static int bulk_writer(void *arg)
{
    struct bulk *b = arg;

    b->wrc = ferry_stream_write(A, b->src, BIG, &b->written);
    b->writer_done = true;
    return 0;
}

static int bulk_task(void *arg)
{
    struct bulk *b = arg;
    ferry_task *t;
    ferry_scope sc;
    unsigned char *buf = malloc(70000);
    char *line = malloc(100001);

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc || !buf || !line)
        goto out;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(30000), 0);
    ferry_task_spawn(&t, NULL, bulk_writer, b, NULL);
    /* Nobody reads for a while: the writer must be held up. */
    ferry_sleep(tu_ms(100));
    b->done_before_read = b->writer_done;
    while (b->got < BIG) {
        size_t n;
        b->rrc = ferry_stream_read(B, buf, 70000, &n);
        if (b->rrc || n == 0)
            break;
        for (size_t i = 0; i < n && !b->bad_at; i++)
            if (buf[i] != pattern(b->got + i))
                b->bad_at = b->got + i + 1;
        b->got += n;
    }
    ferry_task_join(t, NULL);
    /* A line of 100,000 bytes: seven records, read by the line reader. */
    b->line = line;
    memset(line, 'x', 100000);
    line[99999] = '\n';
    ferry_task_spawn(&t, NULL, line_writer, b, NULL);
    b->lrc = ferry_stream_read_until(B, "\n", 1, buf, 70000, &b->line_len);
    b->lrc2 = b->lrc;
    if (b->lrc == -EMSGSIZE) {
        char *big = malloc(100001);
        b->lrc = big ? ferry_stream_read_until(B, "\n", 1, big, 100001, &b->line_len) : -ENOMEM;
        if (b->lrc == 0 && (big[0] != 'x' || big[99998] != 'x' || big[99999] != '\n'))
            b->lrc = -1000;
        free(big);
    }
    ferry_task_join(t, NULL);
    ferry_scope_exit(&sc);
out:
    free(buf);
    free(line);
    return 0;
}

T(large_writes_wait_for_the_reader_and_arrive_intact)
{
    struct bulk b;

    memset(&b, 0, sizeof b);
    b.src = malloc(BIG);
    cr_assert_not_null(b.src);
    for (size_t i = 0; i < BIG; i++)
        b.src[i] = pattern(i);
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(bulk_task, &b);
    free(b.src);
    cr_assert_eq(HC.rc, 0, "client: %d (%s)", HC.rc, HC.why);
    cr_assert_eq(b.wrc, 0, "write: %d", b.wrc);
    cr_assert_eq(b.written, BIG);
    cr_assert_not(b.done_before_read, "6 MiB went out with no reader: no backpressure");
    cr_assert_eq(b.rrc, 0, "read: %d", b.rrc);
    cr_assert_eq(b.got, BIG, "got %zu of %zu bytes", b.got, BIG);
    cr_assert_eq(b.bad_at, 0, "byte %zu is wrong", b.bad_at - 1);
    cr_assert_eq(b.lwrc, 0, "the long line's write: %d", b.lwrc);
    cr_assert_eq(b.lrc2, -EMSGSIZE, "a line over the maximum: %d", b.lrc2);
    cr_assert_eq(b.lrc, 0, "the long line: %d", b.lrc);
    cr_assert_eq(b.line_len, 100000);
    close_ab();
    done();
}

/* ---- verification ------------------------------------------------------------------ */

/* A server context with the certificate `cert`/`key`. */
static ferry_tls_ctx *server_with(const char *cert, const char *key)
{
    ferry_tls_ctx *c;

    cr_assert_eq(ferry_tls_ctx_new(&c, FERRY_TLS_SERVER, 0), 0);
    cr_assert_eq(ferry_tls_ctx_load_cert(c, cert, key), 0);
    return c;
}

T(a_certificate_for_another_host_is_rejected)
{
    ferry_tls_ctx *wrong = server_with(F.wrong, F.wrong_key);

    pair();
    connect_ab(CLI, "localhost", wrong);
    cr_assert_eq(HC.rc, -EKEYREJECTED, "client: %d (%s)", HC.rc, HC.why);
    cr_assert(strstr(HC.why, "hostname mismatch"), "the reason: '%s'", HC.why);
    cr_assert_eq(HS.rc, -EPROTO, "server: %d (%s)", HS.rc, HS.why);
    cr_assert_null(HC.out);
    /* Broken, not half-made: reads and writes say so, close frees. */
    cr_assert_eq(ferry_stream_buffered(A), 0);
    close_ab();
    ferry_tls_ctx_free(wrong);

    /* The same certificate passes for the name it has. */
    ferry_tls_ctx *ok = server_with(F.wrong, F.wrong_key);
    pair();
    connect_ab(CLI, "wrong.example", ok);
    cr_assert_eq(HC.rc, 0, "client: %d (%s)", HC.rc, HC.why);
    close_ab();
    ferry_tls_ctx_free(ok);
    done();
}

T(an_untrusted_certificate_is_rejected_unless_verification_is_off)
{
    ferry_tls_ctx *self = server_with(F.self, F.self_key), *nv;

    pair();
    connect_ab(CLI, "localhost", self);
    cr_assert_eq(HC.rc, -EKEYREJECTED, "client: %d (%s)", HC.rc, HC.why);
    cr_assert(strstr(HC.why, "certificate verify failed"), "the reason: '%s'", HC.why);
    close_ab();

    cr_assert_eq(ferry_tls_ctx_new(&nv, FERRY_TLS_CLIENT, FERRY_TLS_NO_VERIFY), 0);
    pair();
    connect_ab(nv, NULL, self);
    cr_assert_eq(HC.rc, 0, "no verification: %d (%s)", HC.rc, HC.why);
    close_ab();
    ferry_tls_ctx_free(nv);
    ferry_tls_ctx_free(self);
    done();
}

T(a_client_context_verifies_against_the_system_store_by_default)
{
    ferry_tls_ctx *sys;

    /* The test CA is in no system store: the default must reject it. */
    cr_assert_eq(ferry_tls_ctx_new(&sys, FERRY_TLS_CLIENT, 0), 0);
    pair();
    connect_ab(sys, "localhost", SRV);
    cr_assert_eq(HC.rc, -EKEYREJECTED, "client: %d (%s)", HC.rc, HC.why);
    close_ab();
    ferry_tls_ctx_free(sys);
    done();
}

T(a_server_may_require_a_client_certificate)
{
    ferry_tls_ctx *srv, *cli;

    cr_assert_eq(ferry_tls_ctx_new(&srv, FERRY_TLS_SERVER, FERRY_TLS_VERIFY_CLIENT), 0);
    cr_assert_eq(ferry_tls_ctx_load_cert(srv, F.server, F.server_key), 0);
    cr_assert_eq(ferry_tls_ctx_load_ca(srv, F.ca, NULL), 0);
    pair();
    connect_ab(CLI, "localhost", srv);
    cr_assert_neq(HS.rc, 0, "a client without a certificate was accepted");
    close_ab();

    cr_assert_eq(ferry_tls_ctx_new(&cli, FERRY_TLS_CLIENT, 0), 0);
    cr_assert_eq(ferry_tls_ctx_load_ca(cli, F.ca, NULL), 0);
    cr_assert_eq(ferry_tls_ctx_load_cert(cli, F.client, F.client_key), 0);
    pair();
    connect_ab(cli, "localhost", srv);
    cr_assert_eq(HS.rc, 0, "server: %d (%s)", HS.rc, HS.why);
    cr_assert_eq(HC.rc, 0, "client: %d (%s)", HC.rc, HC.why);
    close_ab();
    ferry_tls_ctx_free(cli);
    ferry_tls_ctx_free(srv);
    done();
}

/* What the client of a refused handshake sees: the handshake's result
 * and, if it succeeded (TLS 1.3: the client is done before the server has
 * checked its certificate), its first read's. */
struct refused {
    int  rrc;
    char rwhy[200];
};

static int refused_task(void *arg)
{
    struct refused *k = arg;
    ferry_scope sc;
    const char *p;
    char buf[8];
    size_t n;

    handshake_both(&HC, &HS);
    if (HC.rc)
        return 0;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(10000), 0);
    k->rrc = ferry_stream_read(A, buf, sizeof buf, &n);
    ferry_scope_exit(&sc);
    if ((p = ferry_tls_last_error(A)) != NULL)
        snprintf(k->rwhy, sizeof k->rwhy, "%s", p);
    return 0;
}

/* Run a handshake of `cli` at `srv` over a new pair; k says what the
 * client saw after it. */
static void refused_run(ferry_tls_ctx *cli, ferry_tls_ctx *srv, struct refused *k)
{
    memset(k, 0, sizeof *k);
    pair();
    HC = (struct hs){ .s = A, .ctx = cli, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = srv, .ms = 10000 };
    cr_assert_eq(tu_run(refused_task, k), 0);
}

/* A server that requires a client certificate refuses a client without
 * one as it refuses one whose certificate does not verify: -EKEYREJECTED.
 * The client sees the server's alert, -EPROTO: from its first read in TLS
 * 1.3 (its handshake is over before the server checks), from the
 * handshake in TLS 1.2. */
T(a_client_without_a_certificate_is_rejected_as_one_that_did_not_verify)
{
    ferry_tls_ctx *srv, *srv12, *self;
    struct refused k;

    cr_assert_eq(ferry_tls_ctx_new(&srv, FERRY_TLS_SERVER, FERRY_TLS_VERIFY_CLIENT), 0);
    cr_assert_eq(ferry_tls_ctx_load_cert(srv, F.server, F.server_key), 0);
    cr_assert_eq(ferry_tls_ctx_load_ca(srv, F.ca, NULL), 0);
    cr_assert_eq(ferry_tls_ctx_new(&srv12, FERRY_TLS_SERVER, FERRY_TLS_VERIFY_CLIENT), 0);
    cr_assert_eq(ferry_tls_ctx_load_cert(srv12, F.server, F.server_key), 0);
    cr_assert_eq(ferry_tls_ctx_load_ca(srv12, F.ca, NULL), 0);
    cr_assert_eq(SSL_CTX_set_max_proto_version(ferry_tls_ctx_openssl(srv12), TLS1_2_VERSION), 1);
    cr_assert_eq(ferry_tls_ctx_new(&self, FERRY_TLS_CLIENT, 0), 0);
    cr_assert_eq(ferry_tls_ctx_load_ca(self, F.ca, NULL), 0);
    cr_assert_eq(ferry_tls_ctx_load_cert(self, F.self, F.self_key), 0);

    /* No certificate, TLS 1.3. */
    refused_run(CLI, srv, &k);
    cr_expect_eq(HS.rc, -EKEYREJECTED, "server, no certificate, TLS 1.3: %d (%s)", HS.rc, HS.why);
    cr_expect(strstr(HS.why, "did not return a certificate"), "the reason: '%s'", HS.why);
    cr_expect_eq(HC.rc, 0, "client, TLS 1.3: %d (%s)", HC.rc, HC.why);
    cr_expect_eq(k.rrc, -EPROTO, "client's read, TLS 1.3: %d (%s)", k.rrc, k.rwhy);
    cr_expect(strstr(k.rwhy, "certificate required"), "the client's reason: '%s'", k.rwhy);
    close_ab();

    /* No certificate, TLS 1.2. */
    refused_run(CLI, srv12, &k);
    cr_expect_eq(HS.rc, -EKEYREJECTED, "server, no certificate, TLS 1.2: %d (%s)", HS.rc, HS.why);
    cr_expect_eq(HC.rc, -EPROTO, "client, TLS 1.2: %d (%s)", HC.rc, HC.why);
    cr_expect(strstr(HC.why, "handshake failure"), "the client's reason: '%s'", HC.why);
    close_ab();

    /* A certificate that does not verify (self-signed), for comparison. */
    refused_run(self, srv, &k);
    cr_expect_eq(HS.rc, -EKEYREJECTED, "server, self-signed: %d (%s)", HS.rc, HS.why);
    cr_expect_eq(HC.rc, 0, "client, self-signed: %d (%s)", HC.rc, HC.why);
    cr_expect_eq(k.rrc, -EPROTO, "client's read, self-signed: %d (%s)", k.rrc, k.rwhy);
    close_ab();

    ferry_tls_ctx_free(self);
    ferry_tls_ctx_free(srv12);
    ferry_tls_ctx_free(srv);
    done();
}

/* ---- cancellation, deadlines, closing ------------------------------------------------- */

/* The handshake against a peer that never answers: a deadline, then a
 * cancellation.  The stream is left broken, and closing it frees all. */
struct silent {
    int rc[4];
    ferry_task *victim;
};

static int silent_client(void *arg)
{
    struct silent *k = arg;
    ferry_stream *o;

    k->rc[1] = ferry_tls_client(&o, A, CLI, "localhost");
    return 0;
}

static int silent_task(void *arg)
{
    struct silent *k = arg;
    ferry_scope sc;
    ferry_stream *o;
    char b[8];
    size_t n;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(100), 0);
    k->rc[0] = ferry_tls_client(&o, A, CLI, "localhost");
    ferry_scope_exit(&sc);
    k->rc[2] = ferry_stream_read(A, b, sizeof b, &n);
    return 0;
}

static int canceller(void *arg)
{
    struct silent *k = arg;

    ferry_sleep(tu_ms(50));
    ferry_task_cancel(k->victim);
    return 0;
}

static int silent_cancel_task(void *arg)
{
    struct silent *k = arg;

    ferry_task_spawn(&k->victim, NULL, silent_client, k, NULL);
    ferry_task_spawn(NULL, NULL, canceller, k, NULL);
    ferry_task_join(k->victim, NULL);
    return 0;
}

T(a_handshake_honours_deadlines_and_cancellation)
{
    struct silent k;

    memset(&k, 0, sizeof k);
    pair();
    tu_run(silent_task, &k);
    cr_assert_eq(k.rc[0], -ETIMEDOUT, "deadline: %d", k.rc[0]);
    cr_assert_eq(k.rc[2], -EPROTO, "a read after it: %d", k.rc[2]);
    close_ab();

    memset(&k, 0, sizeof k);
    pair();
    tu_run(silent_cancel_task, &k);
    cr_assert_eq(k.rc[1], -ECANCELED, "cancelled: %d", k.rc[1]);
    close_ab();
    done();
}

/* Closing the stream while the handshake waits, and while a read waits. */
struct closer {
    ferry_stream *s;
    int64_t ms;
};

static int close_later(void *arg)
{
    struct closer *c = arg;

    ferry_sleep(tu_ms(c->ms));
    ferry_stream_close(c->s);
    return 0;
}

static int close_hs_task(void *arg)
{
    int *rc = arg;
    struct closer c = { A, 50 };
    ferry_stream *o;

    ferry_task_spawn(NULL, NULL, close_later, &c, NULL);
    rc[0] = ferry_tls_client(&o, A, CLI, "localhost");
    return 0;
}

static int close_read_task(void *arg)
{
    int *rc = arg;
    struct closer c = { A, 50 };
    char b[8];
    size_t n;

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc)
        return 0;
    ferry_task_spawn(NULL, NULL, close_later, &c, NULL);
    rc[1] = ferry_stream_read(A, b, sizeof b, &n);
    return 0;
}

T(closing_wakes_a_task_in_the_handshake_or_a_read)
{
    int rc[2] = { 1, 1 };

    pair();
    tu_run(close_hs_task, rc);
    cr_assert_eq(rc[0], -EBADF, "handshake: %d", rc[0]);
    cr_assert_eq(ferry_stream_close(B), 0);

    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(close_read_task, rc);
    cr_assert_eq(HC.rc, 0, "client: %d (%s)", HC.rc, HC.why);
    cr_assert_eq(rc[1], -EBADF, "read: %d", rc[1]);
    cr_assert_eq(ferry_stream_close(B), 0);
    done();
}

/* A read that times out keeps what came; the retry gets the whole line. */
struct keep {
    int  rc[4];
    char line[32];
};

static int keep_task(void *arg)
{
    struct keep *k = arg;
    ferry_scope sc;
    size_t n;

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc)
        return 0;
    k->rc[0] = ferry_stream_write(B, "abc", 3, NULL);
    ferry_scope_enter(&sc, ferry_now() + tu_ms(100), 0);
    k->rc[1] = ferry_stream_read_until(A, "\n", 1, k->line, sizeof k->line - 1, &n);
    ferry_scope_exit(&sc);
    k->rc[2] = ferry_stream_write(B, "def\n", 4, NULL);
    ferry_scope_enter(&sc, ferry_now() + tu_ms(10000), 0);
    k->rc[3] = ferry_stream_read_until(A, "\n", 1, k->line, sizeof k->line - 1, &n);
    ferry_scope_exit(&sc);
    k->line[n] = 0;
    return 0;
}

T(a_read_that_times_out_loses_nothing)
{
    struct keep k;

    memset(&k, 0, sizeof k);
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(keep_task, &k);
    cr_assert_eq(HC.rc, 0);
    cr_assert_eq(k.rc[0], 0);
    cr_assert_eq(k.rc[1], -ETIMEDOUT, "first read: %d", k.rc[1]);
    cr_assert_eq(k.rc[2], 0);
    cr_assert_eq(k.rc[3], 0, "retry: %d", k.rc[3]);
    cr_assert_str_eq(k.line, "abcdef\n");
    close_ab();
    done();
}

/* A write that times out counts what it encrypted; those bytes, and no
 * others, reach the peer before the next write's. */
struct partial {
    int    rc[4];
    size_t written;
    size_t got;
    size_t bad_at;
    unsigned char *src;
};

static int partial_end_writer(void *arg)
{
    struct partial *k = arg;

    k->rc[1] = ferry_stream_write(A, "END\n", 4, NULL);
    return 0;
}

static int partial_task(void *arg)
{
    struct partial *k = arg;
    ferry_scope sc;
    unsigned char *buf = malloc(65536);

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc || !buf)
        goto out;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(200), 0);
    k->rc[0] = ferry_stream_write(A, k->src, BIG, &k->written);
    ferry_scope_exit(&sc);
    /* "END\n" after it: the reader must find exactly written bytes first. */
    ferry_task *t;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(20000), 0);
    ferry_task_spawn(&t, NULL, partial_end_writer, k, NULL);
    while (k->got < k->written + 4) {
        size_t n;
        k->rc[2] = ferry_stream_read(B, buf, 65536, &n);
        if (k->rc[2] || !n)
            break;
        for (size_t i = 0; i < n && !k->bad_at; i++) {
            size_t at = k->got + i;
            unsigned char want = at < k->written ? pattern(at) : (unsigned char)"END\n"[at - k->written];
            if (buf[i] != want)
                k->bad_at = at + 1;
        }
        k->got += n;
    }
    ferry_task_join(t, NULL);
    ferry_scope_exit(&sc);
out:
    free(buf);
    return 0;
}

T(a_write_that_times_out_counts_what_it_encrypted)
{
    struct partial k;

    memset(&k, 0, sizeof k);
    k.src = malloc(BIG);
    cr_assert_not_null(k.src);
    for (size_t i = 0; i < BIG; i++)
        k.src[i] = pattern(i);
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(partial_task, &k);
    free(k.src);
    cr_assert_eq(HC.rc, 0);
    cr_assert_eq(k.rc[0], -ETIMEDOUT, "the write: %d", k.rc[0]);
    cr_assert(k.written > 0 && k.written < BIG, "written %zu", k.written);
    cr_assert_eq(k.rc[1], 0, "the next write: %d", k.rc[1]);
    cr_assert_eq(k.rc[2], 0, "read: %d", k.rc[2]);
    cr_assert_eq(k.got, k.written + 4, "got %zu, written %zu + 4", k.got, k.written);
    cr_assert_eq(k.bad_at, 0, "byte %zu is wrong", k.bad_at - 1);
    close_ab();
    done();
}

/* ---- the end of the stream --------------------------------------------------------------- */

struct ending {
    bool   dirty;      /* the server ends without close_notify */
    int    rc[6];
    size_t n;
    char   buf[32];
};

static int ending_task(void *arg)
{
    struct ending *k = arg;
    ferry_scope sc;
    size_t n;

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc)
        return 0;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(10000), 0);
    k->rc[0] = ferry_stream_write(B, "last\n", 5, NULL);
    if (k->dirty)
        k->rc[1] = shutdown(ferry_stream_fd(B), SHUT_WR);    /* under TLS's feet */
    else
        k->rc[1] = ferry_stream_shutdown(B);
    k->rc[2] = ferry_stream_read_until(A, "\n", 1, k->buf, sizeof k->buf, &k->n);
    k->rc[3] = ferry_stream_read(A, k->buf, sizeof k->buf, &n);
    k->n += n;
    /* After close_notify the other direction still works (TLS 1.3). */
    if (!k->dirty) {
        k->rc[4] = ferry_stream_write(A, "more\n", 5, NULL);
        k->rc[5] = ferry_stream_read_until(B, "\n", 1, k->buf, sizeof k->buf, &n);
    }
    ferry_scope_exit(&sc);
    return 0;
}

T(close_notify_is_the_end_and_its_absence_is_an_error)
{
    struct ending k;
    ferry_tls_ctx *lax;

    memset(&k, 0, sizeof k);
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(ending_task, &k);
    cr_assert_eq(HC.rc, 0);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(k.rc[i], 0, "clean, call %d: %d", i, k.rc[i]);
    cr_assert_eq(k.n, 5, "the line, then the end");
    close_ab();

    memset(&k, 0, sizeof k);
    k.dirty = true;
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(ending_task, &k);
    cr_assert_eq(k.rc[2], 0, "the line before the cut: %d", k.rc[2]);
    cr_assert_eq(k.rc[3], -ECONNABORTED, "no close_notify: %d", k.rc[3]);
    cr_assert(strstr(ferry_tls_last_error(A), "close_notify"), "%s", ferry_tls_last_error(A));
    close_ab();

    /* FERRY_TLS_ALLOW_TRUNCATION: the same end reads as a clean one. */
    cr_assert_eq(ferry_tls_ctx_new(&lax, FERRY_TLS_CLIENT, FERRY_TLS_ALLOW_TRUNCATION), 0);
    cr_assert_eq(ferry_tls_ctx_load_ca(lax, F.ca, NULL), 0);
    memset(&k, 0, sizeof k);
    k.dirty = true;
    pair();
    HC = (struct hs){ .s = A, .ctx = lax, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(ending_task, &k);
    cr_assert_eq(k.rc[3], 0, "tolerated: %d", k.rc[3]);
    close_ab();
    ferry_tls_ctx_free(lax);
    done();
}

/* ---- bad input, another loop -------------------------------------------------------------- */

static int bad_task(void *arg)
{
    int *r = arg, i = 0;
    ferry_stream *o = (ferry_stream *)1;

    r[i++] = ferry_tls_client(NULL, A, CLI, "localhost");
    r[i++] = ferry_tls_client(&o, NULL, CLI, "localhost");
    r[i++] = o == (ferry_stream *)1 ? -EINVAL : 0;    /* *out not written */
    r[i++] = ferry_tls_client(&o, A, NULL, "localhost");
    r[i++] = ferry_tls_client(&o, A, SRV, "localhost");      /* a server context */
    r[i++] = ferry_tls_client(&o, A, CLI, NULL);             /* verifying, no name */
    r[i++] = ferry_tls_client(&o, A, CLI, "");
    r[i++] = ferry_tls_server(&o, B, CLI);                   /* a client context */
    r[15] = i;
    return 0;
}

T(bad_input_is_einval)
{
    int r[16];
    ferry_tls_ctx *c, *nocert;

    memset(r, 1, sizeof r);
    cr_assert_eq(ferry_tls_ctx_new(NULL, FERRY_TLS_CLIENT, 0), -EINVAL);
    cr_assert_eq(ferry_tls_ctx_new(&c, 3, 0), -EINVAL);
    cr_assert_null(c);
    cr_assert_eq(ferry_tls_ctx_new(&c, FERRY_TLS_CLIENT, FERRY_TLS_VERIFY_CLIENT), -EINVAL);
    cr_assert_eq(ferry_tls_ctx_new(&c, FERRY_TLS_SERVER, FERRY_TLS_NO_VERIFY), -EINVAL);
    cr_assert_eq(ferry_tls_ctx_new(&c, FERRY_TLS_CLIENT, 0x100), -EINVAL);
    cr_assert_eq(ferry_tls_ctx_load_cert(NULL, F.server, F.server_key), -EINVAL);
    cr_assert_eq(ferry_tls_ctx_load_cert(SRV, NULL, F.server_key), -EINVAL);
    cr_assert_eq(ferry_tls_ctx_load_ca(CLI, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_tls_ctx_load_cert(SRV, "/nonexistent/cert.pem", F.server_key), -ENOENT);
    cr_assert_eq(ferry_tls_ctx_load_cert(SRV, F.garbage, F.server_key), -EBADMSG);
    cr_assert_eq(ferry_tls_ctx_load_cert(SRV, F.server, F.wrong_key), -EBADMSG);
    cr_assert_eq(ferry_tls_ctx_load_ca(CLI, "/nonexistent/ca.pem", NULL), -ENOENT);
    cr_assert_eq(ferry_tls_ctx_load_ca(CLI, F.garbage, NULL), -EBADMSG);
    cr_assert_null(ferry_tls_ctx_openssl(NULL));
    cr_assert_not_null(ferry_tls_ctx_openssl(CLI));
    ferry_tls_ctx_free(NULL);

    pair();
    cr_assert_null(ferry_tls_last_error(A), "a plain stream");
    cr_assert_null(ferry_tls_last_error(NULL));
    cr_assert_null(ferry_tls_server_name(NULL));
    cr_assert_null(ferry_tls_version(A));
    cr_assert_eq(tu_run(bad_task, r), 0);
    cr_assert_eq(r[15], 8);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(r[i], -EINVAL, "call %d: %d", i, r[i]);
    /* A server context without a certificate. */
    cr_assert_eq(ferry_tls_ctx_new(&nocert, FERRY_TLS_SERVER, 0), 0);
    HS = (struct hs){ .s = B, .ctx = nocert, .server = true };
    tu_run(hs_task, &HS);
    cr_assert_eq(HS.rc, -EINVAL, "no certificate: %d", HS.rc);
    ferry_tls_ctx_free(nocert);
    /* Not in a task. */
    ferry_stream *o;
    cr_assert_eq(ferry_tls_client(&o, A, CLI, "localhost"), -EPERM);
    /* Already TLS. */
    connect_ab(CLI, "localhost", SRV);
    cr_assert_eq(HC.rc, 0);
    HC.rc = 1;
    tu_run(hs_task, &HC);
    cr_assert_eq(HC.rc, -EINVAL, "twice: %d", HC.rc);
    close_ab();
    done();
}

struct foreign {
    int rc[4];
};

static int foreign_task(void *arg)
{
    struct foreign *f = arg;
    ferry_stream *o;
    char b[4];
    size_t n;

    f->rc[0] = ferry_tls_client(&o, A, CLI, "localhost");
    f->rc[1] = ferry_tls_server(&o, B, SRV);
    f->rc[2] = ferry_stream_read(A, b, sizeof b, &n);
    f->rc[3] = ferry_stream_write(A, "x", 1, NULL);
    return 0;
}

static void *foreign_thread(void *arg)
{
    ferry_loop *loop2;

    if (ferry_loop_new(&loop2, NULL) != 0)
        return NULL;
    ferry_task_spawn(NULL, loop2, foreign_task, arg, NULL);
    ferry_loop_run(loop2, FERRY_RUN_DEFAULT);
    ferry_loop_free(loop2);
    return NULL;
}

T(a_task_of_another_loop_gets_eperm)
{
    struct foreign f;
    pthread_t th;

    memset(&f, 0, sizeof f);
    pair();
    connect_ab(CLI, "localhost", SRV);
    cr_assert_eq(HC.rc, 0);
    /* A is TLS now; B is made plain again for the handshake call. */
    close_ab();
    pair();
    connect_ab(CLI, "localhost", SRV);
    th = tu_start_thread(foreign_thread, &f);
    pthread_join(th, NULL);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(f.rc[i], -EPERM, "call %d: %d", i, f.rc[i]);
    close_ab();
    done();
}

/* ---- allocation failures ---------------------------------------------------------------------- */

/* Fail each of ferry's allocations in the handshake call, then each of
 * OpenSSL's: the call fails with a code (never crashes), and closing the
 * stream frees everything (ferry's count here, LeakSanitizer in its build). */
static unsigned long enomem_nth;    /* ferry's allocation to fail, or 0 */

/* A handshake that closes its stream when it fails, so that the peer
 * sees the end at once instead of waiting for its deadline. */
static int closing_hs_task(void *arg)
{
    struct hs *h = arg;

    hs_task(h);
    if (h->rc)
        ferry_stream_close(h->s);
    return 0;
}

static int enomem_task(void *arg)
{
    ferry_task *t;

    (void)arg;
    HS.server = true;
    if (ferry_task_spawn(&t, NULL, closing_hs_task, &HS, NULL) != 0)
        return -1;
    if (enomem_nth)
        ferry__fault_arm(enomem_nth, false);
    closing_hs_task(&HC);
    ferry_task_join(t, NULL);
    return 0;
}

/* Close what the handshakes left open. */
static void close_left(void)
{
    if (!HC.rc)
        cr_assert_eq(ferry_stream_close(A), 0);
    if (!HS.rc)
        cr_assert_eq(ferry_stream_close(B), 0);
}

T(allocation_failures_leave_nothing_behind)
{
    unsigned long n;
    int ok = 0, failed = 0;

    /* ferry's allocations: the state, the bytes already read. */
    for (unsigned long i = 1; i < 10; i++) {
        pair();
        HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000, .rc = 1 };
        HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000, .rc = 1 };
        enomem_nth = i;
        cr_assert_eq(tu_run(enomem_task, NULL), 0);
        enomem_nth = 0;
        n = ferry__fault_hits();
        ferry__fault_reset();
        if (!n) {
            cr_assert_eq(HC.rc, 0, "client: %d", HC.rc);
            close_left();
            break;
        }
        cr_assert(HC.rc == -ENOMEM || HS.rc == -ENOMEM, "fault %lu: client %d, server %d", i,
                  HC.rc, HS.rc);
        /* The side that failed is still a plain stream. */
        close_left();
        failed++;
    }
    cr_assert(failed >= 2, "ferry's allocations failed: %d", failed);

    /* OpenSSL's: the nth allocation from the handshake on fails, and all
     * after it, until the calls return. */
    for (unsigned long i = 1; i < 400; i += 13) {
        pair();
        HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 5000 };
        HS = (struct hs){ .s = B, .ctx = SRV, .ms = 5000 };
        ossl_count = 0;
        ossl_fail_at = i;
        ossl_armed = true;
        tu_run(enomem_task, NULL);
        ossl_armed = false;
        if (HC.rc == 0 && HS.rc == 0)
            ok++;
        else
            cr_assert(HC.rc < 0 || HS.rc < 0, "fault %lu: client %d, server %d", i, HC.rc, HS.rc);
        close_left();
    }
    fprintf(stderr, "tls: %d of 31 handshakes with failing OpenSSL allocations succeeded\n", ok);
    cr_assert(ok < 31, "no OpenSSL allocation failed");
    done();
}

/* ---- the write's records go out before it returns; early bytes -------------------------------- */

/* With a small socket buffer, the last records of a write do not fit at
 * once: the write must wait until they are out, or the reader never gets
 * them. */
struct smallbuf {
    int    wrc, rrc;
    size_t got;
    unsigned char *src;
};

static int smallbuf_writer(void *arg)
{
    struct smallbuf *k = arg;

    k->wrc = ferry_stream_write(A, k->src, 200000, NULL);
    return 0;
}

static int smallbuf_task(void *arg)
{
    struct smallbuf *k = arg;
    ferry_task *t;
    ferry_scope sc;
    unsigned char *buf = malloc(65536);

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc || !buf)
        goto out;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(5000), 0);
    ferry_task_spawn(&t, NULL, smallbuf_writer, k, NULL);
    while (k->got < 200000) {
        size_t n;
        k->rrc = ferry_stream_read(B, buf, 65536, &n);
        if (k->rrc || !n)
            break;
        k->got += n;
    }
    ferry_task_join(t, NULL);
    ferry_scope_exit(&sc);
out:
    free(buf);
    return 0;
}

T(a_write_returns_once_its_records_are_out)
{
    struct smallbuf k;
    int sz = 4096;

    memset(&k, 0, sizeof k);
    k.src = calloc(1, 200000);
    cr_assert_not_null(k.src);
    pair();
    cr_assert_eq(setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz), 0);
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    tu_run(smallbuf_task, &k);
    free(k.src);
    cr_assert_eq(HC.rc, 0);
    cr_assert_eq(k.wrc, 0, "write: %d", k.wrc);
    cr_assert_eq(k.rrc, 0, "read: %d", k.rrc);
    cr_assert_eq(k.got, 200000, "got %zu", k.got);
    close_ab();
    done();
}

/* STARTTLS: the server's plain stream has read the client's first TLS
 * bytes along with the plain command; the handshake must take them. */
struct starttls {
    int  rc[3];
    char cmd[16];
};

static int starttls_server(void *arg)
{
    struct starttls *k = arg;
    size_t n;

    ferry_sleep(tu_ms(50));    /* the client hello is there by now */
    k->rc[0] = ferry_stream_read_until(B, "\n", 1, k->cmd, sizeof k->cmd - 1, &n);
    k->cmd[n] = 0;
    k->rc[1] = (int)ferry_stream_buffered(B);    /* the client hello, read early */
    hs_task(&HS);
    return 0;
}

static int starttls_task(void *arg)
{
    struct starttls *k = arg;
    ferry_task *t;

    ferry_task_spawn(&t, NULL, starttls_server, k, NULL);
    k->rc[2] = ferry_stream_write(A, "STARTTLS\n", 9, NULL);
    hs_task(&HC);
    ferry_task_join(t, NULL);
    return 0;
}

T(bytes_read_before_the_handshake_are_its_start)
{
    struct starttls k;

    memset(&k, 0, sizeof k);
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000, .server = true };
    tu_run(starttls_task, &k);
    cr_assert_eq(k.rc[0], 0);
    cr_assert_str_eq(k.cmd, "STARTTLS\n");
    cr_assert_gt(k.rc[1], 0, "the client hello was not read early");
    cr_assert_eq(HS.rc, 0, "server: %d (%s)", HS.rc, HS.why);
    cr_assert_eq(HC.rc, 0, "client: %d (%s)", HC.rc, HC.why);
    close_ab();
    done();
}

/* ---- a broken stream, a busy or cancelled start, a name OpenSSL refuses ---- */

struct brk {
    int    rc[8];
    size_t n[2];
};

static int broken_task(void *arg)
{
    struct brk *b = arg;
    char buf[8];

    b->rc[0] = ferry_stream_read(A, buf, sizeof buf, &b->n[0]);
    b->rc[1] = ferry_stream_write(A, "x", 1, &b->n[1]);
    b->rc[2] = ferry_stream_write(A, NULL, 0, NULL);
    b->rc[3] = ferry_stream_shutdown(A);
    return 0;
}

/* After a handshake that failed, the stream is broken: its reads and
 * writes return -EPROTO at once, without touching the descriptor. */
T(a_stream_whose_handshake_failed_reads_and_writes_eproto)
{
    ferry_tls_ctx *wrong = server_with(F.wrong, F.wrong_key);
    struct brk b;

    memset(&b, 0x55, sizeof b);
    pair();
    connect_ab(CLI, "localhost", wrong);
    cr_assert_eq(HC.rc, -EKEYREJECTED, "client: %d (%s)", HC.rc, HC.why);
    cr_assert_eq(tu_run(broken_task, &b), 0);
    cr_assert_eq(b.rc[0], -EPROTO, "read: %d", b.rc[0]);
    cr_assert_eq(b.n[0], 0);
    cr_assert_eq(b.rc[1], -EPROTO, "write: %d", b.rc[1]);
    cr_assert_eq(b.n[1], 0);
    cr_assert_eq(b.rc[2], -EPROTO, "write of 0 bytes: %d", b.rc[2]);
    cr_assert_eq(b.rc[3], -EPROTO, "shutdown: %d", b.rc[3]);
    close_ab();
    ferry_tls_ctx_free(wrong);
    done();
}

static int reader_of_a(void *arg)
{
    char buf[4];
    size_t n;

    (void)arg;
    return ferry_stream_read(A, buf, sizeof buf, &n);
}

static int start_refusals_task(void *arg)
{
    int *r = arg;
    ferry_stream *o = (ferry_stream *)1;
    ferry_task *t = tu_spawn(reader_of_a, NULL);
    char host[300], buf[8];

    tu_settle();
    /* A task is inside a read on A. */
    r[0] = ferry_tls_client(&o, A, CLI, "localhost");
    r[1] = o == (ferry_stream *)1;    /* *out not written */
    ferry_task_cancel(t);
    r[2] = tu_join(t);
    /* A name longer than SNI allows: OpenSSL refuses it. */
    memset(host, 'a', sizeof host - 1);
    host[sizeof host - 1] = '\0';
    r[3] = ferry_tls_client(&o, B, CLI, host);
    /* Nothing of a handshake went out of A or B. */
    r[4] = recv(sp[0], buf, sizeof buf, MSG_DONTWAIT) == -1 && errno == EAGAIN &&
           recv(sp[1], buf, sizeof buf, MSG_DONTWAIT) == -1 && errno == EAGAIN;
    /* Closed, while a woken reader has not left it yet. */
    t = tu_spawn(reader_of_a, NULL);
    tu_settle();
    r[5] = ferry_stream_close(A);
    r[6] = ferry_tls_client(&o, A, CLI, "localhost");
    r[7] = tu_join(t);
    /* A cancelled task: a cancellation point, nothing begun. */
    ferry_task_cancel(ferry_task_current());
    r[8] = ferry_tls_client(&o, B, CLI, "localhost");
    return 0;
}

T(a_start_is_ebusy_ebadf_or_einval_for_a_name_openssl_refuses_and_is_a_cancellation_point)
{
    int r[9];

    memset(r, 0x55, sizeof r);
    pair();
    cr_assert_eq(tu_run(start_refusals_task, r), 0);
    cr_assert_eq(r[0], -EBUSY, "during a read: %d", r[0]);
    cr_assert_eq(r[1], 1);
    cr_assert_eq(r[2], -ECANCELED);
    cr_assert_eq(r[3], -EINVAL, "a 299-byte name: %d", r[3]);
    cr_assert_eq(r[4], 1, "bytes went out");
    cr_assert_eq(r[5], 0);
    cr_assert_eq(r[6], -EBADF, "a closed stream: %d", r[6]);
    cr_assert_eq(r[7], -EBADF);
    cr_assert_eq(r[8], -ECANCELED, "cancelled: %d", r[8]);
    cr_assert_eq(ferry_stream_close(B), 0);
    done();
}

struct shw { int rc[4]; size_t n[2]; };

static int shut_then_write_task(void *arg)
{
    struct shw *k = arg;
    char buf[8];

    handshake_both(&HC, &HS);
    if (HC.rc || HS.rc)
        return 0;
    k->rc[0] = ferry_stream_shutdown(A);
    k->rc[1] = ferry_stream_write(A, "late", 4, &k->n[0]);
    /* The server reads close_notify: the end, nothing of the late write. */
    k->rc[2] = ferry_stream_read(B, buf, sizeof buf, &k->n[1]);
    return 0;
}

/* After ferry_stream_shutdown() (close_notify sent) a write is -EPIPE, as
 * on a socket whose write side is shut, and sends nothing. */
T(a_write_after_shutdown_is_epipe_and_sends_nothing)
{
    struct shw k;

    memset(&k, 0x55, sizeof k);
    pair();
    HC = (struct hs){ .s = A, .ctx = CLI, .host = "localhost", .ms = 10000 };
    HS = (struct hs){ .s = B, .ctx = SRV, .ms = 10000 };
    cr_assert_eq(tu_run(shut_then_write_task, &k), 0);
    cr_assert_eq(HC.rc, 0, "client: %d (%s)", HC.rc, HC.why);
    cr_assert_eq(HS.rc, 0, "server: %d (%s)", HS.rc, HS.why);
    cr_assert_eq(k.rc[0], 0);
    cr_assert_eq(k.rc[1], -EPIPE, "write after shutdown: %d", k.rc[1]);
    cr_assert_eq(k.n[0], 0);
    cr_assert_eq(k.rc[2], 0);
    cr_assert_eq(k.n[1], 0);
    close_ab();
    done();
}

static int reset_then_start_task(void *arg)
{
    int *r = arg;
    ferry_stream *o = (ferry_stream *)1;
    char buf[8];
    size_t n;

    r[0] = ferry_stream_read(A, buf, sizeof buf, &n);
    r[1] = ferry_tls_client(&o, A, CLI, "localhost");
    r[2] = o == (ferry_stream *)1;    /* *out not written */
    return 0;
}

/* A plain stream whose descriptor failed (the peer reset it) cannot start
 * TLS: the start returns the descriptor's error. */
T(a_start_on_a_stream_whose_peer_reset_returns_the_error)
{
    int r[3];

    memset(r, 0x55, sizeof r);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    cr_assert_eq(ferry_stream_open(&A, tu_loop, sp[0], NULL), 0);
    /* The peer closes with our bytes unread: a reset for A. */
    cr_assert_eq(write(sp[0], "zz", 2), 2);
    cr_assert_eq(close(sp[1]), 0);
    cr_assert_eq(tu_run(reset_then_start_task, r), 0);
    cr_assert_eq(r[0], -ECONNRESET, "read: %d", r[0]);
    cr_assert_eq(r[1], -ECONNRESET, "start: %d", r[1]);
    cr_assert_eq(r[2], 1);
    cr_assert_eq(ferry_stream_close(A), 0);
    done();
}

/* ---- the in-place form ------------------------------------------------------------------ */

/* Descriptors the process has open now. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

#define FLOOD 100

struct flood {
    int  port;
    int  fds_before, fds_after;   /* with the listener open, both times */
    int  accepted;
    int  eproto;                  /* handshakes that failed with -EPROTO */
    int  same;                    /* ... that left s as it was */
    int  why;                     /* ... whose s still had the reason */
    int  closed;                  /* ferry_stream_close(s) == 0 after it */
    char first_why[200];
};

/* A client that speaks plain HTTP to a TLS port, then goes. */
static int plain_client(void *arg)
{
    struct flood *k = arg;
    static const char req[] = "GET / HTTP/1.0\r\n\r\n";
    ferry_stream *c;

    if (ferry_tcp_connect(&c, "127.0.0.1", k->port, NULL) != 0)
        return -1;
    ferry_stream_write(c, req, sizeof req - 1, NULL);
    ferry_stream_close(c);
    return 0;
}

/* An acceptor written with the in-place form, ferry_tls_server(&s, s, ctx):
 * every failed handshake must leave `s` for the caller to close. */
static int flood_task(void *arg)
{
    struct flood *k = arg;
    ferry_listener *l;
    ferry_scope sc;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(30000), 0);
    if (ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL) != 0)
        goto out;
    k->port = ferry_listener_port(l);
    /* Round 0 is not counted: the first connect makes the loop's resolver,
     * whose socket stays. */
    for (int i = 0; i <= FLOOD; i++) {
        ferry_stream *s, *was;
        ferry_task *t;
        const char *why;
        int rc;

        if (i == 1)
            k->fds_before = open_fds();
        t = tu_spawn(plain_client, k);
        if (ferry_listener_accept(l, &s, NULL) != 0) {
            tu_join(t);
            break;
        }
        if (i == 0) {
            ferry_stream_close(s);
            tu_join(t);
            continue;
        }
        k->accepted++;
        was = s;
        rc = ferry_tls_server(&s, s, SRV);
        if (rc == -EPROTO)
            k->eproto++;
        if (s == was)
            k->same++;
        why = ferry_tls_last_error(s);
        if (why && *why) {
            k->why++;
            if (!k->first_why[0])
                snprintf(k->first_why, sizeof k->first_why, "%s", why);
        }
        if (ferry_stream_close(s) == 0)
            k->closed++;
        tu_join(t);
    }
    k->fds_after = open_fds();
    ferry_listener_close(l);
out:
    ferry_scope_exit(&sc);
    return 0;
}

/* A flood of plain-text clients at an acceptor that writes the handshake
 * in place: each failed handshake leaves the stream where it was, with its
 * reason, and closing it gives the descriptor back. */
T(the_in_place_form_keeps_the_stream_when_the_handshake_fails)
{
    struct flood k;

    memset(&k, 0, sizeof k);
    cr_assert_eq(tu_run(flood_task, &k), 0);
    cr_assert_eq(k.accepted, FLOOD, "accepted %d of %d", k.accepted, FLOOD);
    cr_expect_eq(k.eproto, FLOOD, "%d of %d handshakes were -EPROTO", k.eproto, FLOOD);
    cr_expect_eq(k.same, FLOOD, "%d of %d failed handshakes left s as it was", k.same, FLOOD);
    cr_expect_eq(k.why, FLOOD, "%d of %d had a reason (the first: '%s')", k.why, FLOOD,
                 k.first_why);
    cr_expect_eq(k.closed, FLOOD, "%d of %d closed", k.closed, FLOOD);
    cr_expect_eq(k.fds_after, k.fds_before, "%d descriptors open before the flood, %d after",
                 k.fds_before, k.fds_after);
    done();
}

/* ---- a line that comes with the last handshake flight ----------------------------------- */

/*
 * STARTTLS, with the client's first line in the same receive as its
 * Finished.  The plain read of "STARTTLS\n" (with the client hello behind
 * it) is short, so the stream clears its readable bit and counts on the
 * next edge.  The handshake then receives without looking at that bit;
 * when its last receive also takes the line, the socket is empty again by
 * the time epoll looks, so the edge for those bytes is never reported,
 * and the line waits inside the TLS transport for a read that waits for
 * the descriptor.
 *
 * To get that order every time, the server's transport is wrapped: its
 * first receive after it has sent its flight waits until the client, on a
 * loop of its own on another thread, has finished its handshake and
 * written the line.
 */
static struct ferry__stream_io hold_io;   /* ferry__sock_io, with the two below */
static bool hold_sent;                    /* the server sent (loop thread) */
static bool hold_done;                    /* the hold happened (loop thread) */
static atomic_int hold_client_wrote;      /* set by the client's thread */

static ssize_t hold_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    ssize_t k = ferry__sock_io.send(s, iov, n, want);

    if (k > 0)
        hold_sent = true;
    return k;
}

static ssize_t hold_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    if (hold_sent && !hold_done) {
        struct timespec ms = { 0, 1000000 };

        hold_done = true;
        for (int i = 0; i < 20000 && !atomic_load(&hold_client_wrote); i++)
            nanosleep(&ms, NULL);
    }
    return ferry__sock_io.recv(s, buf, len, want);
}

struct late {
    int  fd;              /* the client's end of the socketpair */
    int  crc[4];          /* client: open, write, start, write */
    int  creply;          /* client: the reply's read */
    char reply[16];
    int  cmd_rc;          /* server: the plain read */
    char cmd[16];
    bool cleared;         /* the plain read left the readable bit clear */
    int  src;             /* server: the handshake */
    int  lrc;             /* server: the read of the line */
    char line[16];
};

static int late_client_task(void *arg)
{
    struct late *k = arg;
    ferry_stream *c;
    ferry_scope sc;
    size_t n;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(20000), 0);
    k->crc[0] = ferry_stream_open(&c, NULL, k->fd, NULL);
    if (k->crc[0]) {
        close(k->fd);
        atomic_store(&hold_client_wrote, 1);
        goto out;
    }
    k->crc[1] = ferry_stream_write(c, "STARTTLS\n", 9, NULL);
    k->crc[2] = ferry_tls_client(&c, c, CLI, "localhost");
    if (!k->crc[2])
        k->crc[3] = ferry_stream_write(c, "hello\n", 6, NULL);
    atomic_store(&hold_client_wrote, 1);
    if (!k->crc[2] && !k->crc[3]) {
        k->creply = ferry_stream_read_until(c, "\n", 1, k->reply, sizeof k->reply - 1, &n);
        k->reply[n] = 0;
    }
    ferry_stream_close(c);
out:
    ferry_scope_exit(&sc);
    return 0;
}

static void *late_client_thread(void *arg)
{
    ferry_loop *loop;

    if (ferry_loop_new(&loop, NULL) != 0) {
        atomic_store(&hold_client_wrote, 1);
        return NULL;
    }
    ferry_task_spawn(NULL, loop, late_client_task, arg, NULL);
    ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    ferry_loop_free(loop);
    return NULL;
}

static int late_server_task(void *arg)
{
    struct late *k = arg;
    ferry_scope sc;
    size_t n;
    int avail = 0;

    /* The command and the client hello behind it, before the plain read. */
    for (int i = 0; i < 10000 && avail <= 9; i++) {
        if (ioctl(sp[1], FIONREAD, &avail) != 0)
            break;
        if (avail <= 9)
            ferry_sleep(tu_ms(1));
    }
    k->cmd_rc = ferry_stream_read_until(B, "\n", 1, k->cmd, sizeof k->cmd - 1, &n);
    k->cmd[n] = 0;
    k->cleared = !(B->reg.ready & FERRY_READ) || B->reg.mode != FERRY__IO_EPOLL;
    hold_io = ferry__sock_io;
    hold_io.send = hold_send;
    hold_io.recv = hold_recv;
    B->io = &hold_io;
    k->src = ferry_tls_server(&B, B, SRV);
    if (k->src)
        return 0;
    /* The line is in: a read must not wait for the descriptor. */
    ferry_scope_enter(&sc, ferry_now() + tu_ms(2000), 0);
    k->lrc = ferry_stream_read_until(B, "\n", 1, k->line, sizeof k->line - 1, &n);
    k->line[n] = 0;
    ferry_scope_exit(&sc);
    if (!k->lrc)
        ferry_stream_write(B, "ok\n", 3, NULL);
    return 0;
}

T(after_starttls_a_line_that_came_with_the_handshake_is_read_at_once)
{
    struct late k;
    pthread_t th;

    if (on_uring())
        cr_skip_test("it puts the epoll backend's transport under the stream (FERRY_IO=uring)");

    memset(&k, 0, sizeof k);
    hold_sent = hold_done = false;
    atomic_store(&hold_client_wrote, 0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    cr_assert_eq(ferry_stream_open(&B, tu_loop, sp[1], NULL), 0);
    k.fd = sp[0];
    th = tu_start_thread(late_client_thread, &k);
    cr_assert_eq(tu_run(late_server_task, &k), 0);
    /* Unblocks the client if the server gave up on the line. */
    cr_assert_eq(ferry_stream_close(B), 0);
    pthread_join(th, NULL);
    cr_assert_eq(k.cmd_rc, 0);
    cr_assert_str_eq(k.cmd, "STARTTLS\n");
    cr_assert(k.cleared, "the plain read left the readable bit set: the test shows nothing");
    cr_assert(hold_done, "the server's handshake never received after sending");
    cr_assert_eq(k.src, 0, "server handshake: %d", k.src);
    cr_assert_eq(k.crc[0], 0);
    cr_assert_eq(k.crc[1], 0);
    cr_assert_eq(k.crc[2], 0, "client handshake: %d", k.crc[2]);
    cr_assert_eq(k.crc[3], 0);
    cr_expect_eq(k.lrc, 0, "the line that came with the handshake: %d", k.lrc);
    cr_expect_str_eq(k.line, "hello\n");
    cr_expect_eq(k.creply, 0, "the client's read of the reply: %d", k.creply);
    cr_expect_str_eq(k.reply, "ok\n");
    done();
}

/*
 * The same shape without STARTTLS, on the client's side: right after a
 * connect the readable bit is clear (only writability said the connect
 * was done).  A TLS 1.2 server that greets as soon as its handshake is
 * done (as IMAPS and SMTPS servers do) sends its greeting right behind
 * its Finished, and the client's last handshake receive takes both.
 * Every receive of the client's transport after it has sent waits until
 * all that the server has sent by then (its flight; then its Finished and
 * greeting) is in the client's socket.
 */
struct greet {
    atomic_int  port;          /* the server's, once it listens */
    atomic_long srv_sent;      /* bytes the server's transport sent */
    atomic_int  greeted;       /* the server's greeting was written */
    long        cli_got;       /* bytes the client's transport received */
    bool        cli_sent;      /* the client's transport sent */
    int         holds;         /* receives held so far */
    int         src, swrc, srrc;
    char        bye[16];
    int         crc[3];
    char        greeting[32];
};

static struct greet *G;
static struct ferry__stream_io greet_srv_io, greet_cli_io;

static ssize_t greet_srv_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    ssize_t k = ferry__sock_io.send(s, iov, n, want);

    if (k > 0)
        atomic_fetch_add(&G->srv_sent, k);
    return k;
}

static ssize_t greet_cli_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    ssize_t k = ferry__sock_io.send(s, iov, n, want);

    if (k > 0)
        G->cli_sent = true;
    return k;
}

/* Wait (10 s at most) until every byte the server has sent, and its
 * greeting if `greeting`, is in the client's socket. */
static void greet_wait(int fd, bool greeting)
{
    struct timespec ms = { 0, 1000000 };

    for (int i = 0; i < 10000; i++) {
        int avail = 0;
        long sent = atomic_load(&G->srv_sent);

        if (ioctl(fd, FIONREAD, &avail) != 0)
            return;
        if (sent > 0 && G->cli_got + avail >= sent && (!greeting || atomic_load(&G->greeted)))
            return;
        nanosleep(&ms, NULL);
    }
}

static ssize_t greet_cli_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    ssize_t k;

    /* The first receive after the client hello waits for the server's
     * flight, the second (after the client's Finished) for the server's
     * Finished and greeting. */
    if (G->cli_sent && G->holds < 2)
        greet_wait(s->reg.fd, ++G->holds == 2);
    k = ferry__sock_io.recv(s, buf, len, want);
    if (k > 0)
        G->cli_got += k;
    return k;
}

static int greet_server_task(void *arg)
{
    ferry_tls_ctx *srv12 = arg;
    ferry_listener *l;
    ferry_stream *s;
    ferry_scope sc;
    size_t n;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(20000), 0);
    G->src = ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL);
    if (G->src) {
        atomic_store(&G->port, -1);
        goto out;
    }
    atomic_store(&G->port, ferry_listener_port(l));
    G->src = ferry_listener_accept(l, &s, NULL);
    ferry_listener_close(l);
    if (G->src)
        goto out;
    greet_srv_io = ferry__sock_io;
    greet_srv_io.send = greet_srv_send;
    s->io = &greet_srv_io;
    G->src = ferry_tls_server(&s, s, srv12);
    if (!G->src) {
        G->swrc = ferry_stream_write(s, "* OK ready\n", 11, NULL);
        atomic_store(&G->greeted, 1);
        G->srrc = ferry_stream_read_until(s, "\n", 1, G->bye, sizeof G->bye - 1, &n);
        G->bye[n] = 0;
    }
    atomic_store(&G->greeted, 1);
    ferry_stream_close(s);
out:
    ferry_scope_exit(&sc);
    return 0;
}

static void *greet_server_thread(void *arg)
{
    ferry_loop *loop;

    if (ferry_loop_new(&loop, NULL) != 0) {
        atomic_store(&G->port, -1);
        return NULL;
    }
    ferry_task_spawn(NULL, loop, greet_server_task, arg, NULL);
    ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    ferry_loop_free(loop);
    return NULL;
}

static int greet_client_task(void *arg)
{
    ferry_stream *c;
    ferry_scope sc;
    size_t n;
    int port;

    (void)arg;
    while ((port = atomic_load(&G->port)) == 0)
        ferry_sleep(tu_ms(1));
    if (port < 0)
        return 0;
    G->crc[0] = ferry_tcp_connect(&c, "127.0.0.1", port, NULL);
    if (G->crc[0])
        return 0;
    /* A connect that waited (loopback's do) leaves the bit clear; one
     * that completed at once would leave it set.  Nothing can have come
     * yet (the server waits for the client hello), so clear is true. */
    c->reg.ready &= (uint8_t)~FERRY_READ;
    greet_cli_io = ferry__sock_io;
    greet_cli_io.send = greet_cli_send;
    greet_cli_io.recv = greet_cli_recv;
    c->io = &greet_cli_io;
    G->crc[1] = ferry_tls_client(&c, c, CLI, "localhost");
    if (!G->crc[1]) {
        ferry_scope_enter(&sc, ferry_now() + tu_ms(2000), 0);
        G->crc[2] = ferry_stream_read_until(c, "\n", 1, G->greeting, sizeof G->greeting - 1, &n);
        G->greeting[n] = 0;
        ferry_scope_exit(&sc);
        if (!G->crc[2])
            ferry_stream_write(c, "bye\n", 4, NULL);
    }
    ferry_stream_close(c);
    return 0;
}

T(after_a_connect_a_greeting_that_came_with_the_handshake_is_read_at_once)
{
    struct greet k;
    ferry_tls_ctx *srv12 = server_with(F.server, F.server_key);

    if (on_uring())
        cr_skip_test("it puts the epoll backend's transport under the stream (FERRY_IO=uring)");
    pthread_t th;

    memset(&k, 0, sizeof k);
    G = &k;
    cr_assert_eq(SSL_CTX_set_max_proto_version(ferry_tls_ctx_openssl(srv12), TLS1_2_VERSION), 1);
    th = tu_start_thread(greet_server_thread, srv12);
    cr_assert_eq(tu_run(greet_client_task, NULL), 0);
    pthread_join(th, NULL);
    ferry_tls_ctx_free(srv12);
    cr_assert_eq(k.crc[0], 0, "connect: %d", k.crc[0]);
    cr_assert_eq(k.crc[1], 0, "client handshake: %d", k.crc[1]);
    cr_assert_eq(k.holds, 2, "%d receives held, not 2", k.holds);
    cr_assert_eq(k.swrc, 0, "the server's greeting: %d", k.swrc);
    cr_expect_eq(k.crc[2], 0, "the greeting that came with the handshake: %d", k.crc[2]);
    cr_expect_str_eq(k.greeting, "* OK ready\n");
    cr_expect_eq(k.srrc, 0, "the server's read of the client's answer: %d", k.srrc);
    cr_expect_str_eq(k.bye, "bye\n");
    done();
}
