/* test_dns.c - name resolution for tasks (ferry/resolve.h): numeric hosts and
 * the hosts file answered without waiting, DNS through a fake server on
 * loopback (tests/fakedns.c: no test needs the network), the resolver's
 * error codes, deadlines and cancellation with the late answer dropped,
 * many lookups at once, a loop freed with lookups in flight, and
 * getaddrinfo(3) on the pool (forced, and as the fallback).
 *
 * Every lookup that a broken resolver could leave hanging runs under a
 * deadline scope, so the test reports -ETIMEDOUT instead of hitting the
 * runner's timeout.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fakedns.h"
#include "bridge_int.h"
#include "dns_int.h"

#define T(name) Test(dns, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 60.)

/* ---- helpers --------------------------------------------------------------- */

/* One lookup, run in a task. */
struct lk {
    const char      *host;
    const char      *service;
    struct addrinfo  hints;
    bool             no_hints;    /* pass NULL hints */
    int64_t          ms;          /* deadline (scaled); 0: 10 s */
    int              rc;
    struct addrinfo *res;
    uint64_t         polls;       /* polls of the loop during the call */
    int              held_at_return;
    int              queries_at_return;
    struct fakedns  *dns;         /* for the two above */
};

static int lookup_task(void *arg)
{
    struct lk *l = arg;
    ferry_loop_stats a, b;
    ferry_scope s;

    ferry_loop_stats_get(ferry_loop_current(), &a);
    ferry_scope_enter(&s, ferry_now() + tu_ms(l->ms ? l->ms : 10000), 0);
    l->rc = ferry_getaddrinfo(l->host, l->service, l->no_hints ? NULL : &l->hints, &l->res);
    ferry_scope_exit(&s);
    ferry_loop_stats_get(ferry_loop_current(), &b);
    l->polls = b.polls - a.polls;
    if (l->dns) {
        l->held_at_return = fakedns_held(l->dns);
        l->queries_at_return = fakedns_queries(l->dns);
    }
    return 0;
}

static void lookup(struct lk *l)
{
    cr_assert_eq(tu_run(lookup_task, l), 0);
}

static struct lk lk_stream(const char *host, const char *service, int family)
{
    struct lk l;

    memset(&l, 0, sizeof l);
    l.host = host;
    l.service = service;
    l.hints.ai_family = family;
    l.hints.ai_socktype = SOCK_STREAM;
    return l;
}

/* The addresses of a list as text, "a:port b:port ...", in order. */
static const char *show(const struct addrinfo *ai)
{
    static char out[1024];
    size_t o = 0;

    out[0] = 0;
    for (; ai; ai = ai->ai_next) {
        char buf[INET6_ADDRSTRLEN];
        int port;

        if (ai->ai_family == AF_INET) {
            const struct sockaddr_in *s = (const void *)ai->ai_addr;
            inet_ntop(AF_INET, &s->sin_addr, buf, sizeof buf);
            port = ntohs(s->sin_port);
        } else {
            const struct sockaddr_in6 *s = (const void *)ai->ai_addr;
            inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof buf);
            port = ntohs(s->sin6_port);
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "%s%s:%d", o ? " " : "", buf, port);
    }
    return out;
}

/* Point tu_loop's resolver at the fake server: no hosts file, short
 * timeouts so that a lost answer fails fast. */
static void use_fake(struct fakedns *s, int mode, const char *hosts)
{
    ferry_resolver_opts o = {
        .mode = mode, .nameservers = fakedns_addr(s), .hosts = hosts ? hosts : "",
        .timeout = tu_ms(2000), .attempts = 2,
    };

    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
}

/* Write `text` to a new temporary file; its path (static, one at a time). */
static const char *temp_file(const char *text)
{
    static char path[64];
    int fd;

    snprintf(path, sizeof path, "/tmp/ferry-dns-XXXXXX");
    fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* Run tu_loop once at a time until cond(arg) or `ms` (scaled) passed. */
static bool run_until(bool (*cond)(void *), void *arg, int64_t ms)
{
    int64_t until = ferry_now() + tu_ms(ms);

    while (!cond(arg)) {
        if (ferry_now() > until)
            return false;
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
        usleep(200);
    }
    return true;
}

static bool held_some(void *arg)
{
    return fakedns_held(arg) > 0;
}

static bool nothing_owed(void *arg)
{
    (void)arg;
    return ferry__dns_inflight(tu_loop) == 0;
}

/* ---- codes ------------------------------------------------------------------ */

T(resolver_codes_are_not_errno_values)
{
    static const int codes[] = { FERRY_EAI_NONAME, FERRY_EAI_AGAIN, FERRY_EAI_FAIL,
                                 FERRY_EAI_NODATA, FERRY_EAI_SERVICE, FERRY_EAI_FAMILY,
                                 FERRY_EAI_SOCKTYPE };
    size_t n = sizeof codes / sizeof codes[0];

    for (size_t i = 0; i < n; i++) {
        cr_expect_lt(codes[i], -4095, "code %d is in the errno range", codes[i]);
        cr_expect(FERRY_EAI_IS(codes[i]), "FERRY_EAI_IS(%d) is false", codes[i]);
        cr_expect_str_neq(ferry_gai_strerror(codes[i]), "unknown error code");
        for (size_t j = 0; j < i; j++)
            cr_expect_str_neq(ferry_gai_strerror(codes[i]), ferry_gai_strerror(codes[j]));
    }
    for (int e = 1; e < 4096; e++)
        cr_expect(!FERRY_EAI_IS(-e), "FERRY_EAI_IS(-%d) is true", e);
    cr_expect(!FERRY_EAI_IS(0));
    cr_expect_str_eq(ferry_gai_strerror(-ENOMEM), strerror(ENOMEM));
    cr_expect_str_eq(ferry_gai_strerror(0), "success");
}

/* ---- answered at once -------------------------------------------------------- */

T(numeric_ipv4_is_answered_without_waiting)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("127.0.0.1", "80", AF_UNSPEC);

    use_fake(s, FERRY_RESOLVE_AUTO, NULL);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "127.0.0.1:80");
    cr_expect_eq(l.res->ai_socktype, SOCK_STREAM);
    cr_expect_eq(l.res->ai_addrlen, sizeof(struct sockaddr_in));
    cr_expect_eq(l.polls, 0, "the lookup waited (%llu polls)", (unsigned long long)l.polls);
    cr_expect_eq(fakedns_queries(s), 0, "a numeric host was sent to DNS");
    ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}

T(numeric_ipv6_is_answered_without_waiting)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("2001:db8::1", "443", AF_UNSPEC);

    use_fake(s, FERRY_RESOLVE_AUTO, NULL);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "2001:db8::1:443");
    cr_expect_eq(l.res->ai_family, AF_INET6);
    cr_expect_eq(l.polls, 0);
    cr_expect_eq(fakedns_queries(s), 0);
    ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}

T(no_host_gives_the_wildcard_or_the_loopback)
{
    struct lk l = lk_stream(NULL, "8080", AF_INET);

    l.hints.ai_flags = AI_PASSIVE;
    lookup(&l);
    cr_assert_eq(l.rc, 0);
    cr_expect_str_eq(show(l.res), "0.0.0.0:8080");
    ferry_freeaddrinfo(l.res);
    l = lk_stream(NULL, "8080", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0);
    cr_expect_str_eq(show(l.res), "127.0.0.1:8080");
    ferry_freeaddrinfo(l.res);
}

T(hosts_file_names_are_answered_without_waiting)
{
    struct fakedns *s = fakedns_start();
    const char *hosts = temp_file("# test hosts\n"
                                  "10.1.2.3   alpha.test alpha   # a comment\n"
                                  "fd00::5    alpha.test\n"
                                  "not-an-address ignored.test\n"
                                  "10.1.2.4\tbeta.test\n"
                                  "10.1.2.5   alpha.test\n");
    struct lk l = lk_stream("alpha.test", "22", AF_UNSPEC);

    use_fake(s, FERRY_RESOLVE_NO_THREADS, hosts);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    /* IPv4 first, each family in file order. */
    cr_expect_str_eq(show(l.res), "10.1.2.3:22 10.1.2.5:22 fd00::5:22");
    cr_expect_eq(l.polls, 0);
    ferry_freeaddrinfo(l.res);

    l = lk_stream("ALPHA", "22", AF_INET);       /* an alias, in another case */
    lookup(&l);
    cr_assert_eq(l.rc, 0);
    cr_expect_str_eq(show(l.res), "10.1.2.3:22");
    ferry_freeaddrinfo(l.res);

    l = lk_stream("beta.test", "22", AF_INET6);  /* known, but IPv4 only */
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_NODATA, "rc %d", l.rc);
    cr_expect_null(l.res);

    l = lk_stream("ignored.test", "22", AF_UNSPEC);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_NONAME, "rc %d", l.rc);   /* from the server */
    cr_expect_eq(fakedns_queries(s), 2, "%d queries: only ignored.test's A and AAAA "
                 "should have gone to DNS", fakedns_queries(s));
    unlink(hosts);
    fakedns_stop(s);
}

T(localhost_from_the_system_hosts_file)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("localhost", NULL, AF_INET);
    FILE *f = fopen("/etc/hosts", "r");
    char line[512];
    bool listed = false;

    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "127.0.0.1", 9) == 0 && strstr(line, "localhost"))
            listed = true;
    if (f)
        fclose(f);
    if (!listed) {
        fakedns_stop(s);
        cr_skip_test("/etc/hosts has no 127.0.0.1 localhost line");
    }
    /* The system's hosts file; the fake server answers nothing else. */
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = fakedns_addr(s) }), 0);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect(strstr(show(l.res), "127.0.0.1:0") != NULL, "%s", show(l.res));
    cr_expect_eq(fakedns_queries(s), 0);
    ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}

/* ---- DNS --------------------------------------------------------------------- */

T(names_are_asked_of_the_nameserver)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("www.example.test", "https", AF_UNSPEC);

    fakedns_add(s, "www.example.test", "192.0.2.10");
    fakedns_add(s, "www.example.test", "2001:db8::10");
    fakedns_add(s, "www.example.test", "192.0.2.11");
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "192.0.2.10:443 192.0.2.11:443 2001:db8::10:443");
    cr_expect_geq(l.polls, 1);
    for (struct addrinfo *ai = l.res; ai; ai = ai->ai_next)
        cr_expect_eq(ai->ai_socktype, SOCK_STREAM);
    ferry_freeaddrinfo(l.res);

    /* An absolute name (trailing dot), and each family alone. */
    l = lk_stream("www.example.test.", "1", AF_INET6);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d", l.rc);
    cr_expect_str_eq(show(l.res), "2001:db8::10:1");
    ferry_freeaddrinfo(l.res);
    l = lk_stream("www.example.test", "1", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d", l.rc);
    cr_expect_str_eq(show(l.res), "192.0.2.10:1 192.0.2.11:1");
    ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}

T(a_name_that_does_not_exist_is_noname)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("nosuch.example.test", "80", AF_UNSPEC);

    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_NONAME, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect(FERRY_EAI_IS(l.rc));
    cr_expect_null(l.res);
    cr_expect_geq(fakedns_queries(s), 1);
    fakedns_stop(s);
}

T(a_name_without_the_family_is_nodata_or_mapped)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("v4only.test", "80", AF_INET6);

    fakedns_add(s, "v4only.test", "192.0.2.20");
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_NODATA, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_null(l.res);

    l = lk_stream("v4only.test", "80", AF_INET6);
    l.hints.ai_flags = AI_V4MAPPED;
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "::ffff:192.0.2.20:80");
    ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}

T(servfail_and_silence_are_temporary_refused_is_not)
{
    struct fakedns *s = fakedns_start();
    ferry_resolver_opts o = { .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = fakedns_addr(s),
                              .hosts = "", .timeout = tu_ms(50), .attempts = 1 };
    struct lk l = lk_stream("servfail.test", "80", AF_INET);

    fakedns_rule(s, "servfail.test", FAKEDNS_ANY, FAKEDNS_SERVFAIL);
    fakedns_rule(s, "silent.test", FAKEDNS_ANY, FAKEDNS_DROP);
    fakedns_rule(s, "refused.test", FAKEDNS_ANY, FAKEDNS_REFUSED);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_AGAIN, "servfail: rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    l = lk_stream("silent.test", "80", AF_INET);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_AGAIN, "silence: rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    l = lk_stream("refused.test", "80", AF_INET);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_FAIL, "refused: rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    fakedns_stop(s);
}

T(the_second_family_gets_the_timeout_not_more)
{
    struct fakedns *s = fakedns_start();
    ferry_resolver_opts o = { .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = fakedns_addr(s),
                              .hosts = "", .timeout = tu_ms(100), .attempts = 100 };
    struct lk l = lk_stream("slow6.test", "80", AF_UNSPEC);

    fakedns_add(s, "slow6.test", "192.0.2.30");
    fakedns_add(s, "slow6.test", "2001:db8::30");
    fakedns_rule(s, "slow6.test", FAKEDNS_AAAA, FAKEDNS_HOLD);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
    l.dns = s;
    lookup(&l);
    /* With 100 attempts evdns alone would send the AAAA query 100 times
     * before it gave up; the lookup returns after one timeout or so. */
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "192.0.2.30:80");
    cr_expect_gt(l.held_at_return, 0, "the AAAA query was not held: nothing tested");
    cr_expect_lt(l.queries_at_return, 20, "%d queries sent: the lookup waited for evdns to "
                 "give up on AAAA", l.queries_at_return);
    ferry_freeaddrinfo(l.res);
    cr_expect(run_until(nothing_owed, NULL, 5000), "the AAAA query's callback never came");
    fakedns_stop(s);
}

/* ---- deadlines and cancellation ------------------------------------------------- */

T(a_deadline_ends_the_lookup_and_the_late_answer_is_dropped)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("slow.test", "80", AF_UNSPEC);

    fakedns_add(s, "slow.test", "192.0.2.40");
    fakedns_rule(s, "slow.test", FAKEDNS_ANY, FAKEDNS_HOLD);
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    l.ms = 100;
    l.dns = s;
    lookup(&l);
    cr_expect_eq(l.rc, -ETIMEDOUT, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_null(l.res);
    cr_expect_gt(l.held_at_return, 0, "the server had answered: nothing tested");
    /* The answer comes after the task left; evdns still calls back for
     * the cancelled queries, and the record goes then. */
    fakedns_release(s);
    cr_expect(run_until(nothing_owed, NULL, 5000), "%zu callbacks still owed",
              ferry__dns_inflight(tu_loop));
    fakedns_stop(s);
}

/* Cancels `victim` once the fake server holds its query. */
struct canceller {
    ferry_task     *victim;
    struct fakedns *dns;
};

static int cancel_task(void *arg)
{
    struct canceller *c = arg;

    while (fakedns_held(c->dns) == 0)
        if (ferry_sleep(FERRY_MSEC(1)) != 0)
            return -1;
    return ferry_task_cancel(c->victim);
}

T(a_cancelled_lookup_returns_at_once_and_leaks_nothing)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("slow.test", "80", AF_UNSPEC);
    struct canceller c = { .dns = s };
    ferry_task *t, *k;
    int st;

    fakedns_add(s, "slow.test", "192.0.2.40");
    fakedns_rule(s, "slow.test", FAKEDNS_ANY, FAKEDNS_HOLD);
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    l.dns = s;
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, lookup_task, &l, NULL), 0);
    c.victim = t;
    cr_assert_eq(ferry_task_spawn(&k, tu_loop, cancel_task, &c, NULL), 0);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    while (ferry_task_try_join(k, &st) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(st, 0);
    cr_expect_eq(l.rc, -ECANCELED, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_null(l.res);
    cr_expect_gt(l.held_at_return, 0, "the server had answered: nothing tested");
    fakedns_release(s);
    cr_expect(run_until(nothing_owed, NULL, 5000));
    fakedns_stop(s);
}

static bool replied(void *arg)
{
    return fakedns_sent(arg) > 0;
}

/* Wait (without running the loop) until the server has sent `n` replies:
 * loopback delivers them into the resolver's socket at once. */
static void wait_sent(struct fakedns *s, int n)
{
    int64_t until = ferry_now() + tu_ms(5000);

    while (fakedns_sent(s) < n && ferry_now() < until)
        usleep(200);
    cr_assert_geq(fakedns_sent(s), n, "the server sent %d replies, not %d", fakedns_sent(s), n);
}

static void wait_reply_sent(struct fakedns *s)
{
    wait_sent(s, 1);
}

/* Keeps the run queue from emptying, so that FERRY_RUN_ONCE returns right
 * after its poll and a task woken by that poll is seen READY, not run. */
static atomic_int yielder_stop;

static int yielder_task(void *arg)
{
    (void)arg;
    while (!atomic_load(&yielder_stop))
        if (ferry_yield() != 0)
            break;
    return 0;
}

static ferry_task *yielder_start(void)
{
    ferry_task *y;

    atomic_store(&yielder_stop, 0);
    cr_assert_eq(ferry_task_spawn(&y, tu_loop, yielder_task, NULL, NULL), 0);
    return y;
}

static void yielder_end(ferry_task *y)
{
    int st;

    atomic_store(&yielder_stop, 1);
    while (ferry_task_try_join(y, &st) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
}

T(a_task_cancelled_after_its_answer_came_gets_nothing)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("slow.test", "80", AF_INET);
    ferry_task *t, *y;
    int st;

    fakedns_add(s, "slow.test", "192.0.2.40");
    fakedns_rule(s, "slow.test", FAKEDNS_ANY, FAKEDNS_HOLD);
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, lookup_task, &l, NULL), 0);
    cr_assert(run_until(held_some, s, 5000));
    y = yielder_start();
    fakedns_release(s);
    wait_reply_sent(s);
    /* The answer wakes the task; it is cancelled before it runs. */
    ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(ferry_task_state(t), FERRY_TASK_READY, "the answer did not wake the task");
    ferry_task_cancel(t);
    yielder_end(y);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_expect_eq(l.rc, -ECANCELED, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_null(l.res);
    ferry_freeaddrinfo(l.res);
    cr_expect_eq(ferry__dns_inflight(tu_loop), 0);
    fakedns_stop(s);
}

T(a_resolver_with_a_lookup_in_flight_cannot_be_reconfigured)
{
    struct fakedns *s = fakedns_start();
    struct lk l = lk_stream("slow.test", "80", AF_INET);
    ferry_task *t;
    int st;

    fakedns_add(s, "slow.test", "192.0.2.40");
    fakedns_rule(s, "slow.test", FAKEDNS_ANY, FAKEDNS_HOLD);
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, lookup_task, &l, NULL), 0);
    cr_assert(run_until(held_some, s, 5000));
    cr_expect_eq(ferry_loop_set_resolver(tu_loop, NULL), -EBUSY);
    fakedns_release(s);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(l.rc, 0, "rc %d", l.rc);
    ferry_freeaddrinfo(l.res);
    cr_expect_eq(ferry_loop_set_resolver(tu_loop, NULL), 0);
    fakedns_stop(s);
}

/* ---- many lookups, and the loop's end ------------------------------------------- */

static double stress_scale(void)
{
    const char *v = getenv("FERRY_STRESS_SCALE");
    double f = v ? atof(v) : 1.0;

    return f > 0 && f <= 1 ? f : 1.0;
}

struct many {
    int  idx;
    int  rc;
    char got[128];
};

static int many_task(void *arg)
{
    struct many *m = arg;
    struct addrinfo h = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res;
    char name[32];
    ferry_scope s;

    snprintf(name, sizeof name, "n%d.test", m->idx % 5);
    ferry_scope_enter(&s, ferry_now() + tu_ms(60000), 0);
    m->rc = ferry_getaddrinfo(name, "80", &h, &res);
    ferry_scope_exit(&s);
    if (m->rc == 0) {
        snprintf(m->got, sizeof m->got, "%s", show(res));
        ferry_freeaddrinfo(res);
    }
    return 0;
}

T(a_thousand_lookups_at_once)
{
    struct fakedns *s = fakedns_start();
    int n = (int)(1000 * stress_scale()), ok = 0;
    struct many *m = calloc((size_t)n, sizeof *m);
    ferry_task **t = calloc((size_t)n, sizeof *t);

    cr_assert(m && t);
    for (int i = 0; i < 5; i++) {
        char name[32], a[32];
        snprintf(name, sizeof name, "n%d.test", i);
        snprintf(a, sizeof a, "192.0.2.%d", 100 + i);
        fakedns_add(s, name, a);
        snprintf(a, sizeof a, "2001:db8::%d", 100 + i);
        fakedns_add(s, name, a);
    }
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    for (int i = 0; i < n; i++) {
        m[i].idx = i;
        cr_assert_eq(ferry_task_spawn(&t[i], tu_loop, many_task, &m[i], NULL), 0);
    }
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    for (int i = 0; i < n; i++) {
        char want[128];
        int st;

        cr_assert_eq(ferry_task_try_join(t[i], &st), 0);
        snprintf(want, sizeof want, "192.0.2.%d:80 2001:db8::%d:80", 100 + i % 5, 100 + i % 5);
        if (m[i].rc == 0 && strcmp(m[i].got, want) == 0)
            ok++;
        else if (n - ok < 5)
            fprintf(stderr, "lookup %d: rc %d (%s), got \"%s\"\n", i, m[i].rc,
                    ferry_gai_strerror(m[i].rc), m[i].got);
    }
    cr_expect_eq(ok, n, "%d of %d lookups got their answer", ok, n);
    cr_expect_geq(fakedns_queries(s), 2 * n);
    free(m);
    free(t);
    fakedns_stop(s);
}

/* Frees tu_loop while `n` lookups wait; `release` first lets the held
 * answers go out, so that some arrive while the loop closes. */
static void free_loop_with_lookups(int n, bool release)
{
    struct fakedns *s = fakedns_start();
    struct lk *l = calloc((size_t)n, sizeof *l);
    int cancelled = 0;

    cr_assert(l);
    fakedns_add(s, "slow.test", "192.0.2.40");
    fakedns_add(s, "slow.test", "2001:db8::40");
    fakedns_rule(s, "slow.test", FAKEDNS_ANY, FAKEDNS_HOLD);
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    for (int i = 0; i < n; i++) {
        l[i] = lk_stream("slow.test", "80", AF_UNSPEC);
        cr_assert_eq(ferry_task_spawn(NULL, tu_loop, lookup_task, &l[i], NULL), 0);
    }
    /* evdns sends 64 queries at a time; the rest wait in its queue. */
    for (int64_t until = ferry_now() + tu_ms(5000); fakedns_held(s) < 64 && ferry_now() < until;)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(fakedns_held(s), 64, "%d queries held, not 64", fakedns_held(s));
    for (int k = 0; k < 20; k++)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    if (release) {
        fakedns_release(s);
        wait_reply_sent(s);
    }
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    for (int i = 0; i < n; i++) {
        if (l[i].rc == -ECANCELED && !l[i].res)
            cancelled++;
        else if (l[i].rc == 0)
            ferry_freeaddrinfo(l[i].res);
    }
    if (!release)
        cr_expect_eq(cancelled, n, "%d of %d lookups were cancelled", cancelled, n);
    else
        cr_expect_gt(cancelled, 0, "no lookup was in flight when the loop was freed");
    free(l);
    fakedns_stop(s);
}

/* 40 lookups: 80 queries, more than the 64 evdns sends at once, and fewer
 * tasks than the loop runs between two polls (128), so that no poll comes
 * by chance between the tasks' cancellation and the end of the free. */
T(a_loop_freed_with_lookups_in_flight_frees_everything)
{
    free_loop_with_lookups(40, false);
}

T(a_loop_freed_while_answers_arrive_frees_everything)
{
    free_loop_with_lookups(40, true);
}

/* ---- the pool -------------------------------------------------------------------- */

static atomic_int hook_started, hook_release;

/* A getaddrinfo(3) for the pool that answers 10.9.8.7 for every name, once
 * hook_release is set. */
static int fake_gai(const char *host, const char *service, const struct addrinfo *hints,
                    struct addrinfo **res)
{
    struct addrinfo h = { .ai_flags = AI_NUMERICHOST, .ai_family = AF_INET };

    (void)host;
    if (hints) {
        h.ai_socktype = hints->ai_socktype;
        h.ai_protocol = hints->ai_protocol;
    }
    atomic_store(&hook_started, 1);
    while (!atomic_load(&hook_release))
        usleep(1000);
    return getaddrinfo("10.9.8.7", service, &h, res);
}

static void hook_on(bool released)
{
    atomic_store(&hook_started, 0);
    atomic_store(&hook_release, released);
    ferry__gai_set_blocking(fake_gai);
}

static ferry_pool *small_pool(void)
{
    ferry_pool *p;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 2 }), 0);
    return p;
}

static uint64_t pool_done(ferry_pool *p)
{
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    return st.completed;
}

T(every_lookup_goes_to_the_pool_when_asked)
{
    ferry_pool *p = small_pool();
    struct lk l = lk_stream("127.0.0.1", "80", AF_UNSPEC);

    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .mode = FERRY_RESOLVE_THREADS, .pool = p }), 0);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "127.0.0.1:80");
    cr_expect_eq(pool_done(p), 1, "the lookup did not run on the pool");
    ferry_freeaddrinfo(l.res);

    l = lk_stream("::1", "http", AF_INET6);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "::1:80");
    cr_expect_eq(pool_done(p), 2);
    ferry_freeaddrinfo(l.res);

    l = lk_stream("127.0.0.1", "no-such-service", AF_INET);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_SERVICE, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    ferry_pool_free(p);
}

static int cancel_when_hook_runs(void *arg)
{
    int rc = tu_task_wait_flag(&hook_started);

    if (rc)
        return rc;
    return ferry_task_cancel(arg);
}

T(a_lookup_on_the_pool_is_abandoned_when_cancelled)
{
    ferry_pool *p = small_pool();
    struct lk l = lk_stream("www.example.test", "80", AF_INET);
    ferry_task *t, *k;
    int st;

    hook_on(false);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .mode = FERRY_RESOLVE_THREADS, .pool = p }), 0);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, lookup_task, &l, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&k, tu_loop, cancel_when_hook_runs, t, NULL), 0);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    /* Returned while the pool thread is still inside getaddrinfo. */
    cr_expect_eq(l.rc, -ECANCELED, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_null(l.res);
    while (ferry_task_try_join(k, &st) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_expect_eq(st, 0);
    /* The thread's late answer is freed by the job's cleanup: the test's
     * end counts every allocation. */
    atomic_store(&hook_release, 1);
    ferry_pool_free(p);
    ferry__gai_set_blocking(NULL);
}

T(a_truncated_reply_is_asked_again_on_the_pool)
{
    struct fakedns *s = fakedns_start();
    ferry_pool *p = small_pool();
    struct lk l = lk_stream("big.test", "80", AF_INET);

    hook_on(true);
    fakedns_add(s, "big.test", "192.0.2.50");
    fakedns_rule(s, "big.test", FAKEDNS_ANY, FAKEDNS_TRUNCATE);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .nameservers = fakedns_addr(s), .hosts = "", .pool = p }), 0);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "10.9.8.7:80", "not the pool's answer");
    cr_expect_eq(fakedns_queries(s), 1);
    ferry_freeaddrinfo(l.res);

    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = fakedns_addr(s), .hosts = "" }), 0);
    l = lk_stream("big.test", "80", AF_INET);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_FAIL, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_eq(pool_done(p), 1);
    ferry_pool_free(p);
    ferry__gai_set_blocking(NULL);
    fakedns_stop(s);
}

T(canonical_names_are_asked_on_the_pool)
{
    struct fakedns *s = fakedns_start();
    ferry_pool *p = small_pool();
    struct lk l = lk_stream("www.example.test", "80", AF_INET);

    hook_on(true);
    fakedns_add(s, "www.example.test", "192.0.2.10");
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .nameservers = fakedns_addr(s), .hosts = "", .pool = p }), 0);
    l.hints.ai_flags = AI_CANONNAME;
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "10.9.8.7:80");
    cr_expect_eq(fakedns_queries(s), 0);
    ferry_freeaddrinfo(l.res);

    /* Without threads: the name as asked. */
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = fakedns_addr(s), .hosts = "" }), 0);
    l = lk_stream("www.example.test", "80", AF_INET);
    l.hints.ai_flags = AI_CANONNAME;
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "192.0.2.10:80");
    cr_assert_not_null(l.res->ai_canonname);
    cr_expect_str_eq(l.res->ai_canonname, "www.example.test");
    ferry_freeaddrinfo(l.res);
    ferry_pool_free(p);
    ferry__gai_set_blocking(NULL);
    fakedns_stop(s);
}

/* resolv.conf and nsswitch.conf of the test's own, through the internal
 * hook; the pool's getaddrinfo is the fake one. */
T(resolv_conf_and_nsswitch_decide_where_a_name_is_asked)
{
    struct fakedns *s = fakedns_start();
    ferry_pool *p = small_pool();
    ferry_resolver_opts o = { .hosts = "", .pool = p };
    char resolv[64], nss[64], text[128];
    struct lk l;

    hook_on(true);
    fakedns_add(s, "www.example.test", "192.0.2.10");
    snprintf(text, sizeof text, "# test\nnameserver %s\noptions timeout:2 attempts:2\n",
             fakedns_addr(s));
    snprintf(resolv, sizeof resolv, "%s", temp_file(text));
    snprintf(nss, sizeof nss, "%s",
             temp_file("passwd: files\n  hosts:   files [ NOTFOUND=return ] dns # end\n"));
    ferry__dns_set_files(resolv, nss);

    /* files dns: DNS answers, a miss is a miss. */
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
    l = lk_stream("www.example.test", "80", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "192.0.2.10:80");
    ferry_freeaddrinfo(l.res);
    l = lk_stream("other.test", "80", AF_INET);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_NONAME, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_eq(pool_done(p), 0);

    /* Other sources: a DNS miss is asked again on the pool. */
    unlink(nss);
    snprintf(nss, sizeof nss, "%s",
             temp_file("hosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\n"));
    ferry__dns_set_files(resolv, nss);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
    l = lk_stream("www.example.test", "80", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0);
    cr_expect_str_eq(show(l.res), "192.0.2.10:80");
    ferry_freeaddrinfo(l.res);
    l = lk_stream("other.test", "80", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "10.9.8.7:80");
    cr_expect_eq(pool_done(p), 1);
    ferry_freeaddrinfo(l.res);

    /* No "dns" source: names go to the pool without a query. */
    unlink(nss);
    snprintf(nss, sizeof nss, "%s", temp_file("hosts: files\n"));
    ferry__dns_set_files(resolv, nss);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
    int before = fakedns_queries(s);
    l = lk_stream("www.example.test", "80", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0);
    cr_expect_str_eq(show(l.res), "10.9.8.7:80");
    cr_expect_eq(fakedns_queries(s), before);
    ferry_freeaddrinfo(l.res);

    /* No nameserver in resolv.conf: the same. */
    unlink(nss);
    snprintf(nss, sizeof nss, "%s", temp_file("hosts: files dns\n"));
    unlink(resolv);
    snprintf(resolv, sizeof resolv, "%s", temp_file("search example.test\n"));
    ferry__dns_set_files(resolv, nss);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &o), 0);
    l = lk_stream("www.example.test", "80", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0);
    cr_expect_str_eq(show(l.res), "10.9.8.7:80");
    cr_expect_eq(fakedns_queries(s), before);
    ferry_freeaddrinfo(l.res);

    ferry__dns_set_files(NULL, NULL);
    unlink(resolv);
    unlink(nss);
    ferry_pool_free(p);
    ferry__gai_set_blocking(NULL);
    fakedns_stop(s);
}

/* getaddrinfo(3) answers that the pool turns into ferry's codes: the host
 * names the code the fake getaddrinfo returns. */
static int coded_gai(const char *host, const char *service, const struct addrinfo *hints,
                     struct addrinfo **res)
{
    static const struct { const char *name; int eai, err; } map[] = {
        { "noname", EAI_NONAME, 0 },   { "again", EAI_AGAIN, 0 },
        { "fail", EAI_FAIL, 0 },       { "nodata", EAI_NODATA, 0 },
        { "addrfamily", EAI_ADDRFAMILY, 0 }, { "service", EAI_SERVICE, 0 },
        { "family", EAI_FAMILY, 0 },   { "socktype", EAI_SOCKTYPE, 0 },
        { "memory", EAI_MEMORY, 0 },   { "badflags", EAI_BADFLAGS, 0 },
        { "system", EAI_SYSTEM, EMFILE }, { "system0", EAI_SYSTEM, 0 },
        { "overflow", EAI_OVERFLOW, 0 },
    };

    (void)service;
    (void)hints;
    *res = NULL;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(host, map[i].name) == 0) {
            errno = map[i].err;
            return map[i].eai;
        }
    }
    return EAI_FAIL;
}

struct coded {
    const char *host;
    int         want;
    int         rc;
};

static int coded_task(void *arg)
{
    struct coded *c = arg;
    struct addrinfo *res;

    for (; c->host; c++)
        c->rc = ferry_getaddrinfo(c->host, "80", NULL, &res);
    return 0;
}

T(getaddrinfo_codes_from_the_pool_become_ferry_codes)
{
    ferry_pool *p = small_pool();
    struct coded c[] = {
        { "noname", FERRY_EAI_NONAME, 0 },   { "again", FERRY_EAI_AGAIN, 0 },
        { "fail", FERRY_EAI_FAIL, 0 },       { "nodata", FERRY_EAI_NODATA, 0 },
        { "addrfamily", FERRY_EAI_NODATA, 0 }, { "service", FERRY_EAI_SERVICE, 0 },
        { "family", FERRY_EAI_FAMILY, 0 },   { "socktype", FERRY_EAI_SOCKTYPE, 0 },
        { "memory", -ENOMEM, 0 },            { "badflags", -EINVAL, 0 },
        { "system", -EMFILE, 0 },            { "system0", FERRY_EAI_FAIL, 0 },
        { "overflow", FERRY_EAI_FAIL, 0 },   { NULL, 0, 0 },
    };

    ferry__gai_set_blocking(coded_gai);
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .mode = FERRY_RESOLVE_THREADS, .pool = p }), 0);
    cr_assert_eq(tu_run(coded_task, c), 0);
    for (struct coded *k = c; k->host; k++)
        cr_expect_eq(k->rc, k->want, "%s: rc %d (%s), want %d", k->host, k->rc,
                     ferry_gai_strerror(k->rc), k->want);
    ferry_pool_free(p);
    ferry__gai_set_blocking(NULL);
}

/* AI_ADDRCONFIG: only the families the machine has an address of (other
 * than 127.0.0.1 and ::1), as glibc reads it; what the machine has is
 * pretended through an internal hook, then read from the interfaces. */
struct fams_case {
    int         pretend;     /* bits: 1 IPv4, 2 IPv6 */
    int         family;
    int         rc;          /* expected */
    const char *want;        /* expected list */
};

T(addrconfig_asks_for_the_families_the_machine_has)
{
    static const struct fams_case cases[] = {
        { 1, AF_UNSPEC, 0, "192.0.2.10:80" },
        { 2, AF_UNSPEC, 0, "2001:db8::10:80" },
        { 3, AF_UNSPEC, 0, "192.0.2.10:80 2001:db8::10:80" },
        { 0, AF_UNSPEC, 0, "192.0.2.10:80 2001:db8::10:80" },   /* nothing known */
        { 2, AF_INET, FERRY_EAI_NONAME, "" },
        { 1, AF_INET6, FERRY_EAI_NONAME, "" },
    };
    struct fakedns *s = fakedns_start();
    struct lk l;

    fakedns_add(s, "www.example.test", "192.0.2.10");
    fakedns_add(s, "www.example.test", "2001:db8::10");
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct fams_case *c = &cases[i];
        int before = fakedns_queries(s), per = c->pretend == 1 || c->pretend == 2 ? 1 : 2;

        ferry__dns_set_families(c->pretend);
        l = lk_stream("www.example.test", "80", c->family);
        l.hints.ai_flags = AI_ADDRCONFIG;
        lookup(&l);
        cr_expect_eq(l.rc, c->rc, "case %zu: rc %d (%s)", i, l.rc, ferry_gai_strerror(l.rc));
        if (l.rc == 0) {
            cr_expect_str_eq(show(l.res), c->want, "case %zu", i);
            cr_expect_eq(fakedns_queries(s) - before, per, "case %zu: %d queries", i,
                         fakedns_queries(s) - before);
        }
        ferry_freeaddrinfo(l.res);
    }
    /* The machine's own interfaces (NULL hints have AI_ADDRCONFIG). */
    ferry__dns_set_families(-1);
    l = lk_stream("www.example.test", "80", AF_UNSPEC);
    l.no_hints = true;
    lookup(&l);
    cr_expect_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}

static char logged[256];

static void keep_log(int level, const char *msg, void *ctx)
{
    (void)level;
    (void)ctx;
    snprintf(logged, sizeof logged, "%s", msg);
}

T(freeaddrinfo_leaves_what_is_not_ferrys_alone)
{
    /* Zeros where ferry keeps its mark: not one of its blocks. */
    union { struct addrinfo ai[4]; unsigned char bytes[4 * sizeof(struct addrinfo)]; } buf;

    memset(&buf, 0, sizeof buf);
    logged[0] = 0;
    ferry_set_log(keep_log, NULL);
    ferry_freeaddrinfo(&buf.ai[2]);
    ferry_set_log(NULL, NULL);
    cr_expect(strstr(logged, "not a list from ferry_getaddrinfo()") != NULL, "logged: \"%s\"",
              logged);
}

/* ---- bad input ------------------------------------------------------------------- */

struct bad {
    int rc[16];
    bool res_cleared;
};

static int bad_input_task(void *arg)
{
    struct bad *b = arg;
    struct addrinfo h, *res = (struct addrinfo *)&h;
    char longlabel[80];
    int i = 0;

    memset(longlabel, 'a', 70);
    strcpy(longlabel + 70, ".test");
    b->rc[i++] = ferry_getaddrinfo("x.test", "80", NULL, NULL);
    b->rc[i++] = ferry_getaddrinfo(NULL, NULL, NULL, &res);
    b->res_cleared = res == NULL;
    memset(&h, 0, sizeof h);
    h.ai_flags = 0x40000000;
    b->rc[i++] = ferry_getaddrinfo("127.0.0.1", "80", &h, &res);
    memset(&h, 0, sizeof h);
    h.ai_next = &h;
    b->rc[i++] = ferry_getaddrinfo("127.0.0.1", "80", &h, &res);
    memset(&h, 0, sizeof h);
    h.ai_family = AF_UNIX;
    b->rc[i++] = ferry_getaddrinfo("127.0.0.1", "80", &h, &res);
    memset(&h, 0, sizeof h);
    h.ai_socktype = SOCK_STREAM;
    b->rc[i++] = ferry_getaddrinfo("127.0.0.1", "no-such-service", &h, &res);
    b->rc[i++] = ferry_getaddrinfo(longlabel, "80", &h, &res);
    b->rc[i++] = ferry_getaddrinfo("a..test", "80", &h, &res);
    b->rc[i++] = ferry_getaddrinfo("", "80", &h, &res);
    return 0;
}

T(bad_input_is_refused)
{
    struct fakedns *s = fakedns_start();
    struct addrinfo *res = (struct addrinfo *)1;
    struct bad b;
    static const int want[] = { -EINVAL, -EINVAL, -EINVAL, -EINVAL, FERRY_EAI_FAMILY,
                                FERRY_EAI_SERVICE, FERRY_EAI_NONAME, FERRY_EAI_NONAME,
                                FERRY_EAI_NONAME };

    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);
    memset(&b, 0, sizeof b);
    cr_assert_eq(tu_run(bad_input_task, &b), 0);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_eq(b.rc[i], want[i], "case %zu: rc %d (%s), want %d", i, b.rc[i],
                     ferry_gai_strerror(b.rc[i]), want[i]);
    cr_expect(b.res_cleared);
    cr_expect_eq(fakedns_queries(s), 0, "a bad name was sent to DNS");
    /* Not in a task. */
    cr_expect_eq(ferry_getaddrinfo("127.0.0.1", "80", NULL, &res), -EPERM);
    cr_expect_null(res);
    /* The resolver's options. */
    cr_expect_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){ .mode = 7 }), -EINVAL);
    cr_expect_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .nameservers = "not-an-address" }), -EINVAL);
    cr_expect_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .nameservers = " , " }), -EINVAL);
    cr_expect_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){ .timeout = 5 }),
                 -EINVAL);
    cr_expect_eq(ferry_loop_set_resolver(NULL, NULL), -EINVAL);
    ferry_freeaddrinfo(NULL);
    fakedns_stop(s);
}

static void *set_resolver_thread(void *arg)
{
    return (void *)(intptr_t)ferry_loop_set_resolver(arg, NULL);
}

T(the_resolver_belongs_to_its_loop_thread)
{
    pthread_t th = tu_start_thread(set_resolver_thread, tu_loop);
    void *ret;

    pthread_join(th, &ret);
    cr_expect_eq((int)(intptr_t)ret, -EPERM);
}

/* nsswitch.conf read safely: an action whose bracket never closes ends
 * the line; a file too large to be a configuration is not read (a
 * warning, and glibc's default sources). */
T(nsswitch_with_an_unclosed_action_or_of_an_absurd_size)
{
    char nss[64];
    bool files = false, dns = true, other = true;
    int fd;

    snprintf(nss, sizeof nss, "%s", temp_file("hosts: files [NOTFOUND=return dns\n"));
    ferry__dns_set_files(NULL, nss);
    cr_assert_eq(ferry__nss_read(&files, &dns, &other), 0);
    cr_assert(files);
    cr_assert_not(dns);
    cr_assert_not(other);

    /* Sparse: 64 MiB and a byte, without writing them. */
    fd = open(nss, O_WRONLY | O_TRUNC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, ((off_t)64 << 20) + 1), 0);
    close(fd);
    files = dns = false;
    other = true;
    tu_log_capture_start();
    cr_assert_eq(ferry__nss_read(&files, &dns, &other), 0);
    tu_log_capture_stop();
    cr_assert(files);
    cr_assert(dns);
    cr_assert_not(other);
    cr_assert_eq(tu_log_lines(), 1);
    cr_assert(strstr(tu_log_text(), "larger than"), "the warning: '%s'", tu_log_text());
    ferry__dns_set_files(NULL, NULL);
    unlink(nss);
}

static int cancelled_lookup_task(void *arg)
{
    struct lk *l = arg;

    ferry_task_cancel(ferry_task_current());
    l->res = (struct addrinfo *)1;
    l->rc = ferry_getaddrinfo(l->host, l->service, &l->hints, &l->res);
    return 0;
}

/* Every lookup is a cancellation point, also one answered at once; the
 * nameserver list may end with separators. */
T(a_cancelled_lookup_is_ecanceled_and_a_nameserver_list_may_end_with_separators)
{
    struct fakedns *s = fakedns_start();
    char ns[96];
    struct lk l;

    snprintf(ns, sizeof ns, "%s, \t", fakedns_addr(s));
    fakedns_add(s, "www.example.test", "192.0.2.10");
    cr_assert_eq(ferry_loop_set_resolver(tu_loop, &(ferry_resolver_opts){
        .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = ns, .hosts = "" }), 0);
    l = lk_stream("127.0.0.1", "80", AF_INET);
    cr_assert_eq(tu_run(cancelled_lookup_task, &l), 0);
    cr_assert_eq(l.rc, -ECANCELED, "rc %d", l.rc);
    cr_assert_null(l.res);
    l = lk_stream("www.example.test", "80", AF_INET);
    lookup(&l);
    cr_assert_eq(l.rc, 0, "rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "192.0.2.10:80");
    ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}

/* ---- NUL bytes in the system files -------------------------------------------- */

/* Write `len` bytes of `text` to a new temporary file; its path (static,
 * one at a time). */
static const char *temp_file_bytes(const char *text, size_t len)
{
    static char path[64];
    int fd;

    snprintf(path, sizeof path, "/tmp/ferry-dns-XXXXXX");
    fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

/* A NUL byte ends what is read of its line, as glibc's readers of the
 * hosts file and nsswitch.conf (fgets, then C strings) take it; the lines
 * after it still count. */
T(a_nul_byte_in_the_hosts_file_hides_only_the_rest_of_its_line)
{
    static const char text[] = "10.1.2.3 before.test\n"
                               "10.1.2.4 cut.test\0hidden.test\n"
                               "10.1.2.5 after.test\n";
    struct fakedns *s = fakedns_start();
    char hosts[64];
    struct lk l;

    snprintf(hosts, sizeof hosts, "%s", temp_file_bytes(text, sizeof text - 1));
    use_fake(s, FERRY_RESOLVE_NO_THREADS, hosts);
    l = lk_stream("cut.test", "22", AF_INET);
    lookup(&l);
    cr_expect_eq(l.rc, 0, "cut.test: rc %d", l.rc);
    cr_expect_str_eq(show(l.res), "10.1.2.4:22");
    ferry_freeaddrinfo(l.res);

    l = lk_stream("after.test", "22", AF_INET);
    lookup(&l);
    cr_expect_eq(l.rc, 0, "after.test, the line after the NUL: rc %d (%s)", l.rc,
                 ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "10.1.2.5:22");
    ferry_freeaddrinfo(l.res);

    l = lk_stream("hidden.test", "22", AF_INET);   /* behind the NUL: DNS's */
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_NONAME, "hidden.test: rc %d", l.rc);
    cr_expect_eq(fakedns_queries(s), 1, "%d queries: only hidden.test's A should have "
                 "gone to DNS", fakedns_queries(s));
    unlink(hosts);
    fakedns_stop(s);
}

T(a_nul_byte_in_nsswitch_conf_hides_only_the_rest_of_its_line)
{
    static const char text[] = "passwd: files\0 junk\n"
                               "hosts: files\n";
    bool files = false, dns = true, other = true;
    char nss[64];

    snprintf(nss, sizeof nss, "%s", temp_file_bytes(text, sizeof text - 1));
    ferry__dns_set_files(NULL, nss);
    cr_assert_eq(ferry__nss_read(&files, &dns, &other), 0);
    ferry__dns_set_files(NULL, NULL);
    unlink(nss);
    cr_expect(files);
    cr_expect_not(dns, "the hosts: line after the NUL was not read (dns is glibc's default)");
    cr_expect_not(other);
}

/* ---- replies that cannot be used ------------------------------------------------ */

/* An AAAA record whose RDLENGTH is not 16 makes the reply unusable:
 * FERRY_EAI_FAIL, as a reply that could not be read.  The A answer of
 * the same lookup still counts (glibc does the same).  An A record of 16
 * bytes is not refused: evdns reads it as four addresses (docs/resolve.md,
 * Limits). */
T(an_aaaa_record_of_the_wrong_length_is_eai_fail)
{
    struct fakedns *s = fakedns_start();
    struct lk l;

    fakedns_add(s, "short6.test", "2001:db8::6");
    fakedns_add(s, "short6.test", "192.0.2.60");
    fakedns_rule(s, "short6.test", FAKEDNS_AAAA, FAKEDNS_BAD_RDLEN);
    use_fake(s, FERRY_RESOLVE_NO_THREADS, NULL);

    l = lk_stream("short6.test", "80", AF_INET6);
    lookup(&l);
    cr_expect_eq(l.rc, FERRY_EAI_FAIL, "AAAA of RDLENGTH 4: rc %d (%s), %s", l.rc,
                 ferry_gai_strerror(l.rc), show(l.res));
    if (!l.rc)
        ferry_freeaddrinfo(l.res);

    l = lk_stream("short6.test", "80", AF_UNSPEC);
    lookup(&l);
    cr_expect_eq(l.rc, 0, "both families: rc %d (%s)", l.rc, ferry_gai_strerror(l.rc));
    cr_expect_str_eq(show(l.res), "192.0.2.60:80");
    if (!l.rc)
        ferry_freeaddrinfo(l.res);
    fakedns_stop(s);
}
