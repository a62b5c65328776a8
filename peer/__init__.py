"""sitemesh peer: one identical process per site (membership, election, leases, exchange, trainer)."""
