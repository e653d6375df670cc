/* dns_local.c - the parts of a lookup answered without asking DNS: the
 * caller's hints checked, numeric hosts, the services database, which
 * address families to look for (AI_ADDRCONFIG), the list of addresses
 * built, the name checked.  The resolver (dns.c) calls them in this order.
 * Loop thread only.
 */
#include "loop_only.h"

#include <errno.h>
#include <ifaddrs.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "dns_int.h"

/* The caller's hints checked, or the defaults; -EINVAL or a resolver code. */
int ferry__dns_hints_get(const struct addrinfo *hints, struct addrinfo *h)
{
    memset(h, 0, sizeof *h);
    if (!hints) {
        h->ai_family = AF_UNSPEC;
        h->ai_flags = AI_V4MAPPED | AI_ADDRCONFIG;
        return 0;
    }
    if ((hints->ai_flags & ~FERRY__DNS_FLAGS_KNOWN) || hints->ai_addrlen || hints->ai_addr ||
        hints->ai_canonname || hints->ai_next)
        return -EINVAL;
    if (hints->ai_family != AF_UNSPEC && hints->ai_family != AF_INET &&
        hints->ai_family != AF_INET6)
        return FERRY_EAI_FAMILY;
    h->ai_flags = hints->ai_flags;
    h->ai_family = hints->ai_family;
    h->ai_socktype = hints->ai_socktype;
    h->ai_protocol = hints->ai_protocol;
    return 0;
}

/* A numeric host, or none: getaddrinfo(3) answers it without asking
 * anyone (AI_NUMERICHOST).  Returns 1 if `host` is a name. */
int ferry__dns_numeric(const char *host, const char *service, const struct addrinfo *h,
                       struct addrinfo **res)
{
    struct addrinfo nh = *h, *g = NULL;
    int e, rc;

    nh.ai_flags |= AI_NUMERICHOST;
    errno = 0;
    e = getaddrinfo(host, service, &nh, &g);
    if (e == EAI_NONAME && host)
        return 1;
    if (e)
        return ferry__gai_code(e, errno);
    rc = ferry__ai_copy(res, g);
    freeaddrinfo(g);
    return rc;
}

/* The socket types, protocols and port that `service` gives with these
 * hints, from the services database (getaddrinfo(3) with no host asks
 * nobody else). */
int ferry__dns_service_kinds(const char *service, const struct addrinfo *h,
                             struct ferry__ai_kind *kinds, size_t *nkinds)
{
    struct addrinfo th, *g = NULL, *s;
    int e;

    memset(&th, 0, sizeof th);
    th.ai_flags = AI_PASSIVE | (h->ai_flags & AI_NUMERICSERV);
    th.ai_family = h->ai_family == AF_INET6 ? AF_INET6 : AF_INET;
    th.ai_socktype = h->ai_socktype;
    th.ai_protocol = h->ai_protocol;
    errno = 0;
    e = getaddrinfo(NULL, service ? service : "0", &th, &g);
    if (e)
        return ferry__gai_code(e, errno);
    *nkinds = 0;
    for (s = g; s && *nkinds < FERRY__AI_KINDS; s = s->ai_next) {
        struct ferry__ai_kind *k = &kinds[*nkinds];

        if (s->ai_family != th.ai_family || !s->ai_addr)
            continue;
        k->socktype = s->ai_socktype;
        k->protocol = s->ai_protocol;
        k->port = s->ai_family == AF_INET
                      ? ((const struct sockaddr_in *)(const void *)s->ai_addr)->sin_port
                      : ((const struct sockaddr_in6 *)(const void *)s->ai_addr)->sin6_port;
        (*nkinds)++;
    }
    freeaddrinfo(g);
    return *nkinds ? 0 : FERRY_EAI_SERVICE;
}


/* What the tests pretend the machine has (ferry__dns_set_families()):
 * -1 for the truth, else bit 0 for IPv4 and bit 1 for IPv6. */
static int families_forced = -1;

void ferry__dns_set_families(int families)
{
    families_forced = families;
}

/* Whether an interface has an IPv4 or an IPv6 address other than
 * 127.0.0.1 or ::1.  Both unknown (false) if the interfaces cannot be read. */
static void machine_families(bool *seen4, bool *seen6)
{
    struct ifaddrs *ifs, *i;

    *seen4 = *seen6 = false;
    if (families_forced >= 0) {
        *seen4 = families_forced & 1;
        *seen6 = families_forced & 2;
        return;
    }
    if (getifaddrs(&ifs) != 0)
        return;
    for (i = ifs; i; i = i->ifa_next) {
        const struct sockaddr *sa = i->ifa_addr;

        if (!sa)
            continue;
        if (sa->sa_family == AF_INET &&
            ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr !=
                htonl(INADDR_LOOPBACK))
            *seen4 = true;
        if (sa->sa_family == AF_INET6 &&
            !IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr))
            *seen6 = true;
    }
    freeifaddrs(ifs);
}

int ferry__dns_families_get(const struct addrinfo *h, struct ferry__dns_families *f)
{
    memset(f, 0, sizeof *f);
    f->v4 = h->ai_family != AF_INET6;
    f->v6 = h->ai_family != AF_INET;
    if (h->ai_family == AF_INET6 && (h->ai_flags & AI_V4MAPPED)) {
        f->v4 = f->mapped = true;
        f->all = (h->ai_flags & AI_ALL) != 0;
    }
    if (h->ai_flags & AI_ADDRCONFIG) {
        bool seen4, seen6;

        machine_families(&seen4, &seen6);
        if (h->ai_family == AF_UNSPEC) {
            /* Neither seen: nothing is known, nothing is narrowed (glibc). */
            if (seen4 || seen6) {
                f->v4 = seen4;
                f->v6 = seen6;
            }
        } else if ((h->ai_family == AF_INET && !seen4) || (h->ai_family == AF_INET6 && !seen6)) {
            return FERRY_EAI_NONAME;
        }
    }
    return 0;
}

/* Append `n` addresses of `family` (4 or 16 bytes each, packed) to the
 * list, as IPv4-mapped IPv6 ones if `map`. */
void ferry__dns_addrs_add(struct ferry__ai_addr *list, size_t *len, int family,
                          const unsigned char *bytes, size_t n, bool map)
{
    size_t step = family == AF_INET ? 4 : 16;

    for (size_t i = 0; i < n && *len < FERRY__DNS_MAX_ADDRS; i++) {
        struct ferry__ai_addr *a = &list[(*len)++];

        memset(a, 0, sizeof *a);
        if (map) {
            a->family = AF_INET6;
            a->bytes[10] = a->bytes[11] = 0xff;
            memcpy(a->bytes + 12, bytes + i * step, 4);
        } else {
            a->family = family;
            memcpy(a->bytes, bytes + i * step, step);
        }
    }
}

/* A name that DNS could hold: labels of 1 to 63 bytes, 253 in all, one
 * trailing dot at most (then `absolute`: no search list).  Copied to `out`
 * without that dot. */
bool ferry__dns_name_ok(const char *host, char out[256], bool *absolute)
{
    size_t len = strlen(host), label = 0;

    *absolute = len > 0 && host[len - 1] == '.';
    if (*absolute)
        len--;
    if (len == 0 || len > 253)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (host[i] == '.') {
            if (label == 0)
                return false;
            label = 0;
        } else if (++label > 63) {
            return false;
        }
    }
    memcpy(out, host, len);
    out[len] = 0;
    return true;
}
