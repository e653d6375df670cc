/* wakefd.c - eventfd, or a pipe where the system has none.
 * Thread: any.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/eventfd.h>
#define FERRY__HAVE_EVENTFD 1
#endif

#include "alloc.h"
#include "wakefd.h"

/* A failure the application can act on keeps its errno; any other is
 * told as -ENOMEM. */
static int open_error(int err)
{
    return err == EMFILE || err == ENFILE ? -err : -ENOMEM;
}

int ferry__wakefd_open(struct ferry__wakefd *w)
{
    w->rfd = w->wfd = -1;
    if (ferry__fault_point("eventfd"))
        return -ENOMEM;
#ifdef FERRY__HAVE_EVENTFD
    w->rfd = w->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return w->rfd < 0 ? open_error(errno) : 0;
#else
    int p[2];

    if (ferry__fault_point("pipe"))
        return -ENOMEM;
    if (pipe(p) < 0)
        return open_error(errno);
    for (int i = 0; i < 2; i++) {
        fcntl(p[i], F_SETFL, fcntl(p[i], F_GETFL) | O_NONBLOCK);
        fcntl(p[i], F_SETFD, FD_CLOEXEC);
    }
    w->rfd = p[0];
    w->wfd = p[1];
    return 0;
#endif
}

void ferry__wakefd_close(struct ferry__wakefd *w)
{
    if (w->wfd != w->rfd && w->wfd >= 0)
        close(w->wfd);
    if (w->rfd >= 0)
        close(w->rfd);
    w->rfd = w->wfd = -1;
}

int ferry__wakefd_write(int wfd)
{
#ifdef FERRY__HAVE_EVENTFD
    static const uint64_t one = 1;
#else
    static const char one = 1;
#endif
    ssize_t n;

    do
        n = write(wfd, &one, sizeof one);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof one)
        return 0;
    if (n >= 0)
        return EIO;
    /* The counter (or the pipe) is full: it is readable. */
    return errno == EAGAIN ? 0 : errno;
}

void ferry__wakefd_drain(int rfd)
{
#ifdef FERRY__HAVE_EVENTFD
    uint64_t v;

    /* One read resets the counter; EAGAIN: another drain did it. */
    if (read(rfd, &v, sizeof v) < 0) {
    }
#else
    char buf[64];

    while (read(rfd, buf, sizeof buf) > 0)
        ;
#endif
}
