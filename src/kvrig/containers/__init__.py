"""A column in its container: image tags, builds, runs, host-specific engine settings, preflight."""
