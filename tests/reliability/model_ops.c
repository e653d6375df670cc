/* model_ops.c - the model-based tester's operations: the command tables
 * of each format, the decoding of an operation from its bytes, and the
 * seeds that make random sequences.  See model.h and model_int.h.
 */
#include "model_int.h"

const char *const model__cop_names[] = {
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

/* The two cases of a select command, listed in this order: format 3's by
 * its arg % 3 (get and event, put and event, get and put), format 4's by
 * its arg % 11 (a channel first or second, two channels, and format 3's). */
static const int sel_kinds[3][2] = { { SK_GET, SK_EV }, { SK_PUT, SK_EV }, { SK_GET, SK_PUT } };

static const int sel_kinds_v4[11][2] = {
    { SK_CR0, SK_GET }, { SK_CS0, SK_PUT }, { SK_CR0, SK_EV }, { SK_GET, SK_CR1 },
    { SK_CR0, SK_CR1 }, { SK_CR0, SK_CS1 }, { SK_CS0, SK_CR1 }, { SK_EV, SK_CS1 },
    { SK_GET, SK_EV }, { SK_PUT, SK_EV }, { SK_GET, SK_PUT },
};

const int *model__sel_pair(int fmt, int arg)
{
    return fmt == MODEL_FMT_V4 ? sel_kinds_v4[arg % 11] : sel_kinds[arg % 3];
}

const char *const model__act_names[] = {
    "nothing", "event_set", "event_clear", "sem_release", "cancel", "queue_try_put",
};

/* Decode the operation at b[0..MODEL_OP_BYTES) of a sequence of format
 * `fmt`.  Format 1 is the original mix; format 2 adds timers, thread
 * posts, the driver's wait for them, and sleep and group commands; format
 * 4 the channel thread. */
void model__decode_op(int fmt, const uint8_t *b, struct op *o)
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
