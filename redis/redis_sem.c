/* redis_sem.c - a semaphore (and lock) across processes on a Redis server:
 * FIFO waiters, leases renewed from the loop, fencing tokens.
 * Loop thread only.
 *
 * Every change of the shared state is one Lua script, so it is atomic on
 * the server, and every time in it is the server's (TIME): the clocks of
 * the processes never meet.  A script that frees a permit hands it to the
 * first waiter at once and tells it on its connection's wake channel
 * (redis_int.h); a waiter polls only as a heartbeat, and as a safety net
 * while that channel is not subscribed.  docs/redis.md gives the scripts'
 * logic.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "ferry/redis.h"
#include "ferry/sync.h"
#include "redis_int.h"
#include "redis_sem_lua.h"

#define DEFAULT_LEASE    FERRY_SEC(10)
#define DEFAULT_POLL_MIN FERRY_MSEC(5)
#define DEFAULT_POLL_MAX FERRY_MSEC(100)
#define MIN_LEASE        FERRY_MSEC(30)

enum { K_HOLDERS, K_QUEUE, K_ALIVE, K_TICKET, K_FENCE, K_FENCES, NKEYS };
static const char *const key_suffix[NKEYS] = {
    "holders", "queue", "alive", "ticket", "fence", "fences",
};


struct ferry_redis_sem {
    ferry_redis *r;            /* the connection; outlives the handle */
    char *keys[NKEYS];         /* "{key}:holders", ... */
    unsigned limit;            /* permits */
    ferry_redis_sem_opts opts; /* with the defaults filled in */
    char lease_ms[24];         /* opts.lease in ms, as text */
    char wttl_ms[24];          /* opts.waiter_ttl in ms, as text */
    char limit_s[16];          /* limit as text */
    char sha[41];              /* SHA1 of acquire_lua once loaded; "" before */
    char release_sha[41];      /* SHA1 of release_lua, loaded with it */
    ferry_event wake;          /* pulsed when a permit of this handle is released */
    size_t busy;               /* permits held and acquires under way */
};

struct ferry_redis_permit {
    ferry_redis_sem *s;        /* the semaphore */
    char token[64];            /* its name on the server */
    int64_t fence;             /* fencing token of the grant */
    int64_t lease_end;         /* local time before which the lease surely holds */
    int64_t lease_end_pending; /* lease_end if the renewal in flight succeeds */
    ferry_timer *timer;        /* the next renewal; NULL while one is in flight */
    bool renewing;             /* a renewal is in flight */
    bool released;             /* given back: the renewal in flight frees it */
    bool lost;                 /* a renewal found the lease gone */
};

/*
 * Unique tokens.  A waiter with a wake channel is "w" ID ":" N, which
 * names the channel ("ferry-wake:" ID) the scripts tell it on; one that
 * only polls is "p" PID "." RANDOM ":" N, drawn once per thread.
 */
static __thread uint64_t token_seed;
static __thread uint64_t token_count;

static void make_token(const ferry_redis_sem *s, char *buf, size_t n)
{
    if (!s->opts.poll_only) {
        snprintf(buf, n, "w%s:%" PRIu64, ferry__redis_wake_id(s->r), ++token_count);
        return;
    }
    if (token_seed == 0) {
        if (getrandom(&token_seed, sizeof(token_seed), 0) != sizeof(token_seed))
            token_seed = (uint64_t)ferry_now() ^ ((uint64_t)getpid() << 32);
        token_seed |= 1;
    }
    snprintf(buf, n, "p%ld.%016" PRIx64 ":%" PRIu64, (long)getpid(), token_seed, ++token_count);
}

static int64_t ms_of(int64_t ns)
{
    return ns / FERRY_MSEC(1);
}

static int check_opts(ferry_redis_sem_opts *o, const ferry_redis_sem_opts *in)
{
    if (in != NULL)
        *o = *in;
    else
        memset(o, 0, sizeof(*o));
    if (o->lease < 0 || o->poll_min < 0 || o->poll_max < 0 || o->waiter_ttl < 0)
        return -EINVAL;
    if (o->lease == 0)
        o->lease = DEFAULT_LEASE;
    if (o->poll_min == 0)
        o->poll_min = DEFAULT_POLL_MIN;
    if (o->poll_max == 0)
        o->poll_max = o->poll_min > DEFAULT_POLL_MAX ? o->poll_min : DEFAULT_POLL_MAX;
    if (o->waiter_ttl == 0)
        o->waiter_ttl = 4 * o->poll_max > FERRY_SEC(1) ? 4 * o->poll_max : FERRY_SEC(1);
    if (o->lease < MIN_LEASE || o->poll_max < o->poll_min || o->waiter_ttl < 2 * o->poll_max)
        return -EINVAL;
    return 0;
}

int ferry_redis_sem_new(ferry_redis_sem **out, ferry_redis *r, const char *key, unsigned limit,
                        const ferry_redis_sem_opts *opts)
{
    ferry_redis_sem *s;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (out == NULL || r == NULL || key == NULL || key[0] == '\0' || limit == 0)
        return -EINVAL;
    if (!ferry_loop_is_current(ferry__redis_loop(r)))
        return -EPERM;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return -ENOMEM;
    rc = check_opts(&s->opts, opts);
    for (int i = 0; rc == 0 && i < NKEYS; i++) {
        size_t n = strlen(key) + strlen(key_suffix[i]) + 4;

        s->keys[i] = malloc(n);
        if (s->keys[i] == NULL)
            rc = -ENOMEM;
        else
            snprintf(s->keys[i], n, "{%s}:%s", key, key_suffix[i]);
    }
    if (rc) {
        for (int i = 0; i < NKEYS; i++)
            free(s->keys[i]);
        free(s);
        return rc;
    }
    s->r = r;
    s->limit = limit;
    snprintf(s->lease_ms, sizeof(s->lease_ms), "%" PRId64, ms_of(s->opts.lease));
    snprintf(s->wttl_ms, sizeof(s->wttl_ms), "%" PRId64, ms_of(s->opts.waiter_ttl));
    snprintf(s->limit_s, sizeof(s->limit_s), "%u", limit);
    ferry_event_init(&s->wake);
    *out = s;
    return 0;
}

int ferry_redis_lock_new(ferry_redis_sem **out, ferry_redis *r, const char *key,
                         const ferry_redis_sem_opts *opts)
{
    return ferry_redis_sem_new(out, r, key, 1, opts);
}

int ferry_redis_sem_free(ferry_redis_sem *s)
{
    if (s == NULL)
        return 0;
    if (s->busy > 0)
        return -EBUSY;
    ferry_event_destroy(&s->wake);
    for (int i = 0; i < NKEYS; i++)
        free(s->keys[i]);
    free(s);
    return 0;
}

/* ---- Release and renewal (no waiting) ------------------------------------ */

static void ignore_reply(ferry_redis *r, redisReply *reply, void *arg)
{
    (void)r;
    (void)reply;
    (void)arg;
}

static bool is_noscript(const redisReply *rep)
{
    return rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0;
}

/*
 * The answer of a release sent by its SHA1.  `arg` holds its arguments
 * after the script (six keys, the token, the limit, each NUL-terminated),
 * copied because the handle may be freed by now: if the server has lost
 * the script (a restart, SCRIPT FLUSH), the release goes again as EVAL.
 */
static void on_release_answer(ferry_redis *r, redisReply *reply, void *arg)
{
    const char *argv[3 + NKEYS + 2] = { "EVAL", release_lua, "6" };
    const char *p = arg;

    if (reply != NULL && is_noscript(reply)) {
        for (int i = 3; i < 3 + NKEYS + 2; i++) {
            argv[i] = p;
            p += strlen(p) + 1;
        }
        ferry__redis_send_cb(r, 3 + NKEYS + 2, argv, NULL, ignore_reply, NULL);
    }
    free(arg);
}

/*
 * Send the release script for `token` without waiting for its answer: by
 * its SHA1 once the acquire has loaded it (EVAL would send the script's
 * text and have the server hash it, for every release), else as EVAL.
 */
static int send_release(ferry_redis_sem *s, const char *token)
{
    const char *argv[3 + NKEYS + 2] = {
        "EVAL",
        release_lua,
        "6",
        s->keys[K_HOLDERS],
        s->keys[K_QUEUE],
        s->keys[K_ALIVE],
        s->keys[K_TICKET],
        s->keys[K_FENCE],
        s->keys[K_FENCES],
        token,
        s->limit_s,
    };
    size_t len[3 + NKEYS + 2], n = 0;
    char *again;
    int rc;

    if (s->release_sha[0] == '\0')
        return ferry__redis_send_cb(s->r, 3 + NKEYS + 2, argv, NULL, ignore_reply, NULL);
    for (int i = 3; i < 3 + NKEYS + 2; i++) {
        len[i] = strlen(argv[i]) + 1;
        n += len[i];
    }
    again = malloc(n);
    if (again == NULL)
        return ferry__redis_send_cb(s->r, 3 + NKEYS + 2, argv, NULL, ignore_reply, NULL);
    n = 0;
    for (int i = 3; i < 3 + NKEYS + 2; i++) {
        memcpy(again + n, argv[i], len[i]);
        n += len[i];
    }
    argv[0] = "EVALSHA";
    argv[1] = s->release_sha;
    rc = ferry__redis_send_cb(s->r, 3 + NKEYS + 2, argv, NULL, on_release_answer, again);
    if (rc)
        free(again);
    return rc;
}

static void renew_due(void *arg);

static void arm_renewal(ferry_redis_permit *p, int64_t delay)
{
    if (ferry_call_later(ferry__redis_loop(p->s->r), delay, renew_due, p, &p->timer) != 0)
        p->timer = NULL;
}

/* The reply of a renewal: the lease extended from when it was sent, or
 * found gone. */
static void on_renewed(ferry_redis *r, redisReply *reply, void *arg)
{
    ferry_redis_permit *p = arg;

    (void)r;
    p->renewing = false;
    if (p->released) {
        free(p);
        return;
    }
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER) {
        if (reply->integer == 1) {
            p->lease_end = p->lease_end_pending;
        } else {
            p->lost = true;
            return;
        }
    }
    arm_renewal(p, p->s->opts.lease / 3);
}

static void renew_due(void *arg)
{
    ferry_redis_permit *p = arg;
    const char *argv[] = {
        "EVAL",   renew_lua,      "2", p->s->keys[K_HOLDERS], p->s->keys[K_FENCES],
        p->token, p->s->lease_ms,
    };

    p->timer = NULL;
    if (p->lost)
        return;
    if (ferry_now() >= p->lease_end) {
        p->lost = true;
        return;
    }
    p->lease_end_pending = ferry_now() + p->s->opts.lease;
    if (ferry__redis_send_cb(p->s->r, 7, argv, NULL, on_renewed, p) == 0)
        p->renewing = true;
    else
        arm_renewal(p, p->s->opts.lease / 3);
}

int ferry_redis_permit_release(ferry_redis_permit *p)
{
    ferry_redis_sem *s;
    int rc = 0;

    if (p == NULL)
        return -EINVAL;
    s = p->s;
    if (p->timer != NULL)
        ferry_timer_cancel(p->timer);
    p->timer = NULL;
    if (p->lost || ferry_now() >= p->lease_end)
        rc = -ESTALE;
    if (send_release(s, p->token) != 0 && rc == 0)
        rc = -ENOTCONN;
    s->busy--;
    /* Waiters of this handle that only poll do so at once: they come after
     * the release on the same connection.  (Waiters with a wake channel
     * wait on their own events: the release's script tells the one it
     * grants.) */
    ferry_event_set(&s->wake);
    ferry_event_clear(&s->wake);
    if (p->renewing)
        p->released = true;
    else
        free(p);
    return rc;
}

int64_t ferry_redis_permit_fence(const ferry_redis_permit *p)
{
    return p != NULL ? p->fence : 0;
}

bool ferry_redis_permit_held(const ferry_redis_permit *p)
{
    return p != NULL && !p->lost && ferry_now() < p->lease_end;
}

/* ---- Acquire -------------------------------------------------------------- */

/* SCRIPT LOAD `script` into sha[41]. */
static int load_one(ferry_redis_sem *s, const char *script, char *sha)
{
    redisReply *rep;
    int rc = ferry_redis_command(s->r, &rep, "SCRIPT LOAD %s", script);

    if (rc)
        return rc;
    if (rep->type == REDIS_REPLY_STRING && rep->len == 40)
        memcpy(sha, rep->str, 41);
    else
        rc = -EPROTO;
    ferry_redis_reply_free(rep);
    return rc;
}

static int load_script(ferry_redis_sem *s)
{
    int rc = load_one(s, release_lua, s->release_sha);

    return rc ? rc : load_one(s, acquire_lua, s->sha);
}

/* One poll: *fence > 0 if granted, 0 if still waiting. */
static int poll_once(ferry_redis_sem *s, const char *token, int64_t *fence)
{
    const char *argv[] = {
        "EVALSHA",
        s->sha,
        "6",
        s->keys[K_HOLDERS],
        s->keys[K_QUEUE],
        s->keys[K_ALIVE],
        s->keys[K_TICKET],
        s->keys[K_FENCE],
        s->keys[K_FENCES],
        token,
        s->limit_s,
        s->lease_ms,
        s->wttl_ms,
    };
    redisReply *rep;
    int rc;

    for (int tries = 0; tries < 2; tries++) {
        if (s->sha[0] == '\0') {
            rc = load_script(s);
            if (rc)
                return rc;
        }
        rc = ferry_redis_commandv(s->r, &rep, 13, argv, NULL);
        if (rc)
            return rc;
        if (rep->type == REDIS_REPLY_INTEGER) {
            *fence = rep->integer;
            ferry_redis_reply_free(rep);
            return 0;
        }
        /* The server lost its script cache (a restart): load it again. */
        rc = is_noscript(rep) ? -EAGAIN : -EPROTO;
        ferry_redis_reply_free(rep);
        if (rc != -EAGAIN)
            return rc;
        s->sha[0] = '\0';
    }
    return -EPROTO;
}

/*
 * Wait until `ev` is set or `interval` has passed, whichever comes first.
 * Returns 0 when it is time to look again, else the error that interrupts
 * the acquire.
 */
static int pause_between_polls(ferry_event *ev, int64_t interval)
{
    ferry_scope sc;
    bool fired;
    int rc;

    rc = ferry_scope_enter(&sc, ferry_now() + interval, 0);
    if (rc)
        return rc;
    rc = ferry_event_wait(ev);
    fired = ferry_scope_fired(&sc);
    ferry_scope_exit(&sc);
    if (rc == -ETIMEDOUT && fired)
        return 0;
    return rc;
}

/*
 * What a waiter with a wake channel does between polls.  Its poll is
 * "covered" when the channel was subscribed before the poll was sent and
 * has not been lost since: then every grant after the poll reaches it as a
 * message, and it polls only as a heartbeat, every poll_max.  Otherwise it
 * polls every poll_min, doubling up to poll_max, as a waiter without the
 * channel does.  Each change of the channel (subscribed, lost) sets the
 * waiter's event, and it polls again at once: after a subscription, to
 * find a grant whose message came before it; after a loss, to find one
 * whose message was lost with the connection.
 */
int ferry_redis_sem_acquire(ferry_redis_sem *s, ferry_redis_permit **out)
{
    struct ferry__redis_waiter w = { 0 };
    ferry_redis_permit *p;
    ferry_event ev;
    int64_t interval, fence = 0, sent, zero_sent = 0, wait;
    uint64_t epoch = 0;
    bool wake, covered = false, pushed = false;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (s == NULL || out == NULL)
        return -EINVAL;
    if (!ferry_loop_is_current(ferry__redis_loop(s->r)) || ferry_task_current() == NULL)
        return -EPERM;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    p->s = s;
    make_token(s, p->token, sizeof(p->token));
    wake = !s->opts.poll_only;
    ferry_event_init(&ev);
    w.token = p->token;
    w.ev = &ev;
    /* Registered before the first poll: a message that overtakes the
     * poll's answer is not lost. */
    if (wake)
        ferry__redis_wake_add(s->r, &w);
    s->busy++;
    interval = s->opts.poll_min;
    for (;;) {
        epoch = wake ? ferry__redis_wake_epoch(s->r) : 0;
        ferry_event_clear(&ev);
        sent = ferry_now();
        rc = poll_once(s, p->token, &fence);
        if (rc || fence > 0)
            break;
        zero_sent = sent;
        if (w.value > 0)
            break;
        if (epoch != 0 && epoch == ferry__redis_wake_epoch(s->r)) {
            covered = true;
            wait = s->opts.poll_max;
        } else {
            if (covered)
                interval = s->opts.poll_min; /* the channel was just lost */
            covered = false;
            wait = interval;
            interval = interval > s->opts.poll_max / 2 ? s->opts.poll_max : interval * 2;
            /* It has to wait: now it wants the channel. */
            if (wake)
                ferry__redis_wake_want(s->r);
        }
        rc = pause_between_polls(wake ? &ev : &s->wake, wait);
        if (rc || w.value > 0)
            break;
    }
    if (wake)
        ferry__redis_wake_del(s->r, &w);
    ferry_event_destroy(&ev);
    if (rc == 0 && fence == 0) {
        /* Granted by another's script: its lease runs until this waiter's
         * heartbeat would have, which the last poll answered 0 set. */
        fence = w.value;
        pushed = true;
    }
    if (rc) {
        /* Take the waiter (or a grant it has not learned of, which runs
         * before this on the server) off the server now. */
        send_release(s, p->token);
        s->busy--;
        free(p);
        return rc;
    }
    p->fence = fence;
    if (pushed) {
        /* Renewed early: this lease is as short as a heartbeat's. */
        int64_t delay = (zero_sent + s->opts.waiter_ttl - ferry_now()) / 2;

        p->lease_end = zero_sent + s->opts.waiter_ttl;
        arm_renewal(p, delay < 0 ? 0 : delay < s->opts.lease / 3 ? delay : s->opts.lease / 3);
    } else {
        p->lease_end = sent + s->opts.lease;
        arm_renewal(p, s->opts.lease / 3);
    }
    *out = p;
    return 0;
}
