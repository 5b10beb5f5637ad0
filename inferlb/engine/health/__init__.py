"""health package."""
