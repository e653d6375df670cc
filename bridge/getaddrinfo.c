/* getaddrinfo.c - getaddrinfo(3) run on a pool thread for a task that
 * abandons it if it is interrupted: the resolver's fallback where evdns
 * cannot answer (io/dns.c), reached through the loop's hooks.
 *
 * The pool job owns copies of the host, the service and the hints: an
 * abandoned job runs on after its task has returned, and its cleanup (on
 * the pool thread) frees the job and the answer nobody will read.
 *
 * Thread: any, except ferry__gai_on_pool() (loop, in a task).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "addrinfo.h"
#include "bridge_int.h"

/* ---- getaddrinfo(3) on a pool thread ---------------------------------------- */

/* Set by tests only; read by pool threads after the hand-over of a job,
 * which orders it (the pool's mutex). */
static _Atomic(ferry__gai_fn) blocking_fn;

void ferry__gai_set_blocking(ferry__gai_fn fn)
{
    atomic_store(&blocking_fn, fn);
}

/* One lookup on a pool thread, with its own copies of what it needs. */
struct gai_job {
    struct addrinfo hints; /* the caller's, or ignored when !has_hints */
    bool has_hints;
    const char *host;     /* into names[], or NULL */
    const char *service;  /* into names[], or NULL */
    struct addrinfo *res; /* the answer in a block of ferry's, once run */
    int rc;               /* 0 or the ferry code of the answer */
    char names[];         /* host and service, each NUL-terminated */
};

/* Pool thread. */
static int gai_run(void *arg)
{
    struct gai_job *j = arg;
    struct addrinfo *g = NULL;
    ferry__gai_fn fn = atomic_load(&blocking_fn);
    int e;

    errno = 0;
    e = (fn ? fn : getaddrinfo)(j->host, j->service, j->has_hints ? &j->hints : NULL, &g);
    if (e) {
        j->rc = ferry__gai_code(e, errno);
        return 0;
    }
    j->rc = ferry__ai_copy(&j->res, g);
    freeaddrinfo(g);
    /* The status is 0 whatever the answer: ferry_to_thread_abandon()
     * reserves -ECANCELED and -ETIMEDOUT for an abandoned job. */
    return 0;
}

/* Pool thread, after an abandoned job ended; or the calling task, for a
 * job interrupted before it started. */
static void gai_cleanup(void *arg, int status)
{
    struct gai_job *j = arg;

    (void)status;
    ferry_freeaddrinfo(j->res);
    ferry__free(j);
}

int ferry__gai_on_pool(ferry_pool *pool, const char *host, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res)
{
    size_t hl = host ? strlen(host) + 1 : 0, sl = service ? strlen(service) + 1 : 0;
    struct gai_job *j;
    int rc;

    *res = NULL;
    j = ferry__malloc(sizeof *j + hl + sl);
    if (!j)
        return -ENOMEM;
    memset(j, 0, sizeof *j);
    if (hints) {
        j->hints.ai_flags = hints->ai_flags;
        j->hints.ai_family = hints->ai_family;
        j->hints.ai_socktype = hints->ai_socktype;
        j->hints.ai_protocol = hints->ai_protocol;
        j->has_hints = true;
    }
    if (host) {
        memcpy(j->names, host, hl);
        j->host = j->names;
    }
    if (service) {
        memcpy(j->names + hl, service, sl);
        j->service = j->names + hl;
    }
    rc = ferry_to_thread_abandon(pool, gai_run, j, gai_cleanup);
    if (rc == -ECANCELED || rc == -ETIMEDOUT)
        return rc; /* gai_cleanup has freed j, or will */
    if (rc == 0) {
        rc = j->rc;
        if (rc == 0)
            *res = j->res;
    }
    ferry__free(j);
    return rc;
}
