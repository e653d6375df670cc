/* stream_script.h - a stream's readers driven by a script of bytes and
 * checked against a reference (tests/reliability/stream_script.c): the
 * libFuzzer target fuzz_stream and the corpus replay stream_corpus share it.
 *
 * The script (every byte string is a valid one):
 *   byte 0      the read buffer's size: 1 + (b % 64), or the default for
 *               b >= 192
 *   byte 1      the delimiter's length: 1 + (b % 4)
 *   next bytes  the delimiter (as many as its length)
 *   then ops, each an opcode byte (b % 8) and an argument byte a:
 *     0  the peer writes the next a bytes of the script (fewer at its end)
 *     1  read_until(delimiter, max 1 + a)
 *     2  read_exactly(a)
 *     3  read(max 1 + a)
 *     4  discard(a)
 *     5  the peer ends its side (shutdown SHUT_WR); later writes are dropped
 *     6  read_until under a deadline that has passed (nothing may change)
 *     7  the peer writes a bytes: the delimiter repeated (delimiters that
 *        overlap and straddle fragments)
 * A read that would wait is cancelled (the data it needs never comes): it
 * must return -ECANCELED having consumed nothing (discard: what it
 * dropped).
 */
#ifndef FERRY_STREAM_SCRIPT_H
#define FERRY_STREAM_SCRIPT_H

#include <stddef.h>
#include <stdint.h>

/* Longest script worth running. */
#define STREAM_SCRIPT_MAX 4096

/*
 * Run the script on a fresh socketpair and stream of a loop made at the
 * first call (kept for the process).  Returns 0 if every result matched
 * the reference; -1 with a description in why[0, whylen) otherwise.
 */
int stream_script_run(const uint8_t *data, size_t size, char *why, size_t whylen);

#endif /* FERRY_STREAM_SCRIPT_H */
