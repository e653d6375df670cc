/* socket.c - TCP and Unix sockets for tasks: listen, accept, connect.
 * Loop thread only.
 *
 * A listener is registered with the loop once, like a stream
 * (ioreg.c): readable edges wake the tasks waiting in accept, which take
 * connections with accept4() until EAGAIN.  Several tasks may accept on one
 * listener; an edge wakes them all and the ones that find nothing wait
 * again.
 *
 * Out of descriptors.  accept4() failing with EMFILE or ENFILE leaves the
 * connection in the queue, and with it the listener's readiness: a loop
 * that retried would spin.  Each listener keeps one descriptor in reserve;
 * on EMFILE it closes it, accepts and closes the queued connections with
 * the one freed, and opens the reserve again (libuv's way), then returns
 * the error to the caller, who chooses how long to back off.
 *
 * Connecting suspends the task until the kernel says the connection is
 * made or failed (the socket becomes writable; SO_ERROR tells which).  A
 * host's addresses are tried in turn within the caller's deadline.
 *
 * A task of a simulated host (ferry/sim.h) listens and connects on the
 * simulation instead (sim_route.h): its listener wraps the simulation's,
 * with no descriptor, and its connections are simulated streams.
 */
#include "loop_only.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ferry/resolve.h"
#include "loop_int.h"
#include "sim_route.h"
#include "stream_int.h"

int64_t ferry__connect_attempt_min = FERRY_SEC(2);

struct ferry_listener {
    struct ferry__ioreg reg; /* descriptor, readiness, accepting tasks in rq */
    struct ferry__ioobj obj; /* in loop->ioobjs while open */
    int spare;               /* descriptor kept for EMFILE, or -1 */
    int port;                /* bound TCP port, or -1 for a Unix socket */
    unsigned inside;         /* tasks inside accept: freed at 0 once closed */
    struct ferry__uacc *acc; /* the io_uring accept queue (uring.c), or NULL */
    char *path;              /* socket file to remove at close, or NULL */
    ferry_stream_opts sopts; /* for accepted streams */
    ferry_sim_listener *sim; /* a simulated host's listener it wraps, or NULL */
};

static int open_spare(void)
{
    return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* TCP_NODELAY for a stream ferry made of a TCP socket, unless the options
 * ask for Nagle's algorithm.  Best effort: the stream works either way. */
static void set_nodelay(int fd, const ferry_stream_opts *opts)
{
    int one = 1;

    if (!opts || !(opts->flags & FERRY_STREAM_NAGLE))
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A sockaddr_un for `path` ('@' first: abstract).  Returns: 0; -EINVAL. */
static int unix_addr(const char *path, struct sockaddr_un *sa, socklen_t *len)
{
    size_t n;

    if (!path || !*path)
        return -EINVAL;
    n = strlen(path);
    if (n >= sizeof sa->sun_path)
        return -EINVAL;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path, path, n);
    if (path[0] == '@') {
        sa->sun_path[0] = 0;
        *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    } else {
        *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    }
    return 0;
}

/*
 * Numeric addresses for bind() (`passive`: host NULL is then the any
 * address).  getaddrinfo() with AI_NUMERICHOST reads no file and asks no
 * server, so it cannot block the loop; a listener is never given a name.
 */
static int resolve(const char *host, int port, bool passive, struct addrinfo **res)
{
    struct addrinfo hints;
    char serv[8];
    int rc;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    snprintf(serv, sizeof serv, "%d", port);
    rc = getaddrinfo(host, serv, &hints, res);
    if (rc == 0)
        return 0;
    if (rc == EAI_MEMORY)
        return -ENOMEM;
    if (rc == EAI_SYSTEM)
        return errno ? -errno : -EINVAL;
    return passive ? -EINVAL : -ENOTSUP;
}

/* ---- listen ------------------------------------------------------------------ */

static void listener_free(ferry_listener *l)
{
    ferry__free(l->path);
    ferry__free(l);
}

/* Closed: unregister, wake the accepting tasks, close; the memory stays. */
static void listener_shut(ferry_listener *l)
{
    ferry__ioobj_del(&l->obj);
    ferry__ioreg_close(&l->reg);
    if (l->sim) {
        ferry__sim_listener_drop(l->sim);
        l->sim = NULL;
        return;
    }
    if (l->acc)
        ferry__uring_listen_close(l->acc);
    l->acc = NULL;
    if (l->path)
        unlink(l->path);
    if (l->reg.fd >= 0)
        close(l->reg.fd);
    l->reg.fd = -1;
    if (l->spare >= 0)
        close(l->spare);
    l->spare = -1;
}

static void listener_destroy_obj(struct ferry__ioobj *o)
{
    ferry_listener *l = ferry__container_of(o, ferry_listener, obj);

    listener_shut(l);
    listener_free(l);
}

/*
 * Bind and listen on a new socket of `family` at `sa`, and make the
 * listener.  On an error nothing is left (the socket file of a Unix
 * listener included).
 */
static int listen_on(ferry_listener **out, ferry_loop *loop, int family, const struct sockaddr *sa,
                     socklen_t len, const ferry_listen_opts *opts)
{
    ferry_listener *l;
    unsigned flags = opts ? opts->flags : 0;
    int fd, rc, one = 1;

    l = ferry__calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->spare = -1;
    l->port = -1;
    if (opts)
        l->sopts = opts->stream;
    if (family == AF_UNIX && sa->sa_family == AF_UNIX &&
        ((const struct sockaddr_un *)(const void *)sa)->sun_path[0]) {
        const char *path = ((const struct sockaddr_un *)(const void *)sa)->sun_path;
        l->path = ferry__malloc(strlen(path) + 1);
        if (!l->path) {
            rc = -ENOMEM;
            goto err_free;
        }
        strcpy(l->path, path);
    }
    fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        goto err_free;
    }
    if (family != AF_UNIX) {
        if (!(flags & FERRY_LISTEN_NO_REUSEADDR))
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if ((flags & FERRY_LISTEN_REUSEPORT) &&
            setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
            rc = -errno;
            goto err_close;
        }
        if (family == AF_INET6) {
            int v6only = (flags & FERRY_LISTEN_V6ONLY) ? 1 : 0;
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
        }
    }
    if (bind(fd, sa, len) != 0) {
        rc = -errno;
        goto err_close;
    }
    if (listen(fd, opts && opts->backlog ? opts->backlog : SOMAXCONN) != 0) {
        rc = -errno;
        goto err_unlink;
    }
    if (family != AF_UNIX) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
            rc = -errno;
            goto err_unlink;
        }
        l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    }
    rc = ferry__ioreg_open_ring(&l->reg, loop, fd, FERRY_READ);
    if (rc == 1) {
        rc = ferry__uring_listen(&l->acc, &l->reg);
        if (rc)
            ferry__ioreg_close(&l->reg);
    }
    if (rc)
        goto err_unlink;
    /* Without its reserve the listener still works; it only cannot clear
     * its queue when the process runs out of descriptors (tried again
     * then). */
    l->spare = open_spare();
    l->obj.destroy = listener_destroy_obj;
    ferry__ioobj_add(loop, &l->obj);
    *out = l;
    return 0;

err_unlink:
    if (l->path)
        unlink(l->path);
err_close:
    close(fd);
err_free:
    listener_free(l);
    return rc;
}

/* A listener of the simulated host `h` on `port` (0: a free one). */
static int listen_sim(ferry_listener **out, ferry_loop *loop, ferry_sim_host *h, int port,
                      const ferry_listen_opts *opts)
{
    ferry_listener *l;
    int rc;

    l = ferry__calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->spare = -1;
    if (opts)
        l->sopts = opts->stream;
    rc = ferry__ioreg_open(&l->reg, loop, -1, 0);
    if (rc)
        goto err_free;
    rc = ferry__sim_listen_owned(h, port, &l->sim, &l->port);
    if (rc)
        goto err_free;
    l->obj.destroy = listener_destroy_obj;
    ferry__ioobj_add(loop, &l->obj);
    *out = l;
    return 0;

err_free:
    listener_free(l);
    return rc;
}

int ferry_tcp_listen(ferry_listener **out, ferry_loop *loop, const char *host, int port,
                     const ferry_listen_opts *opts)
{
    struct addrinfo *ai;
    ferry_sim_host *sh;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (port < 0 || port > 65535 ||
        (opts && ((opts->flags &
                   ~(FERRY_LISTEN_NO_REUSEADDR | FERRY_LISTEN_REUSEPORT | FERRY_LISTEN_V6ONLY)) ||
                  (opts->stream.flags & ~FERRY_STREAM_NAGLE) || opts->backlog < 0)))
        return -EINVAL;
    rc = ferry__loop_arg(&loop);
    if (rc)
        return rc;
    /* A simulated host listens on every address it has, whatever the
     * caller names. */
    sh = ferry__sim_route(loop);
    if (sh)
        return listen_sim(out, loop, sh, port, opts);
    if (!host) {
        struct sockaddr_in6 any6;
        struct sockaddr_in any4;

        /* Every address: IPv6's any address takes IPv4 connections too
         * (unless V6ONLY); a system without IPv6 gets IPv4's. */
        memset(&any6, 0, sizeof any6);
        any6.sin6_family = AF_INET6;
        any6.sin6_addr = in6addr_any;
        any6.sin6_port = htons((uint16_t)port);
        rc = listen_on(out, loop, AF_INET6, (struct sockaddr *)&any6, sizeof any6, opts);
        if (rc != -EAFNOSUPPORT && rc != -EADDRNOTAVAIL)
            return rc;
        memset(&any4, 0, sizeof any4);
        any4.sin_family = AF_INET;
        any4.sin_addr.s_addr = htonl(INADDR_ANY);
        any4.sin_port = htons((uint16_t)port);
        return listen_on(out, loop, AF_INET, (struct sockaddr *)&any4, sizeof any4, opts);
    }
    rc = resolve(host, port, true, &ai);
    if (rc)
        return rc;
    rc = listen_on(out, loop, ai->ai_family, ai->ai_addr, ai->ai_addrlen, opts);
    freeaddrinfo(ai);
    return rc;
}

int ferry_unix_listen(ferry_listener **out, ferry_loop *loop, const char *path,
                      const ferry_listen_opts *opts)
{
    struct sockaddr_un sa;
    socklen_t len;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (opts && ((opts->flags & ~FERRY_LISTEN_NO_REUSEADDR) ||
                 (opts->stream.flags & ~FERRY_STREAM_NAGLE) || opts->backlog < 0))
        return -EINVAL;
    rc = unix_addr(path, &sa, &len);
    if (rc)
        return rc;
    rc = ferry__loop_arg(&loop);
    if (rc)
        return rc;
    return listen_on(out, loop, AF_UNIX, (struct sockaddr *)&sa, len, opts);
}

int ferry_listener_port(const ferry_listener *l)
{
    if (!l)
        return -EINVAL;
    if (l->reg.closed)
        return -EBADF;
    return l->port >= 0 ? l->port : -EAFNOSUPPORT;
}

int ferry_listener_fd(const ferry_listener *l)
{
    if (!l)
        return -EINVAL;
    if (l->reg.closed)
        return -EBADF;
    return l->sim ? -ENOTSOCK : l->reg.fd;
}

int ferry_listener_close(ferry_listener *l)
{
    ferry_task *self;

    if (!l)
        return -EINVAL;
    self = ferry__self();
    if (self ? self->loop != l->reg.loop : ferry__loop_check(l->reg.loop) != 0)
        return -EPERM;
    if (l->reg.closed)
        return -EBADF;
    listener_shut(l);
    if (!l->inside)
        listener_free(l);
    return 0;
}

/* ---- accept --------------------------------------------------------------------- */

/* Out of descriptors with connections queued (see the top of the file):
 * accept and close them with the reserve descriptor.  Clears the readiness
 * if the queue was emptied. */
static void drop_queued(ferry_listener *l)
{
    int fd;

    if (l->spare < 0 && (l->spare = open_spare()) < 0)
        return;
    close(l->spare);
    l->spare = -1;
    for (;;) {
        fd = accept4(l->reg.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            l->reg.ready &= (uint8_t)~FERRY_READ;
        break;
    }
    l->spare = open_spare();
}

/* Errors of accept4() that belong to the connection, not the listener
 * (accept(2): Linux passes pending network errors of the new socket on;
 * take them as EAGAIN and try again). */
static bool retry_accept(int err)
{
    switch (err) {
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
        return true;
    default:
        return false;
    }
}

/* ferry_listener_accept() on a simulated host's listener. */
static int accept_sim(ferry_listener *l, ferry_stream **out, struct sockaddr_storage *peer)
{
    ferry_sim_listener *li = l->sim;
    int rc;

    l->inside++;
    rc = ferry_sim_accept(li, out);
    if (rc == 0 && peer)
        ferry__sim_peer_addr(*out, peer);
    if (--l->inside == 0 && l->reg.closed)
        listener_free(l);
    return rc;
}

/* accept4() through the loop's io_uring: the next queued descriptor (and
 * its peer's address), or -1 with errno as accept4() leaves it;
 * -ENOMEM when no accept could be queued. */
static int accept_ring(ferry_listener *l, struct sockaddr_storage *ss, socklen_t *sl)
{
    int fd = ferry__uring_accept(l->acc);

    if (fd == -ENOMEM)
        return fd;
    if (fd < 0) {
        errno = -fd;
        return -1;
    }
    if (getpeername(fd, (struct sockaddr *)ss, sl) != 0)
        *sl = 0;
    return fd;
}

int ferry_listener_accept(ferry_listener *l, ferry_stream **out, struct sockaddr_storage *peer)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    ferry_task *self;
    int rc, fd;

    if (out)
        *out = NULL;
    if (!l || !out)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (l->reg.loop != self->loop)
        return -EPERM;
    if (l->reg.closed)
        return -EBADF;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (l->sim)
        return accept_sim(l, out, peer);
    l->inside++;
    for (;;) {
        /* Through io_uring the queue is the readiness, and asking it is
         * what arms the next accept. */
        if ((l->reg.ready & FERRY_READ) || l->acc) {
            sl = sizeof ss;
            if (l->acc) {
                fd = accept_ring(l, &ss, &sl);
                if (fd == -ENOMEM) {
                    rc = -ENOMEM;
                    break;
                }
            } else {
                fd = accept4(l->reg.fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
            }
            if (fd >= 0) {
                if (l->port >= 0)
                    set_nodelay(fd, &l->sopts);
                rc = ferry__stream_make(out, self->loop, fd, &ferry__sock_io,
                                        FERRY_READ | FERRY_WRITE, &l->sopts);
                if (rc) {
                    close(fd);
                    break;
                }
                if (peer) {
                    memset(peer, 0, sizeof *peer);
                    memcpy(peer, &ss, sl < sizeof ss ? sl : sizeof ss);
                }
                break;
            }
            rc = errno;
            if (retry_accept(rc))
                continue;
            if (rc == EAGAIN || rc == EWOULDBLOCK) {
                l->reg.ready &= (uint8_t)~FERRY_READ;
            } else {
                if (rc == EMFILE || rc == ENFILE)
                    drop_queued(l);
                rc = -rc;
                break;
            }
        }
        rc = ferry__ioreg_wait(&l->reg, self, &l->reg.rq, FERRY_READ, "accept", l);
        if (rc)
            break;
    }
    if (--l->inside == 0 && l->reg.closed)
        listener_free(l);
    return rc;
}

/* ---- connect ------------------------------------------------------------------- */

/*
 * Connect a new socket to `sa` and make a stream of it, waiting while the
 * connection is in progress.  On an error nothing is left open.
 */
static int connect_addr(ferry_stream **out, ferry_task *self, const struct sockaddr *sa,
                        socklen_t len, const ferry_stream_opts *opts)
{
    ferry_stream *s;
    bool tcp = sa->sa_family != AF_UNIX, pending = false;
    int fd, rc, err;
    socklen_t el = sizeof err;

    fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (tcp)
        set_nodelay(fd, opts);
    if (connect(fd, sa, len) != 0) {
        /* EINTR: the connection goes on in the background, as for
         * EINPROGRESS. */
        if (errno != EINPROGRESS && errno != EINTR) {
            rc = -errno;
            close(fd);
            return rc;
        }
        pending = true;
    }
    rc = ferry__stream_make(&s, self->loop, fd, &ferry__sock_io,
                            pending ? 0 : FERRY_READ | FERRY_WRITE, opts);
    if (rc) {
        close(fd);
        return rc;
    }
    if (pending) {
        /* Only an event can set the writable bit, and one comes when the
         * connection is made or has failed. */
        do {
            rc = ferry__ioreg_wait(&s->reg, self, &s->reg.wq, FERRY_WRITE, "connect", s);
        } while (rc == 0 && !(s->reg.ready & FERRY_WRITE));
        if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
            rc = -errno;
        else if (rc == 0 && err)
            rc = -err;
        if (rc == 0)
            rc = ferry__stream_to_ring(s);
        if (rc) {
            ferry__stream_destroy(s);
            return rc;
        }
    }
    *out = s;
    return 0;
}

/* The stream options of a connect, checked. */
static bool opts_ok(const ferry_stream_opts *opts)
{
    return !opts || !(opts->flags & ~FERRY_STREAM_NAGLE);
}

int ferry__connect_list(ferry_stream **out, ferry_task *self, const struct addrinfo *list,
                        const ferry_stream_opts *opts)
{
    const struct addrinfo *a;
    int64_t deadline = ferry__task_deadline(self);
    size_t left = 0;
    int rc = -EHOSTUNREACH;

    for (a = list; a; a = a->ai_next)
        left++;
    for (a = list; a; a = a->ai_next, left--) {
        ferry_scope attempt;
        int64_t now, share;

        if (deadline == FERRY_NEVER || left == 1) {
            rc = connect_addr(out, self, a->ai_addr, a->ai_addrlen, opts);
        } else {
            /* Go's rule: an equal share of the time left for each address
             * still to try, but at least the minimum. */
            now = ferry_now();
            share = (deadline - now) / (int64_t)left;
            if (share < ferry__connect_attempt_min)
                share = ferry__connect_attempt_min;
            ferry_scope_enter(&attempt, now + share, 0);
            rc = connect_addr(out, self, a->ai_addr, a->ai_addrlen, opts);
            ferry_scope_exit(&attempt);
        }
        if (rc == 0 || rc == -ECANCELED || rc == -ENOMEM || rc == -EMFILE || rc == -ENFILE)
            break;
        /* The caller's own deadline or cancellation ends the tries; an
         * attempt's share running out only moves on to the next address. */
        if (ferry__check_inline(self) != 0) {
            rc = ferry__check_inline(self);
            break;
        }
    }
    return rc;
}

int ferry_tcp_connect(ferry_stream **out, const char *host, int port, const ferry_stream_opts *opts)
{
    struct addrinfo hints, *ai;
    ferry_sim_host *sh;
    char serv[8];
    ferry_task *self;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!host || port < 1 || port > 65535 || !opts_ok(opts))
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    sh = ferry__sim_route(self->loop);
    if (sh)
        return ferry__sim_connect_name(sh, host, port, out);
    /* Names and numeric hosts alike go through the task's resolver (a
     * numeric host is answered at once, with no lookup); the caller's
     * deadline covers the lookup and the attempts after it. */
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(serv, sizeof serv, "%d", port);
    rc = ferry_getaddrinfo(host, serv, &hints, &ai);
    if (rc)
        return rc;
    rc = ferry__connect_list(out, self, ai, opts);
    ferry_freeaddrinfo(ai);
    return rc;
}

int ferry_unix_connect(ferry_stream **out, const char *path, const ferry_stream_opts *opts)
{
    struct sockaddr_un sa;
    ferry_task *self;
    socklen_t len;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!opts_ok(opts))
        return -EINVAL;
    rc = unix_addr(path, &sa, &len);
    if (rc)
        return rc;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    return connect_addr(out, self, (struct sockaddr *)&sa, len, opts);
}
