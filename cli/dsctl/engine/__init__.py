"""The emulated serving engine (`dsctl engine serve`, `python3 -m dsctl.engine serve`).

A vLLM-compatible OpenAI server whose timing comes from dsctl's roofline
performance model (dsctl.core.perf.perfmodel) through a vLLM-V1-like step scheduler
(dsctl.core.perf.engine_sched), with synthetic text and no weights.  Lab hosts run
it as their serving process.  Standard library only (plus dsctl.core.perf.perfmodel
and dsctl.core.perf.engine_sched): it must run from a host's system python3.
"""
