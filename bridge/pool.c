/* pool.c - thread pools: to_thread for tasks, submit for plain threads.
 *
 * A pool is a fixed set of threads and a bounded FIFO of jobs under one
 * mutex.  A task's job lives on the task's stack (ferry_to_thread
 * allocates nothing); its completion goes back through the loop's inbox,
 * which cannot fail.
 *
 * The hot path, one job of a task (ferry_to_thread):
 *
 *   - The task does not take the pool's mutex.  Its job goes on its loop's
 *     list of jobs to hand over (struct ferry__subq, loop thread only), and
 *     a callback that runs after the current turn queues everything the
 *     turn offloaded with one lock per pool and one decision about waking
 *     a worker.  1,000 tasks that offload in one turn cost one lock, not
 *     1,000 that contend with the workers.
 *   - A worker takes one lock per job: the acquisition that takes the next
 *     job also books the end of the previous one.  A finished task job goes
 *     on the pool's completion list (the sink, struct sink) under that same
 *     lock; the first one on an empty sink posts the sink to the loop's
 *     inbox (one inbox lock, at most one eventfd write), and the loop takes
 *     the whole list when it runs it and wakes each task directly.
 *   - Waking: a new batch of jobs goes to a spinning worker if there is
 *     one, else one sleeping worker is signalled, unless busy workers will
 *     reach it soon (see enough_workers_locked()).  A worker that takes a
 *     job while others sleep wakes one more if the jobs are slow enough
 *     for another thread to help (see more_workers_locked()): slow jobs
 *     spread over the threads at once, short ones stay on one, which runs
 *     them faster than several threads contending for the lock and the
 *     CPUs would.
 *   - Spinning: an idle worker polls for work for a while (see
 *     idle_locked() and spin_for_work()), and a loop that handed a job to a
 *     spinning worker and has nothing else to do polls for the completion
 *     (see LSPIN_MAX_NS): a round trip then needs no wakeup on either side.
 *     Both budgets adapt, and neither polls a CPU it shares with the thread
 *     it waits for.
 *
 * Job states (under mu): QUEUED (in `queue`, or in `overq` when the queue
 * was full) -> RUNNING (a worker took it) -> FINISHED (fn returned, or the
 * pool was freed while it was queued; the completion is posted).  Before
 * QUEUED a task's job may be `pending` on its loop's list (loop thread).  A
 * task interrupted while its job is pending or QUEUED removes it: it never
 * runs.  RUNNING: the task waits, shielded, or (abandon variant, heap job)
 * marks it abandoned and leaves; the worker then runs the cleanup and
 * frees it.  FINISHED: the completion is on its way; the task waits for it
 * (ferry__xwake_settle) so the worker's write into the task's stack has
 * landed before the frame goes away.
 *
 * Backpressure.  A full queue makes a task wait: its job waits in `overq`
 * (the task is suspended anyway) and moves into the queue, in order, as
 * room appears.  Plain threads in ferry_pool_submit block on `room`.
 *
 * The pool memory is reference-counted: its creator, every to_thread call
 * in progress, every submitted job whose completion has not run yet and a
 * posted sink hold one, so nothing touches a freed pool after
 * ferry_pool_free().
 *
 * Lock order: pool.mu -> inbox.mu (bridge_int.h).  Callbacks (fn, done,
 * cleanup) always run with no lock held.
 */
#define _GNU_SOURCE 1           /* sched_getcpu */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "bridge_int.h"

enum { JOB_QUEUED = 1, JOB_RUNNING, JOB_FINISHED };
enum { KIND_TASK = 1, KIND_SUBMIT };

struct job {
    /* The first 64 bytes hold everything a worker reads or writes on the
     * hot path, so that a job costs one cache line's trip to the worker
     * and back (a task's job is aligned to a line on its stack). */
    struct ferry__link  link;      /* mu: in pool->queue or pool->overq while QUEUED, in
                                    * pool->sink.more while FINISHED; loop thread: in the
                                    * loop's subq while pending (see `gen`) */
    ferry_job_fn        fn;        /* the blocking call */
    void               *arg;       /* its argument (the caller's) */
    uint64_t            enq;       /* mu: when it was queued (ticks()) */
    struct ferry_inbox *ib;        /* KIND_TASK: the inbox of the task's loop;
                                    * KIND_SUBMIT: the loop's inbox, or NULL */
    int                 state;     /* mu: JOB_* */
    int                 status;    /* fn's status; written before the completion is posted */
    unsigned char       kind;      /* KIND_TASK or KIND_SUBMIT */
    bool                heap;      /* allocated by ferry (abandon variant, submit) */
    bool                abandoned; /* mu: the task left; the worker cleans up */
    bool                over;      /* mu: QUEUED in overq, waiting for room */
    bool                dropped;   /* mu: FINISHED without running (pool freed, or every
                                    * thread blocked); read by the abandon variant only,
                                    * which alone initialises it */
    /* The waiting side.  A task's job fits three cache lines: the fields
     * of the other kind share its wake's room, and the task's loop
     * touches no fourth line per job. */
    uint64_t            gen;       /* loop thread: the flush of its loop's subq it waits
                                    * for (subq.gen + 1 while pending), 0 if never deferred */
    struct ferry_pool  *pool;      /* its pool (KIND_SUBMIT: holds a reference) */
    union {
        struct ferry__xwake xw;    /* KIND_TASK: wakes the waiting task */
        struct {
            struct ferry__cnode cn;    /* with a loop: runs `done` there */
            ferry_job_done      done;  /* completion callback, or NULL */
            void               *done_arg; /* its argument */
        } sub;                     /* KIND_SUBMIT */
    };
    ferry_job_cleanup   cleanup;   /* abandon variant: receives the late status */
};

_Static_assert(offsetof(struct job, gen) <= 64, "a worker's fields of struct job fit one cache line");
_Static_assert(sizeof(struct job) <= 192, "a task's job fits three cache lines");

/* A task waiting for room in the queue (the fallback path, see offload). */
struct room_waiter {
    struct ferry__link  link;      /* mu: in pool->roomq until woken */
    struct ferry__xwake xw;        /* the waiting task */
};

/*
 * The completions of finished task jobs for one inbox, taken by the loop
 * in one go.  It serves one inbox at a time: it is bound to a job's inbox
 * whenever it is idle (empty and not posted); a job for another inbox
 * while it is busy is completed the ordinary way.  Workers note finished
 * jobs in an array (two, used in turn: the loop delivers one while the
 * workers fill the other), so that the loop reads a dense array and can
 * prefetch the jobs ahead instead of chasing a list through a thousand
 * task stacks; what does not fit goes on a list.
 */
#define SINK_SLOTS 1024

struct sink {
    struct ferry__cnode cn;        /* in ib's completion queue while `posted` */
    struct ferry_inbox *ib;        /* mu: the inbox served; only compared while idle */
    bool                posted;    /* mu: cn is posted and has not taken the jobs yet */
    bool                taken[2];  /* mu: slot[i] is being delivered by a loop */
    unsigned            fill;      /* mu: the array workers fill */
    size_t              n;         /* mu: jobs in slot[fill] */
    struct ferry__link  more;      /* mu: FINISHED task jobs that did not fit, FIFO */
    struct job         *slot[2][SINK_SLOTS]; /* mu: FINISHED task jobs for ib */
};

struct ferry_pool {
    pthread_mutex_t     mu;        /* guards the fields marked "mu" */
    pthread_cond_t      work;      /* idle workers wait here */
    pthread_cond_t      room;      /* threads in ferry_pool_submit wait for room */
    struct ferry__link  queue;     /* mu: struct job, FIFO */
    struct ferry__link  overq;     /* mu: task jobs that found the queue full, FIFO */
    struct ferry__link  roomq;     /* mu: struct room_waiter, FIFO */
    size_t              nqueued;   /* mu: jobs in queue */
    size_t              capacity;  /* set once */
    unsigned            nthreads;  /* set once: threads started */
    unsigned            nidle;     /* mu: workers waiting on `work` */
    unsigned            nwaking;   /* mu: of those, signalled and not yet back */
    unsigned            nblocked;  /* mu: workers blocked calling into a loop */
    unsigned            room_threads; /* mu: threads waiting on `room` */
    size_t              running;   /* mu: jobs running, abandoned ones included */
    size_t              nabandoned;/* mu: of those, abandoned */
    uint64_t            completed; /* mu */
    uint64_t            cancelled; /* mu */
    atomic_ulong        callback_errors; /* completions that returned non-zero */
    bool                stopping;  /* mu: ferry_pool_free() began */
    bool                spinner;   /* mu: a worker spins for work, not yet claimed by a job */
    int64_t             spin_ns;   /* mu: how long an idle worker spins now (adaptive) */
    int64_t             lspin_ns;  /* mu: how long an idle loop waits for a completion (adaptive) */
    int64_t             flush_ns;  /* mu: when a loop last queued jobs */
    uint64_t            svc;       /* mu: moving average of a job's run time, ticks() */
    pthread_cond_t      check;     /* the checker sleeps here (CLOCK_MONOTONIC) */
    bool                checker;   /* mu: a worker is the checker (not in nidle) */
    bool                check_kick;/* mu: the checker was woken for work */
    bool                appoint;   /* mu: a sleeper was woken to be the next checker */
    int64_t             check_ns;  /* mu: its timeout now (adaptive) */
    uint64_t            stalled;   /* mu: stuck jobs the checker took */
    atomic_size_t       qhint;     /* nqueued, published for the spinner */
    atomic_int          sub_cpu;   /* CPU of the last submitter (a hint; any thread) */
    atomic_int          spin_cpu;  /* CPU the spinner last ran on (a hint) */
    bool                multicpu;  /* set once: more than one CPU online */
    pthread_t          *threads;   /* set once */
    /* Apart from the fields the workers write all the time: the loop
     * thread takes and drops a reference per ferry_to_thread. */
    char                pad0[64];
    atomic_uint         refs;      /* creator + calls in progress + pending completions + posted sink */
    char                pad1[64];
    struct sink         sink;      /* mu (cn: see struct sink) */
};

/* The pool whose worker is the calling thread, or NULL. */
static _Thread_local struct ferry_pool *tls_pool;

static pthread_mutex_t default_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ferry_pool *_Atomic default_pool;

/*
 * The loop's wait.  When the flush after a turn hands jobs to a spinning
 * worker and the loop has nothing else to run, the loop polls for the
 * completion for up to lspin_ns before it goes to sleep in epoll
 * (ferry__inbox_spin): a task's round trip then costs no system call and
 * no wakeup on either side.  It stops early if the job has not been taken
 * within LSPIN_TAKE_NS (the spinner is not running, e.g. it shares the
 * loop's CPU).  The budget adapts as the worker's: a wait that timed out
 * halves it, a completion that came within LSPIN_MAX_NS of the flush
 * restores it.
 */
#define LSPIN_MAX_NS  FERRY_USEC(20)
#define LSPIN_MIN_NS  FERRY_USEC(2)
#define LSPIN_TAKE_NS FERRY_USEC(2)

/* ---- a cheap clock for the service time and the queueing delay ------- */

/*
 * When another worker is worth waking: the jobs take SVC_MIN_NS or more
 * each (below that, the lock and the cache-line trips of a job cost about
 * as much as the job: a second thread would only contend), and the work
 * queued, or the wait of the job just taken, is above QDELAY_NS (about
 * what waking a thread costs).
 */
#define QDELAY_NS  FERRY_USEC(50)
#define SVC_MIN_NS FERRY_USEC(1)

/*
 * The checker.  A worker wakes another only when it takes a job (see
 * more_workers_locked()), so jobs could sit in the queue behind workers
 * that are all busy with long jobs while others sleep: a batch of slow
 * jobs after a run of short ones (whose average said "one thread is
 * enough"), or jobs that wait for each other.  So one idle worker, the
 * checker, sleeps with a timeout on a condition of its own: when it finds
 * the job at the head of the queue waiting longer than CHECK_MIN_NS, it
 * takes it and wakes a sleeper to be the checker in its place.  Its
 * timeout starts at CHECK_MIN_NS and doubles up to CHECK_MAX_NS while it
 * finds nothing stuck (an idle pool wakes it a few times a second at
 * most).  New work goes to the other sleepers first; to the checker only
 * when none is left, and it then hands the duty on the same way.
 */
#define CHECK_MIN_NS FERRY_MSEC(1)
#define CHECK_MAX_NS FERRY_MSEC(128)

static uint64_t qdelay_ticks;          /* QDELAY_NS in ticks(); set once */
static uint64_t svc_min_ticks;         /* SVC_MIN_NS in ticks(); set once */
static uint64_t check_ticks;           /* CHECK_MIN_NS in ticks(); set once */
static pthread_once_t ticks_once = PTHREAD_ONCE_INIT;

/* A monotonic counter: the TSC on x86-64 (about 10 ns to read, a third of
 * ferry_now()), else ferry_now().  Only compared with qdelay_ticks, so an
 * imprecise TSC costs at most a worker woken late or early. */
static inline uint64_t ticks(void)
{
#if defined(__x86_64__)
    return __rdtsc();
#else
    return (uint64_t)ferry_now();
#endif
}

static void ticks_calibrate(void)
{
#if defined(__x86_64__)
    int64_t t0 = ferry_now(), t1;
    uint64_t c0 = ticks(), c1;

    do
        t1 = ferry_now();
    while (t1 - t0 < FERRY_USEC(20));
    c1 = ticks();
    double per_ns = (double)(c1 - c0) / (double)(t1 - t0);

    qdelay_ticks = (uint64_t)(per_ns * (double)QDELAY_NS);
    svc_min_ticks = (uint64_t)(per_ns * (double)SVC_MIN_NS);
    check_ticks = (uint64_t)(per_ns * (double)CHECK_MIN_NS);
#else
    qdelay_ticks = QDELAY_NS;
    svc_min_ticks = SVC_MIN_NS;
    check_ticks = CHECK_MIN_NS;
#endif
}

/* ==== any thread ======================================================= */

static void pool_ref(struct ferry_pool *p)
{
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}

static void pool_unref(struct ferry_pool *p)
{
    if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->check);
    pthread_cond_destroy(&p->room);
    pthread_mutex_destroy(&p->mu);
    ferry__free(p->threads);
    ferry__free(p);
}

/* Append the nodes of the non-empty list `from` to the tail of `to` in
 * O(1); `from` is left as it was and must not be used as a list again. */
static void list_splice_tail(struct ferry__link *to, struct ferry__link *from)
{
    struct ferry__link *first = from->next, *last = from->prev;

    if (to->next == NULL)
        to->next = to->prev = to;     /* a {0} head: link the sentinel */
    first->prev = to->prev;
    to->prev->next = first;
    last->next = to;
    to->prev = last;
}

/*
 * `added` jobs were just queued behind others while a worker runs a job:
 * leave them to the workers already busy if the jobs are short (the
 * average run time below SVC_MIN_NS) and add up to less than QDELAY_NS.
 * A worker working through a queue of short jobs takes them in a moment,
 * and a second thread would only contend with it for the lock (each wake
 * also costs the loop a system call, and on a busy machine the woken
 * thread often preempts the loop itself).  Jobs queued behind nothing do
 * wake a thread: the running job may be a long one that the average does
 * not know about yet (a fetch after cache hits).  If the queue is stuck
 * behind long jobs all the same, the checker takes what waits: it watches
 * at CHECK_MIN_NS while jobs are in flight, and is woken here once if it
 * sleeps longer than that.  Requires mu.  (Jobs cannot be left here with
 * nobody to take them: a worker is running a job that is neither
 * abandoned nor blocked in a loop, and comes back to the queue when it
 * returns.)
 */
static bool enough_workers_locked(struct ferry_pool *p, size_t added)
{
    if (p->running <= p->nabandoned + p->nblocked ||   /* none that will come back soon */
        p->nqueued <= added ||                          /* they queue behind nothing */
        p->svc >= svc_min_ticks || p->svc * p->nqueued > qdelay_ticks)
        return false;
    if (p->check_ns > CHECK_MIN_NS) {
        /* Also when the duty is being handed on: the next checker starts
         * with the short timeout. */
        p->check_ns = CHECK_MIN_NS;
        if (p->checker)
            pthread_cond_signal(&p->check);
    }
    return true;
}

/* Wake a worker for `added` newly queued jobs: claim the spinner if there
 * is one (it takes them), else signal a sleeper not yet signalled, unless
 * the workers already busy will come to them soon enough (see
 * enough_workers_locked()).  Requires mu.  Returns true if a spinning
 * worker was claimed. */
static bool wake_worker_locked(struct ferry_pool *p, size_t added)
{
    if (p->spinner) {
        p->spinner = false;
        return true;
    }
    if (enough_workers_locked(p, added))
        return false;
    if (p->nidle > p->nwaking) {
        p->nwaking++;
        pthread_cond_signal(&p->work);
    } else if (p->checker && !p->check_kick) {
        p->check_kick = true;          /* no other sleeper: the checker takes it */
        pthread_cond_signal(&p->check);
    }
    return false;
}

/* Put a job at the tail of the queue (room checked by the caller).
 * Requires mu; wakes nobody. */
static void queue_locked(struct ferry_pool *p, struct job *j, uint64_t now)
{
    j->state = JOB_QUEUED;
    j->abandoned = false;
    j->over = false;
    j->enq = now;
    ferry__list_push_back(&p->queue, &j->link);
    p->nqueued++;
}

/* Publish the queue length for the spinner and the submitter's CPU. */
static void publish_locked(struct ferry_pool *p)
{
    int cpu = sched_getcpu();

    atomic_store_explicit(&p->qhint, p->nqueued, memory_order_relaxed);
    if (cpu != atomic_load_explicit(&p->sub_cpu, memory_order_relaxed))
        atomic_store_explicit(&p->sub_cpu, cpu, memory_order_relaxed);
}

/* A slot of the queue freed up: move waiting task jobs in, then wake one
 * thread and one task waiting for room if room is left.  Requires mu.  A
 * woken waiter that does not use the room passes the wake on by calling
 * this again. */
static void room_kick_locked(struct ferry_pool *p)
{
    struct ferry__link *l;

    while (p->nqueued < p->capacity && (l = ferry__list_pop_front(&p->overq)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        queue_locked(p, j, ticks());
    }
    if (p->nqueued >= p->capacity)
        return;
    if (p->room_threads)
        pthread_cond_signal(&p->room);
    if ((l = ferry__list_pop_front(&p->roomq)) != NULL) {
        struct room_waiter *rw = ferry__container_of(l, struct room_waiter, link);
        ferry__xwake_fire(&rw->xw, 0);
    }
}

/* Runs on the loop: the completion of a submitted job. */
static void submit_done_on_loop(struct ferry__cnode *n)
{
    struct job *j = ferry__container_of(n, struct job, sub.cn);
    struct ferry_pool *p = j->pool;
    int rc = j->sub.done ? j->sub.done(j->sub.done_arg, j->status) : 0;

    if (rc) {
        atomic_fetch_add(&p->callback_errors, 1);
        ferry__log(FERRY_LOG_WARN, "pool: a job's completion callback failed (%d); "
                   "later jobs are not affected", rc);
    }
    ferry__free(j);
    pool_unref(p);
}

/* Deliver a job's end (fn's status, or why it never ran).  No lock held.
 * After this the job may be gone (a task's stack frame). */
static void finish(struct job *j, int status)
{
    j->status = status;
    if (j->kind == KIND_TASK) {
        ferry__xwake_fire(&j->xw, status);
        return;
    }
    if (j->ib) {
        j->sub.cn.fn = submit_done_on_loop;
        ferry__inbox_complete_reserved(j->ib, &j->sub.cn);
        return;
    }
    {
        struct ferry_pool *p = j->pool;
        int rc = j->sub.done ? j->sub.done(j->sub.done_arg, status) : 0;
        if (rc) {
            atomic_fetch_add(&p->callback_errors, 1);
            ferry__log(FERRY_LOG_WARN, "pool: a job's completion callback failed (%d); "
                       "later jobs are not affected", rc);
        }
        ferry__free(j);
        pool_unref(p);
    }
}

/* Runs on the loop: take the sink's jobs and wake their tasks. */
static void sink_run(struct ferry__cnode *n)
{
    struct ferry_pool *p = ferry__container_of(n, struct ferry_pool, sink.cn);
    struct sink *s = &p->sink;
    struct ferry__link local, *l;
    struct job **v;
    size_t cnt;
    unsigned a;

    pthread_mutex_lock(&p->mu);
    a = s->fill;
    v = s->slot[a];
    cnt = s->n;
    s->taken[a] = true;
    s->fill = a ^ 1;
    s->n = 0;
    ferry__list_move(&local, &s->more);
    s->posted = false;
    if (p->lspin_ns < LSPIN_MAX_NS && ferry_now() - p->flush_ns < LSPIN_MAX_NS)
        p->lspin_ns = LSPIN_MAX_NS;           /* a wait would have paid */
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < cnt; i++) {
        struct job *j = v[i];

        /* The jobs ahead: the line a worker wrote (status) and the two
         * lines of the wake; nearer, the task each wake makes ready (its
         * pointer is in a line fetched four jobs ago). */
        if (i + 8 < cnt) {
            __builtin_prefetch(v[i + 8], 0);
            __builtin_prefetch(&v[i + 8]->xw.w, 1);
            __builtin_prefetch(&v[i + 8]->xw.delivered, 1);
        }
        if (i + 4 < cnt)
            __builtin_prefetch(v[i + 4]->xw.w.task, 1);
        ferry__xwake_deliver(&j->xw, j->status);   /* wakes the task now */
    }
    while ((l = ferry__list_pop_front(&local)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        ferry__xwake_deliver(&j->xw, j->status);
    }
    pthread_mutex_lock(&p->mu);
    s->taken[a] = false;
    pthread_mutex_unlock(&p->mu);
    pool_unref(p);
}

/*
 * Spinning.  An idle worker may poll the queue for a while before it
 * sleeps, so that a task resubmitting right after its completion costs no
 * futex wake.  At most one worker spins.  The budget adapts: a spin that
 * found work keeps it at SPIN_MAX_NS; one that timed out halves it (below
 * SPIN_MIN_NS it is 0: no spinning); a worker that sleeps and is woken
 * within SPIN_MAX_NS raises it back to the maximum (a spin would have paid).
 * A spinner gives up at once when it runs on the CPU of the last submitter
 * (a loop thread, usually): it would only delay the thread it waits for.
 * On one CPU nobody spins.
 */
#define SPIN_MAX_NS FERRY_USEC(50)
#define SPIN_MIN_NS FERRY_USEC(2)

enum { SPIN_WORK, SPIN_TIMEOUT, SPIN_CLASH };

/* Times a spinner on the submitter's CPU gives it the CPU before it sleeps. */
#define CLASH_YIELDS 2

static int spin_for_work(struct ferry_pool *p, int64_t budget, bool may_yield)
{
    int64_t end = ferry_now() + budget;
    unsigned yields = 0;
    bool clash = false;

    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&p->qhint, memory_order_relaxed))
            return SPIN_WORK;
        if ((i & 63) == 0 || clash) {
            int cpu = sched_getcpu();

            atomic_store_explicit(&p->spin_cpu, cpu, memory_order_relaxed);
            clash = cpu >= 0 && cpu == atomic_load_explicit(&p->sub_cpu, memory_order_relaxed);
            if (i && ferry_now() >= end)
                return clash ? SPIN_CLASH : SPIN_TIMEOUT;
            if (clash) {
                /* On the submitter's CPU polling would only keep it from
                 * running.  If it waited for our last completion (a round
                 * trip: `may_yield`), let it run: it resubmits and blocks
                 * in epoll, and we find the job without a futex wake.  A
                 * busy loop does not block soon: sleep, not to steal its
                 * CPU. */
                if (!may_yield || yields++ == CLASH_YIELDS)
                    return SPIN_CLASH;
                sched_yield();
                continue;
            }
        }
        ferry__cpu_relax();
    }
}


/*
 * Be the checker (see CHECK_MIN_NS) until woken for work, the pool stops,
 * or the job at the head of the queue is stuck; then hand the duty to a
 * sleeper.  Requires mu; returns with mu held, the caller looks at the
 * queue.
 */
static void check_locked(struct ferry_pool *p)
{
    p->checker = true;
    for (;;) {
        struct ferry__link *l = ferry__list_first(&p->queue);

        if (p->stopping || p->check_kick)
            break;
        if (l && ticks() - ferry__container_of(l, struct job, link)->enq > check_ticks) {
            p->stalled++;              /* stuck: the caller takes it */
            p->check_ns = CHECK_MIN_NS;
            break;
        }
        /* Longer sleeps only while nothing is in flight (see
         * enough_workers_locked()). */
        if (ferry__cond_wait_until(&p->check, &p->mu, ferry_now() + p->check_ns) == ETIMEDOUT &&
            p->check_ns < CHECK_MAX_NS && !p->running && !p->nqueued)
            p->check_ns *= 2;
    }
    if (p->check_kick)
        p->check_ns = CHECK_MIN_NS;
    p->checker = false;
    p->check_kick = false;
    if (!p->stopping && !p->appoint && p->nidle > p->nwaking) {
        p->appoint = true;
        p->nwaking++;
        pthread_cond_signal(&p->work);
    }
}

/* The queue is empty: spin (once per idle period) or sleep until a job
 * comes, as the checker if there is none.  Requires mu; returns with mu
 * held, maybe with a job queued. */
static void idle_locked(struct ferry_pool *p, bool *spun, bool waited_for)
{
    int64_t t0;

    if (!*spun && !p->spinner && p->spin_ns && p->multicpu) {
        int64_t budget = p->spin_ns;
        int r;

        p->spinner = true;
        pthread_mutex_unlock(&p->mu);
        r = spin_for_work(p, budget, waited_for);
        pthread_mutex_lock(&p->mu);
        p->spinner = false;
        *spun = true;
        if (r == SPIN_WORK)
            p->spin_ns = SPIN_MAX_NS;
        else if (r == SPIN_TIMEOUT && budget <= p->spin_ns)
            p->spin_ns = budget / 2 >= SPIN_MIN_NS ? budget / 2 : 0;
        return;
    }
    if (!p->checker && !p->appoint && !p->stopping) {
        check_locked(p);
        return;
    }
    t0 = ferry_now();
    p->nidle++;
    pthread_cond_wait(&p->work, &p->mu);
    p->nidle--;
    if (p->nwaking)
        p->nwaking--;
    if (p->appoint) {
        p->appoint = false;
        if (!p->checker && !p->stopping) {
            check_locked(p);
            return;
        }
    }
    if (p->spin_ns < SPIN_MAX_NS && ferry_now() - t0 < SPIN_MAX_NS)
        p->spin_ns = SPIN_MAX_NS;
}

/*
 * Book the end of job `j` (fn returned `status`).  Requires mu.  Returns
 * what the caller must do after unlocking: RET_NONE (it went on the sink,
 * already posted), RET_POST (it went on the sink: post the sink to *ib),
 * RET_FINISH (complete it the ordinary way), RET_CLEANUP (abandoned: run
 * the cleanup and free it).
 */
enum { RET_NONE, RET_POST, RET_FINISH, RET_CLEANUP };

static int book_locked(struct ferry_pool *p, struct job *j, int status,
                       struct ferry_inbox **ib)
{
    struct sink *s = &p->sink;

    p->running--;
    p->completed++;
    if (j->abandoned) {
        p->nabandoned--;
        return RET_CLEANUP;
    }
    j->state = JOB_FINISHED;
    j->status = status;
    if (j->kind != KIND_TASK)
        return RET_FINISH;
    if (!s->posted && !s->n && ferry__list_empty(&s->more))
        s->ib = j->ib;                        /* idle: serve this inbox */
    else if (s->ib != j->ib)
        return RET_FINISH;                    /* busy with another loop */
    if (s->n < SINK_SLOTS && !s->taken[s->fill])
        s->slot[s->fill][s->n++] = j;
    else
        ferry__list_push_back(&s->more, &j->link);
    if (s->posted)
        return RET_NONE;
    s->posted = true;
    *ib = s->ib;
    return RET_POST;
}

/* Carry out what book_locked() asked for.  No lock held. */
static void after_book(struct ferry_pool *p, struct job *j, int status, int what,
                       struct ferry_inbox *ib)
{
    switch (what) {
    case RET_POST:
        pool_ref(p);                          /* dropped by sink_run */
        p->sink.cn.fn = sink_run;
        ferry__inbox_complete(ib, &p->sink.cn);
        break;
    case RET_FINISH:
        finish(j, status);
        break;
    case RET_CLEANUP:
        if (j->cleanup)
            j->cleanup(j->arg, status);
        ferry__free(j);
        break;
    default:
        break;
    }
}

/*
 * A worker that took `j` while others sleep: should it wake one more?  Only
 * for jobs that take SVC_MIN_NS or more (the average of the last few), and
 * when the queued jobs add up to QDELAY_NS or `j` waited that long.
 * Requires mu.
 */
static bool more_workers_locked(struct ferry_pool *p, const struct job *j)
{
    if (!p->nqueued || p->spinner || p->nidle <= p->nwaking || p->svc < svc_min_ticks)
        return false;
    return p->svc * p->nqueued > qdelay_ticks || ticks() - j->enq > qdelay_ticks;
}

/*
 * A worker.  One lock acquisition per job: the one that takes the next job
 * also books the end of the previous one, whose completion is delivered
 * right after it (with no lock held), before the next job runs.
 */
static void *worker_main(void *arg)
{
    struct ferry_pool *p = arg;
    struct ferry_inbox *ib = NULL;
    struct ferry__link *l;
    struct job *j, *done = NULL;   /* finished, not yet booked */
    bool spun = false, waited_for = false;
    int status = 0, what = RET_NONE;
    uint64_t t0, took = 0;         /* done's run time */

    tls_pool = p;
    pthread_setname_np(pthread_self(), "ferry-pool");   /* for top, perf, gdb */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (done) {
            /* A moving average over the last 8 jobs or so. */
            p->svc = p->svc - (p->svc >> 3) + (took >> 3);
            what = book_locked(p, done, status, &ib);
            /* The first completion on an idle sink: a loop is waiting for
             * it, as in a round trip (see spin_for_work). */
            waited_for = what == RET_POST;
        }
        if ((l = ferry__list_pop_front(&p->queue)) == NULL) {
            if (done) {
                pthread_mutex_unlock(&p->mu);
                after_book(p, done, status, what, ib);
                done = NULL;
                pthread_mutex_lock(&p->mu);
                continue;
            }
            if (p->stopping)
                break;
            idle_locked(p, &spun, waited_for);
            continue;
        }
        spun = false;
        j = ferry__container_of(l, struct job, link);
        p->nqueued--;
        p->running++;
        j->state = JOB_RUNNING;
        atomic_store_explicit(&p->qhint, p->nqueued, memory_order_relaxed);
        if (!ferry__list_empty(&p->overq) || p->room_threads || !ferry__list_empty(&p->roomq))
            room_kick_locked(p);
        if (more_workers_locked(p, j)) {
            p->nwaking++;
            pthread_cond_signal(&p->work);
        }
        pthread_mutex_unlock(&p->mu);
        if (done) {
            after_book(p, done, status, what, ib);
            done = NULL;
        }

        t0 = ticks();
        status = j->fn(j->arg);
        took = ticks() - t0;
        done = j;

        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    tls_pool = NULL;
    return NULL;
}

static unsigned default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned dflt = n > 4 ? (unsigned)n : 4;

    return ferry__env_unsigned("FERRY_POOL_SIZE", dflt);
}

/* Stop and join the first `n` threads of a pool being torn down. */
static void stop_threads(struct ferry_pool *p, unsigned n)
{
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->check);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < n; i++)
        pthread_join(p->threads[i], NULL);
}

/*
 * The pool's mutex.  Its holders keep it for a few dozen instructions, a
 * worker once per job and a loop once per batch, so on more than one CPU
 * it spins briefly before it sleeps (glibc's adaptive type): a plain mutex
 * sleeps at the first contention, and the unlock then pays a futex wake
 * (offload_throughput made about a thousand of each per 100,000 jobs).
 */
static int pool_mutex_init(pthread_mutex_t *mu, bool spin)
{
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_t a;
    int rc;

    if (spin) {
        if (pthread_mutexattr_init(&a))
            return -1;
        rc = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
        if (rc == 0)
            rc = pthread_mutex_init(mu, &a);
        pthread_mutexattr_destroy(&a);
        return rc;
    }
#else
    (void)spin;
#endif
    return pthread_mutex_init(mu, NULL);
}

int ferry_pool_new(ferry_pool **out, const ferry_pool_opts *opts)
{
    ferry_pool_opts o = {0};
    struct ferry_pool *p;
    pthread_attr_t attr;
    unsigned i;
    int rc = -ENOMEM;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (opts)
        o = *opts;
    if (o.threads > 4096)
        return -EINVAL;
    pthread_once(&ticks_once, ticks_calibrate);
    p = ferry__calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->nthreads = o.threads ? o.threads : default_threads();
    p->capacity = o.capacity ? o.capacity : 4096;
    p->spin_ns = SPIN_MAX_NS;
    p->lspin_ns = LSPIN_MAX_NS;
    p->svc = qdelay_ticks;             /* slow until measured: spread out */
    p->check_ns = CHECK_MIN_NS;
    p->multicpu = sysconf(_SC_NPROCESSORS_ONLN) > 1;
    atomic_init(&p->refs, 1);
    atomic_init(&p->callback_errors, 0);
    atomic_init(&p->qhint, 0);
    atomic_init(&p->sub_cpu, -1);
    atomic_init(&p->spin_cpu, -1);
    p->threads = ferry__calloc(p->nthreads, sizeof *p->threads);
    if (!p->threads)
        goto err_free;
    if (pool_mutex_init(&p->mu, p->multicpu))
        goto err_free;
    if (ferry__cond_init(&p->room))
        goto err_mutex;
    if (pthread_cond_init(&p->work, NULL))
        goto err_room;
    if (ferry__cond_init(&p->check))
        goto err_work;
    if (pthread_attr_init(&attr))
        goto err_check;
    if (o.stack_size && pthread_attr_setstacksize(&attr, o.stack_size)) {
        rc = -EINVAL;
        goto err_attr;
    }
    for (i = 0; i < p->nthreads; i++) {
        if (ferry__fault_point("pthread_create") ||
            ferry__thread_create_nosig(&p->threads[i], &attr, worker_main, p) != 0) {
            stop_threads(p, i);
            goto err_attr;
        }
    }
    pthread_attr_destroy(&attr);
    *out = p;
    return 0;

err_attr:
    pthread_attr_destroy(&attr);
err_check:
    pthread_cond_destroy(&p->check);
err_work:
    pthread_cond_destroy(&p->work);
err_room:
    pthread_cond_destroy(&p->room);
err_mutex:
    pthread_mutex_destroy(&p->mu);
err_free:
    ferry__free(p->threads);
    ferry__free(p);
    return rc;
}

/* Take every job out of the queue and the overflow list, to be completed
 * with `status` (never run; the overflow ones with -ESHUTDOWN: they were
 * never queued).  Requires mu.  Returns how many. */
static size_t drop_queued_locked(struct ferry_pool *p, struct ferry__link *dropped, int status)
{
    struct ferry__link *l;
    size_t n = 0;

    while ((l = ferry__list_pop_front(&p->queue)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        p->nqueued--;
        p->cancelled++;
        j->state = JOB_FINISHED;
        j->dropped = true;
        j->status = status;
        ferry__list_push_back(dropped, &j->link);
        n++;
    }
    while ((l = ferry__list_pop_front(&p->overq)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        j->state = JOB_FINISHED;
        j->dropped = true;
        j->status = status == -ECANCELED ? -ESHUTDOWN : status;
        ferry__list_push_back(dropped, &j->link);
        n++;
    }
    atomic_store_explicit(&p->qhint, 0, memory_order_relaxed);
    return n;
}

void ferry_pool_free(ferry_pool *p)
{
    struct ferry__link dropped = {0}, *l;

    if (!p || p == atomic_load(&default_pool) || p == tls_pool)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    /* Queued jobs never run: each is completed with -ECANCELED. */
    drop_queued_locked(p, &dropped, -ECANCELED);
    /* Tasks waiting for room: refused. */
    while ((l = ferry__list_pop_front(&p->roomq)) != NULL) {
        struct room_waiter *rw = ferry__container_of(l, struct room_waiter, link);
        ferry__xwake_fire(&rw->xw, -ESHUTDOWN);
    }
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->check);
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->mu);
    while ((l = ferry__list_pop_front(&dropped)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        finish(j, j->status);
    }
    /* Running jobs (abandoned ones too) end; then the threads exit.  A
     * posted sink keeps the memory until its loop has run it. */
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pool_unref(p);
}

ferry_pool *ferry_pool_default(void)
{
    struct ferry_pool *p = atomic_load_explicit(&default_pool, memory_order_acquire);

    if (p)
        return p;
    pthread_mutex_lock(&default_mu);
    p = atomic_load_explicit(&default_pool, memory_order_relaxed);
    if (!p && ferry_pool_new(&p, NULL) == 0) {
        /* Never freed: its two allocations (the pool and its thread array,
         * which pool_unref() would free) belong to the process. */
        ferry__alloc_resident(2);
        atomic_store_explicit(&default_pool, p, memory_order_release);
    }
    pthread_mutex_unlock(&default_mu);
    return p;
}

int ferry_pool_stats_get(ferry_pool *p, ferry_pool_stats *out)
{
    if (!out)
        return -EINVAL;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    pthread_mutex_lock(&p->mu);
    out->threads = p->nthreads;
    out->capacity = p->capacity;
    out->queued = p->nqueued;
    out->running = p->running;
    out->abandoned = p->nabandoned;
    out->completed = p->completed;
    out->cancelled = p->cancelled;
    out->stalled = p->stalled;
    pthread_mutex_unlock(&p->mu);
    out->callback_errors = atomic_load(&p->callback_errors);
    return 0;
}

/* Queue one job and wake a worker for it.  Requires mu; checked for room
 * and state by the caller. */
static void enqueue_locked(struct ferry_pool *p, struct job *j)
{
    queue_locked(p, j, ticks());
    publish_locked(p);
    wake_worker_locked(p, 1);
}

/* Requires mu: why a job could not be queued now, or 0. */
static int refuse_locked(struct ferry_pool *p)
{
    if (p->stopping)
        return -ESHUTDOWN;
    if (p->nblocked >= p->nthreads)
        return -EDEADLK;
    return 0;
}

int ferry_pool_submit(ferry_pool *p, ferry_job_fn fn, void *arg,
                      ferry_loop *loop, ferry_job_done done, void *done_arg)
{
    struct ferry_inbox *ib = NULL;
    struct job *j;
    int rc;

    if (!fn)
        return -EINVAL;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    if (loop && !(ib = ferry__inbox_of(loop)))
        return -ESHUTDOWN;
    j = ferry__calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    j->kind = KIND_SUBMIT;
    j->heap = true;
    j->fn = fn;
    j->arg = arg;
    j->ib = ib;
    j->sub.done = done;
    j->sub.done_arg = done_arg;
    j->pool = p;
    if (ib && (rc = ferry__inbox_reserve(ib)) != 0) {
        ferry__free(j);
        return rc;
    }
    pool_ref(p);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        rc = refuse_locked(p);
        if (rc || (p->nqueued < p->capacity && ferry__list_empty(&p->overq)))
            break;
        if (ferry_loop_current()) {
            rc = -EAGAIN;    /* blocking would stall a loop */
            break;
        }
        p->room_threads++;
        pthread_cond_wait(&p->room, &p->mu);
        p->room_threads--;
    }
    if (!rc)
        enqueue_locked(p, j);
    else if (p->nqueued < p->capacity && p->room_threads)
        pthread_cond_signal(&p->room);   /* pass a wake we may have taken on */
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        if (ib)
            ferry__inbox_unreserve(ib);
        ferry__free(j);
        pool_unref(p);
    }
    return rc;
}

/* ==== loop thread (tasks) ============================================== */

/* The loop's list of jobs to hand over, in its inbox's extension room. */
static inline struct ferry__subq *subq_of(struct ferry_inbox *ib)
{
    return ferry__inbox_ext(ib);
}

/* give_up for the loop's wait: the job has not been taken in time. */
static bool job_not_taken(void *arg, int64_t waited)
{
    struct ferry_pool *p = arg;

    return waited >= LSPIN_TAKE_NS && atomic_load_explicit(&p->qhint, memory_order_relaxed);
}

/* A turn that offloads this many jobs hands them over at once, not at its
 * end: a worker that ran out of jobs meanwhile would go to sleep, and
 * waking it costs more than the lock taken here. */
#define SUBQ_BATCH 64

/*
 * Hand the jobs that tasks of this loop offloaded during the last turn to
 * their pools: one lock and one wake decision per run of jobs for the same
 * pool.  A job that cannot be queued (pool stopping, every thread blocked)
 * completes at once with the reason; one that finds the queue full waits
 * for room in `overq`.  Then, if a spinning worker took the jobs and the
 * loop has nothing else to do, wait for the completion here (see
 * LSPIN_MAX_NS) if `may_wait`.  subq_flush() runs it as a callback of the
 * loop after the turn; defer_job() in the middle of a turn that offloads
 * SUBQ_BATCH jobs (may_wait false: a task is running).
 */
static void subq_handover(struct ferry_inbox *ib, bool may_wait)
{
    struct ferry__subq *q = subq_of(ib);
    struct ferry__link local, failed = {0}, *l;
    struct ferry_pool *spin_pool = NULL, *one = q->pool;
    int64_t budget = 0;
    size_t n = q->n;

    if (!n)
        return;
    q->gen++;                     /* nothing on the list is pending any more */
    ferry__list_move(&local, &q->jobs);
    q->pool = NULL;
    q->n = 0;
    l = NULL;
    if (one && n) {
        /* The common case: every job for one pool, room for all.  The jobs
         * were made QUEUED when they were put on the list; hand the list
         * over whole, without touching them again. */
        pthread_mutex_lock(&one->mu);
        if (!refuse_locked(one) && one->capacity - one->nqueued >= n &&
            one->nqueued <= one->capacity && ferry__list_empty(&one->overq)) {
            list_splice_tail(&one->queue, &local);
            one->nqueued += n;
            publish_locked(one);
            one->flush_ns = ferry_now();
            if (wake_worker_locked(one, n) && one->lspin_ns && one->multicpu &&
                atomic_load_explicit(&one->spin_cpu, memory_order_relaxed) != sched_getcpu()) {
                spin_pool = one;
                budget = one->lspin_ns;
            }
        } else {
            l = ferry__list_pop_front(&local);
        }
        pthread_mutex_unlock(&one->mu);
    } else {
        l = ferry__list_pop_front(&local);
    }
    /* Otherwise one job at a time, one lock per run of jobs for a pool. */
    while (l) {
        struct job *j = ferry__container_of(l, struct job, link);
        struct ferry_pool *p = j->pool;
        size_t added = 0;

        pthread_mutex_lock(&p->mu);
        do {
            int rc = refuse_locked(p);

            if (rc) {
                j->state = JOB_FINISHED;
                j->status = rc;
                ferry__list_push_back(&failed, &j->link);
            } else if (p->nqueued < p->capacity && ferry__list_empty(&p->overq)) {
                queue_locked(p, j, j->enq);
                added++;
            } else {
                j->state = JOB_QUEUED;
                j->over = true;
                ferry__list_push_back(&p->overq, &j->link);
            }
            l = ferry__list_pop_front(&local);
            j = l ? ferry__container_of(l, struct job, link) : NULL;
        } while (j && j->pool == p);
        if (added) {
            publish_locked(p);
            p->flush_ns = ferry_now();
            if (wake_worker_locked(p, added) && p->lspin_ns && p->multicpu &&
                atomic_load_explicit(&p->spin_cpu, memory_order_relaxed) != sched_getcpu()) {
                spin_pool = p;
                budget = p->lspin_ns;
            }
        }
        pthread_mutex_unlock(&p->mu);
    }
    while ((l = ferry__list_pop_front(&failed)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        ferry__xwake_fire(&j->xw, j->status);   /* on the loop: wakes the task now */
    }
    if (spin_pool && may_wait && ferry__inbox_loop_idle(ib, budget)) {
        int r = ferry__inbox_spin(ib, budget, job_not_taken, spin_pool);

        pthread_mutex_lock(&spin_pool->mu);
        if (r == FERRY__SPIN_KICKED)
            spin_pool->lspin_ns = LSPIN_MAX_NS;
        else if (r == FERRY__SPIN_TIMEOUT && budget <= spin_pool->lspin_ns)
            spin_pool->lspin_ns = budget / 2 >= LSPIN_MIN_NS ? budget / 2 : 0;
        pthread_mutex_unlock(&spin_pool->mu);
    }
}

static void subq_flush(void *arg)
{
    struct ferry_inbox *ib = arg;

    subq_of(ib)->scheduled = false;
    subq_handover(ib, true);
}

/* The flush callback stays scheduled: it finds the list empty, or hands
 * over what later turns add to it. */
void ferry__pool_handover(void *ctx)
{
    subq_handover(ctx, false);
}

/* True while a task's job is on its loop's list.  Thread: loop. */
static bool job_pending(const struct job *j)
{
    return j->gen && j->gen == subq_of(j->xw.ib)->gen + 1;
}

/* Put a task's job on its loop's list for the flush after this turn, made
 * QUEUED already (the flush may hand the list over without touching it).
 * Returns 0, or -ENOMEM if the flush could not be scheduled (nothing
 * done: the caller queues the job itself). */
static int defer_job(struct ferry_pool *p, struct job *j)
{
    struct ferry__subq *q = subq_of(j->xw.ib);

    if (!q->scheduled) {
        if (ferry_call_soon(ferry__inbox_loop(j->xw.ib), subq_flush, j->xw.ib) != 0)
            return -ENOMEM;
        q->scheduled = true;
        q->t = ticks();
    }
    if (!q->n)
        q->pool = p;
    else if (q->pool != p)
        q->pool = NULL;
    q->n++;
    j->pool = p;
    j->gen = q->gen + 1;
    j->state = JOB_QUEUED;
    j->abandoned = false;
    j->over = false;
    j->enq = q->t;
    ferry__list_push_back(&q->jobs, &j->link);
    if (q->n >= SUBQ_BATCH)
        subq_handover(j->xw.ib, false);   /* keep the workers fed during a long turn */
    return 0;
}

/* Wait in a task until the queue has room.  Requires mu; returns with mu
 * held.  Returns 0 (room now) or why not.  Only the fallback path (the
 * flush could not be scheduled) comes here. */
static int wait_room_locked(struct ferry_pool *p)
{
    struct room_waiter rw;
    bool fired;
    int rc;

    for (;;) {
        rc = refuse_locked(p);
        if (rc || (p->nqueued < p->capacity && ferry__list_empty(&p->overq)))
            return rc;
        rc = ferry__xwake_init(&rw.xw, "pool room", p);
        if (rc)
            return rc;
        ferry__link_init(&rw.link);
        ferry__list_push_back(&p->roomq, &rw.link);
        pthread_mutex_unlock(&p->mu);
        rc = ferry__xwake_wait(&rw.xw);
        pthread_mutex_lock(&p->mu);
        fired = !ferry__link_linked(&rw.link);
        if (!fired) {
            ferry__list_remove(&rw.link);
        } else if (!rw.xw.delivered) {
            pthread_mutex_unlock(&p->mu);
            ferry__xwake_settle(&rw.xw);
            pthread_mutex_lock(&p->mu);
        }
        if (rc == -ECANCELED || rc == -ETIMEDOUT) {
            if (fired && p->nqueued < p->capacity)
                room_kick_locked(p);   /* pass the unused wake on */
            return rc;
        }
    }
}

/* The job could not go on the loop's list (no flush could be scheduled):
 * queue it now, waiting for room here if need be.  Out of line, as
 * offload_interrupted(): the hot path's frame holds only the job. */
static __attribute__((noinline)) int offload_direct(struct ferry_pool *p, struct job *j)
{
    int rc;

    pthread_mutex_lock(&p->mu);
    rc = wait_room_locked(p);
    if (!rc)
        enqueue_locked(p, j);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The task was interrupted (cancelled, or a deadline passed) with status
 * `rc` while its job was somewhere between the loop's list and its
 * completion: take the job back if it has not started, else abandon it
 * (heap job) or wait for it. */
static __attribute__((noinline)) int offload_interrupted(struct ferry_pool *p, struct job *j,
                                                         int rc, bool *abandoned)
{
    if (job_pending(j)) {
        /* Still on this loop's list: never handed over. */
        ferry__list_remove(&j->link);
        subq_of(j->xw.ib)->n--;
        j->gen = 0;
        pthread_mutex_lock(&p->mu);
        p->cancelled++;
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    if (j->state == JOB_QUEUED) {
        ferry__list_remove(&j->link);
        if (j->over) {
            j->over = false;
        } else {
            p->nqueued--;
            atomic_store_explicit(&p->qhint, p->nqueued, memory_order_relaxed);
            room_kick_locked(p);
        }
        p->cancelled++;
        pthread_mutex_unlock(&p->mu);
        return rc;                    /* never ran */
    }
    if (j->state == JOB_RUNNING && j->heap) {
        j->abandoned = true;
        *abandoned = true;
        p->nabandoned++;
        pthread_mutex_unlock(&p->mu);
        return rc;                    /* the worker cleans up and frees j */
    }
    pthread_mutex_unlock(&p->mu);
    ferry__xwake_settle(&j->xw);      /* running (waited for) or finished */
    return j->xw.result;
}

static int offload(struct ferry_pool *p, struct job *j, struct ferry_task *self,
                   bool *abandoned)
{
    int rc;

    *abandoned = false;
    rc = ferry__xwake_init_self(&j->xw, self, "to_thread", p);
    if (rc)
        return rc;
    j->ib = j->xw.ib;
    ferry__link_init(&j->link);
    j->pool = p;
    if (defer_job(p, j) != 0 && (rc = offload_direct(p, j)) != 0)
        return rc;
    rc = ferry__xwake_wait(&j->xw);
    if (j->xw.delivered)
        return j->xw.result;          /* fn's status, or why it never ran */
    return offload_interrupted(p, j, rc, abandoned);
}

/* Fill in a task's job (not its wake, which offload() sets up).  Field by
 * field: zeroing the whole struct cost a fifth of a round trip's time on
 * the loop thread. */
static void job_init_task(struct job *j, ferry_job_fn fn, void *arg, bool heap,
                          ferry_job_cleanup cleanup)
{
    j->fn = fn;
    j->arg = arg;
    j->kind = KIND_TASK;
    j->state = 0;
    j->status = 0;
    j->heap = heap;
    j->abandoned = false;
    j->over = false;
    j->gen = 0;
    j->enq = 0;
    j->cleanup = cleanup;
    j->ib = NULL;
    j->pool = NULL;
}

int ferry_to_thread(ferry_pool *p, ferry_job_fn fn, void *arg)
{
    struct ferry_task *self;
    _Alignas(64) struct job j;
    bool abandoned;
    int rc;

    if (!fn)
        return -EINVAL;
    if (ferry__enter_task(&self))
        return -EPERM;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    job_init_task(&j, fn, arg, false, NULL);
    pool_ref(p);
    rc = offload(p, &j, self, &abandoned);
    pool_unref(p);
    return rc;
}

int ferry_to_thread_abandon(ferry_pool *p, ferry_job_fn fn, void *arg,
                            ferry_job_cleanup cleanup)
{
    struct ferry_task *self;
    struct job *j;
    bool abandoned;
    int rc;

    if (!fn)
        return -EINVAL;
    if (ferry__enter_task(&self))
        return -EPERM;
    if (!p && !(p = ferry_pool_default()))
        return -ENOMEM;
    j = ferry__malloc(sizeof *j);
    if (!j)
        return -ENOMEM;
    job_init_task(j, fn, arg, true, cleanup);
    j->dropped = false;
    pool_ref(p);
    rc = offload(p, j, self, &abandoned);
    /* Interrupted before fn started (still pending or queued), or dropped
     * from the queue by ferry_pool_free(): fn never runs, so the cleanup
     * gets arg now.  After -ECANCELED or -ETIMEDOUT the caller thus never
     * owns arg again, whether fn ran or not. */
    if (!abandoned && (rc == -ECANCELED || rc == -ETIMEDOUT) && cleanup &&
        (j->dropped || (j->state != JOB_RUNNING && j->state != JOB_FINISHED)))
        cleanup(arg, rc);
    if (!abandoned)
        ferry__free(j);
    pool_unref(p);
    return rc;
}

/* ==== pool threads calling into loops ================================== */

void ferry__pool_block_enter(void)
{
    struct ferry_pool *p = tls_pool;
    struct ferry__link dropped = {0}, *l;
    size_t stuck = 0;

    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->nblocked++;
    if (p->nblocked >= p->nthreads) {
        /* No thread is left to start a queued job until a loop call
         * returns, and that call may be waiting for one of them (Trio
         * #810): fail them with a clear error instead of hanging. */
        stuck = drop_queued_locked(p, &dropped, -EDEADLK);
        if (stuck)
            room_kick_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
    while ((l = ferry__list_pop_front(&dropped)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        finish(j, j->status);
    }
    if (stuck)
        ferry__log(FERRY_LOG_WARN, "pool: all %u threads wait on a loop; %zu queued "
                   "job(s) failed with -EDEADLK", p->nthreads, stuck);
}

void ferry__pool_block_exit(void)
{
    struct ferry_pool *p = tls_pool;

    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->nblocked--;
    pthread_mutex_unlock(&p->mu);
}
