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

void model__wq_push(struct model *m, int q, int id)
{
    m->wq[q][m->wqn[q]++] = id;
}

void model__wq_del(struct model *m, int q, int id)
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

int model__wq_first(const struct model *m, int q)
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
        model__wq_del(m, a->wq, id);
    a->wq = WQ_NONE;
    a->wstate = WS_GRANTED;
    a->wres = res;
    model__m_ready(m, id);
    return true;
}

/* The wait queue of a select case on a loop primitive. */
int model__sel_wq(int kind)
{
    return kind == SK_GET ? WQ_QGET : kind == SK_PUT ? WQ_QPUT : WQ_EV;
}

const int *model__m_sel_cases(const struct model *m, int id)
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
    const int *k = model__m_sel_cases(m, id);
    int j;

    a->sel_cw[i] = WS_GRANTED;
    if (!sk_chan(k[i]))
        model__wq_del(m, model__sel_wq(k[i]), id);
    a->sel_won = i;
    a->sel_wres = res;
    for (j = 0; j < 2; j++) {
        if (j == i || a->sel_cw[j] != WS_WAITING)
            continue;
        if (!sk_chan(k[j]))
            model__wq_del(m, model__sel_wq(k[j]), id);
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
    k = model__m_sel_cases(m, id);
    for (i = 0; i < 2; i++)
        if (!sk_chan(k[i]) && model__sel_wq(k[i]) == q && a->sel_cw[i] == WS_WAITING) {
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
void model__mch_wake_one(struct model *m, int k, bool receivers, bool thread)
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
    model__mch_wake_one(m, k, true, thread);
}

int model__mch_take(struct model *m, int k, bool thread)
{
    struct mchan *c = &m->ch[k];
    int v = c->items[0], i;

    for (i = 0; i + 1 < c->n; i++)
        c->items[i] = c->items[i + 1];
    c->n--;
    model__mch_wake_one(m, k, false, thread);
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
        model__mch_wake_one(m, k, true, thread);
    while (c->nsend)
        model__mch_wake_one(m, k, false, thread);
}

/* Link node `nd` at the back of its side's queue. */
void model__mch_link(struct model *m, int k, bool send, int nd)
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
void model__mch_unlink(struct model *m, int k, bool send, int nd)
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
int model__m_check(struct model *m, int id)
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
int model__m_wait_begin(struct model *m, int id, int q)
{
    struct mact *a = &m->a[id];
    int rc = model__m_check(m, id);

    if (rc)
        return rc;
    if (q)
        model__wq_push(m, q, id);
    a->wq = q;
    a->wstate = WS_WAITING;
    a->wres = 0;
    a->wlead = false;
    a->st = M_WAIT;
    a->timer = !a->shielded && a->scope == DL_FAR;
    return 0;
}

/* ferry__wait() after the task resumed. */
int model__m_wait_result(struct model *m, int id)
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
        rc = model__m_check(m, id);
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
            model__wq_del(m, a->wq, id);
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
                model__wq_del(m, a->wq, id);
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
void model__m_lock_take(struct model *m, int lk, int id)
{
    m->lk[lk].owner = id;
    m->a[id].held[m->a[id].nheld++] = lk;
    m->lheld[m->nlheld++] = lk;
}

static void m_held_del(struct mact *a, int lk)
{
    ids_del(a->held, &a->nheld, lk);
}

int model__lock_wq(int lk)
{
    return lk == LK_L ? WQ_LOCK : WQ_KL0 + (lk - LK_KL0);
}

void model__m_lock_pass(struct model *m, int lk)
{
    int w;

    if (m->lk[lk].owner >= 0)
        m_held_del(&m->a[m->lk[lk].owner], lk);
    w = model__wq_first(m, model__lock_wq(lk));
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
    int q = model__lock_wq(lk), w;

    m->lk[lk].broken = true;
    m->lk[lk].owner = -1;
    m_lheld_del(m, lk);
    while ((w = model__wq_first(m, q)) >= 0)
        model__m_grant(m, w, -EOWNERDEAD);
}

/* Semaphore. */
void model__m_sem_serve(struct model *m)
{
    int w;

    while ((w = model__wq_first(m, WQ_SEM)) >= 0 && m->a[w].wn <= m->sem_value) {
        m->sem_value -= m->a[w].wn;
        m->sem_pending += m->a[w].wn;
        model__m_grant(m, w, 0);
    }
}

/* Condition. */
int model__m_cond_wake(struct model *m, unsigned n)
{
    unsigned woken = 0;
    int w;

    while (woken < n && (w = model__wq_first(m, WQ_COND)) >= 0) {
        m->cond_pending++;
        model__m_grant(m, w, 0);
        woken++;
    }
    return (int)woken;
}

/* Queue. */
size_t model__m_q_avail(const struct model *m)
{
    return (size_t)m->qn - m->q_res_get;
}

size_t model__m_q_free(const struct model *m)
{
    size_t used = (size_t)m->qn + m->q_res_put;

    if (m->cfg.qcap == 0)
        return SIZE_MAX;
    return used >= m->cfg.qcap ? 0 : m->cfg.qcap - used;
}

void model__m_q_serve_getters(struct model *m)
{
    int w;

    while (model__m_q_avail(m) > 0 && (w = model__wq_first(m, WQ_QGET)) >= 0) {
        m->q_res_get++;
        m->q_pending++;
        m_grant_q(m, WQ_QGET, w, 0);
    }
}

void model__m_q_serve_putters(struct model *m)
{
    int w;

    while (model__m_q_free(m) > 0 && (w = model__wq_first(m, WQ_QPUT)) >= 0) {
        m->q_res_put++;
        m->q_pending++;
        m_grant_q(m, WQ_QPUT, w, 0);
    }
}

void model__m_q_wake_all(struct model *m, int q, int res)
{
    int w;

    while ((w = model__wq_first(m, q)) >= 0) {
        m_grant_q(m, q, w, res);
        m->q_pending++;
    }
}

void model__m_q_push(struct model *m, int v)
{
    m->qitems[m->qn++] = v;
    m->q_unfinished++;
    model__m_q_serve_getters(m);
}

int model__prio_of(int v)
{
    return v % 3;
}

int model__m_q_pop(struct model *m)
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
    model__m_q_serve_putters(m);
    return v;
}

/* Flight. */
bool model__m_fl_hand_over(struct model *m, int k)
{
    int w = model__wq_first(m, WQ_FL0 + k);

    if (w < 0)
        return false;
    m->fl_leader[k] = w;
    m->a[w].wlead = true;
    model__m_grant(m, w, 0);
    m->a[w].wlead = true;
    return true;
}

void model__m_fl_finish(struct model *m, int k, int st, int val)
{
    int w;

    m->fl_active[k] = false;
    m->fl_leader[k] = -1;
    while ((w = model__wq_first(m, WQ_FL0 + k)) >= 0) {
        if (st >= 0)
            m->a[w].wval = val;
        model__m_grant(m, w, st);
    }
}

/* Keylock entries. */
void model__m_kl_ref(struct model *m, int k)
{
    if (!m->kl_exists[k]) {
        m->kl_exists[k] = true;
        m->lk[LK_KL0 + k].owner = -1;
        m->lk[LK_KL0 + k].broken = false;
    }
    m->kl_refs[k]++;
}

void model__m_kl_unref(struct model *m, int k)
{
    if (--m->kl_refs[k] == 0)
        m->kl_exists[k] = false;
}

/* A task ends: the locks it holds break, in the loop's order, then DONE. */
/* Groups: cancel every live child of actor `o`'s group, in spawn order. */
void model__m_group_cancel(struct model *m, int o)
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
        model__m_group_cancel(m, o);
    }
    if (g->g_live == 0)
        while ((w = model__wq_first(m, WQ_G0 + o)) >= 0)
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

int model__m_live_count(const struct model *m)
{
    int i, n = 0;

    for (i = 0; i < m->na; i++)
        n += m->a[i].st != M_DONE;
    return n;
}

/* Semaphore release of n permits by anyone (sync.h): -EOVERFLOW if a
 * bounded semaphore would go over its bound, counting permits granted to
 * waiters that have not run yet. */
int model__m_sem_release(struct model *m, uint64_t n)
{
    if (m->cfg.sem_bounded && m->sem_value + m->sem_pending + n > m->cfg.sem_v0)
        return -EOVERFLOW;
    m->sem_value += n;
    model__m_sem_serve(m);
    return 0;
}

void model__m_ev_set(struct model *m)
{
    int k;

    m->ev_set = true;
    while ((k = model__wq_first(m, WQ_EV)) >= 0)
        m_grant_q(m, WQ_EV, k, 0);
}

int model__m_q_tryput(struct model *m, int v)
{
    if (m->q_shutdown)
        return -ESHUTDOWN;
    if (model__m_q_free(m) == 0)
        return -EAGAIN;
    model__m_q_push(m, v);
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
        model__m_ev_set(m);
        c->rc = 0;
        break;
    case A_EV_CLEAR:
        m->ev_set = false;
        c->rc = 0;
        break;
    case A_SEM_REL:
        c->rc = model__m_sem_release(m, 1);
        break;
    case A_CANCEL:
        c->target = m_cancel_target(m, c->sel);
        if (c->target >= 0)
            model__m_cancel(m, c->target);
        c->rc = 0;
        break;
    case A_Q_PUT:
        c->rc = model__m_q_tryput(m, c->val);
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

void model__m_done(struct model *m, int id, int rc, int val)
{
    struct mact *a = &m->a[id];

    a->done_n++;
    a->last_rc = rc;
    a->last_val = val;
    m_park(m, id);
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
            model__m_cleanup(m, id);
            m_finish(m, id, 0);
            return;
        }
        a->scope = a->cmd.dl;
        a->phase = PH_START;
        model__m_exec(m, id, false);
    } else {
        model__m_exec(m, id, true);
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
