/* listen.c - a TCP port served by every loop of a runtime
 * (ferry_runtime_listen(), ferry/runtime.h): a listening socket per loop
 * (SO_REUSEPORT), or one acceptor that hands each connection to the less
 * loaded of two loops.
 * Thread: the listener's sockets are made and freed on any thread; each
 * loop's part (struct spread_loop) runs on that loop's thread only.
 *
 * A connection is a record (struct conn) from accept to close.  In
 * balanced mode the acceptor posts the record into the target loop's
 * inbox; there it is queued for that loop's serve task, which spawns its
 * task.  Every record is dropped exactly once (conn_drop(): its
 * descriptor closed unless its stream took it, its load given back):
 * by its task, or, when its task never ran, by the loop's serve task
 * once its group has ended; a record that reaches a loop which is not
 * serving, or is closing, is dropped on arrival; a record the inbox
 * refused is dropped by the acceptor.  What is queued when a loop's
 * serve task never ran is dropped by the serve call's last step, or by
 * the loop's close (a closer), whichever comes first.
 *
 * The listener is found by other threads (records in flight, the
 * closers): it carries a count of references.  The owner holds one,
 * each record one, each added closer one; whoever drops the last frees
 * it.
 */
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ferry/sync.h"

#include "clock.h"
#include "rand.h"
#include "runtime_int.h"

/* One loop's part of a listener.  Loop thread only, but for `l`. */
struct spread_loop {
    struct ferry_runtime_listener *l; /* set once */
    unsigned index;                   /* set once: the loop's index */
    bool open;                        /* handed connections are queued */
    struct ferry__link handed;        /* records waiting for the serve task */
    ferry_sem ready;                  /* a permit per record in `handed` */
    struct ferry__link live;          /* records given to a task of the group */
    struct ferry__closer closer;      /* added while open: drops `handed` at close */
    bool closer_added;                /* `closer` is on the inbox's list */
};

struct ferry_runtime_listener {
    /* Set once by ferry_runtime_listen(). */
    struct ferry_runtime *rt;
    int mode;                /* FERRY_SPREAD_* */
    unsigned flags;          /* FERRY_SPREAD_CPU */
    unsigned acceptor;       /* balanced: the accepting loop */
    ferry_stream_opts sopts; /* the connections' streams */
    int port;
    unsigned nfds;             /* n loops (reuseport) or 1 */
    int *fds;                  /* the listening sockets */
    struct spread_loop *loops; /* one per loop of rt */
    atomic_uint refs;          /* see the top of the file */
    atomic_bool serving;       /* a serve call runs */
    /* Set by a serve call before it reaches the loops (the calls' inbox
     * mutexes publish them). */
    ferry_conn_fn fn;
    void *arg;
    /* The acceptor's thread only (balanced mode). */
    uint64_t rng;  /* the random candidates */
    unsigned next; /* the round-robin candidate */
};

/* A connection from accept to close. */
struct conn {
    struct ferry__cnode node;         /* the hand-over to the target loop */
    struct ferry__link link;          /* in handed or live, target's thread */
    struct ferry_runtime_listener *l; /* a reference */
    unsigned index;                   /* the loop that serves it */
    int fd;                           /* until a stream owns it, else -1 */
};

static const ferry_task_opts conn_opts = { .name = "conn" };

/* ---- references ------------------------------------------------------------ */

static void listener_ref(struct ferry_runtime_listener *l)
{
    atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
}

static void listener_unref(struct ferry_runtime_listener *l)
{
    if (atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) != 1)
        return;
    ferry__free(l->loops);
    ferry__free(l->fds);
    ferry__free(l);
}

/* Close what is left of a connection and give its load back. */
static void conn_drop(struct conn *c)
{
    struct ferry_runtime_listener *l = c->l;

    if (c->fd >= 0)
        close(c->fd);
    ferry_runtime_load_add(l->rt, c->index, -1);
    ferry__free(c);
    listener_unref(l);
}

/* ---- a loop's part (its thread) ------------------------------------------- */

/* Drop the records of `list`. */
static void drop_all(struct ferry__link *list)
{
    struct ferry__link *n;

    while ((n = ferry__list_pop_front(list)) != NULL)
        conn_drop(ferry__container_of(n, struct conn, link));
}

/* Stop queueing hand-overs on this loop and drop what is queued. */
static void loop_shut(struct spread_loop *p)
{
    p->open = false;
    drop_all(&p->handed);
    if (p->closer_added) {
        p->closer_added = false;
        ferry__inbox_closer_del(&p->closer);
        listener_unref(p->l);
    }
}

/* The loop closes with the loop's part still open: its serve task never
 * ran, or the serve call could not reach it any more. */
static void loop_closer(struct ferry__closer *c)
{
    struct spread_loop *p = ferry__container_of(c, struct spread_loop, closer);

    p->closer_added = false;
    p->open = false;
    drop_all(&p->handed);
    listener_unref(p->l);
}

/* A call's callbacks on each loop: open its part before any acceptor
 * runs, shut it once every serve task has ended. */
static int loop_open_cb(void *arg, void **result)
{
    struct spread_loop *p = arg;
    struct ferry_inbox *ib = p->l->rt->slots[p->index]->ib;

    (void)result;
    ferry__list_init_linked(&p->handed);
    ferry__list_init_linked(&p->live);
    ferry_sem_init(&p->ready, 0, 0);
    p->closer.fn = loop_closer;
    listener_ref(p->l);
    ferry__inbox_closer_add(ib, &p->closer);
    p->closer_added = true;
    p->open = true;
    return 0;
}

static int loop_shut_cb(void *arg, void **result)
{
    (void)result;
    loop_shut(arg);
    return 0;
}

/* A record arrives on its loop. */
static void handed_run(struct ferry__cnode *n)
{
    struct conn *c = ferry__container_of(n, struct conn, node);
    struct spread_loop *p = &c->l->loops[c->index];

    if (!p->open || ferry__inbox_closing(c->l->rt->slots[c->index]->ib)) {
        conn_drop(c);
        return;
    }
    ferry__list_push_back(&p->handed, &c->link);
    ferry_sem_release(&p->ready);
}

/* The task of one connection. */
static int conn_task(void *arg)
{
    struct conn *c = arg;
    struct ferry_runtime_listener *l = c->l;
    ferry_stream *s;
    int one = 1, st;

    ferry__list_remove(&c->link);
    if (!(l->sopts.flags & FERRY_STREAM_NAGLE))
        (void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    st = ferry_stream_open(&s, NULL, c->fd, &l->sopts);
    if (st == 0) {
        c->fd = -1;
        st = l->fn(s, l->arg);
        ferry_stream_close(s);
    }
    conn_drop(c);
    return st;
}

/* Give a record of this loop its task, or drop it. */
static void conn_start(struct spread_loop *p, ferry_group *g, struct conn *c)
{
    ferry__list_push_back(&p->live, &c->link);
    if (ferry_group_spawn_ex(g, NULL, conn_task, c, &conn_opts, FERRY_GROUP_ISOLATE) != 0) {
        ferry__list_remove(&c->link);
        conn_drop(c);
    }
}

/* The loop for a new connection, counted in its load at once, so that
 * the next choice sees it.  Balanced: the less loaded of the round-robin
 * candidate (or the loop of the receiving CPU) and one drawn among the
 * others; the first on a tie. */
static unsigned pick(struct ferry_runtime_listener *l, int fd)
{
    unsigned n = l->rt->n, a, b;

    a = l->next++ % n;
    if (l->flags & FERRY_SPREAD_CPU) {
        int cpu = -1;
        socklen_t len = sizeof cpu;

        if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &len) == 0 && cpu >= 0)
            a = (unsigned)cpu % n;
    }
    if (n > 1) {
        b = ferry__rand_below(&l->rng, n - 1);
        if (b >= a)
            b++;
        if (ferry_runtime_load(l->rt, b) < ferry_runtime_load(l->rt, a))
            a = b;
    }
    ferry_runtime_load_add(l->rt, a, 1);
    return a;
}

/* A new connection accepted on loop `me`: serve it here, or hand it over. */
static void dispatch(struct ferry_runtime_listener *l, struct spread_loop *me, ferry_group *g,
                     int fd)
{
    struct conn *c = ferry__malloc(sizeof *c);
    unsigned to;

    if (!c) {
        close(fd); /* the peer sees the connection end */
        return;
    }
    if (l->mode == FERRY_SPREAD_BALANCED) {
        to = pick(l, fd);
    } else {
        to = me->index;
        ferry_runtime_load_add(l->rt, to, 1);
    }
    listener_ref(l);
    c->l = l;
    c->index = to;
    c->fd = fd;
    ferry__link_init(&c->link);
    if (to == me->index) {
        conn_start(me, g, c);
        return;
    }
    c->node.fn = handed_run;
    if (ferry__inbox_post_node(l->rt->slots[to]->ib, &c->node) != 0)
        conn_drop(c); /* that loop has closed */
}

/* Out of descriptors or memory: the queue stays, try again a little
 * later (without a timer if even that cannot be had).  Returns 0;
 * -ECANCELED, -ETIMEDOUT. */
static int retry_later(void)
{
    int rc = ferry_sleep(FERRY_MSEC(10));

    return rc == -ENOMEM ? ferry_yield() : rc;
}

/* Accept on `lfd` until interrupted.  Returns -ECANCELED, -ETIMEDOUT, or
 * an error of accept4(2) that trying again will not cure. */
static int accept_loop(struct ferry_runtime_listener *l, struct spread_loop *me, ferry_group *g,
                       int lfd)
{
    unsigned burst = 0;
    int fd, rc;

    for (;;) {
        fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            dispatch(l, me, g, fd);
            /* Let the connections just started run between bursts. */
            if (++burst % 64 == 0 && (rc = ferry_yield()) != 0)
                return rc;
            continue;
        }
        switch (errno) {
        case EAGAIN:
            rc = ferry_wait_fd(lfd, FERRY_READ, NULL);
            if (rc == -ENOMEM) /* the wait could not be registered */
                rc = retry_later();
            break;
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case EPERM:
            rc = 0;
            break;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
            rc = retry_later();
            break;
        default:
            return -errno;
        }
        if (rc)
            return rc;
    }
}

/* Take the records handed to this loop until interrupted. */
static int intake_loop(struct spread_loop *me, ferry_group *g)
{
    struct ferry__link *n;
    int rc;

    for (;;) {
        rc = ferry_sem_acquire(&me->ready);
        if (rc)
            return rc;
        n = ferry__list_pop_front(&me->handed);
        if (n)
            conn_start(me, g, ferry__container_of(n, struct conn, link));
    }
}

/* The serve task of one loop (through ferry_runtime_on_all()). */
static int serve_loop(void *arg)
{
    struct ferry_runtime_listener *l = arg;
    struct spread_loop *me = &l->loops[ferry_runtime_index(l->rt, NULL)];
    ferry_group g;
    int rc;

    rc = ferry_group_init(&g);
    if (rc)
        return rc;
    if (l->mode == FERRY_SPREAD_REUSEPORT)
        rc = accept_loop(l, me, &g, l->fds[me->index]);
    else if (me->index == l->acceptor)
        rc = accept_loop(l, me, &g, l->fds[0]);
    else
        rc = intake_loop(me, &g);
    ferry_group_cancel(&g);
    ferry_group_wait(&g);
    /* Records whose task was cancelled before it ran. */
    drop_all(&me->live);
    loop_shut(me);
    return rc;
}

/* ---- the listener (any thread) --------------------------------------------- */

/* The address to bind: a numeric host, or every address (IPv6 and IPv4
 * on one socket, *any6).  Returns 0; -EINVAL. */
static int addr_parse(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len,
                      bool *any6)
{
    struct sockaddr_in *a4 = (struct sockaddr_in *)(void *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)(void *)ss;

    memset(ss, 0, sizeof *ss);
    *any6 = false;
    if (!host) {
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = in6addr_any;
        a6->sin6_port = htons((uint16_t)port);
        *len = sizeof *a6;
        *any6 = true;
    } else if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *len = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *len = sizeof *a6;
    } else {
        return -EINVAL;
    }
    return 0;
}

/* A listening socket bound to ss (SO_REUSEPORT if `reuseport`).
 * Returns 0 and *out; the negated errno of the call that failed. */
static int sock_listen(const struct sockaddr_storage *ss, socklen_t len, bool any6, bool reuseport,
                       int backlog, int *out)
{
    int fd, one = 1, zero = 0, rc;

    fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) ||
        (any6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0) ||
        bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, backlog) != 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

/* Steer by the receiving CPU: socket (CPU mod n) of the reuseport group,
 * which holds the sockets in the order they began to listen.  A kernel
 * that refuses leaves the hash. */
static void attach_cpu_program(int fd, unsigned n)
{
    struct sock_filter code[] = {
        { BPF_LD | BPF_W | BPF_ABS, 0, 0, (uint32_t)(SKF_AD_OFF + SKF_AD_CPU) },
        { BPF_ALU | BPF_MOD | BPF_K, 0, 0, n },
        { BPF_RET | BPF_A, 0, 0, 0 },
    };
    struct sock_fprog prog;

    memset(&prog, 0, sizeof prog); /* the padding after `len` goes to the kernel too */
    prog.len = sizeof code / sizeof code[0];
    prog.filter = code;
    (void)setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog);
}

/* Make every socket of `l`.  Returns 0; as sock_listen(). */
static int sockets_make(struct ferry_runtime_listener *l, const char *host, int port, int backlog)
{
    struct sockaddr_storage ss;
    socklen_t len;
    bool any6, reuseport = l->mode == FERRY_SPREAD_REUSEPORT;
    unsigned i;
    int rc;

    rc = addr_parse(host, port, &ss, &len, &any6);
    if (rc)
        return rc;
    for (i = 0; i < l->nfds; i++) {
        rc = sock_listen(&ss, len, any6, reuseport, backlog, &l->fds[i]);
        if (rc == -EAFNOSUPPORT && any6 && i == 0) {
            /* No IPv6 here: every IPv4 address. */
            struct sockaddr_in *a4 = (struct sockaddr_in *)(void *)&ss;

            memset(&ss, 0, sizeof ss);
            a4->sin_family = AF_INET;
            a4->sin_addr.s_addr = htonl(INADDR_ANY);
            a4->sin_port = htons((uint16_t)port);
            len = sizeof *a4;
            any6 = false;
            rc = sock_listen(&ss, len, any6, reuseport, backlog, &l->fds[i]);
        }
        if (rc)
            goto err;
        if (i == 0) {
            /* The others bind the port the first one got. */
            struct sockaddr_storage got;
            socklen_t glen = sizeof got;

            if (getsockname(l->fds[0], (struct sockaddr *)&got, &glen) != 0) {
                rc = -errno;
                i++;
                goto err;
            }
            l->port =
                ntohs(got.ss_family == AF_INET ? ((struct sockaddr_in *)(void *)&got)->sin_port
                                               : ((struct sockaddr_in6 *)(void *)&got)->sin6_port);
            if (ss.ss_family == AF_INET)
                ((struct sockaddr_in *)(void *)&ss)->sin_port = htons((uint16_t)l->port);
            else
                ((struct sockaddr_in6 *)(void *)&ss)->sin6_port = htons((uint16_t)l->port);
        }
    }
    if (reuseport && (l->flags & FERRY_SPREAD_CPU))
        attach_cpu_program(l->fds[0], l->nfds);
    return 0;

err:
    while (i-- > 0)
        close(l->fds[i]);
    return rc;
}

int ferry_runtime_listen(ferry_runtime_listener **out, ferry_runtime *rt, const char *host,
                         int port, const ferry_runtime_listen_opts *opts)
{
    ferry_runtime_listen_opts o = { 0 };
    struct ferry_runtime_listener *l;
    unsigned i;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (opts)
        o = *opts;
    rt = ferry__rt_resolve(rt);
    if (!rt || port < 0 || port > 65535 || o.backlog < 0 ||
        (o.mode != FERRY_SPREAD_REUSEPORT && o.mode != FERRY_SPREAD_BALANCED) ||
        (o.flags & ~FERRY_SPREAD_CPU) || o.acceptor >= rt->n ||
        (o.stream.flags & ~FERRY_STREAM_NAGLE))
        return -EINVAL;
    l = ferry__calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->rt = rt;
    l->mode = o.mode;
    l->flags = o.flags;
    l->acceptor = o.acceptor;
    l->sopts = o.stream;
    l->nfds = o.mode == FERRY_SPREAD_REUSEPORT ? rt->n : 1;
    l->rng = o.seed ? o.seed : (uint64_t)ferry__now_real();
    l->fds = ferry__calloc(l->nfds, sizeof *l->fds);
    l->loops = ferry__calloc(rt->n, sizeof *l->loops);
    if (!l->fds || !l->loops) {
        rc = -ENOMEM;
        goto err;
    }
    for (i = 0; i < rt->n; i++) {
        l->loops[i].l = l;
        l->loops[i].index = i;
    }
    atomic_init(&l->refs, 1);
    atomic_init(&l->serving, false);
    rc = sockets_make(l, host, port, o.backlog ? o.backlog : SOMAXCONN);
    if (rc)
        goto err;
    *out = l;
    return 0;

err:
    ferry__free(l->loops);
    ferry__free(l->fds);
    ferry__free(l);
    return rc;
}

int ferry_runtime_listener_port(const ferry_runtime_listener *l)
{
    return l ? l->port : -EINVAL;
}

/* What the serve tasks' statuses say when none was interrupted by the
 * caller: the first real error, else the loops were stopping. */
static int serve_status(const int *st, unsigned n)
{
    unsigned i;

    for (i = 0; i < n; i++)
        if (st[i] && st[i] != -ECANCELED && st[i] != -ETIMEDOUT)
            return st[i];
    return -ESHUTDOWN;
}

int ferry_runtime_listener_serve(ferry_runtime_listener *l, ferry_conn_fn fn, void *arg)
{
    struct ferry_runtime *rt;
    ferry_scope shield;
    unsigned i, opened = 0;
    int rc, st, *sts;

    if (!l || !fn)
        return -EINVAL;
    rt = l->rt;
    if (!ferry_task_current() || ferry_runtime_index(rt, NULL) < 0)
        return -EPERM;
    if (atomic_exchange(&l->serving, true))
        return -EBUSY;
    sts = ferry__calloc(rt->n, sizeof *sts);
    if (!sts) {
        atomic_store(&l->serving, false);
        return -ENOMEM;
    }
    l->fn = fn;
    l->arg = arg;
    /* Every loop takes hand-overs before any acceptor runs. */
    for (rc = 0; !rc && opened < rt->n; opened++) {
        rc = ferry_runtime_call(rt, opened, loop_open_cb, &l->loops[opened], FERRY_CALL_CALLBACK,
                                &st, NULL);
        if (rc)
            break;
    }
    if (!rc) {
        rc = ferry_runtime_on_all(rt, serve_loop, l, sts);
        if (!rc)
            rc = serve_status(sts, rt->n);
    }
    /* Drop what was handed to loops whose serve task never ran; a loop
     * that cannot be reached any more does it at its close. */
    ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    for (i = 0; i < opened; i++)
        (void)ferry_runtime_call(rt, i, loop_shut_cb, &l->loops[i], FERRY_CALL_CALLBACK, &st, NULL);
    ferry_scope_exit(&shield);
    ferry__free(sts);
    atomic_store(&l->serving, false);
    return rc;
}

void ferry_runtime_listener_free(ferry_runtime_listener *l)
{
    unsigned i;

    if (!l)
        return;
    for (i = 0; i < l->nfds; i++)
        close(l->fds[i]);
    l->nfds = 0;
    listener_unref(l);
}
