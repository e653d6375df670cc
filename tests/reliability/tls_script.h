/* tls_script.h - TLS record boundaries under test: a client and a server
 * in one loop, with a relay between them that delivers the ciphertext in
 * fragments the input chooses (down to 1 byte), both ways.  The client
 * sends the input as plaintext in pieces the input chooses; the server
 * reads it with the line reader and must get exactly the input, then the
 * end (close_notify).  Used by fuzz_tls (libFuzzer) and tls_corpus (the
 * committed corpus, replayed in every build).
 */
#ifndef FERRY_TLS_SCRIPT_H
#define FERRY_TLS_SCRIPT_H

#include <stddef.h>
#include <stdint.h>

/* Longest input that means something (the rest is ignored). */
#define TLS_SCRIPT_MAX 8192

/* Run one input.  Returns 0 if the plaintext arrived intact; otherwise -1
 * with the reason in why[0, len). */
int tls_script_run(const uint8_t *data, size_t size, char *why, size_t len);

#endif /* FERRY_TLS_SCRIPT_H */
