"""The server interceptor of a mutual-TLS peer: every call is checked against peer/transport/auth.py.

TLS has already verified the client's certificate chain against the run CA; this reads the
verified certificate from the call's auth context, maps it to an identity and refuses what the
identity may not do with PERMISSION_DENIED and a one-line reason. Each refusal is counted in
`Guard.denied` (by method and peer) and logged once per (peer, method), so a misbehaving client
cannot flood the log.

It wraps each method's handler (peer/transport/intercept.py) and checks inside it, before the
servicer runs. A plaintext peer (`--insecure`) has no certificates to check; its guard refuses only
callers that name another run in their user agent (channels.RUN_AGENT), so a peer of another run
cannot join it by mistake (docs/decisions/security-run-id.md).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from pathlib import Path
from typing import Any

import grpc

from peer.core.site_names import site_of
from peer.transport.auth import BadCertificate, Identity, Role, authorize, identity_of, run_id_of
from peer.transport.channels import Credentials, run_named
from peer.transport.front import remote_of
from peer.transport.intercept import CallCheck

log = logging.getLogger("sitemesh.guard")


class Guard(CallCheck):
    """Checks every call of a server against the run's access rules."""

    def __init__(self, run_id: str, tls: bool = True) -> None:
        self.run_id = run_id
        self.tls = tls
        """False: plaintext, only the run a caller names is checked."""
        self.denied: collections.Counter[tuple[str, str]] = collections.Counter()
        """(method, peer name) -> calls refused; exported by the metrics helper."""

    def identity(self, context: grpc.aio.ServicerContext) -> Identity | str:
        """The caller's identity, or why it has none."""
        pems = (context.auth_context() or {}).get("x509_pem_cert")
        if not pems:
            return "no client certificate"
        try:
            return identity_of(pems[0])
        except (BadCertificate, ValueError) as err:
            return f"certificate not usable: {err}"

    def other_run(self, context: grpc.aio.ServicerContext) -> str | None:
        """Why a plaintext caller is refused: it names a run that is not this peer's."""
        agents = [str(v) for k, v in (context.invocation_metadata() or ()) if k == "user-agent"]
        named = run_named(agents[0]) if agents else None
        if named is None or named == self.run_id:
            return None
        return f"caller of run {named}, this peer serves run {self.run_id}"

    async def check(self, method: str, request: Any | None, context: grpc.aio.ServicerContext) -> None:
        who: Identity | str | None
        if self.tls:
            who = self.identity(context)
            reason = who if isinstance(who, str) else authorize(who, self.run_id, method, request)
        else:
            who, reason = None, self.other_run(context)
        if reason is None:
            return
        remote = remote_of(context.peer())  # the client's address, not the front's relay socket
        peer = who.name if isinstance(who, Identity) else remote
        key = (method, peer)
        if key not in self.denied:
            log.warning("refused %s from %s (%s): %s; further refusals of this kind are only counted",
                        method, peer, remote, reason)
        self.denied[key] += 1
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)



def site_security(certs: Path | None, member: str, run_name: str) -> tuple[Credentials, Guard]:
    """A member's TLS credentials and guard from its certificate directory (its site's certificate:
    a job's member `SITE.jN` uses SITE's), the run id from its CA; for None (`--insecure`),
    plaintext under the run file's `run_name`. OSError naming the file when the certificate is not
    the site's."""
    if certs is None:
        return Credentials(run_id=run_name), Guard(run_name, tls=False)
    site = site_of(member)
    creds = Credentials.from_dir(certs, site)
    try:
        run_id, who = run_id_of(creds.ca), identity_of(creds.cert)
    except (BadCertificate, ValueError) as err:
        raise OSError(f"{certs}: {err}") from err
    if who.role is not Role.SITE or who.name != site:
        raise OSError(f"{certs / (site + '.crt')} is the {who.role.value} certificate of {who.name!r}, "
                      f"not the site certificate of {site!r}: issue one with `ops certs issue --site {site}`")
    if who.run_id != run_id:
        raise OSError(f"{certs / (site + '.crt')} belongs to run {who.run_id}, but {certs / 'ca.crt'} is the CA of "
                      f"run {run_id}: copy the ca.crt of the run that issued it")
    return dataclasses.replace(creds, run_id=run_id), Guard(run_id)
