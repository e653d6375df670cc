/* redis_queue_worker.c - a consumer process for test_redis_queue: it takes
 * items from a queue and never acknowledges them, then waits to be killed.
 *
 *     redis_queue_worker PORT KEY GROUP CONSUMER N
 *
 * Prints "got <id>" for each of the N items it took, then "held", one
 * line each, flushed, and sleeps until it is killed.  Exit status 1 on any
 * error (the line "error <where> <code>" says which).
 */
#include <stdio.h>
#include <stdlib.h>

#include "ferry/redis_queue.h"

static char **g_argv;

static int worker_main(void *arg)
{
    ferry_redis *conn;
    ferry_redis_queue *q;
    ferry_redis_item *it;
    int n = atoi(g_argv[5]), rc;

    (void)arg;
    rc = ferry_redis_connect(&conn, "127.0.0.1", atoi(g_argv[1]), NULL);
    if (rc) {
        printf("error connect %d\n", rc);
        return 1;
    }
    rc = ferry_redis_queue_open(&q, conn, g_argv[2], g_argv[3], g_argv[4]);
    if (rc) {
        printf("error open %d\n", rc);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        rc = ferry_redis_queue_get(q, &it, FERRY_SEC(10));
        if (rc) {
            printf("error get %d\n", rc);
            return 1;
        }
        printf("got %s\n", it->id);
        fflush(stdout);
        ferry_redis_item_free(it);
    }
    printf("held\n");
    fflush(stdout);
    for (;;)
        ferry_sleep(FERRY_SEC(60));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s PORT KEY GROUP CONSUMER N\n", argv[0]);
        return 2;
    }
    g_argv = argv;
    return ferry_run(worker_main, NULL) == 0 ? 0 : 1;
}
