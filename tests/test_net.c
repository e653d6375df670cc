/* test_net.c - listen, accept and connect (ferry/stream.h): TCP over IPv4
 * and IPv6 (skipped with a message where the machine has no ::1), Unix
 * sockets in the file system and the abstract namespace, port 0, the
 * options, an address list tried in turn within a deadline, accept out of
 * descriptors, closing a listener under a waiting task, bad input.
 *
 * Every wait that a broken implementation could leave hanging runs under
 * a deadline scope.  No cr_assert inside task bodies (see testutil.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "fakedns.h"
#include "testutil.h"
#include "stream_int.h"

/* FERRY_TEST_IO_LIBEVENT=1 (a second ctest run): listeners and streams
 * registered through libevent instead of the loop's epoll set. */
__attribute__((constructor)) static void io_path(void)
{
    if (getenv("FERRY_TEST_IO_LIBEVENT"))
        ferry__io_use_libevent = true;
}

#define T(name) Test(net, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

static struct {
    int             rc[16];
    size_t          n[16];
    char            buf[4][64];
    int             nodelay[4];
    struct sockaddr_storage peer;
    int             port;
} g;

static ferry_listener *L;

static ferry_scope g_scope;

static void bound(int64_t ms)
{
    ferry_scope_enter(&g_scope, ferry_now() + tu_ms(ms), 0);
}

static void unbound(void)
{
    ferry_scope_exit(&g_scope);
}

/* The lowest free descriptor, from a task, after a first lookup: the
 * resolver keeps its nameserver socket open for the loop's life. */
static int lowest_free_fd_after_a_lookup(void)
{
    struct addrinfo *ai = NULL;
    int fd;

    if (ferry_getaddrinfo("warm-up.test", "80", NULL, &ai) == 0)
        ferry_freeaddrinfo(ai);
    fd = dup(0);
    close(fd);
    return fd;
}

/* Point tu_loop's resolver at a fake nameserver, with no hosts file. */
static void use_fake(struct fakedns *dns)
{
    ferry_resolver_opts o = {
        .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = fakedns_addr(dns), .hosts = "",
        .timeout = tu_ms(5000), .attempts = 1,
    };

    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
}

static int nodelay_of(ferry_stream *s)
{
    int v = -1;
    socklen_t len = sizeof v;

    if (getsockopt(ferry_stream_fd(s), IPPROTO_TCP, TCP_NODELAY, &v, &len) != 0)
        return -errno;
    return v;
}

/* ---- a round trip through a listener ------------------------------------------- */

struct conn_case {
    const char *host;      /* where to connect (NULL: a Unix path) */
    const char *path;
    ferry_stream_opts copts;
};

static int server_task(void *arg)
{
    ferry_stream *s;
    size_t n;

    (void)arg;
    bound(5000);
    g.rc[0] = ferry_listener_accept(L, &s, &g.peer);
    if (g.rc[0] == 0) {
        g.nodelay[0] = nodelay_of(s);
        g.rc[1] = ferry_stream_read_until(s, "\n", 1, g.buf[0], sizeof g.buf[0], &n);
        g.rc[2] = ferry_stream_write(s, g.buf[0], n, NULL);
        ferry_stream_close(s);
    }
    unbound();
    return 0;
}

static int round_trip_main(void *arg)
{
    struct conn_case *c = arg;
    ferry_stream *s;
    ferry_task *srv;

    ferry_task_spawn(&srv, NULL, server_task, NULL, NULL);
    bound(5000);
    if (c->host)
        g.rc[3] = ferry_tcp_connect(&s, c->host, ferry_listener_port(L), &c->copts);
    else
        g.rc[3] = ferry_unix_connect(&s, c->path, &c->copts);
    if (g.rc[3] == 0) {
        g.nodelay[1] = c->host ? nodelay_of(s) : 0;
        g.rc[4] = ferry_stream_write(s, "ping\n", 5, NULL);
        g.rc[5] = ferry_stream_read_until(s, "\n", 1, g.buf[1], sizeof g.buf[1], &g.n[5]);
        g.rc[6] = ferry_stream_read(s, g.buf[2], sizeof g.buf[2], &g.n[6]);   /* the end */
        ferry_stream_close(s);
    }
    unbound();
    ferry_task_join(srv, NULL);
    return 0;
}

static void round_trip(struct conn_case *c)
{
    memset(&g, 0, sizeof g);
    cr_assert_eq(tu_run(round_trip_main, c), 0);
    cr_assert_eq(g.rc[3], 0, "connect: %d", g.rc[3]);
    cr_assert_eq(g.rc[0], 0, "accept: %d", g.rc[0]);
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.rc[4], 0);
    cr_assert_eq(g.rc[5], 0, "the echo: %d", g.rc[5]);
    cr_assert_eq(g.n[5], 5);
    cr_assert_eq(memcmp(g.buf[1], "ping\n", 5), 0);
    cr_assert_eq(g.rc[6], 0);
    cr_assert_eq(g.n[6], 0, "the server closed: end of stream");
}

T(tcp_ipv4_on_port_0_round_trip_with_nodelay_by_default)
{
    struct sockaddr_in *in = (struct sockaddr_in *)&g.peer;

    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    cr_assert_gt(ferry_listener_port(L), 0, "the port picked for 0 is read back");
    round_trip(&(struct conn_case){ .host = "127.0.0.1" });
    cr_assert_eq(g.peer.ss_family, AF_INET);
    cr_assert_eq(in->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    cr_assert_eq(g.nodelay[0], 1, "accepted stream: TCP_NODELAY %d", g.nodelay[0]);
    cr_assert_eq(g.nodelay[1], 1, "connected stream: TCP_NODELAY %d", g.nodelay[1]);
    cr_assert_eq(ferry_listener_close(L), 0);
}

T(nagle_keeps_tcp_nodelay_off)
{
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0,
                                  &(ferry_listen_opts){ .stream.flags = FERRY_STREAM_NAGLE }), 0);
    round_trip(&(struct conn_case){ .host = "127.0.0.1", .copts.flags = FERRY_STREAM_NAGLE });
    cr_assert_eq(g.nodelay[0], 0);
    cr_assert_eq(g.nodelay[1], 0);
    ferry_listener_close(L);
}

static bool have_ipv6_loopback(void)
{
    struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;

    if (fd >= 0)
        close(fd);
    return ok;
}

T(tcp_ipv6_round_trip)
{
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&g.peer;

    if (!have_ipv6_loopback())
        cr_skip_test("this machine has no IPv6 loopback (::1): IPv6 not tested");
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "::1", 0, NULL), 0);
    round_trip(&(struct conn_case){ .host = "::1" });
    cr_assert_eq(g.peer.ss_family, AF_INET6);
    cr_assert(IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr));
    ferry_listener_close(L);
}

/* host NULL: every address, IPv4 and (where there is IPv6) IPv6. */
T(a_listener_on_every_address_takes_ipv4_and_ipv6)
{
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, NULL, 0, NULL), 0);
    round_trip(&(struct conn_case){ .host = "127.0.0.1" });
    if (have_ipv6_loopback())
        round_trip(&(struct conn_case){ .host = "::1" });
    else
        fprintf(stderr, "net: no IPv6 loopback: the any-address listener tested over IPv4 only\n");
    ferry_listener_close(L);
}

T(unix_socket_file_round_trip_and_the_file_goes_with_the_listener)
{
    char dir[] = "/tmp/ferry-net-XXXXXX", path[128];
    struct stat st;

    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/sock", dir);
    cr_assert_eq(ferry_unix_listen(&L, tu_loop, path, NULL), 0);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert(S_ISSOCK(st.st_mode));
    cr_assert_eq(ferry_listener_port(L), -EAFNOSUPPORT);
    round_trip(&(struct conn_case){ .path = path });
    cr_assert_eq(g.peer.ss_family, AF_UNIX);
    {
        ferry_listener *l2;
        cr_assert_eq(ferry_unix_listen(&l2, tu_loop, path, NULL), -EADDRINUSE,
                     "an existing file is not replaced");
    }
    cr_assert_eq(ferry_listener_close(L), 0);
    cr_assert_eq(stat(path, &st), -1, "the socket file was removed");
    rmdir(dir);
}

T(unix_abstract_round_trip)
{
    char name[64];

    snprintf(name, sizeof name, "@ferry-test-%d", (int)getpid());
    cr_assert_eq(ferry_unix_listen(&L, tu_loop, name, NULL), 0);
    round_trip(&(struct conn_case){ .path = name });
    ferry_listener_close(L);
}

/* ---- connect failures ----------------------------------------------------------- */

static int refused_main(void *arg)
{
    ferry_stream *s = (ferry_stream *)1;
    int port = *(int *)arg;

    g.rc[10] = lowest_free_fd_after_a_lookup();
    bound(5000);
    g.rc[0] = ferry_tcp_connect(&s, "127.0.0.1", port, NULL);
    g.n[0] = s == NULL;
    g.rc[1] = ferry_tcp_connect(&s, "no-such-host.test", port, NULL);
    g.rc[2] = ferry_unix_connect(&s, "/nonexistent/ferry/socket", NULL);
    g.rc[3] = ferry_tcp_connect(&s, "127.0.0.1", 0, NULL);
    g.rc[4] = ferry_tcp_connect(&s, NULL, port, NULL);
    g.rc[5] = ferry_tcp_connect(NULL, "127.0.0.1", port, NULL);
    g.rc[6] = ferry_tcp_connect(&s, "127.0.0.1", 65536, NULL);
    g.rc[7] = ferry_tcp_connect(&s, "127.0.0.1", port, &(ferry_stream_opts){ .flags = 0x80 });
    g.rc[8] = ferry_unix_connect(&s, "", NULL);
    unbound();
    g.rc[11] = dup(0);
    close(g.rc[11]);
    return 0;
}

T(connect_errors)
{
    int port, fds_before, fds_after;

    struct fakedns *dns = fakedns_start();

    memset(&g, 0, sizeof g);
    use_fake(dns);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    port = ferry_listener_port(L);
    ferry_listener_close(L);      /* nobody listens there now */
    cr_assert_eq(tu_run(refused_main, &port), 0);
    fds_before = g.rc[10];
    fds_after = g.rc[11];
    cr_assert_eq(g.rc[0], -ECONNREFUSED, "%d", g.rc[0]);
    cr_assert_eq(g.n[0], 1, "*out NULL after an error");
    cr_assert_eq(g.rc[1], FERRY_EAI_NONAME, "an unknown name: %d", g.rc[1]);
    cr_assert_eq(g.rc[2], -ENOENT, "%d", g.rc[2]);
    for (int i = 3; i <= 8; i++)
        cr_assert_eq(g.rc[i], -EINVAL, "call %d: %d", i, g.rc[i]);
    cr_assert_eq(fds_after, fds_before, "nothing left open");
    cr_assert_eq(ferry_tcp_connect(&(ferry_stream *){ NULL }, "127.0.0.1", port, NULL), -EPERM,
                 "outside a task");
    fakedns_stop(dns);
}

/* ---- connect by host name --------------------------------------------------------- */

static int by_name_main(void *arg)
{
    ferry_stream *c = NULL, *a = NULL;
    struct sockaddr_in peer;
    socklen_t pl = sizeof peer;
    char buf[8];

    (void)arg;
    g.rc[10] = lowest_free_fd_after_a_lookup();
    bound(10000);
    g.rc[0] = ferry_tcp_connect(&c, "multi.test", g.port, NULL);
    if (g.rc[0] == 0) {
        g.rc[1] = ferry_listener_accept(L, &a, NULL);
        if (getpeername(ferry_stream_fd(c), (struct sockaddr *)&peer, &pl) == 0)
            inet_ntop(AF_INET, &peer.sin_addr, g.buf[0], sizeof g.buf[0]);
        if (g.rc[1] == 0) {
            g.rc[2] = ferry_stream_write(c, "ping", 4, NULL);
            g.rc[3] = ferry_stream_read_exactly(a, buf, 4, &g.n[0]);
            ferry_stream_close(a);
        }
        ferry_stream_close(c);
    }
    unbound();
    g.rc[11] = dup(0);
    close(g.rc[11]);
    return 0;
}

/* A name with two addresses, the first refusing (nothing listens on
 * 127.0.0.2 at that port): the second is tried and connects. */
T(connect_by_name_tries_each_address_in_turn)
{
    struct fakedns *dns = fakedns_start();
    int before, after;

    memset(&g, 0, sizeof g);
    use_fake(dns);
    fakedns_add(dns, "multi.test", "127.0.0.2");
    fakedns_add(dns, "multi.test", "127.0.0.1");
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    g.port = ferry_listener_port(L);
    cr_assert_eq(tu_run(by_name_main, NULL), 0);
    before = g.rc[10];
    after = g.rc[11];
    ferry_listener_close(L);
    cr_assert_eq(g.rc[0], 0, "connect by name: %d (%s)", g.rc[0], ferry_gai_strerror(g.rc[0]));
    cr_assert_eq(g.rc[1], 0);
    cr_assert_str_eq(g.buf[0], "127.0.0.1", "connected to %s", g.buf[0]);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.rc[3], 0);
    cr_assert_eq(g.n[0], 4);
    cr_assert_geq(fakedns_queries(dns), 1, "the name was asked of the nameserver");
    cr_assert_eq(after, before, "nothing left open");
    fakedns_stop(dns);
}

static int held_name_main(void *arg)
{
    ferry_stream *c = (ferry_stream *)1;

    (void)arg;
    g.rc[10] = lowest_free_fd_after_a_lookup();
    bound(100);
    g.rc[0] = ferry_tcp_connect(&c, "held.test", 80, NULL);
    g.n[0] = c == NULL;
    g.rc[1] = ferry_scope_exit(&g_scope);
    g.rc[11] = dup(0);
    close(g.rc[11]);
    return 0;
}

/* The caller's deadline covers the lookup: a nameserver that does not
 * answer ends the connect with -ETIMEDOUT, nothing left open. */
T(connect_by_name_ends_at_the_callers_deadline_during_the_lookup)
{
    struct fakedns *dns = fakedns_start();
    int before, after;

    memset(&g, 0, sizeof g);
    use_fake(dns);
    fakedns_add(dns, "held.test", "127.0.0.1");
    fakedns_rule(dns, "held.test", FAKEDNS_ANY, FAKEDNS_HOLD);
    cr_assert_eq(tu_run(held_name_main, NULL), 0);
    before = g.rc[10];
    after = g.rc[11];
    cr_assert_eq(g.rc[0], -ETIMEDOUT, "%d", g.rc[0]);
    cr_assert_eq(g.rc[1], -ETIMEDOUT, "the caller's scope fired");
    cr_assert_eq(g.n[0], 1, "*out NULL after an error");
    cr_assert_geq(fakedns_held(dns), 1, "the lookup reached the nameserver");
    cr_assert_eq(after, before, "nothing left open");
    fakedns_stop(dns);
}

/* A listener whose queue is full drops SYNs: a connect to it hangs. */
static int hanging_listener(struct sockaddr_in *a)
{
    socklen_t al = sizeof *a;
    int l = socket(AF_INET, SOCK_STREAM, 0), c;

    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(l, (struct sockaddr *)a, sizeof *a), 0);
    cr_assert_eq(listen(l, 0), 0);
    cr_assert_eq(getsockname(l, (struct sockaddr *)a, &al), 0);
    /* Fill the queue (Linux takes backlog + 1). */
    for (int i = 0; i < 2; i++) {
        c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        connect(c, (struct sockaddr *)a, sizeof *a);
        g.rc[14 + i] = c;
    }
    usleep(50000);
    return l;
}

static struct addrinfo g_ai[3];
static struct sockaddr_in g_sa[3];

static void ai_list(int n)
{
    for (int i = 0; i < n; i++) {
        memset(&g_ai[i], 0, sizeof g_ai[i]);
        g_ai[i].ai_family = AF_INET;
        g_ai[i].ai_socktype = SOCK_STREAM;
        g_ai[i].ai_addr = (struct sockaddr *)&g_sa[i];
        g_ai[i].ai_addrlen = sizeof g_sa[i];
        g_ai[i].ai_next = i + 1 < n ? &g_ai[i + 1] : NULL;
    }
}

static int list_main(void *arg)
{
    ferry_stream *s = NULL;
    ferry_task *srv;
    int64_t t0;

    (void)arg;
    ferry_task_spawn(&srv, NULL, server_task, NULL, NULL);
    t0 = ferry_now();
    ferry_scope_enter(&g_scope, t0 + tu_ms(600), 0);
    g.rc[3] = ferry__connect_list(&s, ferry_task_current(), g_ai, NULL);
    ferry_scope_exit(&g_scope);
    g.n[3] = (size_t)((ferry_now() - t0) / 1000000);
    if (g.rc[3] == 0) {
        bound(5000);
        g.rc[4] = ferry_stream_write(s, "ping\n", 5, NULL);
        g.rc[5] = ferry_stream_read_until(s, "\n", 1, g.buf[1], sizeof g.buf[1], &g.n[5]);
        unbound();
        ferry_stream_close(s);
    } else {
        ferry_task_cancel(srv);
    }
    ferry_task_join(srv, NULL);
    return 0;
}

/* Three addresses: one that refuses, one that never answers, then the
 * listener.  Within a 600 ms deadline the silent one gets its share (half
 * of the time left when it starts), so the third is still reached. */
T(connect_tries_each_address_in_turn_within_the_deadline)
{
    int hang;

    memset(&g, 0, sizeof g);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    ai_list(3);
    /* 1: a closed port. */
    {
        ferry_listener *tmp;
        cr_assert_eq(ferry_tcp_listen(&tmp, tu_loop, "127.0.0.1", 0, NULL), 0);
        g_sa[0] = (struct sockaddr_in){ .sin_family = AF_INET,
                                        .sin_port = htons((uint16_t)ferry_listener_port(tmp)),
                                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        ferry_listener_close(tmp);
    }
    /* 2: a listener that drops SYNs. */
    hang = hanging_listener(&g_sa[1]);
    /* 3: the real one. */
    g_sa[2] = (struct sockaddr_in){ .sin_family = AF_INET,
                                    .sin_port = htons((uint16_t)ferry_listener_port(L)),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ferry__connect_attempt_min = FERRY_MSEC(100);
    cr_assert_eq(tu_run(list_main, NULL), 0);
    ferry__connect_attempt_min = FERRY_SEC(2);
    cr_assert_eq(g.rc[3], 0, "connect over the list: %d after %zu ms", g.rc[3], g.n[3]);
    cr_assert_eq(g.rc[0], 0, "the listener accepted: %d", g.rc[0]);
    cr_assert_eq(g.rc[5], 0);
    cr_assert_eq(memcmp(g.buf[1], "ping\n", 5), 0);
    close(g.rc[14]);
    close(g.rc[15]);
    close(hang);
    ferry_listener_close(L);
}

static int deadline_main(void *arg)
{
    ferry_stream *s = NULL;

    (void)arg;
    ferry_scope_enter(&g_scope, ferry_now() + tu_ms(200), 0);
    g.rc[0] = ferry__connect_list(&s, ferry_task_current(), g_ai, NULL);
    g.rc[1] = ferry_scope_exit(&g_scope);
    g.n[0] = s == NULL;
    return 0;
}

/* The caller's deadline ends the tries: -ETIMEDOUT, nothing left open. */
T(connect_to_an_address_that_never_answers_ends_at_the_callers_deadline)
{
    int hang, before, after;

    memset(&g, 0, sizeof g);
    ai_list(2);
    hang = hanging_listener(&g_sa[0]);
    g_sa[1] = g_sa[0];
    before = dup(0);
    close(before);
    cr_assert_eq(tu_run(deadline_main, NULL), 0);
    after = dup(0);
    close(after);
    cr_assert_eq(g.rc[0], -ETIMEDOUT, "%d", g.rc[0]);
    cr_assert_eq(g.rc[1], -ETIMEDOUT, "the caller's scope fired");
    cr_assert_eq(g.n[0], 1);
    cr_assert_eq(after, before, "nothing left open");
    close(g.rc[14]);
    close(g.rc[15]);
    close(hang);
}

static int cancel_connect_task(void *arg)
{
    ferry_stream *s = NULL;

    (void)arg;
    g.rc[0] = ferry__connect_list(&s, ferry_task_current(), g_ai, NULL);
    return 0;
}

static int cancel_connect_main(void *arg)
{
    ferry_task *t;

    (void)arg;
    ferry_task_spawn(&t, NULL, cancel_connect_task, NULL, NULL);
    ferry_sleep(tu_ms(30));
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    return 0;
}

T(a_cancelled_connect_leaves_nothing_open)
{
    int hang, before, after;

    memset(&g, 0, sizeof g);
    ai_list(1);
    hang = hanging_listener(&g_sa[0]);
    before = dup(0);
    close(before);
    cr_assert_eq(tu_run(cancel_connect_main, NULL), 0);
    after = dup(0);
    close(after);
    cr_assert_eq(g.rc[0], -ECANCELED);
    cr_assert_eq(after, before);
    close(g.rc[14]);
    close(g.rc[15]);
    close(hang);
}

/* ---- accept ---------------------------------------------------------------------- */

static int accept_deadline_main(void *arg)
{
    ferry_stream *s = (ferry_stream *)1;
    ferry_task *srv;

    (void)arg;
    ferry_scope_enter(&g_scope, ferry_now() + tu_ms(30), 0);
    g.rc[10] = ferry_listener_accept(L, &s, NULL);
    ferry_scope_exit(&g_scope);
    g.n[10] = s == NULL;
    /* The listener still works. */
    ferry_task_spawn(&srv, NULL, server_task, NULL, NULL);
    bound(5000);
    g.rc[3] = ferry_tcp_connect(&s, "127.0.0.1", ferry_listener_port(L), NULL);
    if (g.rc[3] == 0) {
        g.rc[4] = ferry_stream_write(s, "ping\n", 5, NULL);
        g.rc[5] = ferry_stream_read_until(s, "\n", 1, g.buf[1], sizeof g.buf[1], &g.n[5]);
        ferry_stream_close(s);
    }
    unbound();
    ferry_task_join(srv, NULL);
    return 0;
}

T(an_accept_cut_by_a_deadline_takes_nothing)
{
    memset(&g, 0, sizeof g);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    cr_assert_eq(tu_run(accept_deadline_main, NULL), 0);
    cr_assert_eq(g.rc[10], -ETIMEDOUT);
    cr_assert_eq(g.n[10], 1);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(g.rc[5], 0);
    ferry_listener_close(L);
}

static int acceptor(void *arg)
{
    ferry_stream *s;
    int i = (int)(intptr_t)arg;

    bound(5000);
    g.rc[i] = ferry_listener_accept(L, &s, NULL);
    unbound();
    if (g.rc[i] == 0)
        ferry_stream_close(s);
    return 0;
}

static int many_acceptors_main(void *arg)
{
    ferry_task *t[3];
    ferry_stream *c[3];

    (void)arg;
    for (int i = 0; i < 3; i++)
        ferry_task_spawn(&t[i], NULL, acceptor, (void *)(intptr_t)i, NULL);
    ferry_yield();
    bound(5000);
    for (int i = 0; i < 3; i++)
        g.rc[4 + i] = ferry_tcp_connect(&c[i], "127.0.0.1", ferry_listener_port(L), NULL);
    unbound();
    for (int i = 0; i < 3; i++) {
        ferry_task_join(t[i], NULL);
        if (g.rc[4 + i] == 0)
            ferry_stream_close(c[i]);
    }
    return 0;
}

T(several_tasks_accept_on_one_listener)
{
    memset(&g, 0, sizeof g);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    cr_assert_eq(tu_run(many_acceptors_main, NULL), 0);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(g.rc[4 + i], 0, "connect %d: %d", i, g.rc[4 + i]);
        cr_assert_eq(g.rc[i], 0, "acceptor %d: %d", i, g.rc[i]);
    }
    ferry_listener_close(L);
}

static int close_under_accept_task(void *arg)
{
    ferry_stream *s;

    (void)arg;
    g.rc[0] = ferry_listener_accept(L, &s, NULL);
    return 0;
}

static ferry_stream *g_closed_out = (ferry_stream *)1;

static int close_under_accept_main(void *arg)
{
    ferry_task *t;
    ferry_listener *old = L;

    (void)arg;
    ferry_task_spawn(&t, NULL, close_under_accept_task, NULL, NULL);
    ferry_yield();
    g.rc[1] = ferry_listener_close(L);
    g.rc[2] = ferry_listener_close(old);
    g.rc[3] = ferry_listener_port(old);
    g.rc[4] = ferry_listener_fd(old);
    g.rc[5] = ferry_listener_accept(old, &g_closed_out, NULL);
    ferry_task_join(t, NULL);
    return 0;
}

T(closing_a_listener_wakes_its_acceptor_with_ebadf)
{
    memset(&g, 0, sizeof g);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    cr_assert_eq(tu_run(close_under_accept_main, NULL), 0);
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.rc[0], -EBADF, "%d", g.rc[0]);
    cr_assert_eq(g.rc[2], -EBADF);
    cr_assert_eq(g.rc[3], -EBADF);
    cr_assert_eq(g.rc[4], -EBADF);
    /* An accept while the woken acceptor has not left yet. */
    cr_assert_eq(g.rc[5], -EBADF);
    cr_assert_null(g_closed_out);
}

/* The lowest descriptor number not in use. */
static int lowest_free(void)
{
    int fd = dup(0);
    close(fd);
    return fd;
}

static int emfile_main(void *arg)
{
    ferry_stream *s = NULL;
    struct rlimit *old = arg, low;
    int64_t t0;

    /* No descriptor left: every number below the limit is taken. */
    low = *old;
    low.rlim_cur = (rlim_t)lowest_free();
    setrlimit(RLIMIT_NOFILE, &low);
    bound(5000);
    g.rc[0] = ferry_listener_accept(L, &s, NULL);
    unbound();
    /* The queue was emptied: the next accept waits, it does not spin on
     * EMFILE. */
    t0 = ferry_now();
    ferry_scope_enter(&g_scope, ferry_now() + tu_ms(50), 0);
    g.rc[1] = ferry_listener_accept(L, &s, NULL);
    ferry_scope_exit(&g_scope);
    g.n[1] = (size_t)(ferry_now() - t0);
    setrlimit(RLIMIT_NOFILE, old);
    return 0;
}

T(accept_out_of_descriptors_drops_the_queue_and_does_not_spin)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    struct rlimit old;
    ferry_loop_stats st0, st1;
    int c[3];
    char b;

    /* valgrind keeps the descriptor limit to itself (the kernel never sees
     * the test's setrlimit), and io_uring's accepts take descriptors in the
     * kernel, past valgrind's checks: there the limit cannot be hit. */
    if (getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "vgpreload") &&
        getenv("FERRY_IO") && strcmp(getenv("FERRY_IO"), "uring") == 0)
        cr_skip_test("under valgrind, io_uring's accepts do not see the test's descriptor limit");
    memset(&g, 0, sizeof g);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    a.sin_port = htons((uint16_t)ferry_listener_port(L));
    for (int i = 0; i < 3; i++) {
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_eq(connect(c[i], (struct sockaddr *)&a, sizeof a), 0);
    }
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    ferry_loop_stats_get(tu_loop, &st0);
    cr_assert_eq(tu_run(emfile_main, &old), 0);
    ferry_loop_stats_get(tu_loop, &st1);
    cr_assert_eq(g.rc[0], -EMFILE, "accept out of descriptors: %d", g.rc[0]);
    cr_assert_eq(g.rc[1], -ETIMEDOUT, "the next accept: %d", g.rc[1]);
    cr_assert_lt(st1.polls - st0.polls, 100, "the loop polled %llu times: it spun",
                 (unsigned long long)(st1.polls - st0.polls));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(recv(c[i], &b, 1, 0), 0, "queued connection %d was accepted and closed", i);
        close(c[i]);
    }
    /* With descriptors again, the listener works (the reserve is back). */
    round_trip(&(struct conn_case){ .host = "127.0.0.1" });
    ferry_listener_close(L);
}

/* ---- listen: options and bad input -------------------------------------------------- */

static void *listen_from_thread(void *arg)
{
    ferry_listener *l;
    *(int *)arg = ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL);
    return NULL;
}

T(listen_errors)
{
    ferry_listener *l = (ferry_listener *)1, *l2;
    char longpath[200];
    int port, rc = 0;
    pthread_t th;

    cr_assert_eq(ferry_tcp_listen(NULL, tu_loop, "127.0.0.1", 0, NULL), -EINVAL);
    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", -1, NULL), -EINVAL);
    cr_assert_null(l);
    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 65536, NULL), -EINVAL);
    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "not-an-address", 0, NULL), -EINVAL);
    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0, &(ferry_listen_opts){ .flags = 0x40 }),
                 -EINVAL);
    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0, &(ferry_listen_opts){ .backlog = -1 }),
                 -EINVAL);
    cr_assert_eq(ferry_unix_listen(NULL, tu_loop, "@x", NULL), -EINVAL);
    cr_assert_eq(ferry_unix_listen(&l, tu_loop, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_unix_connect(NULL, "@x", NULL), -EINVAL);
    cr_assert_eq(ferry_unix_connect(&(ferry_stream *){ NULL }, "@x",
                                    &(ferry_stream_opts){ .flags = 0x40 }), -EINVAL);
    cr_assert_eq(ferry_unix_connect(&(ferry_stream *){ NULL }, "@x", NULL), -EPERM,
                 "unix connect outside a task");
    cr_assert_eq(ferry_unix_listen(&l, tu_loop, "", NULL), -EINVAL);
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = 0;
    cr_assert_eq(ferry_unix_listen(&l, tu_loop, longpath, NULL), -EINVAL);
    cr_assert_eq(ferry_unix_listen(&l, tu_loop, "@x",
                                   &(ferry_listen_opts){ .flags = FERRY_LISTEN_REUSEPORT }), -EINVAL);
    cr_assert_eq(ferry_listener_accept(NULL, &(ferry_stream *){ NULL }, NULL), -EINVAL);
    cr_assert_eq(ferry_listener_close(NULL), -EINVAL);
    cr_assert_eq(ferry_listener_port(NULL), -EINVAL);
    cr_assert_eq(ferry_listener_fd(NULL), -EINVAL);
    th = tu_start_thread(listen_from_thread, &rc);
    pthread_join(th, NULL);
    cr_assert_eq(rc, -EINVAL);

    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0, NULL), 0);
    port = ferry_listener_port(l);
    cr_assert_eq(ferry_listener_accept(l, &(ferry_stream *){ NULL }, NULL), -EPERM,
                 "outside a task");
    cr_assert_eq(ferry_tcp_listen(&l2, tu_loop, "127.0.0.1", port, NULL), -EADDRINUSE);
    ferry_listener_close(l);
    /* SO_REUSEPORT: two listeners share a port. */
    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0,
                                  &(ferry_listen_opts){ .flags = FERRY_LISTEN_REUSEPORT }), 0);
    port = ferry_listener_port(l);
    cr_assert_eq(ferry_tcp_listen(&l2, tu_loop, "127.0.0.1", port,
                                  &(ferry_listen_opts){ .flags = FERRY_LISTEN_REUSEPORT }), 0);
    ferry_listener_close(l2);
    ferry_listener_close(l);
}

T(listen_sets_reuseaddr_unless_told_not_to)
{
    ferry_listener *l;
    int v = -1;
    socklen_t len = sizeof v;

    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0, NULL), 0);
    cr_assert_eq(getsockopt(ferry_listener_fd(l), SOL_SOCKET, SO_REUSEADDR, &v, &len), 0);
    cr_assert_eq(v, 1);
    ferry_listener_close(l);
    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0,
                                  &(ferry_listen_opts){ .flags = FERRY_LISTEN_NO_REUSEADDR }), 0);
    cr_assert_eq(getsockopt(ferry_listener_fd(l), SOL_SOCKET, SO_REUSEADDR, &v, &len), 0);
    cr_assert_eq(v, 0);
    ferry_listener_close(l);
}

static int foreign_accept_task(void *arg)
{
    ferry_stream *s;
    *(int *)arg = ferry_listener_accept(L, &s, NULL);
    ((int *)arg)[1] = ferry_listener_close(L);
    return 0;
}

static void *foreign_accept_thread(void *arg)
{
    ferry_loop *loop2;

    if (ferry_loop_new(&loop2, NULL) != 0)
        return NULL;
    ferry_task_spawn(NULL, loop2, foreign_accept_task, arg, NULL);
    ferry_loop_run(loop2, FERRY_RUN_DEFAULT);
    ferry_loop_free(loop2);
    return NULL;
}

T(a_listener_used_from_another_loop_is_eperm)
{
    int r[2] = { 1, 1 };
    pthread_t th;

    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    th = tu_start_thread(foreign_accept_thread, r);
    pthread_join(th, NULL);
    cr_assert_eq(r[0], -EPERM);
    cr_assert_eq(r[1], -EPERM);
    cr_assert_eq(ferry_listener_close(L), 0);
}

/* ferry_loop_free() closes the listeners left open (the teardown checks
 * that nothing leaked). */
T(freeing_the_loop_closes_listeners_left_open)
{
    int fd;

    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    fd = ferry_listener_fd(L);
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    cr_assert_eq(fcntl(fd, F_GETFD), -1);
}

/* ---- a unix listener without a loop, cancelled accept and connects ---------- */

static void *unix_listen_from_thread(void *arg)
{
    ferry_listener *l;

    *(int *)arg = ferry_unix_listen(&l, NULL, "@ferry-test-no-loop", NULL);
    return NULL;
}

static int cancelled_calls_task(void *arg)
{
    ferry_listener *l = arg;
    ferry_stream *s = (ferry_stream *)1, *c = (ferry_stream *)1, *u = (ferry_stream *)1;

    ferry_task_cancel(ferry_task_current());
    /* Cancellation points that had nothing to wait for yet: nothing
     * accepted, nothing connected, *out NULL. */
    return (ferry_listener_accept(l, &s, NULL) == -ECANCELED && s == NULL) |
           (ferry_tcp_connect(&c, "127.0.0.1", ferry_listener_port(l), NULL) == -ECANCELED &&
            c == NULL) << 1 |
           (ferry_unix_connect(&u, "@ferry-test-nobody", NULL) == -ECANCELED && u == NULL) << 2;
}

T(a_unix_listen_without_a_loop_is_eperm_and_cancelled_tasks_accept_and_connect_nothing)
{
    ferry_listener *l = (ferry_listener *)1;
    int rc = 0;
    pthread_t th;

    cr_assert_eq(ferry_unix_listen(&l, tu_loop, "@ferry-test-backlog",
                                   &(ferry_listen_opts){ .backlog = -1 }), -EINVAL);
    cr_assert_null(l);
    th = tu_start_thread(unix_listen_from_thread, &rc);
    pthread_join(th, NULL);
    cr_assert_eq(rc, -EINVAL);

    cr_assert_eq(ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0, NULL), 0);
    cr_assert_eq(tu_run(cancelled_calls_task, l), 7);
    /* The cancelled connect made no connection: the queue is empty. */
    cr_assert_eq(accept4(ferry_listener_fd(l), NULL, NULL, SOCK_NONBLOCK), -1);
    cr_assert_eq(errno, EAGAIN);
    cr_assert_eq(ferry_listener_close(l), 0);
}
