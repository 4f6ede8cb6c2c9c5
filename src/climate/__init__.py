"""Climate: a resource reservation service for clouds and shared infrastructure."""

__version__ = "0.1.0"
