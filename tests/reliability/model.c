/* model.c - the model-based tester: decoder, reference model, interpreter
 * on a real loop, comparisons and invariants.  See model.h.
 *
 * Layout of this file:
 *   1. operations and their decoding from bytes;
 *   2. the reference model (m_*): a sequential simulation of tasks, a FIFO
 *      run queue and every primitive, from the header contracts;
 *   3. the real side (r_*): actor tasks calling the real primitives;
 *   4. the driver task: runs each operation on both, compares, checks
 *      invariants, tears the sequence down.
 *
 * Loop thread only, but for the thread that posts callbacks (D_POST).
 * Uses ferry internals (linked from ferry_static) to read the run queue,
 * the primitives' counters, a group's children and a task's timer node,
 * and to fire a task's timer.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <semaphore.h>

#include "loop_int.h"
#include "ferry/ferry.h"
#include "ferry/select.h"
#include "model.h"

/* ---- 1. operations ---------------------------------------------------- */

enum dop {
    D_SPAWN, D_CANCEL, D_EXPIRE, D_STEP, D_QUIESCE, D_FL_FINISH, D_CMD,
    D_TIMER, D_TCANCEL, D_POST, D_WAIT,
    D_CHT,       /* format 4: the channel thread sends, receives or closes */
};

enum cop {
    C_LOCK_ACQ, C_LOCK_REL, C_LOCK_TRY,
    C_SEM_ACQ, C_SEM_REL, C_SEM_TRY,
    C_EV_WAIT, C_EV_SET, C_EV_CLEAR,
    C_COND_WAIT, C_COND_NOTIFY, C_COND_NOTIFY_ALL,
    C_Q_PUT, C_Q_GET, C_Q_TRYPUT, C_Q_TRYGET, C_Q_DONE, C_Q_JOIN, C_Q_SHUT,
    C_FL_DO,
    C_KL_ACQ, C_KL_REL, C_KL_TRY,
    C_EXIT,
    C_CLEANUP,   /* teardown only: release everything held, then end */
    C_SLEEP, C_G_SPAWN, C_G_WAIT, C_G_CANCEL,
    C_FAIL,      /* end with a status that is not 0 */
    C_SELECT,    /* ferry_select() over two cases (sel_pair()) */
    C_CH_SEND, C_CH_RECV,   /* format 4: a task's send to, receive from a channel */
    C_NCOP
};

static const char *const cop_names[] = {
    "lock_acquire", "lock_release", "lock_try",
    "sem_acquire", "sem_release", "sem_try",
    "event_wait", "event_set", "event_clear",
    "cond_wait", "cond_notify", "cond_notify_all",
    "queue_put", "queue_get", "queue_try_put", "queue_try_get", "queue_task_done",
    "queue_join", "queue_shutdown",
    "flight_do",
    "keylock_acquire", "keylock_release", "keylock_try",
    "exit", "cleanup",
    "sleep", "group_spawn", "group_wait", "group_cancel",
    "fail", "select", "chan_send", "chan_recv",
};

/* Command weights of format 1: index by byte % length.  Never change it:
 * stored sequences of format 1 decode through it. */
static const uint8_t cmd_table_v1[] = {
    C_LOCK_ACQ, C_LOCK_ACQ, C_LOCK_ACQ, C_LOCK_REL, C_LOCK_REL, C_LOCK_REL, C_LOCK_TRY,
    C_SEM_ACQ, C_SEM_ACQ, C_SEM_ACQ, C_SEM_REL, C_SEM_REL, C_SEM_TRY,
    C_EV_WAIT, C_EV_WAIT, C_EV_SET, C_EV_CLEAR,
    C_COND_WAIT, C_COND_WAIT, C_COND_NOTIFY, C_COND_NOTIFY_ALL,
    C_Q_PUT, C_Q_PUT, C_Q_GET, C_Q_GET, C_Q_TRYPUT, C_Q_TRYGET, C_Q_DONE, C_Q_JOIN,
    C_Q_SHUT,
    C_FL_DO, C_FL_DO,
    C_KL_ACQ, C_KL_ACQ, C_KL_REL, C_KL_REL, C_KL_TRY,
    C_EXIT,
};

/* Command weights of format 2: format 1's, plus sleeps and task groups. */
static const uint8_t cmd_table_v2[] = {
    C_LOCK_ACQ, C_LOCK_ACQ, C_LOCK_ACQ, C_LOCK_REL, C_LOCK_REL, C_LOCK_REL, C_LOCK_TRY,
    C_SEM_ACQ, C_SEM_ACQ, C_SEM_ACQ, C_SEM_REL, C_SEM_REL, C_SEM_TRY,
    C_EV_WAIT, C_EV_WAIT, C_EV_SET, C_EV_CLEAR,
    C_COND_WAIT, C_COND_WAIT, C_COND_NOTIFY, C_COND_NOTIFY_ALL,
    C_Q_PUT, C_Q_PUT, C_Q_GET, C_Q_GET, C_Q_TRYPUT, C_Q_TRYGET, C_Q_DONE, C_Q_JOIN,
    C_Q_SHUT,
    C_FL_DO, C_FL_DO,
    C_KL_ACQ, C_KL_ACQ, C_KL_REL, C_KL_REL, C_KL_TRY,
    C_EXIT,
    C_SLEEP, C_SLEEP, C_SLEEP,
    C_G_SPAWN, C_G_SPAWN, C_G_SPAWN, C_G_WAIT, C_G_WAIT, C_G_CANCEL, C_FAIL, C_FAIL,
};

/* Command weights of format 3: format 2's, plus selects. */
static const uint8_t cmd_table_v3[] = {
    C_LOCK_ACQ, C_LOCK_ACQ, C_LOCK_ACQ, C_LOCK_REL, C_LOCK_REL, C_LOCK_REL, C_LOCK_TRY,
    C_SEM_ACQ, C_SEM_ACQ, C_SEM_ACQ, C_SEM_REL, C_SEM_REL, C_SEM_TRY,
    C_EV_WAIT, C_EV_WAIT, C_EV_SET, C_EV_CLEAR,
    C_COND_WAIT, C_COND_WAIT, C_COND_NOTIFY, C_COND_NOTIFY_ALL,
    C_Q_PUT, C_Q_PUT, C_Q_GET, C_Q_GET, C_Q_TRYPUT, C_Q_TRYGET, C_Q_DONE, C_Q_JOIN,
    C_Q_SHUT,
    C_FL_DO, C_FL_DO,
    C_KL_ACQ, C_KL_ACQ, C_KL_REL, C_KL_REL, C_KL_TRY,
    C_EXIT,
    C_SLEEP, C_SLEEP, C_SLEEP,
    C_G_SPAWN, C_G_SPAWN, C_G_SPAWN, C_G_WAIT, C_G_WAIT, C_G_CANCEL, C_FAIL, C_FAIL,
    C_SELECT, C_SELECT, C_SELECT, C_SELECT, C_SELECT, C_SELECT,
};

/* Command weights of format 4: format 3's commands (most of them less
 * often), the channels' task side, and more selects (most of them over a
 * channel). */
static const uint8_t cmd_table_v4[] = {
    C_LOCK_ACQ, C_LOCK_ACQ, C_LOCK_REL, C_LOCK_REL, C_LOCK_TRY,
    C_SEM_ACQ, C_SEM_ACQ, C_SEM_REL, C_SEM_REL, C_SEM_TRY,
    C_EV_WAIT, C_EV_WAIT, C_EV_SET, C_EV_SET, C_EV_CLEAR,
    C_COND_WAIT, C_COND_NOTIFY,
    C_Q_PUT, C_Q_PUT, C_Q_PUT, C_Q_GET, C_Q_GET, C_Q_TRYPUT, C_Q_TRYGET, C_Q_DONE, C_Q_JOIN,
    C_Q_SHUT,
    C_FL_DO,
    C_KL_ACQ, C_KL_REL,
    C_EXIT,
    C_SLEEP, C_SLEEP,
    C_G_SPAWN, C_G_WAIT, C_G_CANCEL, C_FAIL,
    C_SELECT, C_SELECT, C_SELECT, C_SELECT, C_SELECT, C_SELECT, C_SELECT, C_SELECT,
    C_SELECT, C_SELECT, C_SELECT, C_SELECT,
    C_CH_SEND, C_CH_SEND, C_CH_SEND, C_CH_RECV, C_CH_RECV, C_CH_RECV,
};

/* The kinds of a select's cases: the queue's get and put, the event, and
 * a receive from and a send to each of the two channels. */
enum { SK_GET, SK_PUT, SK_EV, SK_CR0, SK_CS0, SK_CR1, SK_CS1 };

/* The two cases of a select command, listed in this order: format 3's by
 * its arg % 3 (get and event, put and event, get and put), format 4's by
 * its arg % 11 (a channel first or second, two channels, and format 3's). */
static const int sel_kinds[3][2] = { { SK_GET, SK_EV }, { SK_PUT, SK_EV }, { SK_GET, SK_PUT } };
static const int sel_kinds_v4[11][2] = {
    { SK_CR0, SK_GET }, { SK_CS0, SK_PUT }, { SK_CR0, SK_EV }, { SK_GET, SK_CR1 },
    { SK_CR0, SK_CR1 }, { SK_CR0, SK_CS1 }, { SK_CS0, SK_CR1 }, { SK_EV, SK_CS1 },
    { SK_GET, SK_EV }, { SK_PUT, SK_EV }, { SK_GET, SK_PUT },
};

static const int *sel_pair(int fmt, int arg)
{
    return fmt == MODEL_FMT_V4 ? sel_kinds_v4[arg % 11] : sel_kinds[arg % 3];
}

/* A channel case: which channel, which side. */
static bool sk_chan(int kind)
{
    return kind >= SK_CR0;
}

static int sk_ch(int kind)
{
    return (kind - SK_CR0) / 2;
}

static bool sk_send(int kind)
{
    return kind == SK_CS0 || kind == SK_CS1;
}

/* The channel of a task's channel command, and of the channel thread's
 * operation (its arg2). */
#define NCH 2
static int cmd_ch(int arg)
{
    return (arg >> 1) % NCH;
}

/* What the channel thread does (the operation's arg): try to send, try to
 * receive, or, rarely, close the channel. */
enum { CT_SEND, CT_RECV, CT_CLOSE };

static int cht_kind(int arg)
{
    if (arg % 16 == 14)
        return (arg >> 4) == 0 ? CT_CLOSE : CT_SEND;
    return arg % 16 < 7 ? CT_SEND : CT_RECV;
}

enum { DL_NONE = 0, DL_FAR = 1, DL_PAST = 2 };

/* Sleep kinds (the command's arg % 3): a deadline already past (the sleep
 * yields), a short one (tens of microseconds: it passes by the driver's
 * next wait), one an hour away (only cancellation or the command's
 * deadline end it). */
enum { SL_PAST = 0, SL_SHORT = 1, SL_FAR = 2 };

/* What a timer's or a posted callback does when it runs. */
enum { A_NOP, A_EV_SET, A_EV_CLEAR, A_SEM_REL, A_CANCEL, A_Q_PUT, NACT };

static const char *const act_names[] = {
    "nothing", "event_set", "event_clear", "sem_release", "cancel", "queue_try_put",
};

struct cmd {
    int op;       /* enum cop */
    int arg;      /* n for sem, key for flight/keylock, n for notify, immediate for shutdown */
    int dl;       /* DL_* */
    int val;      /* queue_put: the item */
};

struct op {
    int kind;     /* enum dop */
    int actor;    /* selector byte, resolved against the live actors */
    struct cmd c;
    int arg;      /* step count; flight key; timer kind; how many posts */
    int arg2;     /* flight: success? */
    int act;      /* timer, post: A_* */
    int sel;      /* timer, post: selector of A_CANCEL's target */
};

/* Decode the operation at b[0..MODEL_OP_BYTES) of a sequence of format
 * `fmt`.  Format 1 is the original mix; format 2 adds timers, thread
 * posts, the driver's wait for them, and sleep and group commands; format
 * 4 the channel thread. */
static void decode_op(int fmt, const uint8_t *b, struct op *o)
{
    unsigned k = b[0] % 100;

    memset(o, 0, sizeof *o);
    o->actor = b[1];
    if (fmt == MODEL_FMT_V1) {
        if (k < 5)
            o->kind = D_SPAWN;
        else if (k < 10)
            o->kind = D_CANCEL;
        else if (k < 14)
            o->kind = D_EXPIRE;
        else if (k < 36)
            o->kind = D_STEP;
        else if (k < 43)
            o->kind = D_QUIESCE;
        else if (k < 50)
            o->kind = D_FL_FINISH;
        else
            o->kind = D_CMD;
        o->c.op = cmd_table_v1[b[2] % sizeof cmd_table_v1];
    } else if (fmt == MODEL_FMT_V4) {
        /* Format 4: the channel thread, and more waits, in which the
         * wakes it sent reach the tasks. */
        static const struct { unsigned below; int kind; } mix[] = {
            { 5, D_SPAWN }, { 11, D_CANCEL }, { 15, D_EXPIRE }, { 29, D_STEP },
            { 33, D_QUIESCE }, { 35, D_FL_FINISH }, { 38, D_TIMER }, { 39, D_TCANCEL },
            { 41, D_POST }, { 47, D_WAIT }, { 59, D_CHT }, { 100, D_CMD },
        };
        unsigned i = 0;
        while (k >= mix[i].below)
            i++;
        o->kind = mix[i].kind;
        o->c.op = cmd_table_v4[b[2] % sizeof cmd_table_v4];
        o->act = b[4] % NACT;
        o->sel = b[5];
    } else {
        static const struct { unsigned below; int kind; } mix[] = {
            { 5, D_SPAWN }, { 10, D_CANCEL }, { 13, D_EXPIRE }, { 31, D_STEP },
            { 37, D_QUIESCE }, { 42, D_FL_FINISH }, { 45, D_TIMER }, { 47, D_TCANCEL },
            { 49, D_POST }, { 51, D_WAIT }, { 100, D_CMD },
        };
        unsigned i = 0;
        while (k >= mix[i].below)
            i++;
        o->kind = mix[i].kind;
        o->c.op = fmt == MODEL_FMT_V3 ? cmd_table_v3[b[2] % sizeof cmd_table_v3]
                                      : cmd_table_v2[b[2] % sizeof cmd_table_v2];
        o->act = b[4] % NACT;
        o->sel = b[5];
    }
    o->c.arg = b[3];
    o->c.dl = b[4] % 8 == 6 ? DL_FAR : b[4] % 8 == 7 ? DL_PAST : DL_NONE;
    o->arg = b[3];
    o->arg2 = b[5];
}

/* ---- shared sizes ------------------------------------------------------ */

#define MAXA     12         /* actors per sequence */
#define MAXLIVE  6          /* live at once */
#define NKEYS    2          /* flight and keylock keys */
#define MAXITEMS (2 * MODEL_MAX_OPS + 8)
#define MAXCB    64         /* timers and posts per sequence */
#define DRIVER   (-1)       /* the driver in the model's run queue */

/* Lock ids (for the held lists and exit hooks). */
enum { LK_L = 0, LK_KL0 = 1 };
#define NLOCKS (1 + NKEYS)

/* Wait queue ids of the model. */
enum {
    WQ_NONE = 0, WQ_LOCK, WQ_SEM, WQ_EV, WQ_COND, WQ_QGET, WQ_QPUT, WQ_QJOIN,
    WQ_FL0, WQ_KL0 = WQ_FL0 + NKEYS, WQ_G0 = WQ_KL0 + NKEYS, /* the group of actor i */
    WQ_N = WQ_G0 + MAXA
};

/* Per-sequence configuration, from the header bytes. */
struct config {
    uint64_t sem_v0;
    bool     sem_bounded;
    int      qkind;
    size_t   qcap;
    int      chcap;       /* format 4: each channel's capacity, 1 to 3 */
};

/* ---- 2. the reference model -------------------------------------------- */

enum { M_NONE = 0, M_READY, M_WAIT, M_DONE };
/* An actor's channel nodes, numbered actor * ND_PER + slot. */
enum { ND_PARK = 0, ND_SEL0 = 1, ND_PER = 3 };
enum { WS_IDLE = 0, WS_WAITING, WS_GRANTED, WS_CANCELLED, WS_TIMEDOUT };
/* Phases: PH_PARK is "idle, waiting for a command"; PH_START is "given a
 * command, not run yet"; others are per command. */
enum { PH_NEW = 0, PH_PARK, PH_START, PH_WAIT1, PH_WAIT2, PH_FN };

struct mact {
    int      st;          /* M_* */
    bool     started;     /* body entered (or finished before) */
    bool     cancelled;
    bool     shielded;    /* inside the condition's shielded re-acquire, or parked */
    bool     timer;       /* its deadline timer is in the heap */
    int      scope;       /* DL_* of the active command scope */
    int      phase;
    int      wstate;      /* WS_* of the current waiter */
    int      wres;
    int      wq;          /* WQ_* it is linked in */
    uint64_t wn;          /* semaphore weight */
    bool     wlead;       /* flight: woken to lead */
    int      wval;        /* flight: result copied in */
    struct cmd cmd;
    int      saved;       /* cond: rc of the notification wait */
    int      lockid;      /* lock/keylock command: which lock */
    int      nheld;
    int      held[NLOCKS];/* the locks it holds */
    uint64_t sem_held;
    int      done_n, last_rc, last_val;
    bool     slept;       /* sleep: its deadline passed (not its command's) */
    int      gi;          /* the actor whose group it is a child of, or -1 */
    /* select: its cases' waiters exist (from the arming until the actor
     * runs again, also after a cancel), each WS_WAITING (linked in its
     * queue; a channel's node may stay in its channel's queue after it is
     * idle), WS_IDLE or WS_GRANTED; the case whose grant won (-1: none)
     * and that grant's result; after the wait, its result and the next
     * case to take apart. */
    bool     sel_on;
    int      sel_cw[2];
    int      sel_won, sel_wres;
    int      sel_rc, sel_di;
    /* Its channel nodes: ND_PARK for a channel command, ND_SEL0 + i for
     * case i of a select. */
    struct mnode {
        bool linked;      /* in its channel's queue */
        bool fired;       /* a wake took it out */
        bool delivered;   /* that wake reached the loop */
        bool settling;    /* the actor waits (shielded) for that delivery */
    } nd[ND_PER];
    /* The group this actor owns (ferry_group_init on its first spawn). */
    bool     g_init, g_failing, g_closed;
    int      g_live, g_status;
    int      g_ch[MAXA];  /* live children, in spawn order */
    int      g_nch;
};

/* A channel (bridge/chan.c): a FIFO ring, the queues of task nodes of
 * each side, closed or not. */
struct mchan {
    int  items[MAXITEMS];
    int  n;
    bool closed;
    int  recvq[MAXA * ND_PER], nrecv;
    int  sendq[MAXA * ND_PER], nsend;
};

/* A timer (ferry_call_later) or a post from a thread, in the model. */
struct mcb {
    bool timer;           /* a timer, else a post */
    bool far;             /* timer an hour away: never fires within a sequence */
    int  act, sel, val;   /* A_*, its target selector, a queue item */
    bool pending;         /* not run, not cancelled */
    int  ran, rc, target; /* runs, what the action returned, whom it cancelled */
};

struct mlock {
    int  owner;           /* actor id or -1 */
    bool broken;
};

struct model {
    struct config cfg;
    int  fmt;             /* MODEL_FMT_* */
    struct mact a[MAXA];
    int  na;
    int  wq[WQ_N][MAXA];
    int  wqn[WQ_N];
    int  rq[64];
    int  rqh, rqn;
    struct mlock lk[NLOCKS];
    /* The loop's list of held locks (sync.c): a lock joins it when taken
     * free, keeps its place when handed over, leaves it when it is free
     * again or breaks.  A task that ends breaks its locks in this order. */
    int lheld[NLOCKS];
    int nlheld;
    /* semaphore */
    uint64_t sem_value;
    uint64_t sem_pending; /* permits granted to waiters not yet run */
    /* event */
    bool ev_set;
    /* condition */
    size_t cond_pending;
    /* queue */
    int    qitems[MAXITEMS];
    int    qn;
    size_t q_res_get, q_res_put, q_unfinished, q_pending;
    int    q_shutdown;
    /* flight */
    bool fl_active[NKEYS];
    int  fl_leader[NKEYS];
    /* keylock */
    bool kl_exists[NKEYS];
    int  kl_refs[NKEYS];
    /* timers and posts, in creation order */
    struct mcb cb[MAXCB];
    int  ncb;
    /* format 4: the channels, and the wakes the channel thread sent that
     * are in the loop's inbox (channel nodes, in order) */
    struct mchan ch[NCH];
    int  inbox[MAXA * ND_PER];
    int  ninbox;
};

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

static void m_ready(struct model *m, int id)
{
    m->a[id].st = M_READY;
    rq_push(m, id);
}

/* ferry__grant(). */
static bool m_grant(struct model *m, int id, int res)
{
    struct mact *a = &m->a[id];

    if (a->st != M_WAIT || a->wstate != WS_WAITING)
        return false;
    if (a->wq)
        wq_del(m, a->wq, id);
    a->wq = WQ_NONE;
    a->wstate = WS_GRANTED;
    a->wres = res;
    m_ready(m, id);
    return true;
}

/* The wait queue of a select case on a loop primitive. */
static int sel_wq(int kind)
{
    return kind == SK_GET ? WQ_QGET : kind == SK_PUT ? WQ_QPUT : WQ_EV;
}

static const int *m_sel_cases(const struct model *m, int id)
{
    return sel_pair(m->fmt, m->a[id].cmd.arg);
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
        m_ready(m, id);
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
        return m_grant(m, id, res);
    k = m_sel_cases(m, id);
    for (i = 0; i < 2; i++)
        if (!sk_chan(k[i]) && sel_wq(k[i]) == q && a->sel_cw[i] == WS_WAITING) {
            m_sel_grant(m, id, i, res);
            return true;
        }
    return false;
}

/* ---- channels ---------------------------------------------------------- */

static bool mch_ready(const struct model *m, int k, bool send)
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
        m_grant(m, id, 0);
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

static void mch_put(struct model *m, int k, int v, bool thread)
{
    struct mchan *c = &m->ch[k];

    c->items[c->n++] = v;
    mch_wake_one(m, k, true, thread);
}

static int mch_take(struct model *m, int k, bool thread)
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
static void mch_close(struct model *m, int k, bool thread)
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

static void m_cancel(struct model *m, int id)
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
        m_ready(m, id);
    }
}

/* The deadline of the actor's command scope passes. */
static void m_expire(struct model *m, int id)
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
            m_ready(m, id);
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
        m_grant(m, w, 0);
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
        m_grant(m, w, -EOWNERDEAD);
}

/* Semaphore. */
static void m_sem_serve(struct model *m)
{
    int w;

    while ((w = wq_first(m, WQ_SEM)) >= 0 && m->a[w].wn <= m->sem_value) {
        m->sem_value -= m->a[w].wn;
        m->sem_pending += m->a[w].wn;
        m_grant(m, w, 0);
    }
}

/* Condition. */
static int m_cond_wake(struct model *m, unsigned n)
{
    unsigned woken = 0;
    int w;

    while (woken < n && (w = wq_first(m, WQ_COND)) >= 0) {
        m->cond_pending++;
        m_grant(m, w, 0);
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

static int prio_of(int v)
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
            if (prio_of(m->qitems[i]) < prio_of(m->qitems[best]))
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
    m_grant(m, w, 0);
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
        m_grant(m, w, st);
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
        m_cancel(m, ch[i]);
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
            m_grant(m, w, 0);
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
static int fail_status(int arg)
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
static int cancel_target(int n, const bool *live, const bool *sleeping, const int *parent,
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
    return cancel_target(m->na, live, sleeping, parent, sel);
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
            m_cancel(m, c->target);
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
static bool r_sleep_waited(int id);

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
                    mch_put(m, sk_ch(k[i]), c->val, false);
                    return true;
                }
            } else {
                if (m->ch[sk_ch(k[i])].n > 0) {
                    *val = mch_take(m, sk_ch(k[i]), false);
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

    if (n->fired && a->sel_cw[i] != WS_GRANTED && mch_ready(m, k, sk_send(kind)) &&
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
            if (mch_ready(m, k, sk_send(kind)) && !m->ch[k].closed)
                mch_wake_one(m, k, !sk_send(kind), false);
            return false;
        }
        if (sk_send(kind)) {
            if (m->ch[k].closed) {
                *val = -ESHUTDOWN;
                return true;
            }
            if (m->ch[k].n < m->cfg.chcap) {
                mch_put(m, k, a->cmd.val, false);
                return true;
            }
            return false;
        }
        if (m->ch[k].n > 0) {
            *val = mch_take(m, k, false);
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
            if (r_sleep_waited(id)) {
                m_wait_begin(m, id, WQ_NONE);     /* the check passed just now */
                a->timer = true;                  /* the sleep's own deadline */
                a->slept = false;
                a->phase = PH_WAIT1;
                return true;
            }
            /* The deadline had passed: ferry_sleep_until() yields once. */
            a->phase = PH_WAIT2;
            m_ready(m, id);
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
        m_ready(m, val);
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
                    val = mch_take(m, k, false);
                break;
            }
            if (send ? m->ch[k].n < m->cfg.chcap : m->ch[k].closed) {
                if (send)
                    mch_put(m, k, c->val, false);
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
            m_finish(m, id, fail_status(a->cmd.arg));
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
static void m_step(struct model *m)
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
static void m_wait(struct model *m)
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
            m_ready(m, i);
        }
    }
    while (m->rqn)
        m_run(m, rq_pop(m));
}

/* ---- 3. the real side --------------------------------------------------- */

struct ract {
    ferry_task           *t;          /* handle, joined at teardown */
    struct ferry__waiter *parkw;      /* its park waiter while idle */
    struct ferry__waiter *fnw;        /* its flight fn waiter while in fn */
    ferry_scope          *scope;      /* command scope while running one */
    struct cmd            cmd;        /* command given */
    int                   fn_val;     /* flight result to write */
    int                   done_n, last_rc, last_val;
    /* What it believes it holds, from its own return codes. */
    bool                  holds_l;
    bool                  holds_kl[NKEYS];
    uint64_t              sem_held;
    uint64_t              sem_cur;    /* permits requested by the running sem_acquire */
    bool                  in_sem;
    bool                  ended;
    int                   owner;      /* the actor whose group it is a child of, or -1 */
    /* Sleep: the deadline and the timer heap's next insertion number, read
     * just before ferry_sleep_until(), tell whether it armed its timer. */
    bool                  in_sleep;
    int64_t               sleep_until;
    uint64_t              sleep_seq0;
    ferry_group           group;      /* the group it owns, once g_used */
    bool                  g_used;
};

/* A timer (ferry_call_later) or a post from a thread, on the real side. */
struct rcb {
    struct seq           *s;          /* its sequence */
    int                   i;          /* its index */
    ferry_timer          *h;          /* timer: the handle while pending */
    bool                  pending;    /* made or posted, not run, not cancelled */
    int                   ran;        /* times the callback ran */
    int                   rc, target; /* what its action returned, whom it cancelled */
    int                   post_rc;    /* post: what call_soon_threadsafe returned */
};

struct seq;

/* Everything of one sequence. */
struct seq {
    ferry_loop    *loop;
    struct config  cfg;
    struct model   m;
    struct ract    r[MAXA];
    int            na;
    /* the real primitives */
    ferry_lock     lock;
    ferry_sem      sem;
    ferry_event    ev;
    ferry_cond     cond;
    ferry_queue    q;
    ferry_flight   fl;
    ferry_keylock  kl;
    /* real-side accounting for invariants */
    uint64_t       sem_extra;        /* successful releases beyond what the releaser held */
    int            inserted[MAXITEMS];
    int            ninserted;        /* values inserted, in insertion order */
    int            got[MAXITEMS];
    int            ngot;
    int            dropped;          /* items dropped by an immediate shutdown */
    int            in_fn[NKEYS];     /* actors inside the flight fn of a key */
    int            put_counter, fin_counter;
    struct rcb     cb[MAXCB];        /* timers and posts (the model's in m.cb) */
    /* format 4: the channels (elements are ints), the items sent into
     * each and received from each, in order */
    ferry_chan    *ch[NCH];
    int            ch_in[NCH][MAXITEMS], nch_in[NCH];
    int            ch_out[NCH][MAXITEMS], nch_out[NCH];
    bool           stuck;            /* a wait gave up: some callback never ran */
    /* reporting */
    FILE          *trace;
    model_report  *rep;
    int            opi;
    bool           failed;
    int            fmt;              /* MODEL_FMT_V1 to _V4 */
};

static struct seq *cur;   /* the sequence the actors belong to */
static unsigned long stray_callbacks;   /* callbacks that ran after their sequence */

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
        fprintf(out, "%-16s", cop_names[op]);
        for (i = 0; i < 160; i++)
            if (hist[op][i])
                fprintf(out, " %s%d:%lu", i >= 150 ? "+" : "-", i >= 150 ? i - 150 : i, hist[op][i]);
        fprintf(out, "\n");
    }
}

static void failf(struct seq *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void failf(struct seq *s, const char *fmt, ...)
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

static int actor_main(void *arg);

/* The actor a task runs, by its argument: a child of a group has no
 * handle, and the task structure of one that ended may already be
 * another's. */
static int r_id(struct seq *s, const ferry_task *t)
{
    if (t && t->fn == actor_main && (const struct ract *)t->arg >= s->r &&
        (const struct ract *)t->arg < s->r + s->na)
        return (int)((const struct ract *)t->arg - s->r);
    return -2;
}

/* Actor i's task while it may still be read: through the handle of one the
 * driver spawned, through its group's list of live children for a child
 * (NULL once it has ended). */
static ferry_task *r_task(struct seq *s, int i)
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

static int r_state(struct seq *s, int i)
{
    ferry_task *t = r_task(s, i);

    return t ? (int)ferry_task_state(t) : FERRY_TASK_DONE;
}

static bool r_live(struct seq *s, int i)
{
    return r_state(s, i) != FERRY_TASK_DONE;
}

static int r_live_count(struct seq *s)
{
    int i, n = 0;

    for (i = 0; i < s->na; i++)
        n += r_live(s, i);
    return n;
}

static bool r_sleep_waited(int id)
{
    struct seq *s = cur;
    struct ract *a = &s->r[id];
    ferry_task *t = r_task(s, id);
    bool waited = t && t->timer.seq == a->sleep_seq0 && t->timer.key == a->sleep_until;

    /* Waiting is right while the deadline is ahead; yielding only once it
     * has passed, and a deadline an hour away never has. */
    if (!waited && (ferry_now() < a->sleep_until || a->cmd.arg % 3 == SL_FAR))
        failf(s, "actor %d: sleep yielded although its deadline had not passed", id);
    if (waited && a->cmd.arg % 3 == SL_PAST)
        failf(s, "actor %d: sleep with a deadline in the past armed a timer", id);
    return waited;
}

/* The real side of m_cancel_target(). */
static int r_cancel_target(struct seq *s, int sel)
{
    bool live[MAXA], sleeping[MAXA];
    int parent[MAXA], i;

    for (i = 0; i < s->na; i++) {
        live[i] = r_live(s, i);
        sleeping[i] = s->r[i].cmd.op == C_SLEEP;
        parent[i] = s->r[i].owner;
    }
    return cancel_target(s->na, live, sleeping, parent, sel);
}

/* A timer's or a posted callback: run its action on the real primitives. */
static void cb_main(void *arg)
{
    struct rcb *c = arg;
    struct seq *s = c->s;
    const struct mcb *mc;
    int item;

    if (s != cur) {
        stray_callbacks++;          /* ran after its sequence ended */
        return;
    }
    mc = &s->m.cb[c->i];
    c->ran++;
    if (!c->pending)
        failf(s, "%s %d ran although it had run or was cancelled", mc->timer ? "timer" : "post",
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
        c->rc = c->target >= 0 ? ferry_task_cancel(r_task(s, c->target)) : 0;
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
                act_names[mc->act], c->rc);
}

static int qcmp(const void *a, const void *b, void *arg)
{
    (void)arg;
    return prio_of(*(const int *)a) - prio_of(*(const int *)b);
}

static int fl_fn(void *arg, void *out, size_t size)
{
    struct ract *a = arg;
    struct ferry__waiter w;
    int k = a->cmd.arg % NKEYS, rc;

    (void)size;
    ferry__waiter_init(&w, ferry_task_current(), "flight fn", a);
    a->fnw = &w;
    if (++cur->in_fn[k] > 1)
        failf(cur, "singleflight: %d calls in flight for key %d", cur->in_fn[k], k);
    rc = ferry__wait(NULL, &w, FERRY_NEVER);
    cur->in_fn[k]--;
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
            failf(s, "queue: item %d got twice", item);
    for (i = 0; i < s->ninserted; i++)
        if (s->inserted[i] == item)
            break;
    if (i == s->ninserted)
        failf(s, "queue: got item %d that was never inserted", item);
    if (s->ngot < MAXITEMS)
        s->got[s->ngot++] = item;
}

/* An item sent into channel k, by a task or the channel thread. */
static void r_ch_sent(struct seq *s, int k, int item)
{
    if (s->nch_in[k] < MAXITEMS)
        s->ch_in[k][s->nch_in[k]++] = item;
}

/* An item received from channel k: the oldest one not received yet (the
 * channel is a FIFO, and nothing suspends between a take and this). */
static void r_ch_got(struct seq *s, int k, int item)
{
    int i = s->nch_out[k];

    if (i >= s->nch_in[k] || s->ch_in[k][i] != item)
        failf(s, "channel %d: receive #%d got %d, sent #%d was %d", k, i, item, i,
              i < s->nch_in[k] ? s->ch_in[k][i] : -1);
    if (i < MAXITEMS)
        s->ch_out[k][s->nch_out[k]++] = item;
}

/* r_exec() for the lock. */
static int r_exec_lock(struct seq *s, struct ract *a, int *val)
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
static int r_exec_sem(struct seq *s, struct ract *a, int *val)
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
static int r_exec_event(struct seq *s, struct ract *a, int *val)
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
static int r_exec_cond(struct seq *s, struct ract *a, int *val)
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
        const int *kinds = sel_pair(s->fmt, c->arg);
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
            failf(s, "select returned %d for two cases", rc);
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
                r_ch_sent(s, sk_ch(kinds[rc]), put_item);
            } else {
                *val = got[rc];
                r_ch_got(s, sk_ch(kinds[rc]), got[rc]);
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
            r_ch_sent(s, k, item);
        return rc;
    case C_CH_RECV:
        k = cmd_ch(c->arg);
        item = -1;
        rc = ferry_chan_recv_elem(s->ch[k], &item);
        *val = item;
        if (rc == 0)
            r_ch_got(s, k, item);
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
static int r_exec_keylock(struct seq *s, struct ract *a, int *val)
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
static int r_exec_sleep(struct seq *s, struct ract *a, int *val)
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
            failf(s, "actor %d: sleep returned 0 before its deadline", (int)(a - s->r));
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
        rc = ferry_group_spawn(&a->group, actor_main, ch, &(ferry_task_opts){ .name = "child" });
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
            if (s->r[i].g_used && r_live(s, i))
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
        return r_exec_lock(s, a, val);
    case C_SEM_ACQ:
    case C_SEM_REL:
    case C_SEM_TRY:
        return r_exec_sem(s, a, val);
    case C_EV_WAIT:
    case C_EV_SET:
    case C_EV_CLEAR:
        return r_exec_event(s, a, val);
    case C_COND_WAIT:
    case C_COND_NOTIFY:
    case C_COND_NOTIFY_ALL:
        return r_exec_cond(s, a, val);
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
        return r_exec_keylock(s, a, val);
    case C_SLEEP:
        return r_exec_sleep(s, a, val);
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
            failf(s, "cleanup: lock_release by its holder returned %d", rc);
        a->holds_l = false;
    }
    for (k = 0; k < NKEYS; k++)
        if (a->holds_kl[k]) {
            rc = ferry_keylock_release(&s->kl, &k, sizeof k);
            if (rc)
                failf(s, "cleanup: keylock_release(%d) by its holder returned %d", k, rc);
            a->holds_kl[k] = false;
        }
    if (a->sem_held) {
        /* A bounded semaphore may refuse if others released permits they
         * never held (sem_extra): then the permits stay counted as held. */
        rc = ferry_sem_release_n(&s->sem, a->sem_held);
        if (rc == 0)
            a->sem_held = 0;
        else if (!(rc == -EOVERFLOW && s->cfg.sem_bounded && s->sem_extra > 0))
            failf(s, "cleanup: sem_release(%" PRIu64 ") of held permits returned %d (value %" PRIu64 ")",
                  a->sem_held, rc, s->sem.value);
    }
    /* No child outlives its group: wait for them (at teardown they are
     * being cancelled and cleaned up too). */
    if (a->g_used && !a->group.closed)
        ferry_group_wait(&a->group);
}

static int actor_main(void *arg)
{
    struct ract *a = arg;
    struct seq *s = cur;
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
            failf(s, "actor %d: park returned %d", r_id(s, self), rc);
        if (a->cmd.op == C_EXIT) {
            a->ended = true;
            return 0;
        }
        if (a->cmd.op == C_FAIL) {
            a->ended = true;
            return fail_status(a->cmd.arg);
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
            fprintf(s->trace, "    actor %d: %s -> %d%s (val %d)\n", r_id(s, self),
                    cop_names[a->cmd.op], rc, rc < 0 ? "" : "", val);
    }
}

/* ---- 4. the driver ------------------------------------------------------ */

static bool runq_empty(ferry_loop *loop)
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
                failf(s, "run queue holds a callback");
                return;
            }
            if (nreal < 64)
                real[nreal++] = r_id(s, ferry__container_of(rn, ferry_task, run));
        }
    }
    if (nreal != s->m.rqn) {
        failf(s, "run queue: %d ready, model %d", nreal, s->m.rqn);
        return;
    }
    for (i = 0; i < nreal; i++)
        if (real[i] != s->m.rq[(s->m.rqh + i) % 64]) {
            failf(s, "run queue position %d: actor %d, model actor %d", i, real[i],
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
        int rs = r_state(s, i), want;

        if (a->done_n != ma->done_n) {
            failf(s, "actor %d (%s): %d commands completed, model %d (real last %d, model last %d)",
                  i, cop_names[a->cmd.op], a->done_n, ma->done_n, a->last_rc, ma->last_rc);
            return;
        }
        if (a->done_n && (a->last_rc != ma->last_rc || a->last_val != ma->last_val)) {
            failf(s, "actor %d: %s returned %d (val %d), model %d (val %d)", i,
                  cop_names[a->cmd.op], a->last_rc, a->last_val, ma->last_rc, ma->last_val);
            return;
        }
        want = ma->st == M_READY ? FERRY_TASK_READY :
               ma->st == M_WAIT ? FERRY_TASK_WAITING : FERRY_TASK_DONE;
        if (rs != want) {
            failf(s, "actor %d: task state %d, model %s", i, rs, mstate_name(ma->st));
            return;
        }
        if (a->g_used != ma->g_init) {
            failf(s, "actor %d: group initialised %d, model %d", i, a->g_used, ma->g_init);
            return;
        }
        if (a->g_used && ((int)a->group.live != ma->g_live || a->group.status != ma->g_status ||
                          a->group.failing != ma->g_failing || a->group.closed != ma->g_closed)) {
            failf(s, "group of actor %d: live %zu status %d failing %d closed %d; "
                  "model %d %d %d %d", i, a->group.live, a->group.status, a->group.failing,
                  a->group.closed, ma->g_live, ma->g_status, ma->g_failing, ma->g_closed);
            return;
        }
    }
    if (s->na != m->na) {
        failf(s, "%d actors, model %d", s->na, m->na);
        return;
    }
    for (i = 0; i < m->ncb; i++) {
        const struct rcb *c = &s->cb[i];
        const struct mcb *mc = &m->cb[i];
        if (c->ran != mc->ran || c->pending != mc->pending) {
            failf(s, "%s %d (%s): ran %d times, pending %d; model %d, %d",
                  mc->timer ? "timer" : "post", i, act_names[mc->act], c->ran, c->pending,
                  mc->ran, mc->pending);
            return;
        }
        if (c->ran && (c->rc != mc->rc || c->target != mc->target)) {
            failf(s, "%s %d (%s) returned %d (target %d), model %d (target %d)",
                  mc->timer ? "timer" : "post", i, act_names[mc->act], c->rc, c->target,
                  mc->rc, mc->target);
            return;
        }
    }
    cmp_runq(s);
    for (k = 0; k < NCH; k++)
        if (ferry_chan_len(s->ch[k]) != (size_t)m->ch[k].n)
            failf(s, "channel %d: %zu items, model %d", k, ferry_chan_len(s->ch[k]), m->ch[k].n);
    if ((s->lock.owner ? r_id(s, s->lock.owner) : -1) != m->lk[LK_L].owner)
        failf(s, "lock owner: actor %d, model %d",
              s->lock.owner ? r_id(s, s->lock.owner) : -1, m->lk[LK_L].owner);
    if (s->lock.broken != m->lk[LK_L].broken)
        failf(s, "lock broken: %d, model %d", s->lock.broken, m->lk[LK_L].broken);
    if (s->sem.value != m->sem_value || s->sem.pending != m->sem_pending)
        failf(s, "semaphore: value %" PRIu64 " pending %" PRIu64 ", model %" PRIu64 " %" PRIu64,
              s->sem.value, s->sem.pending, m->sem_value, m->sem_pending);
    if (s->ev.set != m->ev_set)
        failf(s, "event: set %d, model %d", s->ev.set, m->ev_set);
    if (s->cond.pending != m->cond_pending)
        failf(s, "condition: pending %zu, model %zu", s->cond.pending, m->cond_pending);
    if (s->q.count != (size_t)m->qn || s->q.res_get != m->q_res_get ||
        s->q.res_put != m->q_res_put || s->q.unfinished != m->q_unfinished ||
        s->q.pending != m->q_pending || s->q.shutdown != m->q_shutdown)
        failf(s, "queue: count %zu res_get %zu res_put %zu unfinished %zu pending %zu shutdown %d; "
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
            failf(s, "flight: %zu calls in flight, model %zu", ferry_flight_count(&s->fl), nfl);
        if (ferry_keylock_count(&s->kl) != nkl)
            failf(s, "keylock: %zu keys, model %zu", ferry_keylock_count(&s->kl), nkl);
        for (k = 0; k < NKEYS; k++) {
            bool locked = ferry_keylock_locked(&s->kl, &k, sizeof k);
            bool mlocked = m->kl_exists[k] &&
                           (m->lk[LK_KL0 + k].owner >= 0 || m->lk[LK_KL0 + k].broken);
            if (locked != mlocked)
                failf(s, "keylock key %d: locked %d, model %d", k, locked, mlocked);
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
        ferry_task *t = r_task(s, i);
        held += a->sem_held;
        if (a->in_sem && t && t->waiter && t->waiter->state == FERRY__W_GRANTED)
            granted += a->sem_cur;
        if (a->holds_l && !a->ended) {
            holders++;
            if (s->lock.owner != t)
                failf(s, "lock: actor %d holds it (acquire returned 0) but the owner is actor %d",
                      i, r_id(s, s->lock.owner));
        }
        for (k = 0; k < NKEYS; k++)
            if (a->holds_kl[k] && !a->ended)
                kholders[k]++;
    }
    if (holders > 1)
        failf(s, "lock: %d holders", holders);
    for (k = 0; k < NKEYS; k++)
        if (kholders[k] > 1)
            failf(s, "keylock key %d: %d holders", k, kholders[k]);
    /* Permits conserved: available + held + granted-not-yet-run = initial + extra. */
    if (s->sem.value + held + granted != s->cfg.sem_v0 + s->sem_extra)
        failf(s, "semaphore: value %" PRIu64 " + held %" PRIu64 " + granted %" PRIu64
              " != initial %" PRIu64 " + extra releases %" PRIu64,
              s->sem.value, held, granted, s->cfg.sem_v0, s->sem_extra);
    if (s->cfg.sem_bounded && s->sem.value > s->cfg.sem_v0)
        failf(s, "bounded semaphore: value %" PRIu64 " above its bound %" PRIu64,
              s->sem.value, s->cfg.sem_v0);
    /* Items conserved. */
    if ((int)s->q.count != s->ninserted - s->ngot - s->dropped)
        failf(s, "queue: %zu stored, but %d inserted - %d got - %d dropped", s->q.count,
              s->ninserted, s->ngot, s->dropped);
    if (s->cfg.qcap && s->q.count + s->q.res_put > s->cfg.qcap)
        failf(s, "queue: %zu stored + %zu promised slots above capacity %zu", s->q.count,
              s->q.res_put, s->cfg.qcap);
    /* FIFO: gets return items in insertion order (until an immediate
     * shutdown drops some). */
    if (s->cfg.qkind == FERRY_QUEUE_FIFO && s->dropped == 0)
        for (i = 0; i < s->ngot; i++)
            if (s->got[i] != s->inserted[i]) {
                failf(s, "FIFO queue: get #%d returned %d, inserted #%d was %d", i, s->got[i],
                      i, s->inserted[i]);
                break;
            }
    /* Channel items conserved (their order is checked at each receive). */
    for (k = 0; k < NCH; k++)
        if ((int)ferry_chan_len(s->ch[k]) != s->nch_in[k] - s->nch_out[k])
            failf(s, "channel %d: %zu stored, but %d sent - %d received", k,
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
            failf(s, "group of actor %d: %zu children listed, live %zu, closed %d", i, n,
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
        failf(s, "quiescent: the lock is free but tasks wait for it");
    if ((w = waitq_first(&s->sem.waiters)) && w->n <= s->sem.value)
        failf(s, "quiescent: the first semaphore waiter wants %" PRIu64 ", %" PRIu64 " available",
              w->n, s->sem.value);
    if (s->ev.set && waitq_has_waiting(&s->ev.waiters))
        failf(s, "quiescent: the event is set but tasks wait for it");
    if (avail > 0 && waitq_has_waiting(&s->q.getters))
        failf(s, "quiescent: %zu items available but getters wait", avail);
    if (s->q.shutdown && (waitq_has_waiting(&s->q.getters) || waitq_has_waiting(&s->q.putters)))
        failf(s, "quiescent: the queue is shut down but tasks wait in put/get");
    if ((s->cfg.qcap == 0 || s->q.count + s->q.res_put < s->cfg.qcap) &&
        waitq_has_waiting(&s->q.putters))
        failf(s, "quiescent: the queue has room but putters wait");
    if (s->q.unfinished == 0 && waitq_has_waiting(&s->q.joiners))
        failf(s, "quiescent: every item is done but joiners wait");
    /* A select whose queue case won keeps the reservation while it waits
     * for a wake of the channel thread still in the inbox. */
    if ((s->q.pending && s->m.ninbox == 0) || s->sem.pending || s->cond.pending)
        failf(s, "quiescent: woken waiters not accounted for (queue %zu, sem %" PRIu64 ", cond %zu)",
              s->q.pending, s->sem.pending, s->cond.pending);
    for (k = 0; k < NKEYS; k++) {
        /* A call with waiters has a leader parked inside fn. */
        bool waiters = false, leader_in_fn = false;
        for (i = 0; i < s->na; i++) {
            struct ract *a = &s->r[i];
            ferry_task *t = r_task(s, i);
            if (!t || a->ended || a->cmd.op != C_FL_DO || a->cmd.arg % NKEYS != k || !t->waiter)
                continue;
            if (a->fnw && a->fnw->state == FERRY__W_WAITING)
                leader_in_fn = true;
            else if (t->waiter->state == FERRY__W_WAITING && !a->parkw)
                waiters = true;
        }
        if (waiters && !leader_in_fn)
            failf(s, "quiescent: tasks wait for singleflight key %d but no call runs", k);
    }
    for (i = 0; i < s->na; i++)
        if (s->r[i].g_used && s->r[i].group.live == 0 && waitq_has_waiting(&s->r[i].group.waiters))
            failf(s, "quiescent: the group of actor %d has no child left but its wait sleeps", i);
    /* With no wake of the channel thread in the inbox, every state change
     * of a channel has woken a task of the side that can proceed. */
    if (s->m.ninbox == 0)
        for (k = 0; k < NCH; k++)
            for (i = 0; i < 2; i++)
                if (mch_ready(&s->m, k, i) && m_chan_side_waits(&s->m, k, i))
                    failf(s, "quiescent: channel %d has %s (or is closed) but a task waits to %s",
                          k, i ? "room" : "an item", i ? "send" : "receive");
}

/* Yield once on both sides and compare. */
static void step(struct seq *s)
{
    ferry_yield();
    m_step(&s->m);
    compare(s);
    invariants(s);
}

static void quiesce(struct seq *s)
{
    int n = 0;

    while (!s->failed && (!runq_empty(s->loop) || s->m.rqn)) {
        if (++n > 10000) {
            failf(s, "no quiescence after 10000 rounds (livelock)");
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
    rc = ferry_task_spawn(&a->t, s->loop, actor_main, a, &(ferry_task_opts){ .name = "actor" });
    if (rc) {
        failf(s, "spawn: %d", rc);
        return;
    }
    s->na++;
    memset(&s->m.a[id], 0, sizeof s->m.a[id]);
    s->m.a[id].gi = -1;
    s->m.na++;
    m_ready(&s->m, id);
}

static void give(struct seq *s, int id, const struct cmd *c)
{
    struct ract *a = &s->r[id];

    a->cmd = *c;
    s->m.a[id].cmd = *c;
    if (!a->parkw || !ferry__grant(a->parkw, 0)) {
        failf(s, "actor %d is not parked (model says idle)", id);
        return;
    }
    if (!m_grant(&s->m, id, 0))
        failf(s, "model: actor %d not idle", id);
}

static void expire(struct seq *s, int id)
{
    ferry_task *t = r_task(s, id);

    if (!t || !s->r[id].scope) {
        failf(s, "actor %d has no command scope (model says it does)", id);
        return;
    }
    s->r[id].scope->deadline = 1;
    /* What the loop's timer poll does once the deadline has passed. */
    if (t->timer.linked) {
        ferry__heap_remove(&s->loop->timers, &t->timer);
        t->timer.fire(&t->timer);
    }
    m_expire(&s->m, id);
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
        failf(s, "flight key %d: leader actor %d is not in fn (model says it is)", k, id);
        return;
    }
    s->r[id].fn_val = val;
    if (!ferry__grant(s->r[id].fnw, st)) {
        failf(s, "flight key %d: fn waiter of actor %d not waiting", k, id);
        return;
    }
    ma->wval = val;
    m_grant(&s->m, id, st);
}

static void trace_op(struct seq *s, const struct op *o, int id)
{
    static const char *const dn[] = { "spawn", "cancel", "expire", "step", "quiesce",
                                      "flight_finish", "cmd", "timer", "timer_cancel",
                                      "post", "wait", "chan_thread" };
    if (!s->trace)
        return;
    fprintf(s->trace, "op %3d: %s", s->opi, dn[o->kind]);
    if (o->kind == D_CMD)
        fprintf(s->trace, " actor %d %s arg %d%s", id, cop_names[o->c.op], o->c.arg,
                o->c.dl == DL_FAR ? " [deadline]" : o->c.dl == DL_PAST ? " [deadline passed]" : "");
    else if (o->kind == D_CANCEL || o->kind == D_EXPIRE)
        fprintf(s->trace, " actor %d", id);
    else if (o->kind == D_FL_FINISH)
        fprintf(s->trace, " key %d %s", o->arg % NKEYS, o->arg2 & 1 ? "ok" : "fail");
    else if (o->kind == D_STEP)
        fprintf(s->trace, " x%d", o->arg % 3 + 1);
    else if (o->kind == D_TIMER)
        fprintf(s->trace, " %d %s, %s", id, o->arg & 1 ? "in an hour" : "due", act_names[o->act]);
    else if (o->kind == D_TCANCEL)
        fprintf(s->trace, " %d", id);
    else if (o->kind == D_POST)
        fprintf(s->trace, " %d from a thread, from %s", 1 + o->arg % 3, act_names[o->act]);
    else if (o->kind == D_CHT)
        fprintf(s->trace, " channel %d", id);
    fprintf(s->trace, "\n");
}

/* ---- timers, posts from a thread, the driver's wait ------------------ */

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
static void op_timer(struct seq *s, const struct op *o)
{
    bool far = o->arg & 1;
    int64_t delay = far ? FERRY_SEC(3600) : (o->arg & 2) ? -1 : 0;
    struct rcb *c = cb_new(s, true, far, o->act, o->sel);
    int rc;

    if (!c)
        return;
    trace_op(s, o, c->i);
    rc = ferry_call_later(s->loop, delay, cb_main, c, &c->h);
    if (rc) {
        failf(s, "call_later: %d", rc);
        return;
    }
    c->pending = true;
    s->m.cb[c->i].pending = true;
}

/* D_TCANCEL: ferry_timer_cancel() of a timer that has not run. */
static void op_tcancel(struct seq *s, const struct op *o)
{
    int ids[MAXCB], n = 0, i, rc;
    struct rcb *c;

    for (i = 0; i < s->m.ncb; i++)
        if (s->m.cb[i].timer && s->m.cb[i].pending)
            ids[n++] = i;
    if (!n)
        return;
    c = &s->cb[ids[o->actor % n]];
    trace_op(s, o, c->i);
    if (!c->pending || !c->h) {
        failf(s, "timer %d: ran or was cancelled, model says pending", c->i);
        return;
    }
    rc = ferry_timer_cancel(c->h);
    if (rc)
        failf(s, "timer_cancel: %d", rc);
    c->pending = false;
    c->h = NULL;
    s->m.cb[c->i].pending = false;
}

/*
 * The thread that posts: one for the process.  D_POST queues its
 * callbacks and goes on; the thread posts them while the loop runs.  The
 * loop polls only in the driver's wait, which first waits until every
 * queued callback has been posted (poster_flush()), so that all of them
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
            q[k]->post_rc = ferry_loop_call_soon_threadsafe(q[k]->s->loop, cb_main, q[k]);
        pthread_mutex_lock(&poster.mu);
        poster.posted += (unsigned long)n;
        pthread_cond_broadcast(&poster.done);
    }
    return NULL;
}

/* Wait until every queued callback has been posted; check what
 * ferry_loop_call_soon_threadsafe() returned for those of `s`. */
static void poster_flush(struct seq *s)
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
            failf(s, "post %d: call_soon_threadsafe returned %d", i, s->cb[i].post_rc);
            s->cb[i].post_rc = 0;
        }
}

/* D_POST: 1 to 3 callbacks posted from another thread.  They run at the
 * loop's next poll, in the driver's next wait. */
static void op_post(struct seq *s, const struct op *o)
{
    int n = 1 + o->arg % 3, k;

    if (!poster.up) {
        if (pthread_create(&poster.th, NULL, poster_main, NULL)) {
            failf(s, "cannot start the posting thread");
            return;
        }
        pthread_detach(poster.th);
        poster.up = true;
    }
    trace_op(s, o, -1);
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
            failf(s, "cannot start the channel thread");
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
static void op_cht(struct seq *s, const struct op *o)
{
    struct model *m = &s->m;
    int k = o->arg2 % NCH, kind = cht_kind(o->arg), val = 0, got = -1, rc, mrc = 0, mval = -1;

    if (kind == CT_SEND)
        val = ++s->put_counter;
    trace_op(s, o, k);
    rc = chthr_run(s, s->ch[k], kind, val, &got);
    switch (kind) {
    case CT_SEND:
        if (m->ch[k].closed)
            mrc = -ESHUTDOWN;
        else if (m->ch[k].n == m->cfg.chcap)
            mrc = -EAGAIN;
        else
            mch_put(m, k, val, true);
        if (rc == 0)
            r_ch_sent(s, k, val);
        break;
    case CT_RECV:
        if (m->ch[k].n > 0)
            mval = mch_take(m, k, true);
        else
            mrc = m->ch[k].closed ? -ESHUTDOWN : -EAGAIN;
        if (rc == 0)
            r_ch_got(s, k, got);
        else
            got = -1;
        break;
    default:
        mch_close(m, k, true);
        break;
    }
    if (s->trace)
        fprintf(s->trace, "    channel thread: %s -> %d (val %d)\n",
                kind == CT_SEND ? "send" : kind == CT_RECV ? "recv" : "close", rc,
                kind == CT_SEND ? val : got);
    if (rc != mrc || (kind == CT_RECV && got != mval))
        failf(s, "channel thread: %s on channel %d returned %d (val %d), model %d (val %d)",
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
static bool r_wait_pending(struct seq *s, int64_t *until)
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
 * not a hang.  Then what they woke runs to the end.  See m_wait().
 */
static void op_wait(struct seq *s, const struct op *o)
{
    int64_t give_up = ferry_now() + FERRY_SEC(10), until, margin = FERRY_USEC(1);
    bool first = true;

    trace_op(s, o, -1);
    poster_flush(s);
    for (;;) {
        bool left = r_wait_pending(s, &until);

        if (!left && !first)
            break;
        first = false;
        if (ferry_now() > give_up) {
            s->stuck = true;
            failf(s, "wait: a post, a due timer or a short sleep did not end in 10 s");
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
    while (!runq_empty(s->loop))
        ferry_yield();
    m_wait(&s->m);
}

static void run_op(struct seq *s, const struct op *o)
{
    int id = -1, i;
    struct cmd c;

    switch (o->kind) {
    case D_SPAWN:
        trace_op(s, o, -1);
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
        trace_op(s, o, id);
        if (!r_task(s, id)) {
            failf(s, "actor %d has ended (model says it is live)", id);
            break;
        }
        ferry_task_cancel(r_task(s, id));
        m_cancel(&s->m, id);
        break;
    case D_EXPIRE:
        id = pick(s, o->actor, p_far);
        if (id < 0)
            break;
        trace_op(s, o, id);
        expire(s, id);
        break;
    case D_STEP:
        trace_op(s, o, -1);
        for (i = 0; i <= o->arg % 3 && !s->failed; i++)
            step(s);
        break;
    case D_QUIESCE:
        trace_op(s, o, -1);
        quiesce(s);
        break;
    case D_FL_FINISH:
        trace_op(s, o, -1);
        fl_finish(s, o->arg % NKEYS, o->arg2 & 1);
        break;
    case D_TIMER:
        op_timer(s, o);
        break;
    case D_TCANCEL:
        op_tcancel(s, o);
        break;
    case D_POST:
        op_post(s, o);
        break;
    case D_WAIT:
        op_wait(s, o);
        break;
    case D_CHT:
        op_cht(s, o);
        break;
    case D_CMD:
        /* Cancellation is level-triggered, so a cancelled actor can only
         * fail from now on: mostly retire it and bring in a fresh one. */
        id = pick(s, o->actor, (o->actor & 0x80) ? p_idle : p_idle_fresh);
        if (id < 0)
            id = pick(s, o->actor, p_idle);
        if (id < 0)
            break;
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
            trace_op(s, &(struct op){ .kind = D_CMD, .c = c }, id);
            give(s, id, &c);
            if (s->na < MAXA)
                spawn(s);
            break;
        }
        guide(s, id, &c);
        if (c.op == C_Q_PUT || c.op == C_Q_TRYPUT || c.op == C_SELECT || c.op == C_CH_SEND)
            c.val = ++s->put_counter;
        trace_op(s, o, id);
        give(s, id, &c);
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
                failf(s, "teardown: timer_cancel %d", rc);
            s->cb[i].pending = false;
            s->cb[i].h = NULL;
        }
    for (i = 0; i < s->na; i++)
        if (!s->r[i].ended && r_task(s, i))
            ferry_task_cancel(r_task(s, i));
    for (round = 0; round < 50; round++) {
        bool live = false;
        while (!runq_empty(s->loop))
            ferry_yield();
        for (i = 0; i < s->na; i++) {
            struct ract *a = &s->r[i];
            if (!r_live(s, i))
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
        ferry_task *t = r_task(s, i);
        int st;

        /* A child of a group has no handle: it has ended once its group
         * no longer lists it. */
        if (a->owner < 0 ? ferry_task_try_join(a->t, &st) != 0 : t != NULL) {
            failf(s, "teardown: actor %d never ended (%s, waits on %s)", i,
                  cop_names[a->cmd.op],
                  t && t->waiter && t->waiter->what ? t->waiter->what : "?");
            r_chans_abandon(s);
            return;   /* cannot free its primitives safely */
        }
    }
    for (i = 0; i < NCH; i++) {
        if ((int)ferry_chan_len(s->ch[i]) != s->nch_in[i] - s->nch_out[i])
            failf(s, "teardown: channel %d holds %zu, expected %d", i, ferry_chan_len(s->ch[i]),
                  s->nch_in[i] - s->nch_out[i]);
        ferry_chan_free(s->ch[i]);
        s->ch[i] = NULL;
    }
    for (i = 0; i < s->m.ncb; i++)
        if (s->cb[i].pending)
            failf(s, "teardown: %s %d never ran", s->m.cb[i].timer ? "timer" : "post", i);
    {
        uint64_t held = 0;
        for (i = 0; i < s->na; i++)
            held += s->r[i].sem_held;   /* permits of actors that exited holding them */
        if (s->sem.value + held != s->cfg.sem_v0 + s->sem_extra)
            failf(s, "teardown: semaphore value %" PRIu64 " + still held %" PRIu64
                  " != initial + extra %" PRIu64, s->sem.value, held, s->cfg.sem_v0 + s->sem_extra);
    }
    if ((rc = ferry_cond_destroy(&s->cond)))
        failf(s, "teardown: cond_destroy %d", rc);
    if ((rc = ferry_lock_destroy(&s->lock)))
        failf(s, "teardown: lock_destroy %d", rc);
    if ((rc = ferry_sem_destroy(&s->sem)))
        failf(s, "teardown: sem_destroy %d", rc);
    if ((rc = ferry_event_destroy(&s->ev)))
        failf(s, "teardown: event_destroy %d", rc);
    if ((int)s->q.count != s->ninserted - s->ngot - s->dropped)
        failf(s, "teardown: queue holds %zu, expected %d", s->q.count,
              s->ninserted - s->ngot - s->dropped);
    if ((rc = ferry_queue_destroy(&s->q)))
        failf(s, "teardown: queue_destroy %d", rc);
    if ((rc = ferry_flight_destroy(&s->fl)))
        failf(s, "teardown: flight_destroy %d (%zu calls)", rc, ferry_flight_count(&s->fl));
    if ((rc = ferry_keylock_destroy(&s->kl)))
        failf(s, "teardown: keylock_destroy %d", rc);
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
        failf(s, "self-test: a task that never ends");
    }
    spawn(s);
    spawn(s);
    for (s->opi = 0; !s->failed && s->opi < MODEL_MAX_OPS &&
                     pos + MODEL_OP_BYTES <= d->len; s->opi++, pos += MODEL_OP_BYTES) {
        decode_op(s->fmt, d->bytes + pos, &o);
        run_op(s, &o);
        s->rep->ops_run++;
    }
    /* Posts and due timers still to run, short sleeps to end: one more
     * wait, checked like any other. */
    if (!s->failed && r_wait_pending(s, &until)) {
        o = (struct op){ .kind = D_WAIT };
        op_wait(s, &o);
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
    return stray_callbacks;
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
            failf(&s, "chan_new: out of memory");
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
                     s.cfg.qkind == FERRY_QUEUE_PRIORITY ? qcmp : NULL, NULL);
    ferry_flight_init(&s.fl);
    ferry_keylock_init(&s.kl);
    if (trace)
        fprintf(trace, "sequence (format %d): semaphore %" PRIu64 "%s, queue %s capacity %zu, "
                "channels capacity %d\n",
                s.fmt, s.cfg.sem_v0, s.cfg.sem_bounded ? " bounded" : "",
                s.cfg.qkind == 0 ? "fifo" : s.cfg.qkind == 1 ? "lifo" : "priority", s.cfg.qcap,
                s.cfg.chcap);
    cur = &s;
    rc = ferry_task_spawn(&drv, loop, driver_main, &d, &(ferry_task_opts){ .name = "driver" });
    if (rc) {
        failf(&s, "spawn driver: %d", rc);
        for (int k = 0; k < NCH; k++)
            ferry_chan_free(s.ch[k]);
        return 1;
    }
    /* The driver stops the loop when it ends, even with tasks stuck. */
    while (ferry_task_try_join(drv, &st) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    /* The posting thread holds no callback of this sequence after this:
     * the next one reuses the memory. */
    poster_flush(NULL);
    cur = NULL;
    rep->stuck = s.stuck;
    return rep->failed ? 1 : 0;
}

/* ---- seeds ---------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t model_seq_seed(uint64_t run_seed, uint64_t i)
{
    uint64_t x = run_seed ^ (i * 0xd1b54a32d192ed03ull);
    return splitmix(&x);
}

size_t model_seed_bytes(uint64_t seed, uint8_t *buf, size_t cap)
{
    uint64_t x = seed;
    size_t nops = 1 + splitmix(&x) % MODEL_MAX_OPS, n = MODEL_HDR_BYTES + nops * MODEL_OP_BYTES, i;

    if (n > cap)
        n = cap;
    if (n == 0)
        return 0;
    /* A third of the seeds each give format 2, format 3 (with selects)
     * and format 4 (with the channels and their thread). */
    buf[0] = nops % 3 == 0 ? MODEL_FMT_V2 : nops % 3 == 1 ? MODEL_FMT_V3 : MODEL_FMT_V4;
    for (i = 1; i < n; i += 8) {
        uint64_t r = splitmix(&x);
        size_t j;
        for (j = 0; j < 8 && i + j < n; j++)
            buf[i + j] = (uint8_t)(r >> (8 * j));
    }
    return n;
}
