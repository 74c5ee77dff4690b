"""One cell's life: its process, the warm parent it forks from, the vLLM plugin, its record."""
