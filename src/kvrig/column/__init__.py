"""The pytest plugin: the cells of matrix.yaml collected and run as test items."""
