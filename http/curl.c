/* curl.c - libcurl's multi_socket API on a ferry loop (ferry/curl.h),
 * an adapter on the kit of ferry/watch.h.
 * Loop thread only.
 *
 * One multi handle per loop, the watch's library: curl's socket callback
 * becomes ferry_watch_fd() / ferry_watch_fd_remove(), its timer callback
 * ferry_watch_timer(); the watch's ops call curl_multi_socket_action() and
 * then collect finished transfers.  None of these calls happens inside one
 * of curl's callbacks: the callbacks only record (the watch's promise),
 * and the driver and the tasks call curl only from the loop.  `in_curl`
 * marks the time spent inside curl, so that a user's callback that tries
 * to start a transfer is refused instead of re-entering curl.
 *
 * A transfer is a record on the performing task's stack, on the loop's
 * list of transfers while curl has it.  The task waits on the record's
 * ferry_watch_op.  A finished transfer is taken out of the multi handle by
 * the driver, which completes the op; a cancelled or timed out task takes
 * it out itself before returning, so curl never holds an easy handle
 * whose task has gone.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/curl.h"
#include "ferry/task.h"
#include "ferry/watch.h"

/* The key of the loop's watch (ferry_watch_get()). */
static const char loop_key;

/* One transfer in flight. */
struct xfer {
    struct xfer *prev, *next; /* on the loop's list */
    CURL *easy;               /* the caller's handle */
    CURLcode code;            /* curl's result, once done */
    ferry_watch_op op;        /* what the task waits on */
};

/* A loop's libcurl state. */
struct fcurl {
    CURLM *multi;       /* the loop's multi handle */
    ferry_watch *w;     /* its watch */
    struct xfer *xfers; /* transfers curl has, newest first */
    bool in_curl;       /* inside a curl_multi_* call */
};

/* ---- curl's callbacks: record only --------------------------------------- */

static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    struct fcurl *c = userp;
    int rc;

    (void)easy;
    (void)socketp;
    if (what == CURL_POLL_REMOVE)
        rc = ferry_watch_fd_remove(c->w, (int)s);
    else
        rc = ferry_watch_fd(c->w, (int)s,
                            (what & CURL_POLL_IN ? FERRY_READ : 0) |
                                (what & CURL_POLL_OUT ? FERRY_WRITE : 0));
    /* -1 makes curl fail the transfers on the socket, rather than leave
     * them waiting for readiness nobody watches. */
    return rc ? -1 : 0;
}

static int on_timer(CURLM *multi, long ms, void *userp)
{
    struct fcurl *c = userp;

    (void)multi;
    return ferry_watch_timer(c->w, ms < 0 ? -1 : FERRY_MSEC(ms)) ? -1 : 0;
}

/* ---- the driver ------------------------------------------------------------ */

static struct xfer *find(struct fcurl *c, CURL *easy)
{
    for (struct xfer *x = c->xfers; x; x = x->next)
        if (x->easy == easy)
            return x;
    return NULL;
}

static void unlink_xfer(struct fcurl *c, struct xfer *x)
{
    if (x->prev)
        x->prev->next = x->next;
    else
        c->xfers = x->next;
    if (x->next)
        x->next->prev = x->prev;
    x->prev = x->next = NULL;
}

/* Take finished transfers out of the multi handle and wake their tasks. */
static void collect(struct fcurl *c)
{
    CURLMsg *m;
    int left;

    while ((m = curl_multi_info_read(c->multi, &left)) != NULL) {
        struct xfer *x;

        if (m->msg != CURLMSG_DONE)
            continue;
        x = find(c, m->easy_handle);
        if (!x)
            continue;
        x->code = m->data.result;
        unlink_xfer(c, x);
        c->in_curl = true;
        curl_multi_remove_handle(c->multi, x->easy);
        c->in_curl = false;
        ferry_watch_progress(c->w);
        ferry_watch_op_done(&x->op, 0);
    }
}

static void drive(struct fcurl *c, curl_socket_t s, int ev_bitmask)
{
    int running;

    c->in_curl = true;
    curl_multi_socket_action(c->multi, s, ev_bitmask, &running);
    c->in_curl = false;
    collect(c);
}

static void op_ready(ferry_watch *w, int fd, int events, void *arg)
{
    (void)w;
    drive(arg, (curl_socket_t)fd,
          (events & FERRY_READ ? CURL_CSELECT_IN : 0) |
              (events & FERRY_WRITE ? CURL_CSELECT_OUT : 0));
}

static void op_timeout(ferry_watch *w, void *arg)
{
    (void)w;
    drive(arg, CURL_SOCKET_TIMEOUT, 0);
}

/* The loop is going: every task has ended, so no transfer is left. */
static void op_teardown(ferry_watch *w, void *arg)
{
    struct fcurl *c = arg;

    (void)w;
    c->in_curl = true;
    curl_multi_cleanup(c->multi);
    free(c);
}

static const ferry_watch_ops curl_ops = {
    .ready = op_ready,
    .timeout = op_timeout,
    .teardown = op_teardown,
};

/* The loop's state, made at first use.  Returns: 0; -ENOMEM. */
static int loop_state(ferry_loop *loop, struct fcurl **out)
{
    ferry_watch *w = ferry_watch_get(loop, &loop_key);
    struct fcurl *c;
    int rc;

    if (w) {
        *out = ferry_watch_arg(w);
        return 0;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->multi = curl_multi_init();
    if (!c->multi) {
        free(c);
        return -ENOMEM;
    }
    rc = ferry_watch_new(&c->w, loop, &loop_key, &curl_ops, c);
    if (rc) {
        curl_multi_cleanup(c->multi);
        free(c);
        return rc;
    }
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    *out = c;
    return 0;
}

int ferry_curl_multi(ferry_loop *loop, CURLM **out)
{
    struct fcurl *c;
    int rc;

    if (!out || !loop)
        return -EINVAL;
    if (!ferry_loop_is_current(loop))
        return -EPERM;
    rc = loop_state(loop, &c);
    if (rc)
        return rc;
    *out = c->multi;
    return 0;
}

static int mcode_errno(CURLMcode mc)
{
    switch (mc) {
    case CURLM_OK:
        return 0;
    case CURLM_OUT_OF_MEMORY:
        return -ENOMEM;
    case CURLM_ADDED_ALREADY:
        return -EBUSY;
    case CURLM_RECURSIVE_API_CALL:
        return -EDEADLK;
    default:
        return -EINVAL;
    }
}

int ferry_curl_perform(CURL *easy, CURLcode *code_out)
{
    ferry_loop *loop = ferry_loop_current();
    struct xfer x;
    struct fcurl *c;
    CURLMcode mc;
    int rc;

    if (code_out)
        *code_out = CURLE_OK;
    if (!easy)
        return -EINVAL;
    if (!loop || !ferry_task_current())
        return -EPERM;
    rc = loop_state(loop, &c);
    if (rc)
        return rc;
    if (c->in_curl || ferry_watch_busy(c->w))
        return -EDEADLK;
    /* A cancelled task does not start anything. */
    if (ferry_task_cancelled(ferry_task_current()))
        return -ECANCELED;
    memset(&x, 0, sizeof x);
    x.easy = easy;
    ferry_watch_op_init(&x.op);
    c->in_curl = true;
    mc = curl_multi_add_handle(c->multi, easy);
    c->in_curl = false;
    if (mc != CURLM_OK)
        return mcode_errno(mc);
    x.next = c->xfers;
    if (x.next)
        x.next->prev = &x;
    c->xfers = &x;
    rc = ferry_watch_op_wait(&x.op);
    if (rc) {
        /* Cancelled or timed out: out of curl now, before `x` goes. */
        unlink_xfer(c, &x);
        c->in_curl = true;
        curl_multi_remove_handle(c->multi, easy);
        c->in_curl = false;
        if (code_out)
            *code_out = CURLE_ABORTED_BY_CALLBACK;
        return rc;
    }
    if (code_out)
        *code_out = x.code;
    return x.code == CURLE_OK ? 0 : -EIO;
}

/* ---- bodies in memory ------------------------------------------------------ */

/* Where a body grows. */
struct sink {
    char *buf;  /* the bytes, room for a NUL */
    size_t len; /* bytes stored */
    size_t cap; /* bytes buf holds */
    bool nomem; /* a realloc failed: the transfer was stopped */
};

static size_t sink_write(char *data, size_t size, size_t nmemb, void *arg)
{
    struct sink *s = arg;
    size_t n = size * nmemb;

    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 1024;
        char *nb;

        while (cap < s->len + n + 1)
            cap *= 2;
        nb = realloc(s->buf, cap);
        if (!nb) {
            s->nomem = true;
            return 0; /* curl stops the transfer: CURLE_WRITE_ERROR */
        }
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    s->buf[s->len] = '\0';
    return n;
}

static int request(const char *url, const void *body, size_t len, const char *ctype,
                   ferry_curl_result *out, CURLcode *code_out)
{
    struct curl_slist *hdrs = NULL;
    struct sink s;
    char hbuf[256];
    CURL *easy;
    int rc;

    if (code_out)
        *code_out = CURLE_OK;
    if (!url || !out)
        return -EINVAL;
    memset(out, 0, sizeof *out);
    memset(&s, 0, sizeof s);
    easy = curl_easy_init();
    if (!easy)
        return -ENOMEM;
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        snprintf(hbuf, sizeof hbuf, "Content-Type: %s", ctype ? ctype : "application/octet-stream");
        hdrs = curl_slist_append(NULL, hbuf);
        if (!hdrs) {
            curl_easy_cleanup(easy);
            return -ENOMEM;
        }
        curl_easy_setopt(easy, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    }
    rc = ferry_curl_perform(easy, code_out);
    if (rc == -EIO && s.nomem)
        rc = -ENOMEM;
    if (rc == 0) {
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &out->status);
        if (!s.buf) {
            s.buf = malloc(1);
            if (!s.buf)
                rc = -ENOMEM;
            else
                s.buf[0] = '\0';
        }
    }
    if (rc == 0) {
        out->body = s.buf;
        out->len = s.len;
    } else {
        free(s.buf);
    }
    curl_easy_cleanup(easy);
    curl_slist_free_all(hdrs);
    return rc;
}

int ferry_curl_get(const char *url, ferry_curl_result *out, CURLcode *code_out)
{
    return request(url, NULL, 0, NULL, out, code_out);
}

int ferry_curl_post(const char *url, const void *body, size_t len, const char *content_type,
                    ferry_curl_result *out, CURLcode *code_out)
{
    return request(url, body ? body : "", len, content_type, out, code_out);
}

void ferry_curl_result_release(ferry_curl_result *r)
{
    if (!r)
        return;
    free(r->body);
    r->body = NULL;
    r->len = 0;
    r->status = 0;
}
