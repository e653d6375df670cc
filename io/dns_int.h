/* dns_int.h - the loop's resolver (io/dns.c, DNS through evdns), the parts
 * of a lookup answered without DNS (io/dns_local.c) and the readers of the
 * system files it uses (io/dns_conf.c).  Loop thread only.
 * Address lists are base/addrinfo.h's; getaddrinfo(3) on a pool is the
 * bridge's, reached through the loop's hooks (loop_port.h).
 */
#ifndef FERRY_DNS_INT_H
#define FERRY_DNS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netdb.h>

#include "ferry/resolve.h"
#include "ferry_int.h"

#include "addrinfo.h"

/* ---- The system files (loop thread; io/dns_conf.c) ---------------------- */

/* One name of the hosts file: a line gives one entry per name on it. */
struct ferry__hosts_ent {
    const char *name;       /* into the file's text */
    const char *canon;      /* the line's first name, into the file's text */
    unsigned seq;           /* position in the file: ties keep file order */
    int family;             /* AF_INET or AF_INET6 */
    unsigned char addr[16]; /* 4 or 16 bytes, network order */
};

/* The hosts file as read; all-zero is an empty one. */
struct ferry__hosts {
    char *text;                    /* the file, cut into names in place */
    struct ferry__hosts_ent *ents; /* sorted by name (any case), then file order */
    size_t n;
};

/* Read the hosts file at `path` ("address name aliases...", '#' starts a
 * comment and a NUL byte ends its line's text, lines whose address does
 * not parse are skipped).  A file that cannot be read is empty.
 * Returns: 0; -ENOMEM (*h stays empty). */
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

/* ---- The parts of a lookup answered without DNS (dns_local.c) ------------ */

/* The most addresses a lookup returns: evdns keeps at most 32 of each
 * family from a reply, and the hosts file is cut at the same total. */
#define FERRY__DNS_MAX_ADDRS 64

/* ai_flags a lookup accepts. */
#define FERRY__DNS_FLAGS_KNOWN \
    (AI_PASSIVE | AI_CANONNAME | AI_NUMERICHOST | AI_NUMERICSERV | AI_V4MAPPED | AI_ALL | \
     AI_ADDRCONFIG | AI_IDN | AI_CANONIDN)

/* Which families to look for.  AI_ADDRCONFIG as glibc reads it: a family
 * counts if an interface has an address of it other than 127.0.0.1 or ::1. */
struct ferry__dns_families {
    bool v4;     /* ask for IPv4 addresses */
    bool v6;     /* ask for IPv6 addresses */
    bool mapped; /* AF_INET6 with AI_V4MAPPED: IPv4 ones become ::ffff:a.b.c.d */
    bool all;    /* with `mapped`: AI_ALL, mapped ones even when IPv6 ones exist */
};

/* The caller's hints checked, or the defaults; -EINVAL or a resolver code. */
int ferry__dns_hints_get(const struct addrinfo *hints, struct addrinfo *h /* OUT */);

/* A numeric host, or none: getaddrinfo(3) answers it without asking
 * anyone (AI_NUMERICHOST).  Returns 1 if `host` is a name. */
int ferry__dns_numeric(const char *host, const char *service, const struct addrinfo *h,
                       struct addrinfo **res /* OUT */);

/* The socket types, protocols and port that `service` gives with these
 * hints, from the services database. */
int ferry__dns_service_kinds(const char *service, const struct addrinfo *h,
                             struct ferry__ai_kind *kinds, size_t *nkinds /* OUT */);

/* Which families to look for: 0, or FERRY_EAI_NONAME (AI_ADDRCONFIG and
 * the machine has no address of the one family asked for). */
int ferry__dns_families_get(const struct addrinfo *h, struct ferry__dns_families *f /* OUT */);

/* Append `n` addresses of `family` (4 or 16 bytes each, packed) to the
 * list (at most FERRY__DNS_MAX_ADDRS), as IPv4-mapped IPv6 ones if `map`. */
void ferry__dns_addrs_add(struct ferry__ai_addr *list, size_t *len, int family,
                          const unsigned char *bytes, size_t n, bool map);

/* A name that DNS could hold, copied to `out` without its trailing dot
 * (then `absolute`: no search list). */
bool ferry__dns_name_ok(const char *host, char out[256], bool *absolute /* OUT */);

/* ---- The resolver of a loop (loop thread) -------------------------------- */

struct ferry__resolver;

/* A loop's resolver is one of its parts (ferry_int.h), made at its first
 * use; the loop's end asks it to close (it may owe evdns callbacks) and
 * frees it. */

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
