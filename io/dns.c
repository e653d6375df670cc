/* dns.c - the resolver of a loop: numeric hosts (with dns_local.c), the
 * hosts file (read by dns_conf.c), and DNS queries through libevent's evdns on the loop's
 * thread; the choice of the pool (bridge/getaddrinfo.c, reached through
 * the loop's hooks) where those cannot serve.
 * Loop thread only.
 *
 * A loop's resolver is made at its first lookup and freed with the loop.
 * /etc/nsswitch.conf, /etc/hosts and /etc/resolv.conf are read when it is
 * made and not again (docs/resolve.md).
 *
 * A lookup's DNS part does not use evdns_getaddrinfo(): that call reports
 * every failure but NXDOMAIN as one code (a timeout, a SERVFAIL and a
 * truncated reply all look alike), so nothing could tell "try again" from
 * "ask the pool".  Instead each lookup sends its A and AAAA queries with
 * evdns_base_resolve_ipv4/6() and keeps their DNS_ERR_* codes.  The hosts
 * file and numeric hosts are answered here, before any query.
 *
 * Lifetimes.  A lookup's record (struct query) is on the heap, never on the
 * task's stack: evdns calls back later than a task may leave (cancelled,
 * timed out), and a callback must not write into a frame that is gone.
 * evdns always calls back exactly once per query it accepted, also after
 * evdns_cancel_request() (with DNS_ERR_CANCEL, or with the real answer if
 * it was already on its way), and always from the event loop, never inside
 * the call that sent or cancelled the query.  So the record counts the
 * callbacks it is owed; the task that leaves early clears its waiter
 * pointer, and the last callback frees the record.
 *
 * Freeing.  evdns_base_free() must not run while callbacks are owed:
 * evdns would run them later against the freed base (freeing a base with
 * requests still waiting is a known way to crash libevent 2.1).
 * ferry_loop_free() cancels every task, so every lookup cancels its
 * queries; the loop then polls until the resolver is owed nothing
 * (resolver_closing(), the closing hook of its part of the loop), frees
 * the evdns base, and polls once more for the callbacks that the base's
 * own probes may have left.
 *
 * A task of a simulated host (ferry/sim.h) is answered by the simulation
 * (sim_route.h): its hosts' names and addresses, nothing else.
 */
#include "loop_only.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include <event2/dns.h>
#include <event2/util.h>

#include "dns_int.h"
#include "loop_int.h"
#include "sim_route.h"
#include "wait_int.h"

/* How long the second address family may take once the first has
 * answered, unless ferry_resolver_opts.timeout says otherwise (evdns's own
 * getaddrinfo allows the same 3 s). */
#define DEFAULT_SKEW FERRY_SEC(3)

/* The most addresses of one family evdns keeps from a reply. */
#define MAX_PER_FAMILY 32
/* ai_flags whose lookups go to the pool in FERRY_RESOLVE_AUTO. */
#define FLAGS_POOL (AI_CANONNAME | AI_IDN | AI_CANONIDN)

struct ferry__resolver {
    struct ferry__loop_part part; /* in the loop's parts */
    ferry_loop *loop;
    /* Configuration (ferry_loop_set_resolver()), owned copies. */
    int mode;          /* FERRY_RESOLVE_* */
    char *ns_conf;     /* nameservers given, or NULL: resolv.conf */
    char *hosts_conf;  /* hosts file given, or NULL: /etc/hosts */
    int64_t timeout;   /* 0: resolv.conf's */
    unsigned attempts; /* 0: resolv.conf's */
    ferry_pool *pool;  /* for getaddrinfo(3); NULL: default */
    /* Made at the first lookup (resolver_make()), undone by
     * ferry_loop_set_resolver() and ferry_loop_free(). */
    bool made;
    bool use_files;            /* look in the hosts file */
    bool use_dns;              /* ask DNS for the other names */
    bool nss_other;            /* nsswitch has other sources: DNS misses go to the pool */
    struct evdns_base *evdns;  /* NULL: no nameserver (names go to the pool) */
    struct ferry__hosts hosts; /* the hosts file, if use_files */
    /* Callbacks evdns owes: one per query it accepted and has not called
     * back for.  Nothing may free the evdns base while this is not 0. */
    size_t inflight;
    bool closed;          /* ferry_loop_free() began: new lookups refused */
    bool draining;        /* the base was freed at poll `closed_poll`: one more poll */
    uint64_t closed_poll; /* loop->stats.polls when the base was freed */
};

/* ---- making and undoing a resolver ------------------------------------------------ */

/* The evdns base, with the nameservers given or those of resolv.conf.
 * r->evdns stays NULL if there is none. */
static int dns_open(struct ferry__resolver *r)
{
    struct evdns_base *e = evdns_base_new(r->loop->base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    char buf[64];
    int err;

    if (!e)
        return -ENOMEM;
    /* evdns_base_new() ignores a failure to allocate its table of requests
     * in flight, and a base without one sends nothing, ever: every query
     * would wait in its queue.  Setting the limit makes the table again (a
     * failure now leaves the first one in place if it was made). */
    evdns_base_set_option(e, "max-inflight:", "64");
    if (r->ns_conf) {
        const char *p = r->ns_conf;

        while (*p) {
            size_t n;

            p += strspn(p, ", \t");
            n = strcspn(p, ", \t");
            if (!n)
                break;
            if (n >= sizeof buf) {
                evdns_base_free(e, 0);
                return -EINVAL;
            }
            memcpy(buf, p, n);
            buf[n] = 0;
            p += n;
            errno = 0;
            err = evdns_base_nameserver_ip_add(e, buf);
            if (err && err != 3) { /* 3: the same server twice */
                int saved = errno;
                evdns_base_free(e, 0);
                if (err == 1 && (saved == EMFILE || saved == ENFILE))
                    return -saved; /* no descriptor for its socket */
                return err == 4 ? -EINVAL : -ENOMEM;
            }
        }
    } else {
        err = evdns_base_resolv_conf_parse(e,
                                           DNS_OPTION_NAMESERVERS | DNS_OPTION_SEARCH |
                                               DNS_OPTION_MISC | DNS_OPTION_NAMESERVERS_NO_DEFAULT,
                                           ferry__dns_resolv_conf());
        if (err == 4) {
            evdns_base_free(e, 0);
            return -ENOMEM;
        }
        /* Other outcomes (no file, no nameserver line, a line evdns could
         * not use) leave the base without nameservers: checked below. */
    }
    if (r->timeout) {
        snprintf(buf, sizeof buf, "%.6f", (double)r->timeout / 1e9);
        evdns_base_set_option(e, "timeout:", buf);
    }
    if (r->attempts) {
        snprintf(buf, sizeof buf, "%u", r->attempts);
        evdns_base_set_option(e, "attempts:", buf);
    }
    if (evdns_base_count_nameservers(e) == 0) {
        /* Queries would wait forever for a server: none are sent. */
        evdns_base_free(e, 0);
        e = NULL;
    }
    r->evdns = e;
    return 0;
}

static int resolver_make(struct ferry__resolver *r)
{
    bool files = true, dns = true, other = false;
    int rc;

    if (r->made)
        return 0;
    if (r->mode != FERRY_RESOLVE_THREADS) {
        if (!r->ns_conf && (rc = ferry__nss_read(&files, &dns, &other)))
            return rc;
        if (r->hosts_conf && !r->hosts_conf[0])
            files = false;
        if (files &&
            (rc = ferry__hosts_load(&r->hosts, r->hosts_conf ? r->hosts_conf : "/etc/hosts")))
            return rc;
        if (dns && (rc = dns_open(r))) {
            ferry__hosts_free(&r->hosts);
            return rc;
        }
    }
    r->use_files = files;
    r->use_dns = dns;
    r->nss_other = other;
    r->made = true;
    return 0;
}

/* Undo resolver_make(); r->inflight is 0. */
static void resolver_unmake(struct ferry__resolver *r)
{
    if (r->evdns)
        evdns_base_free(r->evdns, 0);
    r->evdns = NULL;
    ferry__hosts_free(&r->hosts);
    r->made = false;
}

static bool resolver_closing(struct ferry__loop_part *part);
static void resolver_free(struct ferry__loop_part *part);

/* The loop's part for its resolver: made at the first lookup or setting. */
static const struct ferry__part_ops resolver_ops = { "resolver", resolver_closing, resolver_free };

static struct ferry__resolver *resolver_find(const ferry_loop *loop)
{
    struct ferry__loop_part *p = ferry__loop_part_find(loop, &resolver_ops);

    return p ? ferry__container_of(p, struct ferry__resolver, part) : NULL;
}

static int resolver_of(ferry_loop *loop, struct ferry__resolver **out)
{
    struct ferry__resolver *r = resolver_find(loop);

    if (!r) {
        r = ferry__calloc(1, sizeof *r);
        if (!r)
            return -ENOMEM;
        r->loop = loop;
        ferry__loop_part_add(loop, &r->part, &resolver_ops);
    }
    *out = r;
    return 0;
}

/* ---- the hosts file --------------------------------------------------------------- */

/* From the hosts file: 0 and *res; FERRY_EAI_NODATA (the name is there, but
 * with no address of the families asked for); 1 (not there). */
static int from_hosts(const struct ferry__resolver *r, const char *name,
                      const struct ferry__dns_families *f, const struct ferry__ai_kind *kinds,
                      size_t nkinds, bool canon, struct addrinfo **res)
{
    struct ferry__ai_addr addrs[FERRY__DNS_MAX_ADDRS];
    size_t count, n = 0;
    const struct ferry__hosts_ent *e = ferry__hosts_find(&r->hosts, name, &count);
    bool have6 = false;

    if (!e)
        return 1;
    for (size_t i = 0; i < count; i++)
        if (e[i].family == AF_INET6 && f->v6)
            have6 = true;
    for (size_t i = 0; i < count; i++)
        if (e[i].family == AF_INET && f->v4 && (!f->mapped || f->all || !have6))
            ferry__dns_addrs_add(addrs, &n, AF_INET, e[i].addr, 1, f->mapped);
    for (size_t i = 0; i < count; i++)
        if (e[i].family == AF_INET6 && f->v6)
            ferry__dns_addrs_add(addrs, &n, AF_INET6, e[i].addr, 1, false);
    if (!n)
        return FERRY_EAI_NODATA;
    return ferry__ai_build(res, addrs, n, kinds, nkinds, canon ? e->canon : NULL);
}

/* ---- DNS queries through evdns ------------------------------------------------------ */

struct query;

/* One query of a lookup: A or AAAA. */
struct sub {
    struct query *q;
    struct evdns_request *req; /* while evdns owes the callback; NULL after */
    bool sent;                 /* evdns accepted it */
    bool done;                 /* called back */
    int err;                   /* DNS_ERR_*, once done */
    size_t n;                  /* addresses in addr, once done */
    unsigned char addr[MAX_PER_FAMILY * 16];
};

/* A lookup's record.  Heap: see the top of the file. */
struct query {
    struct ferry__resolver *r;
    struct ferry__waiter *w; /* the waiting task's, or NULL once it left */
    unsigned owed;           /* callbacks not yet run */
    struct sub v4, v6;
};

static void query_cb(int result, char type, int count, int ttl, void *addresses, void *arg)
{
    struct sub *s = arg;
    struct query *q = s->q;
    size_t size = type == DNS_IPv4_A ? 4 : 16;

    (void)ttl;
    s->req = NULL;
    s->done = true;
    s->err = result;
    if (result == DNS_ERR_NONE && (type == DNS_IPv4_A || type == DNS_IPv6_AAAA) && count > 0 &&
        addresses) {
        s->n = (size_t)count < MAX_PER_FAMILY ? (size_t)count : MAX_PER_FAMILY;
        memcpy(s->addr, addresses, s->n * size);
    } else if (result == DNS_ERR_NONE) {
        s->err = DNS_ERR_NODATA;
    }
    q->owed--;
    q->r->inflight--;
    if (!q->w) {
        /* The task has left: drop the late answer. */
        if (!q->owed)
            ferry__free(q);
        return;
    }
    /* Wake the task when everything is in, or at the first addresses (it
     * then gives the other family a little longer). */
    if (!q->owed || s->n)
        ferry__grant(q->w, 0);
}

/* The task leaves: queries still out are cancelled and their callbacks
 * (which always come) free the record; without any, it goes now. */
static void query_leave(struct query *q)
{
    q->w = NULL;
    if (q->v4.req)
        evdns_cancel_request(q->r->evdns, q->v4.req);
    if (q->v6.req)
        evdns_cancel_request(q->r->evdns, q->v6.req);
    if (!q->owed)
        ferry__free(q);
}

static int query_send(struct query *q, struct sub *s, bool v6, const char *name, int flags)
{
    s->q = q;
    s->req = v6 ? evdns_base_resolve_ipv6(q->r->evdns, name, flags, query_cb, s)
                : evdns_base_resolve_ipv4(q->r->evdns, name, flags, query_cb, s);
    if (!s->req)
        return -ENOMEM;
    s->sent = true;
    q->owed++;
    q->r->inflight++;
    return 0;
}

/* The outcome of the queries that are done, when none gave an address:
 * 1 for "ask the pool" (a truncated reply), else a resolver code. */
static int query_error(const struct query *q)
{
    const struct sub *subs[2] = { &q->v4, &q->v6 };
    bool notexist = false, nodata = true, again = false, truncated = false;

    for (int i = 0; i < 2; i++) {
        const struct sub *s = subs[i];

        if (!s->sent)
            continue;
        switch (s->err) {
        case DNS_ERR_NOTEXIST:
            notexist = true;
            break;
        case DNS_ERR_NODATA:
            break;
        case DNS_ERR_TRUNCATED:
            truncated = true;
            nodata = false;
            break;
        case DNS_ERR_TIMEOUT:
        case DNS_ERR_SERVERFAILED:
            again = true;
            nodata = false;
            break;
        default:
            nodata = false;
            break;
        }
    }
    if (truncated)
        return 1;
    if (notexist)
        return FERRY_EAI_NONAME;
    if (nodata)
        return FERRY_EAI_NODATA;
    return again ? FERRY_EAI_AGAIN : FERRY_EAI_FAIL;
}

/*
 * Ask DNS for `name`: A and AAAA as `f` says, in parallel.  Once one
 * family has given addresses, the other gets `skew` more.
 * Returns: 0 and *res; 1 (the pool should ask: a truncated reply);
 * a resolver code; -ECANCELED, -ETIMEDOUT; -ENOMEM.
 */
static int query_dns(struct ferry__resolver *r, ferry_task *self, const char *name, bool absolute,
                     const struct ferry__dns_families *f, const struct ferry__ai_kind *kinds,
                     size_t nkinds, const char *canon, struct addrinfo **res)
{
    struct ferry__ai_addr addrs[FERRY__DNS_MAX_ADDRS];
    int64_t until = FERRY_NEVER, skew = r->timeout ? r->timeout : DEFAULT_SKEW;
    int flags = absolute ? DNS_QUERY_NO_SEARCH : 0, rc = 0;
    struct ferry__waiter w;
    struct query *q;
    size_t n = 0;

    q = ferry__calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->r = r;
    q->w = &w;
    ferry__waiter_init(&w, self, "getaddrinfo", q);
    if (f->v4)
        rc = query_send(q, &q->v4, false, name, flags);
    if (!rc && f->v6)
        rc = query_send(q, &q->v6, true, name, flags);
    if (rc) {
        query_leave(q);
        return rc;
    }
    for (;;) {
        rc = ferry__wait_inline(NULL, &w, until);
        if (rc < 0) {
            query_leave(q);
            return rc;
        }
        if (rc == 1 || !q->owed)
            break; /* the slower family's time is up, or all is in */
        if (until == FERRY_NEVER)
            until = ferry_now() + skew;
        ferry__waiter_init(&w, self, "getaddrinfo", q);
    }
    /* IPv4 first, then IPv6; IPv4-mapped only without IPv6 ones (or with
     * AI_ALL), as getaddrinfo(3) does. */
    if (q->v4.n && (!f->mapped || f->all || !q->v6.n))
        ferry__dns_addrs_add(addrs, &n, AF_INET, q->v4.addr, q->v4.n, f->mapped);
    if (q->v6.n)
        ferry__dns_addrs_add(addrs, &n, AF_INET6, q->v6.addr, q->v6.n, false);
    rc = n ? ferry__ai_build(res, addrs, n, kinds, nkinds, canon) : query_error(q);
    query_leave(q);
    return rc;
}

/* ---- the API ------------------------------------------------------------------------ */

/* getaddrinfo(3) on the pool, and the cancellation check a wait makes: a
 * task cancelled while the answer was on its way gets nothing. */
static int on_pool(ferry_task *self, ferry_pool *pool, const char *host, const char *service,
                   const struct addrinfo *hints, struct addrinfo **res)
{
    int rc = self->loop->hooks.getaddrinfo(pool, host, service, hints, res);

    if (rc == 0 && self->cancelled && !ferry__task_shielded(self)) {
        ferry_freeaddrinfo(*res);
        *res = NULL;
        return -ECANCELED;
    }
    return rc;
}

int ferry_getaddrinfo(const char *host, const char *service, const struct addrinfo *hints,
                      struct addrinfo **res)
{
    struct ferry__ai_kind kinds[FERRY__AI_KINDS];
    struct ferry__resolver *r;
    struct ferry__dns_families f;
    struct addrinfo h;
    ferry_sim_host *sim_host;
    ferry_task *self;
    size_t nkinds = 0;
    char name[256];
    bool absolute, auto_mode, canon;
    int rc;

    if (res)
        *res = NULL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (!res || (!host && !service))
        return -EINVAL;
    rc = ferry__dns_hints_get(hints, &h);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    /* A task of a simulated host asks the simulation's names. */
    sim_host = host ? ferry__sim_route(self->loop) : NULL;
    if (sim_host)
        return ferry__sim_getaddrinfo(sim_host, host, service, &h, res);
    rc = resolver_of(self->loop, &r);
    if (rc)
        return rc;
    if (r->closed)
        return -ESHUTDOWN;
    rc = resolver_make(r);
    if (rc)
        return rc;
    auto_mode = r->mode == FERRY_RESOLVE_AUTO;
    canon = (h.ai_flags & AI_CANONNAME) != 0;
    if (r->mode == FERRY_RESOLVE_THREADS || (auto_mode && (h.ai_flags & FLAGS_POOL)))
        return on_pool(self, r->pool, host, service, hints, res);

    rc = ferry__dns_numeric(host, service, &h, res);
    if (rc != 1)
        return rc;
    rc = ferry__dns_service_kinds(service, &h, kinds, &nkinds);
    if (rc)
        return rc;
    rc = ferry__dns_families_get(&h, &f);
    if (rc)
        return rc;
    if (!ferry__dns_name_ok(host, name, &absolute))
        return FERRY_EAI_NONAME;
    if (r->use_files) {
        rc = from_hosts(r, name, &f, kinds, nkinds, canon, res);
        if (rc != 1)
            return rc;
    }
    if (!r->use_dns || !r->evdns)
        return auto_mode ? on_pool(self, r->pool, host, service, hints, res) : FERRY_EAI_NONAME;
    rc = query_dns(r, self, name, absolute, &f, kinds, nkinds, canon ? name : NULL, res);
    if (auto_mode &&
        (rc == 1 || (r->nss_other && (rc == FERRY_EAI_NONAME || rc == FERRY_EAI_NODATA))))
        return on_pool(self, r->pool, host, service, hints, res);
    return rc == 1 ? FERRY_EAI_FAIL : rc;
}

/* A list of nameservers that evdns will take: -EINVAL otherwise. */
static int nameservers_check(const char *list)
{
    const char *p = list;
    int count = 0;

    while (*p) {
        struct sockaddr_storage ss;
        int len = sizeof ss;
        char buf[64];
        size_t n;

        p += strspn(p, ", \t");
        n = strcspn(p, ", \t");
        if (!n)
            break;
        if (n >= sizeof buf)
            return -EINVAL;
        memcpy(buf, p, n);
        buf[n] = 0;
        if (evutil_parse_sockaddr_port(buf, (struct sockaddr *)&ss, &len) != 0)
            return -EINVAL;
        p += n;
        count++;
    }
    return count ? 0 : -EINVAL;
}

static char *strdup_or(const char *s, int *rc)
{
    char *d;

    if (!s)
        return NULL;
    d = ferry__malloc(strlen(s) + 1);
    if (!d)
        *rc = -ENOMEM;
    else
        strcpy(d, s);
    return d;
}

int ferry_loop_set_resolver(ferry_loop *loop, const ferry_resolver_opts *opts)
{
    static const ferry_resolver_opts defaults;
    struct ferry__resolver *r;
    char *ns, *hosts;
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (!opts)
        opts = &defaults;
    if (opts->mode < FERRY_RESOLVE_AUTO || opts->mode > FERRY_RESOLVE_THREADS ||
        opts->timeout < 0 || (opts->timeout > 0 && opts->timeout < FERRY_MSEC(1)))
        return -EINVAL;
    if (opts->nameservers && (rc = nameservers_check(opts->nameservers)))
        return rc;
    rc = resolver_of(loop, &r);
    if (rc)
        return rc;
    if (r->closed)
        return -ESHUTDOWN;
    if (r->inflight)
        return -EBUSY;
    ns = strdup_or(opts->nameservers, &rc);
    hosts = strdup_or(opts->hosts, &rc);
    if (rc) {
        ferry__free(ns);
        ferry__free(hosts);
        return rc;
    }
    resolver_unmake(r);
    ferry__free(r->ns_conf);
    ferry__free(r->hosts_conf);
    r->ns_conf = ns;
    r->hosts_conf = hosts;
    r->mode = opts->mode;
    r->timeout = opts->timeout;
    r->attempts = opts->attempts;
    r->pool = opts->pool;
    return 0;
}

/* ---- the loop's end ---------------------------------------------------------------- */

/*
 * ferry_loop_free(), after every task has ended: true while the loop must
 * poll once more before the resolver can go, because evdns still owes
 * callbacks (of lookups that were cancelled) or has just been freed and
 * may have left callbacks of its own to run.  From the first call on, new
 * lookups get -ESHUTDOWN.
 */
static bool resolver_closing(struct ferry__loop_part *part)
{
    struct ferry__resolver *r = ferry__container_of(part, struct ferry__resolver, part);
    ferry_loop *loop = r->loop;

    r->closed = true;
    if (r->inflight)
        return true;
    if (r->evdns) {
        /* Nothing is owed now: no query of ours is left in evdns.  Freeing
         * may cancel a probe of a failed nameserver, whose callback evdns
         * runs (and frees) at the next poll. */
        evdns_base_free(r->evdns, 0);
        r->evdns = NULL;
        r->draining = true;
        r->closed_poll = loop->stats.polls;
        return true;
    }
    if (r->draining && loop->stats.polls == r->closed_poll)
        return true;
    r->draining = false;
    return false;
}

/* ferry_loop_free(), at the end: free what is left of the resolver. */
static void resolver_free(struct ferry__loop_part *part)
{
    struct ferry__resolver *r = ferry__container_of(part, struct ferry__resolver, part);

    resolver_unmake(r);
    ferry__free(r->ns_conf);
    ferry__free(r->hosts_conf);
    ferry__loop_part_del(&r->part);
    ferry__free(r);
}

size_t ferry__dns_inflight(ferry_loop *loop)
{
    struct ferry__resolver *r = resolver_find(loop);

    return r ? r->inflight : 0;
}
