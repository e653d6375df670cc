/* model_ref_cmds.c - the reference model's commands: what each command of
 * an actor does to the model's state, started and resumed, one function per
 * primitive (m_exec_*), and the teardown's cleanup.  The state they work on,
 * the waits and the run queue are model_ref.c's.  See model.h.
 */
#include "model_int.h"

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
    *rc = model__m_check(m, id);
    if (*rc)
        return 0;
    if (m->lk[lk].owner < 0) {
        model__m_lock_take(m, lk, id);
        *rc = 0;
        return 0;
    }
    *rc = model__m_wait_begin(m, id, model__lock_wq(lk));
    if (*rc)
        return 0;
    a->phase = wait_phase;
    a->lockid = lk;
    return 1;
}

static int m_lock_acq_end(struct model *m, int id, int lk)
{
    struct mact *a = &m->a[id];
    int rc = model__m_wait_result(m, id);

    if (rc != 0 && a->wstate == WS_GRANTED && a->wres == 0)
        model__m_lock_pass(m, lk);
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
    const int *k = model__m_sel_cases(m, id);
    int i;

    for (i = 0; i < 2; i++) {
        *rc = i;
        *val = 0;
        switch (k[i]) {
        case SK_GET:
            if (model__m_q_avail(m) > 0) {
                *val = model__m_q_pop(m);
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
            if (model__m_q_free(m) > 0) {
                model__m_q_push(m, c->val);
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
    const int *k = model__m_sel_cases(m, id);
    int i;

    for (i = 0; i < 2; i++) {
        if (sk_chan(k[i]))
            model__mch_link(m, sk_ch(k[i]), sk_send(k[i]), id * ND_PER + ND_SEL0 + i);
        else
            model__wq_push(m, model__sel_wq(k[i]), id);
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
    const int *k = model__m_sel_cases(m, id);
    int i;

    for (i = 0; i < 2; i++) {
        if (sk_chan(k[i]))
            model__mch_unlink(m, sk_ch(k[i]), sk_send(k[i]), id * ND_PER + ND_SEL0 + i);
        else if (a->sel_cw[i] == WS_WAITING)
            model__wq_del(m, model__sel_wq(k[i]), id);
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
    int kind = model__m_sel_cases(m, id)[i], k = sk_ch(kind);
    struct mnode *n = &a->nd[ND_SEL0 + i];

    if (n->fired && a->sel_cw[i] != WS_GRANTED && model__mch_ready(m, k, sk_send(kind)) &&
        !m->ch[k].closed)
        model__mch_wake_one(m, k, !sk_send(kind), false);
    memset(n, 0, sizeof *n);
}

/* The select's winning case a->sel_won: perform it (ferry__queue_sel_done(),
 * the channel's done), or hand the grant back.  Returns true if performed
 * (*val: the item got, or the case's error), false if a channel case found
 * nothing to do after all (the select starts again). */
static bool m_sel_done(struct model *m, int id, bool perform, int *val)
{
    struct mact *a = &m->a[id];
    int kind = model__m_sel_cases(m, id)[a->sel_won], k;

    *val = 0;
    if (sk_chan(kind)) {
        k = sk_ch(kind);
        if (!perform) {
            if (model__mch_ready(m, k, sk_send(kind)) && !m->ch[k].closed)
                model__mch_wake_one(m, k, !sk_send(kind), false);
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
            model__m_q_serve_putters(m);
            *val = -ESHUTDOWN;
            return true;
        }
        model__m_q_push(m, a->cmd.val);
        return true;
    }
    if (m->q_shutdown == 2) {
        *val = -ESHUTDOWN;
        return true;
    }
    m->q_res_get--;
    if (!perform) {
        model__m_q_serve_getters(m);
        return true;
    }
    *val = model__m_q_pop(m);
    return true;
}

/* model__m_exec() for the lock.  Returns true if the actor suspended, else false with
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
            model__m_lock_pass(m, LK_L);
        break;
    case C_LOCK_TRY:
        if (m->lk[LK_L].broken)
            rc = -EOWNERDEAD;
        else if (m->lk[LK_L].owner == id)
            rc = -EDEADLK;
        else if (m->lk[LK_L].owner >= 0)
            rc = -EAGAIN;
        else
            model__m_lock_take(m, LK_L, id);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for the semaphore.  Returns true if the actor suspended, else false with
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
            rc = model__m_check(m, id);
            if (rc)
                break;
            if (m->sem_value >= n && model__wq_first(m, WQ_SEM) < 0) {
                m->sem_value -= n;
                a->sem_held += n;
                break;
            }
            rc = model__m_wait_begin(m, id, WQ_SEM);
            if (rc)
                break;
            a->wn = n;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = model__m_wait_result(m, id);
        if (a->wstate == WS_GRANTED) {
            m->sem_pending -= n;
            if (rc != 0) {
                m->sem_value += n;
                model__m_sem_serve(m);
            }
        } else if (rc != 0) {
            model__m_sem_serve(m);
        }
        if (rc == 0)
            a->sem_held += n;
        break;
    case C_SEM_REL:
        n = (uint64_t)(c->arg % 3 + 1);
        rc = model__m_sem_release(m, n);
        if (rc == 0)
            a->sem_held -= n < a->sem_held ? n : a->sem_held;
        break;
    case C_SEM_TRY:
        n = (uint64_t)(c->arg % 3 + 1);
        if (m->cfg.sem_bounded && n > m->cfg.sem_v0)
            rc = -EINVAL;
        else if (m->sem_value < n || model__wq_first(m, WQ_SEM) >= 0)
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

/* model__m_exec() for the event.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_event(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_EV_WAIT:
        if (!resumed) {
            rc = model__m_check(m, id);
            if (rc || m->ev_set)
                break;
            rc = model__m_wait_begin(m, id, WQ_EV);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = model__m_wait_result(m, id);
        break;
    case C_EV_SET:
        model__m_ev_set(m);
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

/* model__m_exec() for the condition.  Returns true if the actor suspended, else false with
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
            rc = model__m_check(m, id);
            if (rc)
                break;
            model__m_lock_pass(m, LK_L);
            rc = model__m_wait_begin(m, id, WQ_COND);   /* check passed just now */
            a->phase = PH_WAIT1;
            return true;
        }
        if (a->phase == PH_WAIT1) {
            rc = model__m_wait_result(m, id);
            if (a->wstate == WS_GRANTED) {
                m->cond_pending--;
                if (rc != 0)
                    model__m_cond_wake(m, 1);
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
        rc = model__m_cond_wake(m, c->op == C_COND_NOTIFY ? (unsigned)(c->arg % 3) : ~0u);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for the queue's puts.  Returns true if the actor suspended, else false with
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
            rc = model__m_check(m, id);
            if (rc)
                break;
            if (model__m_q_free(m) > 0) {
                model__m_q_push(m, c->val);
                break;
            }
            rc = model__m_wait_begin(m, id, WQ_QPUT);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = model__m_wait_result(m, id);
        if (a->wstate != WS_GRANTED)
            break;
        m->q_pending--;
        if (a->wres != 0)
            break;
        m->q_res_put--;
        if (rc == 0 && m->q_shutdown)
            rc = -ESHUTDOWN;
        if (rc) {
            model__m_q_serve_putters(m);
            break;
        }
        model__m_q_push(m, c->val);
        break;
    case C_Q_TRYPUT:
        rc = model__m_q_tryput(m, c->val);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for the queue's gets.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_queue_get(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_Q_GET:
        val = -1;
        if (!resumed) {
            rc = model__m_check(m, id);
            if (rc)
                break;
            if (model__m_q_avail(m) > 0) {
                val = model__m_q_pop(m);
                break;
            }
            if (m->q_shutdown) {
                rc = -ESHUTDOWN;
                break;
            }
            rc = model__m_wait_begin(m, id, WQ_QGET);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = model__m_wait_result(m, id);
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
            model__m_q_serve_getters(m);
            break;
        }
        val = model__m_q_pop(m);
        break;
    case C_Q_TRYGET:
        val = -1;
        if (model__m_q_avail(m) == 0)
            rc = m->q_shutdown ? -ESHUTDOWN : -EAGAIN;
        else
            val = model__m_q_pop(m);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for the queue's task_done, join and shutdown.  Returns true if the actor suspended, else false with
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
            model__m_q_wake_all(m, WQ_QJOIN, 0);
        break;
    case C_Q_JOIN:
        if (!resumed) {
            rc = model__m_check(m, id);
            if (rc || m->q_unfinished == 0)
                break;
            rc = model__m_wait_begin(m, id, WQ_QJOIN);
            if (rc)
                break;
            a->phase = PH_WAIT1;
            return true;
        }
        rc = model__m_wait_result(m, id);
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
                model__m_q_wake_all(m, WQ_QJOIN, 0);
        } else if (m->q_shutdown == 0) {
            m->q_shutdown = 1;
        }
        model__m_q_wake_all(m, WQ_QGET, -ESHUTDOWN);
        model__m_q_wake_all(m, WQ_QPUT, -ESHUTDOWN);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for singleflight.  Returns true if the actor suspended, else false with
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
            rc = model__m_check(m, id);
            if (rc)
                break;
            if (m->fl_active[k]) {
                rc = model__m_wait_begin(m, id, WQ_FL0 + k);
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
            rc = model__m_wait_result(m, id);
            if (a->wstate != WS_GRANTED)
                break;
            if (!a->wlead) {
                rc = a->wres;
                val = a->wres >= 0 ? a->wval : -1;
                break;
            }
            if (rc) {
                if (!model__m_fl_hand_over(m, k)) {
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
            rc = model__m_wait_result(m, id);
        }
        goto fn_done;
    run_fn:
        rc = model__m_wait_begin(m, id, WQ_NONE);
        if (rc == 0) {
            a->phase = PH_FN;
            return true;
        }
    fn_done:
        if ((rc == -ECANCELED || rc == -ETIMEDOUT) && model__m_check(m, id) != 0 &&
            model__m_fl_hand_over(m, k))
            break;
        model__m_fl_finish(m, k, rc, val);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for the per-key locks.  Returns true if the actor suspended, else false with
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
            rc = model__m_check(m, id);
            if (rc)
                break;
            model__m_kl_ref(m, k);
            if (m_lock_acq_begin(m, id, LK_KL0 + k, PH_WAIT1, &rc))
                return true;
        } else {
            rc = m_lock_acq_end(m, id, LK_KL0 + k);
        }
        if (rc)
            model__m_kl_unref(m, k);
        break;
    case C_KL_TRY:
        k = c->arg % NKEYS;
        model__m_kl_ref(m, k);
        if (m->lk[LK_KL0 + k].broken)
            rc = -EOWNERDEAD;
        else if (m->lk[LK_KL0 + k].owner == id)
            rc = -EDEADLK;
        else if (m->lk[LK_KL0 + k].owner >= 0)
            rc = -EAGAIN;
        else
            model__m_lock_take(m, LK_KL0 + k, id);
        if (rc)
            model__m_kl_unref(m, k);
        break;
    case C_KL_REL:
        k = c->arg % NKEYS;
        if (!m->kl_exists[k] || m->lk[LK_KL0 + k].owner != id) {
            rc = -EPERM;
            break;
        }
        model__m_lock_pass(m, LK_KL0 + k);
        model__m_kl_unref(m, k);
        break;
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for sleep.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_sleep(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_SLEEP:
        if (!resumed) {
            rc = model__m_check(m, id);
            if (rc)
                break;
            if (model__r_sleep_waited(id)) {
                model__m_wait_begin(m, id, WQ_NONE);     /* the check passed just now */
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
            rc = model__m_check(m, id);
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

/* model__m_exec() for groups.  Returns true if the actor suspended, else false with
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
        if (m->na >= MAXA || model__m_live_count(m) >= MAXLIVE) {
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
            rc = model__m_wait_result(m, id);
            if (rc < 0 && !a->saved) {
                a->saved = rc;
                model__m_group_cancel(m, id);
                a->shielded = true;
            }
        }
        while (a->g_live) {
            rc = model__m_wait_begin(m, id, WQ_G0 + id);
            if (rc == 0) {
                a->phase = PH_WAIT1;
                return true;
            }
            if (!a->saved) {
                a->saved = rc;
                model__m_group_cancel(m, id);
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
        model__m_group_cancel(m, val);
        break;
    }
    default:
        break;
    }
    *rcp = rc;
    *valp = val;
    return false;
}

/* model__m_exec() for select.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_select(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    int rc = 0, val = 0;

    switch (m->a[id].cmd.op) {
    case C_SELECT:
        if (!resumed) {
            rc = model__m_check(m, id);
            if (rc)
                break;
        sel_again:
            if (m_sel_try(m, id, &rc, &val))
                break;
            /* Armed, then the wait's check: what it refuses is taken apart
             * at once, with nothing in between. */
            rc = model__m_wait_begin(m, id, WQ_NONE);
            if (rc)
                break;
            m_sel_arm(m, id);
            a->phase = PH_WAIT1;
            return true;
        }
        if (a->phase == PH_WAIT1) {
            a->sel_rc = model__m_wait_result(m, id);
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

            if (!sk_chan(model__m_sel_cases(m, id)[a->sel_di]))
                continue;
            if (nd->fired && !nd->delivered) {
                nd->settling = true;
                a->shielded = true;
                model__m_wait_begin(m, id, WQ_NONE);     /* shielded: never refused */
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

/* model__m_exec() for the channels.  Returns true if the actor suspended, else false with
 * the command's result in *rcp and *valp. */
static bool m_exec_chan(struct model *m, int id, bool resumed, int *rcp, int *valp)
{
    struct mact *a = &m->a[id];
    struct cmd *c = &a->cmd;
    int rc = 0, val = 0;
    int k;

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
            rc = model__m_check(m, id);
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
            rc = model__m_wait_begin(m, id, WQ_NONE);
            if (rc)
                break;
            model__mch_link(m, k, send, id * ND_PER + ND_PARK);
            a->phase = PH_WAIT1;
            return true;
        }
        if (a->phase == PH_WAIT1) {
            a->saved = model__m_wait_result(m, id);
            if (nd->linked) {
                model__mch_unlink(m, k, send, id * ND_PER + ND_PARK);
            } else if (!nd->delivered) {
                nd->settling = true;
                a->shielded = true;
                model__m_wait_begin(m, id, WQ_NONE);
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
                model__mch_wake_one(m, k, !send, false);
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

/* Start or continue the actor's command.  Returns through model__m_done() or by
 * suspending (st M_WAIT). */
void model__m_exec(struct model *m, int id, bool resumed)
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
    model__m_done(m, id, rc, val);
}

/* C_CLEANUP: give back the lock, the keys (in key order) and the permits
 * held, as r_cleanup() does. */
void model__m_cleanup(struct model *m, int id)
{
    struct mact *a = &m->a[id];
    int k;

    if (m->lk[LK_L].owner == id)
        model__m_lock_pass(m, LK_L);
    for (k = 0; k < NKEYS; k++)
        if (m->kl_exists[k] && m->lk[LK_KL0 + k].owner == id) {
            model__m_lock_pass(m, LK_KL0 + k);
            model__m_kl_unref(m, k);
        }
    if (a->sem_held && !(m->cfg.sem_bounded &&
                         m->sem_value + m->sem_pending + a->sem_held > m->cfg.sem_v0)) {
        m->sem_value += a->sem_held;
        a->sem_held = 0;
        model__m_sem_serve(m);
    }
    /* Its group, whose children have all ended (guide() makes sure):
     * ferry_group_wait() returns at once and closes it. */
    if (a->g_init && !a->g_closed && a->g_live == 0)
        a->g_closed = true;
}
