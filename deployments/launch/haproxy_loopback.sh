#!/bin/sh
# HAProxy as Ray Serve starts it (RAY_SERVE_HAPROXY_BINARY_PATH points here when
# `python -m deployments.launch` serves), with the side ports Serve's template binds on every
# interface (its stats page `bind *:PORT`, its Prometheus endpoint `bind :PORT`) bound to
# FLM_HAPROXY_HOST, the API's own host, instead. Then the real binary, FLM_HAPROXY_BINARY,
# with the same arguments (Serve recognises its processes by the config path in them).
cfg=""
prev=""
for arg in "$@"; do
    [ "$prev" = "-f" ] && cfg=$arg
    prev=$arg
done
if [ -n "$cfg" ] && [ -f "$cfg" ] && [ -n "$FLM_HAPROXY_HOST" ]; then
    sed -E -i "s/^([[:space:]]*bind[[:space:]]+)\*?:([0-9]+)/\1${FLM_HAPROXY_HOST}:\2/" "$cfg" || exit 1
    # No kernel splicing of request bodies: HAProxy 2.8 does not see a client close after
    # a body it spliced (one that came in a write of its own, as httpx sends it), so a
    # non-streamed request whose client left kept generating to its end, and HAProxy spun
    # on the half-closed socket meanwhile.
    sed -E -i "s/^([[:space:]]*)option splice-request[[:space:]]*$/\1no option splice-request/" "$cfg" || exit 1
fi
exec "$FLM_HAPROXY_BINARY" "$@"
