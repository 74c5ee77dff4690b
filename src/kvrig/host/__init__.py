"""This machine: which platform it is, its CPU class, and the fingerprint every record carries."""
