"""sitemesh peer: one identical process per site (membership, election, leases, exchange, trainer)."""

__version__ = "0.1.0"
