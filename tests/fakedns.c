/* fakedns.c - the DNS server of fakedns.h: one thread, one UDP socket on
 * 127.0.0.1, messages parsed and built by hand after RFC 1035 section 4. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "fakedns.h"

#define MAX_RECORDS 64
#define MAX_RULES   64
#define MAX_HELD    4096
#define MSG_MAX     512

struct record {
    char          name[256];
    int           qtype;        /* FAKEDNS_A or FAKEDNS_AAAA */
    unsigned char rdata[16];
};

struct rule {
    char             name[256];
    int              qtype;     /* FAKEDNS_ANY for both */
    enum fakedns_act act;
};

/* A query kept by FAKEDNS_HOLD: the message and where it came from. */
struct held {
    unsigned char      msg[MSG_MAX];
    size_t             len;
    struct sockaddr_in from;
};

struct fakedns {
    int             fd;             /* the UDP socket */
    int             wake[2];        /* a pipe: stop, or answer the held ones */
    pthread_t       thread;
    char            addr[32];
    pthread_mutex_t mu;             /* guards everything below */
    struct record   records[MAX_RECORDS];
    int             nrecords;
    struct rule     rules[MAX_RULES];
    int             nrules;
    struct held    *held;           /* MAX_HELD slots */
    int             nheld;
    int             queries;
    int             sent;
    bool            release;        /* answer the held queries */
    bool            stop;
};

/* The question's name as text (lower case) and where the question ends;
 * -1 if the message is not a query ferry's resolver sends. */
static int parse_question(const unsigned char *m, size_t len, char *name, int *qtype,
                          size_t *qend)
{
    size_t i = 12, o = 0;

    if (len < 12 || (m[2] & 0x80) || m[4] != 0 || m[5] != 1)
        return -1;
    while (i < len && m[i]) {
        size_t l = m[i++];

        if (l > 63 || i + l > len || o + l + 1 >= 256)
            return -1;
        if (o)
            name[o++] = '.';
        for (size_t k = 0; k < l; k++)
            name[o++] = (char)(m[i + k] >= 'A' && m[i + k] <= 'Z' ? m[i + k] + 32 : m[i + k]);
        i += l;
    }
    name[o] = 0;
    if (i + 5 > len)
        return -1;
    *qtype = m[i + 1] << 8 | m[i + 2];
    *qend = i + 5;
    return 0;
}

/* Build the reply to query `q` into `r`; its length.  Called with mu held. */
static size_t build_reply(struct fakedns *s, const unsigned char *q, size_t qlen,
                          unsigned char *r, bool from_hold, enum fakedns_act *act_out)
{
    char name[256];
    int qtype, rcode = 0, nans = 0;
    size_t qend, o;
    enum fakedns_act act = FAKEDNS_ANSWER;
    bool known = false, ruled = false;

    if (parse_question(q, qlen, name, &qtype, &qend) != 0)
        return 0;
    for (int i = 0; i < s->nrules; i++) {
        if (strcasecmp(s->rules[i].name, name) == 0 &&
            (s->rules[i].qtype == FAKEDNS_ANY || s->rules[i].qtype == qtype)) {
            act = s->rules[i].act;
            ruled = true;
        }
    }
    for (int i = 0; i < s->nrecords; i++)
        if (strcasecmp(s->records[i].name, name) == 0)
            known = true;
    if (from_hold && act == FAKEDNS_HOLD)
        act = FAKEDNS_ANSWER;
    *act_out = act;
    if (act == FAKEDNS_HOLD || act == FAKEDNS_DROP)
        return 0;
    if (act == FAKEDNS_NXDOMAIN || (!known && !ruled))
        rcode = 3;
    else if (act == FAKEDNS_SERVFAIL)
        rcode = 2;
    else if (act == FAKEDNS_REFUSED)
        rcode = 5;
    memcpy(r, q, qend);                       /* the header and the question as sent */
    r[2] = (unsigned char)(0x80 | (q[2] & 0x79));   /* QR, the opcode and RD of the query */
    if (act == FAKEDNS_TRUNCATE)
        r[2] |= 0x02;                         /* TC */
    r[3] = (unsigned char)(0x80 | rcode);     /* RA, rcode */
    memset(r + 6, 0, 6);                      /* ANCOUNT, NSCOUNT, ARCOUNT */
    o = qend;
    if (rcode == 0 && act != FAKEDNS_TRUNCATE) {
        for (int i = 0; i < s->nrecords; i++) {
            static const unsigned char more[12] = { 192, 0, 2, 1, 192, 0, 2, 2, 192, 0, 2, 3 };
            const struct record *rec = &s->records[i];
            size_t dl = rec->qtype == FAKEDNS_A ? 4 : 16;
            bool bad = act == FAKEDNS_BAD_RDLEN;

            if (rec->qtype != qtype || strcasecmp(rec->name, name) != 0)
                continue;
            if (bad)
                dl = rec->qtype == FAKEDNS_A ? 16 : 4;
            if (o + 12 + dl > MSG_MAX)
                break;
            r[o++] = 0xc0;                    /* a pointer to the question's name */
            r[o++] = 12;
            r[o++] = (unsigned char)(qtype >> 8);
            r[o++] = (unsigned char)qtype;
            r[o++] = 0;                       /* class IN */
            r[o++] = 1;
            r[o++] = 0;                       /* TTL 60 */
            r[o++] = 0;
            r[o++] = 0;
            r[o++] = 60;
            r[o++] = 0;
            r[o++] = (unsigned char)dl;
            if (bad && rec->qtype == FAKEDNS_A) {
                memcpy(r + o, rec->rdata, 4);
                memcpy(r + o + 4, more, sizeof more);
            } else {
                memcpy(r + o, rec->rdata, dl);
            }
            o += dl;
            nans++;
        }
    }
    r[6] = (unsigned char)(nans >> 8);
    r[7] = (unsigned char)nans;
    return o;
}

static void answer(struct fakedns *s, const unsigned char *q, size_t len,
                   const struct sockaddr_in *from, bool from_hold)
{
    unsigned char r[MSG_MAX];
    enum fakedns_act act;
    size_t rl;

    pthread_mutex_lock(&s->mu);
    rl = build_reply(s, q, len, r, from_hold, &act);
    if (act == FAKEDNS_HOLD && s->nheld < MAX_HELD) {
        struct held *h = &s->held[s->nheld++];
        memcpy(h->msg, q, len);
        h->len = len;
        h->from = *from;
    }
    pthread_mutex_unlock(&s->mu);
    if (rl && sendto(s->fd, r, rl, 0, (const struct sockaddr *)from, sizeof *from) > 0) {
        pthread_mutex_lock(&s->mu);
        s->sent++;
        pthread_mutex_unlock(&s->mu);
    }
}

static void *serve(void *arg)
{
    struct fakedns *s = arg;

    for (;;) {
        struct pollfd p[2] = { { .fd = s->fd, .events = POLLIN },
                               { .fd = s->wake[0], .events = POLLIN } };
        bool stop, release;

        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents) {
            char c[64];
            (void)read(s->wake[0], c, sizeof c);
        }
        pthread_mutex_lock(&s->mu);
        stop = s->stop;
        release = s->release;
        s->release = false;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        if (release) {
            struct held *h;
            int n;

            pthread_mutex_lock(&s->mu);
            n = s->nheld;
            s->nheld = 0;
            h = malloc((size_t)(n ? n : 1) * sizeof *h);
            if (h)
                memcpy(h, s->held, (size_t)n * sizeof *h);
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; h && i < n; i++)
                answer(s, h[i].msg, h[i].len, &h[i].from, true);
            free(h);
        }
        while (p[0].revents) {
            unsigned char q[MSG_MAX];
            struct sockaddr_in from;
            socklen_t fl = sizeof from;
            ssize_t n = recvfrom(s->fd, q, sizeof q, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);

            if (n <= 0)
                break;
            pthread_mutex_lock(&s->mu);
            s->queries++;
            pthread_mutex_unlock(&s->mu);
            answer(s, q, (size_t)n, &from, false);
        }
    }
    return NULL;
}

struct fakedns *fakedns_start(void)
{
    struct fakedns *s = calloc(1, sizeof *s);
    struct sockaddr_in sin;
    socklen_t len = sizeof sin;

    cr_assert_not_null(s);
    s->held = calloc(MAX_HELD, sizeof *s->held);
    cr_assert_not_null(s->held);
    pthread_mutex_init(&s->mu, NULL);
    s->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(s->fd, 0);
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(s->fd, (struct sockaddr *)&sin, sizeof sin), 0);
    cr_assert_eq(getsockname(s->fd, (struct sockaddr *)&sin, &len), 0);
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", ntohs(sin.sin_port));
    cr_assert_eq(pipe2(s->wake, O_CLOEXEC), 0);
    cr_assert_eq(pthread_create(&s->thread, NULL, serve, s), 0);
    return s;
}

static void poke(struct fakedns *s)
{
    (void)write(s->wake[1], "x", 1);
}

void fakedns_stop(struct fakedns *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_mutex_unlock(&s->mu);
    poke(s);
    pthread_join(s->thread, NULL);
    close(s->fd);
    close(s->wake[0]);
    close(s->wake[1]);
    pthread_mutex_destroy(&s->mu);
    free(s->held);
    free(s);
}

const char *fakedns_addr(const struct fakedns *s)
{
    return s->addr;
}

void fakedns_add(struct fakedns *s, const char *name, const char *addr)
{
    struct record *r;

    pthread_mutex_lock(&s->mu);
    cr_assert_lt(s->nrecords, MAX_RECORDS);
    r = &s->records[s->nrecords++];
    snprintf(r->name, sizeof r->name, "%s", name);
    if (inet_pton(AF_INET, addr, r->rdata) == 1)
        r->qtype = FAKEDNS_A;
    else if (inet_pton(AF_INET6, addr, r->rdata) == 1)
        r->qtype = FAKEDNS_AAAA;
    else
        cr_assert_fail("fakedns: not an address: %s", addr);
    pthread_mutex_unlock(&s->mu);
}

void fakedns_rule(struct fakedns *s, const char *name, int qtype, enum fakedns_act act)
{
    struct rule *r;

    pthread_mutex_lock(&s->mu);
    cr_assert_lt(s->nrules, MAX_RULES);
    r = &s->rules[s->nrules++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->qtype = qtype;
    r->act = act;
    pthread_mutex_unlock(&s->mu);
}

void fakedns_release(struct fakedns *s)
{
    pthread_mutex_lock(&s->mu);
    s->release = true;
    pthread_mutex_unlock(&s->mu);
    poke(s);
}

int fakedns_queries(struct fakedns *s)
{
    int n;

    pthread_mutex_lock(&s->mu);
    n = s->queries;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int fakedns_sent(struct fakedns *s)
{
    int n;

    pthread_mutex_lock(&s->mu);
    n = s->sent;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int fakedns_held(struct fakedns *s)
{
    int n;

    pthread_mutex_lock(&s->mu);
    n = s->nheld;
    pthread_mutex_unlock(&s->mu);
    return n;
}
