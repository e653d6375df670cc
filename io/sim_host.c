/* sim_host.c - the tasks of simulated hosts (ferry/sim.h) and the way
 * their ordinary calls reach the simulation (sim_route.h): listening,
 * connecting and name lookups made by socket.c and dns.c on a host's
 * behalf.
 * Loop thread only.
 *
 * A task belongs to a host through a task-local value whose key hands it
 * down to the tasks it spawns, so the core knows nothing of hosts: the
 * host is the value, and the routing check is that the calling task has
 * one and that it is a host of the simulation its loop has (the
 * simulation is one of the loop's parts).  A host's address is its rank
 * among the hosts made, 10.0.0.1 for the first; the names and these
 * addresses are the simulation's whole name service.
 */
#include "loop_only.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "dns_int.h"
#include "sim_int.h"
#include "sim_route.h"

/* First and last port a listen on port 0 may pick (Linux's ephemeral
 * range). */
#define PORT_LO 32768
#define PORT_HI 60999

/* A child of a host's task belongs to the same host. */
static void *host_inherit(void *value)
{
    return value;
}

static const ferry_task_key host_key = { NULL, host_inherit };

/* ---- host tasks ----------------------------------------------------------- */

int ferry_sim_spawn(ferry_sim_host *host, ferry_task **out, int (*fn)(void *), void *arg)
{
    ferry_task_opts opts = { 0 };
    int rc;

    if (out)
        *out = NULL;
    if (!host || !fn)
        return -EINVAL;
    if (host->crashed)
        return -EHOSTDOWN;
    opts.name = host->name;
    rc = ferry__task_spawn_with(out, host->sim->loop, fn, arg, &opts, &host_key, host);
    if (!rc)
        ferry__sim_faults_arm(host->sim);
    return rc;
}

int ferry_sim_boot(ferry_sim_host *host, int (*fn)(void *), void *arg)
{
    int rc;

    if (!host || !fn)
        return -EINVAL;
    if (host->boot_fn)
        return -EBUSY;
    host->boot_fn = fn;
    host->boot_arg = arg;
    if (host->crashed)
        return 0; /* it runs at the restart */
    rc = ferry_sim_spawn(host, NULL, fn, arg);
    if (rc)
        host->boot_fn = NULL;
    return rc;
}

ferry_sim_host *ferry_sim_current_host(void)
{
    return ferry_task_local_get(&host_key);
}

const char *ferry_sim_host_name(const ferry_sim_host *host)
{
    return host ? host->name : NULL;
}

uint64_t ferry_sim_seed(const ferry_sim *sim)
{
    return sim ? sim->seed : 0;
}

bool ferry__sim_host_busy(struct ferry_sim *sim, const ferry_sim_host *h)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->loop->tasks) {
        if (ferry__task_local_of(ferry__container_of(l, ferry_task, all), &host_key) == h)
            return true;
    }
    return false;
}

void ferry__sim_host_cancel(struct ferry_sim *sim, const ferry_sim_host *host)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->loop->tasks) {
        ferry_task *t = ferry__container_of(l, ferry_task, all);
        if (ferry__task_local_of(t, &host_key) == host)
            ferry_task_cancel(t);
    }
}

/* ---- routing ---------------------------------------------------------------- */

static void sim_part_free(struct ferry__loop_part *part);

/* The loop's part for its simulation: made by ferry_sim_new(). */
const struct ferry__part_ops ferry__sim_part_ops = { "simulation", NULL, sim_part_free };

/* The loop is freed with the simulation still there: free it too. */
static void sim_part_free(struct ferry__loop_part *part)
{
    ferry_sim_free(ferry__container_of(part, struct ferry_sim, part));
}

static bool host_of(struct ferry_sim *sim, const ferry_sim_host *h)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->hosts) {
        if (ferry__container_of(l, ferry_sim_host, link) == h)
            return true;
    }
    return false;
}

ferry_sim_host *ferry__sim_route(const ferry_loop *loop)
{
    ferry_sim_host *h = ferry_sim_current_host();
    struct ferry__loop_part *p;

    if (!h)
        return NULL;
    p = ferry__loop_part_find(loop, &ferry__sim_part_ops);
    /* A value left from a simulation since freed names no host of this
     * one: compared, never read. */
    if (!p || !host_of(ferry__container_of(p, struct ferry_sim, part), h))
        return NULL;
    return h;
}

/* The host called `name`, or whose address `name` writes out; NULL. */
static ferry_sim_host *host_named(struct ferry_sim *sim, const char *name)
{
    struct ferry__link *l;
    struct in_addr a;
    uint32_t addr = 0;

    if (inet_pton(AF_INET, name, &a) == 1) {
        addr = ntohl(a.s_addr);
        if ((addr & 0xff000000u) != 0x0a000000u)
            return NULL;
        addr &= 0x00ffffffu;
    }
    ferry__list_foreach(l, &sim->hosts) {
        ferry_sim_host *h = ferry__container_of(l, ferry_sim_host, link);
        if (addr ? h->addr == addr : strcmp(h->name, name) == 0)
            return h;
    }
    return NULL;
}

int ferry__sim_listen_owned(ferry_sim_host *host, int port, ferry_sim_listener **out, int *bound)
{
    struct ferry_sim *sim = host->sim;
    int rc;

    if (host->crashed)
        return -EHOSTDOWN;
    if (!port) {
        /* The next free port after the last one picked, as a kernel walks
         * its ephemeral range. */
        int p = sim->next_port ? sim->next_port : PORT_LO;

        for (int n = 0; n <= PORT_HI - PORT_LO; n++) {
            if (!ferry__sim_find_listener(sim, host, p)) {
                port = p;
                break;
            }
            p = p == PORT_HI ? PORT_LO : p + 1;
        }
        if (!port)
            return -EADDRINUSE;
        sim->next_port = port == PORT_HI ? PORT_LO : port + 1;
    }
    rc = ferry_sim_listen(sim, host, port, out);
    if (rc)
        return rc;
    (*out)->owned = true;
    *bound = port;
    return 0;
}

void ferry__sim_listener_drop(ferry_sim_listener *li)
{
    li->owned = false;
    if (!li->closed)
        ferry_sim_listener_close(li);
    else
        ferry__sim_listener_put(li);
}

void ferry__sim_peer_addr(const ferry_stream *s, struct sockaddr_storage *ss)
{
    const struct sim_end *e = s->io_ctx;
    struct sockaddr_in *sin = (struct sockaddr_in *)ss;

    memset(ss, 0, sizeof *ss);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(0x0a000000u + e->peer_host->addr);
    sin->sin_port = htons((uint16_t)(PORT_LO + e->conn % (PORT_HI - PORT_LO + 1)));
}

int ferry__sim_connect_name(ferry_sim_host *from, const char *name, int port, ferry_stream **out)
{
    ferry_sim_host *to = host_named(from->sim, name);

    if (!to)
        return FERRY_EAI_NONAME;
    return ferry_sim_connect(from->sim, from, to, port, out);
}

int ferry__sim_getaddrinfo(ferry_sim_host *from, const char *host, const char *service,
                           const struct addrinfo *h, struct addrinfo **res)
{
    struct ferry__ai_kind kinds[FERRY__AI_KINDS];
    struct ferry__ai_addr addr;
    ferry_sim_host *to = host_named(from->sim, host);
    size_t nkinds = 0, n = 0;
    uint32_t be;
    bool mapped = h->ai_family == AF_INET6;
    int rc;

    if (!to)
        return FERRY_EAI_NONAME;
    if (mapped && !(h->ai_flags & AI_V4MAPPED))
        return FERRY_EAI_NODATA;
    rc = ferry__dns_service_kinds(service, h, kinds, &nkinds);
    if (rc)
        return rc;
    be = htonl(0x0a000000u + to->addr);
    memset(&addr, 0, sizeof addr);
    ferry__dns_addrs_add(&addr, &n, AF_INET, (const unsigned char *)&be, 1, mapped);
    return ferry__ai_build(res, &addr, 1, kinds, nkinds,
                           (h->ai_flags & AI_CANONNAME) ? to->name : NULL);
}
