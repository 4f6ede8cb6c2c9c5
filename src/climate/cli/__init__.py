"""The ``climate`` command."""
