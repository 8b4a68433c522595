"""The shipped rule library, packaged as ``rewrite.library`` (found by ``include``)."""
