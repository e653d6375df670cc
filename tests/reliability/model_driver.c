/* model_driver.c - the driver task of the model-based tester: runs each
 * operation on the reference model and on the real loop, compares them,
 * checks the invariants and tears the sequence down.  Timers, posts from
 * a thread, the channel thread and the driver's wait are model_threads.c's.
 * See model.h.
 *
 * Loop thread only.  Uses ferry internals
 * (linked from ferry_static) to read the run queue, the primitives'
 * counters, a group's children and a task's timer node, and to fire a
 * task's timer.
 */
#include "model_int.h"

bool model__runq_empty(ferry_loop *loop)
{
    return ferry__list_empty(&loop->runq) && (!loop->turn || ferry__list_empty(loop->turn));
}

/* Compare the real run queue with the model's, in order. */
static void cmp_runq(struct seq *s)
{
    struct ferry__link *heads[2] = { s->loop->turn, &s->loop->runq };
    struct ferry__link *l;
    int real[64], nreal = 0, i, h;

    for (h = 0; h < 2; h++) {
        if (!heads[h])
            continue;
        ferry__list_foreach(l, heads[h]) {
            struct ferry__runnable *rn = ferry__container_of(l, struct ferry__runnable, link);
            if (rn->kind != FERRY__RUN_TASK) {
                model__failf(s, "run queue holds a callback");
                return;
            }
            if (nreal < 64)
                real[nreal++] = model__r_id(s, ferry__container_of(rn, ferry_task, run));
        }
    }
    if (nreal != s->m.rqn) {
        model__failf(s, "run queue: %d ready, model %d", nreal, s->m.rqn);
        return;
    }
    for (i = 0; i < nreal; i++)
        if (real[i] != s->m.rq[(s->m.rqh + i) % 64]) {
            model__failf(s, "run queue position %d: actor %d, model actor %d", i, real[i],
                  s->m.rq[(s->m.rqh + i) % 64]);
            return;
        }
}

static const char *mstate_name(int st)
{
    static const char *const n[] = { "none", "ready", "waiting", "done" };
    return n[st];
}

/* Compare everything observable with the model. */
static void compare(struct seq *s)
{
    struct model *m = &s->m;
    int i, k;

    for (i = 0; i < s->na; i++) {
        struct ract *a = &s->r[i];
        struct mact *ma = &m->a[i];
        int rs = model__r_state(s, i), want;

        if (a->done_n != ma->done_n) {
            model__failf(s, "actor %d (%s): %d commands completed, model %d (real last %d, model last %d)",
                  i, model__cop_names[a->cmd.op], a->done_n, ma->done_n, a->last_rc, ma->last_rc);
            return;
        }
        if (a->done_n && (a->last_rc != ma->last_rc || a->last_val != ma->last_val)) {
            model__failf(s, "actor %d: %s returned %d (val %d), model %d (val %d)", i,
                  model__cop_names[a->cmd.op], a->last_rc, a->last_val, ma->last_rc, ma->last_val);
            return;
        }
        want = ma->st == M_READY ? FERRY_TASK_READY :
               ma->st == M_WAIT ? FERRY_TASK_WAITING : FERRY_TASK_DONE;
        if (rs != want) {
            model__failf(s, "actor %d: task state %d, model %s", i, rs, mstate_name(ma->st));
            return;
        }
        if (a->g_used != ma->g_init) {
            model__failf(s, "actor %d: group initialised %d, model %d", i, a->g_used, ma->g_init);
            return;
        }
        if (a->g_used && ((int)a->group.live != ma->g_live || a->group.status != ma->g_status ||
                          a->group.failing != ma->g_failing || a->group.closed != ma->g_closed)) {
            model__failf(s, "group of actor %d: live %zu status %d failing %d closed %d; "
                  "model %d %d %d %d", i, a->group.live, a->group.status, a->group.failing,
                  a->group.closed, ma->g_live, ma->g_status, ma->g_failing, ma->g_closed);
            return;
        }
    }
    if (s->na != m->na) {
        model__failf(s, "%d actors, model %d", s->na, m->na);
        return;
    }
    for (i = 0; i < m->ncb; i++) {
        const struct rcb *c = &s->cb[i];
        const struct mcb *mc = &m->cb[i];
        if (c->ran != mc->ran || c->pending != mc->pending) {
            model__failf(s, "%s %d (%s): ran %d times, pending %d; model %d, %d",
                  mc->timer ? "timer" : "post", i, model__act_names[mc->act], c->ran, c->pending,
                  mc->ran, mc->pending);
            return;
        }
        if (c->ran && (c->rc != mc->rc || c->target != mc->target)) {
            model__failf(s, "%s %d (%s) returned %d (target %d), model %d (target %d)",
                  mc->timer ? "timer" : "post", i, model__act_names[mc->act], c->rc, c->target,
                  mc->rc, mc->target);
            return;
        }
    }
    cmp_runq(s);
    for (k = 0; k < NCH; k++)
        if (ferry_chan_len(s->ch[k]) != (size_t)m->ch[k].n)
            model__failf(s, "channel %d: %zu items, model %d", k, ferry_chan_len(s->ch[k]), m->ch[k].n);
    if ((s->lock.owner ? model__r_id(s, s->lock.owner) : -1) != m->lk[LK_L].owner)
        model__failf(s, "lock owner: actor %d, model %d",
              s->lock.owner ? model__r_id(s, s->lock.owner) : -1, m->lk[LK_L].owner);
    if (s->lock.broken != m->lk[LK_L].broken)
        model__failf(s, "lock broken: %d, model %d", s->lock.broken, m->lk[LK_L].broken);
    if (s->sem.value != m->sem_value || s->sem.pending != m->sem_pending)
        model__failf(s, "semaphore: value %" PRIu64 " pending %" PRIu64 ", model %" PRIu64 " %" PRIu64,
              s->sem.value, s->sem.pending, m->sem_value, m->sem_pending);
    if (s->ev.set != m->ev_set)
        model__failf(s, "event: set %d, model %d", s->ev.set, m->ev_set);
    if (s->cond.pending != m->cond_pending)
        model__failf(s, "condition: pending %zu, model %zu", s->cond.pending, m->cond_pending);
    if (s->q.count != (size_t)m->qn || s->q.res_get != m->q_res_get ||
        s->q.res_put != m->q_res_put || s->q.unfinished != m->q_unfinished ||
        s->q.pending != m->q_pending || s->q.shutdown != m->q_shutdown)
        model__failf(s, "queue: count %zu res_get %zu res_put %zu unfinished %zu pending %zu shutdown %d; "
              "model %d %zu %zu %zu %zu %d", s->q.count, s->q.res_get, s->q.res_put,
              s->q.unfinished, s->q.pending, s->q.shutdown, m->qn, m->q_res_get,
              m->q_res_put, m->q_unfinished, m->q_pending, m->q_shutdown);
    {
        size_t nfl = 0, nkl = 0;
        for (k = 0; k < NKEYS; k++) {
            nfl += m->fl_active[k];
            nkl += m->kl_exists[k];
        }
        if (ferry_flight_count(&s->fl) != nfl)
            model__failf(s, "flight: %zu calls in flight, model %zu", ferry_flight_count(&s->fl), nfl);
        if (ferry_keylock_count(&s->kl) != nkl)
            model__failf(s, "keylock: %zu keys, model %zu", ferry_keylock_count(&s->kl), nkl);
        for (k = 0; k < NKEYS; k++) {
            bool locked = ferry_keylock_locked(&s->kl, &k, sizeof k);
            bool mlocked = m->kl_exists[k] &&
                           (m->lk[LK_KL0 + k].owner >= 0 || m->lk[LK_KL0 + k].broken);
            if (locked != mlocked)
                model__failf(s, "keylock key %d: locked %d, model %d", k, locked, mlocked);
        }
    }
}

/* Invariants of the real objects, independent of the model. */
static void invariants(struct seq *s)
{
    uint64_t held = 0, granted = 0;
    int i, k, holders = 0, kholders[NKEYS] = {0};

    for (i = 0; i < s->na; i++) {
        struct ract *a = &s->r[i];
        ferry_task *t = model__r_task(s, i);
        held += a->sem_held;
        if (a->in_sem && t && t->waiter && t->waiter->state == FERRY__W_GRANTED)
            granted += a->sem_cur;
        if (a->holds_l && !a->ended) {
            holders++;
            if (s->lock.owner != t)
                model__failf(s, "lock: actor %d holds it (acquire returned 0) but the owner is actor %d",
                      i, model__r_id(s, s->lock.owner));
        }
        for (k = 0; k < NKEYS; k++)
            if (a->holds_kl[k] && !a->ended)
                kholders[k]++;
    }
    if (holders > 1)
        model__failf(s, "lock: %d holders", holders);
    for (k = 0; k < NKEYS; k++)
        if (kholders[k] > 1)
            model__failf(s, "keylock key %d: %d holders", k, kholders[k]);
    /* Permits conserved: available + held + granted-not-yet-run = initial + extra. */
    if (s->sem.value + held + granted != s->cfg.sem_v0 + s->sem_extra)
        model__failf(s, "semaphore: value %" PRIu64 " + held %" PRIu64 " + granted %" PRIu64
              " != initial %" PRIu64 " + extra releases %" PRIu64,
              s->sem.value, held, granted, s->cfg.sem_v0, s->sem_extra);
    if (s->cfg.sem_bounded && s->sem.value > s->cfg.sem_v0)
        model__failf(s, "bounded semaphore: value %" PRIu64 " above its bound %" PRIu64,
              s->sem.value, s->cfg.sem_v0);
    /* Items conserved. */
    if ((int)s->q.count != s->ninserted - s->ngot - s->dropped)
        model__failf(s, "queue: %zu stored, but %d inserted - %d got - %d dropped", s->q.count,
              s->ninserted, s->ngot, s->dropped);
    if (s->cfg.qcap && s->q.count + s->q.res_put > s->cfg.qcap)
        model__failf(s, "queue: %zu stored + %zu promised slots above capacity %zu", s->q.count,
              s->q.res_put, s->cfg.qcap);
    /* FIFO: gets return items in insertion order (until an immediate
     * shutdown drops some). */
    if (s->cfg.qkind == FERRY_QUEUE_FIFO && s->dropped == 0)
        for (i = 0; i < s->ngot; i++)
            if (s->got[i] != s->inserted[i]) {
                model__failf(s, "FIFO queue: get #%d returned %d, inserted #%d was %d", i, s->got[i],
                      i, s->inserted[i]);
                break;
            }
    /* Channel items conserved (their order is checked at each receive). */
    for (k = 0; k < NCH; k++)
        if ((int)ferry_chan_len(s->ch[k]) != s->nch_in[k] - s->nch_out[k])
            model__failf(s, "channel %d: %zu stored, but %d sent - %d received", k,
                  ferry_chan_len(s->ch[k]), s->nch_in[k], s->nch_out[k]);
    /* A group counts its live children, and a closed one has none. */
    for (i = 0; i < s->na; i++) {
        ferry_group *g = &s->r[i].group;
        size_t n = 0;
        struct ferry__link *l;

        if (!s->r[i].g_used)
            continue;
        ferry__list_foreach(l, &g->children)
            n++;
        if (n != g->live || (g->closed && g->live))
            model__failf(s, "group of actor %d: %zu children listed, live %zu, closed %d", i, n,
                  g->live, g->closed);
    }
}

static bool waitq_has_waiting(struct ferry__waitq *q)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &q->head) {
        struct ferry__waiter *w = ferry__container_of(l, struct ferry__waiter, link);
        if (w->state == FERRY__W_WAITING)
            return true;
    }
    return false;
}

static const struct ferry__waiter *waitq_first(struct ferry__waitq *q)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &q->head) {
        const struct ferry__waiter *w = ferry__container_of(l, struct ferry__waiter, link);
        if (w->state == FERRY__W_WAITING)
            return w;
    }
    return NULL;
}

/* True if a node of channel k's side `send` waits (the model's view: the
 * channel's queues are its own): a task parked in a channel command, or a
 * select's case while the select waits. */
static bool m_chan_side_waits(const struct model *m, int k, bool send)
{
    const int *q = send ? m->ch[k].sendq : m->ch[k].recvq;
    int n = send ? m->ch[k].nsend : m->ch[k].nrecv, i;

    for (i = 0; i < n; i++) {
        const struct mact *a = &m->a[q[i] / ND_PER];
        int slot = q[i] % ND_PER;

        if (a->st != M_WAIT || a->wstate != WS_WAITING)
            continue;
        if (slot == ND_PARK ? a->phase == PH_WAIT1
                            : a->sel_on && a->sel_cw[slot - ND_SEL0] == WS_WAITING)
            return true;
    }
    return false;
}

/* Nothing can run: no waiter may be blocked whose wake condition holds. */
static void quiescent(struct seq *s)
{
    const struct ferry__waiter *w;
    size_t avail = s->q.count - s->q.res_get;
    int i, k;

    if (!s->lock.owner && !s->lock.broken && waitq_has_waiting(&s->lock.waiters))
        model__failf(s, "quiescent: the lock is free but tasks wait for it");
    if ((w = waitq_first(&s->sem.waiters)) && w->n <= s->sem.value)
        model__failf(s, "quiescent: the first semaphore waiter wants %" PRIu64 ", %" PRIu64 " available",
              w->n, s->sem.value);
    if (s->ev.set && waitq_has_waiting(&s->ev.waiters))
        model__failf(s, "quiescent: the event is set but tasks wait for it");
    if (avail > 0 && waitq_has_waiting(&s->q.getters))
        model__failf(s, "quiescent: %zu items available but getters wait", avail);
    if (s->q.shutdown && (waitq_has_waiting(&s->q.getters) || waitq_has_waiting(&s->q.putters)))
        model__failf(s, "quiescent: the queue is shut down but tasks wait in put/get");
    if ((s->cfg.qcap == 0 || s->q.count + s->q.res_put < s->cfg.qcap) &&
        waitq_has_waiting(&s->q.putters))
        model__failf(s, "quiescent: the queue has room but putters wait");
    if (s->q.unfinished == 0 && waitq_has_waiting(&s->q.joiners))
        model__failf(s, "quiescent: every item is done but joiners wait");
    /* A select whose queue case won keeps the reservation while it waits
     * for a wake of the channel thread still in the inbox. */
    if ((s->q.pending && s->m.ninbox == 0) || s->sem.pending || s->cond.pending)
        model__failf(s, "quiescent: woken waiters not accounted for (queue %zu, sem %" PRIu64 ", cond %zu)",
              s->q.pending, s->sem.pending, s->cond.pending);
    for (k = 0; k < NKEYS; k++) {
        /* A call with waiters has a leader parked inside fn. */
        bool waiters = false, leader_in_fn = false;
        for (i = 0; i < s->na; i++) {
            struct ract *a = &s->r[i];
            ferry_task *t = model__r_task(s, i);
            if (!t || a->ended || a->cmd.op != C_FL_DO || a->cmd.arg % NKEYS != k || !t->waiter)
                continue;
            if (a->fnw && a->fnw->state == FERRY__W_WAITING)
                leader_in_fn = true;
            else if (t->waiter->state == FERRY__W_WAITING && !a->parkw)
                waiters = true;
        }
        if (waiters && !leader_in_fn)
            model__failf(s, "quiescent: tasks wait for singleflight key %d but no call runs", k);
    }
    for (i = 0; i < s->na; i++)
        if (s->r[i].g_used && s->r[i].group.live == 0 && waitq_has_waiting(&s->r[i].group.waiters))
            model__failf(s, "quiescent: the group of actor %d has no child left but its wait sleeps", i);
    /* With no wake of the channel thread in the inbox, every state change
     * of a channel has woken a task of the side that can proceed. */
    if (s->m.ninbox == 0)
        for (k = 0; k < NCH; k++)
            for (i = 0; i < 2; i++)
                if (model__mch_ready(&s->m, k, i) && m_chan_side_waits(&s->m, k, i))
                    model__failf(s, "quiescent: channel %d has %s (or is closed) but a task waits to %s",
                          k, i ? "room" : "an item", i ? "send" : "receive");
}

/* Yield once on both sides and compare. */
static void step(struct seq *s)
{
    ferry_yield();
    model__m_step(&s->m);
    compare(s);
    invariants(s);
}

static void quiesce(struct seq *s)
{
    int n = 0;

    while (!s->failed && (!model__runq_empty(s->loop) || s->m.rqn)) {
        if (++n > 10000) {
            model__failf(s, "no quiescence after 10000 rounds (livelock)");
            return;
        }
        step(s);
    }
    if (!s->failed)
        quiescent(s);
}

/* Pick the n-th actor (mod count) among those matching `pred`. */
static int pick(struct seq *s, int sel, bool (*pred)(struct seq *, int))
{
    int ids[MAXA], n = 0, i;

    for (i = 0; i < s->na; i++)
        if (pred(s, i))
            ids[n++] = i;
    return n ? ids[sel % n] : -1;
}

static bool p_live(struct seq *s, int i)
{
    return s->m.a[i].st != M_DONE;
}

/* Woken (granted, cancelled, timed out, given a command) and not run yet. */
static bool p_ready(struct seq *s, int i)
{
    return s->m.a[i].st == M_READY;
}

/* Live and not idle: waiting in a primitive, or woken and not run yet. */
static bool p_busy(struct seq *s, int i)
{
    return s->m.a[i].st != M_DONE && !(s->m.a[i].st == M_WAIT && s->m.a[i].phase == PH_PARK);
}

static bool p_idle(struct seq *s, int i)
{
    return s->m.a[i].st == M_WAIT && s->m.a[i].phase == PH_PARK;
}

static bool p_idle_fresh(struct seq *s, int i)
{
    return p_idle(s, i) && !s->m.a[i].cancelled;
}

static bool p_far(struct seq *s, int i)
{
    return s->m.a[i].st != M_DONE && s->m.a[i].scope == DL_FAR && s->m.a[i].phase != PH_PARK;
}

/*
 * An owner that waits for its group while holding a lock can wait for
 * ever: a child may need that lock, and a condition wait takes it back
 * shielded from cancellation.  Such a user deadlock would only hide what
 * the tester looks for, so a group wait becomes a release while a lock
 * is held.
 */
static void guide_group_wait(struct seq *s, int id, struct cmd *c)
{
    const struct mact *a = &s->m.a[id];

    if (s->m.lk[LK_L].owner == id) {
        c->op = C_LOCK_REL;
    } else if (a->nheld) {
        c->op = C_KL_REL;
        c->arg = a->held[0] - LK_KL0;
    }
}

/*
 * Steer a command towards ones that do something in the actor's state (the
 * model's): a condition command or a release without holding the lock
 * mostly becomes an acquire, an acquire of a held lock becomes a condition
 * command or a release.  Deterministic: it reads only the model.
 */
static void guide(struct seq *s, int id, struct cmd *c)
{
    const struct mact *a = &s->m.a[id];
    bool holds = s->m.lk[LK_L].owner == id;
    int k = c->arg % NKEYS;
    static const int with_lock[] = { C_COND_WAIT, C_COND_WAIT, C_COND_NOTIFY,
                                     C_COND_NOTIFY_ALL, C_LOCK_REL };

    switch (c->op) {
    case C_COND_WAIT:
    case C_COND_NOTIFY:
    case C_COND_NOTIFY_ALL:
    case C_LOCK_REL:
        if (!holds && (c->arg & 0x30) != 0)
            c->op = C_LOCK_ACQ;
        break;
    case C_LOCK_ACQ:
    case C_LOCK_TRY:
        if (holds && (c->arg & 0x30) != 0) {
            c->op = with_lock[(c->arg >> 2) % 5];
            /* Notify when someone waits, wait when nobody does. */
            if ((c->arg & 0x40) && (c->op == C_COND_WAIT || c->op == C_COND_NOTIFY))
                c->op = s->m.wqn[WQ_COND] ? C_COND_NOTIFY : C_COND_WAIT;
            if (c->op == C_COND_NOTIFY && c->arg % 3 == 0)
                c->arg++;
        }
        break;
    case C_KL_REL:
        if (!(s->m.lk[LK_KL0 + k].owner == id) && (c->arg & 0x30) != 0)
            c->op = C_KL_ACQ;
        break;
    case C_KL_ACQ:
        if (s->m.lk[LK_KL0 + k].owner == id && (c->arg & 0x30) != 0)
            c->op = C_KL_REL;
        break;
    case C_SEM_REL:
        if (a->sem_held == 0 && (c->arg & 0x30) != 0)
            c->op = C_SEM_ACQ;
        break;
    case C_Q_SHUT:
        /* Shutting down ends the queue's story: keep it rare. */
        if ((c->arg & 0xf0) != 0)
            c->op = C_Q_PUT;
        break;
    case C_EXIT:
    case C_FAIL:
        /* A group must be waited for before its owner ends. */
        if (a->g_init && !a->g_closed && a->g_live > 0) {
            c->op = C_G_WAIT;
            guide_group_wait(s, id, c);
            break;
        }
        /* Ending while holding the lock breaks it for good: keep it rare. */
        if ((holds || a->nheld) && (c->arg & 0xf0) != 0) {
            c->op = holds ? C_LOCK_REL : C_KL_REL;
            if (c->op == C_KL_REL)
                c->arg = a->held[0] - LK_KL0;
        }
        break;
    case C_G_WAIT:
        /* Waiting for a group with no child returns at once: mostly spawn
         * one first. */
        if ((!a->g_init || a->g_closed || a->g_live == 0) && (c->arg & 0x30) != 0)
            c->op = C_G_SPAWN;
        else
            guide_group_wait(s, id, c);
        break;
    default:
        break;
    }
}

static void spawn(struct seq *s)
{
    struct ract *a;
    int rc, id;

    if (s->na >= MAXA)
        return;
    id = s->na;
    a = &s->r[id];
    memset(a, 0, sizeof *a);
    a->owner = -1;
    rc = ferry_task_spawn(&a->t, s->loop, model__actor_main, a, &(ferry_task_opts){ .name = "actor" });
    if (rc) {
        model__failf(s, "spawn: %d", rc);
        return;
    }
    s->na++;
    memset(&s->m.a[id], 0, sizeof s->m.a[id]);
    s->m.a[id].gi = -1;
    s->m.na++;
    model__m_ready(&s->m, id);
}

static void give(struct seq *s, int id, const struct cmd *c)
{
    struct ract *a = &s->r[id];

    a->cmd = *c;
    s->m.a[id].cmd = *c;
    if (!a->parkw || !ferry__grant(a->parkw, 0)) {
        model__failf(s, "actor %d is not parked (model says idle)", id);
        return;
    }
    if (!model__m_grant(&s->m, id, 0))
        model__failf(s, "model: actor %d not idle", id);
}

static void expire(struct seq *s, int id)
{
    ferry_task *t = model__r_task(s, id);

    if (!t || !s->r[id].scope) {
        model__failf(s, "actor %d has no command scope (model says it does)", id);
        return;
    }
    s->r[id].scope->deadline = 1;
    /* What the loop's timer poll does once the deadline has passed. */
    if (t->timer.linked) {
        ferry__heap_remove(&s->loop->timers, &t->timer);
        t->timer.fire(&t->timer);
    }
    model__m_expire(&s->m, id);
}

static void fl_finish(struct seq *s, int k, bool ok)
{
    int id = s->m.fl_leader[k], st, val;
    struct mact *ma;

    if (!s->m.fl_active[k] || id < 0)
        return;
    ma = &s->m.a[id];
    if (ma->phase != PH_FN || ma->st != M_WAIT || ma->wstate != WS_WAITING)
        return;
    s->fin_counter++;
    st = ok ? s->fin_counter % 4 : -EIO;
    val = 1000 + s->fin_counter;
    if (!s->r[id].fnw) {
        model__failf(s, "flight key %d: leader actor %d is not in fn (model says it is)", k, id);
        return;
    }
    s->r[id].fn_val = val;
    if (!ferry__grant(s->r[id].fnw, st)) {
        model__failf(s, "flight key %d: fn waiter of actor %d not waiting", k, id);
        return;
    }
    ma->wval = val;
    model__m_grant(&s->m, id, st);
}

void model__trace_op(struct seq *s, const struct op *o, int id)
{
    static const char *const dn[] = { "spawn", "cancel", "expire", "step", "quiesce",
                                      "flight_finish", "cmd", "timer", "timer_cancel",
                                      "post", "wait", "chan_thread" };
    if (!s->trace)
        return;
    fprintf(s->trace, "op %3d: %s", s->opi, dn[o->kind]);
    if (o->kind == D_CMD)
        fprintf(s->trace, " actor %d %s arg %d%s", id, model__cop_names[o->c.op], o->c.arg,
                o->c.dl == DL_FAR ? " [deadline]" : o->c.dl == DL_PAST ? " [deadline passed]" : "");
    else if (o->kind == D_CANCEL || o->kind == D_EXPIRE)
        fprintf(s->trace, " actor %d", id);
    else if (o->kind == D_FL_FINISH)
        fprintf(s->trace, " key %d %s", o->arg % NKEYS, o->arg2 & 1 ? "ok" : "fail");
    else if (o->kind == D_STEP)
        fprintf(s->trace, " x%d", o->arg % 3 + 1);
    else if (o->kind == D_TIMER)
        fprintf(s->trace, " %d %s, %s", id, o->arg & 1 ? "in an hour" : "due", model__act_names[o->act]);
    else if (o->kind == D_TCANCEL)
        fprintf(s->trace, " %d", id);
    else if (o->kind == D_POST)
        fprintf(s->trace, " %d from a thread, from %s", 1 + o->arg % 3, model__act_names[o->act]);
    else if (o->kind == D_CHT)
        fprintf(s->trace, " channel %d", id);
    fprintf(s->trace, "\n");
}

/* D_CMD: give an idle actor its next command (a cancelled one mostly its
 * cleanup, and a fresh actor takes its place). */
static void op_cmd(struct seq *s, const struct op *o)
{
    struct cmd c;
    int id;

    /* Cancellation is level-triggered, so a cancelled actor can only
     * fail from now on: mostly retire it and bring in a fresh one. */
    id = pick(s, o->actor, (o->actor & 0x80) ? p_idle : p_idle_fresh);
    if (id < 0)
        id = pick(s, o->actor, p_idle);
    if (id < 0)
        return;
    c = o->c;
    if (s->m.a[id].cancelled && (o->actor & 0x60) != 0) {
        const struct mact *ma = &s->m.a[id];
        /* Its group first: the wait, interrupted at once, cancels
         * the children and still waits for them. */
        c.op = C_CLEANUP;
        if (ma->g_init && !ma->g_closed && ma->g_live > 0) {
            c.op = C_G_WAIT;
            guide_group_wait(s, id, &c);
        }
        model__trace_op(s, &(struct op){ .kind = D_CMD, .c = c }, id);
        give(s, id, &c);
        if (s->na < MAXA)
            spawn(s);
        return;
    }
    guide(s, id, &c);
    if (c.op == C_Q_PUT || c.op == C_Q_TRYPUT || c.op == C_SELECT || c.op == C_CH_SEND)
        c.val = ++s->put_counter;
    model__trace_op(s, o, id);
    give(s, id, &c);
}

static void run_op(struct seq *s, const struct op *o)
{
    int id = -1, i;

    switch (o->kind) {
    case D_SPAWN:
        model__trace_op(s, o, -1);
        {
            int live = 0;
            for (i = 0; i < s->na; i++)
                live += p_live(s, i);
            if (live < MAXLIVE)
                spawn(s);
        }
        break;
    case D_CANCEL:
        /* Mostly a task inside a command: cancelling idle ones only
         * makes every later command of theirs fail at once. */
        if ((o->actor & 0xc0) == 0 && (id = pick(s, o->actor, p_ready)) >= 0)
            ;   /* woken but not run yet: the window primitives get wrong */
        else
            id = (o->actor & 0x80) ? pick(s, o->actor, p_live) : pick(s, o->actor, p_busy);
        if (id < 0)
            break;
        model__trace_op(s, o, id);
        if (!model__r_task(s, id)) {
            model__failf(s, "actor %d has ended (model says it is live)", id);
            break;
        }
        ferry_task_cancel(model__r_task(s, id));
        model__m_cancel(&s->m, id);
        break;
    case D_EXPIRE:
        id = pick(s, o->actor, p_far);
        if (id < 0)
            break;
        model__trace_op(s, o, id);
        expire(s, id);
        break;
    case D_STEP:
        model__trace_op(s, o, -1);
        for (i = 0; i <= o->arg % 3 && !s->failed; i++)
            step(s);
        break;
    case D_QUIESCE:
        model__trace_op(s, o, -1);
        quiesce(s);
        break;
    case D_FL_FINISH:
        model__trace_op(s, o, -1);
        fl_finish(s, o->arg % NKEYS, o->arg2 & 1);
        break;
    case D_TIMER:
        model__op_timer(s, o);
        break;
    case D_TCANCEL:
        model__op_tcancel(s, o);
        break;
    case D_POST:
        model__op_post(s, o);
        break;
    case D_WAIT:
        model__op_wait(s, o);
        break;
    case D_CHT:
        model__op_cht(s, o);
        break;
    case D_CMD:
        op_cmd(s, o);
        break;
    }
    if (!s->failed)
        compare(s);
    if (!s->failed)
        invariants(s);
}

/* Channels a task that never ends may still be parked on: never freed,
 * kept reachable. */
static ferry_chan *abandoned_chans[64];
static int nabandoned_chans;

static void r_chans_abandon(struct seq *s)
{
    int k;

    for (k = 0; k < NCH; k++) {
        if (nabandoned_chans < (int)(sizeof abandoned_chans / sizeof abandoned_chans[0]))
            abandoned_chans[nabandoned_chans++] = s->ch[k];
        s->ch[k] = NULL;
    }
}

/* End the sequence: cancel every actor, let each give back what it holds
 * and end; destroy every primitive (which must not be busy). */
static void teardown(struct seq *s)
{
    int i, round, rc;
    struct cmd c = { .op = C_CLEANUP };

    s->opi = -1;
    /* Timers that have not run never will: an hour away, or made after
     * the last wait.  (Posts all ran in the last wait.) */
    for (i = 0; i < s->m.ncb; i++)
        if (s->cb[i].pending && s->cb[i].h) {
            if ((rc = ferry_timer_cancel(s->cb[i].h)))
                model__failf(s, "teardown: timer_cancel %d", rc);
            s->cb[i].pending = false;
            s->cb[i].h = NULL;
        }
    for (i = 0; i < s->na; i++)
        if (!s->r[i].ended && model__r_task(s, i))
            ferry_task_cancel(model__r_task(s, i));
    for (round = 0; round < 50; round++) {
        bool live = false;
        while (!model__runq_empty(s->loop))
            ferry_yield();
        for (i = 0; i < s->na; i++) {
            struct ract *a = &s->r[i];
            if (!model__r_live(s, i))
                continue;
            live = true;
            if (a->parkw) {
                a->cmd = c;
                ferry__grant(a->parkw, 0);
            }
        }
        if (!live)
            break;
    }
    for (i = 0; i < s->na; i++) {
        struct ract *a = &s->r[i];
        ferry_task *t = model__r_task(s, i);
        int st;

        /* A child of a group has no handle: it has ended once its group
         * no longer lists it. */
        if (a->owner < 0 ? ferry_task_try_join(a->t, &st) != 0 : t != NULL) {
            model__failf(s, "teardown: actor %d never ended (%s, waits on %s)", i,
                  model__cop_names[a->cmd.op],
                  t && t->waiter && t->waiter->what ? t->waiter->what : "?");
            r_chans_abandon(s);
            return;   /* cannot free its primitives safely */
        }
    }
    for (i = 0; i < NCH; i++) {
        if ((int)ferry_chan_len(s->ch[i]) != s->nch_in[i] - s->nch_out[i])
            model__failf(s, "teardown: channel %d holds %zu, expected %d", i, ferry_chan_len(s->ch[i]),
                  s->nch_in[i] - s->nch_out[i]);
        ferry_chan_free(s->ch[i]);
        s->ch[i] = NULL;
    }
    for (i = 0; i < s->m.ncb; i++)
        if (s->cb[i].pending)
            model__failf(s, "teardown: %s %d never ran", s->m.cb[i].timer ? "timer" : "post", i);
    {
        uint64_t held = 0;
        for (i = 0; i < s->na; i++)
            held += s->r[i].sem_held;   /* permits of actors that exited holding them */
        if (s->sem.value + held != s->cfg.sem_v0 + s->sem_extra)
            model__failf(s, "teardown: semaphore value %" PRIu64 " + still held %" PRIu64
                  " != initial + extra %" PRIu64, s->sem.value, held, s->cfg.sem_v0 + s->sem_extra);
    }
    if ((rc = ferry_cond_destroy(&s->cond)))
        model__failf(s, "teardown: cond_destroy %d", rc);
    if ((rc = ferry_lock_destroy(&s->lock)))
        model__failf(s, "teardown: lock_destroy %d", rc);
    if ((rc = ferry_sem_destroy(&s->sem)))
        model__failf(s, "teardown: sem_destroy %d", rc);
    if ((rc = ferry_event_destroy(&s->ev)))
        model__failf(s, "teardown: event_destroy %d", rc);
    if ((int)s->q.count != s->ninserted - s->ngot - s->dropped)
        model__failf(s, "teardown: queue holds %zu, expected %d", s->q.count,
              s->ninserted - s->ngot - s->dropped);
    if ((rc = ferry_queue_destroy(&s->q)))
        model__failf(s, "teardown: queue_destroy %d", rc);
    if ((rc = ferry_flight_destroy(&s->fl)))
        model__failf(s, "teardown: flight_destroy %d (%zu calls)", rc, ferry_flight_count(&s->fl));
    if ((rc = ferry_keylock_destroy(&s->kl)))
        model__failf(s, "teardown: keylock_destroy %d", rc);
}

struct drive_arg {
    struct seq    *s;
    const uint8_t *bytes;
    size_t         len;
};

/* FERRY_MODEL_SELFTEST=stuck: a task that never ends, not even when
 * cancelled, as a bug that breaks a sequence can leave; it checks that
 * the runner never runs or frees such a loop again. */
static int stuck_main(void *arg)
{
    struct ferry__waiter w;
    ferry_scope shield;

    (void)arg;
    ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    ferry__waiter_init(&w, ferry_task_current(), "self-test", NULL);
    ferry__wait(NULL, &w, FERRY_NEVER);
    ferry_scope_exit(&shield);
    return 0;
}

static int driver_main(void *arg)
{
    struct drive_arg *d = arg;
    struct seq *s = d->s;
    size_t pos = MODEL_HDR_BYTES;
    int64_t until;
    struct op o;

    if (getenv("FERRY_MODEL_SELFTEST") && !strcmp(getenv("FERRY_MODEL_SELFTEST"), "stuck")) {
        ferry_task_spawn(NULL, s->loop, stuck_main, NULL, NULL);
        model__failf(s, "self-test: a task that never ends");
    }
    spawn(s);
    spawn(s);
    for (s->opi = 0; !s->failed && s->opi < MODEL_MAX_OPS &&
                     pos + MODEL_OP_BYTES <= d->len; s->opi++, pos += MODEL_OP_BYTES) {
        model__decode_op(s->fmt, d->bytes + pos, &o);
        run_op(s, &o);
        s->rep->ops_run++;
    }
    /* Posts and due timers still to run, short sleeps to end: one more
     * wait, checked like any other. */
    if (!s->failed && model__r_wait_pending(s, &until)) {
        o = (struct op){ .kind = D_WAIT };
        model__op_wait(s, &o);
        if (!s->failed) {
            compare(s);
            invariants(s);
        }
    }
    if (!s->failed)
        quiesce(s);
    /* Best effort after a failure: the caller puts a failed loop aside. */
    teardown(s);
    /* Return from ferry_loop_run() even if some task never ends. */
    ferry_loop_stop(s->loop);
    return 0;
}

/*
 * The model's loop polls I/O and timers only when nothing is ready (an
 * io_interval no sequence reaches), that is only while the driver waits
 * (D_WAIT): what a poll brings (posts, due timers, short sleeps) then
 * arrives at a point the model knows.  The blocked-loop detector is off,
 * so tasks hand the CPU to each other as in production.
 */
int model_loop_new(ferry_loop **out)
{
    ferry_loop_opts o = { .stack_size = 32 * 1024, .stack_cache = 64,
                          .io_interval = 1u << 30 };
    int rc = ferry_loop_new(out, &o);

    if (rc == 0)
        ferry_loop_set_slow_threshold(*out, 0);
    return rc;
}

unsigned long model_stray_callbacks(void)
{
    return model__stray_callbacks;
}

int model_check_bytes(ferry_loop *loop, const uint8_t *bytes, size_t len,
                      FILE *trace, model_report *rep)
{
    static struct seq s;   /* large; one sequence at a time per process */
    struct drive_arg d = { &s, bytes, len };
    ferry_task *drv;
    int rc, st;

    memset(rep, 0, sizeof *rep);
    memset(&s, 0, sizeof s);
    s.loop = loop;
    s.trace = trace;
    s.rep = rep;
    s.opi = -1;
    s.fmt = len && bytes[0] == MODEL_FMT_V1 ? MODEL_FMT_V1 :
            len && bytes[0] == MODEL_FMT_V3 ? MODEL_FMT_V3 :
            len && bytes[0] == MODEL_FMT_V4 ? MODEL_FMT_V4 : MODEL_FMT_V2;
    if (len >= MODEL_HDR_BYTES) {
        s.cfg.sem_bounded = (bytes[1] >> 2) & 1;
        s.cfg.sem_v0 = s.cfg.sem_bounded ? 1 + bytes[1] % 3 : bytes[1] % 4;
        s.cfg.qkind = bytes[2] % 3;
        s.cfg.qcap = (bytes[2] >> 2) % 4;
    }
    s.cfg.chcap = 1 + (len >= MODEL_HDR_BYTES ? (bytes[1] >> 3) % 3 : 0);
    s.m.cfg = s.cfg;
    s.m.fmt = s.fmt;
    for (int k = 0; k < NCH; k++)
        if (ferry_chan_new_elem(&s.ch[k], (size_t)s.cfg.chcap, sizeof(int))) {
            model__failf(&s, "chan_new: out of memory");
            return 1;
        }
    s.m.sem_value = s.cfg.sem_v0;
    for (int i = 0; i < NLOCKS; i++)
        s.m.lk[i].owner = -1;
    for (int k = 0; k < NKEYS; k++)
        s.m.fl_leader[k] = -1;
    ferry_lock_init(&s.lock);
    ferry_sem_init(&s.sem, s.cfg.sem_v0, s.cfg.sem_bounded ? FERRY_SEM_BOUNDED : 0);
    ferry_event_init(&s.ev);
    ferry_cond_init(&s.cond, &s.lock);
    ferry_queue_init(&s.q, sizeof(int), s.cfg.qcap, (enum ferry_queue_kind)s.cfg.qkind,
                     s.cfg.qkind == FERRY_QUEUE_PRIORITY ? model__qcmp : NULL, NULL);
    ferry_flight_init(&s.fl);
    ferry_keylock_init(&s.kl);
    if (trace)
        fprintf(trace, "sequence (format %d): semaphore %" PRIu64 "%s, queue %s capacity %zu, "
                "channels capacity %d\n",
                s.fmt, s.cfg.sem_v0, s.cfg.sem_bounded ? " bounded" : "",
                s.cfg.qkind == 0 ? "fifo" : s.cfg.qkind == 1 ? "lifo" : "priority", s.cfg.qcap,
                s.cfg.chcap);
    model__cur = &s;
    rc = ferry_task_spawn(&drv, loop, driver_main, &d, &(ferry_task_opts){ .name = "driver" });
    if (rc) {
        model__failf(&s, "spawn driver: %d", rc);
        for (int k = 0; k < NCH; k++)
            ferry_chan_free(s.ch[k]);
        return 1;
    }
    /* The driver stops the loop when it ends, even with tasks stuck. */
    while (ferry_task_try_join(drv, &st) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    /* The posting thread holds no callback of this sequence after this:
     * the next one reuses the memory. */
    model__poster_flush(NULL);
    model__cur = NULL;
    rep->stuck = s.stuck;
    return rep->failed ? 1 : 0;
}
