"""Reusable test helpers: a fault-injecting TCP proxy (faultproxy) and exchange servers (exchange)."""
