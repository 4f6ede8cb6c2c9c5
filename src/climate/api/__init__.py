"""The HTTP API: Blazar v1 plus our extensions. Thin: parse, call a service, render."""
