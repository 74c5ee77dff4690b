"""What a column needs on a host: the platform's vLLM, Debian packages, a container engine."""
