"""``baton profile``: measure an engine's iteration times for the fitted performance model."""
