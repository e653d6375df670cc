/* pool_int.h - what the files of the thread pools share.
 *
 * A pool is a fixed set of threads and a bounded FIFO of jobs under one
 * mutex.  A task's job lives on the task's stack (ferry_to_thread
 * allocates nothing); its completion goes back through the loop's inbox,
 * which cannot fail.  The parts:
 *
 *   pool.c         the pool object: making and freeing it, the default
 *                  pool, statistics, ferry_pool_submit() from any thread;
 *   pool_worker.c  the workers, and when to wake one (the clock, the
 *                  spinner, the checker): the waking policy, struct
 *                  ferry__pool_wake, which no other file writes; pool
 *                  threads calling into loops;
 *   pool_sink.c    a job's end going back to whoever waits for it, and the
 *                  sink that takes a loop's finished task jobs in one go;
 *   to_thread.c    the task side: ferry_to_thread(), the abandon variant,
 *                  and the hand-over of a turn's jobs.
 *
 * The hot path, one job of a task (ferry_to_thread):
 *
 *   - The task does not take the pool's mutex.  Its job goes on its loop's
 *     list of jobs to hand over (to_thread.c, loop thread only), and a
 *     callback that runs after the current turn queues everything the
 *     turn offloaded with one lock per pool and one decision about waking
 *     a worker: many tasks that offload in one turn cost one lock, not one
 *     each that contends with the workers.
 *   - A worker takes one lock per job: the acquisition that takes the next
 *     job also books the end of the previous one.  A finished task job goes
 *     on the pool's completion list (the sink, struct sink) under that same
 *     lock; the first one on an empty sink posts the sink to the loop's
 *     inbox (one inbox lock, at most one eventfd write), and the loop takes
 *     the whole list when it runs it and wakes each task directly.
 *   - Waking: a new batch of jobs goes to a spinning worker if there is
 *     one, else one sleeping worker is signalled, unless busy workers will
 *     reach it soon.  A worker that takes a job while others sleep wakes
 *     one more if the jobs are slow enough for another thread to help:
 *     slow jobs spread over the threads at once, short ones stay on one,
 *     which runs them faster than several threads contending for the lock
 *     and the CPUs would (pool_worker.c).
 *   - Spinning: an idle worker polls for work for a while, and a loop that
 *     handed a job to a spinning worker and has nothing else to do polls
 *     for the completion (LSPIN_MAX_NS below): a round trip then needs no
 *     wakeup on either side.  Both budgets adapt, and neither polls a CPU
 *     it shares with the thread it waits for.
 *
 * Job states (under mu): QUEUED (in `queue`, or in `overq` when the queue
 * was full) -> RUNNING (a worker took it) -> FINISHED (fn returned, or the
 * pool was freed while it was queued; the completion is posted).  Before
 * QUEUED a task's job may be `pending` on its loop's list (loop thread).  A
 * task interrupted while its job is pending or QUEUED removes it: it never
 * runs.  RUNNING: the task waits, shielded, or (abandon variant, heap job)
 * marks it abandoned and leaves; the worker then runs the cleanup and
 * frees it.  FINISHED: the completion is on its way; the task waits for it
 * (ferry__task_wake_settle) so the worker's write into the task's stack has
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
#ifndef FERRY_POOL_INT_H
#define FERRY_POOL_INT_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "bridge_int.h"
#include "ferry/job.h"

enum { JOB_QUEUED = 1, JOB_RUNNING, JOB_FINISHED };
enum { KIND_TASK = 1, KIND_SUBMIT };

struct job {
    /* The first 64 bytes hold everything a worker reads or writes on the
     * hot path, so that a job costs one cache line's trip to the worker
     * and back (a task's job is aligned to a line on its stack). */
    struct ferry__link link; /* mu: in pool->queue or pool->overq while QUEUED, in
                                    * pool->sink.more while FINISHED; loop thread: in the
                                    * loop's list (to_thread.c) while pending (see `gen`) */
    ferry_job_fn fn;         /* the blocking call */
    void *arg;               /* its argument (the caller's) */
    uint64_t enq;            /* mu: when it was queued (ferry__pool_ticks()) */
    struct ferry_inbox *ib;  /* KIND_TASK: the inbox of the task's loop;
                                    * KIND_SUBMIT: the loop's inbox, or NULL */
    int state;               /* mu: JOB_* */
    int status;              /* fn's status; written before the completion is posted */
    unsigned char kind;      /* KIND_TASK or KIND_SUBMIT */
    bool heap;               /* allocated by ferry (abandon variant, submit) */
    bool abandoned;          /* mu: the task left; the worker cleans up */
    bool over;               /* mu: QUEUED in overq, waiting for room */
    bool dropped;            /* mu: FINISHED without running (pool freed, or every
                                    * thread blocked); read by the abandon variant only,
                                    * which alone initialises it */
    /* The waiting side.  A task's job fits three cache lines: the fields
     * of the other kind share its wake's room, and the task's loop
     * touches no fourth line per job. */
    uint64_t gen;            /* loop thread: the hand-over of its loop's list it waits
                                    * for (that list's gen + 1 while pending), 0 if never
                                    * deferred */
    struct ferry_pool *pool; /* its pool (KIND_SUBMIT: holds a reference) */
    union {
        struct ferry__task_wake tw; /* KIND_TASK: wakes the waiting task */
        struct {
            struct ferry__cnode cn; /* with a loop: runs `done` there */
            ferry_job_done done;    /* completion callback, or NULL */
            void *done_arg;         /* its argument */
            atomic_uint refs;       /* with a ticket: the ticket and the completion
                                        * each hold one; the last frees the job */
            bool ticket;            /* a ferry_ticket refers to the job */
        } sub;                      /* KIND_SUBMIT */
    };
    ferry_job_cleanup cleanup; /* abandon variant: receives the late status */
};

_Static_assert(offsetof(struct job, gen) <= 64,
               "a worker's fields of struct job fit one cache line");
_Static_assert(sizeof(struct job) <= 192, "a task's job fits three cache lines");

/* A task waiting for room in the queue (the fallback path, see offload). */
struct room_waiter {
    struct ferry__link link;    /* mu: in pool->roomq until woken */
    struct ferry__task_wake tw; /* the waiting task */
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
    struct ferry__cnode cn;          /* in ib's completion queue while `posted` */
    struct ferry_inbox *ib;          /* mu: the inbox served; only compared while idle */
    bool posted;                     /* mu: cn is posted and has not taken the jobs yet */
    bool taken[2];                   /* mu: slot[i] is being delivered by a loop */
    unsigned fill;                   /* mu: the array workers fill */
    size_t n;                        /* mu: jobs in slot[fill] */
    struct ferry__link more;         /* mu: FINISHED task jobs that did not fit, FIFO */
    struct job *slot[2][SINK_SLOTS]; /* mu: FINISHED task jobs for ib */
};

/*
 * The waking policy of a pool: who is idle, who spins, the checker, the
 * adaptive budgets and the hints they read.  Written by pool_worker.c
 * only; the other files of the pool go through the functions of its
 * section below (they may read it).
 */
struct ferry__pool_wake {
    unsigned nidle;      /* mu: workers waiting on `work` */
    unsigned nwaking;    /* mu: of those, signalled and not yet back */
    bool spinner;        /* mu: a worker spins for work, not yet claimed by a job */
    bool checker;        /* mu: a worker is the checker (not in nidle) */
    bool check_kick;     /* mu: the checker was woken for work */
    bool appoint;        /* mu: a sleeper was woken to be the next checker */
    bool multicpu;       /* set once: more than one CPU online */
    int64_t spin_ns;     /* mu: how long an idle worker spins now (adaptive) */
    int64_t lspin_ns;    /* mu: how long an idle loop waits for a completion (adaptive) */
    int64_t flush_ns;    /* mu: when a loop last queued jobs */
    int64_t check_ns;    /* mu: the checker's timeout now (adaptive) */
    uint64_t svc;        /* mu: moving average of a job's run time, ferry__pool_ticks() */
    atomic_size_t qhint; /* nqueued, published for the spinner */
    atomic_int sub_cpu;  /* CPU of the last submitter (a hint; any thread) */
    atomic_int spin_cpu; /* CPU the spinner last ran on (a hint) */
};

struct ferry_pool {
    pthread_mutex_t mu;           /* guards the fields marked "mu" */
    pthread_cond_t work;          /* idle workers wait here */
    pthread_cond_t room;          /* threads in ferry_pool_submit wait for room */
    struct ferry__link queue;     /* mu: struct job, FIFO */
    struct ferry__link overq;     /* mu: task jobs that found the queue full, FIFO */
    struct ferry__link roomq;     /* mu: struct room_waiter, FIFO */
    size_t nqueued;               /* mu: jobs in queue */
    size_t capacity;              /* set once */
    unsigned nthreads;            /* set once: threads started */
    unsigned nblocked;            /* mu: workers blocked calling into a loop */
    unsigned room_threads;        /* mu: threads waiting on `room` */
    size_t running;               /* mu: jobs running, abandoned ones included */
    size_t nabandoned;            /* mu: of those, abandoned */
    uint64_t completed;           /* mu */
    uint64_t cancelled;           /* mu */
    atomic_ulong callback_errors; /* completions that returned non-zero */
    bool stopping;                /* mu: ferry_pool_free() began */
    bool leave;                   /* mu: being freed with FERRY_POOL_FREE_LEAVE_ABANDONED */
    bool released;                /* mu: that free has returned: a worker leaving now
                                    * detaches itself and drops a reference */
    unsigned alive;               /* mu: workers that have not left their loop */
    bool *exited;                 /* mu: per thread, left its loop (after `threads`, same
                                    * allocation) */
    pthread_cond_t gone;          /* a worker left, or a job was abandoned, while stopping */
    pthread_cond_t check;         /* the checker sleeps here (CLOCK_MONOTONIC) */
    uint64_t stalled;             /* mu: stuck jobs the checker took */
    pthread_t *threads;           /* set once */
    struct ferry__pool_wake wake; /* the waking policy (pool_worker.c) */
    /* Apart from the fields the workers write all the time: the loop
     * thread takes and drops a reference per ferry_to_thread. */
    char pad0[64];
    atomic_uint refs; /* creator + calls in progress + pending completions
                                    * + posted sink */
    char pad1[64];
    struct sink sink; /* mu (cn: see struct sink) */
};

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

/* The pool whose worker is the calling thread, or NULL (pool_worker.c). */
extern _Thread_local struct ferry_pool *ferry__pool_tls;

/* A monotonic counter for the service time and the queueing delay: the
 * TSC on x86-64 (cheaper to read than ferry__now_real()), else
 * ferry__now_real().  Only compared with the waking policy's thresholds
 * (pool_worker.c), so an imprecise TSC costs at most a worker woken late
 * or early. */
static inline uint64_t ferry__pool_ticks(void)
{
#if defined(__x86_64__)
    return __rdtsc();
#else
    return (uint64_t)ferry__now_real();
#endif
}

/* ---- the pool object (pool.c) -------------------------------------------- */

static inline void ferry__pool_ref(struct ferry_pool *p)
{
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}
/* Drop a reference; the last one frees the pool.  Thread: any. */
void ferry__pool_unref(struct ferry_pool *p);

/* Put a job at the tail of the queue (room checked by the caller).
 * Requires mu; wakes nobody. */
static inline void ferry__pool_queue_locked(struct ferry_pool *p, struct job *j, uint64_t now)
{
    j->state = JOB_QUEUED;
    j->abandoned = false;
    j->over = false;
    j->enq = now;
    ferry__list_push_back(&p->queue, &j->link);
    p->nqueued++;
}

/* Requires mu: why a job could not be queued now, or 0. */
static inline int ferry__pool_refuse_locked(struct ferry_pool *p)
{
    if (p->stopping)
        return -ESHUTDOWN;
    if (p->nblocked >= p->nthreads)
        return -EDEADLK;
    return 0;
}

/* A slot of the queue freed up: move waiting task jobs in, then wake one
 * thread and one task waiting for room if room is left.  Requires mu.  A
 * woken waiter that does not use the room passes the wake on by calling
 * this again. */
void ferry__pool_room_kick_locked(struct ferry_pool *p);

/* Take every job out of the queue and the overflow list, onto `dropped`,
 * to be completed with `status` (never run; the overflow ones with
 * -ESHUTDOWN: they were never queued).  Requires mu.  Returns how many. */
size_t ferry__pool_drop_queued_locked(struct ferry_pool *p, struct ferry__link *dropped,
                                      int status);

/* ---- the workers (pool_worker.c) ----------------------------------------- */

/* A new pool's waking policy: its adaptive budgets and starting point;
 * calibrates the clock once per process. */
void ferry__pool_policy_init(struct ferry_pool *p);

/* Publish the queue length for the spinner and the submitter's CPU.
 * Requires mu. */
void ferry__pool_publish_locked(struct ferry_pool *p);

/* The queue lost jobs (taken out, dropped): publish its length for the
 * spinner.  Requires mu. */
void ferry__pool_unqueued_locked(struct ferry_pool *p);

/*
 * A loop queued `added` jobs of a turn's hand-over: publish, note the
 * time, wake a worker for them.  Requires mu.  Returns how long the loop
 * may poll for the completion if it has nothing else to do (a spinning
 * worker took the jobs on another CPU), else 0.
 */
int64_t ferry__pool_flushed_locked(struct ferry_pool *p, size_t added);

/* The loop polled for `budget` after a hand-over and it ended with `r`
 * (FERRY__SPIN_*): adapt the loop's budget.  Takes mu. */
void ferry__pool_loop_spun(struct ferry_pool *p, int r, int64_t budget);

/* A loop takes the pool's completions: if they came within LSPIN_MAX_NS
 * of the last hand-over, a poll would have paid, so the loop's budget is
 * restored.  Requires mu. */
void ferry__pool_completions_taken_locked(struct ferry_pool *p);

/* Wake a worker for `added` newly queued jobs: claim the spinner if there
 * is one (it takes them), else signal a sleeper not yet signalled, unless
 * the workers already busy will come to them soon enough.  Requires mu.
 * Returns true if a spinning worker was claimed. */
bool ferry__pool_wake_locked(struct ferry_pool *p, size_t added);

/* The body of a pool thread; `arg` is the pool. */
void *ferry__pool_worker_main(void *arg);

/* Queue one job and wake a worker for it.  Requires mu; checked for room
 * and state by the caller. */
static inline void ferry__pool_enqueue_locked(struct ferry_pool *p, struct job *j)
{
    ferry__pool_queue_locked(p, j, ferry__pool_ticks());
    ferry__pool_publish_locked(p);
    ferry__pool_wake_locked(p, 1);
}

/* ---- a job's end (pool_sink.c) ------------------------------------------- */

/* Deliver a job's end (fn's status, or why it never ran).  No lock held.
 * After this the job may be gone (a task's stack frame). */
void ferry__pool_finish(struct job *j, int status);

/*
 * Book the end of job `j` (fn returned `status`).  Requires mu.  Returns
 * what the caller must do after unlocking: RET_NONE (it went on the sink,
 * already posted), RET_POST (it went on the sink: post the sink to *ib),
 * RET_FINISH (complete it the ordinary way), RET_CLEANUP (abandoned: run
 * the cleanup and free it).
 */
enum { RET_NONE, RET_POST, RET_FINISH, RET_CLEANUP };
int ferry__pool_book_locked(struct ferry_pool *p, struct job *j, int status,
                            struct ferry_inbox **ib /* OUT */);

/* Carry out what ferry__pool_book_locked() asked for.  No lock held. */
void ferry__pool_after_book(struct ferry_pool *p, struct job *j, int status, int what,
                            struct ferry_inbox *ib);

/* ---- jobs that cancellation reaches (job.c) ----------------------------- */

/* The pool-side body of a ferry_to_thread_ex() job; `arg` is its state.
 * to_thread.c recognises such a job by this fn. */
int ferry__job_trampoline(void *arg);

/* The task waiting for the job `arg` (a ferry__job_trampoline job) was
 * interrupted with `why` (-ECANCELED or -ETIMEDOUT) after the job left
 * the queue: mark it cancelled and run its hook if it is running.  Loop
 * thread; never waits for the job. */
void ferry__job_interrupt(void *arg, int why);

#endif /* FERRY_POOL_INT_H */
