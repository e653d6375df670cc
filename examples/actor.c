/* actor.c - one task owns the state, the others send it commands over a
 * queue: no lock, and the order of changes is the order of the queue.
 *
 * From the seed: "if the state belongs to one owner and the other
 * coroutines send it commands through a queue, concurrent writes disappear:
 * only the owner changes the data."
 *
 * Here the state is ten bank accounts.  A hundred client tasks each make a
 * hundred transfers.  First without an owner: a transfer checks the
 * balance, awaits an audit call, then moves the money, so two transfers
 * from one account can both pass the check.  Then with an owner task: a
 * client sends a command and waits for the reply, the owner applies
 * commands one by one.
 */
#include <stdio.h>

#include "examples.h"

#define ACCOUNTS  10
#define CLIENTS   100
#define TRANSFERS 100
#define START     1000

static long balance[ACCOUNTS];

static long total(void)
{
    long sum = 0;
    for (int i = 0; i < ACCOUNTS; i++)
        sum += balance[i];
    return sum;
}

static long lowest(void)
{
    long low = balance[0];
    for (int i = 1; i < ACCOUNTS; i++)
        if (balance[i] < low)
            low = balance[i];
    return low;
}

/* A deterministic pseudo-random transfer for client c, step i. */
static void pick(int c, int i, int *from, int *to, long *amount)
{
    unsigned x = (unsigned)(c * 7919 + i * 104729) * 2654435761u;
    *from = (int)(x % ACCOUNTS);
    *to = (int)((x / ACCOUNTS + 1 + (unsigned)*from) % ACCOUNTS);
    *amount = 100 + (long)(x % 400);
}

/* ---- shared state, no owner -------------------------------------------- */

static int client_racy(void *arg)
{
    int c = (int)(intptr_t)arg, from, to;
    long amount;

    for (int i = 0; i < TRANSFERS; i++) {
        pick(c, i, &from, &to, &amount);
        if (balance[from] < amount)
            continue;                           /* insufficient funds */
        int rc = ferry_yield();                 /* await audit_log(...) */
        if (rc)
            return rc;
        balance[from] -= amount;                /* acts on a stale check */
        balance[to] += amount;
    }
    return 0;
}

/* ---- the owner --------------------------------------------------------- */

/* A command and its reply slot; lives on the client's stack. */
struct command {
    int         from, to;     /* from < 0: stop the owner */
    long        amount;
    int         result;       /* 0 done, -EAGAIN insufficient funds */
    ferry_event done;         /* set by the owner when `result` is in */
};

static ferry_queue inbox = FERRY_QUEUE_INIT(sizeof(struct command *), 64);
static long applied, refused;

static int owner(void *arg)
{
    struct command *cmd;

    for (;;) {
        int rc = ferry_queue_get(&inbox, &cmd);
        if (rc)
            return rc;
        if (cmd->from < 0) {
            ferry_event_set(&cmd->done);
            return 0;
        }
        if (balance[cmd->from] < cmd->amount) {
            cmd->result = -EAGAIN;
            refused++;
        } else {
            balance[cmd->from] -= cmd->amount;  /* only the owner writes */
            balance[cmd->to] += cmd->amount;
            cmd->result = 0;
            applied++;
        }
        ferry_event_set(&cmd->done);
    }
}

/* Send a command and wait for its reply. */
static int call_owner(struct command *cmd)
{
    ferry_event_init(&cmd->done);
    int rc = ferry_queue_put(&inbox, &cmd);
    if (rc == 0)
        rc = ferry_event_wait(&cmd->done);
    return rc ? rc : cmd->result;
}

static int client(void *arg)
{
    int c = (int)(intptr_t)arg;
    struct command cmd;

    for (int i = 0; i < TRANSFERS; i++) {
        pick(c, i, &cmd.from, &cmd.to, &cmd.amount);
        int rc = call_owner(&cmd);
        if (rc && rc != -EAGAIN)
            return rc;
    }
    return 0;
}

static int run_clients(ferry_task_fn fn)
{
    ferry_group group;

    for (int i = 0; i < ACCOUNTS; i++)
        balance[i] = START;
    ferry_group_init(&group);
    for (int c = 0; c < CLIENTS; c++)
        ferry_group_spawn(&group, fn, (void *)(intptr_t)c, NULL);
    return ferry_group_wait(&group);
}

static int main_task(void *arg)
{
    int bad = 0;

    bad |= run_clients(client_racy) != 0;
    long racy_total = total();
    long racy_low = lowest();
    printf("  shared state, no owner: total %ld of %d, lowest balance %ld%s\n", racy_total,
           ACCOUNTS * START, racy_low, racy_low < 0 ? " (overdrawn: two transfers passed one check)" : "");

    ferry_task *owner_task;
    ferry_task_spawn(&owner_task, NULL, owner, NULL, &(ferry_task_opts){ .name = "owner" });
    int64_t t0 = ferry_now();
    bad |= run_clients(client) != 0;
    double ms = ms_since(t0);
    struct command stop = { .from = -1 };
    call_owner(&stop);
    bad |= ferry_task_join(owner_task, NULL) != 0;
    printf("  one owner task:         total %ld of %d, lowest balance %ld "
           "(%ld transfers applied, %ld refused for funds, %.0f ms)\n", total(), ACCOUNTS * START,
           lowest(), applied, refused, ms);
    ferry_queue_destroy(&inbox);
    return bad || !(racy_low < 0 || racy_total != ACCOUNTS * START) ||
           applied + refused != CLIENTS * TRANSFERS || total() != ACCOUNTS * START || lowest() < 0;
}

int ex_actor(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_actor();
}
#endif
