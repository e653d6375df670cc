/* main.c - a program built out of tree against an installed ferry, by
 * find_package(ferry) and by pkg-config (tests/install/check.sh).
 * It runs a main task that spawns a child, sleeps, joins it and returns
 * the child's status; the program exits 0 only if that status is 42.
 * It uses the installed headers and library only, so the shared teardown
 * of the tests (testutil.c, not installed) is not available to it.
 */
#include <stdio.h>
#include <string.h>

#include <ferry/ferry.h>
/* The earlier name of ferry/resolve.h, kept for programs that include it:
 * installed, and harmless beside ferry/ferry.h. */
#include <ferry/net.h>

static int child(void *arg)
{
    int *steps = arg;
    for (int i = 0; i < 3; i++) {
        (*steps)++;
        if (ferry_yield() != 0)
            return -1;
    }
    return 42;
}

static int main_task(void *arg)
{
    int steps = 0, status = 0;
    ferry_task *t;
    int rc = ferry_task_spawn(&t, NULL, child, &steps, NULL);
    if (rc)
        return rc;
    rc = ferry_sleep(FERRY_MSEC(1));
    if (rc)
        return rc;
    rc = ferry_task_join(t, &status);
    if (rc)
        return rc;
    printf("install check: child ran %d steps, status %d\n", steps, status);
    (void)arg;
    return steps == 3 ? status : -1;
}

int main(void)
{
    int64_t start = ferry_now();
    int status;

    /* The installed generated header and the installed library agree. */
    if (strcmp(ferry_version(), FERRY_VERSION) != 0) {
        fprintf(stderr, "install check: library %s, headers %s\n", ferry_version(), FERRY_VERSION);
        return 1;
    }
    status = ferry_run(main_task, NULL);
    if (status != 42 || ferry_now() < start) {
        fprintf(stderr, "install check: ferry_run returned %d\n", status);
        return 1;
    }
    return 0;
}
