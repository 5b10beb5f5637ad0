"""The studies behind docs/benchmarks.md that do not ship in the wheel: each module is run from the
repository's root as ``python -m benchmarks.NAME`` (its docstring says what it measures and how).

They may import inferlb (the load generator and DES glue of ``inferlb bench``: inferlb/bench);
inferlb never imports them, and they import no command of inferlb/cli (tests/test_layering.py).
"""
