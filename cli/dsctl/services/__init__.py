"""The verbs as Python calls: provision, check, deploy, probe, tune, upgrade, and the lab's, matrix, estimate,
wheelhouse and engine verbs.  The commands (dsctl.commands) import nothing else of dsctl (inputs.py checks what a
command line gives a verb).

Each verb takes validated, frozen inputs, the port it drives (a `PlaybookRunner` or a `Prober`, see
`dsctl.services.ports`) and a progress sink, and returns a frozen result with ``to_dict()`` (the ``--json``
envelope's data). Verbs never print; commands (dsctl.commands) render what they return, and the tuner calls
them directly.
"""
