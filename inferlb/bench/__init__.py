"""The load generator and the benchmarks that ship with the ``inferlb`` command.

What ``inferlb bench``, ``inferlb autoscale backtest`` and ``inferlb sim des`` run
(inferlb/cli/bench.py, cli/backtest.py, cli/sim.py) and what those need.
The other studies behind docs/benchmarks.md live
outside the wheel, in the repository's benchmarks/ (``python -m benchmarks.NAME``).

Layout: ``loadgen/`` (the one load generator, open and closed loop, its workloads, traces, figures,
reports, child processes and the ``Stack`` of processes; ``bench run | compare | capacity``),
``cell`` (one closed-loop measured cell with CPU readings) and ``overhead`` (``bench overhead``),
``engine`` (the request process alone, in-process) and ``report`` (the overhead table),
``overload`` (``bench overload``), ``replicas`` (``bench replicas``), ``autoscale_backtest``,
``autoscale_controller`` and ``autoscale_plots`` (``autoscale backtest``), ``des_report`` and
``des_admission`` (``sim des``: a discrete-event run's figures, the gateway's admission rules in it).

``bench`` may import the simulator (the emulated nodes it drives) and the app; nothing in
``engine`` imports ``bench``, and ``bench`` imports no command of inferlb/cli.
"""
