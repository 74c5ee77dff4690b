"""A record against its expectation: the verdict."""
