"""The service context moved to ``climate.context``; this name stays for the tests and branches
written before the move."""

from climate.context import FIRST_PAGE, Page, ServiceContext

__all__ = ["FIRST_PAGE", "Page", "ServiceContext"]
