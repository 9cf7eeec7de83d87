"""Asset checks: the invariants a cleanup must leave behind."""

ASSET_CHECKS: list = []
