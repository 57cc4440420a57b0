"""Collectors: read and parse one source each; raise SourceError on failure."""
