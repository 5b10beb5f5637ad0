"""inferlb: model-aware inference load balancer."""

__all__ = ["__version__"]

__version__ = "0.1.0"
