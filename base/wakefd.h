/* wakefd.h - a descriptor pair that wakes a loop's poll: an eventfd where
 * the system has one, else a pipe.  A write makes the read end readable
 * until it is drained; several writes before a drain cost one wakeup.
 * Thread: any.  ferry__wakefd_write() is async-signal-safe.
 */
#ifndef FERRY_BASE_WAKEFD_H
#define FERRY_BASE_WAKEFD_H

struct ferry__wakefd {
    int rfd; /* what the loop polls and drains */
    int wfd; /* what wakers write: rfd itself (eventfd), or the pipe's write end */
};

/* Make a non-blocking, close-on-exec pair (a fault point: "eventfd", and
 * "pipe" for the pipe).  Returns: 0; -EMFILE, -ENFILE (no descriptor
 * left); -ENOMEM (any other failure).  On error both fds are -1. */
int ferry__wakefd_open(struct ferry__wakefd *w);

/* Close both ends (each once) and set them to -1. */
void ferry__wakefd_close(struct ferry__wakefd *w);

/* Make the read end readable.  Returns 0, also when the counter or the
 * pipe is full (it is readable then), or the errno of a failed write. */
int ferry__wakefd_write(int wfd);

/* Read the read end until it is no longer readable.  Writes that land
 * after this keep it readable. */
void ferry__wakefd_drain(int rfd);

#endif /* FERRY_BASE_WAKEFD_H */
