/* sigport.c - a loop's port on the process's signal table
 * (base/sigtab.c): the wake descriptor the handler writes, its event on
 * the loop's base, and the counts already handed to the subscriptions.
 * Loop thread only.
 *
 * The port is made by the loop's first subscription and freed with the
 * loop.  Its descriptor is watched only while the loop has a subscription:
 * an application's event_base_dispatch() would never end on an otherwise
 * empty base.  When it wakes the loop, and whenever a receive or a new
 * subscription asks, the port hands each signal's `count - seen` to the
 * subscriptions (io/signal.c); reading the counters costs no system call.
 */
#include "loop_only.h"

#include <event2/event.h>

#include "loop_int.h"
#include "sig_int.h"
#include "wakefd.h"

static void port_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__sigport *port = arg;

    (void)what;
    /* Drained first: a delivery after this wakes the loop again. */
    ferry__wakefd_drain(fd);
    ferry__sig_collect(port->loop);
}

/* The loop's port, made on first use: wake descriptor, event (not added
 * yet), slot in the table. */
static void port_part_free(struct ferry__loop_part *part)
{
    ferry__signal_loop_free(ferry__container_of(part, struct ferry__sigport, part));
}

/* The loop's part for its signal subscriptions. */
static const struct ferry__part_ops port_ops = { "signals", NULL, port_part_free };

struct ferry__sigport *ferry__sigport_of(const ferry_loop *loop)
{
    struct ferry__loop_part *p = ferry__loop_part_find(loop, &port_ops);

    return p ? ferry__container_of(p, struct ferry__sigport, part) : NULL;
}

static int port_get(ferry_loop *loop, struct ferry__sigport **out)
{
    struct ferry__sigport *port = ferry__sigport_of(loop);
    long slot;
    int rc;

    if (port) {
        *out = port;
        return 0;
    }
    port = ferry__calloc(1, sizeof *port);
    if (!port)
        return -ENOMEM;
    port->loop = loop;
    /* Out of descriptors is -ENOMEM here too (ferry/signal.h). */
    if (ferry__wakefd_open(&port->fd) != 0) {
        rc = -ENOMEM;
        goto err_free;
    }
    port->ev = event_new(loop->base, port->fd.rfd, EV_READ | EV_PERSIST, port_cb, port);
    if (!port->ev) {
        rc = -ENOMEM;
        goto err_close;
    }
    slot = ferry__sigtab_join(port->fd.wfd);
    if (slot < 0) {
        rc = (int)slot;
        goto err_event;
    }
    port->slot = (size_t)slot;
    ferry__loop_part_add(loop, &port->part, &port_ops);
    *out = port;
    return 0;

err_event:
    event_free(port->ev);
err_close:
    ferry__wakefd_close(&port->fd);
err_free:
    ferry__free(port);
    return rc;
}

int ferry__sig_add(ferry_loop *loop, int signum)
{
    struct ferry__sigport *port = NULL;
    int rc;

    rc = port_get(loop, &port);
    if (rc)
        return rc;
    if (port->refs[signum]) {
        port->refs[signum]++;
        port->total++;
        return 0;
    }
    if (port->total == 0 && event_add(port->ev, NULL) != 0)
        return -ENOMEM;
    rc = ferry__sigtab_listen(port->slot, signum, &port->seen[signum]);
    if (rc) {
        if (port->total == 0)
            event_del(port->ev);
        return rc;
    }
    port->mask |= ferry__sig_bit(signum);
    port->refs[signum] = 1;
    port->total++;
    return 0;
}

void ferry__sig_del(ferry_loop *loop, int signum, bool unread)
{
    struct ferry__sigport *port = ferry__sigport_of(loop);

    port->total--;
    if (--port->refs[signum])
        return;
    if (port->total == 0)
        event_del(port->ev);
    port->mask &= ~ferry__sig_bit(signum);
    ferry__sigtab_unlisten(port->slot, signum, port->seen[signum], unread);
}

void ferry__sig_collect(ferry_loop *loop)
{
    struct ferry__sigport *port = ferry__sigport_of(loop);

    if (!port)
        return;
    for (uint64_t m = port->mask; m; m &= m - 1) {
        int signum = __builtin_ctzll(m) + 1;
        uint64_t now = ferry__sigtab_count(signum);
        if (now != port->seen[signum]) {
            uint64_t n = now - port->seen[signum];
            port->seen[signum] = now;
            ferry__sig_deliver(loop, signum, n);
        }
    }
}

void ferry__sig_port_free(struct ferry__sigport *port)
{

    /* Out of the table first, so that no handler writes the closed
     * descriptor. */
    ferry__sigtab_leave(port->slot);
    event_free(port->ev);
    ferry__wakefd_close(&port->fd);
    ferry__loop_part_del(&port->part);
    ferry__free(port);
}
