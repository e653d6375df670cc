#!/usr/bin/env bash
# test_tls_echo.sh TLS_ECHO CHECK_OUTPUT - make a certificate for localhost
# (self-signed, with the openssl command), run the TLS echo example with it
# as the server's certificate and the clients' authority, and check what it
# printed.
set -euo pipefail
bin=$1
check=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
bash "$check" "$bin" "$dir/cert.pem" "$dir/key.pem" "$dir/cert.pem" -- \
    "^client [123]: TLSv1.3, certificate verified" \
    "^client [123]: echoed hello [01] from client [123]" \
    "^3 clients, 6 lines echoed" \
    "!connection ended" \
    "!client [123]: .*\("
