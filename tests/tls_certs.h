/* tls_certs.h - certificates made at run time for the TLS tests and the
 * TLS fuzz target, with OpenSSL's X509 API: a CA, certificates it signs,
 * and self-signed ones.  Keys are P-256 (fast to make).
 */
#ifndef FERRY_TLS_CERTS_H
#define FERRY_TLS_CERTS_H

#include <openssl/evp.h>
#include <openssl/x509.h>

/* A new P-256 key, or NULL. */
EVP_PKEY *tc_key(void);

/* A certificate for `key` named `cn`, with the subjectAltName `san` (as
 * "DNS:localhost,IP:127.0.0.1", or NULL), signed by issuer/issuer_key (both
 * NULL: self-signed), a CA if `ca`; valid from an hour ago for a day.
 * NULL on failure. */
X509 *tc_cert(EVP_PKEY *key, const char *cn, const char *san, X509 *issuer,
              EVP_PKEY *issuer_key, int ca);

/* The files of one test run, in a fresh directory under /tmp. */
struct tc_files {
    char dir[64];
    char ca[128];            /* the CA's certificate */
    char server[128];        /* localhost, 127.0.0.1, ::1; signed by the CA */
    char server_key[128];
    char wrong[128];         /* wrong.example; signed by the CA */
    char wrong_key[128];
    char self[128];          /* localhost, self-signed */
    char self_key[128];
    char client[128];        /* a client certificate signed by the CA */
    char client_key[128];
    char garbage[128];       /* not PEM */
};

/* Make them.  Returns 0, or -1 (with a line on stderr). */
int tc_files_make(struct tc_files *f);

/* Remove the files and the directory. */
void tc_files_remove(struct tc_files *f);

#endif /* FERRY_TLS_CERTS_H */
