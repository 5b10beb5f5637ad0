"""Benchmarks and the load generator behind ``inferlb bench``.

Layout: ``loadgen/`` (the one load generator, open and closed loop, its workloads, figures,
reports and the ``Stack`` of processes; ``bench run | compare | capacity``), ``cell`` (one
closed-loop measured cell with CPU readings) and ``overhead`` (``bench overhead``), ``engine``
(the request process alone, in-process), ``overload`` (``bench overload``), ``procs`` (child
processes, ports, CPU readings), ``report`` (the overhead table).

``bench`` may import the simulator (the emulated nodes it drives) and the app; nothing in
``engine`` imports ``bench``.
"""
