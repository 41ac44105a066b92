"""Starting and stopping a server: the `flm-serve` command line (cli), the process launcher
behind `make serve` (launcher: `serve run` with configs/serve.env's Ray settings, a clean
stop), the processes of one run (processes), Ray's environment (serve_env), and the
loopback-only binding of Serve's own ports (loopback, haproxy_loopback.sh)."""
