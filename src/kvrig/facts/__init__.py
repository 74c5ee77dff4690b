"""What kvrig knows of vLLM, one record per thing: its attention backends, its model
architectures, the GPUs its platform code tells apart, and its platforms.

The verdicts, the predictor, the emulation and the matrix's checks each need these facts;
written once here, below them all, a table two of them read cannot disagree with itself.
Pure data and lookups: nothing here imports vLLM or another kvrig package.
"""
