/* tls_echo.c - a TLS echo server and its clients, one task per connection,
 * in one loop: the server answers every line with the same line; three
 * clients connect over TCP, verify the server's certificate for
 * "localhost", send two lines each and print what came back.
 *
 *   tls_echo CERT KEY CA    (PEM files: the server's certificate and key,
 *                            and the authority the clients trust)
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ferry/ferry.h"

static ferry_tls_ctx *server_ctx, *client_ctx;
static int port;
static int status = 1;    /* main_task's result */

/* One connection of the server: a line in, the same line out. */
static int echo_conn(void *arg)
{
    ferry_stream *s = arg, *tls;
    char line[1024];
    size_t n;
    int rc = ferry_tls_server(&tls, s, server_ctx);

    while (rc == 0 && (rc = ferry_stream_read_until(tls, "\n", 1, line, sizeof line, &n)) == 0)
        rc = ferry_stream_write(tls, line, n, NULL);
    if (rc != -ENODATA || n)    /* -ENODATA with n 0: the client's close_notify */
        printf("server: connection ended: %s (%s)\n", strerror(-rc), ferry_tls_last_error(s));
    ferry_stream_close(s);
    return 0;
}

static int serve(void *arg)
{
    ferry_listener *l = arg;
    ferry_stream *s;

    while (ferry_listener_accept(l, &s, NULL) == 0)
        ferry_task_spawn(NULL, NULL, echo_conn, s, NULL);
    return 0;
}

static int client(void *arg)
{
    int id = (int)(intptr_t)arg, rc;
    ferry_stream *s, *tls;
    char out[64], in[64];
    size_t n;

    if ((rc = ferry_tcp_connect(&s, "127.0.0.1", port, NULL)) != 0)
        return rc;
    rc = ferry_tls_client(&tls, s, client_ctx, "localhost");
    if (rc == 0)
        printf("client %d: %s, certificate verified\n", id, ferry_tls_version(tls));
    for (int i = 0; rc == 0 && i < 2; i++) {
        snprintf(out, sizeof out, "hello %d from client %d\n", i, id);
        rc = ferry_stream_write(tls, out, strlen(out), NULL);
        if (rc == 0)
            rc = ferry_stream_read_until(tls, "\n", 1, in, sizeof in - 1, &n);
        if (rc == 0) {
            in[n] = '\0';
            printf("client %d: echoed %s", id, in);
        }
    }
    if (rc == 0)
        rc = ferry_stream_shutdown(tls);    /* close_notify */
    if (rc)
        printf("client %d: %s (%s)\n", id, strerror(-rc), ferry_tls_last_error(s));
    ferry_stream_close(s);
    return rc;
}

static int main_task(void *arg)
{
    ferry_listener *l;
    ferry_group g;
    int rc;

    (void)arg;
    if ((rc = ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL)) != 0)
        return rc;
    port = ferry_listener_port(l);
    ferry_task_spawn(NULL, NULL, serve, l, NULL);
    ferry_group_init(&g);
    for (int i = 1; i <= 3; i++)
        ferry_group_spawn(&g, client, (void *)(intptr_t)i, NULL);
    rc = ferry_group_wait(&g);
    printf("%s\n", rc ? "a client failed" : "3 clients, 6 lines echoed");
    ferry_listener_close(l);    /* serve() ends; connections end with their clients */
    status = rc;
    return rc;
}

int main(int argc, char **argv)
{
    ferry_loop *loop;
    int rc;

    if (argc != 4) {
        fprintf(stderr, "usage: tls_echo CERT KEY CA\n");
        return 2;
    }
    if ((rc = ferry_tls_ctx_new(&server_ctx, FERRY_TLS_SERVER, 0)) != 0 ||
        (rc = ferry_tls_ctx_load_cert(server_ctx, argv[1], argv[2])) != 0 ||
        (rc = ferry_tls_ctx_new(&client_ctx, FERRY_TLS_CLIENT, 0)) != 0 ||
        (rc = ferry_tls_ctx_load_ca(client_ctx, argv[3], NULL)) != 0) {
        fprintf(stderr, "tls_echo: %s\n", strerror(-rc));
        return 1;
    }
    ferry_loop_new(&loop, NULL);
    ferry_task_spawn(NULL, loop, main_task, NULL, NULL);
    ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    ferry_loop_free(loop);
    ferry_tls_ctx_free(server_ctx);
    ferry_tls_ctx_free(client_ctx);
    return status ? 1 : 0;
}
