"""The discrete-event mode of the simulator: virtual time, no sockets (``inferlb sim des``).

Layout: ``engine`` (:class:`~.engine.FastCore`: the emulator's continuous-batching engine of
:mod:`inferlb.simulator.batching`, fast-forwarded over runs of equal steps), ``node`` (one node:
engine, life cycle, the gateway's view of it), ``admission`` (the hook for admission rules),
``results`` (per-request columns, the node table), ``sim`` (:class:`~.sim.Simulation`: the event loop;
over ``fleet``: the controller API and node views, ``lifecycle``: one request's life through the
real routing core, ``api``: the hook and window types), ``prefix`` (:class:`~.prefix.PrefixCaches`: per-node prefix
caches behind the ``prefill_cached`` hook, and the prompt text affinity routing hashes), ``closed``
(:class:`~.closed.ClosedLoop`: sessions whose next turn leaves a think time after the previous answer).

The entry point for other code (each name imported from the module that defines it)::

    from inferlb.simulator.des.closed import ClosedLoop
    from inferlb.simulator.des.feedback import LearnedFeedback
    from inferlb.simulator.des.prefix import PrefixCaches
    from inferlb.simulator.des.sim import Simulation

    sim = Simulation(specs, profile="token-aware", seed=1, admission=..., timeout_s=...,
                     controller=fn, control_every_s=60.0,
                     prefill_cached=PrefixCaches(prompt_of),   # prompt text → per-node caches + affinity keys
                     feedback=LearnedFeedback(router))   # a learned router's feedback loop
    results = sim.run(plan)            # DesResults: columns, rows(), counts(), gpu_hours()
    results = ClosedLoop(specs, ...).run_sessions(sessions, stop_s=120.0)   # closed-loop sessions
"""

__all__: list[str] = []
