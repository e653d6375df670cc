/* tls.c - TLS over a stream with OpenSSL: a transport of the stream seam
 * (stream_int.h), contexts and handshakes.
 * Loop thread only, except the contexts (set up on any thread, then only
 * read).
 *
 * Memory BIOs, not OpenSSL on the descriptor.  The SSL object reads and
 * writes a BIO pair; this file moves ciphertext between the pair and the
 * descriptor with the stream's own transport (recv, send with
 * MSG_NOSIGNAL), so that:
 *   - OpenSSL never touches the descriptor: no SIGPIPE (its socket BIO
 *     writes without MSG_NOSIGNAL), and every wait is the stream's own
 *     wait, with its readiness bits, cancellation and close;
 *   - a write never leaves a half-written record inside OpenSSL.  OpenSSL
 *     has encrypted a record before it knows whether the descriptor takes
 *     it, and wants the same buffer again after SSL_ERROR_WANT_WRITE; a
 *     cancelled write would then leave bytes that are neither written nor
 *     free to change.  Here plaintext goes to SSL_write_ex only when the
 *     pair has room for the whole record, so it always succeeds, and the
 *     bytes count as written at once (stream_int.h, flush);
 *   - reads are cancel-safe with nothing to add: ciphertext waits in the
 *     pair, plaintext in the stream's buffer.
 * The pair's buffers let one recv(2) take up to PAIR_IN bytes of records
 * and one send(2) give several records at once; SSL_read_ex decrypts
 * straight into the stream's buffer (or the caller's).
 *
 * OpenSSL's error queue belongs to the thread, which all the loop's tasks
 * share: every SSL call starts with ERR_clear_error() and its result is
 * read (SSL_get_error, the reason) before anything that may suspend.
 *
 * After the handshake, a reader and a writer may use the SSL object in
 * turn: no call into OpenSSL suspends, so they never interleave inside
 * it.  Renegotiation is off, so a write never needs to read.  A read that
 * produces output (a TLS 1.3 key update's answer) sends it when the
 * descriptor takes it, and otherwise waits for writability as well as
 * readability, so that the answer is not left behind while the peer
 * waits for it.
 */
/* OpenSSL's headers include <pthread.h> for their types: it comes first,
 * so that loop_only.h's poison (next) does not trip over the declarations
 * in it; calling a poisoned function here is still an error. */
#include <pthread.h>
#include "loop_only.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "loop_int.h"
#include "stream_int.h"
#include "ferry/tls.h"

/* Sizes of the BIO pair's buffers: ciphertext from the descriptor, and
 * records for it. */
#define PAIR_IN  ((size_t)64 * 1024)
#define PAIR_OUT ((size_t)64 * 1024)
/* Most plaintext one SSL_write_ex is given: one record. */
#define REC_MAX ((size_t)16 * 1024)
/* What a record adds to its plaintext, with room to spare (TLS 1.2 CBC
 * with SHA-384 adds 85 bytes), plus a key update message that OpenSSL may
 * send before it. */
#define REC_ROOM ((size_t)512)

struct ferry_tls_ctx {
    SSL_CTX *ssl_ctx; /* OpenSSL's context */
    int role;         /* FERRY_TLS_CLIENT or FERRY_TLS_SERVER */
    unsigned flags;   /* FERRY_TLS_* */
    bool own_ca;      /* ferry_tls_ctx_load_ca() replaced the system's store */
    bool has_cert;    /* ferry_tls_ctx_load_cert() succeeded */
};

/* States of a TLS stream. */
enum { TLS_HANDSHAKE = 0, TLS_OPEN, TLS_BROKEN };

/* A TLS stream's transport state (s->io_ctx). */
struct tls {
    SSL *ssl;                             /* owns the inner half of the pair */
    BIO *net;                             /* the outer half: this file's */
    const struct ferry__stream_io *lower; /* the descriptor's transport */
    char *pre;                            /* ciphertext the plain stream had
                                               * read before the handshake */
    size_t pre_len;                       /* its length */
    size_t pre_off;                       /* how much went into the pair */
    unsigned flags;                       /* the context's FERRY_TLS_* */
    int state;                            /* TLS_* */
    int broken;                           /* TLS_BROKEN: what calls return */
    bool fatal;                           /* OpenSSL failed: no SSL_shutdown */
    bool fd_eof;                          /* the descriptor's end was read */
    bool shut;                            /* SSL_shutdown() was called */
    bool fin;                             /* shut the descriptor's write side
                                               * once the output is out */
    char why[200];                        /* ferry_tls_last_error() */
};

static const struct ferry__stream_io tls_io;

static struct tls *tls_of(const ferry_stream *s)
{
    return s && !s->reg.closed && s->io == &tls_io ? s->io_ctx : NULL;
}

/* ---- errors --------------------------------------------------------------- */

/* Keep OpenSSL's reason for the error at the head of the queue (and what
 * a certificate check said) in t->why; the code for it. */
static int tls_fail(struct tls *t, int sslerr)
{
    unsigned long e = ERR_peek_error();
    long v = SSL_get_verify_result(t->ssl);
    int rc = -EPROTO;

    t->fatal = true;
    if (ERR_GET_REASON(e) == ERR_R_MALLOC_FAILURE) {
        rc = -ENOMEM;
    } else if (t->fd_eof && (sslerr == SSL_ERROR_SYSCALL ||
                             ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING)) {
        snprintf(t->why, sizeof t->why, "the peer closed the connection without close_notify");
        ERR_clear_error();
        return -ECONNABORTED;
    } else if (ERR_GET_LIB(e) == ERR_LIB_SSL &&
               (ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED ||
                ERR_GET_REASON(e) == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)) {
        /* A server that requires a client certificate refuses a client
         * without one as one whose certificate does not verify. */
        rc = -EKEYREJECTED;
    }
    if (rc == -EKEYREJECTED && v != X509_V_OK) {
        snprintf(t->why, sizeof t->why, "certificate verify failed: %s",
                 X509_verify_cert_error_string(v));
    } else if (e) {
        ERR_error_string_n(e, t->why, sizeof t->why);
    } else {
        snprintf(t->why, sizeof t->why, "TLS error %d", sslerr);
    }
    ERR_clear_error();
    return rc;
}

/* ---- moving ciphertext ------------------------------------------------------ */

/*
 * Send what the pair holds for the descriptor, then (t->fin) shut the
 * descriptor's write side.  Returns: 0 (nothing left); -EAGAIN with *want;
 * an error of the descriptor.
 */
static int net_flush(ferry_stream *s, struct tls *t, int *want)
{
    char *p;
    int n;

    while ((n = BIO_nread0(t->net, &p)) > 0) {
        struct iovec iov = { p, (size_t)n };
        ssize_t k = t->lower->send(s, &iov, 1, want);
        if (k < 0)
            return (int)k;
        BIO_nread(t->net, &p, (int)k);
    }
    if (t->fin) {
        t->fin = false;
        /* A pipe has no write side to shut: close_notify is what counts. */
        int rc = t->lower->shutdown(s);
        if (rc && rc != -ENOTSOCK && rc != -ENOTCONN)
            return rc;
    } else if (t->lower->flush) {
        /* A transport below with buffers of its own (io_uring's sends):
         * the records are sent once it has handed them to the kernel. */
        return t->lower->flush(s, want);
    }
    return 0;
}

/* The transport's flush (stream_int.h). */
static int tls_flush(ferry_stream *s, int *want)
{
    struct tls *t = s->io_ctx;

    if (t->state == TLS_BROKEN)
        return t->broken;
    return net_flush(s, t, want);
}

/*
 * Bring ciphertext into the pair: what the plain stream had read first,
 * then from the descriptor.  Returns: the count (> 0); 0 at the
 * descriptor's end (the pair then says end of input to OpenSSL); -EAGAIN
 * with *want; an error of the descriptor.
 */
static ssize_t net_fill(ferry_stream *s, struct tls *t, int *want)
{
    char *p;
    ssize_t k;
    int room;

    if (t->fd_eof)
        return 0;
    room = BIO_nwrite0(t->net, &p);
    if (room <= 0)
        return -EPROTO; /* OpenSSL wants input but has not read the pair */
    if (t->pre) {
        size_t left = t->pre_len - t->pre_off, take = left < (size_t)room ? left : (size_t)room;
        memcpy(p, t->pre + t->pre_off, take);
        t->pre_off += take;
        k = (ssize_t)take;
        if (t->pre_off == t->pre_len) {
            ferry__free(t->pre);
            t->pre = NULL;
        }
    } else {
        k = t->lower->recv(s, p, (size_t)room, want);
        if (k == 0) {
            t->fd_eof = true;
            BIO_shutdown_wr(t->net);
            return 0;
        }
        if (k < 0)
            return k;
    }
    BIO_nwrite(t->net, &p, (int)k);
    return k;
}

/* ---- the transport ------------------------------------------------------------- */

static ssize_t tls_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    struct tls *t = s->io_ctx;

    if (t->state == TLS_BROKEN)
        return t->broken;
    for (;;) {
        size_t n = 0;
        int r, e, out;
        ssize_t k;

        ERR_clear_error();
        r = SSL_read_ex(t->ssl, buf, len, &n);
        e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(t->ssl, r);
        if (e != SSL_ERROR_NONE && e != SSL_ERROR_ZERO_RETURN && e != SSL_ERROR_WANT_READ &&
            e != SSL_ERROR_WANT_WRITE) {
            int rc = tls_fail(t, e);
            if (rc == -ECONNABORTED && (t->flags & FERRY_TLS_ALLOW_TRUNCATION)) {
                t->why[0] = '\0';
                return 0;
            }
            return rc;
        }
        /* Output that reading made (an answer to a key update): sent when
         * the descriptor takes it.  Its errors are the writer's to report;
         * reading goes on while there is something to read. */
        out = net_flush(s, t, want);
        if (e == SSL_ERROR_NONE)
            return (ssize_t)n;
        if (e == SSL_ERROR_ZERO_RETURN)
            return 0;
        if (e == SSL_ERROR_WANT_WRITE) {
            /* The pair is full of records the descriptor has not taken. */
            if (out != 0)
                return out; /* -EAGAIN: *want is FERRY_WRITE */
            continue;
        }
        k = net_fill(s, t, want);
        if (k >= 0)
            continue; /* more input, or its end: OpenSSL says what it makes of it */
        if (k == -EAGAIN && out == -EAGAIN)
            *want = FERRY_READ | FERRY_WRITE;
        return k;
    }
}

static ssize_t tls_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    struct tls *t = s->io_ctx;
    BIO *inner = SSL_get_wbio(t->ssl);
    size_t total = 0;
    int rc;

    if (t->state == TLS_BROKEN)
        return t->broken;
    if (t->shut)
        return -EPIPE;
    /* Records already made go first; new ones only while the pair has
     * room for a whole record. */
    rc = net_flush(s, t, want);
    if (rc && rc != -EAGAIN)
        return rc;
    for (int i = 0; i < n; i++) {
        const char *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;

        while (left) {
            size_t room = BIO_ctrl_get_write_guarantee(inner), chunk, w = 0;
            int r;

            if (room <= REC_ROOM)
                goto out;
            chunk = left < REC_MAX ? left : REC_MAX;
            if (chunk > room - REC_ROOM)
                chunk = room - REC_ROOM;
            ERR_clear_error();
            r = SSL_write_ex(t->ssl, p, chunk, &w);
            if (r != 1) {
                int e = SSL_get_error(t->ssl, r);
                /* The pair had room for the record: anything else than
                 * success is OpenSSL failing, and the stream with it. */
                rc = tls_fail(t, e);
                t->state = TLS_BROKEN;
                t->broken = rc;
                return total ? (ssize_t)total : rc;
            }
            p += w;
            left -= w;
            total += w;
        }
    }
out:
    if (!total)
        return rc ? rc : -EAGAIN; /* no room: the descriptor is full */
    rc = net_flush(s, t, want);
    if (rc && rc != -EAGAIN)
        return rc;
    return (ssize_t)total;
}

static int tls_shutdown(ferry_stream *s)
{
    struct tls *t = s->io_ctx;
    int want = FERRY_WRITE, rc;

    if (t->state == TLS_BROKEN)
        return t->broken;
    if (!t->shut) {
        t->shut = true;
        t->fin = true;
        if (!t->fatal) {
            ERR_clear_error();
            SSL_shutdown(t->ssl); /* 0: close_notify is in the pair */
            ERR_clear_error();
        }
    }
    rc = net_flush(s, t, &want);
    return rc;
}

static void tls_free(struct tls *t)
{
    SSL_free(t->ssl); /* and the inner half of the pair */
    BIO_free(t->net);
    ferry__free(t->pre);
    ferry__free(t);
}

static void tls_close(ferry_stream *s)
{
    struct tls *t = s->io_ctx;
    int want;

    /* close_notify, if the descriptor takes it now: closing does not wait. */
    if (t->state == TLS_OPEN && !t->shut && !t->fatal) {
        ERR_clear_error();
        SSL_shutdown(t->ssl);
        ERR_clear_error();
        t->shut = true;
    }
    if (t->state == TLS_OPEN)
        net_flush(s, t, &want);
    s->io_ctx = NULL;
    t->lower->close(s);
    tls_free(t);
}

static const struct ferry__stream_io tls_io = {
    .recv = tls_recv,
    .send = tls_send,
    .shutdown = tls_shutdown,
    .close = tls_close,
    .flush = tls_flush,
    .drains = false,
};

/* ---- contexts ---------------------------------------------------------------- */

/* An OpenSSL error from loading a file, as a code. */
static int load_error(void)
{
    unsigned long e = ERR_peek_last_error();
    int rc = -EBADMSG;

    if (ERR_GET_LIB(e) == ERR_LIB_SYS && ERR_GET_REASON(e) > 0)
        rc = -ERR_GET_REASON(e);
    else if (ERR_GET_REASON(e) == ERR_R_MALLOC_FAILURE)
        rc = -ENOMEM;
    else {
        /* A missing file shows as a BIO or a store error with the
         * system's reason earlier in the queue. */
        unsigned long f;
        while ((f = ERR_get_error()) != 0) {
            if (ERR_GET_LIB(f) == ERR_LIB_SYS && ERR_GET_REASON(f) > 0) {
                rc = -ERR_GET_REASON(f);
                break;
            }
        }
    }
    ERR_clear_error();
    return rc;
}

int ferry_tls_ctx_new(ferry_tls_ctx **out, int role, unsigned flags)
{
    ferry_tls_ctx *c;
    unsigned allowed = FERRY_TLS_ALLOW_TRUNCATION;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (role == FERRY_TLS_CLIENT)
        allowed |= FERRY_TLS_NO_VERIFY;
    else if (role == FERRY_TLS_SERVER)
        allowed |= FERRY_TLS_VERIFY_CLIENT;
    else
        return -EINVAL;
    if (flags & ~allowed)
        return -EINVAL;
    c = ferry__calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->role = role;
    c->flags = flags;
    ERR_clear_error();
    c->ssl_ctx = SSL_CTX_new(role == FERRY_TLS_CLIENT ? TLS_client_method() : TLS_server_method());
    if (!c->ssl_ctx)
        goto err_free;
    if (!SSL_CTX_set_min_proto_version(c->ssl_ctx, TLS1_2_VERSION))
        goto err_free;
    SSL_CTX_set_options(c->ssl_ctx, SSL_OP_NO_RENEGOTIATION);
    if (role == FERRY_TLS_CLIENT) {
        if (!(flags & FERRY_TLS_NO_VERIFY)) {
            SSL_CTX_set_verify(c->ssl_ctx, SSL_VERIFY_PEER, NULL);
            /* The system's store.  Its absence is not an error here: the
             * handshake then fails to verify, or load_ca names a store. */
            SSL_CTX_set_default_verify_paths(c->ssl_ctx);
        }
    } else if (flags & FERRY_TLS_VERIFY_CLIENT) {
        SSL_CTX_set_verify(c->ssl_ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    ERR_clear_error();
    *out = c;
    return 0;

err_free:
    ERR_clear_error();
    SSL_CTX_free(c->ssl_ctx);
    ferry__free(c);
    return -ENOMEM;
}

int ferry_tls_ctx_load_cert(ferry_tls_ctx *ctx, const char *cert_file, const char *key_file)
{
    if (!ctx || !cert_file || !key_file)
        return -EINVAL;
    ERR_clear_error();
    if (SSL_CTX_use_certificate_chain_file(ctx->ssl_ctx, cert_file) != 1)
        return load_error();
    if (SSL_CTX_use_PrivateKey_file(ctx->ssl_ctx, key_file, SSL_FILETYPE_PEM) != 1)
        return load_error();
    if (SSL_CTX_check_private_key(ctx->ssl_ctx) != 1) {
        ERR_clear_error();
        return -EBADMSG;
    }
    ctx->has_cert = true;
    return 0;
}

int ferry_tls_ctx_load_ca(ferry_tls_ctx *ctx, const char *ca_file, const char *ca_dir)
{
    if (!ctx || (!ca_file && !ca_dir))
        return -EINVAL;
    ERR_clear_error();
    if (!ctx->own_ca) {
        X509_STORE *st = X509_STORE_new();
        if (!st)
            return -ENOMEM;
        SSL_CTX_set_cert_store(ctx->ssl_ctx, st); /* frees the system's */
        ctx->own_ca = true;
    }
    if (SSL_CTX_load_verify_locations(ctx->ssl_ctx, ca_file, ca_dir) != 1)
        return load_error();
    return 0;
}

void *ferry_tls_ctx_openssl(ferry_tls_ctx *ctx)
{
    return ctx ? ctx->ssl_ctx : NULL;
}

void ferry_tls_ctx_free(ferry_tls_ctx *ctx)
{
    if (!ctx)
        return;
    SSL_CTX_free(ctx->ssl_ctx);
    ferry__free(ctx);
}

/* ---- handshakes ------------------------------------------------------------------ */

/* The transport state for `s` with its SSL object, client side for
 * `host`.  Returns: 0; -ENOMEM (nothing made); -EINVAL (a host OpenSSL
 * refuses). */
static int tls_make(struct tls **out, ferry_stream *s, ferry_tls_ctx *ctx, const char *host)
{
    struct tls *t = ferry__calloc(1, sizeof *t);
    BIO *inner = NULL;
    int rc = -ENOMEM;

    if (!t)
        return -ENOMEM;
    t->lower = s->io;
    t->flags = ctx->flags;
    ERR_clear_error();
    t->ssl = SSL_new(ctx->ssl_ctx);
    if (!t->ssl)
        goto err;
    if (!BIO_new_bio_pair(&inner, PAIR_OUT, &t->net, PAIR_IN))
        goto err;
    SSL_set_bio(t->ssl, inner, inner);
    if (ctx->role == FERRY_TLS_CLIENT) {
        struct in6_addr a6;
        struct in_addr a4;
        bool ip =
            host && (inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1);

        SSL_set_connect_state(t->ssl);
        /* SNI names hosts, never addresses (RFC 6066). */
        if (host && !ip && !SSL_set_tlsext_host_name(t->ssl, host))
            goto err_input;
        if (!(ctx->flags & FERRY_TLS_NO_VERIFY)) {
            if (ip ? !X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), host)
                   : !SSL_set1_host(t->ssl, host))
                goto err_input;
        }
    } else {
        SSL_set_accept_state(t->ssl);
    }
    /* Bytes the plain stream had already read belong to the handshake. */
    if (s->w > s->r) {
        t->pre_len = s->w - s->r;
        t->pre = ferry__malloc(t->pre_len);
        if (!t->pre)
            goto err;
        memcpy(t->pre, s->buf + s->r, t->pre_len);
    }
    ERR_clear_error();
    *out = t;
    return 0;

err_input:
    if (ERR_GET_REASON(ERR_peek_error()) != ERR_R_MALLOC_FAILURE)
        rc = -EINVAL;
err:
    ERR_clear_error();
    if (t->ssl)
        SSL_free(t->ssl);
    else
        BIO_free(inner);
    BIO_free(t->net);
    ferry__free(t);
    return rc;
}

/* Wait for `want` (the caller found it missing). */
static int hs_wait(ferry_stream *s, ferry_task *self, int want)
{
    s->reg.ready &= (uint8_t)~want;
    return ferry__ioreg_wait(&s->reg, self, want & FERRY_READ ? &s->reg.rq : &s->reg.wq, want,
                             "tls handshake", s);
}

/* Run the handshake of `t` on `s`.  Returns: 0; an error (the stream is
 * closed when it is -EBADF: t is gone then). */
static int handshake(ferry_stream *s, struct tls *t, ferry_task *self)
{
    for (;;) {
        int r, e, want = FERRY_WRITE, rc;

        ERR_clear_error();
        r = SSL_do_handshake(t->ssl);
        e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(t->ssl, r);
        if (e != SSL_ERROR_NONE && e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            rc = tls_fail(t, e);
            /* The alert that says why, if the descriptor takes it. */
            net_flush(s, t, &want);
            return rc;
        }
        /* What the handshake wrote goes first: the peer needs it to answer. */
        rc = net_flush(s, t, &want);
        if (rc == -EAGAIN) {
            rc = hs_wait(s, self, want);
            if (rc)
                return rc;
            continue;
        }
        if (rc)
            return rc;
        if (e == SSL_ERROR_NONE)
            return 0;
        if (e == SSL_ERROR_WANT_WRITE)
            continue;
        want = FERRY_READ;
        ssize_t k = net_fill(s, t, &want);
        if (k >= 0)
            continue;
        if (k != -EAGAIN)
            return (int)k;
        rc = hs_wait(s, self, want);
        if (rc)
            return rc;
    }
}

static int tls_start(ferry_stream **out, ferry_stream *s, ferry_tls_ctx *ctx, const char *host,
                     int role)
{
    ferry_task *self;
    struct tls *t;
    int rc;

    /* *out is written on success only: in the in-place form,
     * ferry_tls_server(&s, s, ctx), a failure must leave the caller its
     * stream to read the reason from and to close. */
    if (!out || !s || !ctx || ctx->role != role)
        return -EINVAL;
    if (role == FERRY_TLS_CLIENT && !(ctx->flags & FERRY_TLS_NO_VERIFY) && (!host || !*host))
        return -EINVAL;
    if (role == FERRY_TLS_SERVER && !ctx->has_cert)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (s->reg.loop != self->loop)
        return -EPERM;
    if (s->reg.closed)
        return -EBADF;
    if (s->io == &tls_io)
        return -EINVAL;
    if (s->reading || s->writing)
        return -EBUSY;
    if (s->rerr)
        return s->rerr;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    rc = tls_make(&t, s, ctx, host);
    if (rc)
        return rc;
    /* From here the stream speaks TLS, or is broken. */
    s->r = s->w = 0;
    s->eof = false; /* the end of a TLS stream is its close_notify */
    s->io = &tls_io;
    s->io_ctx = t;
    s->reading = s->writing = true;
    s->inside++;
    rc = handshake(s, t, self);
    if (rc == -EBADF) {
        /* Closed meanwhile: t went with it. */
        s->reading = s->writing = false;
        ferry__stream_unref(s);
        return -EBADF;
    }
    if (t->pre) {
        ferry__free(t->pre);
        t->pre = NULL;
    }
    if (rc == 0) {
        t->state = TLS_OPEN;
        /* The handshake received without looking at the readable bit,
         * and its last receive may have taken records beyond the
         * handshake (a client's first request right behind its
         * Finished).  If the bit was clear (a short plain read before
         * STARTTLS, a fresh connect), no edge will announce those
         * records: epoll reports an edge only for a descriptor that is
         * still readable when it looks.  So the first read asks the
         * transport (stream_int.h, the seam). */
        s->reg.ready |= FERRY_READ;
        *out = s;
    } else {
        /* Broken: every later call says so at once, without waiting for
         * the descriptor (the stream calls the transport when it thinks
         * the descriptor is ready, and reads stop at a kept error). */
        t->state = TLS_BROKEN;
        t->broken = -EPROTO;
        s->rerr = -EPROTO;
        s->reg.ready |= FERRY_READ | FERRY_WRITE;
    }
    s->reading = s->writing = false;
    ferry__stream_unref(s);
    return rc;
}

int ferry_tls_client(ferry_stream **out, ferry_stream *s, ferry_tls_ctx *ctx, const char *host)
{
    return tls_start(out, s, ctx, host, FERRY_TLS_CLIENT);
}

int ferry_tls_server(ferry_stream **out, ferry_stream *s, ferry_tls_ctx *ctx)
{
    return tls_start(out, s, ctx, NULL, FERRY_TLS_SERVER);
}

/* ---- what a TLS stream knows --------------------------------------------------------- */

const char *ferry_tls_last_error(const ferry_stream *s)
{
    struct tls *t = tls_of(s);

    return t ? t->why : NULL;
}

const char *ferry_tls_server_name(const ferry_stream *s)
{
    struct tls *t = tls_of(s);

    if (!t || t->state != TLS_OPEN)
        return NULL;
    return SSL_get_servername(t->ssl, TLSEXT_NAMETYPE_host_name);
}

const char *ferry_tls_version(const ferry_stream *s)
{
    struct tls *t = tls_of(s);

    if (!t || t->state != TLS_OPEN)
        return NULL;
    return SSL_get_version(t->ssl);
}
