/* uring_probe.c - the check that deny_uring denies io_uring, and only it.
 *
 *     uring_probe denied     exit 0 when all three io_uring calls fail
 *                            with EPERM and other calls still work
 *     uring_probe allowed    exit 0 when none of them fails with EPERM;
 *                            77 (skipped) when io_uring is unavailable
 *                            here for a reason of the machine's own
 *
 * The calls are made so that they cannot do anything: io_uring_setup with
 * an invalid flag, the other two on descriptor -1.  Where io_uring is
 * allowed, the kernel answers EINVAL or EBADF; where a filter denies it,
 * EPERM.  The ctests run it under deny_uring and without (docs/testing.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "uring_nr.h"

/* Large enough for struct io_uring_params of any kernel; zero but for the
 * flags word, which holds a bit no kernel defines, so that a setup the
 * filter lets through fails with EINVAL and makes no ring. */
static unsigned char params[512];

static int call_errno(const char *name, long nr)
{
    long rc;

    errno = 0;
    if (nr == __NR_io_uring_setup)
        rc = syscall(nr, 1, params);
    else if (nr == __NR_io_uring_enter)
        rc = syscall(nr, -1, 0, 0, 0, NULL, 0);
    else
        rc = syscall(nr, -1, 0, NULL, 0);
    if (rc >= 0) {
        /* A ring was made after all: close it, and report success. */
        close((int)rc);
        printf("uring_probe: %s succeeded\n", name);
        return 0;
    }
    printf("uring_probe: %s: %s\n", name, strerror(errno));
    return errno;
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        long nr;
    } calls[] = {
        { "io_uring_setup", __NR_io_uring_setup },
        { "io_uring_enter", __NR_io_uring_enter },
        { "io_uring_register", __NR_io_uring_register },
    };
    int want_denied, eperm = 0, setup_errno = 0;

    if (argc != 2 || (strcmp(argv[1], "denied") != 0 && strcmp(argv[1], "allowed") != 0)) {
        fprintf(stderr, "usage: uring_probe denied|allowed\n");
        return 2;
    }
    want_denied = strcmp(argv[1], "denied") == 0;
    /* flags, after sq_entries and cq_entries: bit 31. */
    params[11] = 0x80;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        int e = call_errno(calls[i].name, calls[i].nr);

        eperm += e == EPERM;
        if (i == 0)
            setup_errno = e;
    }
    if (want_denied) {
        /* The filter must leave the rest alone: a plain call still works. */
        if (getppid() <= 0 || syscall(SYS_getpid) <= 0) {
            printf("uring_probe: an ordinary system call failed\n");
            return 1;
        }
        if (eperm != 3) {
            printf("uring_probe: FAIL: %d of 3 calls failed with EPERM, want 3\n", eperm);
            return 1;
        }
        printf("uring_probe: all three denied with EPERM\n");
        return 0;
    }
    /* io_uring_disabled and older kernels refuse the setup alone. */
    if (setup_errno == EPERM || setup_errno == ENOSYS) {
        printf("SKIPPED: io_uring is unavailable here without deny_uring "
               "(no kernel support, io_uring_disabled, or a filter already)\n");
        return 77;
    }
    if (eperm) {
        printf("uring_probe: FAIL: %d of 3 calls failed with EPERM without a filter\n", eperm);
        return 1;
    }
    printf("uring_probe: none denied\n");
    return 0;
}
