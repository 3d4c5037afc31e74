"""The pieces of ``tools/bench.py``, split along its sections.

- :mod:`benchlib.common`: what is compared (methods, models, profiles), search settings,
  the papers' reported figures, progress output;
- :mod:`benchlib.models`: the benchmark models and their traced training steps;
- :mod:`benchlib.search`: "does this size fit with this method?" and the largest-size search;
- :mod:`benchlib.report`: JSON records, the Markdown report and the memory-timeline plots.
"""
