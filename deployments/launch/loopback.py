"""Serve's replica gRPC server on the loopback interface, for a single-host install.

Every Serve replica starts a gRPC server for calls between deployments and binds it to all
interfaces ("[::]:0", fixed in Ray 2.60's replica code, with no setting). When
`deployments.launch` serves a loopback API it sets FLM_LOOPBACK_ONLY=1 and names
`bind_replica_grpc_to_loopback` as the job's `worker_process_setup_hook`, which runs in each
Ray worker before it starts a replica: the server is then bound to 127.0.0.1, the address
Ray's single-host mode gives the node, so nothing else changes.
"""

from __future__ import annotations

import os

LOOPBACK_ENV = "FLM_LOOPBACK_ONLY"
_ALL_INTERFACES = "[::]:"


def bind_replica_grpc_to_loopback() -> None:
    if os.environ.get(LOOPBACK_ENV) != "1":
        return
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server
    if getattr(bind, "flm_loopback", False):
        return

    def bind_loopback(server, address: str):
        if address.startswith(_ALL_INTERFACES):
            address = "127.0.0.1:" + address[len(_ALL_INTERFACES):]
        return bind(server, address)

    bind_loopback.flm_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = bind_loopback
