/* pool_worker.c - the workers of a pool, and when to wake one: the clock
 * that measures jobs, the spinner, the checker; pool threads that call
 * into loops.
 * Pool threads, and under the pool's mutex whoever queues jobs.
 *
 * pool_int.h has the map of the pool's files and the rules they share.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "fuzz.h"
#include "pool_int.h"

_Thread_local struct ferry_pool *ferry__pool_tls;

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

static uint64_t qdelay_ticks;  /* QDELAY_NS in ferry__pool_ticks(); set once */
static uint64_t svc_min_ticks; /* SVC_MIN_NS in ferry__pool_ticks(); set once */
static uint64_t check_ticks;   /* CHECK_MIN_NS in ferry__pool_ticks(); set once */
static pthread_once_t ticks_once = PTHREAD_ONCE_INIT;

static void ticks_calibrate(void)
{
#if defined(__x86_64__)
    int64_t t0 = ferry__now_real(), t1;
    uint64_t c0 = ferry__pool_ticks(), c1;

    do
        t1 = ferry__now_real();
    while (t1 - t0 < FERRY_USEC(20));
    c1 = ferry__pool_ticks();
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
    if (p->running <= p->nabandoned + p->nblocked || /* none that will come back soon */
        p->nqueued <= added ||                       /* they queue behind nothing */
        p->wake.svc >= svc_min_ticks || p->wake.svc * p->nqueued > qdelay_ticks)
        return false;
    if (p->wake.check_ns > CHECK_MIN_NS) {
        /* Also when the duty is being handed on: the next checker starts
         * with the short timeout. */
        p->wake.check_ns = CHECK_MIN_NS;
        if (p->wake.checker)
            pthread_cond_signal(&p->check);
    }
    return true;
}

/* Wake a worker for `added` newly queued jobs: claim the spinner if there
 * is one (it takes them), else signal a sleeper not yet signalled, unless
 * the workers already busy will come to them soon enough (see
 * enough_workers_locked()).  Requires mu.  Returns true if a spinning
 * worker was claimed. */
bool ferry__pool_wake_locked(struct ferry_pool *p, size_t added)
{
    if (p->wake.spinner) {
        p->wake.spinner = false;
        return true;
    }
    if (enough_workers_locked(p, added))
        return false;
    if (p->wake.nidle > p->wake.nwaking) {
        p->wake.nwaking++;
        pthread_cond_signal(&p->work);
    } else if (p->wake.checker && !p->wake.check_kick) {
        p->wake.check_kick = true; /* no other sleeper: the checker takes it */
        pthread_cond_signal(&p->check);
    }
    return false;
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

void ferry__pool_policy_init(struct ferry_pool *p)
{
    struct ferry__pool_wake *w = &p->wake;

    pthread_once(&ticks_once, ticks_calibrate);
    w->multicpu = sysconf(_SC_NPROCESSORS_ONLN) > 1;
    w->spin_ns = SPIN_MAX_NS;
    w->lspin_ns = LSPIN_MAX_NS;
    w->svc = qdelay_ticks; /* slow until measured: spread out */
    w->check_ns = CHECK_MIN_NS;
    atomic_init(&w->qhint, 0);
    atomic_init(&w->sub_cpu, -1);
    atomic_init(&w->spin_cpu, -1);
}

void ferry__pool_publish_locked(struct ferry_pool *p)
{
    int cpu = sched_getcpu();

    atomic_store_explicit(&p->wake.qhint, p->nqueued, memory_order_relaxed);
    if (cpu != atomic_load_explicit(&p->wake.sub_cpu, memory_order_relaxed))
        atomic_store_explicit(&p->wake.sub_cpu, cpu, memory_order_relaxed);
}

void ferry__pool_unqueued_locked(struct ferry_pool *p)
{
    atomic_store_explicit(&p->wake.qhint, p->nqueued, memory_order_relaxed);
}

int64_t ferry__pool_flushed_locked(struct ferry_pool *p, size_t added)
{
    ferry__pool_publish_locked(p);
    p->wake.flush_ns = ferry__now_real();
    /* The loop polls only for a spinner that took the jobs, and not on
     * the CPU that spinner runs on. */
    if (ferry__pool_wake_locked(p, added) && p->wake.lspin_ns && p->wake.multicpu &&
        atomic_load_explicit(&p->wake.spin_cpu, memory_order_relaxed) != sched_getcpu())
        return p->wake.lspin_ns;
    return 0;
}

void ferry__pool_loop_spun(struct ferry_pool *p, int r, int64_t budget)
{
    pthread_mutex_lock(&p->mu);
    if (r == FERRY__SPIN_KICKED)
        p->wake.lspin_ns = LSPIN_MAX_NS;
    else if (r == FERRY__SPIN_TIMEOUT && budget <= p->wake.lspin_ns)
        p->wake.lspin_ns = budget / 2 >= LSPIN_MIN_NS ? budget / 2 : 0;
    pthread_mutex_unlock(&p->mu);
}

void ferry__pool_completions_taken_locked(struct ferry_pool *p)
{
    if (p->wake.lspin_ns < LSPIN_MAX_NS && ferry__now_real() - p->wake.flush_ns < LSPIN_MAX_NS)
        p->wake.lspin_ns = LSPIN_MAX_NS; /* a wait would have paid */
}

static int spin_for_work(struct ferry_pool *p, int64_t budget, bool may_yield)
{
    int64_t end = ferry__now_real() + budget;
    unsigned yields = 0;
    bool clash = false;

    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&p->wake.qhint, memory_order_relaxed))
            return SPIN_WORK;
        if ((i & 63) == 0 || clash) {
            int cpu = sched_getcpu();

            atomic_store_explicit(&p->wake.spin_cpu, cpu, memory_order_relaxed);
            clash = cpu >= 0 && cpu == atomic_load_explicit(&p->wake.sub_cpu, memory_order_relaxed);
            if (i && ferry__now_real() >= end)
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
    p->wake.checker = true;
    for (;;) {
        struct ferry__link *l = ferry__list_first(&p->queue);

        if (p->stopping || p->wake.check_kick)
            break;
        if (l &&
            ferry__pool_ticks() - ferry__container_of(l, struct job, link)->enq > check_ticks) {
            p->stalled++; /* stuck: the caller takes it */
            p->wake.check_ns = CHECK_MIN_NS;
            break;
        }
        /* Longer sleeps only while nothing is in flight (see
         * enough_workers_locked()). */
        if (ferry__cond_wait_until(&p->check, &p->mu, ferry__now_real() + p->wake.check_ns) ==
                ETIMEDOUT &&
            p->wake.check_ns < CHECK_MAX_NS && !p->running && !p->nqueued)
            p->wake.check_ns *= 2;
    }
    if (p->wake.check_kick)
        p->wake.check_ns = CHECK_MIN_NS;
    p->wake.checker = false;
    p->wake.check_kick = false;
    if (!p->stopping && !p->wake.appoint && p->wake.nidle > p->wake.nwaking) {
        p->wake.appoint = true;
        p->wake.nwaking++;
        pthread_cond_signal(&p->work);
    }
}

/* The queue is empty: spin (once per idle period) or sleep until a job
 * comes, as the checker if there is none.  Requires mu; returns with mu
 * held, maybe with a job queued. */
static void idle_locked(struct ferry_pool *p, bool *spun, bool waited_for)
{
    int64_t t0;

    if (!*spun && !p->wake.spinner && p->wake.spin_ns && p->wake.multicpu) {
        int64_t budget = p->wake.spin_ns;
        int r;

        p->wake.spinner = true;
        pthread_mutex_unlock(&p->mu);
        r = spin_for_work(p, budget, waited_for);
        pthread_mutex_lock(&p->mu);
        p->wake.spinner = false;
        *spun = true;
        if (r == SPIN_WORK)
            p->wake.spin_ns = SPIN_MAX_NS;
        else if (r == SPIN_TIMEOUT && budget <= p->wake.spin_ns)
            p->wake.spin_ns = budget / 2 >= SPIN_MIN_NS ? budget / 2 : 0;
        return;
    }
    if (!p->wake.checker && !p->wake.appoint && !p->stopping) {
        check_locked(p);
        return;
    }
    t0 = ferry__now_real();
    p->wake.nidle++;
    pthread_cond_wait(&p->work, &p->mu);
    p->wake.nidle--;
    if (p->wake.nwaking)
        p->wake.nwaking--;
    if (p->wake.appoint) {
        p->wake.appoint = false;
        if (!p->wake.checker && !p->stopping) {
            check_locked(p);
            return;
        }
    }
    if (p->wake.spin_ns < SPIN_MAX_NS && ferry__now_real() - t0 < SPIN_MAX_NS)
        p->wake.spin_ns = SPIN_MAX_NS;
}

/*
 * A worker that took `j` while others sleep: should it wake one more?  Only
 * for jobs that take SVC_MIN_NS or more (the average of the last few), and
 * when the queued jobs add up to QDELAY_NS or `j` waited that long.
 * Requires mu.
 */
static bool more_workers_locked(struct ferry_pool *p, const struct job *j)
{
    if (!p->nqueued || p->wake.spinner || p->wake.nidle <= p->wake.nwaking ||
        p->wake.svc < svc_min_ticks)
        return false;
    return p->wake.svc * p->nqueued > qdelay_ticks || ferry__pool_ticks() - j->enq > qdelay_ticks;
}

/*
 * A worker.  One lock acquisition per job: the one that takes the next job
 * also books the end of the previous one, whose completion is delivered
 * right after it (with no lock held), before the next job runs.
 */
void *ferry__pool_worker_main(void *arg)
{
    struct ferry_pool *p = arg;
    struct ferry_inbox *ib = NULL;
    struct ferry__link *l;
    struct job *j, *done = NULL; /* finished, not yet booked */
    bool spun = false, waited_for = false, leave;
    int status = 0, what = RET_NONE;
    uint64_t t0, took = 0; /* done's run time */

    ferry__pool_tls = p;
    pthread_setname_np(pthread_self(), "ferry-pool"); /* for top, perf, gdb */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (done) {
            /* A moving average over the last 8 jobs or so. */
            p->wake.svc = p->wake.svc - (p->wake.svc >> 3) + (took >> 3);
            what = ferry__pool_book_locked(p, done, status, &ib);
            /* The first completion on an idle sink: a loop is waiting for
             * it, as in a round trip (see spin_for_work). */
            waited_for = what == RET_POST;
        }
        if ((l = ferry__list_pop_front(&p->queue)) == NULL) {
            if (done) {
                pthread_mutex_unlock(&p->mu);
                ferry__pool_after_book(p, done, status, what, ib);
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
        atomic_store_explicit(&p->wake.qhint, p->nqueued, memory_order_relaxed);
        if (!ferry__list_empty(&p->overq) || p->room_threads || !ferry__list_empty(&p->roomq))
            ferry__pool_room_kick_locked(p);
        if (more_workers_locked(p, j)) {
            p->wake.nwaking++;
            pthread_cond_signal(&p->work);
        }
        pthread_mutex_unlock(&p->mu);
        if (done) {
            ferry__pool_after_book(p, done, status, what, ib);
            done = NULL;
        }

        /* Schedule fuzzing: a job may start late, and its completion
         * reach its loop late. */
        ferry__fuzz_delay();
        t0 = ferry__pool_ticks();
        status = j->fn(j->arg);
        took = ferry__pool_ticks() - t0;
        done = j;
        ferry__fuzz_delay();

        pthread_mutex_lock(&p->mu);
    }
    p->alive--;
    leave = p->released;
    if (p->leave && !leave) {
        /* The free waits for us and joins us. */
        for (unsigned i = 0; i < p->nthreads; i++)
            if (pthread_equal(p->threads[i], pthread_self()))
                p->exited[i] = true;
        pthread_cond_broadcast(&p->gone);
    }
    pthread_mutex_unlock(&p->mu);
    ferry__pool_tls = NULL;
    if (leave) {
        /* Nobody joins this thread: it goes away on its own, and its
         * reference was the last thing it held. */
        pthread_detach(pthread_self());
        ferry__pool_unref(p);
    }
    return NULL;
}

/* ==== pool threads calling into loops ================================== */

void ferry__pool_block_enter(void)
{
    struct ferry_pool *p = ferry__pool_tls;
    struct ferry__link dropped = { 0 }, *l;
    size_t stuck = 0;

    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->nblocked++;
    if (p->nblocked >= p->nthreads) {
        /* No thread is left to start a queued job until a loop call
         * returns, and that call may be waiting for one of them: fail
         * them with a clear error instead of hanging. */
        stuck = ferry__pool_drop_queued_locked(p, &dropped, -EDEADLK);
        if (stuck)
            ferry__pool_room_kick_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
    while ((l = ferry__list_pop_front(&dropped)) != NULL) {
        struct job *j = ferry__container_of(l, struct job, link);
        ferry__pool_finish(j, j->status);
    }
    if (stuck)
        ferry__log(FERRY_LOG_WARN,
                   "pool: all %u threads wait on a loop; %zu queued "
                   "job(s) failed with -EDEADLK",
                   p->nthreads, stuck);
}

void ferry__pool_block_exit(void)
{
    struct ferry_pool *p = ferry__pool_tls;

    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->nblocked--;
    pthread_mutex_unlock(&p->mu);
}
