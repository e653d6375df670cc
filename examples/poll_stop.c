/* poll_stop.c - a background poll loop stopped by an event, with a pause
 * between rounds that the stop interrupts.
 *
 * The seed (asyncio):
 *
 *     async def poll_loop():
 *         while not stop.is_set():
 *             await poll_once()
 *             try:
 *                 await asyncio.wait_for(stop.wait(), timeout=5)
 *             except TimeoutError:
 *                 pass
 *
 * asyncio.wait_for(..., timeout) is a deadline scope around the wait.  A
 * stop event lets the current round finish; ferry_task_cancel() cuts it
 * short.  Times are scaled down: a poll takes 20 ms, the pause is 100 ms.
 */
#include <stdio.h>

#include "examples.h"

#define POLL_MS  20
#define PAUSE_MS 100

static ferry_event stop = FERRY_EVENT_INIT;
static int polls_done, polls_cut, pauses_timed_out;
/* The stopper acts when the poller reaches a given round, not after a
 * given time: on a busy machine timers drift, and a stop aimed at the
 * middle of a 20 ms poll could land in the pause. */
static ferry_event reached = FERRY_EVENT_INIT;
static int polls_started, pauses_started, stop_at_poll, stop_at_pause;

/* One round of work; a cancellation interrupts it. */
static int poll_once(void)
{
    if (++polls_started == stop_at_poll)
        ferry_event_set(&reached);
    int rc = ferry_sleep(FERRY_MSEC(POLL_MS));
    if (rc)
        polls_cut++;
    else
        polls_done++;
    return rc;
}

static int poll_loop(void *arg)
{
    while (!ferry_event_is_set(&stop)) {
        int rc = poll_once();
        if (rc)
            return rc;
        if (++pauses_started == stop_at_pause)
            ferry_event_set(&reached);
        ferry_scope pause;                       /* wait_for(stop.wait(), timeout=...) */
        ferry_scope_enter(&pause, ferry_now() + FERRY_MSEC(PAUSE_MS), 0);
        rc = ferry_event_wait(&stop);
        ferry_scope_exit(&pause);
        if (rc == -ETIMEDOUT)
            pauses_timed_out++;                  /* except TimeoutError: pass */
        else if (rc)
            return rc;
    }
    return 0;
}

/* Start the poll loop, stop it by the event or by cancellation once it
 * has started poll number `at_poll` or pause number `at_pause` (the other
 * 0), and return how long it took to end after that. */
static double run(int at_poll, int at_pause, bool cancel, int *status)
{
    ferry_task *poller;

    ferry_event_clear(&stop);
    ferry_event_clear(&reached);
    polls_done = polls_cut = pauses_timed_out = polls_started = pauses_started = 0;
    stop_at_poll = at_poll;
    stop_at_pause = at_pause;
    ferry_task_spawn(&poller, NULL, poll_loop, NULL, &(ferry_task_opts){ .name = "poller" });
    ferry_event_wait(&reached);
    int64_t t0 = ferry_now();
    if (cancel)
        ferry_task_cancel(poller);
    else
        ferry_event_set(&stop);
    ferry_task_join(poller, status);
    return ms_since(t0);
}

static int main_task(void *arg)
{
    int status, bad = 0;

    /* Rounds: poll, pause (runs out), poll, pause (runs out), poll, pause:
     * the stop comes in the third pause. */
    double t = run(0, 3, false, &status);
    printf("  stop set during a pause: the loop ended %.1f ms later, %s "
           "(%d polls done, %d pauses ran out)\n", t,
           pauses_timed_out == 2 ? "without waiting out the pause" : "AFTER the pause",
           polls_done, pauses_timed_out);
    bad |= status != 0 || polls_done != 3 || pauses_timed_out != 2;

    t = run(2, 0, false, &status);
    printf("  stop set during a poll:  the poll finished, the loop ended %.1f ms later "
           "(%d polls done, %d cut short)\n", t, polls_done, polls_cut);
    bad |= status != 0 || polls_done != 2 || polls_cut != 0;

    t = run(2, 0, true, &status);
    printf("  cancelled during a poll: the poll was cut short, the loop ended %.1f ms later "
           "with %s (%d polls done, %d cut short)\n", t, errname(status), polls_done, polls_cut);
    bad |= status != -ECANCELED || polls_done != 1 || polls_cut != 1;
    return bad;
}

int ex_poll_stop(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_poll_stop();
}
#endif
