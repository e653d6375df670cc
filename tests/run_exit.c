/* run_exit.c - a program that uses the default pool and forgets a task,
 * all through ferry_run(): run under valgrind with
 * --leak-check=full --errors-for-leak-kinds=all (tests/CMakeLists.txt, the
 * valgrind build), it must leave nothing behind, reachable or not: the
 * forgotten task is cancelled and waited for, the default pool is shut
 * down, and libevent's own globals are released at the end.
 */
#include <errno.h>
#include <stdio.h>

#include <event2/event.h>

#include <ferry/ferry.h>

static int job(void *arg)
{
    (void)arg;
    return 7;
}

static int forgotten(void *arg)
{
    (void)arg;
    return ferry_sleep(FERRY_NEVER) == -ECANCELED ? 0 : 1;
}

static int main_task(void *arg)
{
    (void)arg;
    if (ferry_task_spawn(NULL, NULL, forgotten, NULL, &(ferry_task_opts){ .name = "forgotten" }))
        return 1;
    return ferry_to_thread(NULL, job, NULL) == 7 ? 0 : 2;
}

int main(void)
{
    int rc = ferry_run(main_task, NULL);

    libevent_global_shutdown();
    if (rc != 0)
        fprintf(stderr, "run_exit: ferry_run returned %d\n", rc);
    return rc != 0;
}
