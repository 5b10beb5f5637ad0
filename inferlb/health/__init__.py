"""Node health: probes, metric scrapes, GPU readings, and the sweeps that isolate and restore nodes.

Sources: the HTTP probe, Prometheus scrapes of vLLM / TGI / SGLang and DCGM, the NVML node agent.
Layout: ``prometheus`` (exposition parsers), ``assess`` (samples → verdicts), ``isolation`` (sweeps
over the fleet), ``probe`` (the async sources, aiohttp), ``monitor`` (the timer loop driving
``processes/node_health.bpmn``), ``scope`` (what its service operations act on), ``nvml`` and
``agent`` (``inferlb agent``). Its config is ``inferlb/config/health.py``; its vocabulary (samples,
node events) ``inferlb/node_types.py``; the ejection and slow-start arithmetic the fleet's state
machine applies, and the GPU names (throttle bits, Xid), ``inferlb/fleet/rules.py`` and
``inferlb/fleet/gpu.py``.
"""

__all__: list[str] = []
