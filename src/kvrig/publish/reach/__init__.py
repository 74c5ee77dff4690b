"""`kvrig check reach`: which branches of vLLM's block-size code the cells take, measured
with coverage.py in the cells' own processes, against the table in kvrig.define."""
