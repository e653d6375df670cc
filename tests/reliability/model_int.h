/* model_int.h - what the files of the model-based tester share: the
 * operations, the sizes, the reference model's state (model_ref.c), the
 * real side's (model_real.c) and the functions each file offers the
 * others.  See model.h for the tester, model_ops.c for the decoding,
 * model_driver.c for the driver.  Not installed, not used outside
 * tests/reliability/.
 */
#ifndef FERRY_MODEL_INT_H
#define FERRY_MODEL_INT_H

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

/* ---- operations (model_ops.c) ------------------------------------------ */

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
    C_SELECT,    /* ferry_select() over two cases (model__sel_pair()) */
    C_CH_SEND, C_CH_RECV,   /* format 4: a task's send to, receive from a channel */
    C_NCOP
};

/* The kinds of a select's cases: the queue's get and put, the event, and
 * a receive from and a send to each of the two channels. */
enum { SK_GET, SK_PUT, SK_EV, SK_CR0, SK_CS0, SK_CR1, SK_CS1 };

/* A channel case: which channel, which side. */
static inline bool sk_chan(int kind)
{
    return kind >= SK_CR0;
}

static inline int sk_ch(int kind)
{
    return (kind - SK_CR0) / 2;
}

static inline bool sk_send(int kind)
{
    return kind == SK_CS0 || kind == SK_CS1;
}

/* The channel of a task's channel command, and of the channel thread's
 * operation (its arg2). */
#define NCH 2
static inline int cmd_ch(int arg)
{
    return (arg >> 1) % NCH;
}

/* What the channel thread does (the operation's arg): try to send, try to
 * receive, or, rarely, close the channel. */
enum { CT_SEND, CT_RECV, CT_CLOSE };

static inline int cht_kind(int arg)
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

/* ---- the reference model (model_ref.c) --------------------------------- */

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

/* ---- the real side (model_real.c) -------------------------------------- */

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

/* ---- what each file offers the others ------------------------------------ */

/* model_ops.c: the names of the commands and of the callbacks' actions,
 * for traces; the decoding of one operation; a select command's cases. */
extern const char *const model__cop_names[];
extern const char *const model__act_names[];
const int *model__sel_pair(int fmt, int arg);
void model__decode_op(int fmt, const uint8_t *b, struct op *o);

/* model_ref.c: the reference model's steps, as the driver runs them. */
void model__m_ready(struct model *m, int id);
bool model__m_grant(struct model *m, int id, int res);
bool model__mch_ready(const struct model *m, int k, bool send);
void model__mch_put(struct model *m, int k, int v, bool thread);
int model__mch_take(struct model *m, int k, bool thread);
void model__mch_close(struct model *m, int k, bool thread);
void model__m_cancel(struct model *m, int id);
void model__m_expire(struct model *m, int id);
int model__prio_of(int v);
int model__fail_status(int arg);
int model__cancel_target(int n, const bool *live, const bool *sleeping, const int *parent,
                         int sel);
void model__m_step(struct model *m);
void model__m_wait(struct model *m);

/* model_ref.c: the model's state, waits and primitives, for its commands. */
int model__lock_wq(int lk);
int model__m_check(struct model *m, int id);
int model__m_cond_wake(struct model *m, unsigned n);
void model__m_done(struct model *m, int id, int rc, int val);
void model__m_ev_set(struct model *m);
void model__m_fl_finish(struct model *m, int k, int st, int val);
bool model__m_fl_hand_over(struct model *m, int k);
void model__m_group_cancel(struct model *m, int o);
void model__m_kl_ref(struct model *m, int k);
void model__m_kl_unref(struct model *m, int k);
int model__m_live_count(const struct model *m);
void model__m_lock_pass(struct model *m, int lk);
void model__m_lock_take(struct model *m, int lk, int id);
size_t model__m_q_avail(const struct model *m);
size_t model__m_q_free(const struct model *m);
int model__m_q_pop(struct model *m);
void model__m_q_push(struct model *m, int v);
void model__m_q_serve_getters(struct model *m);
void model__m_q_serve_putters(struct model *m);
int model__m_q_tryput(struct model *m, int v);
void model__m_q_wake_all(struct model *m, int q, int res);
const int *model__m_sel_cases(const struct model *m, int id);
int model__m_sem_release(struct model *m, uint64_t n);
void model__m_sem_serve(struct model *m);
int model__m_wait_begin(struct model *m, int id, int q);
int model__m_wait_result(struct model *m, int id);
void model__mch_link(struct model *m, int k, bool send, int nd);
void model__mch_unlink(struct model *m, int k, bool send, int nd);
void model__mch_wake_one(struct model *m, int k, bool receivers, bool thread);
int model__sel_wq(int kind);
void model__wq_del(struct model *m, int q, int id);
int model__wq_first(const struct model *m, int q);
void model__wq_push(struct model *m, int q, int id);

/* model_ref_cmds.c: an actor's command run or resumed on the model, and the
 * teardown's cleanup. */
void model__m_exec(struct model *m, int id, bool resumed);
void model__m_cleanup(struct model *m, int id);

/* model_real.c: the actors on the real loop and their records. */
extern struct seq *model__cur;               /* the sequence the actors belong to */
extern unsigned long model__stray_callbacks; /* callbacks that ran after their sequence */
void model__failf(struct seq *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int model__r_id(struct seq *s, const ferry_task *t);
ferry_task *model__r_task(struct seq *s, int i);
int model__r_state(struct seq *s, int i);
bool model__r_live(struct seq *s, int i);
bool model__r_sleep_waited(int id);
void model__cb_main(void *arg);
int model__qcmp(const void *a, const void *b, void *arg);
void model__r_ch_sent(struct seq *s, int k, int item);
void model__r_ch_got(struct seq *s, int k, int item);
int model__actor_main(void *arg);

/* model_driver.c: the run queue's test and the trace, for model_threads.c. */
bool model__runq_empty(ferry_loop *loop);
void model__trace_op(struct seq *s, const struct op *o, int id);

/* model_threads.c: timers, posts from a thread, the channel thread and the
 * driver's wait, as the driver runs them. */
void model__op_cht(struct seq *s, const struct op *o);
void model__op_post(struct seq *s, const struct op *o);
void model__op_tcancel(struct seq *s, const struct op *o);
void model__op_timer(struct seq *s, const struct op *o);
void model__op_wait(struct seq *s, const struct op *o);
void model__poster_flush(struct seq *s);
bool model__r_wait_pending(struct seq *s, int64_t *until);

#endif
