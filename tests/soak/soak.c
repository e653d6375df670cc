/* soak.c - ferry-soak: many task lifetimes with random primitive operations
 * and offloads, checking that memory, descriptors and mappings stay flat.
 *
 * 1,000,000 task lifetimes by default (FERRY_SOAK_LIFETIMES overrides, e.g.
 * 50000 in slow builds), at most 256 alive at once.  Each task does a few
 * random operations: lock, weighted semaphore, queue put/get, event wait
 * under an already-passed deadline, singleflight and per-key locks on keys
 * drawn from a large space (so entries are made and freed all the time),
 * yields, sleeps of 0, and one task in 64 offloads to the default pool
 * (ferry_to_thread) or abandons a job.  Some tasks are cancelled by
 * others.
 *
 * After a warm-up of 20% of the lifetimes it samples RSS, the number of
 * open descriptors and of lines in /proc/self/maps; at the end RSS must be
 * within +5% (plus 256 KiB of slack for allocator noise), and descriptors
 * and mappings the same.  Exits 1 on any violation.  A program of its own,
 * not a Criterion test: instead of the shared teardown's per-test checks it
 * checks that the process stays flat over the whole run.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/ferry.h"

static ferry_lock    g_lock = FERRY_LOCK_INIT;
static ferry_sem     g_sem = FERRY_SEM_INIT(4);
static ferry_event   g_ev = FERRY_EVENT_INIT;
static ferry_queue   g_q = FERRY_QUEUE_INIT(sizeof(long), 64);
static ferry_flight  g_fl = FERRY_FLIGHT_INIT;
static ferry_keylock g_kl = FERRY_KEYLOCK_INIT;

static long     target, started, finished, live, errors;
static long     offloads, abandons;
static uint64_t rng = 0x9e3779b97f4a7c15ull;
/* Handles of recent tasks, for cancels.  Only tasks that have started are
 * cancelled: one cancelled before its first run never runs its body, so it
 * could not count itself as finished. */
static struct {
    ferry_task *t;
    bool        started;
} recent[64];

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int job(void *arg)
{
    return (int)(intptr_t)arg;
}

static void job_cleanup(void *arg, int status)
{
    (void)arg;
    (void)status;
}

static int fl_fn(void *arg, void *out, size_t size)
{
    (void)arg;
    (void)size;
    *(long *)out = 1;
    return ferry_yield() == 0 ? 0 : -ECANCELED;
}

/* An error is fine if it is one of the documented outcomes of the call
 * under cancellation, deadlines or contention. */
static void check(int rc, const char *what)
{
    if (rc == 0 || rc == -ECANCELED || rc == -ETIMEDOUT || rc == -EAGAIN)
        return;
    if (errors++ < 10)
        fprintf(stderr, "soak: %s returned %d\n", what, rc);
}

static int worker(void *arg)
{
    uint64_t r = (uint64_t)(uintptr_t)arg;
    int nops = 1 + (int)((r >> 6) % 4), rc;

    if (recent[r & 63].t == ferry_task_current())
        recent[r & 63].started = true;

    for (int i = 0; i < nops; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        switch ((r >> 33) % 10) {
        case 0:
            rc = ferry_lock_acquire(&g_lock);
            check(rc, "lock_acquire");
            if (rc == 0) {
                ferry_yield();
                check(ferry_lock_release(&g_lock), "lock_release");
            }
            break;
        case 1: {
            uint64_t n = 1 + (r >> 40) % 3;
            rc = ferry_sem_acquire_n(&g_sem, n);
            check(rc, "sem_acquire");
            if (rc == 0) {
                ferry_yield();
                check(ferry_sem_release_n(&g_sem, n), "sem_release");
            }
            break;
        }
        case 2: {
            long v = (long)r, out;
            check(ferry_queue_try_put(&g_q, &v), "queue_try_put");
            rc = ferry_queue_try_get(&g_q, &out);
            check(rc, "queue_try_get");
            break;
        }
        case 3: {
            ferry_scope s;
            ferry_scope_enter(&s, 1, 0);   /* already passed */
            rc = ferry_event_wait(&g_ev);
            ferry_scope_exit(&s);
            if (rc != -ETIMEDOUT && rc != -ECANCELED && errors++ < 10)
                fprintf(stderr, "soak: event_wait under a passed deadline returned %d\n", rc);
            break;
        }
        case 4: {
            long key = (long)((r >> 20) % 8), out = 0;
            rc = ferry_flight_do(&g_fl, &key, sizeof key, fl_fn, NULL, &out, sizeof out);
            check(rc, "flight_do");
            break;
        }
        case 5: {
            uint64_t key = (r >> 16) % 100000;   /* many distinct keys */
            rc = ferry_keylock_acquire(&g_kl, &key, sizeof key);
            check(rc, "keylock_acquire");
            if (rc == 0) {
                ferry_yield();
                check(ferry_keylock_release(&g_kl, &key, sizeof key), "keylock_release");
            }
            break;
        }
        case 6:
            if ((r >> 24) % 64 == 0) {
                if ((r >> 30) & 1) {
                    offloads++;
                    rc = ferry_to_thread(NULL, job, (void *)0);
                } else {
                    abandons++;
                    rc = ferry_to_thread_abandon(NULL, job, (void *)0, job_cleanup);
                }
                check(rc, "to_thread");
            }
            break;
        case 7:
            check(ferry_sleep(0), "sleep");
            break;
        case 8: {
            int slot = (int)((r >> 12) % 64);
            if (recent[slot].t && recent[slot].started && recent[slot].t != ferry_task_current())
                ferry_task_cancel(recent[slot].t);
            break;
        }
        default:
            check(ferry_yield(), "yield");
            break;
        }
    }
    return 0;
}

static void sample(long *rss_kib, long *fds, long *maps)
{
    char buf[256];
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    DIR *d;
    struct dirent *de;

    if (f) {
        if (fscanf(f, "%*ld %ld", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    *rss_kib = pages * (sysconf(_SC_PAGESIZE) / 1024);
    *fds = 0;
    if ((d = opendir("/proc/self/fd"))) {
        while ((de = readdir(d)))
            if (de->d_name[0] != '.')
                (*fds)++;
        closedir(d);
        (*fds)--;   /* the directory itself */
    }
    *maps = 0;
    if (getenv("FERRY_SOAK_DEBUG")) {
        static int n;
        snprintf(buf, sizeof buf, "cp /proc/%d/maps /tmp/rel-soak-maps.%d", (int)getpid(), n++);
        if (system(buf) != 0)
            fprintf(stderr, "soak: cannot save maps\n");
    }
    if ((f = fopen("/proc/self/maps", "r"))) {
        while (fgets(buf, sizeof buf, f))
            if (strchr(buf, '\n'))
                (*maps)++;
        fclose(f);
    }
}

#ifndef __has_feature
#define __has_feature(x) 0
#endif

/* RSS growth means nothing under ASan (its quarantine holds freed memory)
 * or TSan; FERRY_SOAK_RSS=0 turns the check off elsewhere (valgrind). */
static bool rss_checked(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    return false;
#else
    const char *e = getenv("FERRY_SOAK_RSS");
    return !(e && strcmp(e, "0") == 0);
#endif
}

/* TSan maps shadow memory for every newly touched range, and valgrind
 * manages the client's mappings itself (FERRY_SOAK_RSS=0): there the
 * mappings grow by themselves. */
static bool maps_checked(void)
{
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
    return false;
#else
    const char *e = getenv("FERRY_SOAK_RSS");
    return !(e && strcmp(e, "0") == 0);
#endif
}

static void on_done(void)
{
    finished++;
    live--;
}

static int tracked(void *arg)
{
    int rc = worker(arg);
    on_done();
    return rc;
}

static int slow_job(void *arg)
{
    (void)arg;
    usleep(20000);
    return 0;
}

static int prewarm(void *arg)
{
    (void)arg;
    return ferry_to_thread(NULL, slow_job, NULL);
}

static int main_task(void *arg)
{
    long rss0 = 0, fds0 = 0, maps0 = 0, rss1, fds1, maps1, warm = target / 5;
    int *fail = arg;

    /* Start every thread of the default pool now (it may grow lazily),
     * so that its stacks are part of the baseline. */
    {
        ferry_group g;
        ferry_group_init(&g);
        for (int i = 0; i < 16; i++)
            ferry_group_spawn(&g, prewarm, NULL, NULL);
        if (ferry_group_wait(&g) != 0)
            errors++;
    }
    while (started < target) {
        ferry_task *t;
        if (live >= 256) {
            ferry_yield();
            continue;
        }
        int slot = (int)(started % 64);
        if (ferry_task_spawn(&t, NULL, tracked,
                             (void *)(uintptr_t)((next_rand() & ~(uint64_t)63) | (uint64_t)slot),
                             NULL) != 0) {
            errors++;
            break;
        }
        /* Keep a few handles for cancels; detach the one it replaces. */
        if (recent[slot].t)
            ferry_task_detach(recent[slot].t);
        recent[slot].t = t;
        recent[slot].started = false;
        started++;
        live++;
        if (started == warm) {
            while (live > 0)
                ferry_yield();
            sample(&rss0, &fds0, &maps0);
        }
    }
    while (live > 0)
        ferry_yield();
    for (int i = 0; i < 64; i++)
        if (recent[i].t) {
            ferry_task_detach(recent[i].t);
            recent[i].t = NULL;
        }
    sample(&rss1, &fds1, &maps1);
    printf("soak: %ld task lifetimes (%ld offloads, %ld abandoned); after warm-up RSS %ld -> %ld KiB "
           "(%+.2f%%), fds %ld -> %ld, mappings %ld -> %ld, %ld unexpected errors\n",
           finished, offloads, abandons, rss0, rss1,
           rss0 ? 100.0 * (double)(rss1 - rss0) / (double)rss0 : 0.0, fds0, fds1, maps0, maps1,
           errors);
    if (!rss_checked())
        printf("soak: RSS not judged in this build (sanitizer quarantine or valgrind); "
               "leaks are LeakSanitizer's or memcheck's job here\n");
    else if (rss1 > rss0 + rss0 / 20 + 256) {
        printf("soak: FAILED: RSS grew by more than 5%%\n");
        *fail = 1;
    }
    if (fds1 != fds0 || (maps_checked() && maps1 != maps0)) {
        printf("soak: FAILED: descriptors or mappings changed\n");
        *fail = 1;
    }
    if (errors || finished != target) {
        printf("soak: FAILED: %ld errors, %ld of %ld tasks finished\n", errors, finished, target);
        *fail = 1;
    }
    return 0;
}

int main(void)
{
    const char *e = getenv("FERRY_SOAK_LIFETIMES");
    int fail = 0, rc;

    /* One malloc arena: glibc makes a new arena (two mappings) the first
     * time a pool thread allocates under contention, which would show up
     * as a mapping "leak" at a random moment. */
    mallopt(M_ARENA_MAX, 1);
    target = e ? atol(e) : 1000000;
    if (target < 100)
        target = 100;
    rc = ferry_run(main_task, &fail);
    if (rc != 0) {
        printf("soak: FAILED: main task returned %d\n", rc);
        fail = 1;
    }
    if (ferry_flight_count(&g_fl) || ferry_keylock_count(&g_kl)) {
        printf("soak: FAILED: %zu flight calls and %zu keys left\n", ferry_flight_count(&g_fl),
               ferry_keylock_count(&g_kl));
        fail = 1;
    }
    printf("%d passed, %d failed\n", fail ? 0 : 1, fail ? 1 : 0);
    return fail;
}
