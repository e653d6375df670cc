/* redis_wake.c - the wake channel of a connection (redis_int.h): a
 * subscriber connection of its own, whose messages wake the tasks that
 * wait for something the server pushes.
 * Loop thread only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "ferry/redis.h"
#include "ferry/sync.h"
#include "redis_int.h"

#define WAKE_PREFIX "ferry-wake:"

/* The channel's name: the pid, a random number drawn once per thread and a
 * count, so that no two connections of any process share one. */
static __thread uint64_t wake_seed;
static __thread unsigned wake_count;

void ferry__redis_wake_init(ferry_redis *r)
{
    if (wake_seed == 0) {
        if (getrandom(&wake_seed, sizeof(wake_seed), 0) != sizeof(wake_seed))
            wake_seed = (uint64_t)ferry_now() ^ ((uint64_t)getpid() << 32);
        wake_seed |= 1;
    }
    snprintf(r->wake.id, sizeof(r->wake.id), "%ld.%016" PRIx64 ".%u", (long)getpid(), wake_seed,
             ++wake_count);
    r->wake.backoff = r->opts.retry_min;
}

void ferry__redis_wake_stop_timer(struct ferry__redis_wake *wk)
{
    if (wk->timer != NULL) {
        ferry_timer_cancel(wk->timer);
        wk->timer = NULL;
    }
}

/* Every registered waiter checks again: the channel came up (messages
 * before it were not seen) or was lost (messages from now on are not). */
static void wake_all(ferry_redis *r)
{
    for (struct ferry__redis_waiter *w = r->wake.first; w != NULL; w = w->next)
        ferry_event_set(w->ev);
}

static void wake_start(ferry_redis *r);

static void wake_retry(void *arg)
{
    ferry_redis *r = arg;

    r->wake.timer = NULL;
    if (r->wake.ac == NULL && r->wake.first != NULL)
        wake_start(r);
}

/* The subscriber is gone (its context is or is being freed): the next
 * attempt after the back-off, if waiters are still registered then. */
static void wake_lost(ferry_redis *r)
{
    struct ferry__redis_wake *wk = &r->wake;
    bool was_up = wk->up;

    wk->up = false;
    ferry__redis_wake_stop_timer(wk);
    if (r->closing)
        return;
    wk->retry_at = ferry_now() + wk->backoff;
    if (ferry_call_later(r->loop, wk->backoff, wake_retry, r, &wk->timer) != 0)
        wk->timer = NULL; /* the next registration tries again */
    wk->backoff = wk->backoff > r->opts.retry_max / 2 ? r->opts.retry_max : wk->backoff * 2;
    if (was_up)
        wake_all(r);
}

/* A message "VALUE TOKEN" for the waiter registered with TOKEN. */
static void wake_deliver(ferry_redis *r, const char *msg, size_t len)
{
    const char *sp = memchr(msg, ' ', len), *tok;
    char *end;
    long long v;
    size_t tlen;

    if (sp == NULL)
        return;
    v = strtoll(msg, &end, 10);
    if (end != sp || v <= 0)
        return;
    tok = sp + 1;
    tlen = len - (size_t)(tok - msg);
    for (struct ferry__redis_waiter *w = r->wake.first; w != NULL; w = w->next) {
        if (strlen(w->token) == tlen && memcmp(w->token, tok, tlen) == 0) {
            w->value = v;
            ferry_event_set(w->ev);
            return;
        }
    }
}

/* The channel's callback: the SUBSCRIBE's confirmation, then each message;
 * NULL when the context is freed. */
static void wake_on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    ferry_redis *r = priv;
    struct ferry__redis_wake *wk = &r->wake;
    redisReply *rep = reply;
    const char *kind;

    if (rep == NULL || wk->ac != ac || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING)
        return;
    kind = rep->element[0]->str;
    if (strcmp(kind, "subscribe") == 0 && !wk->up) {
        ferry__redis_wake_stop_timer(wk);
        wk->up = true;
        wk->epoch++;
        wk->backoff = r->opts.retry_min;
        wk->retry_at = 0;
        wake_all(r);
    } else if (strcmp(kind, "message") == 0 && rep->element[2]->type == REDIS_REPLY_STRING) {
        wake_deliver(r, rep->element[2]->str, rep->element[2]->len);
    }
}

static void wake_on_connect(const redisAsyncContext *ac, int status)
{
    ferry_redis *r = ac->data;

    /* A failed connect: hiredis frees the context after this. */
    if (status != REDIS_OK && r->wake.ac == ac) {
        r->wake.ac = NULL;
        wake_lost(r);
    }
}

static void wake_on_disconnect(const redisAsyncContext *ac, int status)
{
    ferry_redis *r = ac->data;

    (void)status;
    if (r->wake.ac == ac) {
        r->wake.ac = NULL;
        wake_lost(r);
    }
}

/* The subscription was not confirmed within opts.connect_timeout. */
static void wake_on_timeout(void *arg)
{
    ferry_redis *r = arg;
    redisAsyncContext *ac = r->wake.ac;

    r->wake.timer = NULL;
    if (ac == NULL || r->wake.up)
        return;
    r->wake.ac = NULL;
    wake_lost(r);
    redisAsyncFree(ac);
}

/* Connect the subscriber and send its SUBSCRIBE, which hiredis writes once
 * the connection is made. */
static void wake_start(ferry_redis *r)
{
    struct ferry__redis_wake *wk = &r->wake;
    char chan[sizeof(WAKE_PREFIX) + sizeof(wk->id)];
    redisAsyncContext *ac;

    ferry__redis_wake_stop_timer(wk);
    if (r->unix_path)
        ac = redisAsyncConnectUnix(r->host);
    else
        ac = redisAsyncConnect(r->host, r->port);
    if (ac == NULL) {
        wake_lost(r);
        return;
    }
    snprintf(chan, sizeof(chan), WAKE_PREFIX "%s", wk->id);
    if (ac->err || ferry__redis_io_attach(ac, r->loop, r->base) != 0)
        goto fail;
    ac->data = r;
    redisAsyncSetConnectCallback(ac, wake_on_connect);
    redisAsyncSetDisconnectCallback(ac, wake_on_disconnect);
    if (redisAsyncCommand(ac, wake_on_reply, r, "SUBSCRIBE %s", chan) != REDIS_OK)
        goto fail;
    if (ferry_call_later(r->loop, r->opts.connect_timeout, wake_on_timeout, r, &wk->timer) != 0) {
        wk->timer = NULL;
        goto fail;
    }
    wk->ac = ac;
    return;

fail:
    redisAsyncFree(ac);
    wake_lost(r);
}

const char *ferry__redis_wake_id(const ferry_redis *r)
{
    return r->wake.id;
}

void ferry__redis_wake_add(ferry_redis *r, struct ferry__redis_waiter *w)
{
    struct ferry__redis_wake *wk = &r->wake;

    w->next = NULL;
    w->prev = wk->last;
    if (wk->last != NULL)
        wk->last->next = w;
    else
        wk->first = w;
    wk->last = w;
}

void ferry__redis_wake_want(ferry_redis *r)
{
    struct ferry__redis_wake *wk = &r->wake;

    if (wk->ac == NULL && wk->timer == NULL && !r->closing && ferry_now() >= wk->retry_at)
        wake_start(r);
}

void ferry__redis_wake_del(ferry_redis *r, struct ferry__redis_waiter *w)
{
    struct ferry__redis_wake *wk = &r->wake;

    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        wk->first = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    else
        wk->last = w->prev;
    w->prev = w->next = NULL;
}

uint64_t ferry__redis_wake_epoch(const ferry_redis *r)
{
    return r->wake.up ? r->wake.epoch : 0;
}
