"""fsdpmon: observability for PyTorch FSDP training on Kubernetes."""

__version__ = "0.1.0"
