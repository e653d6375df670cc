/* xloop_pingpong.c - the floor of a cross-loop call's round trip: two
 * threads and two eventfds, by hand.  Thread A writes B's eventfd and
 * blocks reading its own; thread B reads its eventfd (blocking) and
 * writes A's.  No loop, no queue, no lock: what ferry_runtime_call()'s
 * wake-ups cost at least when both loops sleep between calls.
 *
 *   ferry-xloop-pingpong [N]      N round trips (default 200,000)
 *
 * Prints the contract's BENCH line (bench/README.md) with
 * workload=xloop_call system=eventfd-pingpong.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static int efd_a, efd_b;       /* A's and B's eventfds */
static long rounds;

static void wait_efd(int fd)
{
    uint64_t v;

    while (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        if (errno != EINTR) {
            perror("read");
            exit(1);
        }
}

static void kick(int fd)
{
    uint64_t one = 1;

    while (write(fd, &one, sizeof one) != (ssize_t)sizeof one)
        if (errno != EINTR) {
            perror("write");
            exit(1);
        }
}

static void *thread_b(void *arg)
{
    (void)arg;
    for (long i = 0; i < rounds; i++) {
        wait_efd(efd_b);
        kick(efd_a);
    }
    return NULL;
}

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 200000, warm = 1000;
    struct rusage ru;
    pthread_t b;
    double t0, secs;

    if (n <= 0)
        return 2;
    efd_a = eventfd(0, EFD_CLOEXEC);
    efd_b = eventfd(0, EFD_CLOEXEC);
    if (efd_a < 0 || efd_b < 0) {
        perror("eventfd");
        return 1;
    }
    rounds = warm + n;
    if (pthread_create(&b, NULL, thread_b, NULL) != 0)
        return 1;
    for (long i = 0; i < warm; i++) {
        kick(efd_b);
        wait_efd(efd_a);
    }
    t0 = now();
    for (long i = 0; i < n; i++) {
        kick(efd_b);
        wait_efd(efd_a);
    }
    secs = now() - t0;
    pthread_join(b, NULL);
    getrusage(RUSAGE_SELF, &ru);
    printf("BENCH workload=xloop_call system=eventfd-pingpong n=%ld seconds=%.6f ns_per_op=%.2f "
           "ops_per_s=%.0f rss_kb=%ld check=ok\n", n, secs, secs * 1e9 / (double)n,
           (double)n / secs, ru.ru_maxrss);
    return 0;
}
