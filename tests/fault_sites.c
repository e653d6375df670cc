/* fault_sites.c - SQLite-style allocation-failure injection over every
 * public operation that allocates, with the failures attributed to their
 * call sites in the library's folders (base/, src/, bridge/, wire/).
 *
 * For each operation: run it once clean and count the fault points it
 * passes (n); then for i = 1..n fail the i-th, once ("transient") and from
 * then on ("persistent").  Every time the call must succeed or return
 * -ENOMEM (nothing else), nothing may crash, the objects must still work
 * and be destroyable, and once they are, the live allocations must be
 * back to what they were before the operation (checked after every run,
 * in every build).  libevent's allocations are routed through the same
 * hook (event_set_mem_functions), so they fail too; a loop must then still
 * use epoll, not a silent fallback backend.
 *
 * A call that succeeds although a failure was injected has absorbed it.
 * That is allowed only where the design says so, named per operation: a
 * fault point's site name ("eventfd write", "fork mark") or the function
 * that made the failing allocation ("resize": a hash table that cannot
 * shrink keeps its array).  Each absorbed failure must match one of them.
 *
 * Sites: the link wraps ferry__malloc/calloc/realloc/fault_point
 * (tests/reliability/CMakeLists.txt adds -Wl,--wrap=...), so each injected
 * failure records its caller's address and call path; addr2line turns
 * those into file:line and function names.  Every call site found in the
 * source must be reached, except one compiled out of this program (no line
 * of it in the program's line table): those are listed, and must be named
 * in FAULT_SITES_ELSEWHERE (the fault point names another build of this
 * test reaches: fault_sites_pipe, built without eventfd, reaches the pipe
 * fallback).  The test prints "fault: N of M allocation sites reached" and
 * fails unless every site compiled in was.  Without the wrap (another
 * build), attribution is skipped and said so.
 */
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <event2/event.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fakedns.h"
#include "fault.h"
#include "ferry_int.h"
#include "ferry/ferry.h"

/* Set by tests/reliability/CMakeLists.txt: where the library's folders are. */
#ifndef FERRY_SOURCE_DIR
#define FERRY_SOURCE_DIR "."
#endif

/* ---- call-site recording ------------------------------------------------ */

void *__real_ferry__malloc(size_t size) __attribute__((weak));
void *__real_ferry__calloc(size_t n, size_t size) __attribute__((weak));
void *__real_ferry__realloc(void *p, size_t size) __attribute__((weak));
bool  __real_ferry__fault_point(const char *site) __attribute__((weak));

void *__wrap_ferry__malloc(size_t size);
void *__wrap_ferry__calloc(size_t n, size_t size);
void *__wrap_ferry__realloc(void *p, size_t size);
bool  __wrap_ferry__fault_point(const char *site);

#define MAXHITS 256
static void *hit_addr[MAXHITS];
static int   nhit;
static pthread_mutex_t hit_mu = PTHREAD_MUTEX_INITIALIZER;

static void *last_addr;   /* caller of the last injected failure */

/* The failures injected during one run of an operation, with their call
 * paths: what an absorbed failure is checked against.  Guarded by hit_mu
 * (pool threads allocate too). */
#define MAXINJ   64
#define INJ_BT   10
struct injection {
    const char *site;       /* ferry__fault_last_site(): "malloc", "eventfd write" */
    void *bt[INJ_BT];       /* bt[0]: the wrapper; bt[1]: the call site */
    int   nbt;
};
static struct injection inj[MAXINJ];
static int ninj;

/* The path of this program (in-process: under valgrind /proc/PID/exe seen
 * from another process is valgrind's own binary). */
static const char *self_exe(void)
{
    static char path[4096];
    ssize_t n;

    if (!path[0]) {
        n = readlink("/proc/self/exe", path, sizeof path - 1);
        path[n > 0 ? n : 0] = 0;
    }
    return path;
}

/* The address addr2line wants for a return address: inside the call
 * instruction, relative to the load address in a PIE. */
static unsigned long code_addr(void *ret)
{
    static int pie = -1;
    uintptr_t a = (uintptr_t)ret - 1;
    Dl_info di;

    if (pie < 0) {
        Elf64_Ehdr eh;
        FILE *self = fopen(self_exe(), "rb");
        pie = 1;
        if (self && fread(&eh, sizeof eh, 1, self) == 1)
            pie = eh.e_type == ET_DYN;
        if (self)
            fclose(self);
    }
    if (pie && dladdr(ret, &di) && di.dli_fbase)
        a -= (uintptr_t)di.dli_fbase;
    return (unsigned long)a;
}

/* file:line of a code address, for messages. */
static const char *describe(void *addr)
{
    static char out[256];
    char cmd[4400];
    FILE *p;

    if (!addr)
        return "?";
    snprintf(cmd, sizeof cmd, "addr2line -e '%s' %#lx", self_exe(), code_addr(addr));
    snprintf(out, sizeof out, "?");
    if ((p = popen(cmd, "r"))) {
        if (fgets(out, sizeof out, p))
            out[strcspn(out, "\n")] = 0;
        pclose(p);
    }
    return out;
}

/*
 * The functions of an injection's call path, innermost first: `path`, those
 * above the wrapper here, and `site`, those of the call site (the frame just
 * above the wrapper, with the functions inlined at it), which is what an
 * absorbed failure is matched against; both space-separated.  Returns the
 * index of the call site's frame in in->bt (a sanitizer may add frames of
 * its own below the wrapper), or -1.
 */
static int call_path(const struct injection *in, char *site, size_t site_len,
                     char *path, size_t path_len)
{
    char cmd[4400], line[512], names[INJ_BT][256];
    size_t len, plen = 0;
    int frame = -1, site_frame = -1;
    FILE *p;

    site[0] = path[0] = 0;
    memset(names, 0, sizeof names);
    len = (size_t)snprintf(cmd, sizeof cmd, "addr2line -a -f -i -e '%s'", self_exe());
    for (int i = 0; i < in->nbt && len < sizeof cmd - 32; i++)
        len += (size_t)snprintf(cmd + len, sizeof cmd - len, " %#lx", code_addr(in->bt[i]));
    if (!(p = popen(cmd, "r")))
        return -1;
    /* Per address: a line "0x...", then function names and file:line
     * alternating, one pair per inlined function. */
    for (int k = 0; fgets(line, sizeof line, p); k++) {
        size_t n;

        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "0x", 2) == 0) {
            frame++;
            k = -1;
            continue;
        }
        if (k % 2 != 0 || frame < 0 || frame >= INJ_BT)
            continue;
        n = strlen(names[frame]);
        snprintf(names[frame] + n, sizeof names[frame] - n, "%s%s", n ? " " : "", line);
        if (strncmp(line, "__wrap_", 7) == 0)
            site_frame = frame + 1;
    }
    pclose(p);
    if (site_frame < 0 || site_frame >= in->nbt)
        return -1;
    snprintf(site, site_len, "%s", names[site_frame]);
    for (int i = site_frame; i < in->nbt && plen < path_len - 2; i++)
        plen += (size_t)snprintf(path + plen, path_len - plen, "%s%s", plen ? " " : "", names[i]);
    return site_frame;
}

static void record(void *ret, const char *site, void *const *bt, int nbt)
{
    int i;

    pthread_mutex_lock(&hit_mu);
    last_addr = ret;
    for (i = 0; i < nhit; i++)
        if (hit_addr[i] == ret)
            break;
    if (i == nhit && nhit < MAXHITS)
        hit_addr[nhit++] = ret;
    if (ninj < MAXINJ) {
        inj[ninj].site = site;
        memcpy(inj[ninj].bt, bt, (size_t)nbt * sizeof *bt);
        inj[ninj].nbt = nbt;
        ninj++;
    }
    pthread_mutex_unlock(&hit_mu);
}

/* A failure was injected by this call if the hit counter moved.  The
 * call path is taken here, so that bt[0] is the wrapper and bt[1] the
 * call site. */
#define WRAP_BODY(call)                                         \
    unsigned long before = ferry__fault_hits();                 \
    void *ret = __builtin_return_address(0);                    \
    __typeof__(call) r = call;                                  \
    if (ferry__fault_hits() != before) {                        \
        void *bt[INJ_BT];                                       \
        int nbt = backtrace(bt, INJ_BT);                        \
        record(ret, ferry__fault_last_site(), bt, nbt);         \
    }                                                           \
    return r;

void *__wrap_ferry__malloc(size_t size) { WRAP_BODY(__real_ferry__malloc(size)) }
void *__wrap_ferry__calloc(size_t n, size_t size) { WRAP_BODY(__real_ferry__calloc(n, size)) }
void *__wrap_ferry__realloc(void *p, size_t size) { WRAP_BODY(__real_ferry__realloc(p, size)) }
bool __wrap_ferry__fault_point(const char *site) { WRAP_BODY(__real_ferry__fault_point(site)) }

/* ---- libevent through the hook ------------------------------------------- */

/* Libevent allocations that were failed: by every loop's thread of a
 * runtime's sweeps at once. */
static atomic_ulong ev_faults;

/* A libevent allocation was failed through the hook; with FAULT_VERBOSE,
 * from where. */
static void ev_failed(const char *site)
{
    void *bt[8];
    int n;

    (void)site;
    atomic_fetch_add(&ev_faults, 1);
    if (!getenv("FAULT_VERBOSE"))
        return;
    n = backtrace(bt, 8);
    fprintf(stderr, "fault:   libevent allocation failed, from:\n");
    backtrace_symbols_fd(bt + 1, n - 1, 2);
}

/* Before any libevent allocation of this process (each Criterion test
 * process runs the constructors afresh). */
__attribute__((constructor)) static void route_libevent(void)
{
    tu_libevent_fault_hook(ev_failed);
}

/* ---- sweep machinery ------------------------------------------------------ */

static int failures;   /* checks that failed, reported on the main stack */
static char first_failure[512];

#define FAILF(...) do {                                                        \
        if (!failures++)                                                       \
            snprintf(first_failure, sizeof first_failure, __VA_ARGS__);        \
        fprintf(stderr, "fault: " __VA_ARGS__);                                \
        fputc('\n', stderr);                                                   \
    } while (0)

/*
 * One operation under test.  op() runs it (with the fault armed around it
 * only) and returns its code; undo(rc) gives back what a successful op made
 * and checks the objects still work; teardown() frees what setup() made.
 * absorb: where the op may hide a failure by design (it succeeds anyway):
 * site names of fault points and names of functions on the failing call's
 * path, separated by '|'.
 */
struct sweep {
    const char *name;
    void (*setup)(void);          /* before each run, not armed; may be NULL */
    int  (*op)(void);             /* armed */
    void (*undo)(int rc);         /* after each run, not armed */
    const char *absorb;           /* may absorb failures there; NULL: nowhere */
    bool self_arm;                /* op arms itself with sweep_arm()/sweep_disarm() */
    void (*teardown)(void);       /* after undo; may be NULL */
};

static unsigned long sweeps_run, injected, absorbed;

/* Is `name` one of the '|'-separated names of `list`? */
static bool listed(const char *list, const char *name, size_t n)
{
    const char *p = list;

    if (!list || !n)
        return false;
    while ((p = strstr(p, name)) != NULL) {
        if ((p == list || p[-1] == '|') && (p[n] == 0 || p[n] == '|'))
            return true;
        p++;
    }
    return false;
}

/*
 * A run returned 0 although failures were injected: each of them must have
 * been absorbed at a site the sweep names, by the site name of its fault
 * point or by the function (or a function inlined there) that made the
 * failing allocation.  Returns how many were not; says which.
 */
static int check_absorbed(const struct sweep *sw, unsigned long point, int mode)
{
    int bad = 0;

    pthread_mutex_lock(&hit_mu);
    for (int k = 0; k < ninj; k++) {
        const struct injection *in = &inj[k];
        char site[256], path[1024];
        bool ok = in->site && listed(sw->absorb, in->site, strlen(in->site));

        if (!ok) {
            int f = call_path(in, site, sizeof site, path, sizeof path);

            for (const char *w = site; *w && !ok; w += strcspn(w, " "), w += *w == ' ') {
                size_t n = strcspn(w, " ");
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)n, w);
                ok = listed(sw->absorb, name, strlen(name));
            }
            if (!ok && !bad++)
                FAILF("%s: failing point %lu (%s) was absorbed at %s in %s (%s; path: %s): "
                      "the call returned 0", sw->name, point, mode ? "persistent" : "transient",
                      in->site ? in->site : "?", site, f >= 0 ? describe(in->bt[f]) : "?",
                      path);
        }
        absorbed++;
    }
    pthread_mutex_unlock(&hit_mu);
    return bad;
}

static unsigned long arm_nth;     /* for self-arming ops: 0 = count only */
static bool arm_persist;
static unsigned long arm_count, arm_hits;

static void sweep_arm(void)
{
    if (arm_nth)
        ferry__fault_arm(arm_nth, arm_persist);
    else
        ferry__fault_reset();
}

static void sweep_disarm(void)
{
    arm_count = ferry__fault_count();
    arm_hits = ferry__fault_hits();
    ferry__fault_reset();
}

/* The end of one run: give back what it made, then every allocation made
 * since *base (the start of the sweep) must have been freed.  After a
 * leak *base moves, so that each run is charged with its own. */
static void end_run(const struct sweep *sw, int rc, long *base, const char *what)
{
    long d;

    sw->undo(rc);
    if (sw->teardown)
        sw->teardown();
    /* Completions posted to tu_loop (a pool's last reference) run now. */
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    d = tu_alloc_settle(*base);
    if (d) {
        FAILF("%s: %s: %ld allocations %s", sw->name, what, d < 0 ? -d : d,
              d > 0 ? "leaked" : "freed more than made");
        *base += d;
    }
}

static void run_sweep(const struct sweep *sw)
{
    unsigned long n, i;
    long base = ferry__alloc_live();
    char what[64];
    int rc, mode;

    if (getenv("FAULT_ONLY") && strcmp(getenv("FAULT_ONLY"), sw->name) != 0)
        return;
    if (getenv("FAULT_VERBOSE"))
        fprintf(stderr, "fault: sweep %s\n", sw->name);
    if (sw->setup)
        sw->setup();
    ferry__fault_reset();
    arm_nth = 0;
    arm_count = 0;
    rc = sw->op();
    n = sw->self_arm ? arm_count : ferry__fault_count();
    ferry__fault_reset();
    if (rc != 0)
        FAILF("%s: clean run returned %d", sw->name, rc);
    /* The first runs may grow what tu_loop keeps for good (its inbox has
     * two arrays, each made by the first post that needs it): repeat the
     * clean run until one takes nothing; every run with a failure must
     * then take nothing either. */
    for (int k = 0;; k++) {
        long before = base;

        sw->undo(rc);
        if (sw->teardown)
            sw->teardown();
        ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
        tu_alloc_settle(before);
        base = ferry__alloc_live();
        if (base == before)
            break;
        if (k == 3) {
            FAILF("%s: every clean run keeps %ld more allocations", sw->name, base - before);
            break;
        }
        if (sw->setup)
            sw->setup();
        arm_nth = 0;
        rc = sw->op();
        ferry__fault_reset();
        if (rc != 0)
            FAILF("%s: clean run %d returned %d", sw->name, k + 2, rc);
    }
    for (mode = 0; mode < 2; mode++) {
        for (i = 1; i <= n; i++) {
            unsigned long hits;
            if (sw->setup)
                sw->setup();
            if (getenv("FAULT_VERBOSE"))
                fprintf(stderr, "fault:   point %lu %s\n", i, mode ? "persistent" : "transient");
            arm_nth = i;
            arm_persist = mode == 1;
            arm_hits = 0;
            pthread_mutex_lock(&hit_mu);
            ninj = 0;
            pthread_mutex_unlock(&hit_mu);
            if (!sw->self_arm)
                ferry__fault_arm(i, mode == 1);
            rc = sw->op();
            hits = sw->self_arm ? arm_hits : ferry__fault_hits();
            ferry__fault_reset();
            injected += hits;
            if (rc != 0 && rc != -ENOMEM)
                FAILF("%s: failing point %lu (%s) gave %d, not -ENOMEM", sw->name, i,
                      mode ? "persistent" : "transient", rc);
            if (hits && rc == 0)
                check_absorbed(sw, i, mode);
            if (!hits && rc != 0)
                FAILF("%s: returned %d with no failure injected", sw->name, rc);
            snprintf(what, sizeof what, "failing point %lu (%s)", i,
                     mode ? "persistent" : "transient");
            end_run(sw, rc, &base, what);
        }
    }
    sweeps_run++;
    if (tu_leaks())
        FAILF("%s: leaks found (LeakSanitizer)", sw->name);
}

/* Run fn(arg) as a task on `loop` until it ends; its status. */
static int in_task(ferry_loop *loop, ferry_task_fn fn, void *arg)
{
    ferry_task *t;
    int st = -12345;

    if (ferry_task_spawn(&t, loop, fn, arg, NULL))
        return -99999;
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    return st;
}

/* ---- loop_new ----------------------------------------------------------- */

static ferry_loop *g_loop;

static int op_loop_new(void)
{
    return ferry_loop_new(&g_loop, NULL);
}

static int nop_task(void *arg)
{
    (void)arg;
    return ferry_yield();
}

static void undo_loop_new(int rc)
{
    const char *m;

    if (rc) {
        if (g_loop)
            FAILF("loop_new: failed but set *out");
        return;
    }
    m = event_base_get_method(ferry_loop_base(g_loop));
    if (strcmp(m, "epoll") != 0)
        FAILF("loop_new: succeeded on the \"%s\" backend, not epoll (a failed allocation "
              "was absorbed by libevent's fallback)", m);
    if (in_task(g_loop, nop_task, NULL) != 0)
        FAILF("loop_new: the new loop cannot run a task");
    ferry_loop_free(g_loop);
    g_loop = NULL;
}

/* ---- on tu_loop, from the main stack ------------------------------------ */

static ferry_task *g_task;
static int g_ran;

static int ran_task(void *arg)
{
    (void)arg;
    g_ran++;
    return 0;
}

static int op_spawn_big(void)
{
    /* Not the loop's default size, so no cached stack: a fresh mapping. */
    return ferry_task_spawn(&g_task, tu_loop, ran_task, NULL,
                            &(ferry_task_opts){ .stack_size = 128 * 1024 });
}

static void undo_spawn(int rc)
{
    int before = g_ran, st;

    if (rc == 0) {
        while (ferry_task_try_join(g_task, &st) == -EAGAIN)
            ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
        if (g_ran != before + 1)
            FAILF("spawn: the task did not run");
    }
    if (in_task(tu_loop, nop_task, NULL) != 0)
        FAILF("spawn: the loop cannot run a task after the failure");
}

static void cb_count(void *arg)
{
    (*(int *)arg)++;
}

static int g_cbs;
static ferry_timer *g_timer;

static int op_call_soon(void)
{
    return ferry_call_soon(tu_loop, cb_count, &g_cbs);
}

static int op_call_later(void)
{
    return ferry_call_later(tu_loop, FERRY_SEC(3600), cb_count, &g_cbs, &g_timer);
}

static void undo_call_soon(int rc)
{
    int before = g_cbs;

    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    if (g_cbs != before + (rc == 0))
        FAILF("call_soon: %d callbacks ran, expected %d", g_cbs - before, rc == 0);
}

static void undo_call_later(int rc)
{
    if (rc == 0 && ferry_timer_cancel(g_timer) != 0)
        FAILF("call_later: the timer cannot be cancelled");
    undo_call_soon(1);   /* a call_soon still works */
}

/* ---- a watch of a callback-style library (ferry/watch.h) ------------------- */

static ferry_loop *g_wl;          /* a loop of its own: its first watch adds a part */
static ferry_watch *g_w;
static int g_wp[2] = { -1, -1 };
static int g_w_ready;

static void w_ready(ferry_watch *w, int fd, int events, void *arg)
{
    (void)w;
    (void)fd;
    (void)arg;
    if (events & FERRY_WRITE)
        g_w_ready++;
}

static void w_timeout(ferry_watch *w, void *arg)
{
    (void)w;
    (void)arg;
}

static const ferry_watch_ops g_w_ops = { .ready = w_ready, .timeout = w_timeout };

static void setup_watch(void)
{
    if (pipe2(g_wp, O_NONBLOCK | O_CLOEXEC) != 0)
        FAILF("watch: pipe: %s", strerror(errno));
    if (ferry_loop_new(&g_wl, NULL))
        FAILF("cannot make a loop");
    g_w = NULL;
    g_w_ready = 0;
}

/* Make the first watch of a loop and register a descriptor: the loop's
 * part for watches, the watch, its table and the registration allocate. */
static int op_watch(void)
{
    int rc = ferry_watch_new(&g_w, g_wl, NULL, &g_w_ops, NULL);

    if (rc)
        return rc;
    rc = ferry_watch_fd(g_w, g_wp[1], FERRY_WRITE);
    if (rc) {
        ferry_watch_free(g_w);
        g_w = NULL;
    }
    return rc;
}

static void undo_watch(int rc)
{
    if (rc == 0) {
        /* The write end is writable: the registration must deliver it. */
        for (int i = 0; i < 10 && g_w_ready == 0; i++)
            ferry_loop_run(g_wl, FERRY_RUN_ONCE);
        if (g_w_ready == 0)
            FAILF("watch: registered, but readiness never delivered");
        ferry_watch_fd_remove(g_w, g_wp[1]);
        ferry_watch_free(g_w);
    }
    g_w = NULL;
    ferry_loop_free(g_wl);   /* with the part, if it was made */
    g_wl = NULL;
    close(g_wp[0]);
    close(g_wp[1]);
}

/* ---- primitives, inside a task ------------------------------------------- */

static ferry_queue g_q;
static ferry_flight g_f;
static ferry_keylock g_kl;

static int q_task(void *arg)
{
    int v = 7;
    (void)arg;
    return ferry_queue_put(&g_q, &v);
}

static void setup_queue(void)
{
    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_PRIORITY, (ferry_queue_cmp)(void *)memcmp, NULL);
}

static int cmp_int(const void *a, const void *b, void *arg)
{
    (void)arg;
    return *(const int *)a - *(const int *)b;
}

static void setup_queue2(void)
{
    ferry_queue_init(&g_q, sizeof(int), 0, FERRY_QUEUE_PRIORITY, cmp_int, NULL);
}

static int op_queue_put(void)
{
    return in_task(tu_loop, q_task, NULL);
}

static void undo_queue(int rc)
{
    int v = 0;

    if (ferry_queue_size(&g_q) != (rc == 0 ? 1u : 0u))
        FAILF("queue_put: %zu stored after rc %d", ferry_queue_size(&g_q), rc);
    if (rc == 0 && (ferry_queue_try_get(&g_q, &v) != 0 || v != 7))
        FAILF("queue_put: the stored item is wrong");
    if (in_task(tu_loop, q_task, NULL) != 0)
        FAILF("queue_put: the queue does not work after the failure");
    if (ferry_queue_destroy(&g_q) != 0)
        FAILF("queue: destroy failed");
}

static int fl_fn(void *arg, void *out, size_t size)
{
    (void)arg;
    *(int *)out = 42;
    (void)size;
    return 0;
}

static int fl_task(void *arg)
{
    int key = (int)(intptr_t)arg, out = 0, rc;

    rc = ferry_flight_do(&g_f, &key, sizeof key, fl_fn, NULL, &out, sizeof out);
    return rc == 0 && out != 42 ? -1000 : rc;
}

static void setup_flight(void)
{
    ferry_flight_init(&g_f);
}

static int op_flight(void)
{
    return in_task(tu_loop, fl_task, (void *)1);
}

static void undo_flight(int rc)
{
    (void)rc;
    if (ferry_flight_count(&g_f) != 0)
        FAILF("flight: %zu calls left", ferry_flight_count(&g_f));
    if (in_task(tu_loop, fl_task, (void *)2) != 0)
        FAILF("flight: does not work after the failure");
    if (ferry_flight_destroy(&g_f) != 0)
        FAILF("flight: destroy failed");
}

#define NKEYS 40

static int kl_acquire_task(void *arg)
{
    int key = (int)(intptr_t)arg;
    return ferry_keylock_acquire(&g_kl, &key, sizeof key);
}

static int kl_release_task(void *arg)
{
    int key = (int)(intptr_t)arg;
    return ferry_keylock_release(&g_kl, &key, sizeof key);
}

static void setup_kl(void)
{
    ferry_keylock_init(&g_kl);
}

static int kl_both_task(void *arg);

static int op_kl(void)
{
    return in_task(tu_loop, kl_both_task, (void *)5);
}

static int kl_both_task(void *arg)
{
    int rc = kl_acquire_task(arg);
    return rc ? rc : kl_release_task(arg);
}

static void undo_kl(int rc)
{
    if (ferry_keylock_count(&g_kl) != 0)
        FAILF("keylock: %zu keys left after rc %d", ferry_keylock_count(&g_kl), rc);
    if (in_task(tu_loop, kl_both_task, (void *)6) != 0)
        FAILF("keylock: does not work after the failure");
    if (ferry_keylock_destroy(&g_kl) != 0)
        FAILF("keylock: destroy failed");
}

/* Many keys held, then all released: the table shrinks, and a failed
 * shrink keeps the larger table (absorbed by design). */
static int kl_many_task(void *arg)
{
    int rc = 0;
    (void)arg;
    for (int k = 0; k < NKEYS && !rc; k++)
        rc = ferry_keylock_acquire(&g_kl, &k, sizeof k);
    return rc;
}

static void sweep_arm(void);
static void sweep_disarm(void);

/* Takes NKEYS keys (not armed), then releases them all (armed). */
static int kl_release_all_task(void *arg)
{
    int rc = kl_many_task(arg);
    if (rc)
        return -1000 + rc;
    sweep_arm();
    for (int k = 0; k < NKEYS && !rc; k++)
        rc = ferry_keylock_release(&g_kl, &k, sizeof k);
    sweep_disarm();
    return rc;
}

static void setup_kl_many(void)
{
    ferry_keylock_init(&g_kl);
}

static int op_kl_release_all(void)
{
    return in_task(tu_loop, kl_release_all_task, NULL);
}

static void undo_kl_many(int rc)
{
    if (rc != 0 || ferry_keylock_count(&g_kl) != 0)
        FAILF("keylock shrink: rc %d, %zu keys left", rc, ferry_keylock_count(&g_kl));
    if (ferry_keylock_destroy(&g_kl) != 0)
        FAILF("keylock shrink: destroy failed");
}

/* ---- bridge ---------------------------------------------------------------- */

static ferry_pool *g_pool;

static int op_pool_new(void)
{
    return ferry_pool_new(&g_pool, &(ferry_pool_opts){ .threads = 3, .capacity = 4 });
}

static int job_ret7(void *arg)
{
    (void)arg;
    return 7;
}

static int to_thread_task(void *arg)
{
    return ferry_to_thread(arg, job_ret7, NULL);
}

static void undo_pool_new(int rc)
{
    if (rc == 0) {
        if (in_task(tu_loop, to_thread_task, g_pool) != 7)
            FAILF("pool_new: the pool does not run jobs");
        ferry_pool_free(g_pool);
    } else if (g_pool) {
        FAILF("pool_new: failed but set *out");
    }
    g_pool = NULL;
}

/* A fresh pool for every run: a pool may keep freed jobs for reuse, and
 * then only its first job would allocate. */
static void setup_pool(void)
{
    if (ferry_pool_new(&g_pool, &(ferry_pool_opts){ .threads = 2, .capacity = 4 }))
        FAILF("cannot make a pool");
}

static void teardown_pool(void)
{
    ferry_pool_free(g_pool);
    g_pool = NULL;
}

static int op_to_thread(void)
{
    int rc = in_task(tu_loop, to_thread_task, g_pool);
    return rc == 7 ? 0 : rc;
}

static void undo_nothing(int rc)
{
    (void)rc;
}

static int abandon_task(void *arg)
{
    return ferry_to_thread_abandon(arg, job_ret7, NULL, NULL);
}

static int op_abandon(void)
{
    int rc = in_task(tu_loop, abandon_task, g_pool);
    return rc == 7 ? 0 : rc;
}

static int g_done, g_done_status;

static int done_cb(void *arg, int status)
{
    (void)arg;
    g_done++;
    g_done_status = status;
    return 0;
}

static int op_submit(void)
{
    return ferry_pool_submit(g_pool, job_ret7, NULL, tu_loop, done_cb, NULL);
}

static void undo_submit(int rc)
{
    int before = g_done;

    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);   /* the reserved completion keeps it running */
    if (g_done != before + (rc == 0) || (rc == 0 && g_done_status != 7))
        FAILF("pool_submit: %d completions (status %d) after rc %d", g_done - before,
              g_done_status, rc);
}

/* A fresh loop per run: its inbox has not grown yet. */
static ferry_loop *g_bl;

static void setup_fresh_loop(void)
{
    if (ferry_loop_new(&g_bl, NULL))
        FAILF("cannot make a loop");
}

static int op_post(void)
{
    return ferry_loop_call_soon_threadsafe(g_bl, cb_count, &g_cbs);
}

static void undo_post(int rc)
{
    int before = g_cbs;
    ferry_inbox_stats st;

    ferry_loop_run(g_bl, FERRY_RUN_ONCE);
    ferry_loop_run(g_bl, FERRY_RUN_DEFAULT);
    if (g_cbs != before + (rc == 0))
        FAILF("call_soon_threadsafe: %d callbacks ran after rc %d", g_cbs - before, rc);
    if (ferry_loop_call_soon_threadsafe(g_bl, cb_count, &g_cbs) != 0)
        FAILF("call_soon_threadsafe: posting fails after the failure");
    ferry_loop_run(g_bl, FERRY_RUN_DEFAULT);
    if (g_cbs != before + (rc == 0) + 1)
        FAILF("call_soon_threadsafe: a later post did not run");
    (void)st;
    ferry_loop_free(g_bl);
    g_bl = NULL;
}

/* Posting from another thread: the eventfd write can fail; the post must
 * still run (woken another way) and the failure be counted. */
struct post_arg {
    ferry_loop *loop;
    int         rc;
};

static void *post_thread(void *arg)
{
    struct post_arg *p = arg;
    p->rc = ferry_loop_call_soon_threadsafe(p->loop, cb_count, &g_cbs);
    return NULL;
}

static int op_post_thread(void)
{
    struct post_arg p = { g_bl, -1 };
    pthread_t th;

    pthread_create(&th, NULL, post_thread, &p);
    pthread_join(th, NULL);
    return p.rc;
}

static void undo_post_thread(int rc)
{
    ferry_inbox_stats st;
    int before = g_cbs;

    ferry_loop_run(g_bl, FERRY_RUN_DEFAULT);
    if (g_cbs != before + (rc == 0))
        FAILF("post from a thread: %d callbacks ran after rc %d", g_cbs - before, rc);
    if (ferry_loop_inbox_stats_get(g_bl, &st) == 0 && rc == 0 && st.wakeups == 0)
        FAILF("post from a thread: no wakeup counted");
    ferry_loop_free(g_bl);
    g_bl = NULL;
}

static ferry_chan *g_ch;

static int op_chan_new(void)
{
    return ferry_chan_new(&g_ch, 4);
}

static void undo_chan(int rc)
{
    void *item = NULL;

    if (rc == 0) {
        if (ferry_chan_try_send(g_ch, &g_ch) != 0 || ferry_chan_try_recv(g_ch, &item) != 0 ||
            item != &g_ch)
            FAILF("chan_new: the channel does not work");
        ferry_chan_free(g_ch);
    } else if (g_ch) {
        FAILF("chan_new: failed but set *out");
    }
    g_ch = NULL;
}

/* A future from a foreign thread. */
static ferry_future *g_fut;

static int ret5(void *arg)
{
    (void)arg;
    return 5;
}

static void *future_thread(void *arg)
{
    struct post_arg *p = arg;
    p->rc = ferry_loop_call_threadsafe(p->loop, ret5, NULL, &g_fut);
    return NULL;
}

static int op_future(void)
{
    struct post_arg p = { tu_loop, -1 };
    pthread_t th;

    g_fut = NULL;
    pthread_create(&th, NULL, future_thread, &p);
    pthread_join(th, NULL);
    return p.rc;
}

static void undo_future(int rc)
{
    if (rc == 0) {
        for (int i = 0; i < 1000 && !ferry_future_done(g_fut); i++)
            ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
        if (!ferry_future_done(g_fut))
            FAILF("future: never completed");
        ferry_future_free(g_fut);
    }
    g_fut = NULL;
}

/* ---- signal subscriptions ---------------------------------------------------- */

/* SIGUSR1 and SIGUSR2 are ignored in this process: a failed subscription
 * must leave them so, and a signal raised after a failure is harmless. */
static ferry_sigsub *g_sub, *g_sub2;
static int g_nfds;                /* open descriptors before the fresh loop */

static bool ignored(int signum)
{
    struct sigaction sa;

    return sigaction(signum, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN;
}

/* A fresh loop with no signal port yet, and no loop of the process
 * subscribed: the first subscription makes the port and the table. */
static void setup_sig_loop(void)
{
    g_nfds = tu_open_fds();
    g_sub = g_sub2 = NULL;
    setup_fresh_loop();
}

static int op_sigsub_first(void)
{
    static const int both[] = { SIGUSR1, SIGUSR2 };

    return ferry_sigsub_new(&g_sub, g_bl, both, 2);
}

/* The loop already has a subscription (to SIGUSR2). */
static void setup_sig_loop_subscribed(void)
{
    static const int usr2[] = { SIGUSR2 };

    setup_sig_loop();
    if (ferry_sigsub_new(&g_sub2, g_bl, usr2, 1))
        FAILF("cannot subscribe");
}

static int op_sigsub_more(void)
{
    static const int usr1[] = { SIGUSR1 };

    return ferry_sigsub_new(&g_sub, g_bl, usr1, 1);
}

/* Checks what every run must leave: the dispositions, no descriptor. */
static void sig_loop_done(void)
{
    if (!ignored(SIGUSR1) || !ignored(SIGUSR2))
        FAILF("sigsub: a disposition was not put back");
    ferry_loop_free(g_bl);
    g_bl = NULL;
    g_sub = g_sub2 = NULL;
    if (tu_open_fds() != g_nfds)
        FAILF("sigsub: %d descriptors open, %d before", tu_open_fds(), g_nfds);
}

static void undo_sigsub(int rc)
{
    int signum = 0;

    if (rc != 0 && g_sub)
        FAILF("sigsub_new: failed but set *out");
    if (rc != 0 && g_sub2 == NULL && (!ignored(SIGUSR1) || !ignored(SIGUSR2)))
        FAILF("sigsub_new: failed but changed a disposition");
    if (rc == 0) {
        raise(SIGUSR1);
        if (ferry_sigsub_try_recv(g_sub, &signum) != 0 || signum != SIGUSR1)
            FAILF("sigsub_new: the subscription does not receive (%d)", signum);
    }
    if (ferry_sigsub_free(g_sub) != 0 || ferry_sigsub_free(g_sub2) != 0)
        FAILF("sigsub: free failed");
    sig_loop_done();
}

/* ferry_loop_dump_on_signal() on a loop without a signal port: the stream
 * on the duplicate, the port, the table.  After a failure nothing is left
 * (no disposition changed, no descriptor); after success the signal
 * dumps. */
static int g_dump_pipe[2] = { -1, -1 };

/* Descriptors open on the same file as `fd` (itself included). */
static int same_file_fds(int fd)
{
    struct stat a, b;
    int n = 0;

    if (fstat(fd, &a) != 0)
        return -1;
    for (int i = 0; i < 1024; i++)
        n += fstat(i, &b) == 0 && b.st_dev == a.st_dev && b.st_ino == a.st_ino;
    return n;
}

static void setup_dump_signal(void)
{
    setup_sig_loop();
    if (pipe(g_dump_pipe) != 0)
        FAILF("dump_on_signal: pipe");
}

static int op_dump_signal(void)
{
    return ferry_loop_dump_on_signal(g_bl, SIGUSR1, g_dump_pipe[1]);
}

static void undo_dump_signal(int rc)
{
    char buf[64];

    if (rc != 0 && !ignored(SIGUSR1))
        FAILF("dump_on_signal: failed but changed the disposition");
    if (rc == 0) {
        raise(SIGUSR1);
        if (ferry_loop_run(g_bl, FERRY_RUN_ONCE) != 0 ||
            read(g_dump_pipe[0], buf, sizeof buf) <= 0)
            FAILF("dump_on_signal: the signal printed no dump");
    }
    /* The pipe's two ends, and no duplicate left (the signal port a failed
     * call made may stay until the loop is freed, as sigsub_new's does). */
    if (rc != 0 && same_file_fds(g_dump_pipe[1]) != 2)
        FAILF("dump_on_signal: failed and left a duplicate of the descriptor (%d open)",
              same_file_fds(g_dump_pipe[1]));
    /* Off: the disposition goes back as the last subscription's would. */
    if (ferry_loop_dump_on_signal(g_bl, 0, -1) != 0)
        FAILF("dump_on_signal: turning it off failed");
    close(g_dump_pipe[0]);
    close(g_dump_pipe[1]);
    sig_loop_done();
}

static int raiser_task(void *arg)
{
    (void)arg;
    raise(SIGUSR1);
    return 0;
}

/* ferry_select() arming a channel case (its node) and an fd case (its
 * event) and then ending on its deadline case: -ENOMEM or the deadline,
 * and then nothing is left in the channel's queue. */
static ferry_chan *g_sel_ch;
static int g_sel_fds[2] = { -1, -1 };

static void setup_select(void)
{
    if (ferry_chan_new(&g_sel_ch, 1) != 0 || pipe(g_sel_fds) != 0)
        FAILF("select: setup");
}

static int select_task(void *arg)
{
    void *got = NULL;
    ferry_case c[3] = { FERRY_CASE_RECV_INIT(g_sel_ch, &got),
                        FERRY_CASE_FD_INIT(g_sel_fds[0], FERRY_READ),
                        FERRY_CASE_DEADLINE_INIT(0) };
    int rc;

    (void)arg;
    /* Far enough that the first pass, however slow the build, finds the
     * deadline ahead and the cases get armed (the allocations swept). */
    c[2].at = ferry_now() + tu_ms(20);
    sweep_arm();
    rc = ferry_select(c, 3, 0);
    sweep_disarm();
    return rc == 2 ? 0 : rc;
}

/* ---- a runtime of two loops ------------------------------------------------ */

/* Made on this thread (its loop 0 is a second loop of the thread, beside
 * tu_loop), loop 1 on a thread of its own: both threads' allocations are
 * swept. */
static ferry_runtime *g_rt;

static int op_runtime_new(void)
{
    g_rt = NULL;
    return ferry_runtime_new(&g_rt, &(ferry_runtime_opts){ .loops = 2 });
}

static int rt_noop(void *arg, void **result)
{
    (void)arg;
    *result = arg;
    return 3;
}

/* Both flavours of the call, to loop 1 and inline. */
static int rt_check_main(void *arg)
{
    void *res = NULL;
    int st = 0, bad = 0;

    (void)arg;
    for (unsigned i = 0; i < 2; i++) {
        bad |= ferry_runtime_call(NULL, i, rt_noop, &g_rt, 0, &st, &res) || st != 3 ||
               res != &g_rt;
        bad |= ferry_runtime_call(NULL, i, rt_noop, &g_rt, FERRY_CALL_CALLBACK, &st, &res) ||
               st != 3;
    }
    return bad;
}

static void undo_runtime_new(int rc)
{
    int st = -1;

    if (rc == 0) {
        if (ferry_runtime_run(g_rt, rt_check_main, NULL, &st) != 0 || st != 0)
            FAILF("runtime_new: the runtime's calls do not work after it");
        ferry_runtime_free(g_rt);
    } else if (g_rt) {
        FAILF("runtime_new: failed but set *out");
    }
    g_rt = NULL;
}

static void setup_runtime(void)
{
    if (ferry_runtime_new(&g_rt, &(ferry_runtime_opts){ .loops = 2 }) != 0)
        FAILF("runtime: setup");
}

static void teardown_runtime(void)
{
    ferry_runtime_free(g_rt);
    g_rt = NULL;
}

static int rt_on_all_fn(void *arg)
{
    (void)arg;
    return ferry_yield() ? -1 : 0;
}

/* ferry_runtime_on_all(): its children and the tasks of its calls. */
static int rt_on_all_main(void *arg)
{
    int st[2] = { -1, -1 }, rc;

    (void)arg;
    sweep_arm();
    rc = ferry_runtime_on_all(NULL, rt_on_all_fn, NULL, st);
    sweep_disarm();
    return rc ? rc : st[0] | st[1];
}

static int op_runtime_on_all(void)
{
    int st = -1, rc = ferry_runtime_run(g_rt, rt_on_all_main, NULL, &st);

    return rc ? rc : st;
}

static void undo_runtime_calls(int rc)
{
    int st = -1;

    (void)rc;
    if (ferry_runtime_run(g_rt, rt_check_main, NULL, &st) != 0 || st != 0)
        FAILF("runtime: the calls do not work after a failure");
}

/* A select on a future of loop 1's task: its node is allocated. */
static atomic_int rt_gate, rt_gated_runs;

static int rt_gated(void *arg)
{
    (void)arg;
    atomic_store(&rt_gated_runs, 1);
    while (!atomic_load(&rt_gate))
        if (ferry_sleep(FERRY_MSEC(1)))
            return -1;
    return 4;
}

static int rt_select_main(void *arg)
{
    ferry_future *f;
    ferry_case c[2];
    int rc, st = 0;

    (void)arg;
    atomic_store(&rt_gate, 0);
    atomic_store(&rt_gated_runs, 0);
    if (ferry_runtime_spawn(NULL, 1, rt_gated, NULL, NULL, &f))
        return -1000;
    /* Its task made and running before anything fails. */
    while (!atomic_load(&rt_gated_runs))
        ferry_sleep(FERRY_USEC(200));
    c[0] = FERRY_CASE_FUTURE_INIT(f);
    c[1] = FERRY_CASE_DEADLINE_INIT(ferry_now() + tu_ms(20));
    sweep_arm();
    rc = ferry_select(c, 2, 0);
    sweep_disarm();
    atomic_store(&rt_gate, 1);
    if (ferry_future_await(f, &st) || st != 4)
        rc = -2000;
    ferry_future_free(f);
    return rc == 1 ? 0 : rc;
}

static int op_runtime_select(void)
{
    int st = -1, rc = ferry_runtime_run(g_rt, rt_select_main, NULL, &st);

    return rc ? rc : st;
}

/* ---- a port served by every loop of the runtime ---------------------------- */

static ferry_runtime_listener *g_rl;

static int op_runtime_listen(void)
{
    ferry_runtime_listen_opts lo = { .mode = FERRY_SPREAD_BALANCED, .acceptor = 1 };

    g_rl = NULL;
    return ferry_runtime_listen(&g_rl, g_rt, "127.0.0.1", 0, &lo);
}

static void undo_runtime_listen(int rc)
{
    if (rc == 0 && ferry_runtime_listener_port(g_rl) <= 0)
        FAILF("runtime_listen: no port");
    if (rc != 0 && g_rl)
        FAILF("runtime_listen: failed but set *out");
    ferry_runtime_listener_free(g_rl);
    g_rl = NULL;
}

/* A runtime of two loops and a balanced listener whose acceptor is loop
 * 1: a connection is handed over to loop 0 (the less loaded on a tie is
 * the round-robin candidate, loop 0 first). */
static void setup_rl(void)
{
    setup_runtime();
    if (op_runtime_listen() != 0)
        FAILF("runtime_listen: setup");
}

static void teardown_rl(void)
{
    ferry_runtime_listener_free(g_rl);
    g_rl = NULL;
    teardown_runtime();
}

static atomic_int rl_served, rl_ended;

static int rl_conn(ferry_stream *s, void *arg)
{
    (void)s;
    (void)arg;
    atomic_store(&rl_served, 1);
    return 0;                    /* the stream is closed: the client sees the end */
}

static int rl_serve(void *arg)
{
    int rc;

    (void)arg;
    rc = ferry_runtime_listener_serve(g_rl, rl_conn, NULL);
    atomic_store(&rl_ended, 1);
    return rc;
}

/* Serve one connection: accepted on loop 1, handed to loop 0, its task
 * run there.  A connection dropped for want of memory is closed (the
 * client sees the end without it being served): -ENOMEM, as
 * ferry_listener_accept() reports one. */
static int rl_main(void *arg)
{
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons((uint16_t)ferry_runtime_listener_port(g_rl)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int64_t until;
    ferry_task *t;
    int rc, st = 0, fd;
    char b;

    (void)arg;
    atomic_store(&rl_served, 0);
    atomic_store(&rl_ended, 0);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        return -1000;
    sweep_arm();
    rc = ferry_task_spawn(&t, NULL, rl_serve, NULL, NULL);
    if (rc == 0) {
        until = ferry_now() + tu_ms(2000);
        while (!atomic_load(&rl_served) && !atomic_load(&rl_ended) && ferry_now() < until &&
               recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && errno == EAGAIN)
            if (ferry_sleep(FERRY_MSEC(1)) != 0)
                ferry_yield();
        ferry_task_cancel(t);
        ferry_task_join(t, &st);
    }
    sweep_disarm();
    close(fd);
    if (rc)
        return rc;
    if (st != -ECANCELED)
        return st;
    return atomic_load(&rl_served) ? 0 : -ENOMEM;
}

static int op_runtime_serve(void)
{
    int st = -1, rc = ferry_runtime_run(g_rt, rl_main, NULL, &st);

    return rc ? rc : st;
}

/* ---- task-local values --------------------------------------------------- */

/* A value per task, and the copies children inherit: the key's refs count
 * the values alive, and every one is destroyed once the tasks end. */
static int fs_refs;
static int fs_child_saw;

static void fs_destroy(void *v)
{
    (void)v;
    fs_refs--;
}

static void *fs_inherit(void *v)
{
    fs_refs++;
    return v;
}

static const ferry_task_key fs_key = { .destructor = fs_destroy, .inherit = fs_inherit };

static int fs_child(void *arg)
{
    (void)arg;
    fs_child_saw = ferry_task_local_get(&fs_key) == &fs_refs;
    return 0;
}

static int local_set_task(void *arg)
{
    int rc;

    (void)arg;
    sweep_arm();
    rc = ferry_task_local_set(&fs_key, &fs_refs);
    sweep_disarm();
    if (rc == 0) {
        fs_refs++;
        if (ferry_task_local_get(&fs_key) != &fs_refs)
            return -1001;
    } else if (ferry_task_local_get(&fs_key) != NULL) {
        return -1002;                   /* a failed set changed nothing */
    }
    return rc;
}

static int op_local_set(void)
{
    return in_task(tu_loop, local_set_task, NULL);
}

static int local_inherit_task(void *arg)
{
    ferry_task *c;
    int rc;

    (void)arg;
    if (ferry_task_local_set(&fs_key, &fs_refs) != 0)
        return -1003;
    fs_refs++;
    fs_child_saw = -1;
    sweep_arm();
    rc = ferry_task_spawn(&c, NULL, fs_child, NULL, NULL);
    sweep_disarm();
    if (rc == 0) {
        ferry_task_join(c, NULL);
        if (fs_child_saw != 1)
            return -1004;
    }
    return rc;
}

static int op_local_inherit(void)
{
    return in_task(tu_loop, local_inherit_task, NULL);
}

static int local_plain_task(void *arg)
{
    (void)arg;
    if (ferry_task_local_set(&fs_key, &fs_refs) != 0)
        return -1;
    fs_refs++;
    return ferry_task_local_get(&fs_key) == &fs_refs ? 0 : -2;
}

static void undo_local(int rc)
{
    if (rc < -1000)
        FAILF("task-local values: check %d failed", rc);
    if (fs_refs != 0)
        FAILF("task-local values: %d values were not destroyed", fs_refs);
    if (in_task(tu_loop, local_plain_task, NULL) != 0 || fs_refs != 0)
        FAILF("task-local values: a task cannot set one after the failure");
}

static int op_select(void)
{
    return in_task(tu_loop, select_task, NULL);
}

static void undo_select(int rc)
{
    void *item = NULL;

    (void)rc;
    if (ferry_chan_try_send(g_sel_ch, &g_sel_ch) != 0 ||
        ferry_chan_try_recv(g_sel_ch, &item) != 0 || item != &g_sel_ch)
        FAILF("select: the channel does not work after it");
    ferry_chan_free(g_sel_ch);
    g_sel_ch = NULL;
    close(g_sel_fds[0]);
    close(g_sel_fds[1]);
}

/* ferry_wait_signal() armed around the call only; the raiser runs once it
 * waits (or after it failed: the signal is ignored then). */
static int wait_signal_task(void *arg)
{
    ferry_task *r;
    int rc;

    (void)arg;
    if (ferry_task_spawn(&r, NULL, raiser_task, NULL, NULL))
        return -1000;
    sweep_arm();
    rc = ferry_wait_signal(SIGUSR1);
    sweep_disarm();
    ferry_task_join(r, NULL);
    return rc;
}

static int op_wait_signal(void)
{
    return in_task(g_bl, wait_signal_task, NULL);
}

static void undo_wait_signal(int rc)
{
    (void)rc;
    sig_loop_done();
}

/* A stack with a mapping of its own, unmapped when its task is joined:
 * munmap() may fail (at vm.max_map_count); the mapping is kept and
 * unmapped later, at the latest when the loop is freed. */
static void *g_stack_page;

static int note_stack_page(void *arg)
{
    char here;

    (void)arg;
    g_stack_page = (void *)((uintptr_t)&here & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1));
    return 0;
}

static int op_stack_unmap(void)
{
    ferry_task *t;
    int rc, st;

    g_stack_page = NULL;
    rc = ferry_task_spawn(&t, g_bl, note_stack_page, NULL,
                          &(ferry_task_opts){ .stack_size = 128 * 1024 });
    if (rc)
        return rc;
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(g_bl, FERRY_RUN_DEFAULT);
    return 0;
}

static void undo_stack_unmap(int rc)
{
    unsigned char v;

    if (in_task(g_bl, nop_task, NULL) != 0)
        FAILF("stack unmap: the loop cannot run a task after the failure");
    ferry_loop_free(g_bl);
    g_bl = NULL;
    if (rc == 0 && (!g_stack_page || mincore(g_stack_page, 1, &v) == 0 || errno != ENOMEM))
        FAILF("stack unmap: the task's stack is still mapped after ferry_loop_free()");
}

/* ---- a turn under schedule fuzzing --------------------------------------------- */

static ferry_loop *g_fz;
static int g_fz_ran;

static int fz_task(void *arg)
{
    (void)arg;
    g_fz_ran++;
    return 0;
}

/* A fuzzed loop with two tasks ready: its first turn shuffles them. */
static void setup_fuzz_turn(void)
{
    ferry_loop_opts o = { .fuzz_seed = 1 };

    g_fz_ran = 0;
    if (ferry_loop_new(&g_fz, &o) || ferry_task_spawn(NULL, g_fz, fz_task, NULL, NULL) ||
        ferry_task_spawn(NULL, g_fz, fz_task, NULL, NULL))
        FAILF("cannot make a fuzzed loop with two tasks");
}

static int op_fuzz_turn(void)
{
    return ferry_loop_run(g_fz, FERRY_RUN_DEFAULT);
}

static void undo_fuzz_turn(int rc)
{
    if (rc == 0 && g_fz_ran != 2)
        FAILF("fuzzed turn: %d of 2 tasks ran", g_fz_ran);
    ferry_loop_free(g_fz);
    g_fz = NULL;
}

/* ---- streams, listeners, accept, connect --------------------------------------- */

static int g_sp[2];
static ferry_stream *g_st;
static ferry_listener *g_lis;
static int g_fds_before;
static int g_client;

/* tu_loop makes its epoll set at its first stream and keeps it (one
 * descriptor): make it before any sweep counts descriptors. */
static void warm_tu_loop(void)
{
    static bool warm;
    ferry_stream *s;
    int sp[2];

    if (warm || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
        return;
    if (ferry_stream_open(&s, tu_loop, sp[0], NULL) == 0) {
        ferry_stream_close(s);
        warm = true;
    } else {
        close(sp[0]);
    }
    close(sp[1]);
}

/* A socketpair, its peer end holding "0123456789abcdef...\n" (99 bytes,
 * the last a newline). */
static void setup_pair(void)
{
    char data[99];

    warm_tu_loop();
    g_fds_before = tu_open_fds();
    g_st = NULL;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, g_sp) != 0)
        FAILF("socketpair");
    for (int i = 0; i < 98; i++)
        data[i] = (char)('0' + i % 10);
    data[98] = '\n';
    if (write(g_sp[1], data, sizeof data) != (ssize_t)sizeof data)
        FAILF("write");
}

/* On a fresh loop: the first registration makes the loop's epoll set. */
static void setup_pair_fresh_loop(void)
{
    setup_pair();
    setup_fresh_loop();
}

static int op_stream_open(void)
{
    return ferry_stream_open(&g_st, g_bl, g_sp[0], NULL);
}

/* Close what a run made; no descriptor may be left. */
static void pair_done(void)
{
    if (g_st)
        ferry_stream_close(g_st);
    else if (g_sp[0] >= 0)
        close(g_sp[0]);
    close(g_sp[1]);
    g_st = NULL;
    if (tu_open_fds() != g_fds_before)
        FAILF("stream: %d descriptors open, %d before", tu_open_fds(), g_fds_before);
}

static void undo_stream_open(int rc)
{
    if (rc != 0 && g_st)
        FAILF("stream_open: failed but set *out");
    if (rc != 0 && fcntl(g_sp[0], F_GETFD) == -1)
        FAILF("stream_open: failed but closed the caller's descriptor");
    if (g_st) {
        ferry_stream_close(g_st);    /* closes g_sp[0] */
        g_sp[0] = -1;
    }
    g_st = NULL;
    ferry_loop_free(g_bl);
    g_bl = NULL;
    pair_done();
}

#if FERRY_HAVE_URING
/* The same on a fresh loop that asks for io_uring (FERRY_IO=uring): the
 * first registration makes the ring.  A ring that cannot be made (its
 * memory, or libevent's for its event) leaves the loop on epoll, the
 * stream opened: absorbed by design. */
static void setup_pair_uring_loop(void)
{
    setenv("FERRY_IO", "uring", 1);
    setup_pair_fresh_loop();
}

static void undo_stream_open_uring(int rc)
{
    undo_stream_open(rc);
    unsetenv("FERRY_IO");
}

/* A stream on a loop whose ring is made (not armed). */
static void setup_stream_uring(void)
{
    setup_pair_uring_loop();
    if (ferry_stream_open(&g_st, g_bl, g_sp[0], NULL) != 0)
        FAILF("stream_open on the ring");
}

static int uring_write_task(void *arg)
{
    size_t n = 0;
    int rc;

    (void)arg;
    sweep_arm();
    rc = ferry_stream_write(g_st, "hello", 5, &n);
    sweep_disarm();
    return rc;
}

static int op_stream_write_uring(void)
{
    return in_task(g_bl, uring_write_task, NULL);
}

static void undo_stream_uring(int rc)
{
    (void)rc;
    ferry_stream_close(g_st); /* closes g_sp[0] */
    g_st = NULL;
    g_sp[0] = -1;
    ferry_loop_free(g_bl);
    g_bl = NULL;
    unsetenv("FERRY_IO");
    pair_done();
}

static ferry_listener *g_ulis;

static int op_tcp_listen_uring(void)
{
    return ferry_tcp_listen(&g_ulis, g_bl, "127.0.0.1", 0, NULL);
}

static void undo_listen_uring(int rc)
{
    if (rc != 0 && g_ulis)
        FAILF("tcp_listen: failed but set *out");
    if (g_ulis && ferry_listener_close(g_ulis) != 0)
        FAILF("listener_close");
    g_ulis = NULL;
    undo_stream_uring(0);
}

/* A burst of connections queued before the first accept: the ring's
 * multishot accept takes them all at once, past the listener's queue,
 * which grows (an accepted connection has nowhere else to go). */
#define BURST 40
static int g_burst[BURST];
static ferry_stream *g_bst[BURST];

static void setup_accept_burst_uring(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

    setup_stream_uring();
    if (ferry_tcp_listen(&g_ulis, g_bl, "127.0.0.1", 0, NULL))
        FAILF("tcp_listen on the ring");
    a.sin_port = htons((uint16_t)ferry_listener_port(g_ulis));
    for (int i = 0; i < BURST; i++) {
        g_burst[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (g_burst[i] < 0 || connect(g_burst[i], (struct sockaddr *)&a, sizeof a) != 0)
            FAILF("connect");
    }
}

static int accept_burst_task(void *arg)
{
    int rc = 0;

    (void)arg;
    sweep_arm();
    for (int i = 0; i < BURST && rc == 0; i++)
        rc = ferry_listener_accept(g_ulis, &g_bst[i], NULL);
    sweep_disarm();
    return rc;
}

static int op_accept_burst_uring(void)
{
    return in_task(g_bl, accept_burst_task, NULL);
}

static void undo_accept_burst_uring(int rc)
{
    (void)rc;
    for (int i = 0; i < BURST; i++) {
        if (g_bst[i])
            ferry_stream_close(g_bst[i]);
        g_bst[i] = NULL;
        close(g_burst[i]);
    }
    undo_listen_uring(0);
}
#endif

/* A stream over the pair (not armed), with a read buffer of `bufsize`. */
static void setup_pair_stream(size_t bufsize)
{
    setup_pair();
    if (ferry_stream_open(&g_st, tu_loop, g_sp[0], &(ferry_stream_opts){ .read_buffer = bufsize }))
        FAILF("stream_open");
}

static void setup_stream_read(void)
{
    setup_pair_stream(0);
}

static void setup_stream_grow(void)
{
    setup_pair_stream(16);
}

static size_t g_got, g_buffered;

/* The first read allocates the buffer. */
static int stream_read_task(void *arg)
{
    char line[128];
    int rc;

    (void)arg;
    sweep_arm();
    rc = ferry_stream_read_until(g_st, "\n", 1, line, sizeof line, &g_got);
    sweep_disarm();
    g_buffered = ferry_stream_buffered(g_st);
    return rc;
}

static int op_stream_read(void)
{
    return in_task(tu_loop, stream_read_task, NULL);
}

/* A read of one byte fills the 16-byte buffer (not armed); reading the
 * rest exactly grows it. */
static int stream_grow_task(void *arg)
{
    char buf[128];
    size_t n;
    int rc;

    (void)arg;
    if (ferry_stream_read(g_st, buf, 1, &n) != 0 || n != 1)
        return -1000;
    sweep_arm();
    rc = ferry_stream_read_exactly(g_st, buf, 98, &g_got);
    sweep_disarm();
    g_buffered = ferry_stream_buffered(g_st);
    return rc;
}

static int op_stream_grow(void)
{
    return in_task(tu_loop, stream_grow_task, NULL);
}

/* All or nothing: a failed read consumed nothing. */
static void undo_stream_read(int rc)
{
    if (rc == 0 && g_got != 99 && g_got != 98)    /* the line; the rest after one byte */
        FAILF("stream read: got %zu bytes", g_got);
    if (rc != 0 && (g_got != 0 || (g_buffered != 0 && g_buffered != 15)))
        FAILF("stream read: failed with %d but got %zu, %zu buffered", rc, g_got, g_buffered);
    pair_done();
}

#if FERRY_HAVE_TLS
/* ---- TLS: a context; the handshake's state and the bytes read before it -- */

static ferry_tls_ctx *g_tls;

static int op_tls_ctx_new(void)
{
    return ferry_tls_ctx_new(&g_tls, FERRY_TLS_CLIENT, FERRY_TLS_NO_VERIFY);
}

static void undo_tls_ctx_new(int rc)
{
    if (rc != 0 && g_tls)
        FAILF("tls_ctx_new: failed but set *out");
    ferry_tls_ctx_free(g_tls);
    g_tls = NULL;
}

/* A stream that has read "abc" and handed out "a" (not armed): "bc" are
 * bytes read before the handshake. */
static void setup_tls_client(void)
{
    setup_pair_stream(0);
    if (write(g_sp[1], "abc", 3) != 3 || ferry_tls_ctx_new(&g_tls, FERRY_TLS_CLIENT, FERRY_TLS_NO_VERIFY))
        FAILF("tls setup");
}

static int tls_client_task(void *arg)
{
    ferry_stream *o;
    char c;
    size_t n;
    int rc;

    (void)arg;
    if (ferry_stream_read(g_st, &c, 1, &n) != 0 || n != 1)
        return -1000;
    sweep_arm();
    rc = ferry_tls_client(&o, g_st, g_tls, NULL);
    sweep_disarm();
    /* "bc" is no TLS record: with every allocation made, the handshake
     * fails on them. */
    return rc == -EPROTO ? 0 : rc;
}

static int op_tls_client(void)
{
    return in_task(tu_loop, tls_client_task, NULL);
}

static void undo_tls_client(int rc)
{
    (void)rc;
    pair_done();    /* closing frees the TLS state too */
    ferry_tls_ctx_free(g_tls);
    g_tls = NULL;
}
#endif

static char g_path[64];

static void setup_listen(void)
{
    warm_tu_loop();
    g_fds_before = tu_open_fds();
    g_lis = NULL;
    snprintf(g_path, sizeof g_path, "/tmp/ferry-fault-%d.sock", (int)getpid());
    unlink(g_path);
}

static int op_unix_listen(void)
{
    return ferry_unix_listen(&g_lis, tu_loop, g_path, NULL);
}

static void undo_listen(int rc)
{
    if (rc != 0 && g_lis)
        FAILF("unix_listen: failed but set *out");
    if (rc != 0 && access(g_path, F_OK) == 0)
        FAILF("unix_listen: failed but left its socket file");
    if (g_lis && ferry_listener_close(g_lis) != 0)
        FAILF("listener_close");
    g_lis = NULL;
    if (access(g_path, F_OK) == 0)
        FAILF("listener_close left the socket file");
    if (tu_open_fds() != g_fds_before)
        FAILF("listen: %d descriptors open, %d before", tu_open_fds(), g_fds_before);
}

/* A TCP listener with one connection queued (not armed). */
static void setup_accept(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

    setup_listen();
    g_st = NULL;
    if (ferry_tcp_listen(&g_lis, tu_loop, "127.0.0.1", 0, NULL))
        FAILF("tcp_listen");
    a.sin_port = htons((uint16_t)ferry_listener_port(g_lis));
    g_client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(g_client, (struct sockaddr *)&a, sizeof a) != 0)
        FAILF("connect");
}

static int accept_task(void *arg)
{
    int rc;

    (void)arg;
    sweep_arm();
    rc = ferry_listener_accept(g_lis, &g_st, NULL);
    sweep_disarm();
    return rc;
}

static int op_accept(void)
{
    return in_task(tu_loop, accept_task, NULL);
}

static void undo_accept(int rc)
{
    char b;

    if (rc != 0 && g_st)
        FAILF("accept: failed but set *out");
    if (rc != 0 && recv(g_client, &b, 1, 0) != 0)
        FAILF("accept: failed, but the connection was not closed");
    if (g_st)
        ferry_stream_close(g_st);
    g_st = NULL;
    close(g_client);
    undo_listen(0);
}

static int connect_task(void *arg)
{
    int rc;

    (void)arg;
    sweep_arm();
    rc = ferry_tcp_connect(&g_st, "127.0.0.1", ferry_listener_port(g_lis), NULL);
    sweep_disarm();
    return rc;
}

/* A lookup made once on the loop, so that what the resolver keeps for the
 * loop's life (its nameserver socket) is there before descriptors are
 * counted. */
static int warm_resolver_task(void *arg)
{
    struct addrinfo *res = NULL;
    int rc = ferry_getaddrinfo("127.0.0.1", "80", NULL, &res);

    (void)arg;
    if (res)
        ferry_freeaddrinfo(res);
    return rc;
}

static void setup_connect(void)
{
    if (in_task(tu_loop, warm_resolver_task, NULL) != 0)
        FAILF("tcp_connect: a numeric lookup failed unarmed");
    setup_listen();
    g_st = NULL;
    if (ferry_tcp_listen(&g_lis, tu_loop, "127.0.0.1", 0, NULL))
        FAILF("tcp_listen");
}

static int op_connect(void)
{
    return in_task(tu_loop, connect_task, NULL);
}

static void undo_connect(int rc)
{
    if (rc != 0 && g_st)
        FAILF("connect: failed but set *out");
    if (g_st)
        ferry_stream_close(g_st);
    g_st = NULL;
    undo_listen(0);
}

/* ---- the simulated network ---------------------------------------------------- */

static ferry_sim *g_sim;
static ferry_stream *g_sim_c, *g_sim_s;
static int g_sim_connect_rc; /* what ferry_sim_connect() returned */

/* Every allocating call of ferry/sim.h, armed; then, unarmed, the byte
 * written must reach the accepted end. */
static int sim_task(void *arg)
{
    ferry_sim_host *a = NULL, *b = NULL;
    ferry_sim_listener *l = NULL;
    char x = 0;
    size_t n = 0;
    int rc;

    (void)arg;
    g_sim = NULL;
    g_sim_c = g_sim_s = NULL;
    g_sim_connect_rc = 1;
    sweep_arm();
    rc = ferry_sim_new(&g_sim, NULL, 1, NULL);
    if (!rc)
        rc = ferry_sim_find_host(g_sim, "a", &a);
    if (!rc)
        rc = ferry_sim_find_host(g_sim, "b", &b);
    if (!rc)
        rc = ferry_sim_link(g_sim, a, b, FERRY_MSEC(1), 0);
    if (!rc)
        rc = ferry_sim_listen(g_sim, b, 7, &l);
    if (!rc)
        rc = g_sim_connect_rc = ferry_sim_connect(g_sim, a, b, 7, &g_sim_c);
    if (!rc)
        rc = ferry_stream_write(g_sim_c, "x", 1, NULL);
    sweep_disarm();
    if (!rc)
        rc = ferry_sim_accept(l, &g_sim_s);
    if (!rc)
        rc = ferry_stream_read(g_sim_s, &x, 1, &n);
    if (!rc && (n != 1 || x != 'x'))
        FAILF("sim: the accepted end read %zu bytes", n);
    return rc;
}

static int op_sim(void)
{
    return in_task(tu_loop, sim_task, NULL);
}

static void undo_sim(int rc)
{
    (void)rc;
    if (g_sim_connect_rc < 0 && g_sim_c)
        FAILF("sim_connect: failed but set *out");
    if (g_sim_c)
        ferry_stream_close(g_sim_c);
    if (g_sim_s)
        ferry_stream_close(g_sim_s);
    ferry_sim_free(g_sim);
    g_sim = NULL;
    g_sim_c = g_sim_s = NULL;
}

/* A task of host b listens through the ordinary call and closes. */
static int sim_host_body(void *arg)
{
    ferry_listener *l;
    int rc;

    (void)arg;
    rc = ferry_tcp_listen(&l, NULL, NULL, 0, NULL);
    if (!rc && ferry_listener_fd(l) != -ENOTSOCK)
        rc = -1001;
    if (!rc)
        ferry_listener_close(l);
    return rc;
}

/* A host's task spawned and listening on the host, armed. */
static int sim_host_task(void *arg)
{
    ferry_sim_host *b = NULL;
    ferry_task *t;
    int rc, st = 0;

    (void)arg;
    g_sim = NULL;
    g_sim_c = g_sim_s = NULL;
    g_sim_connect_rc = 1;
    if (ferry_sim_new(&g_sim, NULL, 1, NULL) != 0 || ferry_sim_find_host(g_sim, "b", &b) != 0)
        return -1002;
    sweep_arm();
    rc = ferry_sim_spawn(b, &t, sim_host_body, NULL);
    if (!rc)
        rc = ferry_task_join(t, &st);
    sweep_disarm();
    return rc ? rc : st;
}

static int op_sim_host(void)
{
    return in_task(tu_loop, sim_host_task, NULL);
}

static void undo_sim_host(int rc)
{
    if (rc < -1000)
        FAILF("sim host: check %d failed", rc);
    undo_sim(rc);
}

/* ---- name resolution --------------------------------------------------------- */

/* A hosts file with one name, made once; the fake DNS server, started by
 * the first sweep that needs it and stopped at the end of the test. */
static char g_hosts[64];
static struct fakedns *g_dns;

struct gai_arg {
    const char *host;
    int         family;
    bool        arm;        /* arm the fault hook around the lookup only */
    char        want[64];   /* the first address expected, as text */
};

/* One lookup on the running loop under a deadline (a lost answer shows
 * as -ETIMEDOUT, not as a hang); -1000 for a wrong answer. */
static int gai_task(void *arg)
{
    struct gai_arg *a = arg;
    struct addrinfo h = { .ai_family = a->family, .ai_socktype = SOCK_STREAM }, *res;
    char got[64] = "";
    ferry_scope sc;
    int rc;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(10000), 0);
    if (a->arm)
        sweep_arm();
    rc = ferry_getaddrinfo(a->host, "80", &h, &res);
    if (a->arm)
        sweep_disarm();
    ferry_scope_exit(&sc);
    if (rc)
        return rc;
    if (res->ai_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)res->ai_addr)->sin_addr, got, sizeof got);
    ferry_freeaddrinfo(res);
    return strcmp(got, a->want) == 0 ? 0 : -1000;
}

static int gai_on(ferry_loop *loop, const char *host, const char *want)
{
    struct gai_arg a = { .host = host, .family = AF_INET };

    snprintf(a.want, sizeof a.want, "%s", want);
    return in_task(loop, gai_task, &a);
}

/* The same, armed around the lookup only (the task's spawn on a fresh loop
 * allocates too, outside what is swept). */
static int gai_armed(ferry_loop *loop, const char *host, const char *want)
{
    struct gai_arg a = { .host = host, .family = AF_INET, .arm = true };

    snprintf(a.want, sizeof a.want, "%s", want);
    return in_task(loop, gai_task, &a);
}

static const ferry_resolver_opts *hosts_opts(void)
{
    static ferry_resolver_opts o;

    o = (ferry_resolver_opts){ .mode = FERRY_RESOLVE_NO_THREADS,
                               .nameservers = fakedns_addr(g_dns), .hosts = g_hosts };
    return &o;
}

static void setup_resolver_loop(void)
{
    if (!g_dns) {
        g_dns = fakedns_start();
        fakedns_add(g_dns, "www.example.test", "192.0.2.10");
        fakedns_add(g_dns, "www.example.test", "2001:db8::10");
    }
    if (!g_hosts[0]) {
        int fd;

        snprintf(g_hosts, sizeof g_hosts, "/tmp/ferry-fault-hosts-XXXXXX");
        fd = mkstemp(g_hosts);
        if (fd < 0 || write(fd, "10.1.2.3 alpha.test\n", 20) != 20)
            FAILF("cannot write a hosts file");
        if (fd >= 0)
            close(fd);
    }
    setup_fresh_loop();
}

static int op_set_resolver(void)
{
    return ferry_loop_set_resolver(g_bl, hosts_opts());
}

static void undo_set_resolver(int rc)
{
    if (rc == 0 && gai_on(g_bl, "alpha.test", "10.1.2.3") != 0)
        FAILF("loop_set_resolver: the hosts file is not used");
    if (rc != 0 && gai_on(g_bl, "127.0.0.1", "127.0.0.1") != 0)
        FAILF("loop_set_resolver: lookups fail after the failure");
    ferry_loop_free(g_bl);
    g_bl = NULL;
}

static void setup_resolver_hosts(void)
{
    setup_resolver_loop();
    if (ferry_loop_set_resolver(g_bl, hosts_opts()) != 0)
        FAILF("cannot set the resolver");
}

/* The first lookup makes the resolver: the hosts file, evdns's base and
 * its nameserver socket. */
static int op_gai_hosts(void)
{
    return gai_armed(g_bl, "alpha.test", "10.1.2.3");
}

static void undo_gai(int rc)
{
    (void)rc;
    if (gai_on(g_bl, "alpha.test", "10.1.2.3") != 0)
        FAILF("getaddrinfo (hosts): hosts file lookups fail after the failure");
    if (gai_on(g_bl, "www.example.test", "192.0.2.10") != 0)
        FAILF("getaddrinfo (hosts): DNS lookups fail after the failure");
    ferry_loop_free(g_bl);
    g_bl = NULL;
}

/*
 * A DNS query, with the resolver made before.  libevent's allocations are
 * not failed here: evdns 2.1 does not survive its own allocation failures
 * (a reply whose deferred callback cannot be allocated is dropped without
 * a callback, so the lookup would wait for its deadline; a failed copy of
 * the search name leaves a freed request in use).  ferry's allocations on
 * that path are.
 */
static void setup_resolver_dns(void)
{
    setup_resolver_loop();
    if (ferry_loop_set_resolver(g_bl, &(ferry_resolver_opts){
            .mode = FERRY_RESOLVE_NO_THREADS, .nameservers = fakedns_addr(g_dns),
            .hosts = g_hosts }) != 0 ||
        gai_on(g_bl, "alpha.test", "10.1.2.3") != 0)
        FAILF("cannot set the resolver");
    tu_libevent_fault_exempt(true);
}

static int op_gai_dns(void)
{
    struct gai_arg a = { .host = "www.example.test", .family = AF_UNSPEC, .arm = true,
                         .want = "192.0.2.10" };

    return in_task(g_bl, gai_task, &a);
}

static void undo_gai_dns(int rc)
{
    (void)rc;
    tu_libevent_fault_exempt(false);
    if (gai_on(g_bl, "www.example.test", "192.0.2.10") != 0)
        FAILF("getaddrinfo (dns): lookups fail after the failure");
    ferry_loop_free(g_bl);
    g_bl = NULL;
}

static void setup_resolver_pool(void)
{
    setup_pool();
    setup_fresh_loop();
    if (ferry_loop_set_resolver(g_bl, &(ferry_resolver_opts){
            .mode = FERRY_RESOLVE_THREADS, .pool = g_pool }) != 0)
        FAILF("cannot set the resolver");
}

static int op_gai_pool(void)
{
    return gai_armed(g_bl, "127.0.0.1", "127.0.0.1");
}

static void undo_gai_pool(int rc)
{
    (void)rc;
    if (gai_on(g_bl, "127.0.0.1", "127.0.0.1") != 0)
        FAILF("getaddrinfo (pool): lookups fail after the failure");
    ferry_loop_free(g_bl);
    g_bl = NULL;
}

/* ---- the sites in the source ----------------------------------------------- */

#define MAXSITES 128
struct site {
    char file[64];    /* "src/loop.c" */
    int  line;
    char text[96];
    char name[32];    /* a fault point's site name, "" for an allocation */
    bool hit;
};
static struct site sites[MAXSITES];
static int nsites;

static void scan_file(const char *dir, const char *rel)
{
    char path[4096], buf[512];
    FILE *f;
    int line = 0;

    snprintf(path, sizeof path, "%s/%s", dir, rel);
    if (!(f = fopen(path, "r")))
        return;
    while (fgets(buf, sizeof buf, f)) {
        const char *p = buf, *q;
        line++;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '*' || (p[0] == '/' && (p[1] == '*' || p[1] == '/')))
            continue;   /* a comment */
        if ((strstr(buf, "ferry__malloc(") || strstr(buf, "ferry__calloc(") ||
             strstr(buf, "ferry__realloc(") || strstr(buf, "ferry__fault_point(")) &&
            nsites < MAXSITES) {
            struct site *s = &sites[nsites++];
            snprintf(s->file, sizeof s->file, "%s", rel);
            s->line = line;
            snprintf(s->text, sizeof s->text, "%s", p);
            s->text[strcspn(s->text, "\n")] = 0;
            s->name[0] = 0;
            if ((q = strstr(buf, "ferry__fault_point(\"")) != NULL) {
                q += strlen("ferry__fault_point(\"");
                snprintf(s->name, sizeof s->name, "%.*s", (int)strcspn(q, "\""), q);
            }
        }
    }
    fclose(f);
}

static void scan_sources(void)
{
    static const char *const dirs[] = { "base", "src", "io", "bridge", "wire" };
    char cmd[4200], name[256];
    FILE *ls;

    for (int d = 0; d < (int)(sizeof dirs / sizeof dirs[0]); d++) {
        snprintf(cmd, sizeof cmd, "ls '%s/%s'", FERRY_SOURCE_DIR, dirs[d]);
        if (!(ls = popen(cmd, "r")))
            continue;
        while (fgets(name, sizeof name, ls)) {
            char rel[300];
            name[strcspn(name, "\n")] = 0;
            if (strlen(name) < 3 || strcmp(name + strlen(name) - 2, ".c") != 0)
                continue;
            if (d == 0 && strcmp(name, "alloc.c") == 0)
                continue;   /* where they are defined */
            snprintf(rel, sizeof rel, "%s/%s", dirs[d], name);
            scan_file(FERRY_SOURCE_DIR, rel);
        }
        pclose(ls);
    }
}

/* Resolve the recorded return addresses to file:line and mark the sites. */
static int attribute_hits(void)
{
    char cmd[8192], out[1024];
    size_t len;
    Dl_info di;
    FILE *p;
    int i, unmatched = 0;
    Elf64_Ehdr eh;
    FILE *self = fopen(self_exe(), "rb");
    bool pie = true;

    if (self && fread(&eh, sizeof eh, 1, self) == 1)
        pie = eh.e_type == ET_DYN;
    if (self)
        fclose(self);
    len = (size_t)snprintf(cmd, sizeof cmd, "addr2line -i -e '%s'", self_exe());
    for (i = 0; i < nhit && len < sizeof cmd - 32; i++) {
        uintptr_t a = (uintptr_t)hit_addr[i] - 1;   /* inside the call instruction */
        if (pie && dladdr(hit_addr[i], &di) && di.dli_fbase)
            a -= (uintptr_t)di.dli_fbase;
        len += (size_t)snprintf(cmd + len, sizeof cmd - len, " %#lx", (unsigned long)a);
    }
    /* With -i each address prints its inline chain, innermost first: the
     * first line after each address's previous chain is the call site.  To
     * keep the parse simple, mark every site named anywhere in the output. */
    if (!(p = popen(cmd, "r")))
        return -1;
    while (fgets(out, sizeof out, p)) {
        char *colon = strrchr(out, ':');
        int line, matched = 0;
        if (!colon)
            continue;
        line = atoi(colon + 1);
        *colon = 0;
        for (int s = 0; s < nsites; s++) {
            size_t fl = strlen(sites[s].file), ol = strlen(out);
            if (sites[s].line == line && ol >= fl && strcmp(out + ol - fl, sites[s].file) == 0) {
                sites[s].hit = true;
                matched = 1;
            }
        }
        if (!matched && strstr(out, "/src/") == NULL && strstr(out, "/io/") == NULL &&
            strstr(out, "/bridge/") == NULL)
            unmatched++;
    }
    pclose(p);
    return unmatched;
}

/* Is there code for base:line in this program?  A site in a branch of an
 * #if that this build leaves out has none.  Read from the program's line
 * table once; without objdump every site counts as compiled in. */
#define MAXLINES 65536
static struct { char base[32]; int line; } *code_lines;
static int ncode_lines = -1;

static bool compiled_in(const char *file, int line)
{
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;

    if (ncode_lines < 0) {
        char cmd[4200], buf[512], f[256];
        int l;
        FILE *p;

        ncode_lines = 0;
        code_lines = calloc(MAXLINES, sizeof *code_lines);
        snprintf(cmd, sizeof cmd, "objdump --dwarf=decodedline '%s' 2>/dev/null", self_exe());
        if (!code_lines || !(p = popen(cmd, "r")))
            return true;
        while (fgets(buf, sizeof buf, p) && ncode_lines < MAXLINES) {
            if (sscanf(buf, "%255s %d", f, &l) != 2 || strlen(f) < 3 ||
                strcmp(f + strlen(f) - 2, ".c") != 0)
                continue;
            snprintf(code_lines[ncode_lines].base, sizeof code_lines[0].base, "%s", f);
            code_lines[ncode_lines++].line = l;
        }
        pclose(p);
    }
    if (ncode_lines == 0)
        return true;
    for (int i = 0; i < ncode_lines; i++)
        if (code_lines[i].line == line && strcmp(code_lines[i].base, base) == 0)
            return true;
    return false;
}

/* Fault points that another build of this test reaches, because this one
 * leaves them out (tests/CMakeLists.txt): names separated by '|'. */
#ifndef FAULT_SITES_ELSEWHERE
#define FAULT_SITES_ELSEWHERE ""
#endif

/* ---- the test ------------------------------------------------------------------ */

static const struct sweep sweeps[] = {
    /* A loop works without its fork mark (then a forked child is not
     * detected): absorbed by design. */
    { "loop_new",            NULL,             op_loop_new,       undo_loop_new,    "fork mark" },
    { "task_spawn",          NULL,             op_spawn_big,      undo_spawn,       NULL },
    { "call_soon",           NULL,             op_call_soon,      undo_call_soon,   NULL },
    { "call_later",          NULL,             op_call_later,     undo_call_later,  NULL },
    { "watch_new + watch_fd",setup_watch,      op_watch,          undo_watch,       NULL },
    { "queue_put (growth)",  setup_queue2,     op_queue_put,      undo_queue,       NULL },
    { "flight_do",           setup_flight,     op_flight,         undo_flight,      NULL },
    { "keylock_acquire",     setup_kl,         op_kl,             undo_kl,          NULL },
    /* A table that cannot shrink keeps its larger array. */
    { "keylock shrink",      setup_kl_many,    op_kl_release_all, undo_kl_many,     "resize", true },
    { "pool_new",            NULL,             op_pool_new,       undo_pool_new,    NULL },
    /* A task's job whose flush after the turn cannot be scheduled (the
     * ferry_call_soon of defer_job fails) is queued at once; a failed
     * eventfd write is logged and counted, and the completion still runs
     * (the loop is woken another way). */
    { "to_thread",           setup_pool,       op_to_thread,      undo_nothing,
      "ferry_call_soon|eventfd write", false, teardown_pool },
    { "to_thread_abandon",   setup_pool,       op_abandon,        undo_nothing,
      "ferry_call_soon|eventfd write", false, teardown_pool },
    { "pool_submit",         setup_pool,       op_submit,         undo_submit,
      "eventfd write", false, teardown_pool },
    { "call_soon_threadsafe",setup_fresh_loop, op_post,           undo_post,        NULL },
    { "post from a thread",  setup_fresh_loop, op_post_thread,    undo_post_thread, "eventfd write" },
    { "chan_new",            NULL,             op_chan_new,       undo_chan,        NULL },
    { "select",              setup_select,     op_select,         undo_select,      NULL, true },
    { "task_local_set",      NULL,             op_local_set,      undo_local,       NULL, true },
    { "spawn inheriting",    NULL,             op_local_inherit,  undo_local,       NULL, true },
    /* A failed munmap is kept and retried: absorbed by design. */
    /* Without memory for the shuffle a turn keeps its order. */
    { "fuzzed turn",         setup_fuzz_turn,  op_fuzz_turn,      undo_fuzz_turn,
      "ferry__fuzz_shuffle" },
    { "stack unmap",         setup_fresh_loop, op_stack_unmap,    undo_stack_unmap, "munmap" },
    { "loop_call_threadsafe",NULL,             op_future,         undo_future,      "eventfd write" },
    /* As loop_new, for each loop. */
    { "runtime_new",         NULL,             op_runtime_new,    undo_runtime_new, "fork mark" },
    { "runtime_on_all",      setup_runtime,    op_runtime_on_all, undo_runtime_calls,
      "eventfd write", true, teardown_runtime },
    { "select on a future",  setup_runtime,    op_runtime_select, undo_runtime_calls,
      "eventfd write", true, teardown_runtime },
    { "runtime_listen",      setup_runtime,    op_runtime_listen, undo_runtime_listen,
      NULL, false, teardown_runtime },
    /* An acceptor whose wait for its socket cannot be registered (a
     * libevent allocation: its table of descriptors grows with malloc or
     * realloc) tries again a little later: absorbed. */
    { "runtime_listener_serve", setup_rl,      op_runtime_serve,  undo_nothing,
      "eventfd write|libevent malloc|libevent realloc", true, teardown_rl },
    { "sigsub_new (first)",  setup_sig_loop,   op_sigsub_first,   undo_sigsub,      NULL },
    { "sigsub_new (more)",   setup_sig_loop_subscribed, op_sigsub_more, undo_sigsub, NULL },
    { "loop_dump_on_signal", setup_dump_signal, op_dump_signal,  undo_dump_signal, NULL },
    { "wait_signal",         setup_sig_loop,   op_wait_signal,    undo_wait_signal, NULL, true },
    { "stream_open",         setup_pair_fresh_loop, op_stream_open, undo_stream_open, NULL },
#if FERRY_HAVE_URING
    { "stream_open (io_uring)", setup_pair_uring_loop, op_stream_open, undo_stream_open_uring,
      "uring_setup|ferry__uring_new|bufs_init|ev_malloc" },
    { "stream write (io_uring)", setup_stream_uring, op_stream_write_uring, undo_stream_uring,
      NULL, true },
    { "tcp_listen (io_uring)", setup_stream_uring, op_tcp_listen_uring, undo_listen_uring, NULL },
    { "accept burst (io_uring)", setup_accept_burst_uring, op_accept_burst_uring,
      undo_accept_burst_uring, NULL, true },
#endif
    { "stream read",         setup_stream_read, op_stream_read,   undo_stream_read, NULL, true },
    { "stream read (growth)",setup_stream_grow, op_stream_grow,   undo_stream_read, NULL, true },
    { "unix_listen",         setup_listen,     op_unix_listen,    undo_listen,      NULL },
    { "listener_accept",     setup_accept,     op_accept,         undo_accept,      NULL, true },
    { "tcp_connect",         setup_connect,    op_connect,        undo_connect,     NULL, true },
    /* The trace of deliveries is written in timer callbacks: it is marked
     * lost instead of failing anyone. */
    { "sim",                 NULL,             op_sim,            undo_sim,         "ferry__sim_trace", true },
    { "sim host",            NULL,             op_sim_host,       undo_sim_host,    NULL, true },
    { "loop_set_resolver",   setup_resolver_loop, op_set_resolver, undo_set_resolver, NULL },
    /* evdns_base_new() goes on without its lock (evdns is used by one
     * thread only) or without its table of requests in flight (ferry makes
     * that again at once; the undo's DNS lookup checks it): absorbed. */
    { "getaddrinfo (hosts)", setup_resolver_hosts, op_gai_hosts,   undo_gai,
      "libevent lock|libevent malloc", true },
    { "getaddrinfo (dns)",   setup_resolver_dns, op_gai_dns,      undo_gai_dns,     NULL, true },
    { "getaddrinfo (pool)",  setup_resolver_pool, op_gai_pool,    undo_gai_pool,
      "ferry_call_soon|eventfd write", true, teardown_pool },
#if FERRY_HAVE_TLS
    { "tls_ctx_new",         NULL,             op_tls_ctx_new,    undo_tls_ctx_new, NULL },
    { "tls_client",          setup_tls_client, op_tls_client,     undo_tls_client,  NULL, true },
#endif
};

static void quiet_log(int level, const char *msg, void *ctx)
{
    (void)level; (void)msg; (void)ctx;
}

Test(fault, every_allocating_operation_fails_cleanly_at_every_point, .init = tu_alloc_setup,
     .fini = tu_loop_teardown, .timeout = 300.)
{
    int reached = 0, elsewhere = 0, lost = 0;
    bool wrapped = __real_ferry__malloc != NULL;

    (void)setup_queue;
    ferry_set_log(quiet_log, NULL);   /* failed eventfd writes are logged by design */
    signal(SIGUSR1, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
    cr_assert_eq(ferry_loop_new(&tu_loop, NULL), 0);
    cr_assert_str_eq(event_base_get_method(ferry_loop_base(tu_loop)), "epoll");
    for (size_t i = 0; i < sizeof sweeps / sizeof sweeps[0]; i++)
        run_sweep(&sweeps[i]);
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    fakedns_stop(g_dns);
    if (g_hosts[0])
        unlink(g_hosts);
    ferry_set_log(NULL, NULL);
    fprintf(stderr, "fault: %lu operations swept, %lu failures injected (%lu in libevent)\n",
            sweeps_run, injected, atomic_load(&ev_faults));
    cr_expect_eq(failures, 0, "%d checks failed; first: %s", failures, first_failure);
    cr_assert_gt(atomic_load(&ev_faults), 0, "no libevent allocation was failed: event_set_mem_functions not honoured?");

    if (!wrapped) {
        fprintf(stderr, "fault: sites not attributed (built without -Wl,--wrap)\n");
    } else {
        scan_sources();
        cr_assert_gt(nsites, 0, "no allocation site found in %s", FERRY_SOURCE_DIR);
        cr_assert_geq(attribute_hits(), 0, "addr2line failed");
        for (int s = 0; s < nsites; s++) {
            if (sites[s].hit) {
                reached++;
            } else if (!compiled_in(sites[s].file, sites[s].line)) {
                bool known = listed(FAULT_SITES_ELSEWHERE, sites[s].name, strlen(sites[s].name));
                elsewhere++;
                fprintf(stderr, "fault: compiled out of this build%s: %s:%d: %s\n",
                        known ? " (another build reaches it)" : ", and reached by no other",
                        sites[s].file, sites[s].line, sites[s].text);
                if (!known)
                    lost++;
            } else {
                lost++;
                fprintf(stderr, "fault: not reached: %s:%d: %s\n", sites[s].file, sites[s].line,
                        sites[s].text);
            }
        }
        printf("fault: %d of %d allocation sites reached, %d compiled out of this build\n",
               reached, nsites, elsewhere);
        fprintf(stderr, "fault: %d of %d allocation sites reached, %d compiled out of this build\n",
                reached, nsites, elsewhere);
        cr_expect_eq(lost, 0, "%d allocation sites never failed", lost);
    }
    cr_assert_eq(tu_leaks(), 0, "LeakSanitizer found leaks");
}
