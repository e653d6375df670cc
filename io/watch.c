/* watch.c - the kit for callback-style libraries (ferry/watch.h): their
 * socket-interest and timer callbacks turned into events of the loop's
 * base and one loop timer, delivered to the adapter's driver.
 * Loop thread only.
 *
 * Why libevent events and not the descriptor registry of streams
 * (ioreg.c): a stream's registration is edge-triggered and lives as long
 * as the stream, and a task must have met EAGAIN before it waits.  A
 * library reads what it wants when told, not necessarily until EAGAIN, and
 * changes its interest with every step, so it needs level-triggered
 * interest that follows its callbacks: one persistent event per
 * descriptor, re-assigned when the interest changes, deleted at once on
 * removal (libevent counts registrations per descriptor number, so a
 * registration left behind would blind a later one on a reused number).
 *
 * Spinning.  A level-triggered descriptor that stays ready while its
 * library consumes nothing (an idle connection whose peer closed, an
 * eventfd nobody reads) would wake the loop on every poll.  Each
 * descriptor counts its deliveries; past SPIN_LIMIT of them within
 * SPIN_WINDOW, each further delivery measures what is queued on the
 * descriptor before and after the driver ran (FIONREAD for reading,
 * TIOCOUTQ for writing).  Nothing moved and no ferry_watch_progress():
 * the descriptor is parked (its event deleted) for a back-off that doubles
 * from 1 ms up to 1 s, or until the library states its interest again.
 * Until progress is seen, a descriptor that was parked is parked again at
 * its next idle delivery.
 */
#include "loop_only.h"

#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>

#include <event2/event.h>

#include "ferry/watch.h"
#include "loop_int.h"

#define SPIN_LIMIT  64
#define SPIN_WINDOW FERRY_MSEC(10)
#define PARK_FIRST  FERRY_MSEC(1)
#define PARK_MAX    FERRY_SEC(1)

/* One registered descriptor.  Allocated alone: its event must not move. */
struct wfd {
    ferry_watch *w;      /* its watch */
    int fd;              /* the descriptor */
    uint32_t gen;        /* registration number, unique in the watch */
    uint8_t want;        /* FERRY_READ|FERRY_WRITE the library asked for */
    short armed;         /* EV_READ|EV_WRITE added to the base now, or 0 */
    bool parked;         /* not watched: spinning (top of the file) */
    unsigned burst;      /* deliveries since burst_start */
    int64_t burst_start; /* start of the counting window */
    int64_t backoff;     /* the last parking's length; 0: progress seen */
    ferry_timer *unpark; /* ends the parking, or NULL */
    struct event ev;     /* the registration, valid while armed */
};

/* The loop's part holding its watches, made with the first watch. */
struct watch_part {
    struct ferry__loop_part part; /* in the loop's parts */
    struct ferry__link watches;   /* of struct ferry_watch, oldest first */
};

struct ferry_watch {
    struct ferry__link link; /* in the part's watches */
    ferry_loop *loop;        /* the loop it belongs to */
    const void *key;         /* ferry_watch_get()'s key, or NULL */
    ferry_watch_ops ops;     /* the adapter's driver */
    void *arg;               /* passed to every op */
    struct wfd **byfd;       /* registrations by descriptor number */
    int nfd;                 /* slots in byfd */
    ferry_timer *timer;      /* the library's timer, or NULL */
    unsigned depth;          /* ops running (0 or 1) */
    bool freeing;            /* ferry_watch_free() from inside an op */
    bool progress;           /* ferry_watch_progress() during a delivery */
    bool warned;             /* a parking was logged */
    uint32_t next_gen;       /* last registration number given */
    ferry_watch_stats stats; /* counters (fds and parked kept live) */
};

static struct wfd *lookup(const ferry_watch *w, int fd)
{
    return fd >= 0 && fd < w->nfd ? w->byfd[fd] : NULL;
}

/* Make the base's registration match what the descriptor wants.
 * Returns: 0; -EBADF (refused); -ENOMEM. */
static int arm(struct wfd *f);

static void on_event(evutil_socket_t fd, short what, void *arg);

static int arm(struct wfd *f)
{
    short want = 0;

    if (!f->parked)
        want =
            (short)((f->want & FERRY_READ ? EV_READ : 0) | (f->want & FERRY_WRITE ? EV_WRITE : 0));
    if (want == f->armed)
        return 0;
    if (f->armed)
        event_del(&f->ev);
    f->armed = 0;
    if (!want)
        return 0;
    event_assign(&f->ev, f->w->loop->base, f->fd, (short)(want | EV_PERSIST), on_event, f);
    errno = 0;
    if (ferry__fault_point("watch_arm") || event_add(&f->ev, NULL) != 0)
        return errno == EBADF || errno == EPERM ? -EBADF : -ENOMEM;
    f->armed = want;
    return 0;
}

static void unpark_cb(void *arg)
{
    struct wfd *f = arg;

    f->unpark = NULL;
    if (f->parked) {
        f->parked = false;
        f->w->stats.parked--;
        if (arm(f) != 0) {
            /* Could not watch it again: try later rather than lose it. */
            f->parked = true;
            f->w->stats.parked++;
            ferry_call_later(f->w->loop, f->backoff, unpark_cb, f, &f->unpark);
        }
    }
}

static void park(struct wfd *f)
{
    ferry_watch *w = f->w;
    int64_t backoff = f->backoff ? f->backoff * 2 : PARK_FIRST;

    if (backoff > PARK_MAX)
        backoff = PARK_MAX;
    if (ferry_call_later(w->loop, backoff, unpark_cb, f, &f->unpark) != 0)
        return; /* no timer: keep watching rather than risk never again */
    f->backoff = backoff;
    f->parked = true;
    arm(f);
    w->stats.parks++;
    w->stats.parked++;
    if (!w->warned) {
        w->warned = true;
        ferry__log(FERRY_LOG_WARN,
                   "watch: descriptor %d stays ready and its library consumes nothing: "
                   "parked (the library still watches an idle descriptor)",
                   f->fd);
    }
}

/* Bytes queued on `fd` in the direction of `events`, summed; -1 when the
 * descriptor cannot tell (an eventfd, a pipe's write end). */
static long queued(int fd, int events)
{
    long sum = 0;
    int n;

    if (events & FERRY_READ) {
        if (ioctl(fd, FIONREAD, &n) != 0)
            return -1;
        sum += n;
    }
    if (events & FERRY_WRITE) {
        if (ioctl(fd, TIOCOUTQ, &n) != 0)
            return -1;
        sum -= n; /* a write makes the queue longer: the sum goes down */
    }
    return sum;
}

static void watch_destroy(ferry_watch *w);

/* After an op: free a watch whose ferry_watch_free() came from inside it.
 * Returns: true if it was freed. */
static bool op_end(ferry_watch *w)
{
    w->depth--;
    if (w->depth == 0 && w->freeing) {
        watch_destroy(w);
        return true;
    }
    return false;
}

static void on_event(evutil_socket_t sfd, short what, void *arg)
{
    struct wfd *f = arg;
    ferry_watch *w = f->w;
    int fd = (int)sfd;
    int events = ((what & EV_READ) ? FERRY_READ : 0) | ((what & EV_WRITE) ? FERRY_WRITE : 0);
    uint32_t gen = f->gen;
    long before = -1;
    bool probe;
    int64_t now;

    events &= f->want;
    if (!events || w->depth || w->freeing) {
        w->stats.stale++;
        return;
    }
    now = ferry_now();
    if (now - f->burst_start > SPIN_WINDOW && f->backoff == 0) {
        f->burst_start = now;
        f->burst = 0;
    }
    probe = ++f->burst > SPIN_LIMIT;
    if (probe)
        before = queued(fd, events);
    w->progress = false;
    w->depth++;
    w->stats.ready_calls++;
    w->ops.ready(w, fd, events, w->arg);
    if (op_end(w))
        return;
    /* The driver may have removed the descriptor, or removed it and
     * registered a new one under the same number: that one is not ours. */
    f = lookup(w, fd);
    if (!f || f->gen != gen)
        return;
    if (!w->progress && probe) {
        long after = queued(fd, events);

        if (before < 0 || after < 0 || after >= before) {
            park(f);
            return;
        }
    }
    if (w->progress || probe) {
        f->burst = 0;
        f->burst_start = now;
        f->backoff = 0;
    }
}

static void on_timer(void *arg)
{
    ferry_watch *w = arg;

    w->timer = NULL;
    if (w->freeing)
        return;
    w->depth++;
    w->stats.timeout_calls++;
    w->ops.timeout(w, w->arg);
    op_end(w);
}

static void fd_free(ferry_watch *w, struct wfd *f)
{
    if (f->armed)
        event_del(&f->ev);
    if (f->unpark)
        ferry_timer_cancel(f->unpark);
    if (f->parked)
        w->stats.parked--;
    w->byfd[f->fd] = NULL;
    w->stats.fds--;
    ferry__free(f);
}

/* Unregister everything and stop the timer: nothing of the watch is left
 * in the loop. */
static void watch_quiesce(ferry_watch *w)
{
    for (int i = 0; i < w->nfd; i++)
        if (w->byfd[i])
            fd_free(w, w->byfd[i]);
    if (w->timer)
        ferry_timer_cancel(w->timer);
    w->timer = NULL;
    if (ferry__link_linked(&w->link))
        ferry__list_remove(&w->link);
}

static void watch_destroy(ferry_watch *w)
{
    watch_quiesce(w);
    ferry__free(w->byfd);
    ferry__free(w);
}

/* The loop is being freed, every task has ended: each watch still alive
 * gets its teardown op (its library's handle goes), then the watch goes,
 * before the descriptors and the base the library used. */
static void watch_part_free(struct ferry__loop_part *part)
{
    struct watch_part *wp = ferry__container_of(part, struct watch_part, part);
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(&wp->watches)) != NULL) {
        ferry_watch *w = ferry__container_of(l, ferry_watch, link);

        if (w->ops.teardown) {
            w->depth++;
            w->ops.teardown(w, w->arg);
            w->depth--;
        }
        watch_destroy(w);
    }
    ferry__loop_part_del(part);
    ferry__free(wp);
}

static const struct ferry__part_ops watch_part_ops = { "watches", NULL, watch_part_free };

static struct watch_part *part_of(const ferry_loop *loop)
{
    struct ferry__loop_part *p = ferry__loop_part_find(loop, &watch_part_ops);

    return p ? ferry__container_of(p, struct watch_part, part) : NULL;
}

int ferry_watch_new(ferry_watch **out, ferry_loop *loop, const void *key,
                    const ferry_watch_ops *ops, void *arg)
{
    struct watch_part *wp;
    ferry_watch *w;
    int rc;

    if (!out || !ops || !ops->ready || !ops->timeout)
        return -EINVAL;
    rc = ferry__loop_check(loop);
    if (rc)
        return rc;
    if (key && ferry_watch_get(loop, key))
        return -EEXIST;
    wp = part_of(loop);
    if (!wp) {
        wp = ferry__calloc(1, sizeof *wp);
        if (!wp)
            return -ENOMEM;
        ferry__loop_part_add(loop, &wp->part, &watch_part_ops);
    }
    w = ferry__calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM; /* the part stays for the next watch */
    w->loop = loop;
    w->key = key;
    w->ops = *ops;
    w->arg = arg;
    ferry__list_push_back(&wp->watches, &w->link);
    *out = w;
    return 0;
}

ferry_watch *ferry_watch_get(ferry_loop *loop, const void *key)
{
    struct watch_part *wp;
    struct ferry__link *l;

    if (!key || ferry__loop_check(loop))
        return NULL;
    wp = part_of(loop);
    if (!wp)
        return NULL;
    ferry__list_foreach(l, &wp->watches) {
        ferry_watch *w = ferry__container_of(l, ferry_watch, link);
        if (w->key == key)
            return w;
    }
    return NULL;
}

ferry_loop *ferry_watch_loop(const ferry_watch *w)
{
    return w ? w->loop : NULL;
}

void *ferry_watch_arg(const ferry_watch *w)
{
    return w ? w->arg : NULL;
}

void ferry_watch_free(ferry_watch *w)
{
    if (!w || w->freeing)
        return;
    if (w->depth) {
        watch_quiesce(w);
        w->freeing = true;
        return;
    }
    watch_destroy(w);
}

int ferry_watch_fd(ferry_watch *w, int fd, int events)
{
    struct wfd *f;
    uint8_t old;
    int rc;

    if (!w || fd < 0 || (events & ~(FERRY_READ | FERRY_WRITE)))
        return -EINVAL;
    if (w->freeing)
        return 0;
    f = lookup(w, fd);
    if (!f) {
        if (fd >= w->nfd) {
            int n = w->nfd ? w->nfd : 16;
            struct wfd **nb;

            while (n <= fd)
                n *= 2;
            nb = ferry__realloc(w->byfd, (size_t)n * sizeof *nb);
            if (!nb)
                return -ENOMEM;
            memset(nb + w->nfd, 0, (size_t)(n - w->nfd) * sizeof *nb);
            w->byfd = nb;
            w->nfd = n;
        }
        f = ferry__calloc(1, sizeof *f);
        if (!f)
            return -ENOMEM;
        f->w = w;
        f->fd = fd;
        f->gen = ++w->next_gen;
        f->want = (uint8_t)events;
        f->burst_start = ferry_now();
        w->byfd[fd] = f;
        w->stats.fds++;
        rc = arm(f);
        if (rc)
            fd_free(w, f);
        return rc;
    }
    old = f->want;
    if (events != old) {
        f->burst = 0;
        f->backoff = 0;
    }
    f->want = (uint8_t)events;
    if (f->parked) {
        /* The library spoke: it is not simply spinning on it. */
        f->parked = false;
        w->stats.parked--;
        if (f->unpark)
            ferry_timer_cancel(f->unpark);
        f->unpark = NULL;
    }
    rc = arm(f);
    if (rc) {
        f->want = old;
        arm(f);
    }
    return rc;
}

int ferry_watch_fd_remove(ferry_watch *w, int fd)
{
    struct wfd *f;

    if (!w || fd < 0)
        return -EINVAL;
    f = lookup(w, fd);
    if (f)
        fd_free(w, f);
    return 0;
}

int ferry_watch_timer(ferry_watch *w, int64_t delay)
{
    if (!w)
        return -EINVAL;
    if (w->timer)
        ferry_timer_cancel(w->timer);
    w->timer = NULL;
    if (delay < 0 || w->freeing)
        return 0;
    return ferry_call_later(w->loop, delay, on_timer, w, &w->timer);
}

void ferry_watch_progress(ferry_watch *w)
{
    if (w)
        w->progress = true;
}

bool ferry_watch_busy(const ferry_watch *w)
{
    return w && w->depth > 0;
}

int ferry_watch_stats_get(const ferry_watch *w, ferry_watch_stats *out)
{
    if (!w || !out)
        return -EINVAL;
    *out = w->stats;
    return 0;
}

/* ---- Operation ------------------------------------------------------ */

void ferry_watch_op_init(ferry_watch_op *op)
{
    memset(op, 0, sizeof *op);
}

int ferry_watch_op_wait(ferry_watch_op *op)
{
    struct ferry__waiter wt;
    ferry_task *self;
    int rc;

    if (!op)
        return -EINVAL;
    rc = ferry__enter_task(&self);
    if (rc)
        return rc;
    if (op->done)
        return 0;
    ferry__waiter_init(&wt, self, "watch op", op);
    rc = ferry__wait(&op->waiters, &wt, FERRY_NEVER);
    /* Done before the task ran: the operation took effect, so report it. */
    return op->done ? 0 : rc;
}

void ferry_watch_op_done(ferry_watch_op *op, int result)
{
    if (!op || op->done)
        return;
    op->done = true;
    op->result = result;
    ferry__waitq_grant_all(&op->waiters, 0);
}

bool ferry_watch_op_is_done(const ferry_watch_op *op)
{
    return op && op->done;
}

int ferry_watch_op_result(const ferry_watch_op *op)
{
    return op ? op->result : 0;
}
