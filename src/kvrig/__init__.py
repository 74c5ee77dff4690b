"""kvrig: a hardware-matrix integration test rig for vLLM's KV-cache block-size choice.

The data path, one way, one subpackage per step: define (matrix, cells, models) ->
rules (the block size vLLM should choose) -> run (one cell's engine and its record) ->
judge (record -> verdict) -> publish (results, report, gate); column is the pytest plugin
that drives it, containers and provision the edges that build images and environments.
"""
