/* pq_main.c - a program built out of tree against an installed ferry's
 * PostgreSQL part (ferry::ferry_pq, pkg-config ferry-pq), by
 * tests/install/check.sh.  No server is needed: it connects to a port of
 * 127.0.0.1 where nothing listens and exits 0 only if the connection is
 * refused cleanly (-ECONNREFUSED, no connection object, libpq's message).
 */
#include <errno.h>
#include <stdio.h>

#include <ferry/ferry.h>
#include <ferry/pq.h>

static int main_task(void *arg)
{
    char err[256] = "";
    ferry_pq_opts opts = { .errbuf = err, .errbuf_len = sizeof(err) };
    ferry_pq *c = NULL;
    int rc = ferry_pq_connect(&c, "host=127.0.0.1 port=1", &opts);

    (void)arg;
    if (rc != -ECONNREFUSED || c != NULL || !err[0]) {
        fprintf(stderr, "pq_main: connect gave %d\n", rc);
        return 1;
    }
    return 0;
}

int main(void)
{
#if !FERRY_HAVE_PQ
#error "the installed ferry says it has no PostgreSQL part"
#endif
    return ferry_run(main_task, NULL);
}
