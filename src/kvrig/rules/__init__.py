"""The block size vLLM should choose, restated from its code and computed without vLLM."""
