"""What every part of :mod:`torch_private` shares: the versions checked, the error."""

from __future__ import annotations

CHECKED_TORCH_VERSIONS = ("2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
"""torch versions the private APIs of :mod:`torch_private` were checked against."""


class Unavailable(Exception):
    """The private APIs are not what this module was written against."""
