/* replicated_kv.c - a key-value service with a primary and a replica, its
 * clients and a checker, run on ferry's simulated network under random
 * partitions and crashes drawn from one seed.
 *
 * The service is written as it would run on TCP: its servers listen with
 * ferry_tcp_listen() and take connections with ferry_listener_accept(), its
 * clients connect to a host name with ferry_tcp_connect(), and everyone
 * talks through ferry_stream_*.  Run as tasks of simulated hosts
 * (ferry_sim_boot()), those calls reach the simulation instead of the
 * system; nothing in the service knows.  `--real` runs the same tasks on
 * loopback TCP, without faults, for a second.
 *
 * The protocol, one line each way:
 *
 *     set KEY VALUE  ->  ok KEY   | err KEY
 *     get KEY        ->  val KEY VALUE | none KEY
 *
 * Clients write to the primary.  The primary stores a write on its disk,
 * sends it to the replica and answers "ok" once the replica has answered
 * "ok": an acknowledged write is on both.  A client that cannot reach the
 * primary after a few tries fails over to the replica for that write, and
 * first asks the replica for its last acknowledged write: a replica that
 * is to take over must have it.  A host's disk survives its crashes; its
 * memory (connections, queues) does not.
 *
 * The planted bug (--bug): when the replica does not answer in time, the
 * primary answers "ok" all the same and keeps the write in memory for a
 * task that sends it on later (a slow replica should not slow the writes
 * down; it will catch up).  A replica that is down refuses the connection
 * at once, which is an error as before, and a lost segment is sent again
 * in time.  So plain runs and crashes never show the bug; only a partition
 * between the primary and the replica during a write makes the primary
 * acknowledge a write the replica lacks, and a crash of the primary before
 * the partition heals loses it (or a client that fails over before the
 * write reaches the replica finds it missing).
 *
 * The checker: once the run is over and nothing is left to send to the
 * replica, every write a client saw acknowledged must be on the replica,
 * and no client may have found its last acknowledged write missing there.
 *
 *     replicated_kv [--bug] [--trace] [SEED]    SEED, else FERRY_FUZZ's, else 1
 *     replicated_kv --real [--bug]
 *     ferry-fuzz -n 500 -- replicated_kv --bug
 *
 * The seed drives the simulation (jitter, loss, partitions, crashes) and,
 * given as FERRY_FUZZ, the loop's schedule too.  A failure prints the seed
 * with the command that replays it and exits 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "ferry/sim.h"

#define NCLIENTS 3
#define MAXOPS   1024 /* writes one client makes at most in a run */
#define KEYLEN   24
#define LINE     64
#define DISK     (NCLIENTS * MAXOPS)
#define OUTBOX   256
#define PORT     7000
#define TRIES    3

#define RUN_FOR     FERRY_SEC(20) /* the clients' part of the run */
#define RUN_REAL    FERRY_SEC(1)  /* the same with --real, in real time */
#define SETTLE_MAX  FERRY_SEC(60) /* at most, for the outbox to empty */
#define CALL_WITHIN FERRY_MSEC(500)
#define REP_WITHIN  FERRY_MSEC(300) /* the primary's wait for the replica */
#define RETRY_AFTER FERRY_MSEC(200)
#define THINK       FERRY_MSEC(30)

/* A host's disk: what it stored survives its crashes. */
struct disk {
    int n;                  /* keys stored */
    char key[DISK][KEYLEN]; /* each key, in the order first stored */
    int value[DISK];        /* its value */
};

struct mem;

/* A server host: its name, its disk, and its memory while it runs. */
struct node {
    const char *name; /* the host name clients connect to */
    int port;         /* the port it listens on */
    bool primary;     /* forwards writes to the replica */
    struct disk disk; /* survives crashes */
    struct mem *mem;  /* the running boot task's memory, or NULL */
};

/* A server's memory: lives on its boot task's stack, so a crash (which
 * cancels the boot task) takes it away with every task using it. */
struct mem {
    struct node *node;   /* whose memory */
    ferry_lock rep_lock; /* one request at a time on rep */
    ferry_stream *rep;   /* the connection to the replica, or NULL */
    /* --bug: writes acknowledged, not yet on the replica, oldest first */
    char out_key[OUTBOX][KEYLEN];
    int out_value[OUTBOX];
    int out_head;          /* index of the oldest */
    int out_len;           /* how many */
    ferry_event out_ready; /* set while out_len > 0 */
};

/* What a client did, kept outside its host: the checker's record. */
struct client {
    int id;                   /* its number, in its keys: c<id>-<n> */
    int next;                 /* the next write's number */
    int last_acked;           /* the last acknowledged write's, or -1 */
    bool acked[MAXOPS];       /* which writes were acknowledged */
    int64_t acked_at[MAXOPS]; /* when, for the report */
    int acks;                 /* writes acknowledged */
    int gave_up;              /* writes neither server acknowledged */
    int failovers;            /* writes that went to the replica */
    int missing;              /* last acknowledged writes the replica lacked */
};

static struct {
    bool bug;           /* --bug */
    bool trace;         /* --trace: print the whole trace */
    bool stop;          /* clients stop before their next write */
    bool over;          /* boot tasks return at once */
    int running;        /* boot tasks running */
    size_t checked_at;  /* the trace's length when the checker ran */
    int64_t start;      /* ferry_now() when the run began */
    int64_t first_loss; /* when the first lost write was acknowledged, or 0 */
    ferry_sim *sim;     /* NULL with --real */
    struct node primary, replica;
    struct client cl[NCLIENTS]; /* what each client saw */
} w;

static double secs(int64_t t)
{
    return (double)(t - w.start) / 1e9;
}

/* A lost write acknowledged at `t`: the report shows the faults around
 * the first one. */
static void note_loss(int64_t t)
{
    if (!w.first_loss || t < w.first_loss)
        w.first_loss = t;
}

/* ---- the disk ------------------------------------------------------------ */

static int disk_find(const struct disk *d, const char *key)
{
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->key[i], key) == 0)
            return i;
    return -1;
}

static int disk_put(struct disk *d, const char *key, int value)
{
    int i = disk_find(d, key);

    if (i < 0) {
        if (d->n == DISK)
            return -ENOSPC;
        i = d->n++;
        snprintf(d->key[i], KEYLEN, "%s", key);
    }
    d->value[i] = value;
    return 0;
}

/* ---- one request, one answer ------------------------------------------------ */

/*
 * Send "VERB KEY [VALUE]" on s and read the answer line into ans, all
 * within CALL_WITHIN.  The caller closes s after any error, so that an
 * answer still on its way is never taken for the next request's.
 */
static int call(ferry_stream *s, const char *verb, const char *key, int value, char *ans)
{
    char req[LINE];
    ferry_scope sc;
    size_t n = 0;
    int len, rc;

    if (value >= 0)
        len = snprintf(req, sizeof req, "%s %s %d\n", verb, key, value);
    else
        len = snprintf(req, sizeof req, "%s %s\n", verb, key);
    ferry_scope_enter(&sc, ferry_now() + CALL_WITHIN, 0);
    rc = ferry_stream_write(s, req, (size_t)len, NULL);
    if (!rc)
        rc = ferry_stream_read_until(s, "\n", 1, ans, LINE - 1, &n);
    ferry_scope_exit(&sc);
    ans[rc ? 0 : n] = '\0';
    return rc;
}

/* Connect to `to` if *s is not open yet. */
static int ensure_connected(ferry_stream **s, const struct node *to)
{
    ferry_stream *c;
    ferry_scope sc;
    int rc;

    if (*s)
        return 0;
    ferry_scope_enter(&sc, ferry_now() + CALL_WITHIN, 0);
    rc = ferry_tcp_connect(&c, to->name, to->port, NULL);
    ferry_scope_exit(&sc);
    if (!rc)
        *s = c;
    return rc;
}

static void drop(ferry_stream **s)
{
    if (*s)
        ferry_stream_close(*s);
    *s = NULL;
}

/* Is `ans` the answer `word KEY...` to a request about `key`? */
static bool answer_is(const char *ans, const char *word, const char *key)
{
    char w1[8], k[KEYLEN];

    return sscanf(ans, "%7s %23s", w1, k) == 2 && strcmp(w1, word) == 0 && strcmp(k, key) == 0;
}

/* ---- the servers ------------------------------------------------------------ */

/* Send one write to the replica on the memory's connection and wait for
 * its "ok", within REP_WITHIN: less than a client waits for the primary,
 * so that the client hears the outcome.  Any failure drops the
 * connection. */
static int replicate(struct mem *m, const char *key, int value)
{
    char ans[LINE];
    ferry_scope sc;
    int rc;

    ferry_scope_enter(&sc, ferry_now() + REP_WITHIN, 0);
    if ((rc = ferry_lock_acquire(&m->rep_lock)) == 0) {
        rc = ensure_connected(&m->rep, &w.replica);
        if (!rc)
            rc = call(m->rep, "set", key, value, ans);
        if (!rc && !answer_is(ans, "ok", key))
            rc = -EIO;
        if (rc)
            drop(&m->rep);
        ferry_lock_release(&m->rep_lock);
    }
    ferry_scope_exit(&sc);
    return rc;
}

/* --bug: the task that sends the outbox to the replica, oldest first,
 * trying again after each failure. */
static int replicator(void *arg)
{
    struct mem *m = arg;
    int rc = 0;

    while (rc != -ECANCELED) {
        if (m->out_len == 0) {
            ferry_event_clear(&m->out_ready);
            rc = ferry_event_wait(&m->out_ready);
            continue;
        }
        rc = replicate(m, m->out_key[m->out_head], m->out_value[m->out_head]);
        if (rc == 0) {
            m->out_head = (m->out_head + 1) % OUTBOX;
            m->out_len--;
        } else if (rc != -ECANCELED) {
            rc = ferry_sleep(RETRY_AFTER);
        }
    }
    return 0;
}

static int outbox_push(struct mem *m, const char *key, int value)
{
    int i = (m->out_head + m->out_len) % OUTBOX;

    if (m->out_len == OUTBOX)
        return -ENOBUFS;
    snprintf(m->out_key[i], KEYLEN, "%s", key);
    m->out_value[i] = value;
    m->out_len++;
    ferry_event_set(&m->out_ready);
    return 0;
}

/* A write on this server: on its disk, and on the replica's before the
 * primary acknowledges it (with --bug, not always). */
static int handle_set(struct mem *m, const char *key, int value)
{
    int rc = disk_put(&m->node->disk, key, value);

    if (rc || !m->node->primary)
        return rc;
    rc = replicate(m, key, value);
    if (rc == -ETIMEDOUT && w.bug)
        return outbox_push(m, key, value); /* the bug: "ok" before the replica has it */
    return rc;
}

struct conn {
    struct mem *mem; /* the server's memory */
    ferry_stream *s; /* the connection */
};

/* Answer one connection's requests until it ends. */
static int serve(void *arg)
{
    struct conn *c = arg;
    struct mem *m = c->mem;
    ferry_stream *s = c->s;
    char line[LINE], ans[LINE], key[KEYLEN];
    size_t n;
    int value, i;

    free(c);
    while (ferry_stream_read_until(s, "\n", 1, line, sizeof line - 1, &n) == 0) {
        line[n] = '\0';
        if (sscanf(line, "set %23s %d", key, &value) == 2) {
            snprintf(ans, sizeof ans, "%s %s\n", handle_set(m, key, value) ? "err" : "ok", key);
        } else if (sscanf(line, "get %23s", key) == 1) {
            if ((i = disk_find(&m->node->disk, key)) >= 0)
                snprintf(ans, sizeof ans, "val %s %d\n", key, m->node->disk.value[i]);
            else
                snprintf(ans, sizeof ans, "none %s\n", key);
        } else {
            break;
        }
        if (ferry_stream_write(s, ans, strlen(ans), NULL))
            break;
    }
    ferry_stream_close(s);
    return 0;
}

/* A server host's boot task: it runs at the start and again after each
 * restart, with empty memory and the disk as the crash left it. */
static int server_boot(void *arg)
{
    struct mem m = { .node = arg };
    ferry_listener *l;
    ferry_stream *s;
    ferry_group tasks;
    struct conn *c;
    int rc;

    if (w.over)
        return 0;
    ferry_event_init(&m.out_ready);
    ferry_group_init(&tasks);
    if ((rc = ferry_tcp_listen(&l, NULL, "127.0.0.1", m.node->port, NULL)))
        return rc;
    m.node->port = ferry_listener_port(l); /* the one picked for port 0 */
    w.running++;
    m.node->mem = &m;
    if (m.node->primary && w.bug && (rc = ferry_group_spawn(&tasks, replicator, &m, NULL)))
        goto out;
    while ((rc = ferry_listener_accept(l, &s, NULL)) != -ECANCELED && rc != -EBADF) {
        if (rc)
            continue;
        c = malloc(sizeof *c);
        if (c)
            *c = (struct conn){ &m, s };
        if (!c || ferry_group_spawn(&tasks, serve, c, NULL)) {
            free(c);
            ferry_stream_close(s);
        }
    }
out:
    ferry_listener_close(l);
    ferry_group_wait(&tasks); /* cancelled: every task of the host ends here */
    drop(&m.rep);
    m.node->mem = NULL;
    w.running--;
    return rc;
}

/* ---- the clients ------------------------------------------------------------ */

/* On failing over: is the client's last acknowledged write on the replica? */
static int check_last(struct client *c, ferry_stream *s)
{
    char key[KEYLEN], ans[LINE];
    int rc;

    if (c->last_acked < 0)
        return 0;
    snprintf(key, sizeof key, "c%d-%d", c->id, c->last_acked);
    if ((rc = call(s, "get", key, -1, ans)))
        return rc;
    if (answer_is(ans, "none", key)) {
        c->missing++;
        note_loss(c->acked_at[c->last_acked]);
        printf("%8.3f s  client %d: write %s acknowledged at %.3f s is not on the replica\n",
               secs(ferry_now()), c->id, key, secs(c->acked_at[c->last_acked]));
    }
    return 0;
}

/* One write: TRIES tries on the primary, then TRIES on the replica. */
static int client_write(struct client *c, ferry_stream **s, const struct node **to)
{
    char key[KEYLEN], ans[LINE];
    int rc = 0, n = c->next++;

    snprintf(key, sizeof key, "c%d-%d", c->id, n);
    for (int t = 0; t < 2 * TRIES; t++) {
        if (t == TRIES && *to == &w.primary) {
            drop(s);
            *to = &w.replica;
            c->failovers++;
        }
        if (t > 0 && (rc = ferry_sleep(RETRY_AFTER)))
            return rc;
        rc = ensure_connected(s, *to);
        if (!rc && *to == &w.replica && t == TRIES)
            rc = check_last(c, *s);
        if (!rc)
            rc = call(*s, "set", key, n, ans);
        if (!rc && answer_is(ans, "ok", key)) {
            c->acked[n] = true;
            c->acked_at[n] = ferry_now();
            c->last_acked = n;
            c->acks++;
            return 0;
        }
        drop(s);
        if (rc == -ECANCELED)
            return rc;
    }
    c->gave_up++;
    return 0;
}

/* A client host's boot task: write until the run is over, starting from
 * the primary again for each write. */
static int client_boot(void *arg)
{
    struct client *c = arg;
    const struct node *to = &w.primary;
    ferry_stream *s = NULL;
    int rc = 0;

    w.running++;
    while (!w.stop && !w.over && c->next < MAXOPS && rc != -ECANCELED) {
        if (to != &w.primary) {
            drop(&s);
            to = &w.primary;
        }
        rc = client_write(c, &s, &to);
        if (!rc)
            rc = ferry_sleep(THINK);
    }
    drop(&s);
    w.running--;
    return 0;
}

/* ---- the run ---------------------------------------------------------------- */

static int boot_hosts(void)
{
    struct node *servers[2] = { &w.primary, &w.replica };
    ferry_sim_host *h;
    char name[16];
    int rc;

    for (int i = 0; i < 2; i++)
        if ((rc = ferry_sim_find_host(w.sim, servers[i]->name, &h)) ||
            (rc = ferry_sim_boot(h, server_boot, servers[i])))
            return rc;
    for (int i = 0; i < NCLIENTS; i++) {
        snprintf(name, sizeof name, "client%d", i);
        if ((rc = ferry_sim_find_host(w.sim, name, &h)) ||
            (rc = ferry_sim_boot(h, client_boot, &w.cl[i])))
            return rc;
    }
    return 0;
}

/* Every acknowledged write on the replica?  Prints what it found; returns
 * the number of writes lost. */
static int check(void)
{
    int acks = 0, lost = 0, missing = 0, failovers = 0, gave_up = 0;
    char key[KEYLEN];

    for (int i = 0; i < NCLIENTS; i++) {
        struct client *c = &w.cl[i];

        for (int n = 0; n < c->next; n++) {
            snprintf(key, sizeof key, "c%d-%d", i, n);
            if (!c->acked[n] || disk_find(&w.replica.disk, key) >= 0)
                continue;
            note_loss(c->acked_at[n]);
            if (lost++ < 5)
                printf("lost: %s, acknowledged at %.3f s, is not on the replica\n", key,
                       secs(c->acked_at[n]));
        }
        acks += c->acks;
        missing += c->missing;
        failovers += c->failovers;
        gave_up += c->gave_up;
    }
    printf("%d writes acknowledged, %d lost; %d found missing on failing over; %d failovers, "
           "%d writes given up\n",
           acks, lost, missing, failovers, gave_up);
    return lost + missing;
}

/* Stop every host for good: the boot tasks return at once from now on. */
static int stop_hosts(void)
{
    const char *names[] = { "primary", "replica", "client0", "client1", "client2" };
    ferry_sim_host *h;

    w.over = true;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (ferry_sim_find_host(w.sim, names[i], &h) == 0)
            ferry_sim_crash(w.sim, h);
    while (w.running)
        if (ferry_sleep(FERRY_MSEC(1)))
            return -ECANCELED;
    return 0;
}

/* --real: the same tasks on loopback TCP, servers first (their ports
 * are picked by the system), then the clients; no faults. */
static int boot_real(ferry_task **t)
{
    struct node *servers[2] = { &w.primary, &w.replica };
    int rc;

    for (int i = 0; i < 2; i++) {
        servers[i]->name = "127.0.0.1";
        servers[i]->port = 0;
        if ((rc = ferry_task_spawn(&t[i], NULL, server_boot, servers[i], NULL)))
            return rc;
    }
    while (!w.primary.port || !w.replica.port)
        if ((rc = ferry_yield()))
            return rc;
    for (int i = 0; i < NCLIENTS; i++)
        if ((rc = ferry_task_spawn(&t[2 + i], NULL, client_boot, &w.cl[i], NULL)))
            return rc;
    return 0;
}

static void stop_real(ferry_task **t)
{
    w.over = true;
    for (int i = 0; i < 2 + NCLIENTS; i++) {
        if (!t[i])
            continue;
        ferry_task_cancel(t[i]);
        ferry_task_join(t[i], NULL);
    }
}

/* The scenario: the clients write for RUN_FOR under random faults, then
 * the primary gets until its outbox is empty (--bug) and the checker
 * looks. */
static int scenario(void *arg)
{
    ferry_task *t[2 + NCLIENTS] = { NULL };
    int *failures = arg, rc;
    int64_t until;

    w.start = ferry_now();
    rc = w.sim ? boot_hosts() : boot_real(t);
    if (!rc)
        rc = ferry_sleep(w.sim ? RUN_FOR : RUN_REAL);
    w.stop = true;
    until = ferry_now() + SETTLE_MAX;
    while (!rc && w.primary.mem && w.primary.mem->out_len > 0 && ferry_now() < until)
        rc = ferry_sleep(FERRY_MSEC(100));
    if (!rc)
        *failures = check();
    if (w.sim) {
        ferry_sim_trace(w.sim, &w.checked_at); /* the trace's end worth printing */
        if (!rc)
            rc = stop_hosts();
    } else {
        stop_real(t);
    }
    ferry_loop_stop(NULL);
    return rc;
}

/* FNV-1a of the trace: two runs agree on it when they agree on every
 * delivery and fault. */
static uint64_t trace_hash(const char *t, size_t len)
{
    uint64_t h = 14695981039346656037ull;

    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)t[i]) * 1099511628211ull;
    return h;
}

/* Is this line of the trace a fault (a partition, a heal, a crash, a
 * restart) rather than a connection's event ("TIME cN ...")? */
static bool is_fault(const char *line)
{
    const char *p = strchr(line, ' ');

    return p && !(p[1] == 'c' && p[2] >= '0' && p[2] <= '9');
}

/* The faults of the trace's first `len` bytes from 2 s before to 2 s
 * after `at`: what happened to the hosts around a lost write.  A line
 * starts with its time since the simulation was made, as `at - w.start`. */
static void print_faults(const char *t, size_t len, int64_t at)
{
    int64_t from = at - w.start - FERRY_SEC(2), to = at - w.start + FERRY_SEC(2), when;
    size_t end;

    printf("faults from 2 s before to 2 s after %.3f s:\n", secs(at));
    for (size_t i = 0; i < len; i = end) {
        const char *nl = memchr(t + i, '\n', len - i);

        end = nl ? (size_t)(nl - t) + 1 : len;
        when = strtoll(t + i, NULL, 10);
        if (is_fault(t + i) && when >= from && when <= to)
            printf("    %.*s", (int)(end - i), t + i);
    }
}

static const ferry_sim_opts faults = {
    .latency = FERRY_MSEC(2),
    .jitter = FERRY_MSEC(3),
    .stall = FERRY_SEC(1),
    .loss_ppm = 1000,
    .partition_every = FERRY_SEC(3),
    .partition_for = FERRY_SEC(1),
    .crash_every = FERRY_SEC(5),
    .crash_for = FERRY_SEC(1),
};

/* Print what the run found; returns the exit status. */
static int report(const char *argv0, int status, int failures)
{
    const char *trace = NULL;
    size_t len = 0;

    if (status)
        printf("the scenario ended with %s\n", strerror(-status));
    if (w.sim) {
        trace = ferry_sim_trace(w.sim, &len);
        if (w.trace && trace)
            fwrite(trace, 1, len, stdout);
        printf("seed %" PRIu64 "%s: trace of %zu bytes, hash %016" PRIx64 "\n",
               ferry_sim_seed(w.sim), w.bug ? " (--bug)" : "", len,
               trace ? trace_hash(trace, len) : 0);
    }
    if (status == 0 && failures == 0) {
        printf("ok\n");
        return 0;
    }
    if (!w.sim)
        return 1;
    if (trace)
        print_faults(trace, w.checked_at ? w.checked_at : len,
                     w.first_loss ? w.first_loss : ferry_now());
    printf("FAILED seed %" PRIu64 ": replay with FERRY_FUZZ=%s %s%s\n", ferry_sim_seed(w.sim),
           getenv("FERRY_FUZZ"), argv0, w.bug ? " --bug" : "");
    return 1;
}

int main(int argc, char **argv)
{
    bool real = false;
    ferry_loop *loop;
    ferry_task *t;
    int failures = -1, status = -1, rc, a = 1;

    for (; a < argc && argv[a][0] == '-'; a++) {
        if (strcmp(argv[a], "--bug") == 0)
            w.bug = true;
        else if (strcmp(argv[a], "--real") == 0)
            real = true;
        else if (strcmp(argv[a], "--trace") == 0)
            w.trace = true;
    }
    if (a < argc)
        setenv("FERRY_FUZZ", argv[a], 1); /* one number replays the network and the schedule */
    else if (!getenv("FERRY_FUZZ") && !real)
        setenv("FERRY_FUZZ", "1", 1);
    w.primary = (struct node){ .name = "primary", .port = PORT, .primary = true };
    w.replica = (struct node){ .name = "replica", .port = PORT };
    for (int i = 0; i < NCLIENTS; i++)
        w.cl[i] = (struct client){ .id = i, .last_acked = -1 };
    if ((rc = ferry_loop_new(&loop, &(ferry_loop_opts){ .virtual_clock = !real })) ||
        (!real && (rc = ferry_sim_new(&w.sim, loop, 0, &faults))) ||
        (rc = ferry_task_spawn(&t, loop, scenario, &failures, NULL))) {
        fprintf(stderr, "replicated_kv: cannot start: %s\n", strerror(-rc));
        return 2;
    }
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    rc = report(argv[0], status, failures);
    if (w.sim)
        ferry_sim_free(w.sim);
    ferry_loop_free(loop);
    return rc;
}
