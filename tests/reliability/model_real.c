/* model_real.c - the real side (r_*): actor tasks calling the real
 * primitives on a real loop, what they saw, and the callbacks of timers
 * and posts.  See model.h.
 *
 * Loop thread only.
 */
#include "model_int.h"

struct seq *model__cur;   /* the sequence the actors belong to */
unsigned long model__stray_callbacks;   /* callbacks that ran after their sequence */

/* Outcome histogram: (command, return code) -> count, for model_hist_print(). */
static unsigned long hist[C_NCOP][160];

static void model_hist_add(int op, int rc)
{
    int i = rc < 0 ? -rc : 150 + (rc > 9 ? 9 : rc);
    if (i >= 160)
        i = 159;
    hist[op][i]++;
}

void model_hist_print(FILE *out)
{
    int op, i;

    for (op = 0; op < C_NCOP; op++) {
        fprintf(out, "%-16s", model__cop_names[op]);
        for (i = 0; i < 160; i++)
            if (hist[op][i])
                fprintf(out, " %s%d:%lu", i >= 150 ? "+" : "-", i >= 150 ? i - 150 : i, hist[op][i]);
        fprintf(out, "\n");
    }
}

void model__failf(struct seq *s, const char *fmt, ...)
{
    va_list ap;

    if (s->failed)
        return;
    s->failed = true;
    s->rep->failed = 1;
    s->rep->op_index = s->opi;
    va_start(ap, fmt);
    vsnprintf(s->rep->msg, sizeof s->rep->msg, fmt, ap);
    va_end(ap);
    if (s->trace)
        fprintf(s->trace, "FAIL at op %d: %s\n", s->opi, s->rep->msg);
}

/* The actor a task runs, by its argument: a child of a group has no
 * handle, and the task structure of one that ended may already be
 * another's. */
int model__r_id(struct seq *s, const ferry_task *t)
{
    if (t && t->fn == model__actor_main && (const struct ract *)t->arg >= s->r &&
        (const struct ract *)t->arg < s->r + s->na)
        return (int)((const struct ract *)t->arg - s->r);
    return -2;
}

/* Actor i's task while it may still be read: through the handle of one the
 * driver spawned, through its group's list of live children for a child
 * (NULL once it has ended). */
ferry_task *model__r_task(struct seq *s, int i)
{
    struct ract *a = &s->r[i];
    struct ferry__link *l;

    if (a->owner < 0)
        return a->t;
    ferry__list_foreach(l, &s->r[a->owner].group.children) {
        ferry_task *t = ferry__container_of(l, ferry_task, group_link);
        if (t->arg == a)
            return t;
    }
    return NULL;
}

int model__r_state(struct seq *s, int i)
{
    ferry_task *t = model__r_task(s, i);

    return t ? (int)ferry_task_state(t) : FERRY_TASK_DONE;
}

bool model__r_live(struct seq *s, int i)
{
    return model__r_state(s, i) != FERRY_TASK_DONE;
}

static int r_live_count(struct seq *s)
{
    int i, n = 0;

    for (i = 0; i < s->na; i++)
        n += model__r_live(s, i);
    return n;
}

bool model__r_sleep_waited(int id)
{
    struct seq *s = model__cur;
    struct ract *a = &s->r[id];
    ferry_task *t = model__r_task(s, id);
    bool waited = t && t->timer.seq == a->sleep_seq0 && t->timer.key == a->sleep_until;

    /* Waiting is right while the deadline is ahead; yielding only once it
     * has passed, and a deadline an hour away never has. */
    if (!waited && (ferry_now() < a->sleep_until || a->cmd.arg % 3 == SL_FAR))
        model__failf(s, "actor %d: sleep yielded although its deadline had not passed", id);
    if (waited && a->cmd.arg % 3 == SL_PAST)
        model__failf(s, "actor %d: sleep with a deadline in the past armed a timer", id);
    return waited;
}

/* The real side of m_cancel_target(). */
static int r_cancel_target(struct seq *s, int sel)
{
    bool live[MAXA], sleeping[MAXA];
    int parent[MAXA], i;

    for (i = 0; i < s->na; i++) {
        live[i] = model__r_live(s, i);
        sleeping[i] = s->r[i].cmd.op == C_SLEEP;
        parent[i] = s->r[i].owner;
    }
    return model__cancel_target(s->na, live, sleeping, parent, sel);
}

/* A timer's or a posted callback: run its action on the real primitives. */
void model__cb_main(void *arg)
{
    struct rcb *c = arg;
    struct seq *s = c->s;
    const struct mcb *mc;
    int item;

    if (s != model__cur) {
        model__stray_callbacks++;          /* ran after its sequence ended */
        return;
    }
    mc = &s->m.cb[c->i];
    c->ran++;
    if (!c->pending)
        model__failf(s, "%s %d ran although it had run or was cancelled", mc->timer ? "timer" : "post",
              c->i);
    c->pending = false;
    c->h = NULL;
    c->target = -1;
    switch (mc->act) {
    case A_EV_SET:
        c->rc = ferry_event_set(&s->ev);
        break;
    case A_EV_CLEAR:
        c->rc = ferry_event_clear(&s->ev);
        break;
    case A_SEM_REL:
        c->rc = ferry_sem_release_n(&s->sem, 1);
        if (c->rc == 0)
            s->sem_extra++;
        break;
    case A_CANCEL:
        c->target = r_cancel_target(s, mc->sel);
        c->rc = c->target >= 0 ? ferry_task_cancel(model__r_task(s, c->target)) : 0;
        break;
    case A_Q_PUT:
        item = mc->val;
        c->rc = ferry_queue_try_put(&s->q, &item);
        if (c->rc == 0 && s->ninserted < MAXITEMS)
            s->inserted[s->ninserted++] = item;
        break;
    default:
        c->rc = 0;
        break;
    }
    if (s->trace)
        fprintf(s->trace, "    %s %d: %s -> %d\n", mc->timer ? "timer" : "post", c->i,
                model__act_names[mc->act], c->rc);
}

int model__qcmp(const void *a, const void *b, void *arg)
{
    (void)arg;
    return model__prio_of(*(const int *)a) - model__prio_of(*(const int *)b);
}

static int fl_fn(void *arg, void *out, size_t size)
{
    struct ract *a = arg;
    struct ferry__waiter w;
    int k = a->cmd.arg % NKEYS, rc;

    (void)size;
    ferry__waiter_init(&w, ferry_task_current(), "flight fn", a);
    a->fnw = &w;
    if (++model__cur->in_fn[k] > 1)
        model__failf(model__cur, "singleflight: %d calls in flight for key %d", model__cur->in_fn[k], k);
    rc = ferry__wait(NULL, &w, FERRY_NEVER);
    model__cur->in_fn[k]--;
    a->fnw = NULL;
    if (w.state == FERRY__W_GRANTED) {
        if (w.result >= 0)
            *(int *)out = a->fn_val;
        return w.result;
    }
    return rc;
}

/* Run the actor's command on the real primitives. */
/* An item a get returned: exactly once, and one that was put. */
static void r_got(struct seq *s, int item)
{
    int i;

    for (i = 0; i < s->ngot; i++)
        if (s->got[i] == item)
            model__failf(s, "queue: item %d got twice", item);
    for (i = 0; i < s->ninserted; i++)
        if (s->inserted[i] == item)
            break;
    if (i == s->ninserted)
        model__failf(s, "queue: got item %d that was never inserted", item);
    if (s->ngot < MAXITEMS)
        s->got[s->ngot++] = item;
}

/* An item sent into channel k, by a task or the channel thread. */
void model__r_ch_sent(struct seq *s, int k, int item)
{
    if (s->nch_in[k] < MAXITEMS)
        s->ch_in[k][s->nch_in[k]++] = item;
}

/* An item received from channel k: the oldest one not received yet (the
 * channel is a FIFO, and nothing suspends between a take and this). */
void model__r_ch_got(struct seq *s, int k, int item)
{
    int i = s->nch_out[k];

    if (i >= s->nch_in[k] || s->ch_in[k][i] != item)
        model__failf(s, "channel %d: receive #%d got %d, sent #%d was %d", k, i, item, i,
              i < s->nch_in[k] ? s->ch_in[k][i] : -1);
    if (i < MAXITEMS)
        s->ch_out[k][s->nch_out[k]++] = item;
}

/* r_exec() for the lock. */
static int r_exec_lock(struct seq *s, struct ract *a)
{
    int rc;

    switch (a->cmd.op) {
    case C_LOCK_ACQ:
        rc = ferry_lock_acquire(&s->lock);
        if (rc == 0)
            a->holds_l = true;
        return rc;
    case C_LOCK_REL:
        rc = ferry_lock_release(&s->lock);
        if (rc == 0)
            a->holds_l = false;
        return rc;
    case C_LOCK_TRY:
        rc = ferry_lock_try_acquire(&s->lock);
        if (rc == 0)
            a->holds_l = true;
        return rc;
    default:
        return 0;
    }
}

/* r_exec() for the semaphore. */
static int r_exec_sem(struct seq *s, struct ract *a)
{
    struct cmd *c = &a->cmd;
    int rc;
    uint64_t n = (uint64_t)(c->arg % 3 + 1);

    switch (c->op) {
    case C_SEM_ACQ:
        a->in_sem = true;
        a->sem_cur = n;
        rc = ferry_sem_acquire_n(&s->sem, n);
        a->in_sem = false;
        if (rc == 0)
            a->sem_held += n;
        return rc;
    case C_SEM_REL:
        rc = ferry_sem_release_n(&s->sem, n);
        if (rc == 0) {
            uint64_t mine = n < a->sem_held ? n : a->sem_held;
            a->sem_held -= mine;
            s->sem_extra += n - mine;
        }
        return rc;
    case C_SEM_TRY:
        rc = ferry_sem_try_acquire_n(&s->sem, n);
        if (rc == 0)
            a->sem_held += n;
        return rc;
    default:
        return 0;
    }
}

/* r_exec() for the event. */
static int r_exec_event(struct seq *s, struct ract *a)
{
    switch (a->cmd.op) {
    case C_EV_WAIT:
        return ferry_event_wait(&s->ev);
    case C_EV_SET:
        return ferry_event_set(&s->ev);
    case C_EV_CLEAR:
        return ferry_event_clear(&s->ev);
    default:
        return 0;
    }
}

/* r_exec() for the condition. */
static int r_exec_cond(struct seq *s, struct ract *a)
{
    struct cmd *c = &a->cmd;
    int rc;

    switch (c->op) {
    case C_COND_WAIT: {
        /* The lock is not ours while we wait; held again on every return
         * but -EOWNERDEAD (and -EPERM: it was not held). */
        bool had = a->holds_l;
        a->holds_l = false;
        rc = ferry_cond_wait(&s->cond);
        a->holds_l = had && rc != -EOWNERDEAD;
        return rc;
    }
    case C_COND_NOTIFY:
        return ferry_cond_notify(&s->cond, (unsigned)(c->arg % 3));
    case C_COND_NOTIFY_ALL:
        return ferry_cond_notify_all(&s->cond);
    default:
        return 0;
    }
}

/* r_exec() for the queue. */
static int r_exec_queue(struct seq *s, struct ract *a, int *val)
{
    struct cmd *c = &a->cmd;
    int rc, item;

    switch (c->op) {
    case C_Q_PUT:
    case C_Q_TRYPUT:
        item = c->val;
        rc = c->op == C_Q_PUT ? ferry_queue_put(&s->q, &item) : ferry_queue_try_put(&s->q, &item);
        if (rc == 0 && s->ninserted < MAXITEMS)
            s->inserted[s->ninserted++] = item;
        return rc;
    case C_Q_GET:
    case C_Q_TRYGET:
        item = -1;
        rc = c->op == C_Q_GET ? ferry_queue_get(&s->q, &item) : ferry_queue_try_get(&s->q, &item);
        *val = item;
        if (rc == 0)
            r_got(s, item);
        return rc;
    case C_Q_DONE:
        return ferry_queue_task_done(&s->q);
    case C_Q_JOIN:
        return ferry_queue_join(&s->q);
    case C_Q_SHUT:
        if ((c->arg & 1) && s->q.shutdown != 2)
            s->dropped += (int)ferry_queue_size(&s->q);
        return ferry_queue_shutdown(&s->q, c->arg & 1);
    default:
        return 0;
    }
}

/* r_exec() for select. */
static int r_exec_select(struct seq *s, struct ract *a, int *val)
{
    struct cmd *c = &a->cmd;
    int k, rc;

    switch (c->op) {
    case C_SELECT: {
        /* Listed order (FERRY_SELECT_PRIORITY), so the model knows which
         * ready case is performed. */
        const int *kinds = model__sel_pair(s->fmt, c->arg);
        ferry_case cs[2];
        int put_item = c->val, got[2] = { -1, -1 };

        for (k = 0; k < 2; k++)
            switch (kinds[k]) {
            case SK_GET:
                cs[k] = FERRY_CASE_GET_INIT(&s->q, &got[k]);
                break;
            case SK_PUT:
                cs[k] = FERRY_CASE_PUT_INIT(&s->q, &put_item);
                break;
            case SK_EV:
                cs[k] = FERRY_CASE_EVENT_INIT(&s->ev);
                break;
            default:
                cs[k] = sk_send(kinds[k]) ? FERRY_CASE_SEND_INIT(s->ch[sk_ch(kinds[k])], &put_item)
                                          : FERRY_CASE_RECV_INIT(s->ch[sk_ch(kinds[k])], &got[k]);
                break;
            }
        rc = ferry_select(cs, 2, FERRY_SELECT_PRIORITY);
        if (rc < 0)
            return rc;
        if (rc > 1) {
            model__failf(s, "select returned %d for two cases", rc);
            return rc;
        }
        if (cs[rc].result) {
            *val = cs[rc].result;
            return rc;
        }
        switch (kinds[rc]) {
        case SK_GET:
            *val = got[rc];
            r_got(s, got[rc]);
            break;
        case SK_PUT:
            if (s->ninserted < MAXITEMS)
                s->inserted[s->ninserted++] = put_item;
            break;
        case SK_EV:
            break;
        default:
            if (sk_send(kinds[rc])) {
                model__r_ch_sent(s, sk_ch(kinds[rc]), put_item);
            } else {
                *val = got[rc];
                model__r_ch_got(s, sk_ch(kinds[rc]), got[rc]);
            }
            break;
        }
        return rc;
    }
    default:
        return 0;
    }
}

/* r_exec() for the channels. */
static int r_exec_chan(struct seq *s, struct ract *a, int *val)
{
    struct cmd *c = &a->cmd;
    int k, rc, item;

    switch (c->op) {
    case C_CH_SEND:
        k = cmd_ch(c->arg);
        item = c->val;
        rc = ferry_chan_send_elem(s->ch[k], &item);
        if (rc == 0)
            model__r_ch_sent(s, k, item);
        return rc;
    case C_CH_RECV:
        k = cmd_ch(c->arg);
        item = -1;
        rc = ferry_chan_recv_elem(s->ch[k], &item);
        *val = item;
        if (rc == 0)
            model__r_ch_got(s, k, item);
        return rc;
    default:
        return 0;
    }
}

/* r_exec() for singleflight. */
static int r_exec_flight(struct seq *s, struct ract *a, int *val)
{
    struct cmd *c = &a->cmd;
    int k, rc, item;

    switch (c->op) {
    case C_FL_DO:
        k = c->arg % NKEYS;
        item = -1;
        rc = ferry_flight_do(&s->fl, &k, sizeof k, fl_fn, a, &item, sizeof item);
        *val = item;
        return rc;
    default:
        return 0;
    }
}

/* r_exec() for the per-key locks. */
static int r_exec_keylock(struct seq *s, struct ract *a)
{
    struct cmd *c = &a->cmd;
    int k, rc;

    switch (c->op) {
    case C_KL_ACQ:
        k = c->arg % NKEYS;
        rc = ferry_keylock_acquire(&s->kl, &k, sizeof k);
        if (rc == 0)
            a->holds_kl[k] = true;
        return rc;
    case C_KL_REL:
        k = c->arg % NKEYS;
        rc = ferry_keylock_release(&s->kl, &k, sizeof k);
        if (rc == 0)
            a->holds_kl[k] = false;
        return rc;
    case C_KL_TRY:
        k = c->arg % NKEYS;
        rc = ferry_keylock_try_acquire(&s->kl, &k, sizeof k);
        if (rc == 0)
            a->holds_kl[k] = true;
        return rc;
    default:
        return 0;
    }
}

/* r_exec() for sleep. */
static int r_exec_sleep(struct seq *s, struct ract *a)
{
    struct cmd *c = &a->cmd;
    int rc;

    switch (c->op) {
    case C_SLEEP: {
        int64_t until;

        switch (c->arg % 3) {
        case SL_PAST:
            until = 1;
            break;
        case SL_SHORT:
            until = ferry_now() + FERRY_USEC(1 + (c->arg >> 2) % 4);
            break;
        default:
            until = ferry_now() + FERRY_SEC(3600);
            break;
        }
        a->sleep_until = until;
        a->sleep_seq0 = s->loop->timers.seq;
        a->in_sleep = true;
        rc = ferry_sleep_until(until);
        a->in_sleep = false;
        if (rc == 0 && ferry_now() < until)
            model__failf(s, "actor %d: sleep returned 0 before its deadline", (int)(a - s->r));
        return rc;
    }
    default:
        return 0;
    }
}

/* r_exec() for groups. */
static int r_exec_group(struct seq *s, struct ract *a, int *val)
{
    struct cmd *c = &a->cmd;
    int rc;

    switch (c->op) {
    case C_G_SPAWN: {
        int id = (int)(a - s->r), cid = s->na;
        struct ract *ch;

        *val = -1;
        if (!a->g_used || a->group.closed) {
            rc = ferry_group_init(&a->group);
            if (rc)
                return rc;
            a->g_used = true;
        }
        if (cid >= MAXA || r_live_count(s) >= MAXLIVE)
            return -EAGAIN;
        ch = &s->r[cid];
        memset(ch, 0, sizeof *ch);
        ch->owner = id;
        rc = ferry_group_spawn(&a->group, model__actor_main, ch, &(ferry_task_opts){ .name = "child" });
        if (rc == 0) {
            s->na++;
            *val = cid;
        }
        return rc;
    }
    case C_G_WAIT:
        return ferry_group_wait(&a->group);
    case C_G_CANCEL: {
        int ids[MAXA], no = 0, i;

        for (i = 0; i < s->na; i++)
            if (s->r[i].g_used && model__r_live(s, i))
                ids[no++] = i;
        *val = -1;
        if (!no)
            return -ENOENT;
        *val = ids[c->arg % no];
        return ferry_group_cancel(&s->r[*val].group);
    }
    default:
        return 0;
    }
}

static int r_exec(struct seq *s, struct ract *a, int *val)
{
    *val = 0;
    switch (a->cmd.op) {
    case C_LOCK_ACQ:
    case C_LOCK_REL:
    case C_LOCK_TRY:
        return r_exec_lock(s, a);
    case C_SEM_ACQ:
    case C_SEM_REL:
    case C_SEM_TRY:
        return r_exec_sem(s, a);
    case C_EV_WAIT:
    case C_EV_SET:
    case C_EV_CLEAR:
        return r_exec_event(s, a);
    case C_COND_WAIT:
    case C_COND_NOTIFY:
    case C_COND_NOTIFY_ALL:
        return r_exec_cond(s, a);
    case C_Q_PUT:
    case C_Q_TRYPUT:
    case C_Q_GET:
    case C_Q_TRYGET:
    case C_Q_DONE:
    case C_Q_JOIN:
    case C_Q_SHUT:
        return r_exec_queue(s, a, val);
    case C_SELECT:
        return r_exec_select(s, a, val);
    case C_CH_SEND:
    case C_CH_RECV:
        return r_exec_chan(s, a, val);
    case C_FL_DO:
        return r_exec_flight(s, a, val);
    case C_KL_ACQ:
    case C_KL_REL:
    case C_KL_TRY:
        return r_exec_keylock(s, a);
    case C_SLEEP:
        return r_exec_sleep(s, a);
    case C_G_SPAWN:
    case C_G_WAIT:
    case C_G_CANCEL:
        return r_exec_group(s, a, val);
    default:
        return 0;
    }
}

/* Teardown: give back everything the actor holds. */
static void r_cleanup(struct seq *s, struct ract *a)
{
    int k, rc;

    if (a->holds_l) {
        rc = ferry_lock_release(&s->lock);
        if (rc)
            model__failf(s, "cleanup: lock_release by its holder returned %d", rc);
        a->holds_l = false;
    }
    for (k = 0; k < NKEYS; k++)
        if (a->holds_kl[k]) {
            rc = ferry_keylock_release(&s->kl, &k, sizeof k);
            if (rc)
                model__failf(s, "cleanup: keylock_release(%d) by its holder returned %d", k, rc);
            a->holds_kl[k] = false;
        }
    if (a->sem_held) {
        /* A bounded semaphore may refuse if others released permits they
         * never held (sem_extra): then the permits stay counted as held. */
        rc = ferry_sem_release_n(&s->sem, a->sem_held);
        if (rc == 0)
            a->sem_held = 0;
        else if (!(rc == -EOVERFLOW && s->cfg.sem_bounded && s->sem_extra > 0))
            model__failf(s, "cleanup: sem_release(%" PRIu64 ") of held permits returned %d (value %" PRIu64 ")",
                  a->sem_held, rc, s->sem.value);
    }
    /* No child outlives its group: wait for them (at teardown they are
     * being cancelled and cleaned up too). */
    if (a->g_used && !a->group.closed)
        ferry_group_wait(&a->group);
}

int model__actor_main(void *arg)
{
    struct ract *a = arg;
    struct seq *s = model__cur;
    ferry_task *self = ferry_task_current();

    for (;;) {
        struct ferry__waiter w;
        ferry_scope shield, dl;
        int rc, val;

        ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
        ferry__waiter_init(&w, self, "park", a);
        a->parkw = &w;
        rc = ferry__wait(NULL, &w, FERRY_NEVER);
        a->parkw = NULL;
        ferry_scope_exit(&shield);
        if (rc != 0)
            model__failf(s, "actor %d: park returned %d", model__r_id(s, self), rc);
        if (a->cmd.op == C_EXIT) {
            a->ended = true;
            return 0;
        }
        if (a->cmd.op == C_FAIL) {
            a->ended = true;
            return model__fail_status(a->cmd.arg);
        }
        if (a->cmd.op == C_CLEANUP) {
            r_cleanup(s, a);
            a->ended = true;
            return 0;
        }
        if (a->cmd.dl != DL_NONE) {
            ferry_scope_enter(&dl, a->cmd.dl == DL_FAR ? INT64_MAX - 1 : 1, 0);
            a->scope = &dl;
        }
        rc = r_exec(s, a, &val);
        if (a->cmd.dl != DL_NONE) {
            a->scope = NULL;
            ferry_scope_exit(&dl);
        }
        a->done_n++;
        a->last_rc = rc;
        a->last_val = val;
        model_hist_add(a->cmd.op, rc);
        if (s->trace)
            fprintf(s->trace, "    actor %d: %s -> %d%s (val %d)\n", model__r_id(s, self),
                    model__cop_names[a->cmd.op], rc, rc < 0 ? "" : "", val);
    }
}
