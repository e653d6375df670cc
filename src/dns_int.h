/* dns_int.h - what the two halves of name resolution share: the loop side
 * (src/dns.c: the resolver of a loop, DNS through evdns) and the thread
 * side (bridge/getaddrinfo.c: address lists in ferry's own blocks, and
 * getaddrinfo(3) run on a pool thread).
 *
 * The list functions run on any thread; the resolver functions on the
 * loop's thread only.
 */
#ifndef FERRY_DNS_INT_H
#define FERRY_DNS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netdb.h>

#include "ferry/net.h"
#include "ferry_int.h"

/* ---- Address lists (any thread) --------------------------------------- */

/* One address to put into a list. */
struct ferry__ai_addr {
    int           family;     /* AF_INET or AF_INET6 */
    unsigned char bytes[16];  /* 4 or 16 bytes, network order */
};

/* A socket type, protocol and port that every address of a list gets, as
 * the services database gave them for the lookup's service and hints. */
struct ferry__ai_kind {
    int      socktype;
    int      protocol;
    uint16_t port;            /* network order */
};

/* The most kinds a service gives (TCP, UDP, and a few rarer protocols). */
#define FERRY__AI_KINDS 8

/*
 * Make a list of naddrs x nkinds entries in one block of ferry's allocator
 * (each address with each kind, addresses in the order given), with
 * `canon` (may be NULL) as the first entry's ai_canonname.
 * Returns: 0 and *out; -ENOMEM (nothing made).
 */
int ferry__ai_build(struct addrinfo **out /* OUT */, const struct ferry__ai_addr *addrs,
                    size_t naddrs, const struct ferry__ai_kind *kinds, size_t nkinds,
                    const char *canon);

/* Copy a list from getaddrinfo(3) into one block of ferry's allocator.
 * Returns: 0 and *out; -ENOMEM (nothing made). */
int ferry__ai_copy(struct addrinfo **out /* OUT */, const struct addrinfo *src);

/* The ferry code of a getaddrinfo(3) result `eai` (EAI_*; `err` is errno
 * as getaddrinfo left it, for EAI_SYSTEM). */
int ferry__gai_code(int eai, int err);

/* ---- getaddrinfo(3) on a pool (loop thread, in a task) ------------------ */

/*
 * Run getaddrinfo(host, service, hints) on a thread of `pool` (NULL: the
 * default pool) and suspend the calling task until it ends; abandon it if
 * the task is cancelled or a deadline passes (its late answer is freed on
 * the pool thread).  The strings and hints are copied.
 * Returns: as ferry_getaddrinfo().
 */
int ferry__gai_on_pool(ferry_pool *pool, const char *host, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res /* OUT */);

/* The blocking call the pool runs: getaddrinfo(3) unless a test replaced
 * it (the list it returns is freed with freeaddrinfo(3)).  NULL puts
 * getaddrinfo(3) back.  Thread: any, before the lookups it is meant for. */
typedef int (*ferry__gai_fn)(const char *host, const char *service,
                             const struct addrinfo *hints, struct addrinfo **res);
void ferry__gai_set_blocking(ferry__gai_fn fn);

/* ---- The system files (loop thread; src/dns_conf.c) ---------------------- */

/* One name of the hosts file: a line gives one entry per name on it. */
struct ferry__hosts_ent {
    const char   *name;       /* into the file's text */
    const char   *canon;      /* the line's first name, into the file's text */
    unsigned      seq;        /* position in the file: ties keep file order */
    int           family;     /* AF_INET or AF_INET6 */
    unsigned char addr[16];   /* 4 or 16 bytes, network order */
};

/* The hosts file as read; all-zero is an empty one. */
struct ferry__hosts {
    char                    *text;  /* the file, cut into names in place */
    struct ferry__hosts_ent *ents;  /* sorted by name (any case), then file order */
    size_t                   n;
};

/* Read the hosts file at `path` ("address name aliases...", '#' starts a
 * comment, lines whose address does not parse are skipped).  A file that
 * cannot be read is empty.  Returns: 0; -ENOMEM (*h stays empty). */
int ferry__hosts_load(struct ferry__hosts *h, const char *path);
void ferry__hosts_free(struct ferry__hosts *h);

/* The first entry for `name` (any case) and, in *count, how many follow
 * it in file order; NULL if none. */
const struct ferry__hosts_ent *ferry__hosts_find(const struct ferry__hosts *h, const char *name,
                                                 size_t *count /* OUT */);

/* The sources of nsswitch.conf's "hosts:" line: "files", "dns", others
 * (mdns, myhostname, ...: names only getaddrinfo(3) can ask).  Without the
 * file or the line, glibc's default "dns files".  Actions in brackets are
 * skipped.  Returns: 0; -ENOMEM. */
int ferry__nss_read(bool *files, bool *dns, bool *other);

/* The resolv.conf to read (ferry__dns_set_files()). */
const char *ferry__dns_resolv_conf(void);

/* ---- The resolver of a loop (loop thread) -------------------------------- */

struct ferry__resolver;

/*
 * ferry_loop_free(), after every task has ended: true while the loop must
 * poll once more before the resolver can go, because evdns still owes
 * callbacks (of lookups that were cancelled) or has just been freed and
 * may have left callbacks of its own to run.  From the first call on, new
 * lookups get -ESHUTDOWN.
 */
bool ferry__dns_closing(ferry_loop *loop);

/* ferry_loop_free(), at the end: free what is left of the resolver. */
void ferry__dns_loop_free(ferry_loop *loop);

/* For tests: read these files instead of /etc/resolv.conf and
 * /etc/nsswitch.conf (NULL: those) when a resolver is made from now on.
 * Thread: the tests' main thread, while no resolver is being made. */
void ferry__dns_set_files(const char *resolv_conf, const char *nsswitch_conf);

/* For tests: what AI_ADDRCONFIG takes the machine to have, -1 for what it
 * has, else bit 0 for IPv4 and bit 1 for IPv6.  Thread: as above. */
void ferry__dns_set_families(int families);

/* For tests: callbacks evdns still owes the loop's resolver (lookups in
 * flight, and interrupted ones whose late answer has not come yet). */
size_t ferry__dns_inflight(ferry_loop *loop);

#endif /* FERRY_DNS_INT_H */
