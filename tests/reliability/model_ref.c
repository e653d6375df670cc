/* model_ref.c - the reference model (m_*): a sequential simulation of
 * tasks, a FIFO run queue and every primitive, written from the header
 * contracts.  The driver (model_driver.c) runs each operation on it and on
 * the real loop and compares.  See model.h.
 */
#include "model_int.h"

static void rq_push(struct model *m, int id)
{
    m->rq[(m->rqh + m->rqn) % 64] = id;
    m->rqn++;
}

static int rq_pop(struct model *m)
{
    int id = m->rq[m->rqh];
    m->rqh = (m->rqh + 1) % 64;
    m->rqn--;
    return id;
}

static void wq_push(struct model *m, int q, int id)
{
    m->wq[q][m->wqn[q]++] = id;
}

static void wq_del(struct model *m, int q, int id)
{
    int i, j;

    for (i = 0; i < m->wqn[q]; i++)
        if (m->wq[q][i] == id) {
            for (j = i; j + 1 < m->wqn[q]; j++)
                m->wq[q][j] = m->wq[q][j + 1];
            m->wqn[q]--;
            return;
        }
}

static int wq_first(const struct model *m, int q)
{
    return m->wqn[q] ? m->wq[q][0] : -1;
}

/* Remove `x` from the ordered array v[0..*n), if it is there. */
static void ids_del(int *v, int *n, int x)
{
    int i, j;

    for (i = 0; i < *n; i++)
        if (v[i] == x) {
            for (j = i; j + 1 < *n; j++)
                v[j] = v[j + 1];
            (*n)--;
            return;
        }
}

void model__m_ready(struct model *m, int id)
{
    m->a[id].st = M_READY;
    rq_push(m, id);
}

/* ferry__grant(). */
bool model__m_grant(struct model *m, int id, int res)
{
    struct mact *a = &m->a[id];

    if (a->st != M_WAIT || a->wstate != WS_WAITING)
        return false;
    if (a->wq)
        wq_del(m, a->wq, id);
    a->wq = WQ_NONE;
    a->wstate = WS_GRANTED;
    a->wres = res;
    model__m_ready(m, id);
    return true;
}

/* The wait queue of a select case on a loop primitive. */
static int sel_wq(int kind)
{
    return kind == SK_GET ? WQ_QGET : kind == SK_PUT ? WQ_QPUT : WQ_EV;
}

static const int *m_sel_cases(const struct model *m, int id)
{
    return model__sel_pair(m->fmt, m->a[id].cmd.arg);
}

static struct mnode *m_node(struct model *m, int nd)
{
    return &m->a[nd / ND_PER].nd[nd % ND_PER];
}

/* ferry__sel_grant(): case i of actor id's select is granted.  It wins:
 * its siblings that still wait become idle (a loop primitive's waiter
 * leaves its queue, a channel's node stays in its channel's queue), and
 * the task is made ready unless a cancel or deadline did that already. */
static void m_sel_grant(struct model *m, int id, int i, int res)
{
    struct mact *a = &m->a[id];
    const int *k = m_sel_cases(m, id);
    int j;

    a->sel_cw[i] = WS_GRANTED;
    if (!sk_chan(k[i]))
        wq_del(m, sel_wq(k[i]), id);
    a->sel_won = i;
    a->sel_wres = res;
    for (j = 0; j < 2; j++) {
        if (j == i || a->sel_cw[j] != WS_WAITING)
            continue;
        if (!sk_chan(k[j]))
            wq_del(m, sel_wq(k[j]), id);
        a->sel_cw[j] = WS_IDLE;
    }
    if (a->st == M_WAIT && a->wstate == WS_WAITING) {
        a->wstate = WS_GRANTED;
        a->wres = 0;
        model__m_ready(m, id);
    }
}

/* ferry__grant() of the first waiter of queue `q`, actor id: a select's
 * case wins its select (m_sel_grant()). */
static bool m_grant_q(struct model *m, int q, int id, int res)
{
    struct mact *a = &m->a[id];
    const int *k;
    int i;

    if (!a->sel_on)
        return model__m_grant(m, id, res);
    k = m_sel_cases(m, id);
    for (i = 0; i < 2; i++)
        if (!sk_chan(k[i]) && sel_wq(k[i]) == q && a->sel_cw[i] == WS_WAITING) {
            m_sel_grant(m, id, i, res);
            return true;
        }
    return false;
}

/* ---- channels ---------------------------------------------------------- */

bool model__mch_ready(const struct model *m, int k, bool send)
{
    const struct mchan *c = &m->ch[k];

    return c->closed || (send ? c->n < m->cfg.chcap : c->n > 0);
}

/* A wake reaches node `nd` (deliver() of task_wake.c): the waiter the node
 * holds now is granted if it waits: the task's own (a channel command, or
 * a settle), or a select's case. */
static void m_deliver(struct model *m, int nd)
{
    struct mnode *n = m_node(m, nd);
    int id = nd / ND_PER, slot = nd % ND_PER;
    struct mact *a = &m->a[id];

    n->delivered = true;
    if (n->settling || slot == ND_PARK)
        model__m_grant(m, id, 0);
    else if (a->sel_on && a->sel_cw[slot - ND_SEL0] == WS_WAITING)
        m_sel_grant(m, id, slot - ND_SEL0, 0);
}

/* wake_one_locked(): the first node of a side's queue is taken out and
 * woken: at once on the loop's thread, through the inbox from the channel
 * thread. */
static void mch_wake_one(struct model *m, int k, bool receivers, bool thread)
{
    struct mchan *c = &m->ch[k];
    int *q = receivers ? c->recvq : c->sendq, *n = receivers ? &c->nrecv : &c->nsend, nd;

    if (*n == 0)
        return;
    nd = q[0];
    ids_del(q, n, nd);
    m_node(m, nd)->linked = false;
    m_node(m, nd)->fired = true;
    if (thread)
        m->inbox[m->ninbox++] = nd;
    else
        m_deliver(m, nd);
}

void model__mch_put(struct model *m, int k, int v, bool thread)
{
    struct mchan *c = &m->ch[k];

    c->items[c->n++] = v;
    mch_wake_one(m, k, true, thread);
}

int model__mch_take(struct model *m, int k, bool thread)
{
    struct mchan *c = &m->ch[k];
    int v = c->items[0], i;

    for (i = 0; i + 1 < c->n; i++)
        c->items[i] = c->items[i + 1];
    c->n--;
    mch_wake_one(m, k, false, thread);
    return v;
}

/* ferry_chan_close(): every node of both sides is woken. */
void model__mch_close(struct model *m, int k, bool thread)
{
    struct mchan *c = &m->ch[k];

    if (c->closed)
        return;
    c->closed = true;
    while (c->nrecv)
        mch_wake_one(m, k, true, thread);
    while (c->nsend)
        mch_wake_one(m, k, false, thread);
}

/* Link node `nd` at the back of its side's queue. */
static void mch_link(struct model *m, int k, bool send, int nd)
{
    struct mchan *c = &m->ch[k];
    struct mnode *n = m_node(m, nd);

    if (send)
        c->sendq[c->nsend++] = nd;
    else
        c->recvq[c->nrecv++] = nd;
    memset(n, 0, sizeof *n);
    n->linked = true;
}

/* Take node `nd` out of its side's queue if it is there. */
static void mch_unlink(struct model *m, int k, bool send, int nd)
{
    struct mchan *c = &m->ch[k];
    struct mnode *n = m_node(m, nd);

    if (!n->linked)
        return;
    if (send)
        ids_del(c->sendq, &c->nsend, nd);
    else
        ids_del(c->recvq, &c->nrecv, nd);
    n->linked = false;
}

/* ferry__check(). */
static int m_check(struct model *m, int id)
{
    struct mact *a = &m->a[id];

    if (a->shielded)
        return 0;
    if (a->scope == DL_PAST)
        return a->cancelled ? -ECANCELED : -ETIMEDOUT;
    return a->cancelled ? -ECANCELED : 0;
}

/* ferry__wait() up to the suspension: 0 if suspended, else the error
 * returned without suspending. */
static int m_wait_begin(struct model *m, int id, int q)
{
    struct mact *a = &m->a[id];
    int rc = m_check(m, id);

    if (rc)
        return rc;
    if (q)
        wq_push(m, q, id);
    a->wq = q;
    a->wstate = WS_WAITING;
    a->wres = 0;
    a->wlead = false;
    a->st = M_WAIT;
    a->timer = !a->shielded && a->scope == DL_FAR;
    return 0;
}

/* ferry__wait() after the task resumed. */
static int m_wait_result(struct model *m, int id)
{
    struct mact *a = &m->a[id];
    int rc;

    switch (a->wstate) {
    case WS_GRANTED:
        if (a->cancelled && !a->shielded)
            return -ECANCELED;
        return a->wres;
    case WS_CANCELLED:
        return -ECANCELED;
    default:
        a->wstate = WS_TIMEDOUT;
        rc = m_check(m, id);
        return rc ? rc : -ETIMEDOUT;
    }
}

void model__m_cancel(struct model *m, int id)
{
    struct mact *a = &m->a[id];

    if (a->st == M_DONE)
        return;
    a->cancelled = true;
    if (a->st == M_WAIT && a->wstate == WS_WAITING && !a->shielded) {
        if (a->wq)
            wq_del(m, a->wq, id);
        a->wq = WQ_NONE;
        a->wstate = WS_CANCELLED;
        model__m_ready(m, id);
    }
}

/* The deadline of the actor's command scope passes. */
void model__m_expire(struct model *m, int id)
{
    struct mact *a = &m->a[id];

    a->scope = DL_PAST;
    if (a->timer) {
        a->timer = false;
        if (a->st == M_WAIT && a->wstate == WS_WAITING) {
            if (a->wq)
                wq_del(m, a->wq, id);
            a->wq = WQ_NONE;
            a->wstate = WS_TIMEDOUT;
            model__m_ready(m, id);
        }
    }
}

/* Locks: take, pass, owner died. */

static void m_lheld_del(struct model *m, int lk)
{
    ids_del(m->lheld, &m->nlheld, lk);
}

/* A free lock taken by `id`. */
static void m_lock_take(struct model *m, int lk, int id)
{
    m->lk[lk].owner = id;
    m->a[id].held[m->a[id].nheld++] = lk;
    m->lheld[m->nlheld++] = lk;
}

static void m_held_del(struct mact *a, int lk)
{
    ids_del(a->held, &a->nheld, lk);
}

static int lock_wq(int lk)
{
    return lk == LK_L ? WQ_LOCK : WQ_KL0 + (lk - LK_KL0);
}

static void m_lock_pass(struct model *m, int lk)
{
    int w;

    if (m->lk[lk].owner >= 0)
        m_held_del(&m->a[m->lk[lk].owner], lk);
    w = wq_first(m, lock_wq(lk));
    if (w >= 0) {
        m->lk[lk].owner = w;          /* handed over: keeps its place */
        m->a[w].held[m->a[w].nheld++] = lk;
        model__m_grant(m, w, 0);
    } else {
        m->lk[lk].owner = -1;
        m_lheld_del(m, lk);
    }
}

static void m_lock_died(struct model *m, int lk)
{
    int q = lock_wq(lk), w;

    m->lk[lk].broken = true;
    m->lk[lk].owner = -1;
    m_lheld_del(m, lk);
    while ((w = wq_first(m, q)) >= 0)
        model__m_grant(m, w, -EOWNERDEAD);
}

/* Semaphore. */
static void m_sem_serve(struct model *m)
{
    int w;

    while ((w = wq_first(m, WQ_SEM)) >= 0 && m->a[w].wn <= m->sem_value) {
        m->sem_value -= m->a[w].wn;
        m->sem_pending += m->a[w].wn;
        model__m_grant(m, w, 0);
    }
}

/* Condition. */
static int m_cond_wake(struct model *m, unsigned n)
{
    unsigned woken = 0;
    int w;

    while (woken < n && (w = wq_first(m, WQ_COND)) >= 0) {
        m->cond_pending++;
        model__m_grant(m, w, 0);
        woken++;
    }
    return (int)woken;
}

/* Queue. */
static size_t m_q_avail(const struct model *m)
{
    return (size_t)m->qn - m->q_res_get;
}

static size_t m_q_free(const struct model *m)
{
    size_t used = (size_t)m->qn + m->q_res_put;

    if (m->cfg.qcap == 0)
        return SIZE_MAX;
    return used >= m->cfg.qcap ? 0 : m->cfg.qcap - used;
}

static void m_q_serve_getters(struct model *m)
{
    int w;

    while (m_q_avail(m) > 0 && (w = wq_first(m, WQ_QGET)) >= 0) {
        m->q_res_get++;
        m->q_pending++;
        m_grant_q(m, WQ_QGET, w, 0);
    }
}

static void m_q_serve_putters(struct model *m)
{
    int w;

    while (m_q_free(m) > 0 && (w = wq_first(m, WQ_QPUT)) >= 0) {
        m->q_res_put++;
        m->q_pending++;
        m_grant_q(m, WQ_QPUT, w, 0);
    }
}

static void m_q_wake_all(struct model *m, int q, int res)
{
    int w;

    while ((w = wq_first(m, q)) >= 0) {
        m_grant_q(m, q, w, res);
        m->q_pending++;
    }
}

static void m_q_push(struct model *m, int v)
{
    m->qitems[m->qn++] = v;
    m->q_unfinished++;
    m_q_serve_getters(m);
}

int model__prio_of(int v)
{
    return v % 3;
}

static int m_q_pop(struct model *m)
{
    int i, best = 0, v;

    if (m->cfg.qkind == FERRY_QUEUE_FIFO)
        best = 0;
    else if (m->cfg.qkind == FERRY_QUEUE_LIFO)
        best = m->qn - 1;
    else
        for (i = 1; i < m->qn; i++)
            if (model__prio_of(m->qitems[i]) < model__prio_of(m->qitems[best]))
                best = i;
    v = m->qitems[best];
    for (i = best; i + 1 < m->qn; i++)
        m->qitems[i] = m->qitems[i + 1];
    m->qn--;
    m_q_serve_putters(m);
    return v;
}

/* Flight. */
static bool m_fl_hand_over(struct model *m, int k)
{
    int w = wq_first(m, WQ_FL0 + k);

    if (w < 0)
        return false;
    m->fl_leader[k] = w;
    m->a[w].wlead = true;
    model__m_grant(m, w, 0);
    m->a[w].wlead = true;
    return true;
}

static void m_fl_finish(struct model *m, int k, int st, int val)
{
    int w;

    m->fl_active[k] = false;
    m->fl_leader[k] = -1;
    while ((w = wq_first(m, WQ_FL0 + k)) >= 0) {
        if (st >= 0)
            m->a[w].wval = val;
        model__m_grant(m, w, st);
    }
}

/* Keylock entries. */
static void m_kl_ref(struct model *m, int k)
{
    if (!m->kl_exists[k]) {
        m->kl_exists[k] = true;
        m->lk[LK_KL0 + k].owner = -1;
        m->lk[LK_KL0 + k].broken = false;
    }
    m->kl_refs[k]++;
}

static void m_kl_unref(struct model *m, int k)
{
    if (--m->kl_refs[k] == 0)
        m->kl_exists[k] = false;
}

/* A task ends: the locks it holds break, in the loop's order, then DONE. */
/* Groups: cancel every live child of actor `o`'s group, in spawn order. */
static void m_group_cancel(struct model *m, int o)
{
    int ch[MAXA], n = m->a[o].g_nch, i;

    memcpy(ch, m->a[o].g_ch, sizeof(int) * (size_t)n);
    for (i = 0; i < n; i++)
        model__m_cancel(m, ch[i]);
}

/* A child of actor `o`'s group ended with `status` (group.c): the first
 * failure (not the -ECANCELED of a cancelled child) cancels the siblings;
 * the last child wakes the owner's wait. */
static void m_group_child_done(struct model *m, int o, int id, int status)
{
    struct mact *g = &m->a[o];
    int w;

    ids_del(g->g_ch, &g->g_nch, id);
    g->g_live--;
    if (status != 0 && !(m->a[id].cancelled && status == -ECANCELED) && !g->g_failing) {
        g->g_failing = true;
        g->g_status = status;
        m_group_cancel(m, o);
    }
    if (g->g_live == 0)
        while ((w = wq_first(m, WQ_G0 + o)) >= 0)
            model__m_grant(m, w, 0);
}

/* A task ends with `status`: the locks it holds break, in the loop's
 * order, then DONE, then its group hears of it. */
static void m_finish(struct model *m, int id, int status)
{
    struct mact *a = &m->a[id];
    int i = 0;

    while (a->nheld > 0 && i < m->nlheld) {
        int lk = m->lheld[i];

        if (m->lk[lk].owner == id) {
            m_held_del(a, lk);
            m_lock_died(m, lk);       /* takes it off lheld */
        } else {
            i++;
        }
    }
    a->st = M_DONE;
    if (a->gi >= 0)
        m_group_child_done(m, a->gi, id, status);
}

/* The status C_FAIL ends an actor with: a plain error, -ECANCELED from a
 * task that may not have been cancelled (a failure all the same), or a
 * positive one. */
int model__fail_status(int arg)
{
    static const int st[] = { -EIO, -ECANCELED, 3 };
    return st[arg % 3];
}

static int m_live_count(const struct model *m)
{
    int i, n = 0;

    for (i = 0; i < m->na; i++)
        n += m->a[i].st != M_DONE;
    return n;
}

/* Semaphore release of n permits by anyone (sync.h): -EOVERFLOW if a
 * bounded semaphore would go over its bound, counting permits granted to
 * waiters that have not run yet. */
static int m_sem_release(struct model *m, uint64_t n)
{
    if (m->cfg.sem_bounded && m->sem_value + m->sem_pending + n > m->cfg.sem_v0)
        return -EOVERFLOW;
    m->sem_value += n;
    m_sem_serve(m);
    return 0;
}

static void m_ev_set(struct model *m)
{
    int k;

    m->ev_set = true;
    while ((k = wq_first(m, WQ_EV)) >= 0)
        m_grant_q(m, WQ_EV, k, 0);
}

static int m_q_tryput(struct model *m, int v)
{
    if (m->q_shutdown)
        return -ESHUTDOWN;
    if (m_q_free(m) == 0)
        return -EAGAIN;
    m_q_push(m, v);
    return 0;
}

/*
 * The target of A_CANCEL: the sel-th (mod count) actor that has not ended,
 * is not in (or last given) a sleep and has no such descendant in its
 * group (a group owner cancelled in its wait cancels its children).  A
 * short sleep may end before or after the callback runs, as the clock has
 * it, so a cancellation must not reach it.  `parent` is each actor's
 * group owner or -1, `sleeping` whether it was last given a sleep.
 */
int model__cancel_target(int n, const bool *live, const bool *sleeping, const int *parent,
                         int sel)
{
    bool spared[MAXA] = { false };
    int ids[MAXA], nc = 0, i, j;

    for (i = 0; i < n; i++)
        if (live[i] && sleeping[i])
            for (j = i; j >= 0 && !spared[j]; j = parent[j])
                spared[j] = true;
    for (i = 0; i < n; i++)
        if (live[i] && !spared[i])
            ids[nc++] = i;
    return nc ? ids[sel % nc] : -1;
}

static int m_cancel_target(const struct model *m, int sel)
{
    bool live[MAXA], sleeping[MAXA];
    int parent[MAXA], i;

    for (i = 0; i < m->na; i++) {
        live[i] = m->a[i].st != M_DONE;
        sleeping[i] = m->a[i].cmd.op == C_SLEEP;
        parent[i] = m->a[i].gi;
    }
    return model__cancel_target(m->na, live, sleeping, parent, sel);
}

/* A timer's or a post's callback runs its action. */
static void m_cb_run(struct model *m, struct mcb *c)
{
    c->pending = false;
    c->ran++;
    c->target = -1;
    switch (c->act) {
    case A_EV_SET:
        m_ev_set(m);
        c->rc = 0;
        break;
    case A_EV_CLEAR:
        m->ev_set = false;
        c->rc = 0;
        break;
    case A_SEM_REL:
        c->rc = m_sem_release(m, 1);
        break;
    case A_CANCEL:
        c->target = m_cancel_target(m, c->sel);
        if (c->target >= 0)
            model__m_cancel(m, c->target);
        c->rc = 0;
        break;
    case A_Q_PUT:
        c->rc = m_q_tryput(m, c->val);
        break;
    default:
        c->rc = 0;
        break;
    }
}

static void m_park(struct model *m, int id)
{
    struct mact *a = &m->a[id];

    a->phase = PH_PARK;
    a->shielded = true;
    a->scope = DL_NONE;
    a->wq = WQ_NONE;
    a->wstate = WS_WAITING;
    a->st = M_WAIT;
    a->timer = false;
}

static void m_done(struct model *m, int id, int rc, int val)
{
    struct mact *a = &m->a[id];

    a->done_n++;
    a->last_rc = rc;
    a->last_val = val;
    m_park(m, id);
}

/*
 * Lock acquire (L or a keylock entry), first part: returns 1 if the actor
 * suspended (phase set to `wait_phase`), else 0 with *rc set.
 */
static int m_lock_acq_begin(struct model *m, int id, int lk, int wait_phase, int *rc)
{
    struct mact *a = &m->a[id];

    if (m->lk[lk].broken) {
        *rc = -EOWNERDEAD;
        return 0;
    }
    if (m->lk[lk].owner == id) {
        *rc = -EDEADLK;
        return 0;
    }
    *rc = m_check(m, id);
    if (*rc)
        return 0;
    if (m->lk[lk].owner < 0) {
        m_lock_take(m, lk, id);
        *rc = 0;
        return 0;
    }
    *rc = m_wait_begin(m, id, lock_wq(lk));
    if (*rc)
        return 0;
    a->phase = wait_phase;
    a->lockid = lk;
    return 1;
}

static int m_lock_acq_end(struct model *m, int id, int lk)
{
    struct mact *a = &m->a[id];
    int rc = m_wait_result(m, id);

    if (rc != 0 && a->wstate == WS_GRANTED && a->wres == 0)
        m_lock_pass(m, lk);
    return rc;
}

/* The one place the model asks the real side: whether the sleep an actor
 * just began found its deadline still ahead (it waits on a timer) or
 * already past (it yields), which the clock decides. */

/* Pass 1 of a select command, in listed order: true if a case was
 * performed (*rc its index, *val the item got or the case's error). */
static bool m_sel_try(struct model *m, int id, int *rc, int *val)
{
    const struct cmd *c = &m->a[id].cmd;
    const int *k = m_sel_cases(m, id);
    int i;

    for (i = 0; i < 2; i++) {
        *rc = i;
        *val = 0;
        switch (k[i]) {
        case SK_GET:
            if (m_q_avail(m) > 0) {
                *val = m_q_pop(m);
                return true;
            }
            if (m->q_shutdown) {
                *val = -ESHUTDOWN;
                return true;
            }
            break;
        case SK_PUT:
            if (m->q_shutdown) {
                *val = -ESHUTDOWN;
                return true;
            }
            if (m_q_free(m) > 0) {
                m_q_push(m, c->val);
                return true;
            }
            break;
        case SK_EV:
            if (m->ev_set)
                return true;
            break;
        default:
            if (sk_send(k[i])) {
                if (m->ch[sk_ch(k[i])].closed) {
                    *val = -ESHUTDOWN;
                    return true;
                }
                if (m->ch[sk_ch(k[i])].n < m->cfg.chcap) {
                    model__mch_put(m, sk_ch(k[i]), c->val, false);
                    return true;
                }
            } else {
                if (m->ch[sk_ch(k[i])].n > 0) {
                    *val = model__mch_take(m, sk_ch(k[i]), false);
                    return true;
                }
                if (m->ch[sk_ch(k[i])].closed) {
                    *val = -ESHUTDOWN;
                    return true;
                }
            }
            break;
        }
    }
    *rc = 0;
    *val = 0;
    return false;
}

/* Pass 2 of a select command: each case's waiter at the back of its
 * queue, in listed order. */
static void m_sel_arm(struct model *m, int id)
{
    struct mact *a = &m->a[id];
    const int *k = m_sel_cases(m, id);
    int i;

    for (i = 0; i < 2; i++) {
        if (sk_chan(k[i]))
            mch_link(m, sk_ch(k[i]), sk_send(k[i]), id * ND_PER + ND_SEL0 + i);
        else
            wq_push(m, sel_wq(k[i]), id);
        a->sel_cw[i] = WS_WAITING;
    }
    a->sel_on = true;
    a->sel_won = -1;
}

/* The select's task runs again: every case is taken out before anything
 * may wait (a case waiter left idle unless it won). */
static void m_sel_detach(struct model *m, int id)
{
    struct mact *a = &m->a[id];
    const int *k = m_sel_cases(m, id);
    int i;

    for (i = 0; i < 2; i++) {
        if (sk_chan(k[i]))
            mch_unlink(m, sk_ch(k[i]), sk_send(k[i]), id * ND_PER + ND_SEL0 + i);
        else if (a->sel_cw[i] == WS_WAITING)
            wq_del(m, sel_wq(k[i]), id);
        if (a->sel_cw[i] == WS_WAITING)
            a->sel_cw[i] = WS_IDLE;
    }
    a->sel_on = false;
}

/* The channel case i's node, its wake (if any) delivered: a wake that took
 * it out and did not win goes on to the next node of that side. */
static void m_sel_disarm_end(struct model *m, int id, int i)
{
    struct mact *a = &m->a[id];
    int kind = m_sel_cases(m, id)[i], k = sk_ch(kind);
    struct mnode *n = &a->nd[ND_SEL0 + i];

    if (n->fired && a->sel_cw[i] != WS_GRANTED && model__mch_ready(m, k, sk_send(kind)) &&
        !m->ch[k].closed)
        mch_wake_one(m, k, !sk_send(kind), false);
    memset(n, 0, sizeof *n);
}

/* The select's winning case a->sel_won: perform it (ferry__queue_sel_done(),
 * the channel's done), or hand the grant back.  Returns true if performed
 * (*val: the item got, or the case's error), false if a channel case found
 * nothing to do after all (the select starts again). */
static bool m_sel_done(struct model *m, int id, bool perform, int *val)
{
    struct mact *a = &m->a[id];
    int kind = m_sel_cases(m, id)[a->sel_won], k;

    *val = 0;
    if (sk_chan(kind)) {
        k = sk_ch(kind);
        if (!perform) {
            if (model__mch_ready(m, k, sk_send(kind)) && !m->ch[k].closed)
                mch_wake_one(m, k, !sk_send(kind), false);
            return false;
        }
        if (sk_send(kind)) {
            if (m->ch[k].closed) {
                *val = -ESHUTDOWN;
                return true;
            }
            if (m->ch[k].n < m->cfg.chcap) {
                model__mch_put(m, k, a->cmd.val, false);
                return true;
            }
            return false;
        }
        if (m->ch[k].n > 0) {
            *val = model__mch_take(m, k, false);
            return true;
        }
        if (m->ch[k].closed) {
            *val = -ESHUTDOWN;
            return true;
        }
        return false;
    }
    if (kind == SK_EV) {
        *val = a->sel_wres;
        return true;
    }
    m->q_pending--;
    if (a->sel_wres != 0) {
        *val = a->sel_wres;
        return true;
    }
    if (kind == SK_PUT) {
        m->q_res_put--;
        if (!perform || m->q_shutdown) {
            m_q_serve_putters(m);
            *val = -ESHUTDOWN;
            return true;
        }
        m_q_push(m, a->cmd.val);
        return true;
    }
    if (m->q_shutdown == 2) {
        *val = -ESHUTDOWN;
        return true;
    }
    m->q_res_get--;
    if (!perform) {
        m_q_serve_getters(m);
        return true;
    }
    *val = m_q_pop(m);
    return true;
}

/* m_exec() for the lock.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_lock(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_LOCK_ACQ:
        if (!resumed) {
            if (m_lock_acq_begin(m, id, LK_L, PH_WAIT1, &rc))
                return true;
        } else {
            rc = m_lock_acq_end(m, id, LK_L);
        }
        break;
    case C_LOCK_REL:
        if (m->lk[LK_L].owner != id)
            rc = -EPERM;
        else
            m_lock_pass(m, LK_L);
        break;
    case C_LOCK_TRY:
        if (m->lk[LK_L].broken)
            rc = -EOWNERDEAD;
        else if (m->lk[LK_L].owner == id)
            rc = -EDEADLK;
        else if (m->lk[LK_L].owner >= 0)
            rc = -EAGAIN;
        else
            m_lock_take(m, LK_L, id);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the semaphore.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_sem(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;
    uint64_t n;

    switch (c->op) {
    case C_SEM_ACQ:
        n = (uint64_t)(c->arg % 3 + 1);
        if (!resumed) {
            if (m->cfg.sem_bounded && n > m->cfg.sem_v0) {
                rc = -EINVAL;
                break;
            }
            rc = m_check(m, id);
            if (rc)
                break;
            if (m->sem_value >= n && wq_first(m, WQ_SEM) < 0) {
                m->sem_value -= n;
                a->sem_held += n;
                break;
            }
            rc = m_wait_begin(m, id, WQ_SEM);
            if (rc)
                break;
            a->wn = n;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = m_wait_result(m, id);
        if (a->wstate == WS_GRANTED) {
            m->sem_pending -= n;
            if (rc != 0) {
                m->sem_value += n;
                m_sem_serve(m);
            }
        } else if (rc != 0) {
            m_sem_serve(m);
        }
        if (rc == 0)
            a->sem_held += n;
        break;
    case C_SEM_REL:
        n = (uint64_t)(c->arg % 3 + 1);
        rc = m_sem_release(m, n);
        if (rc == 0)
            a->sem_held -= n < a->sem_held ? n : a->sem_held;
        break;
    case C_SEM_TRY:
        n = (uint64_t)(c->arg % 3 + 1);
        if (m->cfg.sem_bounded && n > m->cfg.sem_v0)
            rc = -EINVAL;
        else if (m->sem_value < n || wq_first(m, WQ_SEM) >= 0)
            rc = -EAGAIN;
        else {
            m->sem_value -= n;
            a->sem_held += n;
        }
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the event.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_event(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_EV_WAIT:
        if (!resumed) {
            rc = m_check(m, id);
            if (rc || m->ev_set)
                break;
            rc = m_wait_begin(m, id, WQ_EV);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = m_wait_result(m, id);
        break;
    case C_EV_SET:
        m_ev_set(m);
        break;
    case C_EV_CLEAR:
        m->ev_set = false;
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the condition.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_cond(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;

    switch (c->op) {
    case C_COND_WAIT:
        if (!resumed) {
            if (m->lk[LK_L].owner != id) {
                rc = -EPERM;
                break;
            }
            rc = m_check(m, id);
            if (rc)
                break;
            m_lock_pass(m, LK_L);
            rc = m_wait_begin(m, id, WQ_COND);   /* check passed just now */
            a->phase = PH_WAIT1;
            return true;
        }
        if (a->phase == PH_WAIT1) {
            rc = m_wait_result(m, id);
            if (a->wstate == WS_GRANTED) {
                m->cond_pending--;
                if (rc != 0)
                    m_cond_wake(m, 1);
            }
            a->saved = rc;
            a->shielded = true;
            if (m_lock_acq_begin(m, id, LK_L, PH_WAIT2, &rc))
                return true;
            a->shielded = false;
            rc = rc ? rc : a->saved;
            break;
        }
        /* PH_WAIT2: the shielded re-acquire resumed. */
        rc = m_lock_acq_end(m, id, LK_L);
        a->shielded = false;
        rc = rc ? rc : a->saved;
        break;
    case C_COND_NOTIFY:
    case C_COND_NOTIFY_ALL:
        if (m->lk[LK_L].owner != id) {
            rc = -EPERM;
            break;
        }
        rc = m_cond_wake(m, c->op == C_COND_NOTIFY ? (unsigned)(c->arg % 3) : ~0u);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the queue's puts.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_queue_put(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;

    switch (c->op) {
    case C_Q_PUT:
        if (!resumed) {
            if (m->q_shutdown) {
                rc = -ESHUTDOWN;
                break;
            }
            rc = m_check(m, id);
            if (rc)
                break;
            if (m_q_free(m) > 0) {
                m_q_push(m, c->val);
                break;
            }
            rc = m_wait_begin(m, id, WQ_QPUT);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = m_wait_result(m, id);
        if (a->wstate != WS_GRANTED)
            break;
        m->q_pending--;
        if (a->wres != 0)
            break;
        m->q_res_put--;
        if (rc == 0 && m->q_shutdown)
            rc = -ESHUTDOWN;
        if (rc) {
            m_q_serve_putters(m);
            break;
        }
        m_q_push(m, c->val);
        break;
    case C_Q_TRYPUT:
        rc = m_q_tryput(m, c->val);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the queue's gets.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_queue_get(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_Q_GET:
        val = -1;
        if (!resumed) {
            rc = m_check(m, id);
            if (rc)
                break;
            if (m_q_avail(m) > 0) {
                val = m_q_pop(m);
                break;
            }
            if (m->q_shutdown) {
                rc = -ESHUTDOWN;
                break;
            }
            rc = m_wait_begin(m, id, WQ_QGET);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = m_wait_result(m, id);
        if (a->wstate != WS_GRANTED)
            break;
        m->q_pending--;
        if (a->wres != 0)
            break;
        if (m->q_shutdown == 2) {
            rc = rc ? rc : -ESHUTDOWN;
            break;
        }
        m->q_res_get--;
        if (rc) {
            m_q_serve_getters(m);
            break;
        }
        val = m_q_pop(m);
        break;
    case C_Q_TRYGET:
        val = -1;
        if (m_q_avail(m) == 0)
            rc = m->q_shutdown ? -ESHUTDOWN : -EAGAIN;
        else
            val = m_q_pop(m);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the queue's task_done, join and shutdown.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_queue(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;

    switch (c->op) {
    case C_Q_DONE:
        if (m->q_unfinished == 0) {
            rc = -EINVAL;
            break;
        }
        if (--m->q_unfinished == 0)
            m_q_wake_all(m, WQ_QJOIN, 0);
        break;
    case C_Q_JOIN:
        if (!resumed) {
            rc = m_check(m, id);
            if (rc || m->q_unfinished == 0)
                break;
            rc = m_wait_begin(m, id, WQ_QJOIN);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = m_wait_result(m, id);
        if (a->wstate == WS_GRANTED)
            m->q_pending--;
        break;
    case C_Q_SHUT:
        if ((c->arg & 1) && m->q_shutdown != 2) {
            size_t dropped = (size_t)m->qn;
            m->qn = 0;
            m->q_res_get = 0;
            m->q_unfinished -= dropped < m->q_unfinished ? dropped : m->q_unfinished;
            m->q_shutdown = 2;
            if (m->q_unfinished == 0)
                m_q_wake_all(m, WQ_QJOIN, 0);
        } else if (m->q_shutdown == 0) {
            m->q_shutdown = 1;
        }
        m_q_wake_all(m, WQ_QGET, -ESHUTDOWN);
        m_q_wake_all(m, WQ_QPUT, -ESHUTDOWN);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for singleflight.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_flight(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;
    int k;

    switch (c->op) {
    case C_FL_DO:
        k = c->arg % NKEYS;
        val = -1;
        if (!resumed) {
            rc = m_check(m, id);
            if (rc)
                break;
            if (m->fl_active[k]) {
                rc = m_wait_begin(m, id, WQ_FL0 + k);
                if (rc)
                    break;
                a->wval = -1;
                a->phase = PH_WAIT1;
                return true;
            }
            m->fl_active[k] = true;
            m->fl_leader[k] = id;
            goto run_fn;
        }
        if (a->phase == PH_WAIT1) {
            rc = m_wait_result(m, id);
            if (a->wstate != WS_GRANTED)
                break;
            if (!a->wlead) {
                rc = a->wres;
                val = a->wres >= 0 ? a->wval : -1;
                break;
            }
            if (rc) {
                if (!m_fl_hand_over(m, k)) {
                    m->fl_active[k] = false;
                    m->fl_leader[k] = -1;
                }
                break;
            }
            goto run_fn;
        }
        /* PH_FN: the leader's fn resumed. */
        if (a->wstate == WS_GRANTED) {
            rc = a->wres;
            val = rc >= 0 ? a->wval : -1;
        } else {
            rc = m_wait_result(m, id);
        }
        goto fn_done;
    run_fn:
        rc = m_wait_begin(m, id, WQ_NONE);
        if (rc == 0) {
            a->phase = PH_FN;
            return true;
        }
    fn_done:
        if ((rc == -ECANCELED || rc == -ETIMEDOUT) && m_check(m, id) != 0 &&
            m_fl_hand_over(m, k))
            break;
        m_fl_finish(m, k, rc, val);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the per-key locks.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_keylock(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct cmd *c = &m->a[id].cmd;
    int rc = 0, val = 0;
    int k;

    switch (c->op) {
    case C_KL_ACQ:
        k = c->arg % NKEYS;
        if (!resumed) {
            rc = m_check(m, id);
            if (rc)
                break;
            m_kl_ref(m, k);
            if (m_lock_acq_begin(m, id, LK_KL0 + k, PH_WAIT1, &rc))
                return true;
        } else {
            rc = m_lock_acq_end(m, id, LK_KL0 + k);
        }
        if (rc)
            m_kl_unref(m, k);
        break;
    case C_KL_TRY:
        k = c->arg % NKEYS;
        m_kl_ref(m, k);
        if (m->lk[LK_KL0 + k].broken)
            rc = -EOWNERDEAD;
        else if (m->lk[LK_KL0 + k].owner == id)
            rc = -EDEADLK;
        else if (m->lk[LK_KL0 + k].owner >= 0)
            rc = -EAGAIN;
        else
            m_lock_take(m, LK_KL0 + k, id);
        if (rc)
            m_kl_unref(m, k);
        break;
    case C_KL_REL:
        k = c->arg % NKEYS;
        if (!m->kl_exists[k] || m->lk[LK_KL0 + k].owner != id) {
            rc = -EPERM;
            break;
        }
        m_lock_pass(m, LK_KL0 + k);
        m_kl_unref(m, k);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for sleep.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_sleep(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_SLEEP:
        if (!resumed) {
            rc = m_check(m, id);
            if (rc)
                break;
            if (model__r_sleep_waited(id)) {
                m_wait_begin(m, id, WQ_NONE);     /* the check passed just now */
                a->timer = true;                  /* the sleep's own deadline */
                a->slept = false;
                a->phase = PH_WAIT1;
                return true;
            }
            /* The deadline had passed: ferry_sleep_until() yields once. */
            a->phase = PH_WAIT2;
            model__m_ready(m, id);
            return true;
        }
        if (a->phase == PH_WAIT2) {
            rc = 0;                               /* back from the yield */
        } else if (a->wstate == WS_CANCELLED) {
            rc = -ECANCELED;
        } else if (a->wstate == WS_GRANTED) {
            rc = a->wres;                         /* nothing grants a sleep */
        } else {
            /* Its timer fired: the sleep's deadline (0) or the command's
             * (-ETIMEDOUT); cancellation and deadlines are checked first. */
            a->wstate = WS_TIMEDOUT;
            rc = m_check(m, id);
            if (rc == 0)
                rc = a->slept ? 0 : -ETIMEDOUT;
        }
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for groups.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_group(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;

    switch (c->op) {
    case C_G_SPAWN:
        val = -1;
        if (!a->g_init || a->g_closed) {
            a->g_init = true;                     /* ferry_group_init() */
            a->g_failing = a->g_closed = false;
            a->g_live = a->g_status = a->g_nch = 0;
        }
        if (m->na >= MAXA || m_live_count(m) >= MAXLIVE) {
            rc = -EAGAIN;                         /* the tester's limit */
            break;
        }
        if (a->g_failing) {
            rc = -ESHUTDOWN;
            break;
        }
        val = m->na++;
        memset(&m->a[val], 0, sizeof m->a[val]);
        m->a[val].gi = id;
        a->g_ch[a->g_nch++] = val;
        a->g_live++;
        model__m_ready(m, val);
        break;
    case C_G_WAIT:
        /* ferry_group_wait(): a->saved is the first interruption. */
        if (!resumed) {
            if (!a->g_init) {
                rc = -EINVAL;
                break;
            }
            a->saved = 0;
        } else {
            rc = m_wait_result(m, id);
            if (rc < 0 && !a->saved) {
                a->saved = rc;
                m_group_cancel(m, id);
                a->shielded = true;
            }
        }
        while (a->g_live) {
            rc = m_wait_begin(m, id, WQ_G0 + id);
            if (rc == 0) {
                a->phase = PH_WAIT1;
                return true;
            }
            if (!a->saved) {
                a->saved = rc;
                m_group_cancel(m, id);
                a->shielded = true;
            }
        }
        a->shielded = false;
        a->g_closed = true;
        rc = a->saved ? a->saved : a->g_status;
        break;
    case C_G_CANCEL: {
        int ids[MAXA], no = 0, i;

        for (i = 0; i < m->na; i++)
            if (m->a[i].g_init && m->a[i].st != M_DONE)
                ids[no++] = i;
        if (!no) {
            rc = -ENOENT;                         /* the tester's: no group */
            val = -1;
            break;
        }
        val = ids[c->arg % no];
        m_group_cancel(m, val);
        break;
    }
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for select.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_select(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_SELECT:
        if (!resumed) {
            rc = m_check(m, id);
            if (rc)
                break;
        sel_again:
            if (m_sel_try(m, id, &rc, &val))
                break;
            /* Armed, then the wait's check: what it refuses is taken apart
             * at once, with nothing in between. */
            rc = m_wait_begin(m, id, WQ_NONE);
            if (rc)
                break;
            m_sel_arm(m, id);
            a->phase = PH_WAIT1;
            return true;
        }
        if (a->phase == PH_WAIT1) {
            a->sel_rc = m_wait_result(m, id);
            m_sel_detach(m, id);
            a->sel_di = 0;
        } else {
            /* A channel case's wake, on its way when the select stopped
             * waiting, has been delivered. */
            a->shielded = false;
            a->nd[ND_SEL0 + a->sel_di].settling = false;
            m_sel_disarm_end(m, id, a->sel_di++);
        }
        for (; a->sel_di < 2; a->sel_di++) {
            struct mnode *nd = &a->nd[ND_SEL0 + a->sel_di];

            if (!sk_chan(m_sel_cases(m, id)[a->sel_di]))
                continue;
            if (nd->fired && !nd->delivered) {
                nd->settling = true;
                a->shielded = true;
                m_wait_begin(m, id, WQ_NONE);     /* shielded: never refused */
                a->phase = PH_WAIT2;
                return true;
            }
            m_sel_disarm_end(m, id, a->sel_di);
        }
        rc = a->sel_rc;
        val = 0;
        if (a->sel_won < 0)
            break;
        if (rc != 0) {
            m_sel_done(m, id, false, &val);
            val = 0;
            break;
        }
        if (!m_sel_done(m, id, true, &val))
            goto sel_again;
        rc = a->sel_won;
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* m_exec() for the channels.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_chan(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;
    int k;
    uint64_t n;

    switch (c->op) {
    case C_CH_SEND:
    case C_CH_RECV: {
        /* ferry_chan_send/recv (park_locked()): the node is a hint, and a
         * task that leaves after its wake was sent waits for its delivery
         * and passes it on. */
        bool send = c->op == C_CH_SEND, fired;
        struct mnode *nd = &a->nd[ND_PARK];

        k = cmd_ch(c->arg);
        val = send ? 0 : -1;
        if (!resumed) {
            rc = m_check(m, id);
            if (rc)
                break;
        ch_again:
            if (send ? m->ch[k].closed : m->ch[k].n > 0) {
                if (send)
                    rc = -ESHUTDOWN;
                else
                    val = model__mch_take(m, k, false);
                break;
            }
            if (send ? m->ch[k].n < m->cfg.chcap : m->ch[k].closed) {
                if (send)
                    model__mch_put(m, k, c->val, false);
                else
                    rc = -ESHUTDOWN;
                break;
            }
            rc = m_wait_begin(m, id, WQ_NONE);
            if (rc)
                break;
            mch_link(m, k, send, id * ND_PER + ND_PARK);
            a->phase = PH_WAIT1;
            return true;
        }
        if (a->phase == PH_WAIT1) {
            a->saved = m_wait_result(m, id);
            if (nd->linked) {
                mch_unlink(m, k, send, id * ND_PER + ND_PARK);
            } else if (!nd->delivered) {
                nd->settling = true;
                a->shielded = true;
                m_wait_begin(m, id, WQ_NONE);
                a->phase = PH_WAIT2;
                return true;
            }
        } else {
            nd->settling = false;
            a->shielded = false;
        }
        rc = a->saved;
        fired = nd->fired;
        memset(nd, 0, sizeof *nd);
        if (rc == -ECANCELED || rc == -ETIMEDOUT) {
            if (fired && (send ? m->ch[k].n < m->cfg.chcap : m->ch[k].n > 0))
                mch_wake_one(m, k, !send, false);
            break;
        }
        goto ch_again;
    }
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* Start or continue the actor's command.  Returns through m_done() or by
 * suspending (st M_WAIT). */
static void m_exec(struct model *m, int id, bool resumed)
{
    static bool (*const exec[C_NCOP])(struct model *, int, bool, int *, int *) = {
        [C_LOCK_ACQ] = m_exec_lock,
        [C_LOCK_REL] = m_exec_lock,
        [C_LOCK_TRY] = m_exec_lock,
        [C_SEM_ACQ] = m_exec_sem,
        [C_SEM_REL] = m_exec_sem,
        [C_SEM_TRY] = m_exec_sem,
        [C_EV_WAIT] = m_exec_event,
        [C_EV_SET] = m_exec_event,
        [C_EV_CLEAR] = m_exec_event,
        [C_COND_WAIT] = m_exec_cond,
        [C_COND_NOTIFY] = m_exec_cond,
        [C_COND_NOTIFY_ALL] = m_exec_cond,
        [C_Q_PUT] = m_exec_queue_put,
        [C_Q_TRYPUT] = m_exec_queue_put,
        [C_Q_GET] = m_exec_queue_get,
        [C_Q_TRYGET] = m_exec_queue_get,
        [C_Q_DONE] = m_exec_queue,
        [C_Q_JOIN] = m_exec_queue,
        [C_Q_SHUT] = m_exec_queue,
        [C_FL_DO] = m_exec_flight,
        [C_KL_ACQ] = m_exec_keylock,
        [C_KL_TRY] = m_exec_keylock,
        [C_KL_REL] = m_exec_keylock,
        [C_SLEEP] = m_exec_sleep,
        [C_G_SPAWN] = m_exec_group,
        [C_G_WAIT] = m_exec_group,
        [C_G_CANCEL] = m_exec_group,
        [C_SELECT] = m_exec_select,
        [C_CH_SEND] = m_exec_chan,
        [C_CH_RECV] = m_exec_chan,
    };
    int op = m->a[id].cmd.op, rc = 0, val = 0;

    if (op >= 0 && op < C_NCOP && exec[op] && exec[op](m, id, resumed, &rc, &val))
        return;
    m_done(m, id, rc, val);
}

/* C_CLEANUP: give back the lock, the keys (in key order) and the permits
 * held, as r_cleanup() does. */
static void m_cleanup(struct model *m, int id)
{
    struct mact *a = &m->a[id];
    int k;

    if (m->lk[LK_L].owner == id)
        m_lock_pass(m, LK_L);
    for (k = 0; k < NKEYS; k++)
        if (m->kl_exists[k] && m->lk[LK_KL0 + k].owner == id) {
            m_lock_pass(m, LK_KL0 + k);
            m_kl_unref(m, k);
        }
    if (a->sem_held && !(m->cfg.sem_bounded &&
                         m->sem_value + m->sem_pending + a->sem_held > m->cfg.sem_v0)) {
        m->sem_value += a->sem_held;
        a->sem_held = 0;
        m_sem_serve(m);
    }
    /* Its group, whose children have all ended (guide() makes sure):
     * ferry_group_wait() returns at once and closes it. */
    if (a->g_init && !a->g_closed && a->g_live == 0)
        a->g_closed = true;
}

/* The scheduler runs actor `id` for one step. */
static void m_run(struct model *m, int id)
{
    struct mact *a = &m->a[id];

    a->timer = false;
    if (!a->started) {
        a->started = true;
        if (a->cancelled) {
            m_finish(m, id, -ECANCELED);
            return;
        }
        m_park(m, id);
        return;
    }
    if (a->phase == PH_PARK) {
        /* Given a command. */
        a->shielded = false;
        if (a->cmd.op == C_EXIT) {
            m_finish(m, id, 0);
            return;
        }
        if (a->cmd.op == C_FAIL) {
            m_finish(m, id, model__fail_status(a->cmd.arg));
            return;
        }
        if (a->cmd.op == C_CLEANUP) {
            m_cleanup(m, id);
            m_finish(m, id, 0);
            return;
        }
        a->scope = a->cmd.dl;
        a->phase = PH_START;
        m_exec(m, id, false);
    } else {
        m_exec(m, id, true);
    }
    if (a->phase == PH_PARK)
        a->scope = DL_NONE;
}

/* The driver yields once: everything queued before it runs one step. */
void model__m_step(struct model *m)
{
    int id;

    rq_push(m, DRIVER);
    while ((id = rq_pop(m)) != DRIVER)
        m_run(m, id);
}

/*
 * The driver waits (D_WAIT) until the loop has polled: the loop polls only
 * once nothing is ready (the model's loop polls I/O and timers no other
 * time), so first everything ready runs.  At the poll the inbox runs the
 * channel thread's wakes (completions, in order, before posts), then the
 * callbacks posted from threads, in order; then the timers that were due
 * run, in the order they were made (each was due since it was made, so
 * their deadlines are in that order); what they wake runs after them.
 * Short sleeps end too, in the order of their deadlines, which the clock
 * interleaves with the rest: a sleeper only finishes its own command, and
 * no callback cancels a sleeper or a group owner above one, so where they
 * fall changes nothing else.
 */
void model__m_wait(struct model *m)
{
    int i;

    while (m->rqn)
        m_run(m, rq_pop(m));
    for (i = 0; i < m->ninbox; i++)
        m_deliver(m, m->inbox[i]);
    m->ninbox = 0;
    for (i = 0; i < m->ncb; i++)
        if (!m->cb[i].timer && m->cb[i].pending)
            m_cb_run(m, &m->cb[i]);
    for (i = 0; i < m->ncb; i++)
        if (m->cb[i].timer && !m->cb[i].far && m->cb[i].pending)
            m_cb_run(m, &m->cb[i]);
    for (i = 0; i < m->na; i++) {
        struct mact *a = &m->a[i];
        if (a->st == M_WAIT && a->wstate == WS_WAITING && a->phase == PH_WAIT1 &&
            a->cmd.op == C_SLEEP && a->cmd.arg % 3 == SL_SHORT && a->timer) {
            a->timer = false;
            a->slept = true;
            a->wstate = WS_TIMEDOUT;
            model__m_ready(m, i);
        }
    }
    while (m->rqn)
        m_run(m, rq_pop(m));
}
