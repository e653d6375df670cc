/* tls_certs.c - certificates made at run time (tls_certs.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/ec.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "tls_certs.h"

EVP_PKEY *tc_key(void)
{
    return EVP_EC_gen("P-256");
}

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX v3;
    X509_EXTENSION *e;
    int ok;

    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, issuer, x, NULL, NULL, 0);
    e = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
    if (!e)
        return 0;
    ok = X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    return ok;
}

X509 *tc_cert(EVP_PKEY *key, const char *cn, const char *san, X509 *issuer,
              EVP_PKEY *issuer_key, int ca)
{
    static long serial = 1;
    X509 *x = X509_new();
    X509_NAME *name;

    if (!x)
        return NULL;
    if (!issuer) {
        issuer = x;
        issuer_key = key;
    }
    name = X509_get_subject_name(x);
    if (!X509_set_version(x, 2) ||
        !ASN1_INTEGER_set(X509_get_serialNumber(x), serial++ + (long)getpid() * 1000) ||
        !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), 86400) ||
        !X509_set_pubkey(x, key) ||
        !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0) ||
        !X509_set_issuer_name(x, X509_get_subject_name(issuer)) ||
        !add_ext(x, issuer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE") ||
        !add_ext(x, issuer, NID_key_usage,
                 ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature") ||
        !add_ext(x, issuer, NID_subject_key_identifier, "hash") ||
        (issuer != x && !add_ext(x, issuer, NID_authority_key_identifier, "keyid")) ||
        (san && !add_ext(x, issuer, NID_subject_alt_name, san)) ||
        !X509_sign(x, issuer_key, EVP_sha256())) {
        X509_free(x);
        return NULL;
    }
    return x;
}

static int write_pem(const char *path, X509 *x, EVP_PKEY *k)
{
    FILE *f = fopen(path, "w");
    int ok;

    if (!f)
        return 0;
    ok = x ? PEM_write_X509(f, x) : PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
    return fclose(f) == 0 && ok;
}

static void path(char *out, const struct tc_files *f, const char *name)
{
    snprintf(out, 128, "%s/%s", f->dir, name);
}

int tc_files_make(struct tc_files *f)
{
    EVP_PKEY *ca_k = tc_key(), *k1 = tc_key(), *k2 = tc_key(), *k3 = tc_key(), *k4 = tc_key();
    X509 *ca = NULL, *srv = NULL, *wrong = NULL, *self = NULL, *cli = NULL;
    FILE *g;
    int rc = -1;

    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/ferry-tls-XXXXXX");
    if (!mkdtemp(f->dir) || !ca_k || !k1 || !k2 || !k3 || !k4)
        goto out;
    path(f->ca, f, "ca.pem");
    path(f->server, f, "server.pem");
    path(f->server_key, f, "server.key");
    path(f->wrong, f, "wrong.pem");
    path(f->wrong_key, f, "wrong.key");
    path(f->self, f, "self.pem");
    path(f->self_key, f, "self.key");
    path(f->client, f, "client.pem");
    path(f->client_key, f, "client.key");
    path(f->garbage, f, "garbage.pem");
    ca = tc_cert(ca_k, "ferry test CA", NULL, NULL, NULL, 1);
    if (!ca)
        goto out;
    srv = tc_cert(k1, "localhost", "DNS:localhost,IP:127.0.0.1,IP:::1", ca, ca_k, 0);
    wrong = tc_cert(k2, "wrong.example", "DNS:wrong.example", ca, ca_k, 0);
    self = tc_cert(k3, "localhost", "DNS:localhost,IP:127.0.0.1", NULL, NULL, 0);
    cli = tc_cert(k4, "ferry test client", NULL, ca, ca_k, 0);
    if (!srv || !wrong || !self || !cli)
        goto out;
    if (!write_pem(f->ca, ca, NULL) || !write_pem(f->server, srv, NULL) ||
        !write_pem(f->server_key, NULL, k1) || !write_pem(f->wrong, wrong, NULL) ||
        !write_pem(f->wrong_key, NULL, k2) || !write_pem(f->self, self, NULL) ||
        !write_pem(f->self_key, NULL, k3) || !write_pem(f->client, cli, NULL) ||
        !write_pem(f->client_key, NULL, k4))
        goto out;
    g = fopen(f->garbage, "w");
    if (!g)
        goto out;
    fputs("this is not a certificate\n", g);
    fclose(g);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "tls_certs: could not make the test certificates\n");
    X509_free(ca);
    X509_free(srv);
    X509_free(wrong);
    X509_free(self);
    X509_free(cli);
    EVP_PKEY_free(ca_k);
    EVP_PKEY_free(k1);
    EVP_PKEY_free(k2);
    EVP_PKEY_free(k3);
    EVP_PKEY_free(k4);
    return rc;
}

void tc_files_remove(struct tc_files *f)
{
    const char *files[] = { f->ca, f->server, f->server_key, f->wrong, f->wrong_key, f->self,
                            f->self_key, f->client, f->client_key, f->garbage };

    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        if (files[i][0])
            unlink(files[i]);
    if (f->dir[0])
        rmdir(f->dir);
}
