"""Benchmarks and the load generator behind ``inferlb bench``.

``bench`` may import the simulator (the emulated nodes it drives) and the app; nothing in
``engine`` imports ``bench``.
"""
