/* tls_script.c - see tls_script.h.
 *
 * The input: byte 0 picks the largest fragment the relay delivers (1, 2,
 * 7, 64, 600 or 17,000 bytes) and byte 1 the largest piece the client
 * writes; the fragment and piece sizes are then drawn, below those, from
 * the input's own bytes in turn.  The plaintext is the whole input.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "tls_certs.h"
#include "tls_script.h"

static ferry_tls_ctx *server_ctx, *client_ctx;

/* The contexts, made once per process from certificates made now. */
static int contexts(void)
{
    struct tc_files f;
    int rc;

    if (server_ctx)
        return 0;
    if (tc_files_make(&f) != 0)
        return -1;
    rc = ferry_tls_ctx_new(&server_ctx, FERRY_TLS_SERVER, 0);
    if (!rc)
        rc = ferry_tls_ctx_load_cert(server_ctx, f.server, f.server_key);
    if (!rc)
        rc = ferry_tls_ctx_new(&client_ctx, FERRY_TLS_CLIENT, 0);
    if (!rc)
        rc = ferry_tls_ctx_load_ca(client_ctx, f.ca, NULL);
    tc_files_remove(&f);
    return rc ? -1 : 0;
}

/* One direction of the relay. */
struct leg {
    struct run   *r;
    ferry_stream *from, *to;
    size_t        at;
};

struct run {
    const uint8_t *data;
    size_t         size;
    size_t         frag_max;    /* the relay's largest fragment */
    size_t         piece_max;   /* the client's largest write */
    ferry_stream  *cli, *srv;   /* the TLS ends */
    ferry_stream  *rc_, *rs;    /* the relay's ends: facing the client, the server */
    unsigned char *got;
    size_t         got_len;
    int            crc, src, end;
    char          *why;
    size_t         why_len;
    /* In the run, not on main_task's stack: relays that a deadline left
     * running are ended by ferry_loop_free(), after main_task. */
    struct leg     up, down;
};

/* A size in 1..max drawn from the input's bytes, in turn. */
static size_t draw(const struct run *r, size_t *at, size_t max)
{
    size_t v;

    if (max <= 1 || r->size == 0)
        return 1;
    v = r->data[*at % r->size] | (size_t)r->data[(*at + 1) % r->size] << 8;
    *at += 2;
    return 1 + v % max;
}


/* Copy one direction in fragments, yielding after each so that the TLS
 * reader on the other side sees partial records. */
static int relay(void *arg)
{
    struct leg *l = arg;
    unsigned char *buf = malloc(17000);

    while (buf) {
        size_t n, k = draw(l->r, &l->at, l->r->frag_max);
        if (ferry_stream_read(l->from, buf, k, &n) != 0 || n == 0)
            break;
        if (ferry_stream_write(l->to, buf, n, NULL) != 0)
            break;
        ferry_yield();
    }
    free(buf);
    ferry_stream_shutdown(l->to);
    return 0;
}

static int server(void *arg)
{
    struct run *r = arg;
    ferry_stream *o;
    size_t n;
    int rc;

    r->src = ferry_tls_server(&o, r->srv, server_ctx);
    if (r->src)
        return 0;
    for (;;) {
        rc = ferry_stream_read_until(r->srv, "\n", 1, r->got + r->got_len,
                                     TLS_SCRIPT_MAX + 1 - r->got_len, &n);
        r->got_len += n;
        if (rc) {
            r->end = rc;
            break;
        }
    }
    return 0;
}

static int client(void *arg)
{
    struct run *r = arg;
    ferry_stream *o;
    size_t at = 7, off = 0;

    r->crc = ferry_tls_client(&o, r->cli, client_ctx, "localhost");
    while (!r->crc && off < r->size) {
        size_t k = draw(r, &at, r->piece_max);
        if (k > r->size - off)
            k = r->size - off;
        r->crc = ferry_stream_write(r->cli, r->data + off, k, NULL);
        off += k;
    }
    if (!r->crc)
        r->crc = ferry_stream_shutdown(r->cli);    /* close_notify */
    /* The socket could not take the alert at once (the relay has not read
     * yet): a write of 0 bytes waits until it is out (ferry/tls.h). */
    if (r->crc == -EAGAIN)
        r->crc = ferry_stream_write(r->cli, "", 0, NULL);
    return 0;
}

static int main_task(void *arg)
{
    struct run *r = arg;
    ferry_task *t[4];
    ferry_scope sc;

    /* A stuck exchange fails the input instead of hanging the fuzzer. */
    ferry_scope_enter(&sc, ferry_now() + (int64_t)20 * 1000000000, 0);
    r->up = (struct leg){ r, r->rc_, r->rs, 3 };
    r->down = (struct leg){ r, r->rs, r->rc_, 5 };
    ferry_task_spawn(&t[0], NULL, relay, &r->up, NULL);
    ferry_task_spawn(&t[1], NULL, relay, &r->down, NULL);
    ferry_task_spawn(&t[2], NULL, server, r, NULL);
    ferry_task_spawn(&t[3], NULL, client, r, NULL);
    ferry_task_join(t[3], NULL);
    ferry_task_join(t[2], NULL);
    /* The server has read to the end: the relays end with the streams. */
    ferry_stream_close(r->cli);
    ferry_stream_close(r->srv);
    ferry_task_join(t[0], NULL);
    ferry_task_join(t[1], NULL);
    ferry_scope_exit(&sc);
    return 0;
}

int tls_script_run(const uint8_t *data, size_t size, char *why, size_t len)
{
    static const size_t frags[] = { 1, 2, 7, 64, 600, 17000 };
    struct run r;
    ferry_loop *loop;
    int a[2], b[2], fail = 0;

    if (size > TLS_SCRIPT_MAX)
        size = TLS_SCRIPT_MAX;
    if (contexts() != 0) {
        snprintf(why, len, "could not make the contexts");
        return -1;
    }
    memset(&r, 0, sizeof r);
    r.data = data;
    r.size = size;
    r.frag_max = frags[(size ? data[0] : 0) % 6];
    r.piece_max = size > 1 ? 1 + (size_t)data[1] * 64 : 1;
    r.got = malloc(TLS_SCRIPT_MAX + 1);
    if (!r.got || ferry_loop_new(&loop, NULL) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b) != 0) {
        snprintf(why, len, "setup failed");
        free(r.got);
        return -1;
    }
    if (ferry_stream_open(&r.cli, loop, a[0], NULL) || ferry_stream_open(&r.rc_, loop, a[1], NULL) ||
        ferry_stream_open(&r.rs, loop, b[0], NULL) || ferry_stream_open(&r.srv, loop, b[1], NULL)) {
        snprintf(why, len, "stream_open failed");
        abort();
    }
    ferry_task_spawn(NULL, loop, main_task, &r, NULL);
    ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    ferry_stream_close(r.rc_);
    ferry_stream_close(r.rs);
    ferry_loop_free(loop);
    if (r.crc || r.src) {
        snprintf(why, len, "client %d, server %d", r.crc, r.src);
        fail = 1;
    } else if (r.end != -ENODATA) {
        snprintf(why, len, "the server's reads ended with %d, not the end (-ENODATA)", r.end);
        fail = 1;
    } else if (r.got_len != size || (size && memcmp(r.got, data, size) != 0)) {
        snprintf(why, len, "the server got %zu bytes, %s the %zu sent", r.got_len,
                 r.got_len == size ? "other than" : "not", size);
        fail = 1;
    }
    free(r.got);
    return fail ? -1 : 0;
}
