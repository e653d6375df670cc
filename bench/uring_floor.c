/* uring_floor.c - the least an io_uring echo server does per round trip:
 * the floor the io_uring backend is measured against (bench/run-uring.sh).
 *
 * One thread, no library: one ring (single issuer, deferred task running),
 * waited on with io_uring_enter itself, so a turn is one system call; a
 * multishot accept; a multishot receive per connection into a provided
 * buffer ring; each received chunk copied to the connection's send queue
 * and sent with one SEND, the rest of a short one sent again.  What ferry
 * adds on top of this (tasks, the stream layer, libevent's wait beside the
 * ring, cancel safety) is the difference between the two rows.
 *
 *   ferry-uring-floor PORT     serve 127.0.0.1:PORT until killed
 */
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

enum { NBUFS = 1024, BUFSZ = 4096, OUTSZ = 65536, MAXFD = 65536 };
enum { OP_ACCEPT = 1, OP_RECV = 2, OP_SEND = 3 };

struct conn {
    size_t len, off; /* bytes queued, bytes the kernel took */
    int sending;     /* a SEND is in flight */
    char out[OUTSZ]; /* the send queue */
};

static struct io_uring ring;
static struct io_uring_buf_ring *br;
static char *bufs;
static struct conn *conns[MAXFD];
static int lfd;

static void die(const char *what, int err)
{
    fprintf(stderr, "uring_floor: %s: %s\n", what, strerror(err));
    exit(1);
}

static struct io_uring_sqe *sqe_get(void)
{
    struct io_uring_sqe *s = io_uring_get_sqe(&ring);

    if (!s) {
        io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    if (!s)
        die("no submission entry", EBUSY);
    return s;
}

static void arm_accept(void)
{
    struct io_uring_sqe *s = sqe_get();

    io_uring_prep_multishot_accept(s, lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(s, OP_ACCEPT);
}

static void arm_recv(int fd)
{
    struct io_uring_sqe *s = sqe_get();

    io_uring_prep_recv_multishot(s, fd, NULL, 0, 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = 0;
    io_uring_sqe_set_data64(s, (uint64_t)fd << 8 | OP_RECV);
}

static void send_queued(int fd, struct conn *c)
{
    struct io_uring_sqe *s = sqe_get();

    io_uring_prep_send(s, fd, c->out + c->off, c->len - c->off, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(s, (uint64_t)fd << 8 | OP_SEND);
    c->sending = 1;
}

static void drop(int fd)
{
    close(fd);
    free(conns[fd]);
    conns[fd] = NULL;
}

static void accepted(int fd)
{
    int one = 1;

    if (fd >= MAXFD || !(conns[fd] = calloc(1, sizeof *conns[fd]))) {
        close(fd);
        return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    arm_recv(fd);
}

/* Returns the buffers given back. */
static unsigned received(int fd, const struct io_uring_cqe *cqe, unsigned given)
{
    struct conn *c = conns[fd];
    unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;

    if (cqe->res > 0) {
        char *b = bufs + (size_t)bid * BUFSZ;

        if (c && c->len + (size_t)cqe->res <= OUTSZ) {
            memcpy(c->out + c->len, b, (size_t)cqe->res);
            c->len += (size_t)cqe->res;
            if (!c->sending)
                send_queued(fd, c);
        } else if (c) {
            drop(fd); /* a peer that does not read its answers */
        }
        io_uring_buf_ring_add(br, b, BUFSZ, (unsigned short)bid, io_uring_buf_ring_mask(NBUFS),
                              (int)given++);
        if (!(cqe->flags & IORING_CQE_F_MORE) && conns[fd])
            arm_recv(fd);
    } else if (cqe->res == -ENOBUFS && c) {
        arm_recv(fd);
    } else if (c && !c->sending) {
        drop(fd); /* the end, or an error */
    } else if (c) {
        c->len = 0; /* closed once the send in flight ends */
    }
    return given;
}

static void sent(int fd, int res)
{
    struct conn *c = conns[fd];

    if (!c)
        return;
    c->sending = 0;
    if (res <= 0 || c->len == 0) {
        drop(fd);
        return;
    }
    c->off += (size_t)res;
    if (c->off == c->len)
        c->off = c->len = 0;
    else
        send_queued(fd, c);
}

int main(int argc, char **argv)
{
    struct io_uring_params p;
    struct io_uring_buf_reg reg;
    struct sockaddr_in a;
    int one = 1, rc;

    if (argc != 2) {
        fprintf(stderr, "usage: ferry-uring-floor PORT\n");
        return 2;
    }
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQSIZE;
    p.cq_entries = 8192;
    rc = io_uring_queue_init_params(256, &ring, &p);
    if (rc)
        die("io_uring_setup", -rc);
    bufs = malloc((size_t)NBUFS * BUFSZ);
    br = mmap(NULL, NBUFS * sizeof(struct io_uring_buf), PROT_READ | PROT_WRITE,
              MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (!bufs || br == MAP_FAILED)
        die("buffers", ENOMEM);
    memset(&reg, 0, sizeof reg);
    reg.ring_addr = (uint64_t)(uintptr_t)br;
    reg.ring_entries = NBUFS;
    rc = io_uring_register_buf_ring(&ring, &reg, 0);
    if (rc)
        die("provided buffer ring", -rc);
    io_uring_buf_ring_init(br);
    for (unsigned i = 0; i < NBUFS; i++)
        io_uring_buf_ring_add(br, bufs + (size_t)i * BUFSZ, BUFSZ, (unsigned short)i,
                              io_uring_buf_ring_mask(NBUFS), (int)i);
    io_uring_buf_ring_advance(br, NBUFS);

    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[1]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1024))
        die("listen", errno);
    arm_accept();
    for (;;) {
        struct io_uring_cqe *cqe;
        unsigned head, n = 0, given = 0;

        rc = io_uring_submit_and_wait(&ring, 1);
        if (rc < 0 && rc != -EINTR)
            die("io_uring_enter", -rc);
        io_uring_for_each_cqe(&ring, head, cqe)
        {
            int fd = (int)(cqe->user_data >> 8);

            n++;
            switch (cqe->user_data & 0xff) {
            case OP_ACCEPT:
                if (cqe->res >= 0)
                    accepted(cqe->res);
                if (!(cqe->flags & IORING_CQE_F_MORE))
                    arm_accept();
                break;
            case OP_RECV:
                given = received(fd, cqe, given);
                break;
            case OP_SEND:
                sent(fd, cqe->res);
                break;
            default:
                break;
            }
        }
        io_uring_cq_advance(&ring, n);
        if (given)
            io_uring_buf_ring_advance(br, (int)given);
    }
}
