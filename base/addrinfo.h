/* addrinfo.h - address lists in blocks of ferry's own allocator (one
 * allocation a list, freed by ferry_freeaddrinfo()), and the codes of name
 * resolution.  What the resolver (io/dns.c) and the pool's fallback
 * (bridge/getaddrinfo.c) share.  Any thread.
 */
#ifndef FERRY_ADDRINFO_H
#define FERRY_ADDRINFO_H

#include <stddef.h>
#include <stdint.h>
#include <netdb.h>

#include "ferry/resolve.h"

/* One address to put into a list. */
struct ferry__ai_addr {
    int family;              /* AF_INET or AF_INET6 */
    unsigned char bytes[16]; /* 4 or 16 bytes, network order */
};

/* A socket type, protocol and port that every address of a list gets, as
 * the services database gave them for the lookup's service and hints. */
struct ferry__ai_kind {
    int socktype;
    int protocol;
    uint16_t port; /* network order */
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

#endif
