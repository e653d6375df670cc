/* deny_uring.c - run a program where io_uring cannot be used.
 *
 *     deny_uring PROGRAM [ARGS...]
 *
 * Installs a seccomp filter that makes io_uring_setup, io_uring_enter and
 * io_uring_register fail with EPERM, as the default seccomp profile of
 * container runtimes does, then executes PROGRAM with ARGS in the same
 * process (the filter is inherited across execve and by every thread and
 * child).  Every other system call is allowed.  The fallback tests run the
 * stream suites under it with FERRY_IO=uring: the loop must find that it
 * cannot set io_uring up and go on with epoll.
 *
 * The filter knows the system call numbers of this program's own ABI (and,
 * on x86-64, of the i386 and x32 ABIs, which number the three calls alike);
 * a call through any other ABI kills the process, since a filter that
 * cannot read the number must not let the call through.
 *
 * Exit status: PROGRAM's; 2 when the filter cannot be installed or on a
 * usage error; 127 when PROGRAM cannot be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "uring_nr.h"

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#define OTHER_ARCH  AUDIT_ARCH_I386
#define X32_BIT     0x40000000u
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#elif defined(__i386__)
#define NATIVE_ARCH AUDIT_ARCH_I386
#elif defined(__riscv) && __riscv_xlen == 64
#define NATIVE_ARCH AUDIT_ARCH_RISCV64
#else
#error "deny_uring: no seccomp architecture known for this target"
#endif
#ifndef OTHER_ARCH
#define OTHER_ARCH NATIVE_ARCH
#endif
#ifndef X32_BIT
#define X32_BIT 0u
#endif

#define DENY (SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))

/* Allow everything but the three calls; kill on an ABI the filter does not
 * know.  The x32 bit is masked off so that an x32 program's calls are
 * matched by the same numbers. */
static int install_filter(void)
{
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, OTHER_ARCH, 0, 6),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~X32_BIT),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_enter, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_register, 2, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, DENY),
    };
    struct sock_fprog fprog = {
        .len = (unsigned short)(sizeof prog / sizeof prog[0]),
        .filter = prog,
    };

    /* Without no_new_privs an unprivileged process may not install a
     * filter; it also keeps a set-user-ID PROGRAM from shedding it. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -errno;
    if (syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0)
        return -errno;
    return 0;
}

int main(int argc, char **argv)
{
    int rc;

    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: deny_uring PROGRAM [ARGS...]\n"
                        "  runs PROGRAM with io_uring_setup, io_uring_enter and "
                        "io_uring_register failing with EPERM\n");
        return 2;
    }
    rc = install_filter();
    if (rc) {
        fprintf(stderr, "deny_uring: cannot install the seccomp filter: %s\n", strerror(-rc));
        return 2;
    }
    execvp(argv[1], argv + 1);
    fprintf(stderr, "deny_uring: cannot execute %s: %s\n", argv[1], strerror(errno));
    return 127;
}
