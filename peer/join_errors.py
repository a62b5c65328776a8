"""Why joining the mesh failed: what `peer serve --join` and `ops join` report to the operator."""


class JoinFailed(RuntimeError):
    """No seed answered within the join timeout."""


class JoinRefused(JoinFailed):
    """A seed refused this site for good: it trains something other than the run (its reason says
    which field differs); retrying cannot help, the run file must be fixed."""
