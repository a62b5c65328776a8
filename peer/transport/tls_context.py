"""TLS contexts from a peer's credentials for the byte streams gRPC does not carry: the bulk data
plane (peer/exchange/bulk.py) and the tunnels between an outbound site and its relays
(peer/transport/tunnel.py, relay_server.py). Mutual, against the run CA, like gRPC's own.
"""

from __future__ import annotations

import os
import ssl

from peer.transport.channels import Credentials


def server_tls(creds: Credentials) -> ssl.SSLContext:
    """The bulk listener's TLS: this site's certificate, clients must show one of the run CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=creds.ca.decode())
    load_own(ctx, creds)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_tls(creds: Credentials) -> ssl.SSLContext:
    """A receiver's TLS: the server's certificate must chain to the run CA and name the host dialed
    (as gRPC checks it); the receiver shows its own site certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=creds.ca.decode())
    load_own(ctx, creds)
    return ctx


def load_own(ctx: ssl.SSLContext, creds: Credentials) -> None:
    # ssl loads certificates only from files and the credentials live in memory: hand it anonymous
    # in-memory files (Linux memfd), so the private key never lands in /tmp, even for a moment.
    if not hasattr(os, "memfd_create"):  # not Linux: a private temporary directory, removed at once
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
            cert.write_bytes(creds.cert)
            key.write_bytes(creds.key)
            ctx.load_cert_chain(cert, key)
        return
    fds = [os.memfd_create(name, os.MFD_CLOEXEC) for name in ("sitemesh-cert", "sitemesh-key")]
    try:
        for fd, data in zip(fds, (creds.cert, creds.key)):
            os.write(fd, data)
        ctx.load_cert_chain(*(f"/proc/self/fd/{fd}" for fd in fds))
    finally:
        for fd in fds:
            os.close(fd)
