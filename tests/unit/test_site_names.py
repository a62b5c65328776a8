"""Members of a site's jobs (peer/core/site_names.py) and what their site's certificate may say for them."""

from __future__ import annotations

import pytest

from peer.core.site_names import is_job_member, job_member, site_of
from peer.gen.sitemesh.v1 import membership_pb2
from peer.transport.auth import Identity, Role, authorize
from peer.transport.route import server_name


def test_a_jobs_member_names_its_site_and_number() -> None:
    assert job_member("lumi", 7) == "lumi.j7"
    assert site_of("lumi.j7") == "lumi" and site_of("lumi") == "lumi"
    assert site_of("eu.lumi.j12") == "eu.lumi" and site_of("lumi.jx") == "lumi.jx" and site_of("lumi.j") == "lumi.j"
    assert is_job_member("lumi.j7") and not is_job_member("lumi") and not is_job_member("lumi.j")
    with pytest.raises(ValueError, match="1 or more"):
        job_member("lumi", 0)


def test_a_sites_certificate_speaks_for_its_jobs_and_no_other_site() -> None:
    lumi = Identity(Role.SITE, "lumi", "r-1")
    method = "/sitemesh.v1.Membership/SendPing"
    assert authorize(lumi, "r-1", method, membership_pb2.Ping(from_site="lumi.j3")) is None
    assert authorize(lumi, "r-1", method, membership_pb2.Ping(from_site="lumi")) is None
    for other in ("kit.j3", "lumi2.j3", "lumi.j3x", "kit"):
        assert authorize(lumi, "r-1", method, membership_pb2.Ping(from_site=other)) is not None, other


def test_a_relayed_jobs_member_proves_its_sites_name() -> None:
    assert server_name("relay://lumi.j4@r1:7100") == "lumi"
