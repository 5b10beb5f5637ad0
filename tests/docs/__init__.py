"""The docs site and the README."""
