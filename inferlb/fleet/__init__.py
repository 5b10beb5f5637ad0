"""fleet package."""
