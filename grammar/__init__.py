"""The Lark grammar of the rules language, packaged as ``rewrite.grammar``."""
