/* ferry/tls.h - TLS over a stream, with OpenSSL: clients and servers,
 * certificate and host-name verification on by default.
 *
 * Present when ferry was built with OpenSSL (FERRY_HAVE_TLS in
 * ferry/features.h is 1).  The types here are ferry's own: a program that
 * uses them needs no OpenSSL header.
 *
 * A context holds what every connection of one side shares: the role
 * (client or server), the certificate and key, the authorities trusted,
 * the flags.  ferry_tls_client() and ferry_tls_server() turn a connected
 * stream into a TLS stream by running the handshake in the calling task;
 * from then on every ferry_stream_* call works on the TLS stream as on any
 * other (ferry/stream.h): buffered reads, the line reader, all-or-nothing
 * reads under cancellation and deadlines, writes that report their count,
 * backpressure, closing while tasks wait.  Differences:
 *
 *   - A write counts a byte as written once TLS has encrypted it into the
 *     stream's output; the write returns when that output has been handed
 *     to the descriptor.  A write that is cancelled or times out while
 *     waiting for the descriptor has counted the bytes it encrypted: their
 *     records go out with the next write (a write of 0 bytes waits for
 *     them), ferry_stream_shutdown() or ferry_stream_close().
 *   - The end of the stream is the peer's close_notify: a read returns 0
 *     (and -ENODATA in the middle of a frame, as for any stream).  A
 *     connection that ends without close_notify could have been cut short
 *     by an attacker: reads return -ECONNABORTED (unless the context has
 *     FERRY_TLS_ALLOW_TRUNCATION).
 *   - ferry_stream_shutdown() sends close_notify, then shuts the socket's
 *     write side.  It does not suspend: if the socket cannot take the alert
 *     now it returns -EAGAIN, and the alert goes out with the next write
 *     (a write of 0 bytes waits for it).  Reading goes on (TLS 1.3 lets the
 *     peer go on writing).
 *   - ferry_stream_close() sends close_notify if the socket takes it at
 *     once, then closes.
 *   - Errors of the protocol: -EKEYREJECTED (the peer's certificate did
 *     not verify: untrusted, expired, another host's name; or a client
 *     sent none to a server that requires one), -EPROTO (the peer broke
 *     the protocol or sent a fatal alert, for instance because it
 *     rejected our certificate or our lack of one), -ECONNABORTED (the
 *     connection ended without close_notify).  ferry_tls_last_error()
 *     gives OpenSSL's reason in words.
 *
 * Everything about a stream belongs to its loop, as in ferry/stream.h.  A
 * context may be shared by the loops of several threads once it is set up.
 */
#ifndef FERRY_TLS_H
#define FERRY_TLS_H

#include "ferry/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Contexts ------------------------------------------------------------ */

typedef struct ferry_tls_ctx ferry_tls_ctx;

/* Roles for ferry_tls_ctx_new(). */
enum { FERRY_TLS_CLIENT = 1, FERRY_TLS_SERVER = 2 };

/*
 * ferry_tls_ctx_new() flags:
 *   FERRY_TLS_NO_VERIFY         client: do not verify the server's
 *                               certificate nor its name.  For tests only:
 *                               anyone on the path can then read and change
 *                               the traffic.
 *   FERRY_TLS_VERIFY_CLIENT     server: ask every client for a certificate
 *                               and refuse one without a certificate that
 *                               the context's authorities (see
 *                               ferry_tls_ctx_load_ca()) have signed.
 *   FERRY_TLS_ALLOW_TRUNCATION  a connection that ends without close_notify
 *                               reads as a clean end of the stream (as many
 *                               HTTPS peers close), not -ECONNABORTED.
 */
#define FERRY_TLS_NO_VERIFY        0x1u
#define FERRY_TLS_VERIFY_CLIENT    0x2u
#define FERRY_TLS_ALLOW_TRUNCATION 0x4u

/*
 * Make a context for `role` (FERRY_TLS_CLIENT or FERRY_TLS_SERVER) with
 * TLS 1.2 or later, renegotiation off.  A client context trusts the
 * system's certificate authorities until ferry_tls_ctx_load_ca() names
 * others.  A server context needs ferry_tls_ctx_load_cert() before its
 * first handshake.
 * Thread: any.  Suspends: no.
 * Owns: the caller owns *out; free it with ferry_tls_ctx_free().
 * Returns: 0; -EINVAL (out NULL, a bad role, a flag unknown or not for
 * the role); -ENOMEM.
 */
int ferry_tls_ctx_new(ferry_tls_ctx **out /* OUT */, int role, unsigned flags);

/*
 * Load the certificate chain (PEM: the certificate first, then the
 * authorities that signed it) and its private key (PEM, not encrypted)
 * that the context presents to peers.
 * Thread: any, before the context is used by a handshake.  Suspends: no.
 * Returns: 0; -ENOENT, -EACCES and the other errors of opening a file;
 * -EBADMSG (not PEM, or the key is not the certificate's); -ENOMEM;
 * -EINVAL (a NULL argument).
 */
int ferry_tls_ctx_load_cert(ferry_tls_ctx *ctx, const char *cert_file, const char *key_file);

/*
 * Trust the certificate authorities of `ca_file` (PEM, one or more) and/or
 * of the directory `ca_dir` (hashed names, as c_rehash makes), and no
 * longer the system's.  Called again, it adds to them.
 * Thread: any, before the context is used by a handshake.  Suspends: no.
 * Returns: 0; -ENOENT, -EACCES and the other errors of opening a file;
 * -EBADMSG (no certificate in ca_file); -ENOMEM; -EINVAL (ctx NULL, or
 * both NULL).
 */
int ferry_tls_ctx_load_ca(ferry_tls_ctx *ctx, const char *ca_file, const char *ca_dir);

/*
 * OpenSSL's SSL_CTX of the context (cast it to SSL_CTX *), for settings
 * this header does not have (ALPN, ciphers, session tickets).
 * Thread: any, before the context is used by a handshake.  Suspends: no.
 * Returns: the SSL_CTX, owned by the context; NULL for NULL.
 */
void *ferry_tls_ctx_openssl(ferry_tls_ctx *ctx);

/*
 * Free the context.  Streams made with it keep what they need of it and
 * may stay open.
 * Thread: any, once no thread uses it.  Suspends: no.
 */
void ferry_tls_ctx_free(ferry_tls_ctx *ctx);

/* ---- Handshakes ---------------------------------------------------------- */

/*
 * Turn the connected stream `s` into a TLS client stream: run the
 * handshake in the calling task, send `host` as the server name (SNI; not
 * for an IP address) and, unless the context has FERRY_TLS_NO_VERIFY,
 * check that the server's certificate chains to a trusted authority and
 * names `host` (a DNS name, matched with wildcards as browsers do, or an
 * IP address, matched against the certificate's IP addresses).  Bytes
 * that `s` had already read are taken as the start of the handshake.
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Owns: `s` stays the caller's in every case.  On success *out is `s`
 * itself, converted in place (so that other pointers to it stay valid):
 * close it once, with ferry_stream_close().  On an error *out is not
 * written, so the in-place form ferry_tls_client(&s, s, ...) keeps `s`
 * to read ferry_tls_last_error() from and to close.  On an error after
 * the handshake began (any but -EINVAL, -EPERM, -EBUSY, -EBADF and
 * -ENOMEM), `s` is left broken: its reads and writes return -EPROTO, and
 * the caller closes it.
 * Returns: 0; -EKEYREJECTED (the certificate did not verify);
 * -EPROTO (a protocol error or a fatal alert from the server);
 * -ECONNABORTED (the server closed during the handshake);
 * -ECANCELED, -ETIMEDOUT; -ECONNRESET, -EPIPE and the other errors of
 * the descriptor; -EBADF (s closed, before or during the handshake: then
 * do not touch s again); -EBUSY (a task is inside a read or write on s);
 * -ENOMEM (nothing changed: s is still a plain stream); -EPERM; -EINVAL
 * (out, s or ctx NULL, ctx not a client context, host NULL or empty
 * while the context verifies, s already TLS).  ferry_tls_last_error(s)
 * says more after a TLS error.
 */
int ferry_tls_client(ferry_stream **out /* OUT */, ferry_stream *s, ferry_tls_ctx *ctx,
                     const char *host);

/*
 * Turn the connected stream `s` into a TLS server stream: run the
 * handshake in the calling task, presenting the context's certificate
 * and (with FERRY_TLS_VERIFY_CLIENT) verifying the client's.
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Owns: as ferry_tls_client().
 * Returns: as ferry_tls_client(); -EKEYREJECTED for a client certificate
 * that did not verify, or none (with FERRY_TLS_VERIFY_CLIENT); -EINVAL
 * also for a context that is not a server context or has no certificate.
 * The client refused gets -EPROTO, from its handshake in TLS 1.2 and from
 * its first read in TLS 1.3, where its handshake ends before the server
 * has checked (ferry_tls_last_error(): "tlsv13 alert certificate
 * required" when it sent none).
 */
int ferry_tls_server(ferry_stream **out /* OUT */, ferry_stream *s, ferry_tls_ctx *ctx);

/* ---- What a TLS stream knows ---------------------------------------------- */

/*
 * OpenSSL's reason for the last TLS error of `s` (a handshake that failed,
 * a record that did not decrypt, a certificate check, as in
 * "certificate verify failed: hostname mismatch"), or "" if there was
 * none.  The text stays valid until the next call on `s` or its close.
 * Thread: loop.  Suspends: no.
 * Returns: the text; NULL if `s` is NULL, closed or not a TLS stream.
 */
const char *ferry_tls_last_error(const ferry_stream *s);

/*
 * The server name (SNI) the client sent, as the server saw it.
 * Thread: loop.  Suspends: no.
 * Returns: the name, valid while `s` is open; NULL if the client sent
 * none, the handshake has not completed, or `s` is NULL, closed or not a
 * TLS stream.
 */
const char *ferry_tls_server_name(const ferry_stream *s);

/*
 * The TLS version agreed on, as OpenSSL names it ("TLSv1.3").
 * Thread: loop.  Suspends: no.
 * Returns: the name (static); NULL if `s` is NULL, closed, not a TLS
 * stream, or its handshake has not completed.
 */
const char *ferry_tls_version(const ferry_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_TLS_H */
