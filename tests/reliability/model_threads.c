/* model_threads.c - what the model-based tester's driver does besides
 * commands: timers and their cancellation, callbacks posted from a thread
 * (D_POST), the channel thread (D_CHT), and the driver's wait for the loop
 * to poll (D_WAIT).  See model.h and model_driver.c.
 *
 * The loop thread, and the poster and channel threads, which hand over
 * under their mutexes.
 */
#include "model_int.h"

/* Add a timer or post on both sides; NULL when the sequence has its fill. */
static struct rcb *cb_new(struct seq *s, bool timer, bool far, int act, int sel)
{
    struct mcb *mc;
    struct rcb *c;

    if (s->m.ncb >= MAXCB)
        return NULL;
    mc = &s->m.cb[s->m.ncb];
    c = &s->cb[s->m.ncb];
    memset(mc, 0, sizeof *mc);
    memset(c, 0, sizeof *c);
    mc->timer = timer;
    mc->far = far;
    mc->act = act;
    mc->sel = sel;
    mc->val = act == A_Q_PUT ? ++s->put_counter : 0;
    mc->target = -1;
    c->s = s;
    c->i = s->m.ncb++;
    c->target = -1;
    return c;
}

/* D_TIMER: ferry_call_later(), due at the next poll (delay 0 or below) or
 * an hour away (it never fires: it is cancelled, here or at teardown). */
void model__op_timer(struct seq *s, const struct op *o)
{
    bool far = o->arg & 1;
    int64_t delay = far ? FERRY_SEC(3600) : (o->arg & 2) ? -1 : 0;
    struct rcb *c = cb_new(s, true, far, o->act, o->sel);
    int rc;

    if (!c)
        return;
    model__trace_op(s, o, c->i);
    rc = ferry_call_later(s->loop, delay, model__cb_main, c, &c->h);
    if (rc) {
        model__failf(s, "call_later: %d", rc);
        return;
    }
    c->pending = true;
    s->m.cb[c->i].pending = true;
}

/* D_TCANCEL: ferry_timer_cancel() of a timer that has not run. */
void model__op_tcancel(struct seq *s, const struct op *o)
{
    int ids[MAXCB], n = 0, i, rc;
    struct rcb *c;

    for (i = 0; i < s->m.ncb; i++)
        if (s->m.cb[i].timer && s->m.cb[i].pending)
            ids[n++] = i;
    if (!n)
        return;
    c = &s->cb[ids[o->actor % n]];
    model__trace_op(s, o, c->i);
    if (!c->pending || !c->h) {
        model__failf(s, "timer %d: ran or was cancelled, model says pending", c->i);
        return;
    }
    rc = ferry_timer_cancel(c->h);
    if (rc)
        model__failf(s, "timer_cancel: %d", rc);
    c->pending = false;
    c->h = NULL;
    s->m.cb[c->i].pending = false;
}

/*
 * The thread that posts: one for the process.  D_POST queues its
 * callbacks and goes on; the thread posts them while the loop runs.  The
 * loop polls only in the driver's wait, which first waits until every
 * queued callback has been posted (model__poster_flush()), so that all of them
 * are in the inbox at that poll.
 */
static struct {
    pthread_t        th;
    bool             up;
    pthread_mutex_t  mu;
    pthread_cond_t   work;             /* signalled when a callback is queued */
    pthread_cond_t   done;             /* broadcast when `posted` grows */
    struct rcb      *q[MAXCB];         /* mu: queued, not posted yet */
    int              qn;               /* mu */
    unsigned long    queued, posted;   /* mu: totals */
} poster = { .mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER,
             .done = PTHREAD_COND_INITIALIZER };

static void *poster_main(void *arg)
{
    struct rcb *q[MAXCB];
    int n, k;

    (void)arg;
    pthread_mutex_lock(&poster.mu);
    for (;;) {
        while (!poster.qn)
            pthread_cond_wait(&poster.work, &poster.mu);
        n = poster.qn;
        memcpy(q, poster.q, sizeof(q[0]) * (size_t)n);
        poster.qn = 0;
        pthread_mutex_unlock(&poster.mu);
        for (k = 0; k < n; k++)
            q[k]->post_rc = ferry_loop_call_soon_threadsafe(q[k]->s->loop, model__cb_main, q[k]);
        pthread_mutex_lock(&poster.mu);
        poster.posted += (unsigned long)n;
        pthread_cond_broadcast(&poster.done);
    }
    return NULL;
}

/* Wait until every queued callback has been posted; check what
 * ferry_loop_call_soon_threadsafe() returned for those of `s`. */
void model__poster_flush(struct seq *s)
{
    int i;

    if (!poster.up)
        return;
    pthread_mutex_lock(&poster.mu);
    while (poster.posted != poster.queued)
        pthread_cond_wait(&poster.done, &poster.mu);
    pthread_mutex_unlock(&poster.mu);
    for (i = 0; s && i < s->m.ncb; i++)
        if (s->cb[i].post_rc) {
            model__failf(s, "post %d: call_soon_threadsafe returned %d", i, s->cb[i].post_rc);
            s->cb[i].post_rc = 0;
        }
}

/* D_POST: 1 to 3 callbacks posted from another thread.  They run at the
 * loop's next poll, in the driver's next wait. */
void model__op_post(struct seq *s, const struct op *o)
{
    int n = 1 + o->arg % 3, k;

    if (!poster.up) {
        if (pthread_create(&poster.th, NULL, poster_main, NULL)) {
            model__failf(s, "cannot start the posting thread");
            return;
        }
        pthread_detach(poster.th);
        poster.up = true;
    }
    model__trace_op(s, o, -1);
    for (k = 0; k < n; k++) {
        struct rcb *c = cb_new(s, false, false, (o->act + k) % NACT, o->sel + 7 * k);
        if (!c)
            break;
        c->pending = true;
        s->m.cb[c->i].pending = true;
        pthread_mutex_lock(&poster.mu);
        poster.q[poster.qn++] = c;
        poster.queued++;
        pthread_cond_signal(&poster.work);
        pthread_mutex_unlock(&poster.mu);
    }
}

/*
 * The channel thread: one for the process.  D_CHT hands it one operation
 * on a channel and waits until it is done, so the loop's thread does
 * nothing meanwhile and the outcome depends on the sequence alone.  A
 * task it wakes is woken through the loop's inbox, which the loop drains
 * only when it polls, in the driver's next wait.
 */
static struct {
    pthread_t        th;
    bool             up;
    pthread_mutex_t  mu;
    pthread_cond_t   go;               /* signalled when an operation is handed over */
    pthread_cond_t   done;             /* signalled when it is done */
    bool             busy;             /* mu: an operation handed over, not done */
    ferry_chan      *ch;               /* mu: the operation */
    int              kind, val;
    int              rc, got;          /* mu: its outcome */
} chthr = { .mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER,
            .done = PTHREAD_COND_INITIALIZER };

static void *chthr_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&chthr.mu);
    for (;;) {
        ferry_chan *ch;
        int kind, v, got = -1, rc;

        while (!chthr.busy)
            pthread_cond_wait(&chthr.go, &chthr.mu);
        ch = chthr.ch;
        kind = chthr.kind;
        v = chthr.val;
        pthread_mutex_unlock(&chthr.mu);
        /* What a thread that feeds or drains a channel calls; 0: do not
         * wait. */
        if (kind == CT_SEND)
            rc = ferry_chan_send_elem_blocking(ch, &v, 0);
        else if (kind == CT_RECV)
            rc = ferry_chan_recv_elem_blocking(ch, &got, 0);
        else
            rc = ferry_chan_close(ch);
        pthread_mutex_lock(&chthr.mu);
        chthr.rc = rc;
        chthr.got = got;
        chthr.busy = false;
        pthread_cond_signal(&chthr.done);
    }
    return NULL;
}

/* Run one operation on the channel thread and wait for it: its return
 * code, and in *got the item a receive took. */
static int chthr_run(struct seq *s, ferry_chan *ch, int kind, int val, int *got)
{
    int rc;

    if (!chthr.up) {
        if (pthread_create(&chthr.th, NULL, chthr_main, NULL)) {
            model__failf(s, "cannot start the channel thread");
            return -EAGAIN;
        }
        pthread_detach(chthr.th);
        chthr.up = true;
    }
    pthread_mutex_lock(&chthr.mu);
    chthr.ch = ch;
    chthr.kind = kind;
    chthr.val = val;
    chthr.busy = true;
    pthread_cond_signal(&chthr.go);
    while (chthr.busy)
        pthread_cond_wait(&chthr.done, &chthr.mu);
    rc = chthr.rc;
    *got = chthr.got;
    pthread_mutex_unlock(&chthr.mu);
    return rc;
}

/* D_CHT: the channel thread sends a new item to, receives from, or closes
 * channel arg2 % NCH, on both sides; the outcomes must agree at once. */
void model__op_cht(struct seq *s, const struct op *o)
{
    struct model *m = &s->m;
    int k = o->arg2 % NCH, kind = cht_kind(o->arg), val = 0, got = -1, rc, mrc = 0, mval = -1;

    if (kind == CT_SEND)
        val = ++s->put_counter;
    model__trace_op(s, o, k);
    rc = chthr_run(s, s->ch[k], kind, val, &got);
    switch (kind) {
    case CT_SEND:
        if (m->ch[k].closed)
            mrc = -ESHUTDOWN;
        else if (m->ch[k].n == m->cfg.chcap)
            mrc = -EAGAIN;
        else
            model__mch_put(m, k, val, true);
        if (rc == 0)
            model__r_ch_sent(s, k, val);
        break;
    case CT_RECV:
        if (m->ch[k].n > 0)
            mval = model__mch_take(m, k, true);
        else
            mrc = m->ch[k].closed ? -ESHUTDOWN : -EAGAIN;
        if (rc == 0)
            model__r_ch_got(s, k, got);
        else
            got = -1;
        break;
    default:
        model__mch_close(m, k, true);
        break;
    }
    if (s->trace)
        fprintf(s->trace, "    channel thread: %s -> %d (val %d)\n",
                kind == CT_SEND ? "send" : kind == CT_RECV ? "recv" : "close", rc,
                kind == CT_SEND ? val : got);
    if (rc != mrc || (kind == CT_RECV && got != mval))
        model__failf(s, "channel thread: %s on channel %d returned %d (val %d), model %d (val %d)",
              kind == CT_SEND ? "send" : kind == CT_RECV ? "recv" : "close", k, rc,
              kind == CT_SEND ? val : got, mrc, kind == CT_SEND ? val : mval);
}

/* Callbacks or completions (the channel thread's wakes) in the loop's
 * inbox, not run yet. */
static bool r_inbox_pending(struct seq *s)
{
    return s->loop->hooks.pending && s->loop->hooks.pending(s->loop->hooks.ctx);
}

/* Anything the driver's wait is for: a post or a due timer not run, a
 * wake in the inbox, an actor inside a short sleep (real side). */
bool model__r_wait_pending(struct seq *s, int64_t *until)
{
    bool any = r_inbox_pending(s);
    int i;

    *until = 0;
    for (i = 0; i < s->m.ncb; i++)
        if (s->cb[i].pending && !s->m.cb[i].far)
            any = true;
    for (i = 0; i < s->na; i++)
        if (s->r[i].in_sleep && s->r[i].cmd.arg % 3 == SL_SHORT) {
            any = true;
            if (s->r[i].sleep_until > *until)
                *until = s->r[i].sleep_until;
        }
    return any;
}

/*
 * D_WAIT: the driver sleeps, so the loop runs what is ready and then
 * polls: posted callbacks run, due timers fire, short sleeps end.  It
 * sleeps until the latest short sleep's deadline, again while anything is
 * left (a sleep whose deadline has passed only yields, without a poll),
 * and gives up after 10 s of it: a callback that never runs is a failure,
 * not a hang.  Then what they woke runs to the end.  See model__m_wait().
 */
void model__op_wait(struct seq *s, const struct op *o)
{
    int64_t give_up = ferry_now() + FERRY_SEC(10), until, margin = FERRY_USEC(1);
    bool first = true;

    model__trace_op(s, o, -1);
    model__poster_flush(s);
    for (;;) {
        bool left = model__r_wait_pending(s, &until);

        if (!left && !first)
            break;
        first = false;
        if (ferry_now() > give_up) {
            s->stuck = true;
            model__failf(s, "wait: a post, a due timer or a short sleep did not end in 10 s");
            return;
        }
        /* A deadline that has passed by the time ferry_sleep_until() looks
         * makes it yield without a poll (under valgrind a microsecond
         * does): the margin doubles until the loop polls. */
        if (until < ferry_now() + margin)
            until = ferry_now() + margin;
        if (margin < FERRY_MSEC(1))
            margin *= 2;
        ferry_sleep_until(until);
    }
    while (!model__runq_empty(s->loop))
        ferry_yield();
    model__m_wait(&s->m);
}
