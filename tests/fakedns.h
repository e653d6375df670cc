/* fakedns.h - a small DNS server on 127.0.0.1 for the resolver's tests, so
 * that they need no network: a thread answering A and AAAA queries (RFC
 * 1035 messages built by hand) from records the test gives it.
 *
 * A name with no rule and no record gets NXDOMAIN; a name with records but
 * none of the type asked gets an empty answer (NOERROR, no record).  A rule
 * (fakedns_rule()) changes what one name gets, for one query type or both.
 * Names compare without regard to case (evdns randomises the case of its
 * queries, and the question is sent back as it came).
 */
#ifndef FERRY_FAKEDNS_H
#define FERRY_FAKEDNS_H

#include <stdbool.h>

/* Query types. */
#define FAKEDNS_A    1
#define FAKEDNS_AAAA 28
#define FAKEDNS_ANY  0

/* What a rule makes the server do. */
enum fakedns_act {
    FAKEDNS_ANSWER = 0,   /* answer from the records */
    FAKEDNS_NXDOMAIN,     /* rcode 3 */
    FAKEDNS_SERVFAIL,     /* rcode 2 */
    FAKEDNS_REFUSED,      /* rcode 5 */
    FAKEDNS_TRUNCATE,     /* the TC bit, no record */
    FAKEDNS_HOLD,         /* keep the query until fakedns_release() */
    FAKEDNS_DROP,         /* never answer */
    FAKEDNS_BAD_RDLEN,    /* answer from the records, each with the wrong
                           * RDLENGTH: an A of 16 bytes (its address and
                           * 192.0.2.1-3), an AAAA of 4 (its first 4) */
};

struct fakedns;

/* Start a server on 127.0.0.1, port chosen by the kernel.  A failure
 * fails the test. */
struct fakedns *fakedns_start(void);

/* Stop the thread, close the socket, free.  Held queries are dropped. */
void fakedns_stop(struct fakedns *s);

/* "127.0.0.1:PORT", for ferry_resolver_opts.nameservers. */
const char *fakedns_addr(const struct fakedns *s);

/* Add a record: `addr` is an IPv4 address (an A record) or an IPv6 one (an
 * AAAA record) for `name`. */
void fakedns_add(struct fakedns *s, const char *name, const char *addr);

/* What queries for `name` of type `qtype` (FAKEDNS_ANY: both) get. */
void fakedns_rule(struct fakedns *s, const char *name, int qtype, enum fakedns_act act);

/* Answer every held query now, from the records (rules apart). */
void fakedns_release(struct fakedns *s);

/* Queries received so far, those held now, and replies sent so far. */
int fakedns_queries(struct fakedns *s);
int fakedns_held(struct fakedns *s);
int fakedns_sent(struct fakedns *s);

#endif /* FERRY_FAKEDNS_H */
