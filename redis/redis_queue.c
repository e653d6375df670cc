/* redis_queue.c - a durable work queue on a Redis stream and consumer
 * group (ferry/redis_queue.h), on the connection of redis.c.  Loop thread
 * only.
 *
 * Items a get or a reclaim received for a caller that gave up are kept in
 * the queue's stash and handed out by the next gets.  They are pending in
 * the group under this consumer on the server anyway, so the stash is only
 * a shortcut: losing it (the queue closed, the process gone) loses nothing
 * that a reclaim cannot find.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ferry/redis_queue.h"

/* The longest a blocking read waits on the server before the get asks
 * again.  A read whose end request was lost (the other connection was
 * down) holds the queue's connection no longer than this. */
#define BLOCK_MAX_MS 5000

struct ferry_redis_queue {
    ferry_redis *conn;       /* the caller's: puts, acks, reclaims */
    ferry_redis *bconn;      /* ours: blocking reads; NULL until made again */
    char *key;               /* the stream */
    char *group;             /* the consumer group */
    char *consumer;          /* this consumer's name in the group */
    ferry_redis_item *stash; /* items to hand out before new ones, oldest first */
    ferry_redis_item *stash_tail;
    char cursor[FERRY_REDIS_ID_MAX]; /* where the next reclaim scan starts */
    bool getting;                    /* a get is in progress */
    bool gave_up;                    /* a get gave up: its read's reply may still come */
    int *closed;                     /* set to 1 by close, when a get is in progress */
};

/*
 * XAUTOCLAIM, and the delivery count of every entry it claimed, in one
 * round trip: {next cursor, entries, counts}.
 */
static const char reclaim_lua[] =
    "local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], "
    "'COUNT', ARGV[5]) "
    "local n = {} "
    "for i, e in ipairs(r[2]) do "
    "  local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1) "
    "  if p[1] then n[i] = p[1][4] else n[i] = 1 end "
    "end "
    "return {r[1], r[2], n}";

/* ---- Items ------------------------------------------------------------ */

void ferry_redis_item_free(ferry_redis_item *item)
{
    free(item);
}

static bool is_str(const redisReply *r)
{
    return r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

/*
 * An item made of one stream entry of a reply ([id, [field, value, ...]]).
 * Returns: 0 and *out; -ENOENT (an entry with no fields: deleted while
 * pending); -EPROTO (not an entry); -ENOMEM.
 */
static int item_from_entry(const redisReply *e, int64_t deliveries, ferry_redis_item **out)
{
    const redisReply *fields, *val = NULL;
    ferry_redis_item *it;

    *out = NULL;
    if (e == NULL || e->type != REDIS_REPLY_ARRAY || e->elements != 2 || !is_str(e->element[0]) ||
        e->element[0]->len >= FERRY_REDIS_ID_MAX)
        return -EPROTO;
    fields = e->element[1];
    if (fields == NULL || fields->type != REDIS_REPLY_ARRAY || fields->elements < 2)
        return -ENOENT;
    for (size_t i = 0; i + 1 < fields->elements; i += 2) {
        if (is_str(fields->element[i]) && fields->element[i]->len == 1 &&
            fields->element[i]->str[0] == 'd') {
            val = fields->element[i + 1];
            break;
        }
    }
    if (val == NULL)
        val = fields->element[1];
    if (!is_str(val))
        return -EPROTO;
    it = malloc(sizeof(*it) + val->len + 1);
    if (it == NULL)
        return -ENOMEM;
    memset(it, 0, sizeof(*it));
    memcpy(it->id, e->element[0]->str, e->element[0]->len);
    it->deliveries = deliveries;
    it->len = val->len;
    it->data = (char *)(it + 1);
    memcpy(it->data, val->str, val->len);
    it->data[val->len] = '\0';
    *out = it;
    return 0;
}

static bool stashed(const ferry_redis_queue *q, const char *id)
{
    for (const ferry_redis_item *it = q->stash; it != NULL; it = it->next_) {
        if (strcmp(it->id, id) == 0)
            return true;
    }
    return false;
}

/* Keep `it` for the next gets; one already kept (a reclaim of an item a
 * late reply brought) is not kept twice. */
static void stash_push(ferry_redis_queue *q, ferry_redis_item *it)
{
    if (stashed(q, it->id)) {
        ferry_redis_item_free(it);
        return;
    }
    it->next_ = NULL;
    if (q->stash_tail != NULL)
        q->stash_tail->next_ = it;
    else
        q->stash = it;
    q->stash_tail = it;
}

static ferry_redis_item *stash_pop(ferry_redis_queue *q)
{
    ferry_redis_item *it = q->stash;

    if (it != NULL) {
        q->stash = it->next_;
        if (q->stash == NULL)
            q->stash_tail = NULL;
        it->next_ = NULL;
    }
    return it;
}

/* ---- Replies ------------------------------------------------------------ */

static bool is_error(const redisReply *r, const char *prefix)
{
    return r != NULL && r->type == REDIS_REPLY_ERROR &&
           strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/*
 * The entry of an XREADGROUP reply ([[key, [entry]]]), as an item, or
 * NULL in *out for a reply with no entry (nil: the read timed out or was
 * ended).
 * Returns: 0; -EPROTO; -ENOMEM.
 */
static int read_reply_item(const redisReply *rep, ferry_redis_item **out)
{
    const redisReply *streams, *entries;
    int rc;

    *out = NULL;
    if (rep->type == REDIS_REPLY_NIL)
        return 0;
    streams = rep;
    if (streams->type != REDIS_REPLY_ARRAY || streams->elements < 1 ||
        streams->element[0]->type != REDIS_REPLY_ARRAY || streams->element[0]->elements != 2)
        return -EPROTO;
    entries = streams->element[0]->element[1];
    if (entries->type != REDIS_REPLY_ARRAY)
        return -EPROTO;
    if (entries->elements == 0)
        return 0;
    rc = item_from_entry(entries->element[0], 1, out);
    /* An entry read as new always has fields. */
    return rc == -ENOENT ? -EPROTO : rc;
}

/*
 * Stash every item of a reclaim script's reply ({cursor, entries,
 * counts}) and keep its cursor.
 * Returns: the number of items stashed; -EPROTO; -ENOMEM (the items not
 * stashed stay pending under this consumer).
 */
static int stash_reclaimed(ferry_redis_queue *q, const redisReply *rep)
{
    const redisReply *entries, *counts;
    ferry_redis_item *it;
    int n = 0, rc;

    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 || !is_str(rep->element[0]) ||
        rep->element[0]->len >= FERRY_REDIS_ID_MAX || rep->element[1]->type != REDIS_REPLY_ARRAY ||
        rep->element[2]->type != REDIS_REPLY_ARRAY)
        return -EPROTO;
    memcpy(q->cursor, rep->element[0]->str, rep->element[0]->len);
    q->cursor[rep->element[0]->len] = '\0';
    entries = rep->element[1];
    counts = rep->element[2];
    for (size_t i = 0; i < entries->elements; i++) {
        int64_t deliveries = 1;

        if (i < counts->elements && counts->element[i]->type == REDIS_REPLY_INTEGER)
            deliveries = counts->element[i]->integer;
        rc = item_from_entry(entries->element[i], deliveries, &it);
        if (rc == -ENOENT)
            continue;
        if (rc)
            return rc;
        stash_push(q, it);
        n++;
    }
    return n;
}

/* The reply of a read whose get gave up: keep its item for the next get. */
static void late_read(ferry_redis *r, redisReply *reply, void *arg)
{
    ferry_redis_queue *q = arg;
    ferry_redis_item *it = NULL;

    (void)r;
    if (reply != NULL && read_reply_item(reply, &it) == 0 && it != NULL)
        stash_push(q, it);
}

/* ---- Open and close ------------------------------------------------------ */

static int check_q(const ferry_redis_queue *q)
{
    if (q == NULL)
        return -EINVAL;
    return 0;
}

/* Create the group (and the stream); one that exists already is fine. */
static int create_group(ferry_redis_queue *q)
{
    const char *argv[] = { "XGROUP", "CREATE", q->key, q->group, "0", "MKSTREAM" };
    redisReply *rep = NULL;
    int rc;

    rc = ferry_redis_commandv(q->conn, &rep, 6, argv, NULL);
    if (rc == 0 && rep->type == REDIS_REPLY_ERROR && !is_error(rep, "BUSYGROUP"))
        rc = -EPROTO;
    ferry_redis_reply_free(rep);
    return rc;
}

static char *default_consumer(void)
{
    char host[256], *name;
    size_t n;

    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    n = strlen(host) + 24;
    name = malloc(n);
    if (name != NULL)
        snprintf(name, n, "%s:%ld", host, (long)getpid());
    return name;
}

int ferry_redis_queue_open(ferry_redis_queue **out, ferry_redis *conn, const char *key,
                           const char *group, const char *consumer)
{
    ferry_redis_queue *q;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (out == NULL || conn == NULL || key == NULL || key[0] == '\0' || group == NULL ||
        group[0] == '\0' || (consumer != NULL && consumer[0] == '\0'))
        return -EINVAL;
    q = calloc(1, sizeof(*q));
    if (q == NULL)
        return -ENOMEM;
    q->conn = conn;
    snprintf(q->cursor, sizeof(q->cursor), "0-0");
    q->key = strdup(key);
    q->group = strdup(group);
    q->consumer = consumer != NULL ? strdup(consumer) : default_consumer();
    rc = q->key && q->group && q->consumer ? 0 : -ENOMEM;
    if (rc == 0)
        rc = create_group(q);
    if (rc == 0)
        rc = ferry_redis_connect_like(&q->bconn, conn);
    if (rc) {
        ferry_redis_queue_close(q);
        return rc;
    }
    *out = q;
    return 0;
}

void ferry_redis_queue_close(ferry_redis_queue *q)
{
    ferry_redis_item *it;

    if (q == NULL)
        return;
    /* A get waiting on the blocking connection gets -ESHUTDOWN from it
     * and must not touch q after that. */
    if (q->closed != NULL)
        *q->closed = 1;
    /* Late readers run (with no reply) before the stash is emptied. */
    ferry_redis_close(q->bconn);
    while ((it = stash_pop(q)) != NULL)
        ferry_redis_item_free(it);
    free(q->key);
    free(q->group);
    free(q->consumer);
    free(q);
}

/* ---- Put and ack ------------------------------------------------------- */

int ferry_redis_queue_put(ferry_redis_queue *q, const void *data, size_t len, size_t maxlen,
                          char id[FERRY_REDIS_ID_MAX])
{
    const char *argv[8];
    size_t lens[8];
    char maxbuf[24];
    redisReply *rep = NULL;
    int argc = 0, rc;

    if (id != NULL)
        id[0] = '\0';
    rc = check_q(q);
    if (rc)
        return rc;
    if (data == NULL && len > 0)
        return -EINVAL;
    argv[argc++] = "XADD";
    argv[argc++] = q->key;
    if (maxlen > 0) {
        snprintf(maxbuf, sizeof(maxbuf), "%zu", maxlen);
        argv[argc++] = "MAXLEN";
        argv[argc++] = "~";
        argv[argc++] = maxbuf;
    }
    argv[argc++] = "*";
    argv[argc++] = "d";
    argv[argc++] = data != NULL ? data : "";
    for (int i = 0; i < argc - 1; i++)
        lens[i] = strlen(argv[i]);
    lens[argc - 1] = len;
    rc = ferry_redis_commandv(q->conn, &rep, argc, argv, lens);
    if (rc)
        return rc;
    if (!is_str(rep) || rep->len >= FERRY_REDIS_ID_MAX)
        rc = -EPROTO;
    else if (id != NULL)
        snprintf(id, FERRY_REDIS_ID_MAX, "%s", rep->str);
    ferry_redis_reply_free(rep);
    return rc;
}

int ferry_redis_queue_ack(ferry_redis_queue *q, const char *id)
{
    redisReply *rep = NULL;
    int rc;

    rc = check_q(q);
    if (rc)
        return rc;
    if (id == NULL || id[0] == '\0')
        return -EINVAL;
    rc = ferry_redis_command(q->conn, &rep, "XACK %s %s %s", q->key, q->group, id);
    if (rc)
        return rc;
    if (rep->type != REDIS_REPLY_INTEGER)
        rc = -EPROTO;
    else if (rep->integer == 0)
        rc = -ENOENT;
    ferry_redis_reply_free(rep);
    return rc;
}

/* ---- Get --------------------------------------------------------------- */

/* Ask the server to end the read the queue's connection is blocked in,
 * through the other connection; without it (that one is down), drop the
 * blocking connection: the next get makes another. */
static void end_read(ferry_redis_queue *q)
{
    char idbuf[24];
    const char *argv[3] = { "CLIENT", "UNBLOCK", idbuf };
    int64_t cid = ferry_redis_client_id(q->bconn);

    snprintf(idbuf, sizeof(idbuf), "%lld", (long long)cid);
    if (cid == 0 || ferry_redis_send(q->conn, 3, argv, NULL) != 0) {
        ferry_redis_close(q->bconn);
        q->bconn = NULL;
    }
}

/*
 * One read of at most `block_ms` (-1: no BLOCK) on the queue's connection.
 * Returns: 0 and *item (NULL: none came; *nogroup: the server has no such
 * group); the errors of the command; -EPROTO; -ENOMEM.
 */
static int read_once(ferry_redis_queue *q, long long block_ms, ferry_redis_item **item,
                     bool *nogroup)
{
    char blockbuf[24];
    const char *argv[12];
    redisReply *rep = NULL;
    int argc = 0, rc;

    argv[argc++] = "XREADGROUP";
    argv[argc++] = "GROUP";
    argv[argc++] = q->group;
    argv[argc++] = q->consumer;
    argv[argc++] = "COUNT";
    argv[argc++] = "1";
    if (block_ms >= 0) {
        snprintf(blockbuf, sizeof(blockbuf), "%lld", block_ms);
        argv[argc++] = "BLOCK";
        argv[argc++] = blockbuf;
    }
    argv[argc++] = "STREAMS";
    argv[argc++] = q->key;
    argv[argc++] = ">";
    rc = ferry_redis_commandv_late(q->bconn, &rep, argc, argv, NULL, late_read, q);
    if (rc)
        return rc;
    if (is_error(rep, "NOGROUP"))
        *nogroup = true;
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = -EPROTO;
    else
        rc = read_reply_item(rep, item);
    ferry_redis_reply_free(rep);
    return rc;
}

/* Milliseconds left until `deadline`, rounded up, at most BLOCK_MAX_MS. */
static long long ms_left(int64_t deadline)
{
    int64_t left = deadline - ferry_now();
    long long ms;

    if (left <= 0)
        return 0;
    ms = (long long)((left + FERRY_MSEC(1) - 1) / FERRY_MSEC(1));
    return ms > BLOCK_MAX_MS ? BLOCK_MAX_MS : ms;
}

static int get_loop(ferry_redis_queue *q, ferry_redis_item **item, int64_t timeout,
                    const int *closed)
{
    int64_t deadline = timeout > 0 ? ferry_now() + timeout : 0;
    /* After a get that gave up, the first read does not block: its reply
     * comes after the old read's (one connection answers in order), so
     * an item the old read brought is in the stash by then and is handed
     * out without waiting for the new read's timeout. */
    bool peek = q->gave_up;
    bool recreated = false;
    long long block;
    int rc;

    for (;;) {
        bool nogroup = false;

        if (q->bconn == NULL) {
            ferry_redis *b = NULL;

            rc = ferry_redis_connect_like(&b, q->conn);
            if (*closed) {
                ferry_redis_close(b);
                return -ESHUTDOWN;
            }
            if (rc)
                return rc;
            q->bconn = b;
        }
        q->gave_up = false;
        if (peek || timeout == 0) {
            block = -1;
        } else if (timeout < 0) {
            block = BLOCK_MAX_MS;
        } else {
            block = ms_left(deadline);
            if (block == 0)
                return -EAGAIN;
        }
        rc = read_once(q, block, item, &nogroup);
        if (*closed)
            return -ESHUTDOWN;
        if (rc == -ECANCELED || rc == -ETIMEDOUT) {
            q->gave_up = true;
            end_read(q);
            return rc;
        }
        if (rc)
            return rc;
        /* The reply of an earlier get's read may have come meanwhile:
         * its item is older and goes first. */
        if (*item != NULL && q->stash != NULL) {
            stash_push(q, *item);
            *item = NULL;
        }
        if (*item == NULL)
            *item = stash_pop(q);
        if (*item != NULL)
            return 0;
        if (nogroup) {
            /* The server lost the group (restarted without its data):
             * make it again, once. */
            if (recreated)
                return -EPROTO;
            recreated = true;
            rc = create_group(q);
            if (*closed)
                return -ESHUTDOWN;
            if (rc)
                return rc;
            continue;
        }
        if (timeout == 0)
            return -EAGAIN;
        peek = false;
        /* A nil reply before the deadline: the read was ended for an
         * earlier get that gave up, or it reached BLOCK_MAX_MS. */
    }
}

int ferry_redis_queue_get(ferry_redis_queue *q, ferry_redis_item **item, int64_t timeout)
{
    int closed = 0, rc;

    if (item != NULL)
        *item = NULL;
    rc = check_q(q);
    if (rc)
        return rc;
    if (item == NULL)
        return -EINVAL;
    if (ferry_task_current() == NULL)
        return -EPERM;
    *item = stash_pop(q);
    if (*item != NULL)
        return 0;
    if (q->getting)
        return -EBUSY;
    q->getting = true;
    q->closed = &closed;
    rc = get_loop(q, item, timeout, &closed);
    if (!closed) {
        q->getting = false;
        q->closed = NULL;
    }
    return rc;
}

/* ---- Reclaim ----------------------------------------------------------- */

int ferry_redis_queue_reclaim(ferry_redis_queue *q, int64_t min_idle, int max)
{
    char idlebuf[24], countbuf[16];
    const char *argv[9];
    redisReply *rep = NULL;
    int rc, total = 0;

    rc = check_q(q);
    if (rc)
        return rc;
    if (max < 1 || min_idle < 0)
        return -EINVAL;
    snprintf(idlebuf, sizeof(idlebuf), "%lld", (long long)(min_idle / FERRY_MSEC(1)));
    snprintf(countbuf, sizeof(countbuf), "%d", max);
    /* Scan the pending list from where the last reclaim stopped, going on
     * while nothing is taken, up to its end: a long run of items still
     * being processed does not hide idle ones behind it.  A reclaim
     * whose caller gives up leaves what it took pending under this
     * consumer, for a later reclaim. */
    for (int pass = 0; pass < 1000; pass++) {
        argv[0] = "EVAL";
        argv[1] = reclaim_lua;
        argv[2] = "1";
        argv[3] = q->key;
        argv[4] = q->group;
        argv[5] = q->consumer;
        argv[6] = idlebuf;
        argv[7] = q->cursor;
        argv[8] = countbuf;
        rc = ferry_redis_commandv(q->conn, &rep, 9, argv, NULL);
        if (rc)
            return rc;
        if (rep->type == REDIS_REPLY_ERROR)
            rc = -EPROTO;
        else
            rc = stash_reclaimed(q, rep);
        ferry_redis_reply_free(rep);
        rep = NULL;
        if (rc < 0)
            return rc;
        total += rc;
        if (total > 0 || strcmp(q->cursor, "0-0") == 0)
            break;
    }
    return total;
}
