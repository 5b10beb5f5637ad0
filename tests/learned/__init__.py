"""learned package."""
