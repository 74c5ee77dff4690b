"""What to run: matrix.yaml's schema, its cells, and the miniature models they load."""
