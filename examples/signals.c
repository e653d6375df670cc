/* signals.c - a service that drains on SIGTERM, reloads on SIGHUP, and is
 * not killed by a second SIGTERM.
 *
 * asyncio:
 *
 *     loop.add_signal_handler(signal.SIGHUP, reload)
 *     loop.add_signal_handler(signal.SIGTERM, stopping.set)
 *     await serve_until(stopping)       # finish in-flight requests, no new ones
 *
 * A ferry_sigsub keeps counting signals while no task waits for them, so a
 * SIGHUP that arrives while the previous reload runs, or a second SIGTERM
 * that arrives during the drain, is one more message, not the signal's
 * default action (which would end the process).  One task receives them in
 * turn; the workers stop taking requests when the first SIGTERM sets an
 * event, and the service ends when the requests in flight have finished.
 *
 * An "operator" thread stands in for an administrator running kill(1): it
 * sends three SIGHUPs, then SIGTERM, then, once the service is draining,
 * SIGTERM again.  It sends each with raise(), to itself, a thread that
 * does not block them: raise() returns after the handler has run on that
 * thread, so each one counts once.  kill(getpid(), ...) would not do: the
 * kernel hands a signal sent to the process to a thread of its choice (on
 * Linux the main thread, here the loop's), and a second SIGHUP sent before
 * that thread has run the handler merges with the first, as it would for
 * any program (signal.h, "Counting").  Try it by hand, too:
 * `./signals --wait` serves until it gets SIGTERM (`kill -HUP <pid>`,
 * `kill -TERM <pid>`).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "examples.h"

#define WORKERS    4
#define REQUEST_MS 100

static struct {
    ferry_sigsub *sub;           /* SIGTERM and SIGHUP */
    ferry_loop   *loop;          /* the service's loop */
    ferry_event   stop;          /* set by the first SIGTERM */
    ferry_event   operator_done; /* the operator thread sent everything */
    atomic_int    draining;      /* the same, for the operator thread */
    int           reloads;       /* SIGHUPs handled */
    int           terms;         /* SIGTERMs received */
    int           inflight;      /* requests being served */
    int           inflight_at_stop; /* requests being served at the first SIGTERM */
    int           served;        /* requests finished */
    bool          drained;       /* the drain has finished */
    const char   *second_term;   /* when the second SIGTERM was received */
    int64_t       stop_at;       /* when the first SIGTERM was received */
} svc;

/* What a SIGHUP does in a real service (re-read the configuration). */
static void reload(void)
{
    svc.reloads++;
}

static void handle(int signum)
{
    if (signum == SIGHUP) {
        reload();
        return;
    }
    if (++svc.terms == 1) {
        svc.stop_at = ferry_now();
        svc.inflight_at_stop = svc.inflight;
        ferry_event_set(&svc.stop);
        atomic_store(&svc.draining, 1);
    } else if (svc.terms == 2) {
        svc.second_term = svc.drained ? "after the drain" : "during the drain";
    }
}

/* Receives the signals one after another, until cancelled. */
static int signal_task(void *arg)
{
    int signum;

    (void)arg;
    while (ferry_sigsub_recv(svc.sub, &signum) == 0)
        handle(signum);
    return 0;
}

/* Serves one request after another until the first SIGTERM. */
static int worker(void *arg)
{
    int rc;

    (void)arg;
    while (!ferry_event_is_set(&svc.stop)) {
        svc.inflight++;
        rc = ferry_sleep(FERRY_MSEC(REQUEST_MS));      /* a request */
        svc.inflight--;
        if (rc)
            return rc;
        svc.served++;
    }
    return 0;
}

/* On the loop, posted by the operator thread. */
static void operator_done(void *arg)
{
    (void)arg;
    ferry_event_set(&svc.operator_done);
}

static void *operator_thread(void *arg)
{
    (void)arg;
    usleep(50 * 1000);
    for (int i = 0; i < 3; i++) {
        raise(SIGHUP);
        usleep(10 * 1000);
    }
    usleep(100 * 1000);
    raise(SIGTERM);
    while (!atomic_load(&svc.draining))
        usleep(1000);
    raise(SIGTERM);
    ferry_loop_call_soon_threadsafe(svc.loop, operator_done, NULL);
    return NULL;
}

static int service(void *arg)
{
    static const int signums[] = { SIGTERM, SIGHUP };
    bool by_hand = arg != NULL;
    ferry_task *sig_task;
    ferry_group workers;
    pthread_t op;
    int rc, signum;

    svc.loop = ferry_loop_current();
    rc = ferry_sigsub_new(&svc.sub, NULL, signums, 2);
    if (rc)
        return rc;
    rc = ferry_task_spawn(&sig_task, NULL, signal_task, NULL,
                          &(ferry_task_opts){ .name = "signals" });
    if (rc)
        goto out_free;
    if (by_hand)
        printf("  pid %d: serving; kill -HUP %d reloads, kill -TERM %d drains\n",
               (int)getpid(), (int)getpid(), (int)getpid());
    else if (pthread_create(&op, NULL, operator_thread, NULL) != 0)
        by_hand = true;                   /* then it waits for a real SIGTERM */
    ferry_group_init(&workers);
    for (int i = 0; i < WORKERS; i++)
        ferry_group_spawn(&workers, worker, NULL, &(ferry_task_opts){ .name = "worker" });
    rc = ferry_group_wait(&workers);           /* ends when the drain is done */
    svc.drained = true;
    printf("  drain finished %.0f ms after SIGTERM\n", (double)(ferry_now() - svc.stop_at) / 1e6);
    if (!by_hand) {
        ferry_event_wait(&svc.operator_done);  /* everything is sent now */
        pthread_join(op, NULL);
    }
    ferry_task_cancel(sig_task);
    ferry_task_join(sig_task, NULL);
    /* Whatever arrived since the signal task stopped: receive it too, or
     * the free would raise it again for the default action. */
    while (ferry_sigsub_try_recv(svc.sub, &signum) == 0)
        handle(signum);
out_free:
    ferry_sigsub_free(svc.sub);
    return rc;
}

int ex_signals(bool by_hand);

int ex_signals(bool by_hand)
{
    int rc, bad;

    memset(&svc, 0, sizeof svc);
    rc = ferry_run(service, by_hand ? &svc : NULL);
    printf("  SIGHUP: %d reloads\n", svc.reloads);
    printf("  first SIGTERM: stopped taking requests, the %d in flight finished "
           "(%d served in all)\n", svc.inflight_at_stop, svc.served);
    if (svc.second_term)
        printf("  second SIGTERM %s: received as a message, not fatal\n", svc.second_term);
    printf("  the service returned %s\n", errname(rc));
    bad = rc != 0 || svc.terms < 1;
    if (!by_hand)
        bad |= svc.reloads != 3 || svc.terms != 2 || svc.inflight_at_stop != WORKERS;
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    return ex_signals(argc > 1 && strcmp(argv[1], "--wait") == 0);
}
