/* ferry/resolve.h - name resolution for tasks: getaddrinfo() that suspends the
 * calling task, not the loop.
 *
 * Each loop has a resolver of its own, made at its first lookup and freed
 * with the loop.  It asks DNS servers itself, on the loop's thread (through
 * libevent's evdns), and needs no thread per lookup.  Where it cannot serve
 * a name (below, "Where each path is used"), it calls getaddrinfo(3) on a
 * thread of a pool and abandons that thread's call if the task is cancelled
 * or its deadline passes.  docs/resolve.md describes both and their limits.
 *
 * Errors.  Resolver outcomes have codes of their own, FERRY_EAI_*: negative
 * like every ferry error, and all below -4095, the lowest value an errno
 * can take on Linux, so that no resolver code is ever an errno value and no
 * errno value is a resolver code.  ferry_gai_strerror() describes both.
 * Running out of memory is -ENOMEM, bad arguments are -EINVAL, as
 * everywhere in ferry.
 *
 * Where each path is used, for a loop whose resolver is in the default
 * mode (FERRY_RESOLVE_AUTO):
 *   - a numeric host ("192.0.2.1", "2001:db8::1") or no host at all: parsed
 *     on the loop's thread, answered at once without waiting;
 *   - a name in the hosts file (/etc/hosts, read when the resolver is
 *     made): answered at once from that copy;
 *   - any other name: A and AAAA queries to the nameservers of
 *     /etc/resolv.conf (read when the resolver is made), with its search
 *     list, "ndots", "timeout" and "attempts", on the loop's thread;
 *   - on a thread of the pool, with getaddrinfo(3): when resolv.conf names
 *     no nameserver; when the "hosts:" line of /etc/nsswitch.conf has
 *     sources other than "files" and "dns" (mdns, myhostname, ldap, ...)
 *     and DNS did not find the name (or, without "dns", for every name not
 *     in the hosts file); when a DNS reply was truncated (evdns has no TCP
 *     fallback); and when the hints ask for AI_CANONNAME, AI_IDN or
 *     AI_CANONIDN (evdns reports no canonical name and does no IDN).
 */
#ifndef FERRY_RESOLVE_H
#define FERRY_RESOLVE_H

#include <stdbool.h>
#include <stdint.h>
#include <netdb.h>

#include "ferry/bridge.h"
#include "ferry/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Resolver errors ------------------------------------------------ */

/* The name (or the service) is not known: the nameservers say it does not
 * exist (NXDOMAIN), or it is not a valid name. */
#define FERRY_EAI_NONAME   (-10001)
/* Temporary failure: no nameserver answered in time, or they answered
 * SERVFAIL.  Trying again later may work. */
#define FERRY_EAI_AGAIN    (-10002)
/* Failure that trying again will not fix: the nameservers refused the
 * query or sent a reply that could not be used. */
#define FERRY_EAI_FAIL     (-10003)
/* The name exists but has no address of the family asked for (an IPv6-only
 * name asked with AF_INET, or a name with no A or AAAA record). */
#define FERRY_EAI_NODATA   (-10004)
/* The service is not known for the socket type asked for ("nosuch", or
 * "http" with SOCK_DGRAM). */
#define FERRY_EAI_SERVICE  (-10005)
/* hints->ai_family is neither AF_UNSPEC, AF_INET nor AF_INET6. */
#define FERRY_EAI_FAMILY   (-10006)
/* hints->ai_socktype or ai_protocol is not supported. */
#define FERRY_EAI_SOCKTYPE (-10007)

/* The range the codes above are in: FERRY_EAI_IS(rc) is true for a
 * resolver code, false for 0 and for every negative errno value. */
#define FERRY_EAI_FIRST    (-10001)
#define FERRY_EAI_LAST     (-10007)
#define FERRY_EAI_IS(rc)   ((rc) <= FERRY_EAI_FIRST && (rc) >= FERRY_EAI_LAST)

/*
 * A message for any code ferry returns: the FERRY_EAI_* codes above, 0,
 * and negative errno values (strerror's text for those).
 * Thread: any.  Suspends: no.
 * Returns: a string that stays valid; never NULL.
 */
const char *ferry_gai_strerror(int code);

/* ---- Lookups -------------------------------------------------------- */

/*
 * Resolve `host` and `service` into socket addresses, as getaddrinfo(3)
 * does, suspending the calling task (not the loop) while the answer is
 * awaited.  `host` NULL asks for the wildcard address (AI_PASSIVE) or the
 * loopback address; `service` is a port number or a name from the services
 * database (/etc/services), looked up on the loop's thread; NULL means port
 * 0.  `hints` as for getaddrinfo(3) (NULL: ai_family AF_UNSPEC, ai_flags
 * AI_V4MAPPED | AI_ADDRCONFIG, as glibc does); its ai_flags may hold
 * AI_PASSIVE, AI_CANONNAME, AI_NUMERICHOST, AI_NUMERICSERV, AI_V4MAPPED,
 * AI_ALL, AI_ADDRCONFIG, AI_IDN and AI_CANONIDN.
 *
 * The list has IPv4 addresses first, then IPv6, each in the order the
 * nameservers (or the hosts file) gave them; it is not sorted by RFC 6724
 * as glibc sorts it.  AI_ADDRCONFIG looks at the interfaces at each lookup.
 *
 * Cancellation and deadlines: every call is a cancellation point, also one
 * answered at once.  A lookup interrupted while it waits returns at once;
 * the answer that arrives later (from a nameserver or from a pool thread)
 * is dropped and freed by ferry.  A task that is cancelled after its answer
 * arrived but before it ran gets -ECANCELED and nothing.
 *
 * Thread: loop, in a task.  Suspends: yes, unless the answer is known at
 * once (numeric host, hosts file).
 * Returns: 0 and *res, a list of at least one entry, the caller's to free
 *          with ferry_freeaddrinfo();
 *          FERRY_EAI_* (above): the resolver's answer;
 *          -ECANCELED, -ETIMEDOUT: interrupted;
 *          -ENOMEM;
 *          -EINVAL: res NULL, both host and service NULL, hints with an
 *          ai_flags bit not listed above or with ai_addrlen, ai_addr,
 *          ai_canonname or ai_next set;
 *          -EPERM: not in a task;
 *          -EMFILE, -ENFILE: no descriptor for the socket of a nameserver
 *          given in ferry_resolver_opts.nameservers (one of resolv.conf's
 *          that gets none is left out);
 *          -ESHUTDOWN: the loop is being freed, or the pool refused the
 *          job; -EDEADLK: the pool refused it (see
 *          ferry_to_thread_abandon()).
 *          On every return but 0, *res is NULL (if res is not NULL).
 */
int ferry_getaddrinfo(const char *host, const char *service, const struct addrinfo *hints,
                      struct addrinfo **res /* OUT */);

/*
 * Free a list that ferry_getaddrinfo() returned: the very pointer it
 * stored, not an entry further down (ferry keeps each list in one block).
 * NULL is ignored.  A list from getaddrinfo(3) goes to freeaddrinfo(3)
 * instead.  Passing anything else is a bug; ferry keeps a mark at the head
 * of its blocks, so in builds without AddressSanitizer it usually catches
 * one (a list freed twice, a list of glibc's) and logs it instead of
 * freeing.
 * Thread: any.  Suspends: no.
 */
void ferry_freeaddrinfo(struct addrinfo *res);

/* ---- The resolver of a loop ----------------------------------------- */

/* ferry_resolver_opts.mode */
enum {
    /* DNS on the loop's thread; getaddrinfo(3) on the pool where that
     * cannot serve (the header comment above says when). */
    FERRY_RESOLVE_AUTO = 0,
    /* Never a pool thread: numeric hosts, the hosts file and DNS only.
     * Then a truncated reply is FERRY_EAI_FAIL, names only other nsswitch
     * sources know are FERRY_EAI_NONAME, and ai_canonname (AI_CANONNAME) is
     * the hosts file's canonical name or the name as asked. */
    FERRY_RESOLVE_NO_THREADS = 1,
    /* Every lookup is getaddrinfo(3) on the pool, as libuv and asyncio do
     * it: every nsswitch source, at the cost of a thread per lookup. */
    FERRY_RESOLVE_THREADS = 2,
};

typedef struct ferry_resolver_opts {
    /* FERRY_RESOLVE_*; 0 is FERRY_RESOLVE_AUTO. */
    int mode;
    /* The nameservers to ask: addresses, each optionally with a port
     * ("192.0.2.53", "192.0.2.53:5353", "[2001:db8::53]:53"), separated by
     * commas or spaces.  NULL: those of /etc/resolv.conf, with its search
     * list and options.  Given here, resolv.conf and nsswitch.conf are not
     * read; the pool's getaddrinfo(3) (for a truncated reply or
     * AI_CANONNAME) still asks the system's nameservers. */
    const char *nameservers;
    /* The hosts file; NULL: /etc/hosts; "": none. */
    const char *hosts;
    /* How long to wait for an answer before a query is sent again, and how
     * long the second address family may take once the first has
     * answered; 1 ms at least.  0: resolv.conf's "timeout" (else 5 s) for
     * the queries, and 3 s for the second family. */
    int64_t timeout;
    /* How many times a query is sent before it fails; 0: resolv.conf's
     * "attempts", else 3. */
    unsigned attempts;
    /* The pool that runs getaddrinfo(3); NULL: the default pool.  It must
     * outlive the loop. */
    ferry_pool *pool;
} ferry_resolver_opts;

/*
 * Configure the resolver of `loop` for the lookups that start from now on
 * (opts NULL: back to the defaults).  The strings are copied; nothing is
 * read or opened until the next lookup.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -EBUSY (a lookup of this loop is in flight: nothing
 * changed); -EINVAL (an unknown mode, a nameserver that is not an address,
 * a negative or sub-millisecond timeout); -ENOMEM; -EPERM.
 */
int ferry_loop_set_resolver(ferry_loop *loop, const ferry_resolver_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_RESOLVE_H */
