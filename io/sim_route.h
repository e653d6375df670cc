/* sim_route.h - what the ordinary calls of sockets and names (socket.c,
 * dns.c) ask the simulated network (sim_host.c), so that a task of a
 * simulated host reaches the simulation through them.
 * Loop thread only.
 */
#ifndef FERRY_SIM_ROUTE_H
#define FERRY_SIM_ROUTE_H

#include <netdb.h>
#include <sys/socket.h>

#include "ferry_int.h"
#include "ferry/sim.h"

/*
 * The host of the calling task if its calls go to a simulation on
 * `loop`: the loop has a simulation and the task was spawned for one of
 * its hosts (or by such a task).  NULL: the call goes to the real
 * network.
 */
ferry_sim_host *ferry__sim_route(const ferry_loop *loop);

/*
 * Listen on `port` of `host` for a ferry_listener (port 0: a free port),
 * the bound port in *bound.  The listener stays the caller's until it
 * calls ferry__sim_listener_drop(), whatever the simulation does.
 * Returns: 0; -ENOMEM; -EADDRINUSE; -EHOSTDOWN (the host crashed).
 */
int ferry__sim_listen_owned(ferry_sim_host *host, int port, ferry_sim_listener **out, int *bound);

/* The owner of a listener made by ferry__sim_listen_owned() is done with
 * it: close it if still open, free it once no task is inside. */
void ferry__sim_listener_drop(ferry_sim_listener *li);

/* The address of the peer of simulated stream `s` (AF_INET, the peer
 * host's address, a port made of the connection's number). */
void ferry__sim_peer_addr(const ferry_stream *s, struct sockaddr_storage *ss);

/*
 * Connect from `from` to `port` of the host called `name` (its name or
 * its address written out).
 * Returns: as ferry_sim_connect(); FERRY_EAI_NONAME (no such host).
 */
int ferry__sim_connect_name(ferry_sim_host *from, const char *name, int port, ferry_stream **out);

/*
 * Answer a lookup of `host` (not NULL) from a task of a simulated host,
 * with the hints checked (`h`).
 * Returns: 0 and *res; FERRY_EAI_NONAME (not a host of the simulation);
 * FERRY_EAI_NODATA (IPv6 only was asked); FERRY_EAI_SERVICE; -ENOMEM.
 */
int ferry__sim_getaddrinfo(ferry_sim_host *from, const char *host, const char *service,
                           const struct addrinfo *h, struct addrinfo **res);

#endif /* FERRY_SIM_ROUTE_H */
